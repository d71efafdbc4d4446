import Denque from 'denque'
import type { RefusalReason } from '../codec/protocol.js'
import type { Clock } from '../scheduling/clock.js'
import { DeadlineQueue, type QueueDiscipline } from '../scheduling/service-queue.js'
import { TokenPool, type TokenLink } from '../scheduling/token-pool.js'
import { WorkerPool, type RejectReason } from '../scheduling/worker-pool.js'
import type { InboundCall } from './inbound-call.js'
import type { MethodMetrics } from './metrics.js'

export interface ServicePoolOptions {
  /** Concurrency slots (in-loop workers, or threads in thread mode). */
  workers: number
  /** Bound of the service queue. */
  queueLength: number
  discipline: QueueDiscipline
  clock: Clock
  /** Runs the call's handler; the worker is released when the returned promise settles. */
  run: (call: InboundCall, worker: number) => Promise<void> | void
  /** Answers a call that will not run (`busy`: the queue was full or evicted it; `expired`; `shutdown`). */
  reject: (call: InboundCall, reason: RefusalReason, message: string) => void
  metrics: ReadonlyMap<string, MethodMetrics>
  /** Calls held back while a burst is absorbed (see below); default 4096. */
  burstLimit?: number | undefined
  /**
   * How long the workers may go without finishing a call before held calls
   * are judged; default: one event-loop turn. Thread mode sets a few ms:
   * threads answer through messages, so turns without a completion are
   * normal while they work (see `progressed`).
   */
  holdWindowMs?: number | undefined
  /**
   * Set when the reactors of a server share one scheduler (reactor/cluster-scheduler.ts):
   * the workers are tokens of the shared pool and the queue is the broker's
   * (scheduling/token-pool.ts); absent, the pool is this process's own.
   */
  connect?: ((pool: TokenPool<InboundCall>) => TokenLink) | undefined
}

/**
 * One service's scheduling: its EDF (or FIFO) service queue and its
 * LIFO-parked workers (`scheduling/`), plus burst absorption.
 *
 * A burst is not an overload. One read can carry a thousand pipelined calls;
 * they are dispatched in the read's callback, before any handler has had the
 * chance to settle, so workers plus queue slots fill after the first few
 * dozen even when every handler takes a microsecond. Calls that find the
 * service saturated are therefore held back in arrival order (up to
 * `burstLimit`) and offered again after this turn's I/O callbacks and
 * microtasks (`clock.defer`). As long as workers finished something in the
 * meantime, holding continues; only when a whole turn passed without
 * progress is the service overloaded, and the held calls are judged by the
 * queue (TOO_BUSY, or eviction of a later deadline). The judgement thus comes
 * at most one turn late, and only under saturation.
 *
 * Worker threads (thread mode) finish calls between turns, not within them,
 * so there the judgement waits `holdWindowMs` without a completion instead
 * of one turn, and each completion (`progressed`) feeds held calls into the
 * room it left, after the pool has taken its next call.
 */
