import { setMaxListeners } from 'node:events'
import { connect as netConnect, type Socket } from 'node:net'
import { connect as tlsConnect, createSecureContext, type ConnectionOptions as TlsConnectionOptions } from 'node:tls'
import Denque from 'denque'
import type { AnswerKind, ClientProtocol } from '../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from '../codec/frame-decoder.js'
import { realClock, type Clock, type TimerHandle } from '../scheduling/clock.js'
import { DeadlineLists, NO_DEADLINE, type Stamp } from '../scheduling/deadline-lists.js'
import { DEFAULT_MAX_ATTEMPTS, ExponentialBackoff, RetryBudget, nextRetryDelay, sleep, type Backoff, type RetryBudgetStats } from '../scheduling/retry.js'
import { Connection, type ConnectionStats } from '../transport/connection.js'
import { SocketReader } from '../transport/socket-reader.js'
import type { OutboundTransfer } from '../transport/transfer-queue.js'
import { Balancer, type BalancePolicy, type Slot } from './balancer.js'
import { RateLimitedLog, resolveLogger, type Logger } from './logger.js'
import { PushIterator } from './push-iterator.js'

/** `host:port`, or its parts. */
export type ClientEndpoint = string | { host: string, port: number }

/** Retries of calls that did not run, or that the protocol says may run again (`ClientProtocol.retryable`). */
export interface ProtocolRetryOptions {
  /** Delay before retry n; default truncated randomized exponential, `random[0,1) × 2^min(n, 12)` ms. */
  backoff?: Backoff
  /** Attempts per call, the first included; default 100 (the deadline usually ends a call first). */
  maxAttempts?: number
  /** null: no budget. Default: one budget (retries ≤ 20 % of calls over 10 s plus 10 per second) shared by the client's calls. */
  budget?: RetryBudget | null
}

export interface ProtocolClientOptions {
  /** The endpoint, or endpoints to balance calls over. */
  endpoint: ClientEndpoint | readonly ClientEndpoint[]
  /** Connections per endpoint (default 1); each call picks one by `balance`. */
  connectionsPerEndpoint?: number
  /** How a call picks its connection; default `p2c` (power of two choices on calls in flight). */
  balance?: BalancePolicy
  /** Timeout of calls that name none, covering connect, set-up and retries; default 30000 ms; 0: no deadline. */
  defaultTimeoutMs?: number
  /** Deadline of a connection's connect and handshake; default 3000 ms. */
  connectTimeoutMs?: number
  /** Largest answer frame; default the protocol's `maxFrameBytes`, else 50 MiB. */
  maxMessageBytes?: number
  /** Bound on a connection's queued request bytes; a call over it fails with RPC_ERR_QUEUE_FULL (unsent, so retried). */
  maxOutboundBytes?: number
  /** Calls in flight per connection (awaiting an answer); a call over it fails with RPC_ERR_QUEUE_FULL. Default 100000. */
  maxInFlight?: number
  /** Retries (on by default with the defaults); false: none. */
  retry?: ProtocolRetryOptions | false
  /**
   * TLS from the first byte (`node:tls` `tls.connect` with these options:
   * ca, cert, key, servername, rejectUnauthorized, ...). A failed TLS
   * handshake (an untrusted certificate, a name that does not match, the
   * server refusing our certificate) fails the connection as a failed
   * connect: calls get RPC_ERR_CONNECT_FAILED, `cannot connect to HOST:PORT:
   * TLS: <reason>`, and are retried by the usual rules. See docs/security.md.
   */
  tls?: TlsConnectionOptions
  /**
   * `stream` answers: the most parts one call gathers (values that are not
   * `undefined`); default 100000. One more fails the call with
   * RPC_ERR_QUEUE_FULL and closes its connection (RPC_ERR_CONNECTION_CLOSED
   * for the other calls on it), since the rest of that stream can no
   * longer be told from the answers after it.
   */
  maxStreamParts?: number
  /** Where a push handler's error is reported (rate-limited warnings); default warnings on stderr, null: nowhere. */
  logger?: Logger | null
  clock?: Clock
}

/** Where a push came from, for `ProtocolClient.onPush` handlers. */
export interface PushInfo {
  /** The connection's endpoint, `host:port`. */
  readonly endpoint: string
}

/** A connection that was set up has closed (`ProtocolClient.onConnectionClose`). */
export interface ConnectionCloseInfo {
  /** The connection's endpoint, `host:port`. */
  readonly endpoint: string
  /** Why: the peer closed it, it broke, or the client closed. */
  readonly error: RpcError
}

export interface ProtocolPushOptions {
  /**
   * Pushes held for an iterator that is not reading; default 1024. Past it
   * the oldest held push is dropped and `stats().pushesDropped` rises.
   */
  maxBuffered?: number
}

/**
 * A step around `ProtocolClient.call`, as undici's `dispatcher.compose`
 * takes them: given the next step, it returns its own. It may change the
 * request or the options, settle the call itself, or look at the outcome.
 */
export type ClientInterceptor<Req, Res> = (next: (request: Req, options: ProtocolCallOptions) => Promise<Res>) => (request: Req, options: ProtocolCallOptions) => Promise<Res>

/** A `ProtocolClient` seen through interceptors (`compose`): `call` goes through them, the rest is the client's. */
export interface ComposedProtocolClient<Req, Res> {
  /** The call through every interceptor, the first outermost; options default to `{}`. */
  call: (request: Req, options?: ProtocolCallOptions) => Promise<Res>
  close: () => Promise<void>
  stats: () => ProtocolClientStats
  onPush: (handler: (push: unknown, info: PushInfo) => void) => () => void
  pushes: (options?: ProtocolPushOptions) => AsyncIterableIterator<unknown>
}

