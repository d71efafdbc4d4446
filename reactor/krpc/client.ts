import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Message, MethodMap, ServiceDef } from '../../codec/protobuf/schema.js'
import type { Clock } from '../../scheduling/clock.js'
import type { OutlierEjectionOptions } from '../../scheduling/outlier-ejection.js'
import type { BalancePolicy } from '../balancer.js'
import { ClientEngine } from '../client/client-engine.js'
import { type ClientHealthStats, type EngineConnectionStats } from '../client/client-engine-options.js'
import { failEarly, type Callback } from '../client/pending-call.js'
import { RetryLoop, type ProtocolRetryOptions, type RetryStats } from '../client/retry-loop.js'
import type { ClientEndpoint, ClientTarget, Target as EngineTarget } from '../client/targets.js'
import type { Logger } from '../logger.js'
import { KrpcClientProtocol, type CallResult, type ClientTlsOptions } from './client-protocol.js'
import { KrpcCall, noSuchMethod, preparedMethod, type PreparedMethod, type PreparedMethods } from './prepared-method.js'
import { serviceStub, type AnyResolve, type CallOptions, type StartCall, type Stub } from './stub.js'

export type { Callback } from '../client/pending-call.js'
export type { RetryStats } from '../client/retry-loop.js'
export type { CallResult, ClientTlsOptions } from './client-protocol.js'
export type { CallOptions, Stub, StubMethod } from './stub.js'

/** `host:port`, or its parts. */
export type Endpoint = ClientEndpoint

/** One endpoint, or several to balance calls over. */
export type Target = ClientTarget

/** Counters of one open connection of the client (`Client.connectionStats`). */
export type ClientConnectionStats = EngineConnectionStats

/**
 * Retries of calls that failed without running: ERROR_SERVER_TOO_BUSY,
 * ERROR_UNAVAILABLE, FATAL_SERVER_SHUTTING_DOWN, and failures to connect,
 * negotiate or send. Each attempt carries what is left of the call's
 * original deadline, and none starts after it. Delays come from `backoff`
 * (default: truncated randomized exponential, `random[0,1) × 2^min(n, 12)`
 * ms, as Kudu's Java client). A budget (default: retries ≤ 20 % of calls
 * over 10 s plus 10 per second) keeps retries from amplifying an overload.
 */
export type RetryOptions = ProtocolRetryOptions

/** Options of the KRPC client (`new KrpcClient(options)`): endpoints and balancing, deadlines, retries, negotiation and TLS, limits. */
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
  /** SASL PLAIN user sent in negotiation; default `nyala`. */
  user?: string
  /** SASL PLAIN password sent in negotiation; default empty. */
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
  /** Calls awaiting a response per connection; a call over it fails with RPC_ERR_QUEUE_FULL, unsent. Default 100000. */
  maxInFlight?: number
  /** Retries of calls that did not run (off unless given; `{}` turns them on with the defaults). */
  retry?: RetryOptions | false
  /** Busy polling after each read and send, in microseconds (as `ServerOptions.busyPollUs`); off by default. */
  busyPollUs?: number
  /**
   * Outlier ejection of the endpoints' hosts, as `ProtocolClientOptions.ejection`:
   * on by default; false: off. KRPC has no ping, so a silent host is found
   * by its calls timing out (idempotent ones at `retry.attemptTimeoutMs`).
   */
  ejection?: OutlierEjectionOptions | false
  /** TCP keepalive on every connection, the first probe after this long idle; default 10000 ms; 0: off. */
  keepAliveMs?: number
  /** Time for deadlines, backoffs and the negotiation timer; default the real clock (tests pass a `FakeClock`). */
  clock?: Clock
  /**
   * Where the client reports what its calls' errors do not: a server that
   * broke the protocol (warn), connections lost and retired (info), retries
   * (debug), with fields. Default: warnings and errors on stderr; `null`
   * silences it. See docs/logging.md.
   */
  logger?: Logger | null
}


/**
 * A KRPC client: typed stubs (stub.ts) over the one client engine
 * (reactor/client/client-engine.ts) with KRPC as its protocol
 * (client-protocol.ts). One connection per endpoint (or
 * `connectionsPerEndpoint`, balanced), reused by every call; call ids from
 * 0 per connection; each call's deadline is armed when the call is made,
 * so it covers connect and negotiation; late responses are ignored. A
 * peer that closes or sends garbage fails every pending call on that
 * connection with a connection error, never crashing the process; one
 * that answers FATAL_* has its connection retired. Retries are the
 * engine's retry loop (reactor/client/retry-loop.ts), off unless `retry`.
 */
export class Client {
  readonly #options: ClientOptions
  readonly #engine: ClientEngine<Message, Message | CallResult<Message>>
  readonly #retry: RetryLoop<Message, Message | CallResult<Message>> | null
  readonly #methods: PreparedMethods = new Map()
  readonly #defaultTimeoutMs: number

