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

/** What the server resolved a call's method to: its handler and metrics. Internal. */
export interface CallRoute {
  readonly handler: (request: Message, ctx: CallContext) => unknown
  readonly metrics: MethodMetrics
}

/**
 * One call being handled by the server, from the moment its whole frame
 * arrived until its response is queued on the connection. The deadline is
 * computed once, at construction (seed 004): scheduling, expiry and the
 * handler all read this cached value.
 */
export class InboundCall implements CallContext {
  readonly service: string
  readonly method: string
  readonly callId: number
  readonly user: string
  readonly remoteAddress: string
  readonly receivedAt: number
  readonly deadline: number
  readonly sidecars: readonly Buffer[]
  readonly methodDef: MethodDef<Message, Message>
  readonly request: Message
  /** Its handler and metrics. Internal. */
  readonly route: CallRoute | null
  /** When a handler started on it (for queue-time metrics); NaN until then. */
  handledAt = Number.NaN
  responseSidecars: Uint8Array[] | undefined
  /** The method's metrics while its handler runs; null before and after. Internal. */
  metrics: MethodMetrics | null = null
  /** The server's per-connection state this call belongs to; null once answered. Internal. */
  owner: unknown = null
  #clock: Clock
  #controller: AbortController | null = null
  #timer: TimerHandle | null = null
  #abortReason: RpcError | null = null
  #finished = false

  constructor (fields: {
    service: string, method: string, callId: number, user: string, remoteAddress: string,
    receivedAt: number, timeoutMs: number, sidecars: readonly Buffer[], methodDef: MethodDef<Message, Message>, request: Message, clock: Clock,
    route?: CallRoute | null
  }) {
    this.service = fields.service
    this.method = fields.method
    this.callId = fields.callId
    this.user = fields.user
    this.remoteAddress = fields.remoteAddress
    this.receivedAt = fields.receivedAt
    this.deadline = fields.timeoutMs > 0 ? fields.receivedAt + fields.timeoutMs : Number.POSITIVE_INFINITY
    this.sidecars = fields.sidecars
    this.methodDef = fields.methodDef
    this.request = fields.request
    this.route = fields.route ?? null
    this.#clock = fields.clock
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
