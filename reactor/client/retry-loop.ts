import { setMaxListeners } from 'node:events'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { DEFAULT_MAX_ATTEMPTS, ExponentialBackoff, RetryBudget, nextRetryDelay, sleep, type Backoff, type RetryBudgetStats } from '../../scheduling/retry.js'
import { RateLimitedLog } from '../logger.js'
import { type ClientEngine } from './client-engine.js'
import { LOG_INTERVAL_MS } from './client-engine-options.js'
import type { Target } from './targets.js'

/** Retries of calls that did not run, or that the protocol says may run again (`ClientProtocol.retryable`). */
export interface ProtocolRetryOptions {
  /** Delay before retry n; default truncated randomized exponential, `random[0,1) × 2^min(n, 12)` ms. */
  backoff?: Backoff
  /** Attempts per call, the first included; default 100 (the deadline usually ends a call first). */
  maxAttempts?: number
  /** null: no budget. Default: one budget (retries ≤ 20 % of calls over 10 s plus 10 per second) shared by the client's calls. */
  budget?: RetryBudget | null
  /**
   * The longest one attempt of an `idempotent` call waits for its answer
   * before it is abandoned (its answer dropped) and the call tried again,
   * on another host when there is one, within its deadline. Default: a
   * third of the call's timeout (at least 50 ms), so that a call that met
   * a host gone silent keeps two tries; 0: the whole deadline. Calls that
   * are not idempotent always wait their whole deadline.
   */
  attemptTimeoutMs?: number
}

/** Retry counters of a client. */
export interface RetryStats {
  /** Retries made (attempts after the first). */
  retries: number
  /** Calls that failed with a retryable error after their last attempt (deadline, attempts or budget spent). */
  exhausted: number
  /** The retry budget's counters; null without a budget. */
  budget: RetryBudgetStats | null
  /** Attempts of idempotent calls abandoned at `attemptTimeoutMs` (retried when time and budget allowed). */
  attemptTimeouts: number
}

/** What one call's retries go by. */
export interface RetryCallOptions {
  signal?: AbortSignal | undefined
  /** Safe to repeat after a lost connection even once sent. */
  idempotent?: boolean | undefined
}

// Local failures after which the request certainly did not run, if it was not sent.
const NOT_RUN_UNSENT: ReadonlySet<string> = new Set([ErrorCode.CONNECT_FAILED, ErrorCode.CONNECTION_CLOSED, ErrorCode.NEGOTIATION_FAILED,
  ErrorCode.QUEUE_FULL, ErrorCode.MALFORMED_FRAME, ErrorCode.FRAME_TOO_LARGE])

const MIN_ATTEMPT_TIMEOUT_MS = 50

type Outcome<Res> = { ok: true, response: Res } | { ok: false, error: RpcError, sent: boolean, streamed: boolean }

/**
 * The retry loop of every client on the engine: attempts until one
 * succeeds, fails for good, or the call's deadline, attempts or budget
 * run out. Each attempt carries what is left of the deadline set once, at
 * the first; a retry waits for its backoff, a sleep that `close()`
 * (through `closing`) and the call's signal cut short. A budget that
 * refuses a retry is logged (rate-limited), since the caller sees only
 * its own call fail.
 */
export class RetryLoop<Req, Res> {
  readonly #engine: ClientEngine<Req, Res>
  readonly #backoff: Backoff
  readonly #maxAttempts: number | undefined
  readonly budget: RetryBudget | null
  readonly #counts = { retries: 0, exhausted: 0, attemptTimeouts: 0 }
  readonly #attemptTimeoutMs: number | undefined
  /** Aborted by the client's close: every call sleeping before a retry listens to it. */
  readonly #closing = new AbortController()
  readonly #logExhausted: RateLimitedLog

