import { ErrorCode, RpcError } from '../codec/errors.js'
import type { CallInfo, ConnectionHandle, RouteInfo } from '../codec/protocol.js'
import type { Clock, TimerHandle } from '../scheduling/clock.js'
import type { ConnectionAnswers } from './answer-order.js'
import type { MethodMetrics } from './metrics.js'
import type { SessionQueue } from './session-order.js'

/** What a handler sees of its call, whatever the protocol. */
export interface CallContext<State = unknown> {
  /** The route's group (KRPC: `package.Service`) and the route within it (KRPC: the method). */
  readonly service: string
  /** The route within its group (KRPC: the method; memcached: the command). */
  readonly method: string
  /** The id the request carried (KRPC call_id, memcached opaque). */
  readonly callId: number
  /** Who the connection's set-up said the peer is (KRPC: the SASL user); '' without one. */
  readonly user: string
  /** `ip:port` of the client. */
  readonly remoteAddress: string
  /**
   * The call's deadline on the server's monotonic clock (ms): receipt time
   * plus the request's time budget (from the wire, or the server's
   * `requestTimeoutMs`), computed once when the whole frame arrived;
   * `Infinity` without one.
   */
  readonly deadline: number
  /** Milliseconds left until the deadline (never negative; `Infinity` without one). */
  remainingMs: () => number
  /** Aborts when the deadline passes or the connection dies. */
  readonly signal: AbortSignal
  /** Closes the connection once this call's answer (or its silence) has been written, and reads no request after it (memcached's QUIT). */
  closeConnection: () => void
  /** The protocol's own state of the connection (`ServerProtocol.connectionState`; RESP: the client's name); undefined without one. */
  readonly connectionState: State
  /** The call's connection, for pushes, closing and flow control; it may be kept after the call (see `ConnectionHandle`). */
  readonly connection: ConnectionHandle<State>
  /**
   * Sends one part of a streamed answer now, before the final answer (the
   * handler's result), encoded with the protocol's `encodePart`: in the
   * request's place in the order (`'in-order'` protocols hold it until the
   * answers before it have gone). Parts count against the connection's
   * outbound bound like answers. False when the connection has closed (the
   * part is dropped). Throws when the call is already answered, or the
   * protocol has no `encodePart`.
   */
  write: (part: unknown) => boolean
}

/** A route as the server resolved it: names, what was registered with it, handler and metrics. Internal. */
export interface CallRoute extends RouteInfo {
  /** The route's handler inside its filters. */
  readonly handler: (request: unknown, ctx: CallContext) => unknown
  /** The route's metrics (counts, latencies). */
  readonly metrics: MethodMetrics
}

/** Who sent a call: the server's connection state answers for it. Internal. */
export interface CallPeer {
  /** Who the connection's set-up said the peer is; '' without one. */
  readonly user: string
  /** `ip:port` of the peer. */
  readonly remoteAddress: string
  /** The connection's protocol state (`ServerProtocol.connectionState`). */
  readonly state?: unknown
  /** The connection's handle (`ctx.connection`). */
  readonly connection?: ConnectionHandle | undefined
}

/**
 * One call being handled by the server, from the moment its whole frame
 * arrived until its answer is queued on the connection. The deadline is
 * computed once, at construction: scheduling, expiry and the handler all
 * read this cached value. What a protocol keeps per call lives in `data`,
 * filled at decode time (`CallHead.data`) and typed by the protocol's
 * `Data`: protocols add no subclasses.
 */
