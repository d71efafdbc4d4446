/**
 * One service's workers in one reactor when the reactors of a server share
 * one scheduler (docs/scheduling.md, 'Several reactors: one scheduler'):
 * the reactor half of `token-broker.ts`. It does the job of `WorkerPool`
 * (same interface, same stats, every item run once or rejected once), but
 * its workers are tokens of the shared pool and its queue is the broker's.
 *
 * - An item that finds an idle token here runs on it at once, the most
 *   recently parked first, as in `WorkerPool`: no message to the broker.
 * - Otherwise it waits here, by id, and is `want`ed from the broker, which
 *   answers `grant` (run it: one more token here) or `refuse` (full,
 *   evicted, expired). The item itself never leaves the reactor.
 * - A token freed here parks (LIFO) unless entries wait somewhere
 *   (`recall`ed by the broker) or items wait here: then it goes back to the
 *   broker, which gives it to the earliest deadline queued anywhere.
 */
import type { Clock, TimerHandle } from './clock.js'
import type { Queued } from './service-queue.js'
import { MAX_TIMER_MS, PoolFront, runItem, type RejectReason, type WorkerPoolStats } from './pool-front.js'

/** How a pool talks to its broker (through whatever carries messages between the processes). */
export interface TokenLink {
  /** Item `id` (deadline on this pool's clock; Infinity: none) needs a token. */
  want: (id: number, deadline: number) => void
  /** `n` tokens go back to the broker. */
  give: (n: number) => void
}

export interface TokenPoolOptions<T extends Queued> {
  /** Tokens this pool holds at first (its share of the workers). */
  workers: number
  clock: Clock
  run: (item: T, worker: number) => Promise<void> | void
  reject: (item: T, reason: RejectReason, message: string) => void
  describe?: ((item: T) => string) | undefined
  /** Called once, in the constructor, with the pool: returns its link to the broker. */
  connect: (pool: TokenPool<T>) => TokenLink
}

export class TokenPool<T extends Queued> {
  readonly #clock: Clock
  readonly #run: (item: T, worker: number) => Promise<void> | void
  /** The counters, the closed flag, the arrival checks and the rejections (as `WorkerPool`'s). */
  readonly #front: PoolFront<T>
  readonly #stats: WorkerPoolStats
  readonly #link: TokenLink
  /** Worker ids of idle tokens; the end is the most recently parked. */
  readonly #idle: number[] = []
  /** Worker ids no token uses now. */
  readonly #freeIds: number[] = []
  readonly #settled: Array<() => void> = []
  readonly #abandoned = new Set<number>()
  /** Items wanted from the broker, by id. */
  readonly #waiting = new Map<number, T>()
  #nextId = 0
  #running = 0
  #recalled = false
  /** The broker is gone: nothing more is wanted. */
  #lost = false

  #closing: Promise<void> | undefined
  #resolveClosing: (() => void) | undefined
  #graceTimer: TimerHandle | undefined
  #graceEnd = Infinity

  constructor (options: TokenPoolOptions<T>) {
    const workers = options.workers
    if (!Number.isSafeInteger(workers) || workers < 0) throw new RangeError(`workers must be a non-negative integer, got ${workers}`)
    this.#clock = options.clock
    this.#run = options.run
    this.#front = new PoolFront(options, 'the service queue shared by the reactors is full')
    this.#stats = this.#front.stats
    for (let i = 0; i < workers; i++) this.#newId()
    for (let worker = workers - 1; worker >= 0; worker--) this.#idle.push(worker)
    this.#link = options.connect(this)
  }

