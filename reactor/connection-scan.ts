import { ErrorCode, RpcError } from '../codec/errors.js'
import type { FramedConnection } from '../transport/framed-connection.js'
import { DEFAULT_SLOW_FRAME_GRACE_MS, MIN_EVICTABLE_IDLE_MS, isSlowFrame, minFrameRateOf } from './admission.js'
import type { ConnectionGuard } from './connection-guard.js'
import { closeWithLastWords } from './last-words.js'
import type { RateLimitedLog } from './logger.js'
import type { ServerContext } from './server-context.js'
import { DEFAULT_FRAME_TIMEOUT_MS, RETIRED_BUSY_LIMIT_MS, RETIRED_QUIET_MS, nonNegative } from './server-options.js'

/** The longest a connection whose reading is paused goes without a probe read (`FramedConnection.probeRead`). */
export const PROBE_PERIOD_MS = 1000

/** What the scan follows of one connection: its progress, the frame it is receiving, and its age. */
export class ScanRecord {
  /** The connection's activity count and unsent bytes at the last scan. */
  lastActivity = -1
  lastOutbound = 0
  /** When the scan last saw it make progress (at accept: when it was accepted). */
  lastActiveAt: number
  /** The incomplete frame the scan saw (by `framesRead`) and since when; -1: none. */
  partialFrame = -1
  partialSince = -1
  /** When the connection reaches its maximum age; Infinity without one. */
  retireAt = Number.POSITIVE_INFINITY
  /** Since when new calls are refused (the connection is past its age); -1 before. */
  retiredAt = -1
  /** The connection has an idle timeout of its own (`ConnectionHandle.setIdleTimeout`): the server's does not apply. */
  ownIdle = false

  constructor (now: number) {
    this.lastActiveAt = now
  }
}

/** What the scan needs of a connection. */
export interface Scanned {
  readonly connection: FramedConnection
  readonly remoteAddress: string
  readonly inFlight: { readonly size: number }
  /** Its set-up is done. */
  readonly ready: boolean
  readonly scan: ScanRecord
  /** The protocol's state of it (for its last words). */
  readonly state: unknown
}

/**
 * The scan's guard over each connection's progress: closes idle
 * connections and frames that take too long (`frameTimeoutMs`) or arrive
 * too slowly (`minFrameBytesPerSecond`), retires connections past
 * `maxConnectionAgeMs` (new calls are refused, then the connection closes
 * once quiet), and probes connections whose reading is paused (their peer
 * may have gone unseen). Its record on each connection is `ScanRecord`.
 */
export class ConnectionScan implements ConnectionGuard<Scanned> {
  readonly #ctx: ServerContext
  /** `minFrameBytesPerSecond` (0: off) and `slowFrameGraceMs`, resolved. */
  readonly #minFrameRate: number
  readonly #slowFrameGraceMs: number
  // Peers choose how often these happen: each kind is rate-limited.
  readonly #logFrameTimeout: RateLimitedLog
  readonly #logSlowFrame: RateLimitedLog

  constructor (ctx: ServerContext) {
    this.#ctx = ctx
    const options = ctx.options
    this.#minFrameRate = minFrameRateOf(options)
    this.#slowFrameGraceMs = nonNegative(options.slowFrameGraceMs ?? DEFAULT_SLOW_FRAME_GRACE_MS, 'slowFrameGraceMs')
    this.#logFrameTimeout = ctx.rateLimitedLog()
    this.#logSlowFrame = ctx.rateLimitedLog()
  }

  /** A new connection's age limit, with jitter: connections opened together do not all reconnect together. */
  accepted (sc: Scanned): void {
    const maxAgeMs = this.#ctx.options.maxConnectionAgeMs ?? 0
    if (maxAgeMs > 0) sc.scan.retireAt = sc.scan.lastActiveAt + maxAgeMs * (0.9 + 0.2 * Math.random())
  }

  /** The shortest of its limits (read when the scan is armed: `maxConnectionAgeMs` may change). */
  scanEveryMs (): number {
    const options = this.#ctx.options
    const positive = (ms: number): number => ms > 0 ? ms : Infinity
    // The frame rate needs the scan to see partial frames (for admission too): at most a second apart.
    const rateMs = this.#minFrameRate > 0 ? Math.max(this.#slowFrameGraceMs, 4 * MIN_EVICTABLE_IDLE_MS) : Infinity
    // Connections whose reading is paused are probed (probeRead) at least once a second, whatever the limits.
    return Math.min(positive(options.idleTimeoutMs), positive(options.maxConnectionAgeMs ?? 0), positive(options.frameTimeoutMs ?? DEFAULT_FRAME_TIMEOUT_MS), rateMs, 4 * PROBE_PERIOD_MS)
  }

