import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Message, MethodDef } from '../codec/schema.js'
import type { Clock, TimerHandle } from '../scheduling/clock.js'
import type { MethodMetrics } from './metrics.js'

/** What a handler sees of its call. */
export interface CallContext {
  /** `package.Service` and method of the call. */
  readonly service: string
  readonly method: string
  readonly callId: number
  /** The SASL user the connection negotiated. */
  readonly user: string
  /** `ip:port` of the client. */
  readonly remoteAddress: string
  /**
   * The call's deadline on the server's monotonic clock (ms): receipt time
   * plus the client's `timeout_millis`, computed once when the whole frame
   * arrived; `Infinity` when the client sent none.
   */
  readonly deadline: number
  /** Milliseconds left until the deadline (never negative; `Infinity` without one). */
  remainingMs: () => number
  /** Aborts when the deadline passes or the connection dies. */
  readonly signal: AbortSignal
  /** The request's sidecars (views of the received frame; do not write to them). */
  readonly sidecars: readonly Buffer[]
  /** Adds a sidecar to the response; returns its index, to be named in the response message. */
  addSidecar: (data: Uint8Array) => number
}

/** What the server resolved a call's method to: its names, definition, handler and metrics. Internal. */
export interface CallRoute {
  readonly serviceName: string
  readonly methodName: string
  readonly methodDef: MethodDef<Message, Message>
  readonly handler: (request: Message, ctx: CallContext) => unknown
  readonly metrics: MethodMetrics
}

/** Who sent a call: the server's connection state answers for it. Internal. */
export interface CallPeer {
  readonly user: string
  readonly remoteAddress: string
}

/**
 * One call being handled by the server, from the moment its whole frame
 * arrived until its response is queued on the connection. The deadline is
 * computed once, at construction (seed 004): scheduling, expiry and the
 * handler all read this cached value.
 */
export class InboundCall implements CallContext {
  readonly callId: number
  readonly receivedAt: number
  readonly deadline: number
  readonly sidecars: readonly Buffer[]
  readonly request: Message
  /** Its method, handler and metrics. Internal. */
  readonly route: CallRoute
  readonly #peer: CallPeer
  /** When a handler started on it (for queue-time metrics); NaN until then. */
  handledAt = Number.NaN
  responseSidecars: Uint8Array[] | undefined
  /** The method's metrics while its handler runs; null before and after. Internal. */
  metrics: MethodMetrics | null = null
  /** The server's per-connection state this call belongs to; null once answered. Internal. */
  owner: unknown = null
  /** Its handler was abandoned (its worker given back, its result to be dropped). Internal. */
  abandoned = false
  /** The worker (of its service's pool) its in-loop handler runs on; -1 before, and in thread mode. Internal. */
  worker = -1
  #clock: Clock
  #controller: AbortController | null = null
  #timer: TimerHandle | null = null
  #abortReason: RpcError | null = null
  #finished = false

  // Positional: one object per call, not two (a fields object would be one more).
  constructor (route: CallRoute, peer: CallPeer, callId: number, receivedAt: number, timeoutMs: number,
    sidecars: readonly Buffer[], request: Message, clock: Clock) {
    this.route = route
    this.#peer = peer
    this.callId = callId
    this.receivedAt = receivedAt
    this.deadline = timeoutMs > 0 ? receivedAt + timeoutMs : Number.POSITIVE_INFINITY
    this.sidecars = sidecars
    this.request = request
    this.#clock = clock
  }

  get service (): string {
    return this.route.serviceName
  }

  get method (): string {
    return this.route.methodName
  }

  get methodDef (): MethodDef<Message, Message> {
    return this.route.methodDef
  }

  get user (): string {
    return this.#peer.user
  }

  get remoteAddress (): string {
    return this.#peer.remoteAddress
  }

  remainingMs (): number {
    return Math.max(0, this.deadline - this.#clock.now())
  }

  /** True once the client's deadline has passed. */
  get isExpired (): boolean {
    return this.#clock.now() >= this.deadline
  }

  // The AbortController and its deadline timer are made only for handlers
  // that look at the signal: most calls never pay for them.
  get signal (): AbortSignal {
    if (this.#controller === null) {
      this.#controller = new AbortController()
      if (this.#abortReason !== null) {
        this.#controller.abort(this.#abortReason)
      } else if (!this.#finished && Number.isFinite(this.deadline)) {
        this.#timer = this.#clock.setTimer(() => {
          this.#timer = null
          this.abort(new RpcError(ErrorCode.DEADLINE_EXCEEDED, 'the call passed its deadline'))
        }, this.deadline - this.#clock.now())
      }
    }
    return this.#controller.signal
  }

  addSidecar (data: Uint8Array): number {
    this.responseSidecars ??= []
    this.responseSidecars.push(data)
    return this.responseSidecars.length - 1
  }

  /** Aborts the handler's signal (deadline passed, connection died, server stopping). */
  abort (reason: RpcError): void {
    if (this.#abortReason !== null) return
    this.#abortReason = reason
    this.#controller?.abort(reason)
  }

  /** Releases the deadline timer; called once when the call is answered. */
  finish (): void {
    this.#finished = true
    if (this.#timer !== null) {
      this.#clock.clearTimer(this.#timer)
      this.#timer = null
    }
  }
}
