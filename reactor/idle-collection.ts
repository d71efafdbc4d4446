/**
 * A full garbage collection once a server is idle after it grew: the
 * other half of giving memory back after an attack (the `idleCollection`
 * server option; every `ProtocolServer` runs one while it listens).
 *
 * Why: the buffers of an attack (1 MiB answers queued to peers that do not
 * read, partial frames) are external memory of JavaScript objects; they are
 * freed only when V8 collects those objects, and V8 collects when
 * JavaScript allocates. A server left idle after the attack allocates
 * nothing, so the garbage and its buffers stayed for minutes
 * (bench/rss-recovery.ts measured it). With glibc's mmap threshold fixed
 * (bin/nyala, examples/malloc-env.ts) a freed large buffer goes straight
 * back to the system; this makes sure it is freed.
 *
 * It costs one event-loop utilization sample and one RSS read every
 * `intervalMs`; it collects only when an interval was idle (utilization
 * below `idleBelow`), RSS stands `growthBytes` above where the last
 * collection left it, and there was work since that collection: under
 * load it never runs, after a burst it runs once. `NYALA_IDLE_GC=0` in the
 * environment turns it off.
 *
 * A collection that leaves RSS still grown has freed little: the memory
 * may still be held (peers that do not read leave the server idle while
 * their answers wait). It does not move the level RSS is compared with,
 * and the collection is tried again on later idle intervals, 2 and then 4
 * intervals apart, until one frees, or until `FUTILE_TRIES` in a row have
 * not: that RSS is then live data, and the new level. Before, one
 * collection during an attack set the level at the attack's peak, and
 * RSS stayed there after it (bench/rss-recovery.ts, 1 run in 8).
 *
 * After each collection it trims the C heap (transport/native/heap.ts:
 * glibc's malloc_trim through the native addon, loaded for it on any
 * `io`). The buffers of a flood of small frames are blocks below glibc's
 * mmap threshold; freed, they stayed mapped (RSS 4-10 x its level before,
 * 30 s after the attack) until this. Without the addon the trim is skipped
 * and that memory stays mapped, reused by later allocations.
 */
import { performance } from 'node:perf_hooks'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { trimHeap } from '../transport/native/heap.js'

/** The variable and value that turn the idle collection off, whatever the servers' options say. */
export const IDLE_COLLECTION_OPT_OUT = { name: 'NYALA_IDLE_GC', value: '0' } as const

/** When the idle collection runs (`ServerOptions.idleCollection`). */
export interface IdleCollectionOptions {
  /** How often it looks; default 5000 ms. */
  intervalMs?: number
  /** An interval whose event-loop utilization is below this is idle; default 0.05. */
  idleBelow?: number
  /** RSS above where the last collection (or the start) left it by at least this; default 64 MiB. */
  growthBytes?: number
  /** The RSS in bytes (tests); default process.memoryUsage.rss. */
  rss?: () => number
  /** The collection (tests); default V8's full collection. */
  collect?: () => void
  /** What gives the freed C heap back, after each collection (tests); default the native addon's malloc_trim, nothing without it. */
  trim?: () => void
}

/** The defaults of `IdleCollectionOptions`. */
export const IDLE_COLLECTION_DEFAULTS = { intervalMs: 5000, idleBelow: 0.05, growthBytes: 64 * 1024 * 1024 } as const

/** Collections in a row that left RSS grown after which the level is taken as live data. */
export const FUTILE_TRIES = 8

/** The most idle intervals let pass between two tries after collections that left RSS grown. */
const MAX_SKIPPED_INTERVALS = 3

let v8Collect: (() => void) | null = null

/** V8's full collection, without --expose-gc on the command line (a context made after the flag has `gc`). */
function fullCollection (): void {
  if (v8Collect === null) {
    setFlagsFromString('--expose-gc')
    v8Collect = runInNewContext('gc') as () => void
  }
  v8Collect()
}

/**
 * Starts the idle collection in this process (its timer does not keep the
 * process alive); answers the function that stops it. Does nothing (and
 * answers a no-op) when `env` has NYALA_IDLE_GC=0. A server starts one
 * when it listens and stops it when it closes.
 */
export function startIdleCollection (options: IdleCollectionOptions = {}, env: NodeJS.ProcessEnv = process.env): () => void {
  if (env[IDLE_COLLECTION_OPT_OUT.name] === IDLE_COLLECTION_OPT_OUT.value) return () => {}
  const intervalMs = options.intervalMs ?? IDLE_COLLECTION_DEFAULTS.intervalMs
  const idleBelow = options.idleBelow ?? IDLE_COLLECTION_DEFAULTS.idleBelow
  const growthBytes = options.growthBytes ?? IDLE_COLLECTION_DEFAULTS.growthBytes
  const rss = options.rss ?? ((): number => process.memoryUsage.rss())
  const collect = options.collect ?? fullCollection
  const trim = options.trim ?? trimHeap
  let floor = rss()
  let workedSinceCollection = false
  // Collections in a row that left RSS grown, and idle intervals to let pass before the next try.
  let futile = 0
  let skip = 0
  let last = performance.eventLoopUtilization()
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization()
    const utilization = performance.eventLoopUtilization(now, last).utilization
    last = now
    if (utilization >= idleBelow) {
      workedSinceCollection = true
      futile = 0
      skip = 0
      return
    }
    if (!workedSinceCollection) return
    if (skip > 0) {
      skip--
      return
    }
    if (rss() < floor + growthBytes) return
    collect()
    trim()
    const after = rss()
    if (after >= floor + growthBytes && ++futile < FUTILE_TRIES) {
      // Still held: again later, less often.
      skip = Math.min(2 ** futile - 1, MAX_SKIPPED_INTERVALS)
      return
    }
    workedSinceCollection = false
    futile = 0
    floor = after
  }, intervalMs)
  timer.unref()
  return () => clearInterval(timer)
}