export interface ProtocolCallOptions {
  /** The call's deadline from now, covering connect and every retry; default the client's `defaultTimeoutMs`; 0: none. */
  timeoutMs?: number
  signal?: AbortSignal
  /** Safe to repeat after a lost connection even once sent (as `ClientProtocol.retryable` can say per request). */
  idempotent?: boolean
  /** false: no retries for this call. */
  retry?: boolean
}

/** Counters of one open connection. */
export interface ProtocolClientConnectionStats extends ConnectionStats {
  endpoint: string
  /** Calls awaiting an answer on this connection. */
  pendingCalls: number
}

export interface ProtocolClientStats {
  connections: ProtocolClientConnectionStats[]
  /** Retries made (attempts after the first). */
  retries: number
  /** Calls that failed with a retryable error after their last attempt. */
  exhausted: number
  budget: RetryBudgetStats | null
  /** Pushes received (`ClientProtocol.isPush`), decoded ones only. */
  pushesReceived: number
  /** Pushes dropped because an iterator (`pushes()`) held `maxBuffered` already. */
  pushesDropped: number
}

// Where a call is. Only QUEUED calls (and calls on a connection that never
// connected) are certainly not run by the peer.
const QUEUED = 0
const SENDING = 1
const SENT = 2
const FINISHED = 3

interface PendingCall<Req, Res> extends OutboundTransfer {
  state: number
  slices: Buffer[]
  bytes: number
  readonly request: Req
  readonly answer: AnswerKind
  id: number
  /** Order of writing on its connection. */
  seq: number
  conn: PeerConnection<Req, Res> | null
  stamp: Stamp<PendingCall<Req, Res>>
  timer: TimerHandle | null
  readonly timeoutMs: number
  /** `stream` answers: the values gathered, from the first part on (null: no part yet). */
  parts: unknown[] | null
  readonly resolve: (response: Res) => void
  /** `streamed`: a part of the call's answer had arrived (the call is then not retried). */
  readonly reject: (error: RpcError, sent: boolean, streamed?: boolean) => void
  signal: AbortSignal | undefined
  onAbort: (() => void) | undefined
  readonly beforeWrite: (this: PendingCall<Req, Res>) => boolean
  readonly onSent: (this: PendingCall<Req, Res>, error: RpcError | undefined) => void
}

const NO_SLICES: Buffer[] = []

function callBeforeWrite (this: PendingCall<unknown, unknown>): boolean {
  // In-order calls are always written: their place in the answer order is taken.
  if (this.state === FINISHED && this.conn?.inOrderMatching !== true) return false
  if (this.state === QUEUED) this.state = SENDING
  return true
}

function callOnSent (this: PendingCall<unknown, unknown>, error: RpcError | undefined): void {
  this.slices = NO_SLICES
  // A write failure closes the connection, whose close fails the call.
  if (error === undefined && this.state === SENDING) this.state = SENT
}

/** The in-place encoder: the protocol writes the call's request straight into the outbound slab. */
const IN_PLACE = {
  encodeInto (call: PendingCall<unknown, unknown>, protocol: ClientProtocol<unknown, unknown>, out: Buffer, at: number): void {
    protocol.encodeInto(call.request, call.id, out, at)
  }
}

/** One connection of the client: its socket, and the calls awaiting answers on it. */
class PeerConnection<Req, Res> {
  readonly key: string
  readonly slot: Slot
  readonly connection: Connection
  readonly inOrderMatching: boolean
  connected = false
  /** TLS: the TCP connection is up (the TLS handshake under way, or done when `connected`). */
  tlsHandshaking = false
  ready = false
  closed = false
  connectTimer: TimerHandle | null = null
  #nextId = 0
  readonly #maxId: number
  nextSeq = 0
  /** `id` matching: calls by id (quiet ones included). */
  readonly byId = new Map<number, PendingCall<Req, Res>>()
  /** `in-order` matching: calls in the order their answers will come, settled ones included (their answers are dropped; a stream's call stays at the front until its last part). */
  readonly inOrder = new Denque<PendingCall<Req, Res>>()
  /** `id` matching: calls with `maybe` answers, in writing order. */
  readonly quiet = new Denque<PendingCall<Req, Res>>()
  flushNeeded = false
  flushScheduled = false
  /** What push handlers are told about this connection. */
  readonly pushInfo: PushInfo

  constructor (key: string, slot: Slot, connection: Connection, inOrder: boolean, maxId: number) {
    this.key = key
    this.pushInfo = Object.freeze({ endpoint: key })
    this.slot = slot
    this.connection = connection
    this.inOrderMatching = inOrder
    this.#maxId = maxId
  }

  get inFlight (): number {
    return this.inOrderMatching ? this.inOrder.length : this.byId.size
  }

  takeId (): number {
    for (;;) {
      const id = this.#nextId
      this.#nextId = id >= this.#maxId ? 0 : id + 1
      if (this.inOrderMatching || !this.byId.has(id)) return id
    }
  }
}

// Local failures after which the request certainly did not run, if it was not sent.
const NOT_RUN_UNSENT: ReadonlySet<string> = new Set([ErrorCode.CONNECT_FAILED, ErrorCode.CONNECTION_CLOSED, ErrorCode.NEGOTIATION_FAILED,
  ErrorCode.QUEUE_FULL, ErrorCode.MALFORMED_FRAME, ErrorCode.FRAME_TOO_LARGE])

const DEFAULT_TIMEOUT_MS = 30_000
const DEFAULT_CONNECT_TIMEOUT_MS = 3000
const DEFAULT_MAX_IN_FLIGHT = 100_000
const DEFAULT_MAX_STREAM_PARTS = 100_000
const DEFAULT_MAX_BUFFERED_PUSHES = 1024
const LOG_INTERVAL_MS = 10_000

