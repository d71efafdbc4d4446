/**
 * Retry timing: how long to wait before a retry (`Backoff`), whether a retry
 * may happen at all (`RetryPolicy`, `RetryBudget`, `nextRetryDelay`), and an
 * abortable `sleep` on an injected `Clock`.
 *
 * The default is the Kudu Java client's truncated randomized exponential
 * backoff (`AsyncKuduClient.getSleepTimeForRpcMillis`, since 2016): the
 * delay before retry n is uniform in [0, 2^min(n, 12)) ms, so the first
 * retry waits under 2 ms and no retry waits 4096 ms or more. It replaced a
 * linear `500 ms × n`, which made the 99.99th percentile latency 500–1000 ms
 * even with spare capacity (`LinearBackoff` keeps it for comparison).
 *
 * A retry never extends the logical call's deadline: `nextRetryDelay` refuses
 * a retry whose sleep would use up the remaining time, as Kudu's clients do.
 * Which errors are retryable is the caller's business (`RetryPolicy.retryable`);
 * nothing here knows about wire error codes.
 */
import { realClock, type Clock } from './clock.js'

/** The delay before a retry. */
export interface Backoff {
  /**
   * Milliseconds (fractional, finite, ≥ 0) to wait before retry number
   * `attempt`: 1 for the first retry, i.e. the number of attempts already
   * made. `attempt` 0 (the first attempt) waits 0.
   */
  delayMs: (attempt: number) => number
}

/**
 * How the exponential delay is randomized, with `ceiling` = min(capMs, baseMs × 2^min(attempt, maxExponent)):
 * - `'full'`: uniform in [0, ceiling) (the Kudu Java client; spreads retries most).
 * - `'equal'`: ceiling/2 + uniform in [0, ceiling/2) (never retries almost at once).
 * - `'none'`: exactly ceiling (deterministic; clients that fail together retry together).
 */
export type Jitter = 'full' | 'equal' | 'none'

/** Options of `ExponentialBackoff`; every one has a default. */
export interface ExponentialBackoffOptions {
  /** Delay unit in ms (default 1, as in the Java client). */
  baseMs?: number
  /** The exponent stops growing here (default 12: at most 2^12 = 4096 × baseMs). */
  maxExponent?: number
  /** Upper bound on any delay in ms (default Infinity). */
  capMs?: number
  /** Default `'full'`. */
  jitter?: Jitter
  /** Uniform in [0, 1) (default `Math.random`); inject for determinism. */
  random?: () => number
}

function checkAttempt (attempt: number): void {
  if (!Number.isInteger(attempt) || attempt < 0) throw new RangeError(`attempt must be an integer ≥ 0, got ${attempt}`)
}

function checkNonNegative (name: string, value: number, allowInfinity: boolean): void {
  if (!(value >= 0) || (!allowInfinity && !Number.isFinite(value))) {
    throw new RangeError(`${name} must be ${allowInfinity ? 'a number' : 'finite and'} ≥ 0, got ${value}`)
  }
}

/** A draw from `random`, forced into [0, 1) so a faulty source cannot push a delay out of range. */
function unit (random: () => number): number {
  const r = random()
  return r >= 0 && r < 1 ? r : r >= 1 ? 1 - Number.EPSILON : 0
}

/**
 * Truncated randomized exponential backoff. With the defaults, retry n waits
 * `random() × 2^min(n, 12)` ms, the Kudu Java client's policy.
 *
 * `capMs` bounds the range the jitter is drawn from (it is applied before
 * randomizing, as in "full jitter" elsewhere), so capped delays stay spread
 * over [0, capMs) instead of piling up at exactly capMs. Delays are not
 * rounded to whole milliseconds (Java truncates to a long).
 */
export class ExponentialBackoff implements Backoff {
  /** The delay unit in ms (option `baseMs`, default 1). */
  readonly baseMs: number
  /** Where the exponent stops growing (option `maxExponent`, default 12). */
  readonly maxExponent: number
  /** The bound on any delay in ms (option `capMs`, default Infinity). */
  readonly capMs: number
  /** How delays are randomized (option `jitter`, default `'full'`). */
  readonly jitter: Jitter
  readonly #random: () => number

