import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { encodeRequestFrame, requestFrameBytes, wireTimeout, writeRequestFrame, writeRequestFrameHead } from '../../codec/krpc/frames.js'
import type { Message, MessageType, MethodMap, ServiceDef } from '../../codec/schema.js'
import { realClock, type Clock } from '../../scheduling/clock.js'
import type { DeadlineLists } from '../../scheduling/deadline-lists.js'
import { Balancer, type BalancePolicy, type Slot } from '../balancer.js'
import { DEFAULT_MAX_ATTEMPTS, ExponentialBackoff, RetryBudget, nextRetryDelay, sleep, type Backoff, type RetryBudgetStats } from '../../scheduling/retry.js'
import { BusyPoller } from '../../transport/busy-poll.js'
import { RateLimitedLog, resolveLogger, type Logger } from '../logger.js'
import type { ClientConnection, ClientTlsOptions } from './client-connection.js'
import { ConnectionPool, type ClientConnectionStats } from './connection-pool.js'
import { OutboundCalls, failEarly, labelOf, newCall, CallState, type CallResult, type Callback, type OutboundCall } from './outbound-call.js'
import { noSuchMethod, preparedMethod, type PreparedMethod, type PreparedMethods } from './prepared-method.js'
import { BalancedTarget, parseEndpoint, type Endpoint, type Target } from './resolve.js'
import { serviceStub, type AnyResolve, type CallOptions, type StartCall, type Stub } from './stub.js'

export type { CallResult, Callback } from './outbound-call.js'
export type { ClientConnectionStats } from './connection-pool.js'
export type { ClientTlsOptions } from './client-connection.js'
export type { Endpoint, Target } from './resolve.js'
export type { CallOptions, Stub, StubMethod } from './stub.js'

/**
 * Retries of calls that failed without running: ERROR_SERVER_TOO_BUSY,
 * ERROR_UNAVAILABLE, FATAL_SERVER_SHUTTING_DOWN, and failures to connect,
 * negotiate or send. Each attempt carries what is left of the call's
 * original deadline, and none starts after it. Delays come from `backoff`
 * (default: truncated randomized exponential, `random[0,1) × 2^min(n, 12)`
 * ms, as Kudu's Java client). A budget (default: retries ≤ 20 % of calls
 * over 10 s plus 10 per second) keeps retries from amplifying an overload.
 */
export interface RetryOptions {
  backoff?: Backoff
  /** Attempts per call, the first included; default 100 (the deadline usually ends a call first). */
  maxAttempts?: number
  /** null: no budget. Default: one budget shared by the client's calls. */
  budget?: RetryBudget | null
}

/** Retry counters of a client. */
export interface RetryStats {
  /** Retries made (attempts after the first). */
  retries: number
  /** Calls that failed with a retryable error after their last attempt (deadline, attempts or budget spent). */
  exhausted: number
  budget: RetryBudgetStats | null
}

export interface ClientOptions {
  /** The endpoint (or endpoints, balanced) stubs use when none is named. */
  endpoint?: Target
  /**
   * Connections per endpoint (default 1). Above 1, or with several
   * endpoints, each call picks a connection by `balance`; against a
   * `nyala serve --reactors N` server, N or more connections load every reactor.
   */
  connectionsPerEndpoint?: number
  /** How a balanced call picks its connection; default `p2c` (power of two choices on calls outstanding). */
  balance?: BalancePolicy
  /** Resolve each endpoint's host name to all its addresses (DNS) and balance over them; re-resolved every 30 s. */
  resolveAll?: boolean
  /** SASL PLAIN user and password sent in negotiation. */
  user?: string
  password?: string
  /**
   * Offer TLS in negotiation (the handshake inside TLS_HANDSHAKE steps, as
   * Kudu's clients do). The server's certificate is checked against `ca`
   * (default: Node's CAs) and its name against `servername` (default: the
   * endpoint's host) unless `rejectUnauthorized` is false. `cert` and `key`
   * authenticate this client by certificate when the server asks for it.
   */
  tls?: ClientTlsOptions
  /** Fail negotiation with a server that does not offer TLS (needs `tls`). */
  requireTls?: boolean
  /** Encrypt loopback connections too (by default both sides on loopback keep plain text after a TLS handshake that authenticates). */
  encryptLoopback?: boolean
  /** Largest inbound frame, checked at its length prefix; default 50 MiB (independent of the server's). */
  maxMessageBytes?: number
  /** Deadline of a connection's negotiation; default 3000 ms. A short call timeout does not shorten it. */
  negotiationTimeoutMs?: number
  /** Timeout of calls that name none; default 30000 ms; 0 means no deadline. */
  defaultTimeoutMs?: number
  /** Bound on a connection's queued request bytes; a call over it fails with RPC_ERR_QUEUE_FULL. */
  maxOutboundBytes?: number
  /** Retries of calls that did not run (off unless given; `{}` turns them on with the defaults). */
  retry?: RetryOptions | false
  /** Busy polling after each read and send, in microseconds (as `ServerOptions.busyPollUs`); off by default. */
  busyPollUs?: number
  clock?: Clock
  /**
   * Where the client reports what its calls' errors do not: a server that
   * broke the protocol (warn), connections lost and retired (info), retries
   * (debug), with fields. Default: warnings and errors on stderr; `null`
   * silences it. See docs/logging.md.
   */
  logger?: Logger | null
}

