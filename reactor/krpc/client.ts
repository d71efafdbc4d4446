import { lookup } from 'node:dns/promises'
import Denque from 'denque'
import { connect as netConnect } from 'node:net'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from '../../codec/frame-decoder.js'
import { ErrorStatusType, ResponseParts, encodeRemoteMethod, encodeRequestFrame, krpcFraming, parseResponseInto, requestFrameBytes, requestHeaderTail, wireTimeout, writeRequestFrame, writeRequestFrameHead } from '../../codec/krpc/frames.js'
import { ClientNegotiation, RpcFeature, type Negotiated } from '../../codec/krpc/negotiation.js'
import type { Message, MethodDef, MethodMap, ServiceDef } from '../../codec/schema.js'
import { realClock, type Clock, type TimerHandle } from '../../scheduling/clock.js'
import { CallTable } from '../call-table.js'
import { Balancer, type Address, type BalancePolicy, type Slot } from '../balancer.js'
import { DEFAULT_MAX_ATTEMPTS, ExponentialBackoff, RetryBudget, nextRetryDelay, sleep, type Backoff, type RetryBudgetStats } from '../../scheduling/retry.js'
import { BusyPoller } from '../../transport/busy-poll.js'
import { SocketReader } from '../../transport/socket-reader.js'
import { Connection, type ConnectionStats } from '../../transport/connection.js'
import type { OutboundTransfer } from '../../transport/transfer-queue.js'

/** Per-call options. */
export interface CallOptions {
  /**
   * Time allowed for the whole call: connect, negotiation, send and
   * response. Default: the client's `defaultTimeoutMs`. Sent as the
   * request's `timeout_millis`; the client's own deadline runs from the end
   * of the microtask checkpoint the call is made in (docs/scheduling.md).
   */
  timeoutMs?: number
  /** Cancels the call. */
  signal?: AbortSignal
  /** Request sidecars, sent after the message without copying. */
  sidecars?: readonly Uint8Array[]
  /** Application feature flags the server must support. */
  requiredFeatureFlags?: readonly number[]
  /**
   * The method may run more than once with the same effect: with retries on,
   * the call is retried even after a failure that may have happened after
   * the server started it (a connection lost once the request was sent).
   */
  idempotent?: boolean
  /** false: no retries for this call, whatever the client's policy. */
  retry?: boolean
}

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

/** Counters of one open connection of the client (`Client.connectionStats`). */
export interface ClientConnectionStats extends ConnectionStats {
  /** The endpoint as the calls named it. */
  endpoint: string
  /** Calls waiting for a response on this connection. */
  pendingCalls: number
}

/** A response with its sidecars. */
export interface CallResult<Res> {
  response: Res
  /** Response sidecars (views of the received frame). */
  sidecars: Buffer[]
}

/** `host:port`, or its parts. */
export type Endpoint = string | { host: string, port: number }

/** One endpoint, or several to balance calls over. */
export type Target = Endpoint | readonly Endpoint[]

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
}

/**
 * How a call made with a callback ends: with an error, or with null and the
 * response. Called exactly once, never before the call that made it has
 * returned (Kudu's `Proxy::AsyncRequest` callback).
 */
export type Callback<Res> = (error: RpcError | null, response?: Res) => void

/**
 * One method of a stub. Called without a callback it returns a promise of
 * the response. Called with one it returns nothing and calls it once the
 * call ends: no promise and no await, for callers that issue the next call
 * from the last one's completion (rpc-bench's async chains). A callback that
 * throws does not disturb the client: the exception is rethrown from a
 * `setImmediate` callback, as an uncaught exception.
 */
export interface StubMethod<Req, Res> {
  (request: Req, options?: CallOptions): Promise<Res>
  (request: Req, callback: Callback<Res>): void
  (request: Req, options: CallOptions | undefined, callback: Callback<Res>): void
}

/** A typed stub: one method per method of the service, each with a promise and a callback form. */
export type Stub<M extends MethodMap> = {
  [K in keyof M & string]: StubMethod<M[K]['request'], M[K]['response']>
}

/** A method of a service as calls to it need it: resolved once, not per call. */
class PreparedMethod {
  readonly service: string
  readonly methodDef: MethodDef<Message, Message>
  /** The encoded `remote_method` header field. */
  readonly remoteMethod: Buffer
  /** The request header after call_id for wire timeout `tailTimeout` (the last one used): encoded once, not per call. */
  tail: Buffer
  tailTimeout: number

  constructor (service: string, methodDef: MethodDef<Message, Message>) {
    this.service = service
    this.methodDef = methodDef
    this.remoteMethod = encodeRemoteMethod(service, methodDef.name)
    this.tailTimeout = 0
    this.tail = requestHeaderTail(this.remoteMethod, 0)
  }

  tailFor (timeout: number): Buffer {
    if (timeout !== this.tailTimeout) {
      this.tail = requestHeaderTail(this.remoteMethod, timeout)
      this.tailTimeout = timeout
    }
    return this.tail
  }
}

function noSuchMethod (def: ServiceDef, method: string): RpcError {
  return new RpcError(ErrorCode.INVALID_ARGUMENT, `${def.fullName} has no method ${method}`)
}

