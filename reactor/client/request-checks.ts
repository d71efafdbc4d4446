/**
 * What is asked of a call's request before a connection is chosen: the
 * protocol's `check`, and its `answerOf` (the kind of answer the request
 * gets), each refused as the call's error rather than thrown.
 */
import type { AnswerKind, ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { invalid } from './pending-call.js'

/** The protocol's check of a request: its throw as the call's error, or null. */
export function checkRequest<Req> (protocol: ClientProtocol<Req, unknown>, request: Req, data: unknown): RpcError | null {
  try {
    protocol.check!(request, data)
    return null
  } catch (err) {
    return invalid(err)
  }
}

/** The protocol's `answerOf` for `request` (`inOrder`: the protocol matches answers in order), or why the call cannot be made. */
export function answerOf<Req> (protocol: ClientProtocol<Req, unknown>, inOrder: boolean, request: Req): AnswerKind | RpcError {
  let answer: AnswerKind
  try {
    answer = protocol.answerOf!(request) ?? 'yes'
  } catch (err) {
    return invalid(err)
  }
  if (answer === 'yes') return answer
  return answerProblem(protocol, inOrder, answer) ?? answer
}

// Why `answerOf` said something this protocol or client cannot do, or null.
function answerProblem<Req> (protocol: ClientProtocol<Req, unknown>, inOrder: boolean, answer: AnswerKind): RpcError | null {
  switch (answer) {
    case 'maybe':
      return inOrder ? new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: 'maybe' answers need 'id' matching`) : null
    case 'stream':
      return protocol.decodePart === undefined ? new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: 'stream' answers need decodePart`) : null
    case 'no':
      return null
    default:
      return new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: answerOf said ${String(answer)}, not yes, maybe, no or stream`)
  }
}
