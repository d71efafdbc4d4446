import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Clock, TimerHandle } from '../scheduling/clock.js'
import { MIN_EVICTABLE_IDLE_MS, isSlowFrame } from './admission.js'
import { RateLimitedLog, type LogFields, type Logger } from './logger.js'
import type { PushOutputLimit } from './push-output-limit.js'
import { DEFAULT_FRAME_TIMEOUT_MS, LOG_INTERVAL_MS, RETIRED_BUSY_LIMIT_MS, RETIRED_QUIET_MS, type ServerOptions } from './server-options.js'
import type { ServerConnection } from './server-connection.js'

/** The longest a connection whose reading is paused goes without a probe read (`Connection.probeRead`). */
export const PROBE_PERIOD_MS = 1000

/** What the connection scan needs of the server around it. */
export interface ScanHost {
  readonly clock: Clock
  readonly log: Required<Logger>
  warn: (message: string, fields?: LogFields) => void
  /** The protocol's name, for log fields. */
  readonly protocolName: string
  readonly connections: ReadonlySet<ServerConnection>
  readonly stats: { idleClosed: number, agedClosed: number, frameTimeouts: number, slowFramesClosed: number }
  /** The server's options (read when the scan is armed: `maxConnectionAgeMs` may change). */
  readonly options: ServerOptions & { idleTimeoutMs: number }
  /** `minFrameBytesPerSecond` (0: off) and `slowFrameGraceMs`, resolved. */
  readonly minFrameRate: number
  readonly slowFrameGraceMs: number
  readonly pushLimit: PushOutputLimit
  /** Connections that received a push and are over the soft limit. */
  readonly overSoft: Set<ServerConnection>
  /** Judges a pushed connection by the push limits (false: closed). */
  judgePushed: (sc: ServerConnection, now: number) => boolean
  readonly dispatch: { readonly shortestAbandonMs: number, abandonOverdue: (now: number) => void }
  /** Counts open descriptors (admission's concern), once per scan. */
  checkDescriptors: () => void
}

/**
 * The server's periodic pass over its connections: closes idle ones and
 * frames that take too long (`frameTimeoutMs`) or arrive too slowly
 * (`minFrameBytesPerSecond`), retires connections past
 * `maxConnectionAgeMs`, closes pushed-to ones over the soft push limit,
 * abandons overdue handlers, probes connections whose reading is paused
 * (their peer may have gone unseen), and watches the descriptor count. One
 * timer per server, its period a quarter of the shortest limit (10 ms to 1 s).
 */
export class ConnectionScan {
  readonly #host: ScanHost
  #timer: TimerHandle | null = null
  /** Some group abandons overdue handlers. */
  #abandoning = false
  // Peers choose how often these happen: each kind is rate-limited.
  readonly #logFrameTimeout: RateLimitedLog
  readonly #logSlowFrame: RateLimitedLog

  constructor (host: ScanHost) {
    this.#host = host
    const now = (): number => host.clock.now()
    this.#logFrameTimeout = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logSlowFrame = new RateLimitedLog(LOG_INTERVAL_MS, now)
  }

