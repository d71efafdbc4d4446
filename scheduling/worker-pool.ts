/**
 * The worker half of Kudu's `LifoServiceQueue` plus `ServicePool`
 * (docs/design.md, 'Workers'), for one event loop: a worker is a concurrency slot
 * that runs one (possibly async) handler at a time.
 *
 * Idle workers park on a stack and a new item goes straight to the most
 * recently parked one, never through the queue. In Kudu that keeps hot
 * threads hot; here it mainly means the deadline queue costs nothing until
 * there is a backlog, and worker ids stay concentrated on few slots (so
 * per-worker state stays warm). Items that wait past their deadline are
 * answered 'expired' without running: at dequeue, as Kudu does, and also by a
 * timer at the earliest queued deadline, so an expired item does not hold a
 * slot that a live call could use.
 */
import type { Clock, TimerHandle } from './clock.js'
import type { DeadlineQueue, Queued } from './service-queue.js'

/** Why an item was not run. */
export type RejectReason = 'full' | 'evicted' | 'expired' | 'shutdown'

export interface WorkerPoolOptions<T extends Queued> {
  /** Concurrency slots, numbered 0..workers-1; 0 only queues (items run never). */
  workers: number
  /** Owned by the pool from now on; must be empty. */
  queue: DeadlineQueue<T>
  clock: Clock
  /**
   * Handles one item on `worker`. Expected to deal with its own errors: a
   * throw or a rejected promise only ends the run (it is swallowed).
   */
  run: (item: T, worker: number) => Promise<void> | void
  /** Answers an item that will not run. Called exactly once per such item; must not throw. */
  reject: (item: T, reason: RejectReason, message: string) => void
  /** Prefix of rejection messages, e.g. "Ping request on Svc from 1.2.3.4:5"; default "call". */
  describe?: ((item: T) => string) | undefined
}

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

// Longer timer delays overflow setTimeout into 1 ms; a timer this long just
// fires early and is re-armed.
const MAX_TIMER_MS = 2 ** 31 - 1

function isThenable (value: unknown): value is PromiseLike<void> {
  return typeof (value as PromiseLike<void> | undefined)?.then === 'function'
}

/**
 * Runs submitted items on `workers` slots, queueing the rest in a
 * `DeadlineQueue`. Every submitted item is either run once or rejected once.
 *
 * Invariant: parked workers and queued items never coexist (an item is
 * only queued when no worker is parked, and a worker only parks when the
 * queue is empty).
 */
