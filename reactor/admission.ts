/**
 * Connection admission for one reactor: how many connections it keeps, and
 * which one makes room when a new one arrives at the limit.
 *
 * A silent connection costs its peer almost nothing, so an unbounded server
 * is locked out by whoever opens the most. Past `maxConnections` a newcomer
 * is admitted by closing, in this order: the oldest connection still
 * negotiating (the one that has had the longest to finish); the one idle
 * longest that never sent a request since its set-up; the one trickling a
 * frame slowest (a byte every few hundred ms, as slowloris does: once its
 * frame in progress has been arriving for `MIN_EVICTABLE_IDLE_MS` below the
 * minimum rate, `slowestFrame`); any other one idle longest. An idle one
 * has been idle at least `MIN_EVICTABLE_IDLE_MS`, with nothing in flight
 * and nothing unsent. A session (a member of a `ConnectionGroup`, or one
 * its protocol marked with `ConnectionHandle.markSession`: a subscriber
 * waits quietly by design) is never closed for a newcomer; when only such
 * connections and busy ones are left, the newcomer is refused at once.
 * Connections still negotiating have a smaller limit of their own; past it
 * the oldest of them makes room.
 */
import { readFileSync, readdir } from 'node:fs'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { ConnectionGuard } from './connection-guard.js'
import type { RateLimitedLog } from './logger.js'
import type { ServerContext } from './server-context.js'
import { DESCRIPTOR_SLACK, atLeastOne, nonNegative, type ServerOptions } from './server-options.js'

/** An established connection may be closed for a newcomer only after this long without activity. */
export const MIN_EVICTABLE_IDLE_MS = 1000
/** The default minimum rate of a frame in progress, bytes per second (8 kbit/s: below any real network, far above a slowloris drip). */
export const DEFAULT_MIN_FRAME_BYTES_PER_SECOND = 1000
/** The default time a frame in progress may take before the minimum rate applies to it in the idle scan. */
export const DEFAULT_SLOW_FRAME_GRACE_MS = 10_000
/** The default limit on connections still negotiating. */
export const DEFAULT_MAX_NEGOTIATING_CONNECTIONS = 1000
/** Without a readable descriptor limit (not Linux), the default connection limit. */
export const FALLBACK_MAX_CONNECTIONS = 10_000

/** `minFrameBytesPerSecond` resolved and checked (0: off). */
export function minFrameRateOf (options: ServerOptions): number {
  return nonNegative(options.minFrameBytesPerSecond ?? DEFAULT_MIN_FRAME_BYTES_PER_SECOND, 'minFrameBytesPerSecond')
}

/** Descriptors kept for the server's own files, listeners, pipes and outgoing sockets. */
export function descriptorReserve (limit: number): number {
  return Math.max(64, Math.ceil(limit / 16))
}

/** The soft "Max open files" limit in the text of `/proc/self/limits`; undefined when absent or unlimited. */
export function parseOpenFilesLimit (limits: string): number | undefined {
  const match = /^Max open files\s+(\d+|unlimited)\s/m.exec(limits)
  if (match === null || match[1] === 'unlimited') return undefined
  return Number(match[1])
}

/**
 * The default `maxConnections`: the process's descriptor limit less a
 * reserve (1/16 of it, at least 64), so that the reactor refuses or makes
 * room before accept() runs out of descriptors. 960 under `ulimit -n 1024`.
 */
export function defaultMaxConnections (limits = readLimits()): number {
  const limit = limits === undefined ? undefined : parseOpenFilesLimit(limits)
  if (limit === undefined) return FALLBACK_MAX_CONNECTIONS
  return Math.max(1, limit - descriptorReserve(limit))
}

/** The process's soft descriptor limit (Linux), read once; undefined where it cannot be read. */
export function descriptorLimit (limits = readLimits()): number | undefined {
  return limits === undefined ? undefined : parseOpenFilesLimit(limits)
}

/**
 * Counts the descriptors this process has open (Linux: `/proc/self/fd`),
 * off the event loop; `done` gets undefined where that cannot be read, and
 * `Infinity` when it cannot be opened for want of a descriptor (EMFILE,
 * ENFILE): the process is out of them.
 */
export function countOpenDescriptors (done: (open: number | undefined) => void): void {
  readdir('/proc/self/fd', (error, entries) => {
    if (error !== null) done(error.code === 'EMFILE' || error.code === 'ENFILE' ? Infinity : undefined)
    // One entry is the directory's own descriptor, open while it is read.
    else done(entries.length - 1)
  })
}

