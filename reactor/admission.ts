/**
 * Connection admission for one reactor: how many connections it keeps, and
 * which one makes room when a new one arrives at the limit.
 *
 * A silent connection costs its peer almost nothing, so an unbounded server
 * is locked out by whoever opens the most. Past `maxConnections` a newcomer
 * is admitted by closing the connection that has been idle longest (idle at
 * least `MIN_EVICTABLE_IDLE_MS`, nothing in flight, nothing unsent); when
 * there is none, the newcomer is refused at once. Connections still
 * negotiating have a smaller limit of their own; past it the oldest of them
 * (the one that has had the longest to finish) makes room.
 *
 * A connection that is never idle but trickles a frame (a byte every few
 * hundred ms, as slowloris does) is no better than an idle one: once its
 * frame in progress has been arriving for `MIN_EVICTABLE_IDLE_MS` below
 * the minimum rate, it makes room too (`slowestFrame`).
 */
import { readFileSync, readdir } from 'node:fs'

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

/** The candidate idle longest (at least `MIN_EVICTABLE_IDLE_MS` by `now`), or null when none may be closed. */
export function longestIdle<T extends AdmissionCandidate> (candidates: Iterable<T>, now: number): T | null {
  let best: T | null = null
  for (const c of candidates) {
    if (!c.quiet || now - c.idleSince < MIN_EVICTABLE_IDLE_MS) continue
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
