import type { ConnectionOptions as TlsConnectionOptions } from 'node:tls'
import type { ClientProtocol } from '../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { RetryBudgetStats } from '../scheduling/retry.js'
import { ClientEngine } from './client/client-engine.js'
import { type ClientEngineOptions, type ClientHealthStats, type EngineConnectionStats } from './client/client-engine-options.js'
import { deliver, type Callback } from './client/pending-call.js'
import type { PushInfo } from './client/peer-connection.js'
import type { ConnectionCloseInfo, ProtocolPushOptions } from './client/pushes.js'
import { RetryLoop, type ProtocolRetryOptions } from './client/retry-loop.js'
import type { ClientEndpoint, Target } from './client/targets.js'
import type { Logger } from './logger.js'

export type { ClientEngineOptions, EngineConnectionStats } from './client/client-engine-options.js'
export type { Callback } from './client/pending-call.js'
export type { PushInfo } from './client/peer-connection.js'
export type { ConnectionCloseInfo, ProtocolPushOptions } from './client/pushes.js'
export type { ProtocolRetryOptions, RetryStats } from './client/retry-loop.js'
export type { ClientEndpoint, ClientTarget } from './client/targets.js'

/** The options of a `ProtocolClient`: the engine's (reactor/client/client-engine-options.ts), its endpoints and retries. */
export interface ProtocolClientOptions extends ClientEngineOptions {
  /** The endpoint, or endpoints to balance calls over. */
  endpoint: ClientEndpoint | readonly ClientEndpoint[]
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
  /** Where a push handler's error is reported (rate-limited warnings), and lost connections (info) and refused retries (warn); default warnings on stderr, null: nowhere. */
  logger?: Logger | null
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
  /** The client's `close`. */
  close: () => Promise<void>
  /** The client's `stats`. */
  stats: () => ProtocolClientStats
  /** The client's `onPush`: pushes do not go through the interceptors. */
  onPush: (handler: (push: unknown, info: PushInfo) => void) => () => void
  /** The client's `pushes`. */
  pushes: (options?: ProtocolPushOptions) => AsyncIterableIterator<unknown>
}

/** Options of one `ProtocolClient.call`. */
export interface ProtocolCallOptions {
  /** The call's deadline from now, covering connect and every retry; default the client's `defaultTimeoutMs`; 0: none. */
  timeoutMs?: number
  /** Cancels the call: it settles with RPC_ERR_CANCELLED (with `id` matching, one not written yet is never sent). */
  signal?: AbortSignal
  /** Safe to repeat after a lost connection even once sent (as `ClientProtocol.retryable` can say per request). */
  idempotent?: boolean
  /** false: no retries for this call. */
  retry?: boolean
  /** The call's protocol data, for the protocol's hooks (`ClientProtocol`: `data`); default undefined. */
  data?: unknown
}

/** Counters of one open connection. */
export type ProtocolClientConnectionStats = EngineConnectionStats

/** A `ProtocolClient`'s counters; `ejection`, `pings` and `unresponsiveConnections` are its health (outlier ejection, liveness). */
export interface ProtocolClientStats extends ClientHealthStats {
  /** Each open connection's counters. */
  connections: ProtocolClientConnectionStats[]
  /** Retries made (attempts after the first). */
  retries: number
  /** Calls that failed with a retryable error after their last attempt. */
  exhausted: number
  /** The retry budget's counters; null with retries off or no budget. */
  budget: RetryBudgetStats | null
  /** Pushes received (`ClientProtocol.isPush`), decoded ones only. */
  pushesReceived: number
  /** Pushes dropped because an iterator (`pushes()`) held `maxBuffered` or `maxBufferedBytes` already. */
  pushesDropped: number
  /** Attempts of idempotent calls abandoned at their attempt timeout (`retry.attemptTimeoutMs`). */
  attemptTimeouts: number
}