function parseEndpoint (endpoint: ClientEndpoint): { host: string, port: number } {
  if (typeof endpoint !== 'string') {
    if (typeof endpoint.host !== 'string' || endpoint.host === '' || !Number.isInteger(endpoint.port) || endpoint.port <= 0 || endpoint.port > 65535) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${JSON.stringify(endpoint)}: expected { host, port } with a port in 1..65535`)
    }
    return { host: endpoint.host, port: endpoint.port }
  }
  const at = endpoint.lastIndexOf(':')
  const port = Number(endpoint.slice(at + 1))
  if (at <= 0 || !Number.isInteger(port) || port <= 0 || port > 65535) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${endpoint}: expected HOST:PORT`)
  return { host: endpoint.slice(0, at).replace(/^\[|\]$/g, ''), port }
}

/**
 * A client for any protocol described by a `ClientProtocol`: the generic
 * twin of KRPC's `Client`.
 *
 * - Endpoints and connections: `connectionsPerEndpoint` connections to
 *   each endpoint, opened on first use; each call picks one with the
 *   balancer (reactor/balancer.ts), which skips a slot whose connection
 *   failed for a backoff.
 * - Deadlines: each call's `timeoutMs` covers connecting, the set-up,
 *   queueing and every retry (scheduling/deadline-lists.ts); a late answer
 *   is dropped.
 * - Retries: a call that was not sent (no connection, connection lost
 *   before its bytes left, outbound queue full), or whose error the
 *   protocol calls retryable, or an `idempotent` call whose connection was
 *   lost, is tried again after a backoff, within the deadline and the
 *   retry budget (scheduling/retry.ts).
 * - Writes: requests are encoded straight into the connection's coalesced
 *   outbound buffer (transport/transfer-queue.ts): the requests of one
 *   turn leave in one write (batches of 50 frames go out as they fill),
 *   and the client waits for 'drain' only when the kernel buffer is full.
 *   A call with an AbortSignal stays a transfer of its own, so that it can
 *   be dropped unsent when cancelled (`id` matching).
 * - Bounds: `maxOutboundBytes` and `maxInFlight` per connection; over
 *   them a call fails with RPC_ERR_QUEUE_FULL, unsent.
 * - Every call settles exactly once: answer, deadline, abort, connection
 *   failure (peer closed, reset, or sent garbage: every call on it fails
 *   with the connection's fatal error, and is retried if allowed), or
 *   `close()` (RPC_ERR_CLIENT_CLOSED).
 *
 * An `in-order` call cancelled or timed out after it was queued is still
 * written (its place in the answer order is taken) and its answer dropped.
 *
 * Beyond one answer per request:
 * - Pushes (`ClientProtocol.isPush`): frames the peer sends unasked go to
 *   the `onPush` handlers and to every `pushes()` iterator, never to a call.
 * - Streamed answers (`answerOf` says `stream`): a call gathers its parts
 *   (`decodePart`) and resolves with their values, within `maxStreamParts`.
 * - Interceptors: `compose(...)` wraps `call` in steps such as logging or
 *   rewriting requests.
 */
export class ProtocolClient<Req, Res> {
  readonly #protocol: ClientProtocol<Req, Res>
  readonly #options: ProtocolClientOptions
  readonly #clock: Clock
  readonly #balancer: Balancer
  readonly #connections = new Map<string, PeerConnection<Req, Res>>()
  readonly #deadlines: DeadlineLists<PendingCall<Req, Res>>
  readonly #retry: { backoff: Backoff, maxAttempts: number | undefined, budget: RetryBudget | null } | null
  readonly #retryCounts = { retries: 0, exhausted: 0 }
  readonly #inOrder: boolean
  readonly #maxInFlight: number
  readonly #defaultTimeoutMs: number
  readonly #closing = new AbortController()
  #closed = false
  /** The protocol's `isPush`: undefined for protocols without pushes, so that their answers pay one check. */
  readonly #isPush: ((buf: Buffer, start: number, end: number) => boolean) | undefined
  readonly #maxStreamParts: number
  /** The push handlers, replaced (never changed) when one is added or removed, so that a handler may remove itself. */
  #pushHandlers: ReadonlyArray<(push: unknown, info: PushInfo) => void> = []
  #closeHandlers: ReadonlyArray<(info: ConnectionCloseInfo) => void> = []
  readonly #pushIterators = new Set<PushIterator>()
  readonly #pushCounts = { received: 0, dropped: 0 }
  readonly #log: Required<Logger>
  readonly #logPushHandler: RateLimitedLog
  /** With `tls`: the options of every connect, their secure context built once. */
  readonly #tls: TlsConnectionOptions | undefined