const CallState = {
  QUEUED: 0, // waiting on the connection: connect, negotiation, or the transfer queue
  SENDING: 1, // bytes handed to the socket, some of the caller's buffers still referenced
  SENT: 2,
  FINISHED: 3
} as const
type CallState = typeof CallState[keyof typeof CallState]

/**
 * One call from the client's side. It settles exactly once, through
 * `finish`, whatever happens first: response, timeout, cancellation or
 * connection failure.
 *
 * A plain object made by `newCall`, not a class instance: V8 allocates an
 * object literal in line wherever it is made, while `new` in #attempt came
 * after V8's inlining budget ran out and went through the generic construct
 * stub, allocating in a builtin (~2 % of a pipelining client's CPU in perf).
 */
interface OutboundCall extends OutboundTransfer {
  state: CallState
  slices: Buffer[]
  bytes: number
  sentHook: ((call: OutboundCall, error: RpcError | undefined) => void) | null
  callId: number
  conn: ClientConnection | null
  timer: TimerHandle | null
  cancelPending: RpcError | null
  needsApplicationFeatures: boolean
  featureMissing: boolean
  /**
   * Its deadline, shared with the calls made in the same checkpoint (see
   * `Client.#armDeadline`), which also hold it in a deadline list; NaN
   * until that checkpoint ends.
   */
  stamp: Stamp
  readonly method: PreparedMethod
  readonly target: { host: string, port: number }
  /** Resolve with the response alone (typed stubs), not a CallResult. */
  readonly responseOnly: boolean
  readonly resolve: (result: CallResult<Message> | Message) => void
  /** `sent`: some of the request's bytes were handed to the socket, so the server may have run it. */
  readonly reject: (error: RpcError, sent: boolean) => void
  /** A callback-form call: settled through this instead of resolve/reject. */
  callback: Callback<Message> | null
  signal: AbortSignal | undefined
  onAbort: (() => void) | undefined
  // Transfer-queue hooks, shared by every call: the call is its own transfer, so no closure per call.
  readonly beforeWrite: (this: OutboundCall) => boolean
  readonly onSent: (this: OutboundCall, error: RpcError | undefined) => void
}

function newCall (method: PreparedMethod, target: { host: string, port: number }, responseOnly: boolean,
  resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void): OutboundCall {
  return {
    state: CallState.QUEUED,
    slices: NO_SLICES,
    bytes: 0,
    sentHook: null,
    callId: -1,
    conn: null,
    timer: null,
    cancelPending: null,
    needsApplicationFeatures: false,
    featureMissing: false,
    stamp: NO_DEADLINE,
    method,
    target,
    responseOnly,
    resolve,
    reject,
    callback: null,
    signal: undefined,
    onAbort: undefined,
    beforeWrite: callBeforeWrite,
    onSent: callOnSent
  }
}

function callBeforeWrite (this: OutboundCall): boolean {
  if (this.state === CallState.FINISHED) return false
  if (this.needsApplicationFeatures && this.conn?.negotiated?.features.has(RpcFeature.APPLICATION_FEATURE_FLAGS) !== true) {
    // Known only once negotiation is done: fail locally, never send.
    this.featureMissing = true
    return false
  }
  this.state = CallState.SENDING
  return true
}

function callOnSent (this: OutboundCall, error: RpcError | undefined): void {
  this.slices = NO_SLICES
  this.sentHook?.(this, error)
}

/** DEADLINE_EXCEEDED for a call whose retries ran out of time, naming the error that made it retry. */
function retriesTimedOut (def: ServiceDef, method: string, timeoutMs: number, attempts: number, last: RpcError): RpcError {
  return new RpcError(ErrorCode.DEADLINE_EXCEEDED,
    `${def.fullName}.${method} timed out after ${timeoutMs} ms and ${attempts} attempt(s); last error: ${last.message}`, { cause: last })
}

/** For messages: built only when an error needs it, never per call. */
function labelOf (call: OutboundCall): string {
  return `${call.method.service}.${call.method.methodDef.name} RPC to ${call.target.host}:${call.target.port}`
}

function isFinished (call: OutboundCall): boolean {
  return call.state === CallState.FINISHED
}

const NO_SLICES: Buffer[] = []
const NO_OPTIONS: CallOptions = {}
// The body of a flat request, written into its frame from the message itself.
const NO_BODY = new Uint8Array(0)
// What a call resolves with: a CallResult, or the response alone for stubs (`responseOnly`).
type AnyResolve = (result: CallResult<Message> | Message) => void
const responseOf = (result: CallResult<Message>): Message => result.response
const unusedResolve: AnyResolve = () => {}
const unusedReject = (): void => {}

// A callback's exception belongs to its caller, not to the read or timer that
// settled the call: it is rethrown from setImmediate, the client left whole.
// (Not process.nextTick: a tick that throws at the end of an `onread`
// callback leaves Node's reads of that socket stopped.)
function deliver (callback: Callback<Message>, error: RpcError | null, response: Message | undefined): void {
  try {
    callback(error, response)
  } catch (err) {
    setImmediate(rethrow, err)
  }
}