  #newId (): number {
    const worker = this.#settled.length
    this.#settled.push(() => {
      if (this.#abandoned.delete(worker)) {
        this.#freeIds.push(worker)
        return
      }
      this.#stats.completed++
      this.#running--
      this.#tokenFree(worker)
    })
    return worker
  }

  get idleWorkers (): number {
    return this.#idle.length
  }

  get busyWorkers (): number {
    return this.#running
  }

  /** Items waiting for a token from the broker. */
  get queueLength (): number {
    return this.#waiting.size
  }

  get completed (): number {
    return this.#stats.completed
  }

  get abandonedRuns (): number {
    return this.#abandoned.size
  }

  get stats (): WorkerPoolStats {
    return { ...this.#stats }
  }

  get closed (): boolean {
    return this.#front.closed
  }

  /** Entries wait at the broker: freed tokens go back. */
  get recalled (): boolean {
    return this.#recalled
  }

  /** No idle token here: the next submit would have to ask the broker. */
  saturated (): boolean {
    return this.#idle.length === 0
  }

  submit (item: T, now?: number): void {
    if (!this.#front.admit(item, now)) return
    const stats = this.#stats
    const worker = this.#idle.pop()
    if (worker !== undefined) {
      stats.handedOff++
      this.#runOn(worker, item)
      return
    }
    if (this.#lost) {
      stats.overflows++
      this.#front.notify(item, 'full')
      return
    }
    const id = this.#nextId++
    this.#waiting.set(id, item)
    stats.queued++
    this.#link.want(id, Number.isNaN(item.deadline) ? Infinity : item.deadline)
  }

  /** The broker granted a token for item `id`. */
  grant (id: number): void {
    const item = this.#waiting.get(id)
    this.#waiting.delete(id)
    const worker = this.#freeIds.pop() ?? this.#newId()
    if (item === undefined) {
      // Answered meanwhile (shutdown): the token is free.
      this.#tokenFree(worker)
      return
    }
    if (item.deadline !== Infinity && this.#clock.now() >= item.deadline) {
      this.#stats.expired++
      this.#front.notify(item, 'expired')
      this.#tokenFree(worker)
      return
    }
    this.#runOn(worker, item)
  }

  /** The broker refused item `id`. */
  refuse (id: number, reason: 'full' | 'evicted' | 'expired'): void {
    const item = this.#waiting.get(id)
    if (item === undefined) return
    this.#waiting.delete(id)
    if (reason === 'full') this.#stats.overflows++
    else if (reason === 'evicted') this.#stats.evictions++
    else this.#stats.expired++
    this.#front.notify(item, reason)
    this.#settleClosing()
  }

  /** Entries wait at the broker: idle tokens go back now, freed ones as they free. */
  recall (): void {
    this.#recalled = true
    this.#giveIdle()
  }

  /** Nothing waits at the broker: tokens are kept again. */
  calm (): void {
    this.#recalled = false
  }

  /** The broker lends `n` tokens back: they park here (a closing pool gives them back). */
  lend (n: number): void {
    for (let i = 0; i < n; i++) this.#tokenFree(this.#freeIds.pop() ?? this.#newId())
  }

  /** The broker is gone (its process died): the items waiting for it are answered 'shutdown'; idle tokens stay usable. */
  lost (): void {
    this.#lost = true
    this.#recalled = false
    this.#rejectWaiting()
  }

  abandon (worker: number): void {
    if (this.#abandoned.has(worker) || this.#idle.includes(worker) || this.#freeIds.includes(worker) || worker >= this.#settled.length) return
    this.#abandoned.add(worker)
    this.#stats.completed++
    this.#running--
    this.#tokenFree(this.#freeIds.pop() ?? this.#newId())
  }

  close (graceMs: number): Promise<void> {
    if (Number.isNaN(graceMs) || graceMs < 0) throw new RangeError(`graceMs must be >= 0, got ${graceMs}`)
    this.#front.closed = true
    this.#closing ??= new Promise<void>(resolve => { this.#resolveClosing = resolve })
    // A closing reactor keeps no token idle: others may need it.
    this.#giveIdle()
    const end = this.#clock.now() + graceMs
    if (this.#resolveClosing !== undefined && end < this.#graceEnd) {
      this.#graceEnd = end
      this.#armGrace()
    }
    this.#settleClosing()
    return this.#closing
  }

  #giveIdle (): void {
    const n = this.#idle.length
    if (n === 0 || this.#lost) return
    for (const worker of this.#idle) this.#freeIds.push(worker)
    this.#idle.length = 0
    this.#link.give(n)
  }

  #runOn (worker: number, item: T): void {
    this.#running++
    if (!runItem(this.#run, item, worker, this.#settled)) return
    this.#stats.completed++
    this.#running--
    this.#tokenFree(worker)
  }

  #tokenFree (worker: number): void {
    if (!this.#lost && (this.#recalled || this.#front.closed || this.#waiting.size > 0)) {
      this.#freeIds.push(worker)
      this.#link.give(1)
    } else {
      this.#idle.push(worker)
    }
    this.#settleClosing()
  }

  #rejectWaiting (): void {
    const left = [...this.#waiting.values()]
    this.#waiting.clear()
    this.#stats.shutdownRejected += left.length
    for (const item of left) this.#front.notify(item, 'shutdown')
    this.#settleClosing()
  }

  #armGrace (): void {
    if (this.#graceTimer !== undefined) this.#clock.clearTimer(this.#graceTimer)
    this.#graceTimer = undefined
    if (this.#graceEnd === Infinity) return
    this.#graceTimer = this.#clock.setTimer(() => {
      this.#graceTimer = undefined
      if (this.#clock.now() < this.#graceEnd) {
        this.#armGrace()
        return
      }
      this.#rejectWaiting()
    }, Math.min(this.#graceEnd - this.#clock.now(), MAX_TIMER_MS))
  }

  #settleClosing (): void {
    const resolve = this.#resolveClosing
    if (resolve === undefined || this.#waiting.size > 0 || this.#running > 0) return
    this.#resolveClosing = undefined
    if (this.#graceTimer !== undefined) this.#clock.clearTimer(this.#graceTimer)
    this.#graceTimer = undefined
    resolve()
  }
}