  constructor (protocol: ClientProtocol<Req, Res>, options: ProtocolClientOptions) {
    if (protocol.matching === 'id' && protocol.answerId === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: 'id' matching needs answerId`)
    this.#protocol = protocol
    this.#options = options
    // Bad certificates and keys throw here, not at each connect.
    this.#tls = options.tls === undefined ? undefined : { ...options.tls, secureContext: options.tls.secureContext ?? createSecureContext(options.tls) }
    this.#clock = options.clock ?? realClock
    this.#inOrder = protocol.matching === 'in-order'
    this.#maxInFlight = options.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT
    this.#defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_TIMEOUT_MS
    this.#isPush = protocol.isPush
    this.#maxStreamParts = options.maxStreamParts ?? DEFAULT_MAX_STREAM_PARTS
    if (!(this.#maxStreamParts >= 1)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `maxStreamParts must be at least 1, got ${options.maxStreamParts}`)
    this.#log = resolveLogger(options.logger)
    this.#logPushHandler = new RateLimitedLog(LOG_INTERVAL_MS, () => this.#clock.now())
    const endpoints = (Array.isArray(options.endpoint) ? options.endpoint : [options.endpoint]) as readonly ClientEndpoint[]
    if (endpoints.length === 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no endpoint: the list is empty')
    this.#balancer = new Balancer(endpoints.map(parseEndpoint), {
      connectionsPerEndpoint: options.connectionsPerEndpoint ?? 1,
      policy: options.balance ?? 'p2c',
      clock: this.#clock,
      outstanding: (slot) => this.#connections.get(slot.key)?.inFlight ?? 0
    })
    // Every call sleeping before a retry listens to it.
    setMaxListeners(0, this.#closing.signal)
    this.#deadlines = new DeadlineLists<PendingCall<Req, Res>>(this.#clock, this.#expire, (call) => call.state === FINISHED)
    const retry = options.retry
    this.#retry = retry === false
      ? null
      : {
          backoff: retry?.backoff ?? new ExponentialBackoff(),
          maxAttempts: retry?.maxAttempts,
          budget: retry?.budget === undefined ? new RetryBudget(this.#clock) : retry.budget
        }
  }

  /** Sends `request` and resolves with its answer's response; rejects with an RpcError (RPC_ERR_REMOTE for the peer's errors). */
  call (request: Req, options: ProtocolCallOptions = {}): Promise<Res> {
    if (this.#closed) return Promise.reject(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed'))
    const timeoutMs = options.timeoutMs ?? this.#defaultTimeoutMs
    if (this.#retry === null || options.retry === false) {
      return new Promise<Res>((resolve, reject) => { this.#attempt(request, options, timeoutMs, resolve, reject) })
    }
    return this.#callWithRetries(request, options, timeoutMs)
  }

  /**
   * `call` through `interceptors`, the first outermost (undici's
   * `dispatcher.compose`): `compose(a, b).call(r)` runs `a`, which calls
   * `b`, which calls this client. The chain is built once, here.
   */
  compose (...interceptors: Array<ClientInterceptor<Req, Res>>): ComposedProtocolClient<Req, Res> {
    let call = (request: Req, options: ProtocolCallOptions): Promise<Res> => this.call(request, options)
    for (let i = interceptors.length - 1; i >= 0; i--) {
      const interceptor = interceptors[i]
      if (typeof interceptor !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `interceptor ${i} is not a function`)
      const next = interceptor(call)
      if (typeof next !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `interceptor ${i} did not return a function`)
      call = next
    }
    return {
      call (request: Req, options: ProtocolCallOptions = {}): Promise<Res> {
        // An interceptor that throws rejects the call, as the client's own errors do.
        try {
          return call(request, options)
        } catch (err) {
          return Promise.reject(err)
        }
      },
      close: () => this.close(),
      stats: () => this.stats(),
      onPush: (handler) => this.onPush(handler),
      pushes: (options) => this.pushes(options)
    }
  }

  /**
   * Calls `handler` with each push (`ClientProtocol.isPush`), decoded by
   * `decodePush`, on any of the client's connections (which open with the
   * first calls), synchronously as its frame is read. A handler that throws
   * is reported to the logger and the others still run. Returns the
   * function that removes the handler.
   */
  /**
   * Calls `handler({ endpoint, error })` when a connection that was set up
   * closes, for whatever reason: what a push consumer needs to know that
   * the pushes of that connection (a subscription) have stopped, since the
   * client opens a new connection for the next call without them. Returns
   * a function that removes the handler; a handler that throws is logged,
   * as a push handler's throw is.
   */
  onConnectionClose (handler: (info: ConnectionCloseInfo) => void): () => void {
    if (typeof handler !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'onConnectionClose needs a function')
    const entry = (info: ConnectionCloseInfo): void => handler(info)
    this.#closeHandlers = [...this.#closeHandlers, entry]
    return () => { this.#closeHandlers = this.#closeHandlers.filter((h) => h !== entry) }
  }

  onPush (handler: (push: unknown, info: PushInfo) => void): () => void {
    if (typeof handler !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'onPush needs a function')
    // A wrapper of its own, so that the same function added twice is removed once per remover.
    const entry = (push: unknown, info: PushInfo): void => handler(push, info)
    this.#pushHandlers = [...this.#pushHandlers, entry]
    return () => { this.#pushHandlers = this.#pushHandlers.filter((h) => h !== entry) }
  }

  /**
   * The pushes from now on, as an async iterator (`for await`). It holds
   * at most `maxBuffered` (default 1024) pushes not yet read: past that
   * the oldest is dropped and `stats().pushesDropped` rises. It ends (done)
   * with its `return()` (a `break` out of `for await`), which drops what it
   * holds, or with `close()`, after the pushes it holds.
   */
  pushes (options: ProtocolPushOptions = {}): AsyncIterableIterator<unknown> {
    const maxBuffered = options.maxBuffered ?? DEFAULT_MAX_BUFFERED_PUSHES
    if (!Number.isInteger(maxBuffered) || maxBuffered < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `maxBuffered must be a positive integer, got ${options.maxBuffered}`)
    const iterator = new PushIterator(maxBuffered, this.#pushCounts, this.#pushIterators)
    if (this.#closed) iterator.end(false)
    else this.#pushIterators.add(iterator)
    return iterator
  }

  /** Counters: connections, retries, pushes. */
  stats (): ProtocolClientStats {
    const connections: ProtocolClientConnectionStats[] = []
    for (const cc of this.#connections.values()) connections.push({ endpoint: cc.key, pendingCalls: cc.inFlight, ...cc.connection.stats() })
    return {
      connections,
      retries: this.#retryCounts.retries,
      exhausted: this.#retryCounts.exhausted,
      budget: this.#retry?.budget?.stats ?? null,
      pushesReceived: this.#pushCounts.received,
      pushesDropped: this.#pushCounts.dropped
    }
  }

  /**
   * Settles every pending call with RPC_ERR_CLIENT_CLOSED and closes every
   * connection; later calls reject with it at once. Push iterators end
   * after the pushes they hold; push handlers are removed.
   */
  async close (): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    const error = new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed')
    this.#closing.abort(error)
    for (const cc of [...this.#connections.values()]) this.#connectionClosed(cc, error)
    this.#deadlines.close()
    for (const iterator of [...this.#pushIterators]) iterator.end(false)
    this.#pushHandlers = []
  }

  async #callWithRetries (request: Req, options: ProtocolCallOptions, timeoutMs: number): Promise<Res> {
    const retry = this.#retry!
    const clock = this.#clock
    const deadline = timeoutMs > 0 ? clock.now() + timeoutMs : Number.POSITIVE_INFINITY
    retry.budget?.recordCall()
    let previous: RpcError | null = null
    for (let attempt = 1; ; attempt++) {
      // The first attempt gets the whole (whole-millisecond) timeout, to share a deadline list; later ones what is left.
      const attemptTimeout = attempt === 1 ? timeoutMs : Number.isFinite(deadline) ? Math.max(1, deadline - clock.now()) : 0
      const outcome = await new Promise<{ ok: true, response: Res } | { ok: false, error: RpcError, sent: boolean, streamed: boolean }>((resolve) => {
        this.#attempt(request, options, attemptTimeout, (response) => resolve({ ok: true, response }),
          (error, sent, streamed) => resolve({ ok: false, error, sent, streamed: streamed === true }))
      })
      if (outcome.ok) return outcome.response
      const { error, sent, streamed } = outcome
      if (previous !== null && error.code === ErrorCode.DEADLINE_EXCEEDED) {
        this.#retryCounts.exhausted++
        throw this.#timedOut(timeoutMs, attempt, previous)
      }
      // Part of a streamed answer was delivered: a second run could not be told from the first.
      if (this.#closed || streamed || !this.#isRetryable(error, sent, request, options.idempotent === true)) throw error
      const refusedBefore = retry.budget?.stats.refused ?? 0
      const delay = nextRetryDelay({ backoff: retry.backoff, maxAttempts: retry.maxAttempts, budget: retry.budget, retryable: () => true }, attempt, deadline - clock.now())
      if (delay === null) {
        this.#retryCounts.exhausted++
        const outOfAttempts = attempt >= (retry.maxAttempts ?? DEFAULT_MAX_ATTEMPTS)
        const outOfBudget = (retry.budget?.stats.refused ?? 0) > refusedBefore
        if (outOfAttempts || outOfBudget) throw error
        throw this.#timedOut(timeoutMs, attempt, error)
      }
      previous = error
      this.#retryCounts.retries++
      const signal = options.signal === undefined ? this.#closing.signal : AbortSignal.any([options.signal, this.#closing.signal])
      try {
        await sleep(clock, delay, signal)
      } catch {
        if (this.#closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed while the call waited to retry')
        throw new RpcError(ErrorCode.CANCELLED, `${this.#protocol.name} call was cancelled while waiting to retry (after: ${error.message})`)
      }
      if (this.#closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed while the call waited to retry')
    }
  }

  #timedOut (timeoutMs: number, attempts: number, last: RpcError): RpcError {
    return new RpcError(ErrorCode.DEADLINE_EXCEEDED,
      `${this.#protocol.name} call timed out after ${timeoutMs} ms and ${attempts} attempt(s); last error: ${last.message}`, { cause: last })
  }