  constructor (engine: ClientEngine<Req, Res>, options: ProtocolRetryOptions) {
    this.#engine = engine
    this.#backoff = options.backoff ?? new ExponentialBackoff()
    this.#maxAttempts = options.maxAttempts
    const attemptTimeoutMs = options.attemptTimeoutMs
    if (attemptTimeoutMs !== undefined && !(attemptTimeoutMs >= 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `attemptTimeoutMs must be at least 0, got ${attemptTimeoutMs}`)
    this.#attemptTimeoutMs = attemptTimeoutMs
    this.budget = options.budget === undefined ? new RetryBudget(engine.clock) : options.budget
    setMaxListeners(0, this.#closing.signal)
    this.#logExhausted = new RateLimitedLog(LOG_INTERVAL_MS, () => engine.clock.now())
  }

  get stats (): RetryStats {
    return { retries: this.#counts.retries, exhausted: this.#counts.exhausted, budget: this.budget?.stats ?? null, attemptTimeouts: this.#counts.attemptTimeouts }
  }

  /** Ends every backoff sleep: the calls waiting in one fail with RPC_ERR_CLIENT_CLOSED. */
  close (error: RpcError): void {
    this.#closing.abort(error)
  }

  /** The call with retries; `timeoutMs` covers every attempt and wait (0: no deadline). */
  async run (target: Target, request: Req, data: unknown, options: RetryCallOptions, timeoutMs: number): Promise<Res> {
    const engine = this.#engine
    const clock = engine.clock
    const budget = this.budget
    const deadline = timeoutMs > 0 ? clock.now() + timeoutMs : Number.POSITIVE_INFINITY
    budget?.recordCall()
    // An idempotent call's attempts wait at most this long: a host gone silent leaves time for another.
    const cap = options.idempotent === true ? this.#attemptCap(timeoutMs) : 0
    let previous: RpcError | null = null
    for (let attempt = 1; ; attempt++) {
      // The first attempt gets the whole timeout, to share a deadline list; later ones what is left (never 0, which would mean none).
      let attemptTimeout = attempt === 1 ? timeoutMs : Number.isFinite(deadline) ? Math.max(1, deadline - clock.now()) : 0
      const capped = cap > 0 && (attemptTimeout === 0 || attemptTimeout > cap)
      if (capped) attemptTimeout = cap
      const outcome = await new Promise<Outcome<Res>>((resolve) => {
        engine.attempt(target, request, data, options.signal, attemptTimeout, (response) => resolve({ ok: true, response }),
          (error, sent, streamed) => resolve({ ok: false, error, sent, streamed: streamed === true }), null)
      })
      if (outcome.ok) return outcome.response
      const { error, sent, streamed } = outcome
      // Abandoned at the attempt timeout with time left: tried again like a lost connection.
      const abandoned = capped && error.code === ErrorCode.DEADLINE_EXCEEDED && !streamed
      if (abandoned) this.#counts.attemptTimeouts++
      if (previous !== null && error.code === ErrorCode.DEADLINE_EXCEEDED && !abandoned) {
        // A retry ran into the call's deadline: the error that made it retry is the story.
        this.#counts.exhausted++
        throw this.#timedOut(request, data, timeoutMs, attempt, previous)
      }
      // Part of a streamed answer was delivered: a second run could not be told from the first.
      if (engine.closed || streamed || (!abandoned && !this.#isRetryable(error, sent, request, data, options.idempotent === true))) throw error
      const refusedBefore = budget?.stats.refused ?? 0
      const delay = nextRetryDelay({ backoff: this.#backoff, maxAttempts: this.#maxAttempts, budget, retryable: () => true }, attempt, deadline - clock.now())
      if (delay === null) {
        this.#counts.exhausted++
        const outOfAttempts = attempt >= (this.#maxAttempts ?? DEFAULT_MAX_ATTEMPTS)
        const outOfBudget = (budget?.stats.refused ?? 0) > refusedBefore
        if (outOfBudget) {
          // The caller sees its own call fail; that retries are being refused client-wide is news.
          const log = engine.log
          this.#logExhausted.log((m, f) => log.warn(m, f), () => `retry budget spent: ${engine.describe(request, data)} fails without retrying (${error.codeName})`,
            () => ({ ...this.#fields(request, data), attempt, code: error.codeName, refused: budget?.stats.refused }))
        }
        if (outOfAttempts || outOfBudget) throw error
        // The next attempt could not start before the deadline.
        throw this.#timedOut(request, data, timeoutMs, attempt, error)
      }
      previous = error
      this.#counts.retries++
      engine.log.debug(`retrying ${engine.describe(request, data)} in ${Math.round(delay)} ms after attempt ${attempt}: ${error.message}`,
        { ...this.#fields(request, data), attempt, delayMs: Math.round(delay), code: error.codeName })
      const closing = this.#closing.signal
      const signal = options.signal === undefined ? closing : AbortSignal.any([options.signal, closing])
      try {
        await sleep(clock, delay, signal)
      } catch {
        if (engine.closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed while the call waited to retry')
        throw new RpcError(ErrorCode.CANCELLED, `${engine.describe(request, data)} was cancelled while waiting to retry (after: ${error.message})`)
      }
      if (engine.closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed while the call waited to retry')
    }
  }

  // The attempt timeout of an idempotent call of `timeoutMs`; 0: none.
  #attemptCap (timeoutMs: number): number {
    const configured = this.#attemptTimeoutMs
    if (configured !== undefined) return configured
    return timeoutMs > 0 ? Math.max(MIN_ATTEMPT_TIMEOUT_MS, Math.floor(timeoutMs / 3)) : 0
  }

  #fields (request: Req, data: unknown): Record<string, unknown> {
    const protocol = this.#engine.protocol
    return protocol.logFields?.(request, data) ?? { protocol: protocol.name }
  }

  #timedOut (request: Req, data: unknown, timeoutMs: number, attempts: number, last: RpcError): RpcError {
    return new RpcError(ErrorCode.DEADLINE_EXCEEDED,
      `${this.#engine.describe(request, data)} timed out after ${timeoutMs} ms and ${attempts} attempt(s); last error: ${last.message}`, { cause: last })
  }

  #isRetryable (error: RpcError, sent: boolean, request: Req, data: unknown, idempotent: boolean): boolean {
    const retryable = this.#engine.protocol.retryable
    if (error.code === ErrorCode.REMOTE) return retryable?.(error, request, data) ?? false
    if (!NOT_RUN_UNSENT.has(error.code)) return false
    // A request that reached the socket may have run: only one safe to repeat goes again.
    return !sent || idempotent || (retryable?.(error, request, data) ?? false)
  }
}