/**
 * A client for any protocol described by a `ClientProtocol`; KRPC's
 * `Client` is the same engine under typed stubs.
 *
 * - Endpoints and connections: `connectionsPerEndpoint` connections to
 *   each endpoint (each address of each name, with `resolveAll`), opened
 *   on first use; each call picks one with the balancer
 *   (reactor/balancer.ts), which skips a slot whose connection failed for
 *   a backoff.
 * - Deadlines: each call's `timeoutMs` covers connecting, the set-up,
 *   queueing and every retry (scheduling/deadline-lists.ts); a late answer
 *   is dropped.
 * - Retries (reactor/client/retry-loop.ts): a call that was not sent (no
 *   connection, connection lost before its bytes left, outbound queue
 *   full), or whose error the protocol calls retryable, or an `idempotent`
 *   call whose connection was lost, is tried again after a backoff, within
 *   the deadline and the retry budget (scheduling/retry.ts).
 * - Writes: requests are encoded straight into the connection's coalesced
 *   outbound buffer (transport/transfer-queue.ts): the requests of one
 *   turn leave in one write (batches of 50 frames go out as they fill),
 *   and the client waits for 'drain' only when the kernel buffer is full.
 *   A call with an AbortSignal stays a transfer of its own, so that it can
 *   be dropped unsent when cancelled (`id` matching); one cancelled while
 *   its frame is being written settles once the frame is out.
 * - Bounds: `maxOutboundBytes` and `maxInFlight` per connection; over
 *   them a call fails with RPC_ERR_QUEUE_FULL, unsent.
 * - Every call settles exactly once: answer, deadline, abort, connection
 *   failure (peer closed, reset, or sent garbage: every call on it fails
 *   with the connection's fatal error, and is retried if allowed), or
 *   `close()` (RPC_ERR_CLIENT_CLOSED). A fatal remote error retires its
 *   connection: new calls open another.
 *
 * An `in-order` call cancelled or timed out after it was queued is still
 * written (its place in the answer order is taken) and its answer dropped.
 * When the call whose answer comes next times out, every answer behind it
 * would wait for that one, however slowly it arrives: its connection is
 * retired (new calls open another) and closes once no call waits on it, so
 * an answer still arriving past its deadline holds up nothing else.
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
  readonly #engine: ClientEngine<Req, Res>
  readonly #target: Target
  readonly #retry: RetryLoop<Req, Res> | null

  constructor (protocol: ClientProtocol<Req, Res>, options: ProtocolClientOptions) {
    this.#engine = new ClientEngine(protocol, options)
    this.#target = this.#engine.targets.of(options.endpoint)
    this.#retry = options.retry === false ? null : new RetryLoop(this.#engine, options.retry ?? {})
  }

  /**
   * Sends `request` and resolves with its answer's response; rejects with
   * an RpcError (RPC_ERR_REMOTE for the peer's errors). With `callback`, it
   * returns nothing and calls it once the call ends (never before this
   * returns): no promise, for callers that issue the next call from the
   * last one's end. A callback that throws does not disturb the client: the
   * exception is rethrown from `setImmediate`, as an uncaught exception.
   */
  call (request: Req, options?: ProtocolCallOptions): Promise<Res>
  call (request: Req, options: ProtocolCallOptions | undefined, callback: Callback<Res>): void
  call (request: Req, options: ProtocolCallOptions = {}, callback?: Callback<Res>): Promise<Res> | undefined {
    const engine = this.#engine
    const timeoutMs = options.timeoutMs ?? engine.defaultTimeoutMs
    const retry = options.retry === false ? null : this.#retry
    if (callback !== undefined) {
      if (typeof callback !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'the callback must be a function')
      if (retry === null) engine.attempt(this.#target, request, options.data, options.signal, timeoutMs, ignore, ignore, callback)
      else retry.run(this.#target, request, options.data, options, timeoutMs).then((response) => deliver(callback, null, response), (error: RpcError) => deliver(callback, error, undefined))
      return undefined
    }
    if (engine.closed) return Promise.reject(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed'))
    if (retry === null) {
      return new Promise<Res>((resolve, reject) => { engine.attempt(this.#target, request, options.data, options.signal, timeoutMs, resolve, reject, null) })
    }
    return retry.run(this.#target, request, options.data, options, timeoutMs)
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
   * Calls `handler({ endpoint, error })` when a connection that was set up
   * closes, for whatever reason: what a push consumer needs to know that
   * the pushes of that connection (a subscription) have stopped, since the
   * client opens a new connection for the next call without them. Returns
   * a function that removes the handler; a handler that throws is logged,
   * as a push handler's throw is.
   */
  onConnectionClose (handler: (info: ConnectionCloseInfo) => void): () => void {
    return this.#engine.pushes.onConnectionClose(handler)
  }

  /**
   * Calls `handler` with each push (`ClientProtocol.isPush`), decoded by
   * `decodePush`, on any of the client's connections (which open with the
   * first calls), synchronously as its frame is read. A handler that throws
   * is reported to the logger and the others still run. Returns the
   * function that removes the handler.
   */
  onPush (handler: (push: unknown, info: PushInfo) => void): () => void {
    return this.#engine.pushes.onPush(handler)
  }

  /**
   * The pushes from now on, as an async iterator (`for await`). It holds
   * at most `maxBuffered` (default 1024) pushes not yet read, of at most
   * `maxBufferedBytes` (default 32 MiB, each counted as its frame's size):
   * past either the oldest are dropped until the newest fits, and
   * `stats().pushesDropped` counts them. It ends (done)
   * with its `return()` (a `break` out of `for await`), which drops what it
   * holds, or with `close()`, after the pushes it holds.
   */
  pushes (options: ProtocolPushOptions = {}): AsyncIterableIterator<unknown> {
    return this.#engine.pushes.iterator(options)
  }

  /** Counters: connections, retries, pushes. */
  stats (): ProtocolClientStats {
    const retry = this.#retry?.stats
    const counts = this.#engine.pushes.counts
    return {
      connections: this.#engine.connectionStats(),
      retries: retry?.retries ?? 0,
      exhausted: retry?.exhausted ?? 0,
      budget: retry?.budget ?? null,
      pushesReceived: counts.received,
      pushesDropped: counts.dropped,
      attemptTimeouts: retry?.attemptTimeouts ?? 0,
      ...this.#engine.health()
    }
  }

  /**
   * Settles every pending call with RPC_ERR_CLIENT_CLOSED and closes every
   * connection; later calls reject with it at once, and calls waiting to
   * retry stop waiting. Push iterators end after the pushes they hold;
   * push handlers are removed.
   */
  async close (): Promise<void> {
    if (this.#engine.closed) return
    const error = new RpcError(ErrorCode.CLIENT_CLOSED, 'the client was closed')
    this.#engine.close(error)
    this.#retry?.close(error)
  }
}

function ignore (): void {}