  #isRetryable (error: RpcError, sent: boolean, request: Req, idempotent: boolean): boolean {
    if (error.code === ErrorCode.REMOTE) return this.#protocol.retryable?.(error, request) ?? false
    if (!NOT_RUN_UNSENT.has(error.code)) return false
    // A request that reached the socket may have run: only one safe to repeat goes again.
    return !sent || idempotent || (this.#protocol.retryable?.(error, request) ?? false)
  }

  // One attempt: a connection, a deadline, the write.
  #attempt (request: Req, options: ProtocolCallOptions, timeoutMs: number, resolve: (response: Res) => void, reject: (error: RpcError, sent: boolean, streamed?: boolean) => void): void {
    if (this.#closed) return reject(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed'), false)
    const signal = options.signal
    if (signal?.aborted === true) return reject(new RpcError(ErrorCode.CANCELLED, `${this.#protocol.name} call was cancelled`), false)
    const protocol = this.#protocol
    let answer: AnswerKind
    try {
      answer = protocol.answerOf?.(request) ?? 'yes'
    } catch (err) {
      return reject(invalid(err), false)
    }
    if (answer !== 'yes') {
      const problem = this.#answerProblem(answer)
      if (problem !== null) return reject(problem, false)
    }
    const cc = this.#connectionFor()
    if (cc instanceof RpcError) return reject(cc, false)
    if (cc.inFlight >= this.#maxInFlight) {
      return reject(new RpcError(ErrorCode.QUEUE_FULL, `${protocol.name} call to ${cc.key}: ${cc.inFlight} calls in flight on the connection (maxInFlight)`), false)
    }
    const call: PendingCall<Req, Res> = {
      state: QUEUED,
      slices: NO_SLICES,
      bytes: 0,
      request,
      answer,
      id: 0,
      seq: 0,
      conn: cc,
      stamp: NO_DEADLINE,
      timer: null,
      timeoutMs,
      parts: null,
      resolve,
      reject,
      signal,
      onAbort: undefined,
      beforeWrite: callBeforeWrite as PendingCall<Req, Res>['beforeWrite'],
      onSent: callOnSent as PendingCall<Req, Res>['onSent']
    }
    if (timeoutMs > 0) this.#deadlines.arm(call, timeoutMs)
    if (signal !== undefined) {
      call.onAbort = () => this.#fail(call, new RpcError(ErrorCode.CANCELLED, `${protocol.name} call to ${cc.key} was cancelled`))
      signal.addEventListener('abort', call.onAbort, { once: true })
    }
    this.#write(cc, call)
  }