function rethrow (err: unknown): never {
  throw err
}

/** One connection to one endpoint, shared by every call to it. */
class ClientConnection {
  readonly key: string
  readonly target: { host: string, port: number }
  readonly connection: Connection
  readonly outstanding = new CallTable<OutboundCall>()
  negotiated: Negotiated | null = null
  nextCallId = 0
  closed = false
  retired = false
  /** The balancer slot this connection fills, if balanced. */
  slot: Slot | null = null
  balancer: Balancer | null = null

  constructor (key: string, target: { host: string, port: number }, connection: Connection) {
    this.key = key
    this.target = target
    this.connection = connection
  }

  takeCallId (): number {
    const id = this.nextCallId
    this.nextCallId = id === 0x7fffffff ? 0 : id + 1
    return id
  }
}

function parseEndpoint (endpoint: Endpoint, cache: Map<string, { host: string, port: number }>): { host: string, port: number } {
  if (typeof endpoint !== 'string') {
    const { host, port } = endpoint
    if (typeof host !== 'string' || host === '' || !Number.isInteger(port) || port <= 0 || port > 65535) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${JSON.stringify(endpoint)}: expected { host, port } with a port in 1..65535`)
    }
    return endpoint
  }
  const cached = cache.get(endpoint)
  if (cached !== undefined) return cached
  const at = endpoint.lastIndexOf(':')
  const port = Number(endpoint.slice(at + 1))
  if (at <= 0 || !Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${endpoint}: expected HOST:PORT`)
  }
  const parsed = { host: endpoint.slice(0, at).replace(/^\[|\]$/g, ''), port }
  if (cache.size < 1024) cache.set(endpoint, parsed)
  return parsed
}

const DEFAULT_NEGOTIATION_TIMEOUT_MS = 3000
const DEFAULT_CALL_TIMEOUT_MS = 30_000

/**
 * A KRPC client. One connection per endpoint, reused by every call; call
 * ids from 0 per connection; each call's timer is armed when the call is
 * made, so it covers connect and negotiation; late responses are ignored.
 * A peer that closes or sends garbage fails every pending call on that
 * connection with a connection error, never crashing the process.
 */
export class Client {
  readonly #options: ClientOptions
  readonly #clock: Clock
  readonly #connections = new Map<string, ClientConnection>()
  /** Connections retired after a FATAL_* answer, kept until their last call settles. */
  readonly #retiredConnections = new Set<ClientConnection>()
  readonly #methods = new Map<MethodDef<Message, Message>, Map<string, PreparedMethod>>()
  readonly #endpoints = new Map<string, { host: string, port: number }>()
  readonly #balancers = new Map<string, BalancedTarget>()
  readonly #deadlines = new Map<number, DeadlineList>()
  readonly #onSentHook = (call: OutboundCall, error: RpcError | undefined): void => this.#onSent(call, error)
  #closed = false
  readonly #retry: { backoff: Backoff, maxAttempts: number | undefined, budget: RetryBudget | null } | null
  readonly #retryCounts = { retries: 0, exhausted: 0 }
  readonly #parts = new ResponseParts()
  #lastDeadlines: DeadlineList | null = null
  // Deadline lists with calls waiting for their deadline (see #armDeadline).
  readonly #unstamped: DeadlineList[] = []
  readonly #stampMicrotask = (): void => { this.#stamp() }
  readonly #unsubscribeClock: (() => void) | null
  // The last single endpoint called and its connection: most calls repeat them.
  #lastEndpoint: Target | null = null
  #lastConnection: ClientConnection | null = null
  readonly #poller: BusyPoller | undefined
  // While a callback-form call starts: its callback (#attempt hands it to
  // the call it creates, or settles it if it fails before), and that call.
  #starting: Callback<Message> | null = null
  #startedCall: OutboundCall | null = null