export class WorkerPool<T extends Queued> {
  readonly #workers: number
  readonly #queue: DeadlineQueue<T>
  readonly #clock: Clock
  readonly #run: (item: T, worker: number) => Promise<void> | void
  readonly #reject: (item: T, reason: RejectReason, message: string) => void
  readonly #describe: (item: T) => string
  /** Idle workers; the end is the most recently parked, the next to get work. */
  readonly #parked: number[] = []
  readonly #settled: Array<() => void> = []
  /** Worker ids given up by `abandon` whose run has not settled yet; their settlement is dropped. */
  readonly #abandoned = new Set<number>()
  /** Ids of abandoned runs that have settled since, to be reused by the next `abandon`. */
  readonly #freeIds: number[] = []
  readonly #stats: WorkerPoolStats = {
    submitted: 0, handedOff: 0, queued: 0, overflows: 0, evictions: 0, expired: 0, shutdownRejected: 0, completed: 0
  }

  /** The one expiry timer, due at or before the earliest queued deadline. */
  #expiryTimer: TimerHandle | undefined
  #expiryAt = Infinity

  #closed = false
  #closing: Promise<void> | undefined
  #resolveClosing: (() => void) | undefined
  #graceTimer: TimerHandle | undefined
  #graceEnd = Infinity

  constructor (options: WorkerPoolOptions<T>) {
    const { workers, queue } = options
    if (!Number.isSafeInteger(workers) || workers < 0) {
      throw new RangeError(`workers must be a non-negative integer, got ${workers}`)
    }
    if (queue.length > 0) throw new Error('the queue must be empty: the pool would have idle workers beside queued items')
    this.#workers = workers
    this.#queue = queue
    this.#clock = options.clock
    this.#run = options.run
    this.#reject = options.reject
    this.#describe = options.describe ?? (() => 'call')
    // All start parked with worker 0 on top, so work goes to 0, then 1, ...
    for (let worker = workers - 1; worker >= 0; worker--) this.#parked.push(worker)
    // One settle callback per worker, made once: no closure per item.
    for (let worker = 0; worker < workers; worker++) this.#addSettled()
  }

  #addSettled (): number {
    const worker = this.#settled.length
    this.#settled.push(() => {
      if (this.#abandoned.delete(worker)) {
        // The abandoned run finally settled: its id can replace a later one.
        this.#freeIds.push(worker)
        return
      }
      this.#stats.completed++
      this.#runOn(worker, this.#next())
    })
    return worker
  }

  /** Runs abandoned by `abandon` that have not settled yet. */
  get abandonedRuns (): number {
    return this.#abandoned.size
  }

  /**
   * Gives up on the run of `worker` (a handler still running long after
   * its call's deadline): the slot is handed to a new worker id at once,
   * which takes the next queued item or parks, and the abandoned run's
   * eventual settlement is dropped. The caller answers the item. Does
   * nothing for a worker that is parked or already abandoned.
   */
  abandon (worker: number): void {
    if (this.#abandoned.has(worker) || this.#parked.includes(worker) || worker >= this.#settled.length) return
    this.#abandoned.add(worker)
    const replacement = this.#freeIds.pop() ?? this.#addSettled()
    this.#stats.completed++
    this.#runOn(replacement, this.#next())
  }

  get idleWorkers (): number {
    return this.#parked.length
  }

  get busyWorkers (): number {
    return this.#workers - this.#parked.length
  }

  get queueLength (): number {
    return this.#queue.length
  }

  /** Runs that have settled; grows whenever the pool makes progress. */
  get completed (): number {
    return this.#stats.completed
  }

  /** A snapshot of the counters. */
  get stats (): WorkerPoolStats {
    return { ...this.#stats }
  }

  /** True once `close` has been called. */
  get closed (): boolean {
    return this.#closed
  }

  /** No worker is parked and the queue is full: the next submit would be refused or evict. */
  saturated (): boolean {
    return this.#parked.length === 0 && this.#queue.length >= this.#queue.maxLength
  }

  /**
   * Runs `item` on the most recently parked worker, or queues it; or
   * rejects it ('shutdown', 'expired' if its deadline has passed already,
   * 'full'), possibly evicting a queued item instead ('evicted').
   */
  submit (item: T, now?: number): void {
    const stats = this.#stats
    stats.submitted++
    if (this.#closed) {
      stats.shutdownRejected++
      this.#notify(item, 'shutdown')
      return
    }
    // Checked before taking a slot: a dead call must neither run nor evict a
    // live one. Without a deadline there is nothing to check (nor a clock to read).
    if (item.deadline !== Infinity && (now ?? this.#clock.now()) >= item.deadline) {
      stats.expired++
      this.#notify(item, 'expired')
      return
    }
    const worker = this.#parked.pop()
    if (worker !== undefined) {
      stats.handedOff++
      this.#runOn(worker, item)
      return
    }
    const dropped = this.#queue.put(item)
    if (dropped !== item) stats.queued++
    if (dropped === item) stats.overflows++
    else if (dropped !== undefined) stats.evictions++
    this.#armExpiry()
    if (dropped !== undefined) this.#notify(dropped, dropped === item ? 'full' : 'evicted')
  }

  /**
   * Stops accepting items (later submits are rejected 'shutdown'). Queued
   * items still run as workers free up; those still queued `graceMs` from
   * now are rejected 'shutdown'. Resolves once the queue is empty and every
   * worker is idle. Calling again returns the same promise, and can only
   * shorten the grace period.
   */
  close (graceMs: number): Promise<void> {
    if (Number.isNaN(graceMs) || graceMs < 0) throw new RangeError(`graceMs must be >= 0, got ${graceMs}`)
    this.#closed = true
    this.#closing ??= new Promise<void>(resolve => { this.#resolveClosing = resolve })
    const end = this.#clock.now() + graceMs
    if (this.#resolveClosing !== undefined && end < this.#graceEnd) {
      this.#graceEnd = end
      this.#armGrace()
    }
    this.#settleClosing()
    return this.#closing
  }

  /** Runs `first` and then queued items on `worker` until the queue is empty, then parks it. */
  #runOn (worker: number, first: T | undefined): void {
    // A loop, not recursion: many synchronous runs in a row must not grow the stack.
    for (let item = first; item !== undefined; item = this.#next()) {
      const pending = this.#invoke(item, worker)
      if (pending !== undefined) {
        const settled = this.#settled[worker]!
        // A native promise settles once; Promise.resolve tames odd thenables (settling twice, throwing).
        if (pending instanceof Promise) pending.then(settled, settled)
        else void Promise.resolve(pending).then(settled, settled)
        return
      }
      this.#stats.completed++
    }
    this.#parked.push(worker)
    this.#settleClosing()
  }

  /** Calls `run`; returns its promise if it is async, undefined once it has finished. */
  #invoke (item: T, worker: number): PromiseLike<void> | undefined {
    try {
      const result = this.#run(item, worker)
      return isThenable(result) ? result : undefined
    } catch {
      // `run` answers its own errors; a throw ends the run like a return.
      return undefined
    }
  }

  /** The next item to run, after rejecting the expired ones ahead of it. */
  #next (): T | undefined {
    this.#expireDue()
    const item = this.#queue.take()
    if (item !== undefined) this.#armExpiry()
    return item
  }

  #expireDue (): void {
    // An empty queue (the common case between calls) needs no clock reading.
    const earliest = this.#queue.earliestDeadline()
    if (earliest === Infinity) return
    const now = this.#clock.now()
    if (earliest > now) return
    const expired = this.#queue.takeExpired(now)
    this.#stats.expired += expired.length
    this.#armExpiry()
    for (const item of expired) this.#notify(item, 'expired')
  }

  /**
   * Keeps the expiry timer due at or before the earliest queued deadline.
   * It is replaced only when that deadline moves earlier; when the deadline
   * moves later the timer fires early, finds nothing, and re-arms.
   */
  #armExpiry (): void {
    const earliest = this.#queue.earliestDeadline()
    if (earliest === Infinity) {
      this.#disarmExpiry()
      return
    }
    if (this.#expiryTimer !== undefined && this.#expiryAt <= earliest) return
    this.#disarmExpiry()
    this.#expiryAt = earliest
    const delay = Math.min(earliest - this.#clock.now(), MAX_TIMER_MS)
    this.#expiryTimer = this.#clock.setTimer(() => {
      this.#expiryTimer = undefined
      this.#expiryAt = Infinity
      this.#expireDue()
      this.#armExpiry()
      this.#settleClosing()
    }, delay)
  }

  #disarmExpiry (): void {
    if (this.#expiryTimer === undefined) return
    this.#clock.clearTimer(this.#expiryTimer)
    this.#expiryTimer = undefined
    this.#expiryAt = Infinity
  }

  #armGrace (): void {
    if (this.#graceTimer !== undefined) this.#clock.clearTimer(this.#graceTimer)
    this.#graceTimer = undefined
    if (this.#graceEnd === Infinity) return
    const delay = Math.min(this.#graceEnd - this.#clock.now(), MAX_TIMER_MS)
    this.#graceTimer = this.#clock.setTimer(() => {
      this.#graceTimer = undefined
      if (this.#clock.now() < this.#graceEnd) {
        this.#armGrace() // a capped delay fired early
        return
      }
      const left = this.#queue.drain()
      this.#stats.shutdownRejected += left.length
      this.#armExpiry()
      for (const item of left) this.#notify(item, 'shutdown')
      this.#settleClosing()
    }, delay)
  }

  /** Resolves `close()` once closed, drained and idle, and drops its timers. */
  #settleClosing (): void {
    const resolve = this.#resolveClosing
    if (resolve === undefined || this.#queue.length > 0 || this.#parked.length < this.#workers) return
    this.#resolveClosing = undefined
    if (this.#graceTimer !== undefined) this.#clock.clearTimer(this.#graceTimer)
    this.#graceTimer = undefined
    this.#disarmExpiry()
    resolve()
  }

  #notify (item: T, reason: RejectReason): void {
    try {
      this.#reject(item, reason, this.#message(item, reason))
    } catch (error) {
      // The pool's books are already updated; surface the bug without
      // leaving the remaining items of a batch unanswered.
      queueMicrotask(() => { throw error })
    }
  }

  #message (item: T, reason: RejectReason): string {
    const what = this.#describe(item)
    switch (reason) {
      case 'full':
      case 'evicted':
        return `${what} dropped due to backpressure: service queue is full with ${this.#queue.maxLength} items`
      case 'expired':
        return `${what} waited in the queue past client deadline`
      case 'shutdown':
        return `${what} rejected: server is shutting down`
    }
  }
}