  // Why `answerOf` said something this protocol or client cannot do, or null.
  #answerProblem (answer: AnswerKind): RpcError | null {
    const protocol = this.#protocol
    switch (answer) {
      case 'maybe':
        return this.#inOrder ? new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: 'maybe' answers need 'id' matching`) : null
      case 'stream':
        return protocol.decodePart === undefined ? new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: 'stream' answers need decodePart`) : null
      case 'no':
        return null
      default:
        return new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: answerOf said ${String(answer)}, not yes, maybe, no or stream`)
    }
  }

  #write (cc: PeerConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    const protocol = this.#protocol
    const id = cc.takeId()
    call.id = id
    call.seq = cc.nextSeq++
    let bytes: number
    try {
      bytes = protocol.encodedLength(call.request, id)
    } catch (err) {
      return this.#fail(call, invalid(err))
    }
    // Registered before the write: the answer cannot come sooner, but the connection's failure can.
    this.#register(cc, call)
    const connection = cc.connection
    try {
      if (bytes >= 0 && call.signal === undefined && connection.tryWriteFrame(bytes, IN_PLACE, call as PendingCall<unknown, unknown>, protocol as ClientProtocol<unknown, unknown>)) {
        call.state = SENT
        this.#afterWrite(cc, call)
        return
      }
      let slices: Buffer[]
      if (bytes < 0) {
        if (protocol.encodeSlices === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: encodedLength said -1 but there is no encodeSlices`)
        slices = protocol.encodeSlices(call.request, id).map((s) => Buffer.isBuffer(s) ? s : Buffer.from(s.buffer, s.byteOffset, s.byteLength))
        bytes = 0
        for (const s of slices) bytes += s.length
      } else {
        const own = Buffer.allocUnsafe(bytes)
        protocol.encodeInto(call.request, id, own, 0)
        slices = [own]
      }
      call.slices = slices
      call.bytes = bytes
    } catch (err) {
      this.#unregister(cc, call)
      return this.#fail(call, invalid(err))
    }
    if (!connection.send(call)) {
      this.#unregister(cc, call)
      return this.#fail(call, new RpcError(ErrorCode.QUEUE_FULL, `${protocol.name} call to ${cc.key}: the connection's outbound queue is full`))
    }
    this.#afterWrite(cc, call)
  }

  #register (cc: PeerConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    if (call.answer === 'no') return
    if (this.#inOrder) {
      cc.inOrder.push(call)
      return
    }
    cc.byId.set(call.id, call)
    if (call.answer === 'maybe') cc.quiet.push(call)
  }

  // Undoes #register of the call just registered (nothing was written).
  #unregister (cc: PeerConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    if (call.answer === 'no') return
    if (this.#inOrder) {
      if (cc.inOrder.peekBack() === call) cc.inOrder.pop()
      return
    }
    if (cc.byId.get(call.id) === call) cc.byId.delete(call.id)
    if (call.answer === 'maybe' && cc.quiet.peekBack() === call) cc.quiet.pop()
  }

  #afterWrite (cc: PeerConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    if (call.answer === 'no') {
      this.#succeed(call, this.#protocol.silentResult!(call.request))
      return
    }
    if (call.answer !== 'maybe') {
      cc.flushNeeded = false
      return
    }
    // A quiet request: unless another request follows it this turn, send the protocol's flush request after it.
    cc.flushNeeded = true
    if (cc.flushScheduled || this.#protocol.flushRequest === undefined) return
    cc.flushScheduled = true
    queueMicrotask(() => {
      cc.flushScheduled = false
      if (!cc.flushNeeded || cc.closed) return
      cc.flushNeeded = false
      this.#attemptFlush(cc)
    })
  }

  // The flush request: an internal call, without a caller or a deadline.
  #attemptFlush (cc: PeerConnection<Req, Res>): void {
    const call: PendingCall<Req, Res> = {
      state: QUEUED,
      slices: NO_SLICES,
      bytes: 0,
      request: this.#protocol.flushRequest!(),
      answer: 'yes',
      id: 0,
      seq: 0,
      conn: cc,
      stamp: NO_DEADLINE,
      timer: null,
      timeoutMs: 0,
      parts: null,
      resolve: ignore,
      reject: ignore,
      signal: undefined,
      onAbort: undefined,
      beforeWrite: callBeforeWrite as PendingCall<Req, Res>['beforeWrite'],
      onSent: callOnSent as PendingCall<Req, Res>['onSent']
    }
    this.#write(cc, call)
  }

  #succeed (call: PendingCall<Req, Res>, response: Res): void {
    if (call.state === FINISHED) return
    this.#finish(call)
    call.resolve(response)
  }

  #fail (call: PendingCall<Req, Res>, error: RpcError): void {
    if (call.state === FINISHED) return
    // Bytes handed to a socket that never connected did not reach the peer.
    const sent = call.state !== QUEUED && call.conn !== null && call.conn.connected
    this.#finish(call)
    call.reject(error, sent, call.parts !== null)
  }

  #finish (call: PendingCall<Req, Res>): void {
    call.state = FINISHED
    this.#deadlines.leave(call)
    if (call.signal !== undefined && call.onAbort !== undefined) call.signal.removeEventListener('abort', call.onAbort)
    const cc = call.conn
    // In-order calls keep their place until their answer comes.
    if (cc !== null && !this.#inOrder && cc.byId.get(call.id) === call) cc.byId.delete(call.id)
  }

  readonly #expire = (call: PendingCall<Req, Res>, timeoutMs: number): void => {
    // After a stall, an answer already in the socket buffer is read first.
    this.#clock.defer(() => {
      if (call.state === FINISHED) return
      const cc = call.conn
      const where = cc === null ? '' : ` to ${cc.key}`
      const phase = cc !== null && !cc.ready ? ' (still connecting)' : ''
      this.#fail(call, new RpcError(ErrorCode.DEADLINE_EXCEEDED, `${this.#protocol.name} call${where} timed out after ${timeoutMs} ms${phase}`))
    })
  }

  // The connection of the slot the balancer picks, opened if need be.
  #connectionFor (): PeerConnection<Req, Res> | RpcError {
    const slot = this.#balancer.pick()!
    const existing = this.#connections.get(slot.key)
    if (existing !== undefined) return existing
    try {
      return this.#open(slot)
    } catch (err) {
      this.#balancer.failed(slot)
      return err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${slot.key}: ${(err as Error).message}`, { cause: err })
    }
  }

  #open (slot: Slot): PeerConnection<Req, Res> {
    const protocol = this.#protocol
    const options = this.#options
    const key = `${slot.address.host}:${slot.address.port}`
    const tls = this.#tls
    // TLS sockets read through 'data' events (onread applies to raw TCP handles only).
    const reader = tls === undefined ? new SocketReader() : undefined
    const socket: Socket = tls === undefined
      ? netConnect({ host: slot.address.host, port: slot.address.port, noDelay: true, onread: reader!.onread })
      : tlsConnect({ ...tls, host: slot.address.host, port: slot.address.port })
    const connection = new Connection(socket, {
      reader,
      framing: protocol.framing,
      maxFrameBytes: options.maxMessageBytes ?? protocol.maxFrameBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      maxOutboundBytes: options.maxOutboundBytes
    })
    const cc = new PeerConnection<Req, Res>(key, slot, connection, this.#inOrder, protocol.maxId ?? 0xffffffff)
    this.#connections.set(slot.key, cc)
    connection.attach({
      onFrame: (buf, start, end) => this.#onAnswer(cc, buf, start, end),
      onClose: (error) => this.#connectionClosed(cc, this.#closeReason(cc, error))
    })
    const connectMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS
    cc.connectTimer = this.#clock.setTimer(() => {
      cc.connectTimer = null
      if (cc.ready) return
      connection.destroy(cc.connected
        ? new RpcError(ErrorCode.NEGOTIATION_FAILED, `${protocol.name} set-up with ${key} timed out after ${connectMs} ms`)
        : new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${key}: timed out after ${connectMs} ms`))
    }, connectMs)
    const handshake = protocol.handshake?.(key)
    if (tls !== undefined) socket.once('connect', () => { cc.tlsHandshaking = true })
    socket.once(tls === undefined ? 'connect' : 'secureConnect', () => {
      cc.connected = true
      if (handshake === undefined) this.#ready(cc)
    })
    if (handshake !== undefined) {
      connection.handshake(handshake).then(() => this.#ready(cc), () => {})
    }
    return cc
  }

  #ready (cc: PeerConnection<Req, Res>): void {
    if (cc.closed) return
    cc.ready = true
    if (cc.connectTimer !== null) this.#clock.clearTimer(cc.connectTimer)
    cc.connectTimer = null
    this.#balancer.succeeded(cc.slot)
  }

  #closeReason (cc: PeerConnection<Req, Res>, error: RpcError | undefined): RpcError {
    if (error === undefined) return new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${cc.key} closed`)
    if (cc.tlsHandshaking && error.code === ErrorCode.CONNECTION_CLOSED && cc.connection.framesRead === 0 && isCertificateRefusal(error.cause)) {
      // Under TLS 1.3 the server judges our certificate after our side of the
      // handshake is done: its refusal, before any answer, still means it
      // took no request. Other TLS errors may follow requests it ran.
      cc.connected = false
      return new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${cc.key}: TLS: ${error.message.replace(/^socket error: /, '')}`, { cause: error })
    }
    if (!cc.connected && error.code === ErrorCode.CONNECTION_CLOSED) {
      return new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${cc.key}: ${cc.tlsHandshaking ? 'TLS: ' : ''}${error.message.replace(/^socket error: /, '')}`, { cause: error })
    }
    return error
  }

  // The connection closed (or the client closes it): every call on it fails with `error`.
  #connectionClosed (cc: PeerConnection<Req, Res>, error: RpcError): void {
    if (cc.closed) return
    cc.closed = true
    if (cc.connectTimer !== null) this.#clock.clearTimer(cc.connectTimer)
    cc.connectTimer = null
    if (this.#connections.get(cc.slot.key) === cc) this.#connections.delete(cc.slot.key)
    if (!cc.ready) this.#balancer.failed(cc.slot)
    const calls = this.#inOrder ? cc.inOrder.toArray() : [...cc.byId.values()]
    cc.inOrder.clear()
    cc.byId.clear()
    cc.quiet.clear()
    for (const call of calls) this.#fail(call, error)
    cc.connection.destroy(error)
    if (cc.ready && this.#closeHandlers.length > 0) {
      const info: ConnectionCloseInfo = { endpoint: cc.key, error }
      for (const handler of this.#closeHandlers) {
        try {
          handler(info)
        } catch (err) {
          this.#logPushHandler.log((m, f) => this.#log.warn(m, f), () => `a connection-close handler threw: ${(err as Error)?.message ?? String(err)}`, () => ({ endpoint: cc.key }))
        }
      }
    }
  }

  // One answer frame (or push): match it to its call and settle that.
  #onAnswer (cc: PeerConnection<Req, Res>, buf: Buffer, start: number, end: number): boolean {
    const isPush = this.#isPush
    if (isPush !== undefined && isPush(buf, start, end)) return this.#onPush(cc, buf, start, end)
    const protocol = this.#protocol
    let call: PendingCall<Req, Res> | undefined
    if (this.#inOrder) {
      call = cc.inOrder.shift()
      if (call === undefined) return this.#broken(cc, new RpcError(ErrorCode.MALFORMED_FRAME, `${protocol.name} answer from ${cc.key} with no request waiting for it`))
    } else {
      const id = protocol.answerId!(buf, start, end)
      if (typeof id !== 'number') return this.#broken(cc, id)
      call = cc.byId.get(id)
      // Unknown, timed out or cancelled: dropped.
      if (call === undefined) return true
      cc.byId.delete(id)
      this.#settleQuietBefore(cc, call.seq)
    }
    if (call.answer === 'stream') return this.#onPart(cc, call, buf, start, end)
    const result = protocol.decodeAnswer(call.request, buf, start, end)
    if (result instanceof RpcError && result.remote === undefined && result.fatal) {
      // Garbage: the stream can no longer be trusted.
      this.#fail(call, result)
      return this.#broken(cc, result)
    }
    if (call.state === FINISHED) return true
    if (result instanceof RpcError) this.#fail(call, result)
    else this.#succeed(call, result)
    return true
  }

  // One part of `call`'s streamed answer; the call was taken off its
  // connection's queue (or map) and goes back unless the stream ended.
  #onPart (cc: PeerConnection<Req, Res>, call: PendingCall<Req, Res>, buf: Buffer, start: number, end: number): boolean {
    const result = this.#protocol.decodePart!(call.request, buf, start, end)
    if (result instanceof RpcError) {
      // The stream ends with the error.
      this.#fail(call, result)
      return result.remote === undefined && result.fatal ? this.#broken(cc, result) : true
    }
    if (call.state === FINISHED) {
      // Settled already (deadline, abort; in-order only, as a settled call
      // leaves the id map): its parts are read to find where it ends.
      if (!result.last) cc.inOrder.unshift(call)
      return true
    }
    const parts = call.parts ?? (call.parts = [])
    if (result.value !== undefined) {
      if (parts.length >= this.#maxStreamParts) {
        const name = this.#protocol.name
        this.#fail(call, new RpcError(ErrorCode.QUEUE_FULL, `${name} call to ${cc.key}: its streamed answer went over ${this.#maxStreamParts} parts (maxStreamParts)`))
        return this.#broken(cc, new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${cc.key} closed: a ${name} streamed answer went over maxStreamParts, and the rest of it cannot be told from the answers after it`))
      }
      parts.push(result.value)
    }
    if (result.last) {
      this.#succeed(call, parts as Res)
      return true
    }
    if (this.#inOrder) cc.inOrder.unshift(call)
    else cc.byId.set(call.id, call)
    return true
  }

  // A push: to every handler, then to every iterator.
  #onPush (cc: PeerConnection<Req, Res>, buf: Buffer, start: number, end: number): boolean {
    const decodePush = this.#protocol.decodePush
    const push = decodePush === undefined ? Buffer.from(buf.subarray(start, end)) : decodePush(buf, start, end)
    if (push instanceof RpcError) return push.remote === undefined && push.fatal ? this.#broken(cc, push) : true
    this.#pushCounts.received++
    for (const handler of this.#pushHandlers) {
      try {
        handler(push, cc.pushInfo)
      } catch (err) {
        this.#logPushHandler.log((m, f) => this.#log.warn(m, f), () => `a push handler threw (the push from ${cc.key} still went to the others): ${(err as Error)?.message ?? String(err)}`,
          () => ({ endpoint: cc.key }))
      }
    }
    for (const iterator of this.#pushIterators) iterator.offer(push)
    return !cc.closed
  }

  // An answer to the request written `seq`-th arrived: the quiet requests written before it were processed without an answer.
  #settleQuietBefore (cc: PeerConnection<Req, Res>, seq: number): void {
    const quiet = cc.quiet
    for (let front = quiet.peekFront(); front !== undefined && front.seq <= seq; front = quiet.peekFront()) {
      quiet.shift()
      if (front.seq === seq || front.state === FINISHED) continue
      if (cc.byId.get(front.id) === front) cc.byId.delete(front.id)
      this.#succeed(front, this.#protocol.silentResult!(front.request))
    }
  }

  #broken (cc: PeerConnection<Req, Res>, error: RpcError): false {
    cc.connection.destroy(error)
    return false
  }
}

function ignore (): void {}

// The alerts of a server refusing the client's certificate (OpenSSL's codes as Node names them).
const CERTIFICATE_REFUSAL = /^ERR_SSL_(?:SSLV3|TLSV1|TLSV13)_ALERT_(?:CERTIFICATE_REQUIRED|BAD_CERTIFICATE|UNSUPPORTED_CERTIFICATE|UNKNOWN_CA|CERTIFICATE_UNKNOWN|CERTIFICATE_EXPIRED|CERTIFICATE_REVOKED|ACCESS_DENIED)$/

function isCertificateRefusal (err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code
  return typeof code === 'string' && CERTIFICATE_REFUSAL.test(code)
}

function invalid (err: unknown): RpcError {
  if (err instanceof RpcError) return err
  return new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot encode the request: ${(err as Error).message}`, { cause: err })
}
