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
import { MAX_TIMER_MS, PoolFront, runItem, type RejectReason, type WorkerPoolStats } from './pool-front.js'

export type { RejectReason, WorkerPoolStats } from './pool-front.js'

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
  /** The counters, the closed flag, the arrival checks and the rejections. */
  readonly #front: PoolFront<T>
  readonly #stats: WorkerPoolStats
  /** Idle workers; the end is the most recently parked, the next to get work. */
  readonly #parked: number[] = []
  readonly #settled: Array<() => void> = []
  /** Worker ids given up by `abandon` whose run has not settled yet; their settlement is dropped. */
  readonly #abandoned = new Set<number>()
  /** Ids of abandoned runs that have settled since, to be reused by the next `abandon`. */
  readonly #freeIds: number[] = []

  /** The one expiry timer, due at or before the earliest queued deadline. */
  #expiryTimer: TimerHandle | undefined
  #expiryAt = Infinity

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
    this.#front = new PoolFront(options, `service queue is full with ${queue.maxLength} items`)
    this.#stats = this.#front.stats
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
    return this.#front.closed
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
    if (!this.#front.admit(item, now)) return
    const stats = this.#stats
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
    if (dropped !== undefined) this.#front.notify(dropped, dropped === item ? 'full' : 'evicted')
  }

  /**
   * The most recently parked worker, for a caller that runs `item` itself
   * at once (an in-loop handler, most often finished before it returns):
   * taken and counted as `submit` would hand it over, without the trip
   * through `run`. -1 when `submit` must judge the item instead: no worker
   * is parked, the pool is closing, or the item's deadline has passed at
   * `now`. The caller gives the worker back with `ran`.
   */
  claim (item: T, now: number): number {
    const parked = this.#parked
    if (parked.length === 0 || this.#front.closed || (item.deadline !== Infinity && now >= item.deadline)) return -1
    const stats = this.#stats
    stats.submitted++
    stats.handedOff++
    return parked.pop()!
  }

  /**
   * The run of a `claim`ed worker ended (`pending` undefined), or ends when
   * `pending` settles; the worker then takes the next queued item or parks.
   */
  ran (worker: number, pending: Promise<void> | undefined): void {
    if (pending !== undefined) {
      const done = this.#settled[worker]!
      pending.then(done, done)
      return
    }
    this.#stats.completed++
    this.#runOn(worker, this.#next())
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
    this.#front.closed = true
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
      if (!runItem(this.#run, item, worker, this.#settled)) return
      this.#stats.completed++
    }
    this.#parked.push(worker)
    this.#settleClosing()
  }

  /** The next item to run, after rejecting the expired ones ahead of it. */
  #next (): T | undefined {
    // An empty queue (the common case) has nothing to expire or take.
    if (this.#queue.length === 0) return undefined
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
    for (const item of expired) this.#front.notify(item, 'expired')
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
      for (const item of left) this.#front.notify(item, 'shutdown')
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
}