export class ServicePool {
  readonly pool: WorkerPool<InboundCall> | TokenPool<InboundCall>
  readonly #clock: Clock
  readonly #held = new Denque<InboundCall>()
  /** The pool when it is this process's own (not tokens of a shared scheduler): the one `claim` lends workers of. */
  readonly #own: WorkerPool<InboundCall> | null
  readonly #burstLimit: number
  readonly #metrics: ReadonlyMap<string, MethodMetrics>
  #checkScheduled = false
  #progressMark = 0
  readonly #check = (): void => this.#offerHeld()
  readonly #holdWindowMs: number | undefined
  // The window's timer defers the check: after a stall the timer phase comes
  // before the poll phase, and the threads' answers waiting there must count.
  readonly #deferCheck = (): void => this.#clock.defer(this.#check)
  #feedScheduled = false
  readonly #feed = (): void => {
    this.#feedScheduled = false
    const held = this.#held
    while (held.length > 0 && !this.pool.saturated()) this.pool.submit(held.shift()!)
  }

  constructor (options: ServicePoolOptions) {
    this.#clock = options.clock
    this.#burstLimit = options.burstLimit ?? 4096
    this.#holdWindowMs = options.holdWindowMs
    this.#metrics = options.metrics
    const reject = options.reject
    const common = {
      workers: options.workers,
      clock: options.clock,
      run: options.run,
      describe: (call: InboundCall) => `${call.service}.${call.method} request from ${call.remoteAddress}`,
      reject: (call: InboundCall, reason: RejectReason, message: string) => {
        this.#count(call, reason)
        reject(call, reason === 'full' || reason === 'evicted' ? 'busy' : reason, message)
      }
    }
    this.pool = options.connect !== undefined
      ? new TokenPool<InboundCall>({ ...common, connect: options.connect })
      : new WorkerPool<InboundCall>({ ...common, queue: new DeadlineQueue<InboundCall>({ maxLength: options.queueLength, discipline: options.discipline }) })
    this.#own = this.pool instanceof WorkerPool ? this.pool : null
  }

  /** Calls held back by burst absorption now. */
  get heldCalls (): number {
    return this.#held.length
  }

  /**
   * A worker of this process's own pool for running `call` at once, in the
   * caller (`WorkerPool.claim`); -1: `submit` it instead (calls held back
   * by burst absorption go first, no worker is idle, the pool is closing,
   * the call expired, or the workers are tokens shared across reactors).
   * The worker goes back with `ran`.
   */
  claim (call: InboundCall, now: number): number {
    return this.#own === null || !this.#held.isEmpty() ? -1 : this.#own.claim(call, now)
  }

  /** The run of a claimed `worker` ended, or ends when `pending` settles. */
  ran (worker: number, pending: Promise<void> | undefined): void {
    this.#own!.ran(worker, pending)
  }

  /** Offers `call`; `now`, when given, is a clock reading the caller just took (spares one). */
  submit (call: InboundCall, now?: number): void {
    const held = this.#held
    if ((held.length > 0 || this.pool.saturated()) && held.length < this.#burstLimit && !this.pool.closed) {
      held.push(call)
      if (!this.#checkScheduled) {
        this.#checkScheduled = true
        this.#progressMark = this.pool.completed
        this.#scheduleCheck()
      }
      return
    }
    this.pool.submit(call, now)
  }

  /** A worker finished a call outside the pool's turn (thread mode): held calls take its room once the pool has moved on. */
  progressed (): void {
    if (this.#held.length === 0 || this.#feedScheduled) return
    this.#feedScheduled = true
    this.#clock.defer(this.#feed)
  }

  #scheduleCheck (): void {
    if (this.#holdWindowMs === undefined) this.#clock.defer(this.#check)
    else this.#clock.setTimer(this.#deferCheck, this.#holdWindowMs)
  }

  /** Stops taking calls: held calls are judged now, queued ones drain within `graceMs`, the rest are refused `shutdown`. */
  close (graceMs: number): Promise<void> {
    this.#judgeHeld()
    return this.pool.close(graceMs)
  }

  #offerHeld (): void {
    this.#checkScheduled = false
    const held = this.#held
    const pool = this.pool
    while (held.length > 0 && !pool.saturated()) pool.submit(held.shift()!)
    if (held.length === 0) return
    if (pool.completed !== this.#progressMark) {
      // Workers are getting through the burst: keep holding.
      this.#progressMark = pool.completed
      this.#checkScheduled = true
      this.#scheduleCheck()
      return
    }
    // A whole turn without progress: this is overload, not a burst.
    this.#judgeHeld()
  }

  #judgeHeld (): void {
    const held = this.#held
    while (held.length > 0) this.pool.submit(held.shift()!)
  }

  #count (call: InboundCall, reason: RejectReason): void {
    const m = this.#metrics.get(call.method)
    if (m === undefined) return
    if (reason === 'full') m.queueOverflows++
    else if (reason === 'evicted') m.evictions++
    else if (reason === 'expired') m.timedOutInQueue++
    else m.shutdownRejected++
  }
}
