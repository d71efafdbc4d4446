import { ErrorCode, RpcError } from '../../codec/errors.js'
import { RpcFeature } from '../../codec/krpc/negotiation.js'
import type { Message } from '../../codec/schema.js'
import type { Clock, TimerHandle } from '../../scheduling/clock.js'
import { DeadlineLists, NO_DEADLINE, type Stamp } from '../../scheduling/deadline-lists.js'
import type { OutboundTransfer } from '../../transport/transfer-queue.js'
import type { ClientConnection } from './client-connection.js'
import type { PreparedMethod } from './prepared-method.js'

/** A response with its sidecars. */
export interface CallResult<Res> {
  response: Res
  /** Response sidecars (views of the received frame). */
  sidecars: Buffer[]
}

/**
 * How a call made with a callback ends: with an error, or with null and the
 * response. Called exactly once, never before the call that made it has
 * returned (Kudu's `Proxy::AsyncRequest` callback).
 */
export type Callback<Res> = (error: RpcError | null, response?: Res) => void

/**
 * Where a call is, in this order (FINISHED from any of them). Only QUEUED
 * calls are certainly not run by the server: a failure after that is one a
 * retry must treat as possibly run.
 */
export const CallState = {
  QUEUED: 0, // waiting on the connection: connect, negotiation, or the transfer queue
  SENDING: 1, // bytes handed to the socket, some of the caller's buffers still referenced
  SENT: 2,
  FINISHED: 3
} as const
export type CallState = typeof CallState[keyof typeof CallState]

/**
 * One call from the client's side. It settles exactly once, through
 * `OutboundCalls` (`succeed` or `fail`), whatever happens first: response,
 * timeout, cancellation or connection failure.
 *
 * A plain object made by `newCall`, not a class instance: V8 allocates an
 * object literal in line wherever it is made, while `new` in #attempt came
 * after V8's inlining budget ran out and went through the generic construct
 * stub, allocating in a builtin (~2 % of a pipelining client's CPU in perf).
 */
export interface OutboundCall extends OutboundTransfer {
  state: CallState
  slices: Buffer[]
  bytes: number
  sentHook: ((call: OutboundCall, error: RpcError | undefined) => void) | null
  callId: number
  conn: ClientConnection | null
  /** Its own deadline timer, when its timeout shares no deadline list (`DeadlineLists`). */
  timer: TimerHandle | null
  /**
   * Why it ends once the transport is done with its transfer: a cancel or
   * timeout that came while SENDING (the frame is finished first), or the
   * refusal to send it at all (the server lacks application feature flags).
   */
  pendingError: RpcError | null
  needsApplicationFeatures: boolean
  /**
   * Its deadline, shared with the calls made in the same checkpoint (see
   * `DeadlineLists.arm`), which also hold it in a deadline list; NaN
   * until that checkpoint ends.
   */
  stamp: Stamp<OutboundCall>
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

export const NO_SLICES: Buffer[] = []

export function newCall (method: PreparedMethod, target: { host: string, port: number }, responseOnly: boolean,
  resolve: (result: CallResult<Message> | Message) => void, reject: (error: RpcError, sent: boolean) => void): OutboundCall {
  return {
    state: CallState.QUEUED,
    slices: NO_SLICES,
    bytes: 0,
    sentHook: null,
    callId: -1,
    conn: null,
    timer: null,
    pendingError: null,
    needsApplicationFeatures: false,
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
    this.pendingError = new RpcError(ErrorCode.NOT_SUPPORTED, `${labelOf(this)}: server does not support the required RPC features`)
    return false
  }
  this.state = CallState.SENDING
  return true
}

function callOnSent (this: OutboundCall, error: RpcError | undefined): void {
  this.slices = NO_SLICES
  this.sentHook?.(this, error)
}

/** For messages: built only when an error needs it, never per call. */
export function labelOf (call: OutboundCall): string {
  return `${call.method.service}.${call.method.methodDef.name} RPC to ${call.target.host}:${call.target.port}`
}

export function isFinished (call: OutboundCall): boolean {
  return call.state === CallState.FINISHED
}

// A callback's exception belongs to its caller, not to the read or timer that
// settled the call: it is rethrown from setImmediate, the client left whole.
// (Not process.nextTick: a tick that throws at the end of an `onread`
// callback leaves Node's reads of that socket stopped.)
export function deliver (callback: Callback<Message>, error: RpcError | null, response: Message | undefined): void {
  try {
    callback(error, response)
  } catch (err) {
    setImmediate(rethrow, err)
  }
}

function rethrow (err: unknown): never {
  throw err
}

// A call that failed before it was made: a promise rejects, a callback is
// called from setImmediate (not a tick: a chain that re-issues on every
// failure must not starve I/O).
export function failEarly (error: RpcError, reject: (error: RpcError, sent: boolean) => void, callback: Callback<Message> | null): void {
  if (callback === null) reject(error, false)
  else setImmediate(deliver, callback, error, undefined)
}

/**
 * A client's calls in flight: the deadline lists that expire them, and
 * their settlement. Each call ends here exactly once: `succeed` with its
 * response, or `fail` (timeout, cancellation, error answer, connection
 * failure).
 */
export class OutboundCalls {
  readonly #clock: Clock
  readonly deadlines: DeadlineLists<OutboundCall>
  /** The hook of calls sent as transfers (`OutboundCall.sentHook`): one for all of them. */
  readonly sentHook = (call: OutboundCall, error: RpcError | undefined): void => this.#onSent(call, error)
  /**
   * The callback-form call being started, while it is: one that fails then
   * is settled from setImmediate, its caller not having control back yet.
   */
  startedCall: OutboundCall | null = null