/** DEADLINE_EXCEEDED for a call whose retries ran out of time, naming the error that made it retry. */
function retriesTimedOut (def: ServiceDef, method: string, timeoutMs: number, attempts: number, last: RpcError): RpcError {
  return new RpcError(ErrorCode.DEADLINE_EXCEEDED,
    `${def.fullName}.${method} timed out after ${timeoutMs} ms and ${attempts} attempt(s); last error: ${last.message}`, { cause: last })
}

// The body of a flat request, written into its frame from the message itself.
const NO_BODY = new Uint8Array(0)

/**
 * A request frame written in place (Connection.tryWriteFrame): its parts,
 * in one reused object. The body is body[0, bodyBytes), or NO_BODY: a flat
 * message the request type's writeFlat writes, as flatLength just measured.
 */
class InPlaceRequest {
  callId = 0
  tail: Uint8Array = NO_BODY
  body: Uint8Array = NO_BODY
  bodyBytes = 0
  type: MessageType<Message> | null = null
}

const IN_PLACE = new InPlaceRequest()

const REQUEST_WRITER = {
  encodeInto (frame: InPlaceRequest, _unused: undefined, out: Buffer, at: number): void {
    if (frame.body !== NO_BODY) writeRequestFrame(out, at, frame.callId, frame.tail, frame.body, frame.bodyBytes)
    else frame.type!.writeFlat(out, writeRequestFrameHead(out, at, frame.callId, frame.tail, frame.bodyBytes))
    // Nothing of the request stays referenced once it is written.
    frame.body = NO_BODY
    frame.type = null
  }
}

const DEFAULT_CALL_TIMEOUT_MS = 30_000
/** Warnings of one kind are logged at most this often. */
const LOG_INTERVAL_MS = 10_000

/**
 * A KRPC client. One connection per endpoint, reused by every call; call
 * ids from 0 per connection; each call's timer is armed when the call is
 * made, so it covers connect and negotiation; late responses are ignored.
 * A peer that closes or sends garbage fails every pending call on that
 * connection with a connection error, never crashing the process.
 *
 * The parts it ties together: typed stubs (stub.ts), calls in flight and
 * their settlement (outbound-call.ts), their deadlines
 * (scheduling/deadline-lists.ts), connections (connection-pool.ts,
 * client-connection.ts) and balanced targets re-resolved by DNS
 * (resolve.ts, reactor/balancer.ts). Here: each attempt, retries with
 * backoff and budget, and the choice of a connection.
 */
export class Client {
  readonly #options: ClientOptions
  readonly #clock: Clock
  readonly #calls: OutboundCalls
  readonly #deadlines: DeadlineLists<OutboundCall>
  readonly #pool: ConnectionPool
  readonly #methods: PreparedMethods = new Map()
  readonly #endpoints = new Map<string, { host: string, port: number }>()
  readonly #balancers = new Map<string, BalancedTarget>()
  #closed = false
  readonly #retry: { backoff: Backoff, maxAttempts: number | undefined, budget: RetryBudget | null } | null
  readonly #retryCounts = { retries: 0, exhausted: 0 }
  // The last single endpoint called and its connection: most calls repeat them.
  #lastEndpoint: Target | null = null
  #lastConnection: ClientConnection | null = null
  readonly #poller: BusyPoller | undefined
  readonly #log: Required<Logger>
  readonly #logBroken: RateLimitedLog
  readonly #logExhausted: RateLimitedLog
  // While a callback-form call starts: its callback (#attempt hands it to
  // the call it creates, or settles it if it fails before; that call is
  // OutboundCalls.startedCall).
  #starting: Callback<Message> | null = null

