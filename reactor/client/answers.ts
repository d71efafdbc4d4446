import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { FINISHED, type CallConnection, type PendingCall } from './pending-call.js'
import type { PushHub } from './pushes.js'

/** What matching answers needs of the client (its engine). */
export interface AnswerOwner<Req, Res> {
  readonly protocol: ClientProtocol<Req, Res>
  readonly inOrder: boolean
  readonly isPush: ((buf: Buffer, start: number, end: number) => boolean) | undefined
  readonly maxStreamParts: number
  /** The protocol can make calls with `maybe` answers (it has `answerOf`): only then are quiet calls looked for. */
  readonly quietAnswers: boolean
  readonly pushes: PushHub
  /** `taken`: the call is out of its connection's id table already. */
  succeed: (call: PendingCall<Req, Res>, response: Res, taken?: boolean) => void
  fail: (call: PendingCall<Req, Res>, error: RpcError) => void
  /** The connection must not take new calls (a fatal remote error). */
  retire: (cc: CallConnection<Req, Res>) => void
}

/**
 * One answer frame (or push) read on `cc`: matched to its call (by id, or
 * the next in order) and settled. Returns false once the connection is
 * failed (the frames after it are not read).
 */
export function onAnswer<Req, Res> (engine: AnswerOwner<Req, Res>, cc: CallConnection<Req, Res>, buf: Buffer, start: number, end: number): boolean {
  cc.liveness?.heard()
  const isPush = engine.isPush
  if (isPush !== undefined && isPush(buf, start, end)) return onPush(engine, cc, buf, start, end)
  const protocol = engine.protocol
  let call: PendingCall<Req, Res> | undefined
  if (engine.inOrder) {
    call = cc.inOrder.shift()
    if (call === undefined) return broken(cc, unexpected(protocol.name, cc.endpoint))
  } else {
    const id = protocol.answerId!(buf, start, end, cc.endpoint)
    if (typeof id !== 'number') return broken(cc, id)
    // Out of the table at once (one probe): every path below finishes it.
    call = cc.byId.take(id | 0)
    // Unknown, timed out or cancelled: dropped (a host being probed that answers a call given up on is alive).
    if (call === undefined) {
      cc.balancer.heardFrom(cc.slot)
      return true
    }
    if (engine.quietAnswers && cc.quiet.length > 0) settleQuietBefore(engine, cc, call.seq)
  }
  // An answer, whatever it says, is the host alive (outlier ejection).
  cc.balancer.callSucceeded(cc.slot)
  if (call.answer === 'stream') return onPart(engine, cc, call, buf, start, end)
  const result = protocol.decodeAnswer(call.request, buf, start, end, call.data, cc.endpoint)
  if (result instanceof RpcError) return onError(engine, cc, call, result)
  engine.succeed(call, result, !engine.inOrder)
  return true
}

// The call's answer is an error (out of line: the per-answer path above is inlined into the reader's).
function onError<Req, Res> (engine: AnswerOwner<Req, Res>, cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>, result: RpcError): boolean {
  if (result.remote === undefined) {
    if (result.fatal) {
      // Garbage: the stream can no longer be trusted.
      engine.fail(call, result)
      return broken(cc, result)
    }
  } else if (result.remote.fatal) {
    // The peer says this connection must not be reused: new calls open another.
    engine.retire(cc)
  }
  engine.fail(call, result)
  return true
}

// One part of `call`'s streamed answer; the call was taken off its
// connection's queue (or table) and goes back unless the stream ended.
function onPart<Req, Res> (engine: AnswerOwner<Req, Res>, cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>, buf: Buffer, start: number, end: number): boolean {
  const result = engine.protocol.decodePart!(call.request, buf, start, end)
  if (result instanceof RpcError) {
    // The stream ends with the error.
    engine.fail(call, result)
    return result.remote === undefined && result.fatal ? broken(cc, result) : true
  }
  if (call.state === FINISHED) {
    // Settled already (deadline, abort; in-order only, as a settled call
    // leaves the id table): its parts are read to find where it ends.
    if (!result.last) cc.inOrder.unshift(call)
    return true
  }
  const parts = call.parts ?? (call.parts = [])
  if (result.value !== undefined) {
    const max = engine.maxStreamParts
    if (parts.length >= max) {
      const name = engine.protocol.name
      engine.fail(call, new RpcError(ErrorCode.QUEUE_FULL, `${name} call to ${cc.endpoint}: its streamed answer went over ${max} parts (maxStreamParts)`))
      return broken(cc, new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${cc.endpoint} closed: a ${name} streamed answer went over maxStreamParts, and the rest of it cannot be told from the answers after it`))
    }
    parts.push(result.value)
  }
  if (result.last) {
    engine.succeed(call, parts as Res)
    return true
  }
  if (engine.inOrder) cc.inOrder.unshift(call)
  else cc.byId.set(call.id | 0, call)
  return true
}

// A push: to every handler, then to every iterator.
function onPush<Req, Res> (engine: AnswerOwner<Req, Res>, cc: CallConnection<Req, Res>, buf: Buffer, start: number, end: number): boolean {
  const decodePush = engine.protocol.decodePush
  const push = decodePush === undefined ? Buffer.from(buf.subarray(start, end)) : decodePush(buf, start, end)
  if (push instanceof RpcError) return push.remote === undefined && push.fatal ? broken(cc, push) : true
  engine.pushes.push(push, cc.pushInfo, end - start)
  return !cc.closed
}

// An answer to the request written `seq`-th arrived: the quiet requests written before it were processed without an answer.
function settleQuietBefore<Req, Res> (engine: AnswerOwner<Req, Res>, cc: CallConnection<Req, Res>, seq: number): void {
  const quiet = cc.quiet
  for (let front = quiet.peekFront(); front !== undefined && front.seq <= seq; front = quiet.peekFront()) {
    quiet.shift()
    if (front.seq === seq || front.state === FINISHED) continue
    if (cc.byId.get(front.id | 0) === front) cc.byId.delete(front.id | 0)
    engine.succeed(front, engine.protocol.silentResult!(front.request))
  }
}

function unexpected (name: string, endpoint: string): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, `${name} answer from ${endpoint} with no request waiting for it`)
}

function broken<Req, Res> (cc: CallConnection<Req, Res>, error: RpcError): false {
  cc.connection.destroy(error)
  return false
}