  constructor (clock: Clock) {
    this.#clock = clock
    this.deadlines = new DeadlineLists<OutboundCall>(clock, this.#expire, isFinished)
  }

  /** Settles `call`, already out of its connection's table, with its response. */
  succeed (call: OutboundCall, response: Message, sidecars: Buffer[]): void {
    this.#finish(call, true)
    if (call.callback !== null) deliver(call.callback, null, response)
    else call.resolve(call.responseOnly ? response : { response, sidecars })
  }

  /** Fails `call` unless it has settled; `taken`: it is already out of its connection's table. */
  fail (call: OutboundCall, error: RpcError, taken = false): void {
    if (isFinished(call)) return
    const sent = call.state !== CallState.QUEUED
    this.#finish(call, taken)
    const callback = call.callback
    if (callback === null) call.reject(error, sent)
    // Failed while it starts: its caller has not got control back yet.
    else if (call === this.startedCall) setImmediate(deliver, callback, error, undefined)
    else deliver(callback, error, undefined)
  }

  cancel (call: OutboundCall): void {
    if (isFinished(call)) return
    const error = new RpcError(ErrorCode.CANCELLED, `${labelOf(call)} was cancelled`)
    if (call.state === CallState.SENDING) {
      // Never truncate a frame nor release its buffers mid-write: wait.
      call.pendingError = error
      return
    }
    this.fail(call, error)
  }

  // `taken`: the call is already out of its connection's table.
  #finish (call: OutboundCall, taken: boolean): void {
    call.state = CallState.FINISHED
    this.deadlines.leave(call)
    if (call.signal !== undefined && call.onAbort !== undefined) call.signal.removeEventListener('abort', call.onAbort)
    const cc = call.conn
    if (cc !== null) {
      if (!taken) cc.outstanding.delete(call.callId)
      if (cc.retired && cc.outstanding.size === 0) cc.connection.destroy()
    }
  }

  #onSent (call: OutboundCall, error: RpcError | undefined): void {
    if (call.state === CallState.SENDING) call.state = CallState.SENT
    // A cancel or timeout that arrived mid-send takes effect now that the
    // frame is whole; a refusal to send, now that the transfer is dropped.
    if (call.pendingError !== null) this.fail(call, call.pendingError)
    // Other write failures close the connection, whose close fails the call
    // with the connection's reason.
  }

  // The call's deadline passed (the deadline lists call this only for calls not finished).
  readonly #expire = (call: OutboundCall, timeoutMs: number): void => {
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
      if (call.state === CallState.SENDING) call.pendingError = error
      else this.fail(call, error)
    })
  }
}