  constructor (options: ClientOptions = {}) {
    this.#options = options
    this.#engine = new ClientEngine(new KrpcClientProtocol(options), {
      connectionsPerEndpoint: options.connectionsPerEndpoint,
      balance: options.balance,
      resolveAll: options.resolveAll,
      defaultTimeoutMs: options.defaultTimeoutMs,
      connectTimeoutMs: options.negotiationTimeoutMs,
      maxMessageBytes: options.maxMessageBytes,
      maxOutboundBytes: options.maxOutboundBytes,
      maxInFlight: options.maxInFlight,
      busyPollUs: options.busyPollUs,
      ejection: options.ejection,
      keepAliveMs: options.keepAliveMs,
      logger: options.logger,
      clock: options.clock
    })
    this.#defaultTimeoutMs = this.#engine.defaultTimeoutMs
    const retry = options.retry
    this.#retry = retry === undefined || retry === false ? null : new RetryLoop(this.#engine, retry)
  }

  /** A typed stub for `def` at `endpoint` (default: the client's endpoint). */
  service<M extends MethodMap> (def: ServiceDef<M>, endpoint?: Target): Stub<M> {
    const target = endpoint ?? this.#options.endpoint
    if (target === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no endpoint: pass one to service() or to the Client')
    return serviceStub(def, target, this.#methods, this, this.#start, this.#retry !== null)
  }

  /** Calls `service.method` at `endpoint`; resolves with the response and its sidecars. */
  call<Res = Message> (endpoint: Target, def: ServiceDef, method: string, request: Message, options: CallOptions = {}): Promise<CallResult<Res>> {
    const prepared = preparedMethod(this.#methods, def, method)
    if (prepared === undefined) return Promise.reject(noSuchMethod(def, method))
    const retry = options.retry === false ? null : this.#retry
    if (retry === null) {
      return new Promise<CallResult<Message>>((resolve, reject) => {
        this.#start(endpoint, prepared, request, options, resolve as AnyResolve, reject, false, null)
      }) as Promise<CallResult<Res>>
    }
    let target: EngineTarget
    try {
      target = this.#engine.targets.of(endpoint)
    } catch (err) {
      return Promise.reject(err)
    }
    const timeoutMs = options.timeoutMs ?? this.#defaultTimeoutMs
    return retry.run(target, request, callData(prepared, false, options), options, timeoutMs) as Promise<CallResult<Res>>
  }

  /** Retry counters; null when retries are off. */
  get retryStats (): RetryStats | null {
    return this.#retry?.stats ?? null
  }

  /** Outlier ejection (ejections, re-admissions, hosts out now) and liveness counters. */
  get healthStats (): ClientHealthStats {
    return this.#engine.health()
  }

  /** Open connections (for tests and metrics). */
  get connectionCount (): number {
    return this.#engine.connections.size
  }

  /** Calls waiting for a response on any connection. */
  get pendingCalls (): number {
    return this.#engine.pendingCalls
  }

  /**
   * Counters of each open connection: its outbound transfer queue (requests
   * and bytes queued, bytes the socket still buffers, immediate and batched
   * writes, partial writes, drain waits) and the bytes and frames read and
   * written.
   */
  connectionStats (): ClientConnectionStats[] {
    return this.#engine.connectionStats()
  }

  /** Fails every pending call with RPC_ERR_CLIENT_CLOSED and closes every connection; calls waiting to retry stop waiting. Later calls fail at once. */
  close (): void {
    if (this.#engine.closed) return
    const error = new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed with the call pending')
    this.#engine.close(error)
    this.#retry?.close(error)
  }

  // Starts a call without retries (the stubs' and call()'s entry, a StartCall):
  // through `callback` when not null, else through resolve/reject.
  readonly #start: StartCall = (endpoint, method, request, options, resolve, reject, responseOnly, callback) => {
    const engine = this.#engine
    let target: EngineTarget
    try {
      target = engine.targets.of(endpoint)
    } catch (err) {
      return failEarly(err as RpcError, reject, callback)
    }
    const timeoutMs = options.timeoutMs ?? this.#defaultTimeoutMs
    engine.attempt(target, request, callData(method, responseOnly, options), options.signal, timeoutMs,
      resolve as (response: Message | CallResult<Message>) => void, reject, callback as Callback<Message | CallResult<Message>> | null)
  }
}

// A call's protocol data: its method's shared one, unless it has sidecars or feature flags.
function callData (method: PreparedMethod, responseOnly: boolean, options: CallOptions): KrpcCall {
  if ((options.sidecars === undefined || options.sidecars.length === 0) && (options.requiredFeatureFlags === undefined || options.requiredFeatureFlags.length === 0)) {
    return responseOnly ? method.stubCall : method.resultCall
  }
  return new KrpcCall(method, responseOnly, options.sidecars, options.requiredFeatureFlags)
}