  /** One connection at a scan tick; true: closed. */
  scan (sc: Scanned, now: number, onTime: boolean): boolean {
    const options = this.#ctx.options
    const idleMs = options.idleTimeoutMs
    const frameMs = options.frameTimeoutMs ?? DEFAULT_FRAME_TIMEOUT_MS
    const connection = sc.connection
    const record = sc.scan
    // Paused, the socket is not polled: a read tells whether its peer has gone (and closes it if so).
    if (connection.isReadingPaused || connection.isReadingHeld || connection.isReadingSuspended) connection.probeRead()
    if (this.#partialFrameTimed(sc, now)) {
      if (frameMs > 0 && this.#frameOverdue(sc, now, frameMs)) return true
      if (onTime && this.#frameTooSlow(sc, now)) return true
    }
    const activity = connection.activity
    // Progress is a read, a send, a drain, or the kernel taking some of
    // what waits to go out. A peer stopped inside a frame makes none.
    const outbound = connection.outboundBytes + connection.writeQueueBytes
    if (activity !== record.lastActivity || outbound !== record.lastOutbound || sc.inFlight.size > 0) {
      record.lastActivity = activity
      record.lastOutbound = outbound
      record.lastActiveAt = now
      if (record.retiredAt >= 0 && sc.inFlight.size === 0 && !connection.isBusy && !connection.hasPartialFrame && now - record.retiredAt >= RETIRED_BUSY_LIMIT_MS) this.#closeAged(sc)
      else if (record.retiredAt < 0 && now >= record.retireAt && sc.ready) record.retiredAt = now
      return false
    }
    if (record.retiredAt >= 0) {
      if (now - record.lastActiveAt >= RETIRED_QUIET_MS) this.#closeAged(sc)
    } else if (now >= record.retireAt && sc.ready) {
      record.retiredAt = now
    } else if (idleMs > 0 && sc.ready && !record.ownIdle && now - record.lastActiveAt >= idleMs) {
      const ctx = this.#ctx
      ctx.counters.idleClosed()
      const inFrame = connection.hasPartialFrame ? ', stopped inside a frame' : ''
      ctx.log.info(`closing idle connection from ${sc.remoteAddress} after ${idleMs} ms without progress${inFrame}`, { protocol: ctx.protocol.name, remote: sc.remoteAddress, idleMs, inFrame: connection.hasPartialFrame })
      closeWithLastWords(ctx, sc, 'idle')
    }
    return false
  }

  // Follows the frame the connection is receiving (seen by the scan): true
  // when one has been seen arriving since an earlier scan, with the server
  // reading it; its clock starts when a scan first sees it.
  #partialFrameTimed (sc: Scanned, now: number): boolean {
    const connection = sc.connection
    const record = sc.scan
    if (!connection.hasPartialFrame) {
      record.partialSince = -1
      return false
    }
    if (connection.isReadingPaused || connection.isReadingHeld || connection.isReadingSuspended) {
      // We stopped reading it (outbound budget or bound): the rest of its frame cannot arrive; its clock restarts.
      record.partialSince = now
      return false
    }
    const frame = connection.framesRead
    if (record.partialSince < 0 || record.partialFrame !== frame) {
      record.partialFrame = frame
      record.partialSince = now
      return false
    }
    return true
  }

  // Closes the connection when its frame in progress arrives below
  // minFrameBytesPerSecond past slowFrameGraceMs.
  #frameTooSlow (sc: Scanned, now: number): boolean {
    const ctx = this.#ctx
    const rate = this.#minFrameRate
    if (rate <= 0) return false
    const bytes = sc.connection.partialFrameBytes
    const arrivingMs = now - sc.scan.partialSince
    const graceMs = this.#slowFrameGraceMs
    if (!isSlowFrame(bytes, arrivingMs, graceMs, rate)) return false
    ctx.counters.slowFrameClosed()
    const ms = Math.round(arrivingMs)
    this.#logSlowFrame.log(ctx.warn, () => `closing ${sc.remoteAddress}: ${bytes} bytes of a frame in ${ms} ms, below ${rate} bytes/s past ${graceMs} ms`,
      () => ({ protocol: ctx.protocol.name, remote: sc.remoteAddress, frameBytes: bytes, arrivingMs: ms, minFrameBytesPerSecond: rate }))
    closeWithLastWords(ctx, sc, 'slow-frame', new RpcError(ErrorCode.CONNECTION_CLOSED, `frame arriving below ${rate} bytes/s`))
    return true
  }

  // Closes the connection when the frame it is receiving started arriving
  // `frameMs` ago (seen by the scan; at most a scan period late).
  #frameOverdue (sc: Scanned, now: number, frameMs: number): boolean {
    const ctx = this.#ctx
    const connection = sc.connection
    const since = sc.scan.partialSince
    if (now - since < frameMs) return false
    ctx.counters.frameTimedOut()
    const arrivingMs = Math.round(now - since)
    this.#logFrameTimeout.log(ctx.warn, () => `closing ${sc.remoteAddress}: a frame has been arriving for ${arrivingMs} ms (frame timeout ${frameMs} ms)`,
      () => ({ protocol: ctx.protocol.name, remote: sc.remoteAddress, arrivingMs, frameTimeoutMs: frameMs }))
    closeWithLastWords(ctx, sc, 'frame-timeout', new RpcError(ErrorCode.CONNECTION_CLOSED, `frame not complete within ${frameMs} ms`))
    return true
  }

  #closeAged (sc: Scanned): void {
    const ctx = this.#ctx
    ctx.counters.agedClosed()
    ctx.log.info(`closing ${sc.remoteAddress}: it reached its maximum age of ${ctx.options.maxConnectionAgeMs} ms`, { protocol: ctx.protocol.name, remote: sc.remoteAddress, maxConnectionAgeMs: ctx.options.maxConnectionAgeMs })
    closeWithLastWords(ctx, sc, 'age')
  }
}