export class InboundCall<Data = unknown> implements CallContext, CallInfo<Data> {
  // Every field is declared without a value and set in the constructor, in
  // one order, and none is #private: V8 then allocates and fills the object
  // in line. With initializers and #fields it went through the generic
  // construct path (about 100 instructions a call more, counted with
  // bench/server-instructions.ts).
  declare readonly callId: number
  /** When its whole frame arrived, on the server's clock (ms). */
  declare readonly receivedAt: number
  declare readonly deadline: number
  /** The protocol's per-call data, as its `decodeHead` filled `CallHead.data`. */
  declare readonly data: Data
  /** The request as the protocol's `decodeRequest` made it: what the handler gets. */
  declare readonly request: unknown
  /** Its route, handler and metrics. Internal. */
  declare readonly route: CallRoute
  declare private readonly _peer: CallPeer
  /** When a handler started on it (for queue-time metrics); NaN until then. */
  declare handledAt: number
  /** The method's metrics while its handler runs; null before and after. Internal. */
  declare metrics: MethodMetrics | null
  /**
   * Its connection's answers: where its answer and streamed parts go, in
   * the connection's answer order; null once answered.
   * @internal
   */
  declare owner: ConnectionAnswers | null
  /** Its place in its connection's answer order (in-order protocols); -1 for protocols that match by id. Internal. */
  declare seq: number
  /** `closeConnection()` was called. */
  declare closeAfter: boolean
  /** Its handler was abandoned (its worker given back, its result to be dropped). Internal. */
  declare abandoned: boolean
  /** The worker (of its group's pool) its in-loop handler runs on; -1 before, and in thread mode. Internal. */
  declare worker: number
  /** Its connection's sequential calls, while it is one of them (`execution: 'sequential'`); null otherwise. Internal. */
  declare session: SessionQueue | null
  /**
   * Told once when the call is aborted (its executor cancels it where it
   * runs: KRPC's worker threads); null when nothing listens. Internal.
   */
  declare onAbort: ((reason: RpcError) => void) | null
  declare private readonly _clock: Clock
  declare private _controller: AbortController | null
  declare private _timer: TimerHandle | null
  declare private _abortReason: RpcError | null
  declare private _finished: boolean

  // Positional: one object per call, not two (a fields object would be one more).
  constructor (route: CallRoute, peer: CallPeer, callId: number, receivedAt: number, timeoutMs: number,
    data: Data, request: unknown, clock: Clock) {
    this.callId = callId
    this.receivedAt = receivedAt
    this.deadline = timeoutMs > 0 ? receivedAt + timeoutMs : Number.POSITIVE_INFINITY
    this.data = data
    this.request = request
    this.route = route
    this._peer = peer
    this.handledAt = Number.NaN
    this.metrics = null
    this.owner = null
    this.seq = -1
    this.closeAfter = false
    this.abandoned = false
    this.worker = -1
    this.session = null
    this.onAbort = null
    this._clock = clock
    this._controller = null
    this._timer = null
    this._abortReason = null
    this._finished = false
  }

  get service (): string {
    return this.route.service
  }

  get method (): string {
    return this.route.method
  }

  get user (): string {
    return this._peer.user
  }

  get connectionState (): unknown {
    return this._peer.state
  }

  get remoteAddress (): string {
    return this._peer.remoteAddress
  }

  get connection (): ConnectionHandle {
    return this._peer.connection!
  }

  write (part: unknown): boolean {
    const owner = this.owner
    if (owner === null) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `ctx.write on call ${this.callId} after its answer`)
    return owner.writePart(this, part)
  }

  remainingMs (): number {
    return Math.max(0, this.deadline - this._clock.now())
  }

  /** Why the handler's signal aborted (deadline, connection, shutdown); null while it has not. */
  get abortReason (): RpcError | null {
    return this._abortReason
  }

  /** True once the deadline has passed. */
  get isExpired (): boolean {
    return this._clock.now() >= this.deadline
  }

  closeConnection (): void {
    if (this.closeAfter) return
    this.closeAfter = true
    // At once: nothing after this request is read, and (in order) no answer after its own is sent.
    this.owner?.requestClose(this.seq)
  }

  // The AbortController and its deadline timer are made only for handlers
  // that look at the signal: most calls never pay for them.
  get signal (): AbortSignal {
    if (this._controller === null) {
      this._controller = new AbortController()
      if (this._abortReason !== null) {
        this._controller.abort(this._abortReason)
      } else if (!this._finished && Number.isFinite(this.deadline)) {
        this._timer = this._clock.setTimer(() => {
          this._timer = null
          this.abort(new RpcError(ErrorCode.DEADLINE_EXCEEDED, 'the call passed its deadline'))
        }, this.deadline - this._clock.now())
      }
    }
    return this._controller.signal
  }

  /** Aborts the handler's signal (deadline passed, connection died, server stopping). */
  abort (reason: RpcError): void {
    if (this._abortReason !== null) return
    this._abortReason = reason
    this._controller?.abort(reason)
    this.onAbort?.(reason)
  }

  /** Releases the deadline timer; called once when the call is answered. */
  finish (): void {
    this._finished = true
    if (this._timer !== null) {
      this._clock.clearTimer(this._timer)
      this._timer = null
    }
  }
}