  /** Stops the scan (the server is closing). */
  stop (): void {
    if (this.#timer !== null) this.#host.clock.clearTimer(this.#timer)
    this.#timer = null
  }

  /** Starts the scan (a no-op while it runs, or when no limit needs it); its period follows the shortest limit. */
  arm (): void {
    const host = this.#host
    const idleMs = host.options.idleTimeoutMs
    const maxAgeMs = host.options.maxConnectionAgeMs ?? 0
    const frameMs = host.options.frameTimeoutMs ?? DEFAULT_FRAME_TIMEOUT_MS
    const abandonMs = host.dispatch.shortestAbandonMs
    this.#abandoning = abandonMs !== Infinity
    const positive = (ms: number): number => ms > 0 ? ms : Infinity
    const softMs = host.pushLimit.softBytes > 0 ? Math.max(host.pushLimit.softMs, 40) : Infinity
    // The frame rate needs the scan to see partial frames (for admission too): at most a second apart.
    const rateMs = host.minFrameRate > 0 ? Math.max(host.slowFrameGraceMs, 4 * MIN_EVICTABLE_IDLE_MS) : Infinity
    // Connections whose reading is paused are probed (probeRead) at least once a second, whatever the limits.
    const shortest = Math.min(positive(idleMs), positive(maxAgeMs), positive(frameMs), abandonMs, softMs, rateMs, 4 * PROBE_PERIOD_MS)
    if (shortest === Infinity || this.#timer !== null) return
    const periodMs = Math.max(10, Math.min(1000, shortest / 4))
    let lastScanAt = host.clock.now()
    const scan = (): void => {
      this.#timer = host.clock.setTimer(scan, periodMs)
      const now = host.clock.now()
      // A scan late by more than a period ran after an event-loop stall,
      // before the reads that waited meanwhile: it judges no frame's rate.
      const onTime = now - lastScanAt <= 2 * periodMs
      lastScanAt = now
      if (this.#abandoning) host.dispatch.abandonOverdue(now)
      // Over the soft push limit: closed once there for softMs, forgotten once below (pushes may have stopped).
      if (host.overSoft.size > 0) for (const sc of [...host.overSoft]) host.judgePushed(sc, now)
      host.checkDescriptors()
      for (const sc of host.connections) {
        const connection = sc.connection
        // Paused, the socket is not polled: a read tells whether its peer has gone (and closes it if so).
        if (connection.isReadingPaused || connection.isReadingHeld || connection.isReadingSuspended) connection.probeRead()
        if (this.#partialFrameTimed(sc, now)) {
          if (frameMs > 0 && this.#frameOverdue(sc, now, frameMs)) continue
          if (onTime && this.#frameTooSlow(sc, now)) continue
        }
        const activity = connection.activity
        // Progress is a read, a send, a drain, or the kernel taking some of
        // what waits to go out. A peer stopped inside a frame makes none.
        const outbound = connection.outboundBytes + connection.writeQueueBytes
        if (activity !== sc.lastActivity || outbound !== sc.lastOutbound || sc.inFlight.size > 0) {
          sc.lastActivity = activity
          sc.lastOutbound = outbound
          sc.lastActiveAt = now
          if (sc.retiredAt >= 0 && sc.inFlight.size === 0 && !connection.isBusy && !connection.hasPartialFrame && now - sc.retiredAt >= RETIRED_BUSY_LIMIT_MS) this.#closeAged(sc)
          else if (sc.retiredAt < 0 && now >= sc.retireAt && sc.ready) sc.retiredAt = now
          continue
        }
        if (sc.retiredAt >= 0) {
          if (now - sc.lastActiveAt >= RETIRED_QUIET_MS) this.#closeAged(sc)
        } else if (now >= sc.retireAt && sc.ready) {
          sc.retiredAt = now
        } else if (idleMs > 0 && sc.ready && now - sc.lastActiveAt >= idleMs) {
          host.stats.idleClosed++
          const inFrame = connection.hasPartialFrame ? ', stopped inside a frame' : ''
          host.log.info(`closing idle connection from ${sc.remoteAddress} after ${idleMs} ms without progress${inFrame}`, { protocol: host.protocolName, remote: sc.remoteAddress, idleMs, inFrame: connection.hasPartialFrame })
          connection.destroy()
        }
      }
    }
    this.#timer = host.clock.setTimer(scan, periodMs)
  }


  // Follows the frame the connection is receiving (seen by the scan): true
  // when one has been seen arriving since an earlier scan, with the server
  // reading it; its clock starts when a scan first sees it.
  #partialFrameTimed (sc: ServerConnection, now: number): boolean {
    const connection = sc.connection
    if (!connection.hasPartialFrame) {
      sc.partialSince = -1
      return false
    }
    if (connection.isReadingPaused || connection.isReadingHeld || connection.isReadingSuspended) {
      // We stopped reading it (outbound budget or bound): the rest of its frame cannot arrive; its clock restarts.
      sc.partialSince = now
      return false
    }
    const frame = connection.framesRead
    if (sc.partialSince < 0 || sc.partialFrame !== frame) {
      sc.partialFrame = frame
      sc.partialSince = now
      return false
    }
    return true
  }

  // Closes the connection when its frame in progress arrives below
  // minFrameBytesPerSecond past slowFrameGraceMs.
  #frameTooSlow (sc: ServerConnection, now: number): boolean {
    const host = this.#host
    const rate = host.minFrameRate
    if (rate <= 0) return false
    const bytes = sc.connection.partialFrameBytes
    const arrivingMs = now - sc.partialSince
    if (!isSlowFrame(bytes, arrivingMs, host.slowFrameGraceMs, rate)) return false
    host.stats.slowFramesClosed++
    const ms = Math.round(arrivingMs)
    this.#logSlowFrame.log(host.warn, () => `closing ${sc.remoteAddress}: ${bytes} bytes of a frame in ${ms} ms, below ${rate} bytes/s past ${host.slowFrameGraceMs} ms`,
      () => ({ protocol: host.protocolName, remote: sc.remoteAddress, frameBytes: bytes, arrivingMs: ms, minFrameBytesPerSecond: rate }))
    sc.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `frame arriving below ${rate} bytes/s`))
    return true
  }

  // Closes the connection when the frame it is receiving started arriving
  // `frameMs` ago (seen by the scan; at most a scan period late).
  #frameOverdue (sc: ServerConnection, now: number, frameMs: number): boolean {
    const host = this.#host
    const connection = sc.connection
    if (now - sc.partialSince < frameMs) return false
    host.stats.frameTimeouts++
    const arrivingMs = Math.round(now - sc.partialSince)
    this.#logFrameTimeout.log(host.warn, () => `closing ${sc.remoteAddress}: a frame has been arriving for ${arrivingMs} ms (frame timeout ${frameMs} ms)`,
      () => ({ protocol: host.protocolName, remote: sc.remoteAddress, arrivingMs, frameTimeoutMs: frameMs }))
    connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `frame not complete within ${frameMs} ms`))
    return true
  }

  #closeAged (sc: ServerConnection): void {
    const host = this.#host
    host.stats.agedClosed++
    host.log.info(`closing ${sc.remoteAddress}: it reached its maximum age of ${host.options.maxConnectionAgeMs} ms`, { protocol: host.protocolName, remote: sc.remoteAddress, maxConnectionAgeMs: host.options.maxConnectionAgeMs })
    sc.connection.destroy()
  }
}
