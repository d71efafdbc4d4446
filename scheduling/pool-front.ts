/**
 * What every worker pool (`WorkerPool`, and `TokenPool` when the reactors
 * share one scheduler) does with an item before it looks for a worker, and
 * how it runs one and answers one that will not run: the counters, the
 * closed flag, the arrival checks, the rejection and its message, and a run
 * that may be asynchronous.
 */
import type { Clock } from './clock.js'
import type { Queued } from './service-queue.js'

/** Why an item was not run. */
export type RejectReason = 'full' | 'evicted' | 'expired' | 'shutdown'

/** Counters since construction. `submitted` = settled by run or reject + in flight + queued. */
export interface WorkerPoolStats {
  submitted: number
  /** Given straight to a parked worker. */
  handedOff: number
  /** Admitted to the queue (including newcomers that evicted an item). */
  queued: number
  /** Newcomers refused because the queue was full. */
  overflows: number
  /** Queued items pushed out by a newcomer with an earlier deadline. */
  evictions: number
  /** Rejected for a passed deadline: on arrival, by the expiry timer or at dequeue. */
  expired: number
  /** Rejected because the pool was closing. */
  shutdownRejected: number
  /** Runs that settled (returned, resolved, threw or rejected). */
  completed: number
}

/** What a pool's front needs of the pool's options. */
export interface PoolFrontOptions<T extends Queued> {
  clock: Clock
  reject: (item: T, reason: RejectReason, message: string) => void
  describe?: ((item: T) => string) | undefined
}

// Longer timer delays overflow setTimeout into 1 ms; a timer this long just
// fires early and is re-armed.
export const MAX_TIMER_MS = 2 ** 31 - 1

/**
 * One pool's counters, closed flag and rejections. `full` says why a full
 * pool dropped an item ('full', 'evicted'), after "dropped due to
 * backpressure: ".
 */
export class PoolFront<T extends Queued> {
  readonly stats: WorkerPoolStats = {
    submitted: 0, handedOff: 0, queued: 0, overflows: 0, evictions: 0, expired: 0, shutdownRejected: 0, completed: 0
  }

  /** True once the pool's `close` has been called: later submits are rejected 'shutdown'. */
  closed = false
  readonly #clock: Clock
  readonly #reject: (item: T, reason: RejectReason, message: string) => void
  readonly #describe: (item: T) => string
  readonly #full: string

  constructor (options: PoolFrontOptions<T>, full: string) {
    this.#clock = options.clock
    this.#reject = options.reject
    this.#describe = options.describe ?? (() => 'call')
    this.#full = full
  }

  /**
   * Counts `item` as submitted; false when it was answered instead: the
   * pool is closing ('shutdown') or its deadline has passed ('expired';
   * checked before it takes a slot: a dead call must neither run nor evict a
   * live one; without a deadline there is no clock to read). `now` is the
   * clock's reading if the caller has one.
   */
  admit (item: T, now: number | undefined): boolean {
    const stats = this.stats
    stats.submitted++
    if (this.closed) {
      stats.shutdownRejected++
      this.notify(item, 'shutdown')
      return false
    }
    if (item.deadline !== Infinity && (now ?? this.#clock.now()) >= item.deadline) {
      stats.expired++
      this.notify(item, 'expired')
      return false
    }
    return true
  }

  /** Answers an item that will not run, once. A throw from `reject` surfaces later: the pool's books are already updated, and the rest of a batch is still answered. */
  notify (item: T, reason: RejectReason): void {
    try {
      this.#reject(item, reason, this.#message(item, reason))
    } catch (error) {
      queueMicrotask(() => { throw error })
    }
  }

  #message (item: T, reason: RejectReason): string {
    const what = this.#describe(item)
    switch (reason) {
      case 'full':
      case 'evicted':
        return `${what} dropped due to backpressure: ${this.#full}`
      case 'expired':
        return `${what} waited in the queue past client deadline`
      case 'shutdown':
        return `${what} rejected: server is shutting down`
    }
  }
}

function isThenable (value: unknown): value is PromiseLike<void> {
  return typeof (value as PromiseLike<void> | undefined)?.then === 'function'
}

/**
 * Runs `item` on `worker`: true when the run finished (returned, or threw:
 * `run` answers its own errors, a throw ends the run as a return does);
 * false when it is asynchronous, and then `settled[worker]` (made once per
 * worker: no closure per item) is called once it settles, resolved or
 * rejected.
 */
export function runItem<T> (run: (item: T, worker: number) => Promise<void> | void, item: T, worker: number, settled: ReadonlyArray<() => void>): boolean {
  let pending: PromiseLike<void>
  try {
    const result = run(item, worker)
    if (!isThenable(result)) return true
    pending = result
  } catch {
    return true
  }
  const done = settled[worker]!
  // A native promise settles once; Promise.resolve tames odd thenables (settling twice, throwing).
  if (pending instanceof Promise) pending.then(done, done)
  else void Promise.resolve(pending).then(done, done)
  return false
}