  constructor (options: ClientOptions = {}) {
    this.#options = options
    this.#clock = options.clock ?? realClock
    this.#calls = new OutboundCalls(this.#clock)
    this.#deadlines = this.#calls.deadlines
    this.#poller = (options.busyPollUs ?? 0) > 0 ? new BusyPoller(options.busyPollUs!) : undefined
    this.#pool = new ConnectionPool(options, this.#clock, this.#poller, this.#calls, (cc) => {
      if (this.#lastConnection === cc) this.#lastConnection = null
      this.#connectionLeft(cc)
    })
    this.#log = resolveLogger(options.logger)
    this.#logBroken = new RateLimitedLog(LOG_INTERVAL_MS, () => this.#clock.now())
    this.#logExhausted = new RateLimitedLog(LOG_INTERVAL_MS, () => this.#clock.now())
    const retry = options.retry
    this.#retry = retry === undefined || retry === false
      ? null
      : {
          backoff: retry.backoff ?? new ExponentialBackoff(),
          maxAttempts: retry.maxAttempts,
          budget: retry.budget === undefined ? new RetryBudget(this.#clock) : retry.budget
        }
  }

  /** A typed stub for `def` at `endpoint` (default: the client's endpoint). */
  service<M extends MethodMap> (def: ServiceDef<M>, endpoint?: Target): Stub<M> {
    const target = endpoint ?? this.#options.endpoint
    if (target === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no endpoint: pass one to service() or to the Client')
    return serviceStub(def, target, this.#methods, this, this.#start, this.#retry !== null)
  }

  /** Calls `service.method` at `endpoint`; resolves with the response and its sidecars. */
  call<Res = Message> (endpoint: Target, def: ServiceDef, method: string, request: Message, options: CallOptions = {}): Promise<CallResult<Res>> {
    if (this.#retry !== null && options.retry !== false) return this.#callWithRetries(endpoint, def, method, request, options) as Promise<CallResult<Res>>
    return new Promise<CallResult<Message>>((resolve, reject) => {
      const prepared = preparedMethod(this.#methods, def, method)
      if (prepared === undefined) reject(noSuchMethod(def, method))
      else this.#start(endpoint, prepared, request, options, resolve as AnyResolve, reject, false, null)
    }) as Promise<CallResult<Res>>
  }

  /** Retry counters; null when retries are off. */
  get retryStats (): RetryStats | null {
    if (this.#retry === null) return null
    return { retries: this.#retryCounts.retries, exhausted: this.#retryCounts.exhausted, budget: this.#retry.budget?.stats ?? null }
  }

  // Attempts until one succeeds, fails for good, or the original deadline,
  // attempts or budget run out. Each attempt's timeout is what is left of
  // the deadline set here, once.
  async #callWithRetries (endpoint: Target, def: ServiceDef, method: string, request: Message, options: CallOptions): Promise<CallResult<Message>> {
    const retry = this.#retry!
    const clock = this.#clock
    const prepared = preparedMethod(this.#methods, def, method)
    if (prepared === undefined) throw noSuchMethod(def, method)
    const timeoutMs = options.timeoutMs ?? this.#options.defaultTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS
    const deadline = timeoutMs > 0 ? clock.now() + timeoutMs : Number.POSITIVE_INFINITY
    retry.budget?.recordCall()
    let previous: RpcError | null = null
    for (let attempt = 1; ; attempt++) {
      const remaining = deadline - clock.now()
      // A retry never starts after the deadline; 0 would mean "no deadline".
      const attemptTimeout = Number.isFinite(remaining) ? Math.max(1, remaining) : 0
      const outcome = await new Promise<CallResult<Message> | { error: RpcError, sent: boolean }>((resolve) => {
        this.#attempt(endpoint, prepared, request, options, attemptTimeout, resolve as AnyResolve, (error, sent) => resolve({ error, sent }))
      })
      if (!('error' in outcome)) return outcome
      const { error, sent } = outcome
      if (previous !== null && error.code === ErrorCode.DEADLINE_EXCEEDED) {
        // A retry ran into the call's deadline: the error that made it retry is the story.
        this.#retryCounts.exhausted++
        throw retriesTimedOut(def, method, timeoutMs, attempt, previous)
      }
      if (!isRetryable(error, sent, options.idempotent === true)) throw error
      const refusedBefore = retry.budget?.stats.refused ?? 0
      const remainingNow = deadline - clock.now()
      const delay = nextRetryDelay({ backoff: retry.backoff, maxAttempts: retry.maxAttempts, budget: retry.budget, retryable: () => true }, attempt, remainingNow)
      if (delay === null) {
        this.#retryCounts.exhausted++
        const outOfAttempts = attempt >= (retry.maxAttempts ?? DEFAULT_MAX_ATTEMPTS)
        const outOfBudget = (retry.budget?.stats.refused ?? 0) > refusedBefore
        if (outOfBudget) {
          // The caller sees its own call fail; that retries are being refused client-wide is news.
          this.#logExhausted.log((m, f) => this.#log.warn(m, f), () => `retry budget spent: ${def.fullName}.${method} fails without retrying (${error.codeName})`,
            () => ({ service: def.fullName, method, attempt, code: error.codeName, refused: retry.budget?.stats.refused }))
        }
        if (outOfAttempts || outOfBudget) throw error
        // The next attempt could not start before the deadline.
        throw retriesTimedOut(def, method, timeoutMs, attempt, error)
      }
      previous = error
      this.#retryCounts.retries++
      this.#log.debug(`retrying ${def.fullName}.${method} in ${Math.round(delay)} ms after attempt ${attempt}: ${error.message}`,
        { service: def.fullName, method, attempt, delayMs: Math.round(delay), code: error.codeName })
      try {
        await sleep(clock, delay, options.signal)
      } catch {
        throw new RpcError(ErrorCode.CANCELLED, `${def.fullName}.${method} was cancelled while waiting to retry (after: ${error.message})`)
      }
      if (this.#closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed while the call waited to retry')
    }
  }

  // A connection left the pool: retired after a FATAL answer (still open),
  // or closed. Its calls' errors tell their callers; the log tells the rest.
  #connectionLeft (cc: ClientConnection): void {
    if (this.#closed || cc.retired) return
    const fields = { endpoint: cc.key, pendingCalls: cc.outstanding.size, negotiated: cc.negotiated !== null }
    if (!cc.connection.isClosed) {
      this.#log.info(`connection to ${cc.key} retired after a FATAL answer; new calls open another`, fields)
      return
    }
    const error = cc.closeReason ?? cc.connection.closeError
    const code = error?.code
    if (cc.negotiated !== null && (code === ErrorCode.MALFORMED_FRAME || code === ErrorCode.FRAME_TOO_LARGE)) {
      // Not a peer going away: a KRPC server that then broke the protocol.
      // (Before negotiation the calls' own error names such a peer.)
      this.#logBroken.log((m, f) => this.#log.warn(m, f), () => `closing the connection to ${cc.key}: ${error!.message}`, () => ({ ...fields, code }))
      return
    }
    this.#log.info(`connection to ${cc.key} closed${error === undefined ? '' : `: ${error.message}`}`, code === undefined ? fields : { ...fields, code })
  }

  /** Open connections (for tests and metrics). */
  get connectionCount (): number {
    return this.#pool.connections.size
  }

  /** Calls waiting for a response on any connection. */
  get pendingCalls (): number {
    return this.#pool.pendingCalls
  }

  /**
   * Counters of each open connection: its outbound transfer queue (requests
   * and bytes queued, bytes the socket still buffers, immediate and batched
   * writes, partial writes, drain waits) and the bytes and frames read and
   * written.
   */
  connectionStats (): ClientConnectionStats[] {
    return this.#pool.stats()
  }

  /** Fails every pending call with RPC_ERR_CLIENT_CLOSED and closes every connection. Later calls fail at once. */
  close (): void {
    if (this.#closed) return
    this.#closed = true
    this.#poller?.stop()
    this.#pool.closeAll(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed with the call pending'))
    // Every call has settled: the lists' timers have nothing left to wait for.
    this.#deadlines.close()
  }

  // Starts a call without retries (the stubs' and call()'s entry, a StartCall):
  // through `callback` when not null, else through resolve/reject.
  readonly #start: StartCall = (endpoint, method, request, options, resolve, reject, responseOnly, callback) => {
    const timeoutMs = options.timeoutMs ?? this.#options.defaultTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS
    if (callback === null) this.#attempt(endpoint, method, request, options, timeoutMs, resolve, reject, responseOnly)
    else this.#attemptWith(callback, endpoint, method, request, options, timeoutMs, resolve, reject, responseOnly)
  }

  // #attempt for a call that settles through `callback` (null: through
  // resolve/reject). Calls can nest (a callback run while this one starts may
  // start another): the outer one's state comes back after.
  #attemptWith (callback: Callback<Message> | null, endpoint: Target, method: PreparedMethod, request: Message, options: CallOptions, timeoutMs: number,
    resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void, responseOnly: boolean): void {
    const calls = this.#calls
    const outer = calls.startedCall
    this.#starting = callback
    try {
      this.#attempt(endpoint, method, request, options, timeoutMs, resolve, reject, responseOnly)
    } finally {
      this.#starting = null
      calls.startedCall = outer
    }
  }

  #attempt (endpoint: Target, method: PreparedMethod, request: Message, options: CallOptions, timeoutMs: number,
    resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void, responseOnly = false): void {
    // A callback-form call's callback, taken at once: nothing below may see another's.
    const callback = this.#starting
    this.#starting = null
    if (this.#closed) return failEarly(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed'), reject, callback)
    const methodDef = method.methodDef
    let target: { host: string, port: number }
    let key: string
    let slot: Slot | undefined
    let balanced: BalancedTarget | null = null
    let body: Uint8Array
    let bodyBytes: number
    try {
      // The endpoint of the previous call, still connected: no lookups. Only
      // strings are remembered (an endpoint object could change under us).
      const last = endpoint === this.#lastEndpoint ? this.#lastConnection : null
      if (last !== null && !last.closed && !last.retired) {
        target = last.target
        key = last.key
      } else if ((balanced = this.#balancedTarget(endpoint)) === null) {
        target = parseEndpoint(endpoint as Endpoint, this.#endpoints)
        key = typeof endpoint === 'string' ? endpoint : `${target.host}:${target.port}`
      } else {
        if (balanced.resolving !== null) {
          // Names still resolving: this attempt starts once they are known.
          balanced.resolving.then(
            () => this.#attemptWith(callback, endpoint, method, request, options, timeoutMs, resolve, reject, responseOnly),
            (error: RpcError) => failEarly(error, reject, callback))
          return
        }
        balanced.refresh()
        slot = balanced.balancer.pick()
        if (slot === undefined) throw new RpcError(ErrorCode.CONNECT_FAILED, `no address for ${balanced.name}`)
        target = slot.address
        key = slot.key
      }
      // A flat request is written straight into its frame below; others are
      // encoded into the codec's scratch buffer: nothing below encodes again
      // before the frame encoder copies them. The request is checked first
      // (the same check `nyala call` runs; it makes no object for a valid
      // request that encodes as it is).
      const requestType = methodDef.requestType
      const encodable = requestType.prepareRequest(request)
      bodyBytes = requestType.flatLength(encodable)
      if (bodyBytes < 0) {
        const scratch = requestType.encodeToScratch(encodable)
        body = scratch.bytes
        bodyBytes = scratch.length
      } else {
        body = NO_BODY
      }
    } catch (err) {
      return failEarly(err as RpcError, reject, callback)
    }
    const timed = timeoutMs > 0 && Number.isFinite(timeoutMs)
    const call = newCall(method, target, responseOnly, resolve, reject)
    if (callback !== null) {
      call.callback = callback
      this.#calls.startedCall = call
    }
    if (options.signal !== undefined) {
      if (options.signal.aborted) return failEarly(new RpcError(ErrorCode.CANCELLED, `${labelOf(call)} was cancelled before it started`), reject, callback)
      call.signal = options.signal
      call.onAbort = () => this.#calls.cancel(call)
      options.signal.addEventListener('abort', call.onAbort, { once: true })
    }
    if (timed) this.#deadlines.arm(call, timeoutMs)

    const cached = this.#lastConnection
    const cc = balanced === null && cached !== null && cached.key === key && !cached.closed && !cached.retired ? cached : this.#pool.connectionOrError(target, key)
    if (cc instanceof RpcError) return this.#calls.fail(call, cc)
    if (balanced === null && typeof endpoint === 'string' && cc !== cached) {
      // Balanced calls pick a connection each time: only single endpoints are remembered.
      this.#lastEndpoint = endpoint
      this.#lastConnection = cc
    }
    if (slot !== undefined && cc.slot === null) {
      cc.slot = slot
      cc.balancer = balanced!.balancer
    }
    call.conn = cc
    if (cc.closed) return this.#calls.fail(call, cc.connection.closeError ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
    const callId = cc.takeCallId()
    call.callId = callId
    cc.outstanding.set(callId, call)
    call.needsApplicationFeatures = options.requiredFeatureFlags !== undefined && options.requiredFeatureFlags.length > 0
    const remoteMethod = method.remoteMethod
    const timeout = timed ? wireTimeout(Math.max(1, timeoutMs)) : 0
    if (!call.needsApplicationFeatures && options.signal === undefined && (options.sidecars === undefined || options.sidecars.length === 0)) {
      // The common case: encoded straight into the connection's outbound
      // slab, when the connection is ready to write. Such a frame goes out
      // at the end of this microtask checkpoint, as a frame written at once,
      // and cannot be dropped: no timer fires before then, but an
      // AbortSignal could, so a call with one stays a droppable transfer.
      const connection = cc.connection
      const tail = method.tailFor(timeout)
      const bytes = requestFrameBytes(callId, tail, bodyBytes)
      const frame = IN_PLACE
      frame.callId = callId
      frame.tail = tail
      frame.body = body
      frame.bodyBytes = bodyBytes
      frame.type = methodDef.requestType
      if (connection.tryWriteFrame(bytes, REQUEST_WRITER, frame, undefined)) {
        call.state = CallState.SENT
        return
      }
    }
    if (body === NO_BODY) {
      // The slow path wants the body's bytes.
      body = Buffer.allocUnsafe(bodyBytes)
      methodDef.requestType.writeFlat(body, 0)
    }
    let slices: Buffer[]
    try {
      slices = encodeRequestFrame({
        callId,
        remoteMethod,
        timeoutMs: timeout,
        requiredFeatureFlags: options.requiredFeatureFlags,
        sidecars: options.sidecars
      }, bodyBytes === body.length ? body : body.subarray(0, bodyBytes))
    } catch (err) {
      return this.#calls.fail(call, err as RpcError)
    }
    let bytes = 0
    for (const s of slices) bytes += s.length
    call.slices = slices
    call.bytes = bytes
    call.sentHook = this.#calls.sentHook
    const accepted = cc.connection.send(call)
    if (!accepted) this.#calls.fail(call, new RpcError(ErrorCode.QUEUE_FULL, `${labelOf(call)}: the connection's outbound queue is full`))
  }

  // The balancer for `endpoint`, or null when calls to it use one plain connection.
  #balancedTarget (endpoint: Target): BalancedTarget | null {
    const perEndpoint = this.#options.connectionsPerEndpoint ?? 1
    const resolveAll = this.#options.resolveAll === true
    const list = Array.isArray(endpoint)
    if (!list && perEndpoint === 1 && !resolveAll) return null
    const endpoints = (list ? endpoint : [endpoint]) as readonly Endpoint[]
    const name = endpoints.map((e) => typeof e === 'string' ? e : `${e.host}:${e.port}`).join(',')
    let balanced = this.#balancers.get(name)
    if (balanced === undefined) {
      const parsed = endpoints.map((e) => parseEndpoint(e, this.#endpoints))
      if (parsed.length === 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no endpoint: the list is empty')
      const connections = this.#pool.connections
      const balancer = new Balancer(resolveAll ? [] : parsed, {
        connectionsPerEndpoint: perEndpoint,
        policy: this.#options.balance ?? 'p2c',
        clock: this.#clock,
        outstanding: (slot) => connections.get(slot.key)?.outstanding.size ?? 0
      })
      balanced = new BalancedTarget(name, balancer, resolveAll ? parsed : null, this.#clock)
      if (this.#balancers.size < 1024) this.#balancers.set(name, balanced)
    }
    return balanced
  }
}

// Failures after which the call certainly did not run on the server.
const NOT_RUN_REMOTE: ReadonlySet<number> = new Set([KrpcCode.ERROR_SERVER_TOO_BUSY, KrpcCode.ERROR_UNAVAILABLE, KrpcCode.FATAL_SERVER_SHUTTING_DOWN])
const NOT_SENT_LOCAL: ReadonlySet<string> = new Set([ErrorCode.CONNECT_FAILED, ErrorCode.CONNECTION_CLOSED, ErrorCode.NEGOTIATION_FAILED, ErrorCode.QUEUE_FULL])

function isRetryable (error: RpcError, sent: boolean, idempotent: boolean): boolean {
  if (error.remote?.code !== undefined) return NOT_RUN_REMOTE.has(error.remote?.code)
  if (!NOT_SENT_LOCAL.has(error.code)) return false
  // A request that reached the socket may have run: only idempotent methods go again.
  return !sent || idempotent
}
