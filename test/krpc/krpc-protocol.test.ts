// KRPC's refusals in its own words (reactor/krpc/protocol.ts): each reason's
// code, and a handler's own code with only that code's name stripped from
// its message (a thread-mode 'EACCES: denied' once lost its 'EACCES: ').
import t from 'tap'
import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import { parseResponseFrame } from '../../codec/krpc/parsed-frame.js'
import type { RefusalReason } from '../../codec/protocol.js'
import { KrpcServerProtocol } from '../../reactor/krpc/protocol.js'

const protocol = new KrpcServerProtocol()
const head = { service: 's', method: 'm', callId: 42, data: undefined }

function status (reason: RefusalReason, message: string, detail?: unknown): { code: number, message: string, flags: number[] | undefined } {
  const slices = protocol.refusal(head, reason, message, detail)!
  const frame = parseResponseFrame(Buffer.concat(slices))
  if (frame instanceof Error) throw frame
  t.equal(frame.header.call_id, 42)
  t.equal(frame.header.is_error, true)
  const s = ErrorStatusType.decodeRange(frame.frame, frame.messageStart, frame.messageEnd) as { code: number, message: string, unsupported_feature_flags?: number[] }
  return { code: s.code, message: s.message, flags: s.unsupported_feature_flags?.length === 0 ? undefined : s.unsupported_feature_flags }
}

t.test('every refusal reason has its KRPC code', async (t) => {
  const codes: Record<RefusalReason, number> = {
    busy: KrpcCode.ERROR_SERVER_TOO_BUSY,
    expired: KrpcCode.ERROR_SERVER_TOO_BUSY,
    // Answered only when the client set no timeout of its own (see deadline-answer.test.ts).
    'timed-out': KrpcCode.ERROR_SERVER_TOO_BUSY,
    shutdown: KrpcCode.FATAL_SERVER_SHUTTING_DOWN,
    unavailable: KrpcCode.ERROR_UNAVAILABLE,
    'no-service': KrpcCode.ERROR_NO_SUCH_SERVICE,
    'no-method': KrpcCode.ERROR_NO_SUCH_METHOD,
    invalid: KrpcCode.ERROR_INVALID_REQUEST,
    failed: KrpcCode.ERROR_APPLICATION,
    abandoned: KrpcCode.ERROR_APPLICATION
  }
  for (const [reason, code] of Object.entries(codes)) t.equal(status(reason as RefusalReason, 'why').code, code, reason)
  t.same(status('invalid', 'unsupported feature flags', [7, 9]).flags, [7, 9], 'unsupported flags travel with invalid')
})

t.test('a handler\'s own code answers with its message, only that code\'s name stripped', async (t) => {
  t.same(status('failed', 'ERROR_SERVER_TOO_BUSY: try later', krpcError(KrpcCode.ERROR_SERVER_TOO_BUSY, 'ERROR_SERVER_TOO_BUSY: try later')),
    { code: KrpcCode.ERROR_SERVER_TOO_BUSY, message: 'try later', flags: undefined })
  t.same(status('failed', 'EACCES: denied', krpcError(KrpcCode.ERROR_APPLICATION, 'EACCES: denied')),
    { code: KrpcCode.ERROR_APPLICATION, message: 'EACCES: denied', flags: undefined }, 'another prefix is part of the message')
  t.same(status('failed', 'plain', new Error('plain')), { code: KrpcCode.ERROR_APPLICATION, message: 'plain', flags: undefined })
})