  constructor (options: ClientOptions = {}) {
    this.#options = options
    this.#clock = options.clock ?? realClock
    this.#unsubscribeClock = this.#clock.beforeStep?.(this.#stampMicrotask) ?? null
    this.#poller = (options.busyPollUs ?? 0) > 0 ? new BusyPoller(options.busyPollUs!) : undefined
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
    const stub: Record<string, (request: unknown, options?: CallOptions | Callback<Message>, callback?: Callback<Message>) => Promise<unknown> | undefined> = {}
    for (const name of Object.keys(def.methods)) {
      // Resolved once per stub: its definition and its encoded remote_method.
      const method = this.#prepared(def, name)!
      stub[name] = (request: unknown, options?: CallOptions | Callback<Message>, callback?: Callback<Message>) => {
        if (typeof options === 'function') {
          callback = options
          options = undefined
        }
        const opts = options ?? NO_OPTIONS
        if (callback !== undefined) {
          if (typeof callback !== 'function') throw new TypeError(`${def.fullName}.${name}: the callback must be a function`)
          this.#startWithCallback(target, def, name, method, request as Message, opts, callback)
          return undefined
        }
        if (this.#retry !== null && opts.retry !== false) return this.call(target, def, name, request as Message, opts).then(responseOf)
        // The common path: one promise per call, resolved with the response itself.
        return new Promise((resolve, reject) => {
          this.#start(target, method, request as Message, opts, resolve as AnyResolve, reject, true)
        })
      }
    }
    return stub as unknown as Stub<M>
  }

  /** Calls `service.method` at `endpoint`; resolves with the response and its sidecars. */
  call<Res = Message> (endpoint: Target, def: ServiceDef, method: string, request: Message, options: CallOptions = {}): Promise<CallResult<Res>> {
    if (this.#retry !== null && options.retry !== false) return this.#callWithRetries(endpoint, def, method, request, options) as Promise<CallResult<Res>>
    return new Promise<CallResult<Message>>((resolve, reject) => {
      const prepared = this.#prepared(def, method)
      if (prepared === undefined) reject(noSuchMethod(def, method))
      else this.#start(endpoint, prepared, request, options, resolve as AnyResolve, reject)
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
    const prepared = this.#prepared(def, method)
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
        if (outOfAttempts || outOfBudget) throw error
        // The next attempt could not start before the deadline.
        throw retriesTimedOut(def, method, timeoutMs, attempt, error)
      }
      previous = error
      this.#retryCounts.retries++
      try {
        await sleep(clock, delay, options.signal)
      } catch {
        throw new RpcError(ErrorCode.CANCELLED, `${def.fullName}.${method} was cancelled while waiting to retry (after: ${error.message})`)
      }
      if (this.#closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed while the call waited to retry')
    }
  }

  /** Open connections (for tests and metrics). */
  get connectionCount (): number {
    return this.#connections.size
  }

  /** Calls waiting for a response on any connection. */
  get pendingCalls (): number {
    let n = 0
    for (const cc of this.#connections.values()) n += cc.outstanding.size
    for (const cc of this.#retiredConnections) n += cc.outstanding.size
    return n
  }

  /**
   * Counters of each open connection: its outbound transfer queue (requests
   * and bytes queued, bytes the socket still buffers, immediate and batched
   * writes, partial writes, drain waits) and the bytes and frames read and
   * written.
   */
  connectionStats (): ClientConnectionStats[] {
    const out: ClientConnectionStats[] = []
    for (const cc of this.#connections.values()) out.push({ endpoint: cc.key, pendingCalls: cc.outstanding.size, ...cc.connection.stats() })
    return out
  }

  /** Fails every pending call with RPC_ERR_CLIENT_CLOSED and closes every connection. Later calls fail at once. */
  close (): void {
    if (this.#closed) return
    this.#closed = true
    this.#poller?.stop()
    this.#unsubscribeClock?.()
    const error = new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed with the call pending')
    for (const cc of [...this.#connections.values(), ...this.#retiredConnections]) this.#failConnection(cc, error)
    // Every call has settled: the lists' timers have nothing left to wait for.
    for (const list of this.#deadlines.values()) {
      if (list.timer !== null) this.#clock.clearTimer(list.timer)
      list.timer = null
    }
  }

  // A callback-form call. Its callback never runs before this returns: a call
  // that fails while it starts (client closed, bad request, queue full) is
  // settled from setImmediate, so a chain that re-issues from its callback
  // cannot recurse.
  #startWithCallback (endpoint: Target, def: ServiceDef, name: string, method: PreparedMethod, request: Message, options: CallOptions, callback: Callback<Message>): void {
    if (this.#retry !== null && options.retry !== false) {
      this.call(endpoint, def, name, request, options).then((result) => deliver(callback, null, result.response), (error: RpcError) => deliver(callback, error, undefined))
      return
    }
    const timeoutMs = options.timeoutMs ?? this.#options.defaultTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS
    this.#attemptWith(callback, endpoint, method, request, options, timeoutMs, unusedResolve, unusedReject, true)
  }

  // #attempt for a call that settles through `callback` (null: through
  // resolve/reject). Calls can nest (a callback run while this one starts may
  // start another): the outer one's state comes back after.
  #attemptWith (callback: Callback<Message> | null, endpoint: Target, method: PreparedMethod, request: Message, options: CallOptions, timeoutMs: number,
    resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void, responseOnly: boolean): void {
    const outer = this.#startedCall
    this.#starting = callback
    try {
      this.#attempt(endpoint, method, request, options, timeoutMs, resolve, reject, responseOnly)
    } finally {
      this.#starting = null
      this.#startedCall = outer
    }
  }

  #start (endpoint: Target, method: PreparedMethod, request: Message, options: CallOptions,
    resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void, responseOnly = false): void {
    const timeoutMs = options.timeoutMs ?? this.#options.defaultTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS
    this.#attempt(endpoint, method, request, options, timeoutMs, resolve, reject, responseOnly)
  }

  #attempt (endpoint: Target, method: PreparedMethod, request: Message, options: CallOptions, timeoutMs: number,
    resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void, responseOnly = false): void {
    // A callback-form call's callback, taken at once: nothing below may see another's.
    const callback = this.#starting
    this.#starting = null
    if (this.#closed) return this.#failEarly(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed'), reject, callback)
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
            (error: RpcError) => this.#failEarly(error, reject, callback))
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
      // before the frame encoder copies them.
      bodyBytes = methodDef.requestType.flatLength(request)
      if (bodyBytes < 0) {
        const scratch = methodDef.requestType.encodeToScratch(request)
        body = scratch.bytes
        bodyBytes = scratch.length
      } else {
        body = NO_BODY
      }
    } catch (err) {
      return this.#failEarly(err as RpcError, reject, callback)
    }
    const timed = timeoutMs > 0 && Number.isFinite(timeoutMs)
    const call = newCall(method, target, responseOnly, resolve, reject)
    if (callback !== null) {
      call.callback = callback
      this.#startedCall = call
    }
    if (options.signal !== undefined) {
      if (options.signal.aborted) return this.#failEarly(new RpcError(ErrorCode.CANCELLED, `${labelOf(call)} was cancelled before it started`), reject, callback)
      call.signal = options.signal
      call.onAbort = () => this.#cancel(call)
      options.signal.addEventListener('abort', call.onAbort, { once: true })
    }
    if (timed) this.#armDeadline(call, timeoutMs)

    const cached = this.#lastConnection
    const cc = balanced === null && cached !== null && cached.key === key && !cached.closed && !cached.retired ? cached : this.#connectionOrError(target, key)
    if (cc instanceof RpcError) return this.#finishError(call, cc)
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
    if (cc.closed) return this.#finishError(call, cc.connection.closeError ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
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
      const out = connection.reserve(bytes)
      if (out !== null) {
        const at = connection.reservedAt
        if (body !== NO_BODY) writeRequestFrame(out, at, callId, tail, body, bodyBytes)
        else methodDef.requestType.writeFlat(out, writeRequestFrameHead(out, at, callId, tail, bodyBytes))
        call.state = CallState.SENT
        connection.commit(bytes)
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
      return this.#finishError(call, err as RpcError)
    }
    let bytes = 0
    for (const s of slices) bytes += s.length
    call.slices = slices
    call.bytes = bytes
    call.sentHook = this.#onSentHook
    const accepted = cc.connection.send(call)
    if (!accepted) this.#finishError(call, new RpcError(ErrorCode.QUEUE_FULL, `${labelOf(call)}: the connection's outbound queue is full`))
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
      const balancer = new Balancer(resolveAll ? [] : parsed, {
        connectionsPerEndpoint: perEndpoint,
        policy: this.#options.balance ?? 'p2c',
        clock: this.#clock,
        outstanding: (slot) => this.#connections.get(slot.key)?.outstanding.size ?? 0
      })
      balanced = new BalancedTarget(name, balancer, resolveAll ? parsed : null, this.#clock)
      if (this.#balancers.size < 1024) this.#balancers.set(name, balanced)
    }
    return balanced
  }

  // A method of a service, resolved with its encoded remote_method (cached per definition and service name).
  #prepared (def: ServiceDef, name: string): PreparedMethod | undefined {
    const methods = def.methods as Record<string, MethodDef<Message, Message> | undefined>
    const methodDef = Object.hasOwn(methods, name) ? methods[name] : undefined
    if (methodDef === undefined) return undefined
    let byService = this.#methods.get(methodDef)
    if (byService === undefined) {
      byService = new Map()
      this.#methods.set(methodDef, byService)
    }
    let prepared = byService.get(def.fullName)
    if (prepared === undefined) {
      prepared = new PreparedMethod(def.fullName, methodDef)
      byService.set(def.fullName, prepared)
    }
    return prepared
  }

  // A connection for a call, or why none could be opened (net.connect throws on some addresses).
  #connectionOrError (target: { host: string, port: number }, key: string): ClientConnection | RpcError {
    try {
      return this.#connectionFor(target, key)
    } catch (err) {
      return err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${key}: ${(err as Error).message}`, { cause: err })
    }
  }

  #connectionFor (target: { host: string, port: number }, key: string): ClientConnection {
    const existing = this.#connections.get(key)
    if (existing !== undefined) return existing
    // Reads come through onread, not 'data' events (see SocketReader).
    const reader = new SocketReader()
    const socket = netConnect({ host: target.host, port: target.port, noDelay: true, onread: reader.onread })
    const connection = new Connection(socket, {
      reader,
      framing: krpcFraming,
      maxFrameBytes: this.#options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      maxOutboundBytes: this.#options.maxOutboundBytes,
      busyPoller: this.#poller
    })
    const cc = new ClientConnection(key, target, connection)
    this.#connections.set(key, cc)
    let connected = false
    socket.once('connect', () => { connected = true })
    connection.attach({
      onFrame: (buf, start, end) => this.#onFrame(cc, buf, start, end),
      onClose: (error) => {
        // A connection that never negotiated marks its slot as failing, so balanced calls skip it for a while.
        if (cc.negotiated === null && cc.slot !== null && error !== undefined) cc.balancer?.failed(cc.slot)
        const reason = !connected && error !== undefined && error.code === ErrorCode.CONNECTION_CLOSED
          ? new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${key}: ${error.message.replace(/^socket error: /, '')}`, { cause: error })
          : error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${key} closed`)
        this.#failConnection(cc, reason)
      }
    })
    const negotiationMs = this.#options.negotiationTimeoutMs ?? DEFAULT_NEGOTIATION_TIMEOUT_MS
    const timer = this.#clock.setTimer(() => {
      connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `connection negotiation to ${key} timed out after ${negotiationMs} ms`))
    }, negotiationMs)
    const negotiation = new ClientNegotiation({ user: this.#options.user, password: this.#options.password })
    connection.handshake<Negotiated>({
      start: () => negotiation.start(),
      onFrame: (frame) => {
        const step = negotiation.onFrame(frame)
        if (step.done !== undefined) cc.negotiated = step.done
        return step
      }
    }).then((negotiated) => {
      this.#clock.clearTimer(timer)
      cc.negotiated = negotiated
      if (cc.slot !== null) cc.balancer?.succeeded(cc.slot)
    }, () => {
      this.#clock.clearTimer(timer)
    })
    return cc
  }

  #onFrame (cc: ClientConnection, buf: Buffer, start: number, end: number): boolean {
    // Taken apart into one reused object: no header, frame or view objects per call.
    const parts = this.#parts
    const malformed = parseResponseInto(buf, start, end, parts)
    if (malformed !== null) {
      cc.connection.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, `malformed response from ${cc.key}: ${malformed.message}`))
      return false
    }
    // Out of the table at once (one probe): every path below finishes it.
    const call = cc.outstanding.take(parts.callId)
    // Unknown, timed out or cancelled: ignore.
    if (call === undefined) return true
    if (parts.isError === true) {
      const status = ErrorStatusType.decodeRange(buf, parts.messageStart, parts.messageEnd)
      if (status instanceof RpcError) {
        this.#finishError(call, new RpcError(ErrorCode.INVALID_RESPONSE, `${labelOf(call)}: was an RPC error but could not parse error response`), true)
      } else {
        const code = status.code === undefined || status.code === 0 ? KrpcCode.FATAL_UNKNOWN : status.code
        const error = krpcError(code, status.message, status.unsupported_feature_flags)
        // FATAL_*: this connection must not be reused; new calls open another.
        if (error.fatal) this.#retire(cc)
        this.#finishError(call, error, true)
      }
      return true
    }
    const response = call.method.methodDef.responseType.decodeRange(buf, parts.messageStart, parts.messageEnd)
    if (response instanceof RpcError) {
      this.#finishError(call, new RpcError(ErrorCode.INVALID_RESPONSE, `${labelOf(call)}: invalid RPC response, ${response.message}`), true)
      return true
    }
    const sidecars = parts.sidecars
    this.#finish(call, true)
    if (call.callback !== null) deliver(call.callback, null, response)
    else call.resolve(call.responseOnly ? response : { response, sidecars })
    return true
  }

  #onSent (call: OutboundCall, error: RpcError | undefined): void {
    if (call.state === CallState.SENDING) call.state = CallState.SENT
    if (call.cancelPending !== null && !isFinished(call)) {
      // A cancel that arrived mid-send takes effect now that the frame is whole.
      this.#finishError(call, call.cancelPending)
      return
    }
    if (call.featureMissing) {
      this.#finishError(call, new RpcError(ErrorCode.NOT_SUPPORTED, `${labelOf(call)}: server does not support the required RPC features`))
    }
    // Other write failures close the connection, whose close fails the call
    // with the connection's reason.
  }

  // Calls with the same (whole-millisecond) timeout share one timer: their
  // deadlines are in arrival order, since the clock is monotonic. That spares
  // a timer and a closure per call. Other timeouts (a retry's remaining
  // time) get a timer of their own.
  //
  // A call in a list is stamped with its deadline at the end of the
  // microtask checkpoint it was made in, when its request is written out:
  // one clock reading for every call of the checkpoint (a reading costs
  // about as much as encoding the request here). The deadline may so be
  // later than the caller's clock by the rest of that checkpoint, never
  // earlier; the timeout sent to the server is the call's own.
  //
  // The list holds stamps, one per checkpoint, and each stamp its calls:
  // per call, a push onto the young stamp's array and a count. (A list of
  // calls took an old-generation queue's write barrier and a shift per call,
  // ~3 % of a pipelining client's CPU in perf.)
  #armDeadline (call: OutboundCall, timeoutMs: number): void {
    // Calls mostly share one timeout: the last list found is tried first.
    let list = this.#lastDeadlines !== null && this.#lastDeadlines.timeoutMs === timeoutMs ? this.#lastDeadlines : this.#deadlines.get(timeoutMs)
    if (list === undefined) {
      if (!Number.isInteger(timeoutMs) || this.#deadlines.size >= MAX_DEADLINE_LISTS) {
        call.stamp = new Stamp(this.#clock.now() + timeoutMs, null)
        call.timer = this.#clock.setTimer(() => this.#onTimer(call, timeoutMs), timeoutMs)
        return
      }
      list = new DeadlineList(timeoutMs)
      this.#deadlines.set(timeoutMs, list)
    }
    this.#lastDeadlines = list
    let stamp = list.open
    if (stamp === null) {
      stamp = list.open = new Stamp(Number.NaN, list)
      list.stamps.push(stamp)
      this.#unstamped.push(list)
      // A resolved promise's then: unlike queueMicrotask, no AsyncResource.
      if (this.#unstamped.length === 1) void RESOLVED.then(this.#stampMicrotask)
    }
    stamp.live++
    stamp.calls.push(call)
    list.liveCalls++
    // Finished calls wait in their stamps until the stamps leave the list: a
    // stuck call would otherwise keep every call made after it.
    if (++list.heldCalls > 64 && list.heldCalls > 4 * list.liveCalls) this.#compactDeadlines(list)
    call.stamp = stamp
    if (list.timer === null) list.timer = this.#clock.setTimer(() => this.#onDeadlines(list), timeoutMs)
  }

  // Gives the calls made since the last stamp their deadlines: one stamp per list.
  #stamp (): void {
    const lists = this.#unstamped
    if (lists.length === 0) return
    const now = this.#clock.now()
    for (let i = 0; i < lists.length; i++) {
      const list = lists[i]!
      list.open!.deadline = now + list.timeoutMs
      list.open = null
    }
    lists.length = 0
  }

  #onDeadlines (list: DeadlineList): void {
    list.timer = null
    // A fake clock fires timers from inside a checkpoint.
    this.#stamp()
    const now = this.#clock.now()
    const stamps = list.stamps
    for (let front = stamps.peekFront(); front !== undefined; front = stamps.peekFront()) {
      if (front.live > 0 && front.deadline > now) break
      this.#dropStamp(list, stamps.shift()!)
      if (front.live === 0) continue
      list.liveCalls -= front.live
      for (const call of front.calls) this.#onTimer(call, list.timeoutMs)
    }
    const next = stamps.peekFront()
    if (next !== undefined) list.timer = this.#clock.setTimer(() => this.#onDeadlines(list), next.deadline - now)
  }

  // A stamp leaves its list: its calls, finished or timed out, no longer count there.
  #dropStamp (list: DeadlineList, stamp: Stamp): void {
    stamp.list = null
    list.heldCalls -= stamp.calls.length
  }

  // A finished call leaves its stamp: stamps whose calls have all finished
  // leave the front of the list at once, the rest when they reach it.
  //
  // An emptied list keeps its timer: one call after another (sync callers)
  // would otherwise set and clear a timer per call (1.3 us each here). It
  // fires at most once per timeout, finds nothing due, and re-arms only for
  // calls still waiting.
  #leaveDeadlines (stamp: Stamp, list: DeadlineList): void {
    list.liveCalls--
    if (--stamp.live > 0) return
    const stamps = list.stamps
    for (let front = stamps.peekFront(); front !== undefined && front.live === 0 && front !== list.open; front = stamps.peekFront()) {
      this.#dropStamp(list, stamps.shift()!)
    }
  }

  // Keeps only the stamps with calls waiting, and in them only those calls.
  #compactDeadlines (list: DeadlineList): void {
    const kept = list.stamps.toArray()
    list.stamps.clear()
    list.heldCalls = 0
    for (const stamp of kept) {
      if (stamp.live === 0 && stamp !== list.open) {
        stamp.list = null
        continue
      }
      stamp.calls = stamp.calls.filter((c) => !isFinished(c))
      list.heldCalls += stamp.calls.length
      list.stamps.push(stamp)
    }
  }

  #onTimer (call: OutboundCall, timeoutMs: number): void {
    call.timer = null
    if (isFinished(call)) return
    // A timer that fired late after an event-loop stall lets a response that
    // is already in the socket buffer be read first (Kudu's two-stage timer).
    this.#clock.defer(() => {
      if (isFinished(call)) return
      const negotiating = call.conn !== null && call.conn.negotiated === null
      const message = negotiating
        ? `connection negotiation for ${labelOf(call)} timed out after ${timeoutMs} ms`
        : `${labelOf(call)} timed out after ${timeoutMs} ms`
      const error = new RpcError(ErrorCode.DEADLINE_EXCEEDED, message)
      // Mid-write, the caller's sidecars are still being read: settle once the frame is out.
      if (call.state === CallState.SENDING) call.cancelPending = error
      else this.#finishError(call, error)
    })
  }

  #cancel (call: OutboundCall): void {
    if (isFinished(call)) return
    const error = new RpcError(ErrorCode.CANCELLED, `${labelOf(call)} was cancelled`)
    if (call.state === CallState.SENDING) {
      // Never truncate a frame nor release its buffers mid-write: wait.
      call.cancelPending = error
      return
    }
    this.#finishError(call, error)
  }

  // `taken`: the call is already out of its connection's table.
  #finish (call: OutboundCall, taken = false): void {
    call.state = CallState.FINISHED
    if (call.timer !== null) {
      this.#clock.clearTimer(call.timer)
      call.timer = null
    }
    const list = call.stamp.list
    if (list !== null) this.#leaveDeadlines(call.stamp, list)
    if (call.signal !== undefined && call.onAbort !== undefined) call.signal.removeEventListener('abort', call.onAbort)
    const cc = call.conn
    if (cc !== null) {
      if (!taken) cc.outstanding.delete(call.callId)
      if (cc.retired && cc.outstanding.size === 0) cc.connection.destroy()
    }
  }

  #finishError (call: OutboundCall, error: RpcError, taken = false): void {
    if (isFinished(call)) return
    const sent = call.state !== CallState.QUEUED
    this.#finish(call, taken)
    const callback = call.callback
    if (callback === null) call.reject(error, sent)
    // Failed while it starts: its caller has not got control back yet.
    else if (call === this.#startedCall) setImmediate(deliver, callback, error, undefined)
    else deliver(callback, error, undefined)
  }

  // A call that failed before it was made: a promise rejects, a callback is
  // called from setImmediate (not a tick: a chain that re-issues on every
  // failure must not starve I/O).
  #failEarly (error: RpcError, reject: (error: RpcError, sent: boolean) => void, callback: Callback<Message> | null): void {
    if (callback === null) reject(error, false)
    else setImmediate(deliver, callback, error, undefined)
  }

  #retire (cc: ClientConnection): void {
    if (this.#connections.get(cc.key) === cc) this.#connections.delete(cc.key)
    if (this.#lastConnection === cc) this.#lastConnection = null
    cc.retired = true
    if (!cc.closed) this.#retiredConnections.add(cc)
  }

  #failConnection (cc: ClientConnection, error: RpcError): void {
    if (this.#connections.get(cc.key) === cc) this.#connections.delete(cc.key)
    if (this.#lastConnection === cc) this.#lastConnection = null
    this.#retiredConnections.delete(cc)
    cc.closed = true
    const calls = cc.outstanding.values()
    cc.outstanding.clear()
    for (const call of calls) {
      call.conn = null
      this.#finishError(call, error)
    }
    cc.connection.destroy(error)
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

const RESOLVE_EVERY_MS = 30_000

/** A balanced target: its balancer, and the DNS names it re-resolves. */
class BalancedTarget {
  readonly name: string
  readonly balancer: Balancer
  /** Set while the names are resolved for the first time; calls wait on it. */
  resolving: Promise<void> | null = null
  readonly #names: Address[] | null
  readonly #clock: Clock
  #resolvedAt = 0
  #refreshing = false

  constructor (name: string, balancer: Balancer, names: Address[] | null, clock: Clock) {
    this.name = name
    this.balancer = balancer
    this.#names = names
    this.#clock = clock
    if (names !== null) {
      this.resolving = this.#resolve().then(() => { this.resolving = null }, (error: unknown) => {
        this.resolving = null
        throw error
      })
    }
  }

  /** Re-resolves the names in the background once they are older than 30 s; calls go on with the old addresses meanwhile. */
  refresh (): void {
    if (this.#names === null || this.#refreshing || this.#clock.now() - this.#resolvedAt < RESOLVE_EVERY_MS) return
    this.#refreshing = true
    this.#resolve().catch(() => {}).finally(() => { this.#refreshing = false })
  }

  async #resolve (): Promise<void> {
    const addresses: Address[] = []
    for (const { host, port } of this.#names!) {
      try {
        for (const found of await lookup(host, { all: true })) addresses.push({ host: found.address, port })
      } catch (err) {
        throw new RpcError(ErrorCode.CONNECT_FAILED, `cannot resolve ${host}: ${(err as Error).message}`, { cause: err })
      }
    }
    this.#resolvedAt = this.#clock.now()
    this.balancer.setAddresses(addresses)
  }
}

// Distinct timeouts with a shared list each; beyond, calls get their own timer.
const MAX_DEADLINE_LISTS = 32

/**
 * The deadline of the calls one checkpoint put in a deadline list (NaN until
 * it ends), or of one call with a timer of its own.
 */
class Stamp {
  deadline: number
  /** The list it is in; null for a call's own stamp, and once it has left the list. */
  list: DeadlineList | null
  /** Its calls in the order made, finished ones included until the stamp leaves (or the list compacts). */
  calls: OutboundCall[] = []
  /** Its calls not finished yet. */
  live = 0

  constructor (deadline: number, list: DeadlineList | null) {
    this.deadline = deadline
    this.list = list
  }
}

// The stamp of calls without a deadline.
const NO_DEADLINE = new Stamp(Number.POSITIVE_INFINITY, null)
const RESOLVED = Promise.resolve()

/** The pending calls of one timeout value, by stamp in deadline order, and their one timer. */
class DeadlineList {
  readonly timeoutMs: number
  readonly stamps = new Denque<Stamp>()
  /** Calls not finished in those stamps. */
  liveCalls = 0
  /** Calls the stamps in `stamps` hold, finished or not. */
  heldCalls = 0
  timer: TimerHandle | null = null
  /** The stamp of the calls this checkpoint added, until it ends (the list is then in the client's list of such lists). */
  open: Stamp | null = null

  constructor (timeoutMs: number) {
    this.timeoutMs = timeoutMs
  }
}