  constructor (options: ExponentialBackoffOptions = {}) {
    const { baseMs = 1, maxExponent = 12, capMs = Infinity, jitter = 'full', random = Math.random } = options
    checkNonNegative('baseMs', baseMs, false)
    if (!Number.isInteger(maxExponent) || maxExponent < 0) throw new RangeError(`maxExponent must be an integer ≥ 0, got ${maxExponent}`)
    checkNonNegative('capMs', capMs, true)
    if (jitter !== 'full' && jitter !== 'equal' && jitter !== 'none') throw new RangeError(`unknown jitter ${String(jitter)}`)
    if (!Number.isFinite(Math.min(capMs, baseMs * 2 ** maxExponent))) {
      throw new RangeError('baseMs × 2^maxExponent overflows; set a finite capMs or a smaller maxExponent')
    }
    this.baseMs = baseMs
    this.maxExponent = maxExponent
    this.capMs = capMs
    this.jitter = jitter
    this.#random = random
  }

  delayMs (attempt: number): number {
    checkAttempt(attempt)
    if (attempt === 0) return 0
    const ceiling = Math.min(this.capMs, this.baseMs * 2 ** Math.min(attempt, this.maxExponent))
    switch (this.jitter) {
      case 'full': return unit(this.#random) * ceiling
      // min(): with subnormal ceilings, halving and adding back can round above the ceiling.
      case 'equal': return Math.min(ceiling, ceiling / 2 + unit(this.#random) * (ceiling / 2))
      case 'none': return ceiling
    }
  }
}

/** Options of `LinearBackoff`; every one has a default. */
export interface LinearBackoffOptions {
  /** Added per attempt in ms (default 500, the Java client's policy before 2016). */
  stepMs?: number
  /** Upper bound on any delay in ms (default Infinity). */
  capMs?: number
}

/** Linear backoff: retry n waits `min(capMs, stepMs × n)` ms. Deterministic. */
export class LinearBackoff implements Backoff {
  /** Added per attempt in ms (option `stepMs`, default 500). */
  readonly stepMs: number
  /** The bound on any delay in ms (option `capMs`, default Infinity). */
  readonly capMs: number

  constructor (options: LinearBackoffOptions = {}) {
    const { stepMs = 500, capMs = Infinity } = options
    checkNonNegative('stepMs', stepMs, false)
    checkNonNegative('capMs', capMs, true)
    this.stepMs = stepMs
    this.capMs = capMs
  }

  delayMs (attempt: number): number {
    checkAttempt(attempt)
    const delay = Math.min(this.capMs, this.stepMs * attempt)
    // stepMs × a huge attempt can overflow; a finite cap already bounds it, otherwise saturate.
    return Number.isFinite(delay) ? delay : Number.MAX_VALUE
  }
}

/** Options of `RetryBudget`; every one has a default. */
export interface RetryBudgetOptions {
  /** Retries allowed per first attempt in the window (default 0.2: 20 % extra load at most). */
  ratio?: number
  /** Retries allowed per second regardless of traffic (default 10), so a quiet client can still retry. */
  minRetriesPerSecond?: number
  /** The sliding window in ms (default 10 000). */
  windowMs?: number
  /** How many buckets the window is cut into (default 10); counts expire a bucket at a time. */
  buckets?: number
}

/** Lifetime totals of a `RetryBudget`. */
export interface RetryBudgetStats {
  /** First attempts recorded with `recordCall()`. */
  calls: number
  /** Retries granted by `tryWithdraw()`. */
  retries: number
  /** Retries refused by `tryWithdraw()`. */
  refused: number
}

/**
 * Caps retries at a fraction of traffic so that retries cannot multiply load
 * on a struggling server (Finagle's `RetryBudget`, gRPC's retry throttling).
 *
 * Over the last `windowMs`, granted retries ≤ `ratio` × calls +
 * `minRetriesPerSecond` × `windowMs` / 1000. The floor is a constant reserve
 * (as in Finagle): with the defaults a client that made no calls may still
 * retry 100 times per 10 s.
 *
 * The window is `buckets` fixed time slots kept in a ring, advanced lazily
 * from `clock.now()` on every use: memory is constant and no timer runs. A
 * count made at time t stops counting at the start of the bucket `buckets`
 * slots later, i.e. after between windowMs − windowMs/buckets and windowMs.
 *
 * The clock defaults to the real one: `new RetryBudget()`,
 * `new RetryBudget({ ratio: 0.1 })`, or `new RetryBudget(clock, options)`
 * with a `FakeClock` (nyala/testing) in tests.
 */
export class RetryBudget {
  /** Retries earned per first attempt in the window (option `ratio`, default 0.2). */
  readonly ratio: number
  /** Retries allowed per second whatever the traffic (option `minRetriesPerSecond`, default 10). */
  readonly minRetriesPerSecond: number
  /** The sliding window in ms (option `windowMs`, default 10 000). */
  readonly windowMs: number
  readonly #clock: Clock
  readonly #bucketMs: number
  readonly #calls: Float64Array
  readonly #retries: Float64Array
  /** Absolute index (floor(now / bucketMs)) of the newest bucket. */
  #head: number
  #windowCalls = 0
  #windowRetries = 0
  #totalCalls = 0
  #totalRetries = 0
  #totalRefused = 0

  constructor (options?: RetryBudgetOptions)
  constructor (clock: Clock, options?: RetryBudgetOptions)
  constructor (clockOrOptions: Clock | RetryBudgetOptions = realClock, budgetOptions: RetryBudgetOptions = {}) {
    const isClock = typeof (clockOrOptions as Partial<Clock>).now === 'function'
    const clock = isClock ? clockOrOptions as Clock : realClock
    const options = isClock ? budgetOptions : clockOrOptions as RetryBudgetOptions
    const { ratio = 0.2, minRetriesPerSecond = 10, windowMs = 10_000, buckets = 10 } = options
    checkNonNegative('ratio', ratio, false)
    checkNonNegative('minRetriesPerSecond', minRetriesPerSecond, false)
    if (!(windowMs > 0) || !Number.isFinite(windowMs)) throw new RangeError(`windowMs must be finite and > 0, got ${windowMs}`)
    if (!Number.isInteger(buckets) || buckets < 1) throw new RangeError(`buckets must be an integer ≥ 1, got ${buckets}`)
    this.ratio = ratio
    this.minRetriesPerSecond = minRetriesPerSecond
    this.windowMs = windowMs
    this.#clock = clock
    this.#bucketMs = windowMs / buckets
    this.#calls = new Float64Array(buckets)
    this.#retries = new Float64Array(buckets)
    this.#head = this.#bucketIndex()
  }

  /** Records a first attempt (never a retry): each one earns `ratio` of a retry. */
  recordCall (): void {
    const slot = this.#advance()
    this.#calls[slot] = (this.#calls[slot] ?? 0) + 1
    this.#windowCalls++
    this.#totalCalls++
  }

  /**
   * Asks to make one retry. True: granted and counted against the budget.
   * False: the budget is exhausted; the retry must not be made (counted as refused).
   */
  tryWithdraw (): boolean {
    const slot = this.#advance()
    if (this.#available() < 1) {
      this.#totalRefused++
      return false
    }
    this.#retries[slot] = (this.#retries[slot] ?? 0) + 1
    this.#windowRetries++
    this.#totalRetries++
    return true
  }

  /** How many retries `tryWithdraw` would grant right now. */
  get balance (): number {
    this.#advance()
    return Math.max(0, Math.floor(this.#available()))
  }

  /** Lifetime totals: first attempts, retries granted and refused. */
  get stats (): RetryBudgetStats {
    return { calls: this.#totalCalls, retries: this.#totalRetries, refused: this.#totalRefused }
  }

  #available (): number {
    const reserve = this.minRetriesPerSecond * this.windowMs / 1000
    // The epsilon absorbs binary rounding (0.1 × 30 calls is 3.0000000000000004 or 2.9999999999999996).
    return this.ratio * this.#windowCalls + reserve - this.#windowRetries + 1e-9
  }

  #bucketIndex (): number {
    return Math.floor(this.#clock.now() / this.#bucketMs)
  }

  /** Expires buckets that left the window; returns the ring slot of the current bucket. */
  #advance (): number {
    const n = this.#calls.length
    const index = this.#bucketIndex()
    if (index > this.#head) {
      const steps = Math.min(index - this.#head, n)
      for (let i = 1; i <= steps; i++) {
        const slot = ((this.#head + i) % n + n) % n
        this.#windowCalls -= this.#calls[slot] ?? 0
        this.#windowRetries -= this.#retries[slot] ?? 0
        this.#calls[slot] = 0
        this.#retries[slot] = 0
      }
      this.#head = index
    }
    // A clock that steps back (it should not) keeps counting in the newest bucket.
    return ((this.#head % n) + n) % n
  }
}

/**
 * When and whether to retry. `Code` is whatever the caller classifies
 * failures by (a wire error code, an exception class): this module never
 * inspects it.
 */
export interface RetryPolicy<Code = unknown> {
  /**
   * Most attempts in all, the first included (default `DEFAULT_MAX_ATTEMPTS`).
   * A guard against runaway loops: the deadline and the budget are the real bounds.
   */
  maxAttempts?: number
  backoff: Backoff
  /** Shared across calls to the same destination; absent or null = unlimited. */
  budget?: RetryBudget | null
  /** Whether a failure with this code may be retried at all; the caller asks before `nextRetryDelay`. */
  retryable: (code: Code) => boolean
}

/**
 * The default `RetryPolicy.maxAttempts`: 100, the Kudu Java client's
 * `MAX_RPC_ATTEMPTS`. With the default backoff the sleeps of 99 retries add up
 * to about 180 s on average, so in practice the call's deadline ends retrying
 * first; the limit only stops a loop that has no deadline.
 */
export const DEFAULT_MAX_ATTEMPTS = 100

/**
 * The sleep before the next attempt, or null when there must be none.
 *
 * `attempt` is the number of attempts already made (≥ 1; the upcoming retry is
 * retry number `attempt`, and `policy.backoff.delayMs(attempt)` is its delay).
 * `remainingMs` is the time left before the logical call's original deadline
 * (Infinity for none). Null when:
 * - `attempt` ≥ `maxAttempts` (the next attempt would be one too many);
 * - the sleep would reach the deadline (`remainingMs − delay ≤ 0`): a retry
 *   never starts at or after the deadline, and never gets a new one;
 * - the budget refuses (asked last, so a retry ruled out for another reason
 *   neither spends nor is counted against the budget).
 *
 * Call `policy.budget.recordCall()` once per logical call (its first attempt),
 * and check `policy.retryable(code)` before asking here.
 */
export function nextRetryDelay<Code> (policy: RetryPolicy<Code>, attempt: number, remainingMs: number): number | null {
  checkAttempt(attempt)
  if (attempt < 1) throw new RangeError('attempt counts attempts already made, so it is ≥ 1')
  const maxAttempts = policy.maxAttempts ?? DEFAULT_MAX_ATTEMPTS
  if (attempt >= maxAttempts) return null
  if (!(remainingMs > 0)) return null
  const delay = policy.backoff.delayMs(attempt)
  if (!(delay >= 0) || !Number.isFinite(delay)) return null
  if (remainingMs - delay <= 0) return null
  if (policy.budget != null && !policy.budget.tryWithdraw()) return null
  return delay
}

/**
 * Resolves after `ms` on `clock`. If `signal` aborts first, the timer is
 * cleared and the promise rejects with `signal.reason`; an already-aborted
 * signal rejects at once without setting a timer.
 */
export async function sleep (clock: Clock, ms: number, signal?: AbortSignal): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    if (signal?.aborted === true) {
      reject(signal.reason)
      return
    }
    const onAbort = (): void => {
      clock.clearTimer(handle)
      reject(signal?.reason)
    }
    const handle = clock.setTimer(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms, true)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}