function readLimits (): string | undefined {
  try {
    return readFileSync('/proc/self/limits', 'utf8')
  } catch {
    return undefined
  }
}

/** What admission needs to know of an established connection. */
export interface AdmissionCandidate {
  /** Nothing in flight and nothing unsent, and no activity seen since `idleSince`. */
  readonly quiet: boolean
  /** Clock reading since which it has been seen idle. */
  readonly idleSince: number
}

/**
 * The candidate idle longest (at least `MIN_EVICTABLE_IDLE_MS` by `now`) of
 * those `eligible` accepts, or null when none may be closed.
 */
export function longestIdle<T extends AdmissionCandidate> (candidates: Iterable<T>, now: number, eligible?: (c: T) => boolean): T | null {
  let best: T | null = null
  for (const c of candidates) {
    if (!c.quiet || now - c.idleSince < MIN_EVICTABLE_IDLE_MS) continue
    if (eligible !== undefined && !eligible(c)) continue
    if (best === null || c.idleSince < best.idleSince) best = c
  }
  return best
}

/**
 * A frame in progress is slow when it has been arriving for more than
 * `graceMs` and holds fewer than `minBytesPerSecond` bytes for every
 * second past the grace (mod_reqtimeout's MinRate: the grace, then one
 * second more per `minBytesPerSecond` bytes received). Never with a rate of 0.
 */
export function isSlowFrame (bytes: number, arrivingMs: number, graceMs: number, minBytesPerSecond: number): boolean {
  return minBytesPerSecond > 0 && arrivingMs > graceMs && bytes * 1000 < minBytesPerSecond * (arrivingMs - graceMs)
}

/** What admission knows of a frame in progress: its bytes so far, and how long it has been seen arriving. */
export interface FrameProgress {
  readonly bytes: number
  readonly arrivingMs: number
}

/**
 * Of the candidates whose frame in progress is slow after
 * `MIN_EVICTABLE_IDLE_MS` (`progress` gives null for one that has none, or
 * may not be closed), the one receiving it slowest; null when there is none.
 */
export function slowestFrame<T> (candidates: Iterable<T>, progress: (c: T) => FrameProgress | null, minBytesPerSecond: number): T | null {
  if (!(minBytesPerSecond > 0)) return null
  let best: T | null = null
  let bestRate = Infinity
  for (const c of candidates) {
    const p = progress(c)
    if (p === null || !isSlowFrame(p.bytes, p.arrivingMs, MIN_EVICTABLE_IDLE_MS, minBytesPerSecond)) continue
    const rate = p.bytes / p.arrivingMs
    if (rate < bestRate) {
      best = c
      bestRate = rate
    }
  }
  return best
}

/** A connection as admission sees it: idle candidate, and the frame the scans follow. */
export interface FrameCandidate extends AdmissionCandidate {
  readonly remoteAddress: string
  /** A session (group member, or marked by its protocol): never closed for a newcomer. */
  readonly session: boolean
  /** It has sent a request frame since its set-up. */
  readonly spoke: boolean
  readonly inFlight: { readonly size: number }
  /** When a scan first saw its frame in progress (-1: none), and which frame that was (the scan's record). */
  readonly scan: { readonly partialSince: number, readonly partialFrame: number }
  readonly connection: {
    readonly hasPartialFrame: boolean
    readonly framesRead: number
    readonly isReadingPaused: boolean
    readonly isReadingHeld: boolean
    readonly isReadingSuspended: boolean
    readonly partialFrameBytes: number
    destroy: (error?: RpcError) => void
  }
}

/**
 * The server's admission of new connections, with the policy above: its
 * limits (`maxConnections`, `maxNegotiatingConnections`), the connections
 * still negotiating (oldest first), the evictions, refusals and accept
 * errors (counted, logged rate-limited), and the descriptor watch.
 */
export class Admission<C extends FrameCandidate> implements ConnectionGuard<C> {
  /** Connections still in set-up (TLS handshake or the protocol's), oldest first. */
  readonly negotiating = new Set<C>()
  readonly maxConnections: number
  readonly maxNegotiating: number
  readonly #ctx: ServerContext<C>
  /** `minFrameBytesPerSecond` resolved (0: off). */
  readonly #minFrameRate: number
  readonly #logRefused: RateLimitedLog
  readonly #logEvicted: RateLimitedLog
  readonly #logNegotiatingEvicted: RateLimitedLog
  readonly #logAcceptError: RateLimitedLog
  // accept()'s own EMFILE (the native transport sees it; libuv drops such connections unseen): a line of its own, so the scan's line still shows.
  readonly #logAcceptEmfile: RateLimitedLog
  /** The process's descriptor limit (Linux), and whether a count of open descriptors is under way. */
  readonly #fdLimit = descriptorLimit()
  #countingFds = false

