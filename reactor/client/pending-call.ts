import type { AnswerKind } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { TimerHandle } from '../../scheduling/clock.js'
import { NO_DEADLINE, type Stamp } from '../../scheduling/deadline-lists.js'
import type { OutboundTransfer } from '../../transport/transfer-queue.js'
import type { PeerConnection } from './peer-connection.js'

/**
 * How a call made with a callback ends: with an error, or with null and the
 * response. Called exactly once, never before the call that made it has
 * returned (Kudu's `Proxy::AsyncRequest` callback).
 */
export type Callback<Res> = (error: RpcError | null, response?: Res) => void

/** How a call that fails is told: `sent`, its bytes may have reached the peer; `streamed`, part of its answer had arrived. */
export type Reject = (error: RpcError, sent: boolean, streamed?: boolean) => void

// Where a call is, in this order (FINISHED from any of them). Only QUEUED
// calls (and calls on a connection that never connected) are certainly not
// run by the peer.
/** Waiting on its connection: connect, set-up, or the transfer queue. */
export const QUEUED = 0
/** Bytes handed to the socket, some of the caller's buffers still referenced. */
export const SENDING = 1
/** Written whole. */
export const SENT = 2
/** Settled. */
export const FINISHED = 3

/**
 * One attempt of a call, from the client's side. It settles exactly once
 * (`ClientEngine.succeed` or `fail`), whatever happens first: answer,
 * deadline, abort, connection failure or close.
 *
 * A plain object made by `newPendingCall`, not a class instance: V8
 * allocates an object literal in line wherever it is made, while a `new`
 * past its inlining budget goes through the generic construct stub. The
 * call is its own transfer (the transfer-queue hooks are shared functions),
 * so a call costs no closure.
 */
export interface PendingCall<Req, Res> extends OutboundTransfer {
  state: number
  slices: Buffer[]
  bytes: number
  readonly request: Req
  /** The call's protocol data (`ClientProtocol` hooks get it). */
  readonly data: unknown
  readonly answer: AnswerKind
  id: number
  /** Order of writing on its connection. */
  seq: number
  conn: CallConnection<Req, Res> | null
  stamp: Stamp<PendingCall<Req, Res>>
  /** Its own deadline timer, when its timeout shares no deadline list. */
  timer: TimerHandle | null
  readonly timeoutMs: number
  /** `stream` answers: the values gathered, from the first part on (null: no part yet). */
  parts: unknown[] | null
  readonly resolve: (response: Res) => void
  readonly reject: Reject
  /** A callback-form call: settled through this instead of resolve/reject. */
  readonly callback: Callback<Res> | null
  signal: AbortSignal | undefined
  onAbort: (() => void) | undefined
  /**
   * Why it ends once the transport is done with its transfer: a cancel or
   * deadline that came while SENDING (the frame is finished first, and
   * the caller's buffers stay untouched until then), or the protocol's
   * refusal to send it (`beforeSend`).
   */
  pendingError: RpcError | null
  readonly beforeWrite: (this: PendingCall<Req, Res>) => boolean
  readonly onSent: (this: PendingCall<Req, Res>, error: RpcError | undefined) => void
}

/** A connection of calls like these. */
export type CallConnection<Req, Res> = PeerConnection<PendingCall<Req, Res>>

/** The slices of a call not encoded yet, or written. */
export const NO_SLICES: Buffer[] = []

/** A new call, QUEUED on `conn`; it settles through `callback` when not null, else through `resolve` or `reject`. */
export function newPendingCall<Req, Res> (request: Req, data: unknown, answer: AnswerKind, conn: CallConnection<Req, Res> | null, timeoutMs: number,
  resolve: (response: Res) => void, reject: Reject, callback: Callback<Res> | null, signal: AbortSignal | undefined): PendingCall<Req, Res> {
  return {
    state: QUEUED,
    slices: NO_SLICES,
    bytes: 0,
    request,
    data,
    answer,
    id: 0,
    seq: 0,
    conn,
    stamp: NO_DEADLINE,
    timer: null,
    timeoutMs,
    parts: null,
    resolve,
    reject,
    callback,
    signal,
    onAbort: undefined,
    pendingError: null,
    beforeWrite: callBeforeWrite as PendingCall<Req, Res>['beforeWrite'],
    onSent: callOnSent as PendingCall<Req, Res>['onSent']
  }
}

function callBeforeWrite (this: PendingCall<unknown, unknown>): boolean {
  const cc = this.conn
  // In-order calls are always written: their place in the answer order is taken.
  if (this.state === FINISHED) return cc?.inOrderMatching === true
  if (this.pendingError !== null) return false
  const check = cc?.owner.beforeSend
  if (check !== undefined) {
    const refusal = check(this, cc!.session)
    if (refusal !== undefined) {
      // Known only once the set-up is done: fail locally, never send.
      this.pendingError = refusal
      return false
    }
  }
  if (this.state === QUEUED) this.state = SENDING
  return true
}

function callOnSent (this: PendingCall<unknown, unknown>, error: RpcError | undefined): void {
  this.slices = NO_SLICES
  if (error === undefined && this.state === SENDING) this.state = SENT
  // A cancel or deadline that arrived mid-send takes effect now that the
  // frame is whole; a refusal to send, now that the transfer is dropped.
  // Other write failures close the connection, whose close fails the call.
  if (this.pendingError !== null && this.state !== FINISHED) this.conn?.owner.fail(this, this.pendingError)
}


/**
 * Calls `callback`. Its exception belongs to its caller, not to the read or
 * timer that settled the call: it is rethrown from setImmediate, the client
 * left whole. (Not process.nextTick: a tick that throws at the end of an
 * `onread` callback leaves Node's reads of that socket stopped.)
 */
export function deliver<Res> (callback: Callback<Res>, error: RpcError | null, response: Res | undefined): void {
  try {
    callback(error, response)
  } catch (err) {
    setImmediate(rethrow, err)
  }
}

function rethrow (err: unknown): never {
  throw err
}

/**
 * A call that failed before it was made: a promise rejects, a callback is
 * called from setImmediate (not a tick: a chain that re-issues on every
 * failure must not starve I/O).
 */
export function failEarly<Res> (error: RpcError, reject: Reject, callback: Callback<Res> | null): void {
  if (callback === null) reject(error, false)
  else setImmediate(deliver, callback, error, undefined)
}

/** An encoder's or a hook's throw as the call's error (unsent). */
export function invalid (err: unknown): RpcError {
  if (err instanceof RpcError) return err
  return new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot encode the request: ${(err as Error).message}`, { cause: err })
}