  constructor (ctx: ServerContext<C>) {
    this.#ctx = ctx
    this.#minFrameRate = minFrameRateOf(ctx.options)
    const maxConnections = ctx.options.maxConnections
    const maxNegotiating = ctx.options.maxNegotiatingConnections
    this.maxConnections = atLeastOne(maxConnections ?? defaultMaxConnections(), 'maxConnections')
    // At most half the connections may be in set-up, so silent openers cannot take them all.
    this.maxNegotiating = atLeastOne(maxNegotiating ?? Math.min(DEFAULT_MAX_NEGOTIATING_CONNECTIONS, Math.ceil(this.maxConnections / 2)), 'maxNegotiatingConnections')
    this.#logRefused = ctx.rateLimitedLog()
    this.#logEvicted = ctx.rateLimitedLog()
    this.#logNegotiatingEvicted = ctx.rateLimitedLog()
    this.#logAcceptError = ctx.rateLimitedLog()
    this.#logAcceptEmfile = ctx.rateLimitedLog()
  }

  /** Counts open descriptors once per scan tick. */
  tick (): void {
    this.checkDescriptors()
  }

  /** A closed connection no longer negotiates. */
  closed (sc: C): void {
    this.negotiating.delete(sc)
  }

  /** accept() failed for want of descriptors (libuv dropped the connection; accepting goes on once some are free). */
  outOfDescriptors (code: string): void {
    const ctx = this.#ctx
    ctx.counters.acceptError()
    this.#logAcceptEmfile.log(ctx.error, () => `accept failed: ${code} (out of file descriptors; ${ctx.connections.size} connections open, limit ${this.maxConnections})`,
      () => ({ protocol: ctx.protocol.name, code, connectionsOpen: ctx.connections.size, maxConnections: this.maxConnections }))
  }

  /** The protocol's connectionState or node:tls threw for a new connection (already closed): counted and logged. */
  setUpFailed (remoteAddress: string, err: unknown): void {
    const ctx = this.#ctx
    ctx.counters.acceptError()
    this.#logAcceptError.log(ctx.error, () => `cannot set up the connection from ${remoteAddress}: ${(err as Error).message}; closing it`,
      () => ({ protocol: ctx.protocol.name, remote: remoteAddress }))
  }

  /** Makes room for a new connection, or refuses it (false: destroyed). */
  admit (accepted: { readonly remoteAddress?: string | undefined, readonly remotePort?: number | undefined, destroy: () => unknown }): boolean {
    const ctx = this.#ctx
    // The oldest negotiating connection has had the longest to finish.
    if (this.negotiating.size >= this.maxNegotiating) this.#evictNegotiating(`${this.negotiating.size} connections negotiating (the limit)`)
    if (ctx.connections.size < this.maxConnections) return true
    // Silent connections in set-up are cheap to open and have not shown who they are: they go first.
    if (this.#evictNegotiating(`${ctx.connections.size} connections open (the limit)`)) return true
    const now = ctx.clock.now()
    // Then one that never sent a request since its set-up (a silent opener), idle longest.
    const silent = longestIdle(ctx.connections, now, (sc) => !sc.session && !sc.spoke)
    if (silent !== null) {
      this.#evictIdle(silent, now, 'never sent a request')
      return true
    }
    // Then one trickling a frame (never idle, so slowloris), the slowest first.
    const slow = slowestFrame(ctx.connections, (sc) => !sc.session && sc.inFlight.size === 0 ? frameProgress(sc, now) : null, this.#minFrameRate)
    if (slow !== null) {
      const progress = frameProgress(slow, now)!
      ctx.counters.connectionEvicted()
      ctx.counters.slowFrameClosed()
      this.#logEvicted.log(ctx.warn, () => `${ctx.connections.size} connections open (the limit): closing ${slow.remoteAddress}, ${progress.bytes} bytes of a frame in ${Math.round(progress.arrivingMs)} ms (below ${this.#minFrameRate} bytes/s), for a new one`,
        () => ({ protocol: ctx.protocol.name, remote: slow.remoteAddress, frameBytes: progress.bytes, arrivingMs: Math.round(progress.arrivingMs), connectionsOpen: ctx.connections.size, maxConnections: this.maxConnections }))
      slow.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed: its frame arrived slowest when the server was at its connection limit'))
      return true
    }
    // Then any other quiet one that is not a session, idle longest; but not while a silent
    // opener is left, too fresh to close: a flood of them is met by refusing newcomers until
    // they can be closed, not by closing clients that have used their connections.
    const idle = hasSilent(ctx.connections) ? null : longestIdle(ctx.connections, now, (sc) => !sc.session)
    if (idle !== null) {
      this.#evictIdle(idle, now, 'idle longest')
      return true
    }
    // Sessions (subscribers wait quietly by design) and busy connections are kept: the newcomer is refused.
    ctx.counters.connectionRefused()
    this.#logRefused.log(ctx.warn, () => `refusing a connection from ${accepted.remoteAddress ?? '?'}: ${ctx.connections.size} connections open (the limit) and none but sessions idle for ${MIN_EVICTABLE_IDLE_MS} ms nor trickling a frame`,
      () => ({ protocol: ctx.protocol.name, remote: `${accepted.remoteAddress ?? '?'}:${accepted.remotePort ?? 0}`, connectionsOpen: ctx.connections.size, maxConnections: this.maxConnections }))
    accepted.destroy()
    return false
  }

  #evictIdle (victim: C, now: number, why: string): void {
    const ctx = this.#ctx
    ctx.counters.connectionEvicted()
    this.#logEvicted.log(ctx.warn, () => `${ctx.connections.size} connections open (the limit): closing ${victim.remoteAddress}, idle ${Math.round(now - victim.idleSince)} ms (${why}), for a new one`,
      () => ({ protocol: ctx.protocol.name, remote: victim.remoteAddress, idleMs: Math.round(now - victim.idleSince), spoke: victim.spoke, connectionsOpen: ctx.connections.size, maxConnections: this.maxConnections }))
    victim.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `closed: ${why} when the server was at its connection limit`))
  }

  // Closes the oldest negotiating connection that is not a session; false when there is none.
  #evictNegotiating (why: string): boolean {
    const ctx = this.#ctx
    let oldest: C | null = null
    for (const sc of this.negotiating) {
      if (sc.session) continue
      oldest = sc
      break
    }
    if (oldest === null) return false
    const victim = oldest
    ctx.counters.negotiatingEvicted()
    this.#logNegotiatingEvicted.log(ctx.warn, () => `${why}: closing the oldest negotiating connection, from ${victim.remoteAddress}, for a new one`,
      () => ({ protocol: ctx.protocol.name, remote: victim.remoteAddress, negotiating: this.negotiating.size, maxNegotiating: this.maxNegotiating }))
    victim.connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, 'closed: too many connections negotiating'))
    return true
  }

  /**
   * Counts open descriptors off the loop (once per scan, never two counts
   * at once): at the limit, libuv drops new connections without telling us.
   */
  checkDescriptors (): void {
    const ctx = this.#ctx
    const limit = this.#fdLimit
    if (limit === undefined || this.#countingFds) return
    this.#countingFds = true
    countOpenDescriptors((open) => {
      this.#countingFds = false
      if (open === undefined || open < limit - DESCRIPTOR_SLACK) return
      ctx.counters.descriptorsExhausted()
      this.#logAcceptError.log(ctx.error, () => `out of file descriptors: ${open === Infinity ? limit : open} of ${limit} open (${ctx.connections.size} connections, limit ${this.maxConnections}); new connections are dropped until some close (lower --max-connections or raise ulimit -n)`,
        () => ({ protocol: ctx.protocol.name, code: 'EMFILE', descriptorsOpen: open === Infinity ? limit : open, descriptorLimit: limit, connectionsOpen: ctx.connections.size, maxConnections: this.maxConnections }))
    })
  }
}

/** The frame `sc` is receiving as the scans saw it (null: none, or not being read): admission judges its rate. */
export function frameProgress (sc: FrameCandidate, now: number): FrameProgress | null {
  const connection = sc.connection
  const scan = sc.scan
  if (scan.partialSince < 0 || !connection.hasPartialFrame || scan.partialFrame !== connection.framesRead) return null
  if (connection.isReadingPaused || connection.isReadingHeld || connection.isReadingSuspended) return null
  return { bytes: connection.partialFrameBytes, arrivingMs: now - scan.partialSince }
}

/** Some connection that is not a session has sent no request since its set-up. */
function hasSilent (candidates: Iterable<{ readonly session: boolean, readonly spoke: boolean }>): boolean {
  for (const c of candidates) if (!c.session && !c.spoke) return true
  return false
}
