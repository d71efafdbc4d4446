/**
 * KRPC frames: sidecars of every size round-trip, malformed frames are
 * returned errors, the preamble check, and the server's negotiation refusals.
 */
import t, { type Test } from 'tap'
import fc from 'fast-check'
import assert from 'node:assert'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { encodeRemoteMethod, encodeRequestFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { ErrorStatusType, MAX_SIDECARS, NEGOTIATE_CALL_ID, ResponseHeaderType, headerSchema } from '../../codec/krpc/frames.js'
import { parseRequestFrame, parseResponseFrame, fastResponseFrame, parseResponseInto, parseResponseIntoGeneral, ResponseParts, type RequestFrame, type ResponseFrame } from '../../codec/krpc/parsed-frame.js'
import { requestFrameBytes, requestHeaderTail, responseFrameBytes, wireTimeout, writeRequestFrame, writeResponseFrame } from '../../codec/krpc/write-frame.js'
import { ClientNegotiation } from '../../codec/krpc/client-negotiation.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { ServerNegotiation, checkPreamble } from '../../codec/krpc/server-negotiation.js'
import { writeVarint } from '../../codec/varint.js'
import { hex, joinFrames, joinSlices, toHex } from '../helpers/bytes.js'
import { C_CONNECTION_CONTEXT, C_NEGOTIATE, C_SASL_INITIATE, PREAMBLE, S_NEGOTIATE } from '../helpers/golden.js'

const NegotiateType = headerSchema.type<Record<string, unknown>>('kudu.rpc.NegotiatePB')

/** A frame from raw header and body bytes: prefix, header varint, header, body varint, body, then `extra`. */
function rawFrame (header: Uint8Array, body: Uint8Array, extra: Uint8Array = new Uint8Array(0)): Buffer {
  const lengths = Buffer.alloc(10)
  const headerLen = lengths.subarray(0, writeVarint(lengths, 0, header.length))
  const bodyLen = Buffer.from(lengths.subarray(5, writeVarint(lengths, 5, body.length)))
  const content = Buffer.concat([Buffer.from(headerLen), header, bodyLen, body, extra])
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(content.length, 0)
  return Buffer.concat([prefix, content])
}

/** Frame with arbitrary bytes after the prefix (the prefix still counts them exactly). */
function prefixed (content: Uint8Array): Buffer {
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(content.length, 0)
  return Buffer.concat([prefix, content])
}

function request (frame: Buffer): RequestFrame {
  const parsed = parseRequestFrame(frame)
  if (parsed instanceof RpcError) throw parsed
  return parsed
}

function response (frame: Buffer): ResponseFrame {
  const parsed = parseResponseFrame(frame)
  if (parsed instanceof RpcError) throw parsed
  return parsed
}

function sync (step: NegotiationStep | Promise<NegotiationStep>): NegotiationStep {
  if (step instanceof Promise) throw new Error('expected a synchronous negotiation step')
  return step
}

function bytesOf (text: string): Buffer {
  return Buffer.from(text, 'latin1')
}

// ---------------------------------------------------------------------------
// Sidecars.

function roundTrip (t: Test, label: string, body: Uint8Array, sidecars: Uint8Array[]): void {
  const requestSlices = encodeRequestFrame({ callId: 3, remoteMethod: encodeRemoteMethod('s.S', 'M'), timeoutMs: 5, sidecars }, body)
  const req = request(joinSlices(requestSlices))
  t.equal(req.header.call_id, 3, `${label}: request call id`)
  t.ok(req.message.equals(body), `${label}: request message`)
  t.equal(req.sidecars.length, sidecars.length, `${label}: request sidecar count`)
  t.ok(req.sidecars.every((s, i) => s.equals(sidecars[i]!)), `${label}: request sidecars intact`)

  const res = response(joinSlices(encodeResponseFrame(3, false, body, sidecars)))
  t.equal(res.header.call_id, 3, `${label}: response call id`)
  t.ok(res.message.equals(body), `${label}: response message`)
  t.equal(res.sidecars.length, sidecars.length, `${label}: response sidecar count`)
  t.ok(res.sidecars.every((s, i) => s.equals(sidecars[i]!)), `${label}: response sidecars intact`)
}

t.test('sidecars round-trip', async t => {
  const body = hex('08 2a')
  roundTrip(t, 'one 0-byte sidecar', body, [new Uint8Array(0)])
  roundTrip(t, '0-byte sidecars around a small one', body, [new Uint8Array(0), bytesOf('x'), new Uint8Array(0)])
  roundTrip(t, 'small sidecars', body, [bytesOf('abc'), bytesOf('de')])
  roundTrip(t, 'empty body with sidecars', new Uint8Array(0), [bytesOf('abc'), bytesOf('de')])
  roundTrip(t, 'no sidecars', body, [])

  const zero = response(joinSlices(encodeResponseFrame(1, false, body, [new Uint8Array(0)])))
  t.same(zero.header.sidecar_offsets, [2], 'a 0-byte sidecar still has an offset')
  t.equal(zero.sidecars[0]!.length, 0)
})

t.test('multi-MiB sidecars (3 MiB + 2 MiB) are sent as their own slices and round-trip', async t => {
  const a = Buffer.alloc(3 * 1024 * 1024)
  const b = Buffer.alloc(2 * 1024 * 1024)
  for (let i = 0; i < a.length; i += 997) a[i] = i & 0xff
  for (let i = 0; i < b.length; i += 991) b[i] = (i >> 3) & 0xff
  const body = hex('08 01 10 02')

  const slices = encodeRequestFrame({ callId: 9, sidecars: [a, b] }, body)
  t.equal(slices.length, 3, 'head, then each large sidecar')
  t.equal(slices[1], a, 'the first sidecar is not copied')
  t.equal(slices[2], b, 'the second sidecar is not copied')
  const req = request(joinSlices(slices))
  t.same(req.header.sidecar_offsets, [4, 4 + a.length])
  t.ok(req.sidecars[0]!.equals(a))
  t.ok(req.sidecars[1]!.equals(b))
  t.ok(req.message.equals(body))

  const responseSlices = encodeResponseFrame(9, false, body, [a, b])
  t.equal(responseSlices.length, 3)
  const res = response(joinSlices(responseSlices))
  t.ok(res.sidecars[0]!.equals(a))
  t.ok(res.sidecars[1]!.equals(b))

  // A plain Uint8Array view into a larger ArrayBuffer keeps its own window.
  const backing = new Uint8Array(4 * 1024 * 1024)
  backing.fill(7)
  const view = backing.subarray(1024 * 1024, 3 * 1024 * 1024)
  view[0] = 1
  view[view.length - 1] = 2
  const viewSlices = encodeResponseFrame(1, false, body, [view])
  t.equal(viewSlices[1]!.buffer, backing.buffer, 'a Uint8Array sidecar is wrapped, not copied')
  const fromView = response(joinSlices(viewSlices))
  t.equal(fromView.sidecars[0]!.length, view.length)
  t.equal(fromView.sidecars[0]![0], 1)
  t.equal(fromView.sidecars[0]![view.length - 1], 2)
})

t.test('10,000 two-byte sidecars round-trip', async t => {
  t.equal(MAX_SIDECARS, 10_000)
  const sidecars: Buffer[] = []
  for (let i = 0; i < MAX_SIDECARS; i++) {
    const s = Buffer.alloc(2)
    s.writeUInt16BE(i, 0)
    sidecars.push(s)
  }
  const body = hex('08 05')
  const req = request(joinSlices(encodeRequestFrame({ callId: 1, sidecars }, body)))
  t.equal(req.sidecars.length, MAX_SIDECARS)
  t.equal(req.sidecars.filter((s, i) => s.length === 2 && s.readUInt16BE(0) === i).length, MAX_SIDECARS, 'every request sidecar in place')
  const res = response(joinSlices(encodeResponseFrame(1, false, body, sidecars)))
  t.equal(res.sidecars.length, MAX_SIDECARS)
  t.equal(res.sidecars.filter((s, i) => s.length === 2 && s.readUInt16BE(0) === i).length, MAX_SIDECARS, 'every response sidecar in place')
})

t.test('more than 10,000 sidecars are rejected', async t => {
  const sidecars = Array.from({ length: MAX_SIDECARS + 1 }, () => Buffer.from('ab'))
  t.throws(() => encodeRequestFrame({ callId: 1, sidecars }, new Uint8Array(0)), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => encodeResponseFrame(1, false, new Uint8Array(0), sidecars), { code: ErrorCode.INVALID_ARGUMENT })

  const offsets = Array.from({ length: MAX_SIDECARS + 1 }, (_, i) => i)
  const frame = rawFrame(ResponseHeaderType.encode({ call_id: 1, sidecar_offsets: offsets }), Buffer.alloc(MAX_SIDECARS + 1))
  const parsed = parseResponseFrame(frame)
  t.ok(parsed instanceof RpcError, 'a frame with 10,001 offsets is refused')
  t.equal((parsed as RpcError).code, ErrorCode.MALFORMED_FRAME)
})

// ---------------------------------------------------------------------------
// Malformed frames: returned, never thrown.

interface Case { name: string, frame: Buffer }

const BODY = hex('08 00 10 01 61 62 63 64 65') // 4-byte PB + "abc" + "de"

const responseCases: Case[] = [
  { name: 'decreasing sidecar offsets', frame: rawFrame(hex('08 07 18 07 18 04'), BODY) },
  { name: 'sidecar offset past the end', frame: rawFrame(hex('08 07 18 04 18 0a'), BODY) },
  { name: 'first sidecar offset past the end', frame: rawFrame(hex('08 07 18 64'), BODY) },
  { name: 'trailing bytes after the body', frame: rawFrame(hex('08 07 10 00'), hex('08 03'), hex('00')) },
  { name: 'prefix shorter than the frame', frame: Buffer.concat([hex('00 00 00 05 02 08 07 02 08 03')]) },
  { name: 'prefix longer than the frame', frame: Buffer.concat([hex('00 00 00 09 02 08 07 02 08 03')]) },
  { name: 'truncated header', frame: prefixed(hex('0a 08 07')) },
  { name: 'header varint runs out', frame: prefixed(hex('80')) },
  { name: 'header length varint over 32 bits', frame: prefixed(hex('ff ff ff ff ff 00')) },
  { name: 'no body length', frame: prefixed(hex('02 08 07')) },
  { name: 'bad body length varint', frame: prefixed(hex('02 08 07 ff ff ff ff 7f')) },
  { name: 'truncated body', frame: prefixed(hex('02 08 07 05 08 03')) },
  { name: 'empty frame', frame: hex('00 00 00 00') },
  { name: 'shorter than a prefix', frame: hex('00 00') },
  { name: 'missing required call_id', frame: rawFrame(hex('10 01'), hex('08 03')) },
  { name: 'bad varint in the header', frame: rawFrame(hex('08 ff ff ff ff ff ff ff ff ff ff'), hex('08 03')) },
  { name: 'truncated field in the header', frame: rawFrame(hex('08'), hex('08 03')) },
  { name: 'unsupported wire type in the header', frame: rawFrame(hex('08 01 0b'), hex('08 03')) }
]

const requestCases: Case[] = [
  { name: 'decreasing sidecar offsets', frame: rawFrame(hex('18 07 80 01 07 80 01 04'), BODY) },
  { name: 'sidecar offset past the end', frame: rawFrame(hex('18 07 80 01 04 80 01 0a'), BODY) },
  { name: 'trailing bytes after the body', frame: rawFrame(hex('18 00'), hex('08 03'), hex('00 00')) },
  { name: 'truncated header', frame: prefixed(hex('30 18 00')) },
  { name: 'header length varint over 32 bits', frame: prefixed(hex('80 80 80 80 10 00')) },
  { name: 'missing required call_id', frame: rawFrame(hex('50 90 4e'), hex('08 03')) },
  { name: 'remote_method missing method_name', frame: rawFrame(hex('18 00 32 03 0a 01 61'), hex('08 03')) },
  { name: 'bad varint in the header', frame: rawFrame(hex('18 80 80 80 80 80 80 80 80 80 80'), hex('08 03')) },
  { name: 'truncated remote_method', frame: rawFrame(hex('18 00 32 0a 0a 01 61'), hex('08 03')) }
]

function expectMalformed (t: Test, parse: (frame: Buffer) => unknown, cases: Case[], side: string): void {
  for (const { name, frame } of cases) {
    let result: unknown
    try {
      result = parse(frame)
    } catch (err) {
      t.fail(`${side} ${name}: threw ${(err as Error).message}`)
      continue
    }
    t.ok(result instanceof RpcError, `${side} ${name}: an error is returned`)
    t.equal((result as RpcError).code, ErrorCode.MALFORMED_FRAME, `${side} ${name}: RPC_ERR_MALFORMED_FRAME`)
  }
}

t.test('malformed response frames', async t => {
  expectMalformed(t, parseResponseFrame, responseCases, 'response')
})

t.test('malformed request frames', async t => {
  expectMalformed(t, parseRequestFrame, requestCases, 'request')
  // Cases caught before the header is read hold for requests too.
  const frameLevel = new Set(['prefix shorter than the frame', 'prefix longer than the frame', 'header varint runs out',
    'header length varint over 32 bits', 'no body length', 'bad body length varint', 'truncated body', 'empty frame',
    'shorter than a prefix'])
  const shared = responseCases.filter(c => frameLevel.has(c.name))
  t.equal(shared.length, frameLevel.size)
  expectMalformed(t, parseRequestFrame, shared, 'request')
})

t.test('legal edge cases of sidecar offsets', async t => {
  const equal = response(rawFrame(hex('08 07 18 04 18 04'), BODY))
  t.same(equal.sidecars.map(s => s.toString('latin1')), ['', 'abcde'], 'equal offsets make a 0-byte sidecar')
  const atEnd = response(rawFrame(hex('08 07 18 09'), BODY))
  t.same(atEnd.sidecars.map(s => s.toString('latin1')), [''], 'an offset at body_len is a 0-byte last sidecar')
  const atZero = response(rawFrame(hex('08 07 18 00'), BODY))
  t.equal(atZero.message.length, 0, 'offset 0: the main message is empty')
  t.equal(atZero.sidecars[0]!.length, BODY.length)
  const views = response(rawFrame(hex('08 07 18 04 18 07'), BODY))
  t.equal(views.sidecars[0]!.buffer, views.message.buffer, 'sidecars are views of the frame')
})

t.test('encoder guards', async t => {
  t.test('a timeout of 2^32 ms or more is refused as an RpcError or clamped', async t => {
    let result: Buffer[] | Error
    try {
      result = encodeRequestFrame({ callId: 1, timeoutMs: 2 ** 32 }, new Uint8Array(0))
    } catch (err) {
      result = err as Error
    }
    if (result instanceof Error) {
      t.ok(result instanceof RpcError, 'thrown error is an RpcError')
      t.equal((result as RpcError).code, ErrorCode.INVALID_ARGUMENT)
    } else {
      t.equal(request(joinSlices(result)).header.timeout_millis, 2 ** 32 - 1, 'clamped to the largest uint32')
    }
  })
  t.test('a feature flag outside uint32 never yields a corrupt frame', async t => {
    let result: Buffer[] | Error
    try {
      result = encodeRequestFrame({ callId: 1, requiredFeatureFlags: [-1] }, new Uint8Array(0))
    } catch (err) {
      result = err as Error
    }
    if (result instanceof Error) {
      t.equal((result as RpcError).code, ErrorCode.INVALID_ARGUMENT)
    } else {
      t.notOk(parseRequestFrame(joinSlices(result)) instanceof RpcError, 'the frame it wrote parses')
    }
  })
})

// ---------------------------------------------------------------------------
// Preamble.

t.test('checkPreamble', async t => {
  t.equal(checkPreamble(PREAMBLE), null, 'the KRPC preamble passes')
  const badMagic = checkPreamble(hex('68 72 70 64 09 00 00'))
  t.equal(badMagic?.code, ErrorCode.NEGOTIATION_FAILED, 'wrong magic')
  t.notMatch(badMagic?.message, /HTTP/)
  t.equal(checkPreamble(hex('00 00 00 00 00 00 00'))?.code, ErrorCode.NEGOTIATION_FAILED, 'zeros')
  for (const version of [0, 8, 10, 0xff]) {
    const error = checkPreamble(Buffer.from([0x68, 0x72, 0x70, 0x63, version, 0, 0]))
    t.equal(error?.code, ErrorCode.NEGOTIATION_FAILED, `version ${version}`)
  }
  for (const verb of ['GET / H', 'POST / ', 'HEAD / ', 'PUT / H', 'OPTIONS', 'DELETE ', 'CONNECT', 'PATCH /', 'TRACE /']) {
    const error = checkPreamble(Buffer.from(verb, 'latin1'))
    t.equal(error?.code, ErrorCode.NEGOTIATION_FAILED, `"${verb}" is refused`)
    t.match(error?.message, /HTTP client on the RPC port/, `"${verb}" is named as HTTP`)
  }
  t.not(checkPreamble(Buffer.from('GETX / ', 'latin1')), null, 'not a verb, not KRPC either')
})

// ---------------------------------------------------------------------------
// Negotiation refusals.

function negotiateFrame (body: Record<string, unknown>, callId = NEGOTIATE_CALL_ID): Buffer {
  return joinSlices(encodeRequestFrame({ callId }, NegotiateType.encode(body)))
}

function expectRefusal (t: Test, step: NegotiationStep, krpcCode: number): void {
  if (!t.ok(step.error instanceof RpcError, 'an error')) return
  t.equal(step.error?.code, ErrorCode.NEGOTIATION_FAILED)
  t.equal(step.error?.remote?.code, krpcCode, `krpcCode ${krpcCode}`)
  t.equal(step.error?.fatal, true)
  t.equal(step.done, undefined)
  const frames = joinFrames(step.send)
  t.equal(frames.length, 1, 'one error frame to send before closing')
  const frame = response(frames[0]!)
  t.equal(frame.header.call_id, NEGOTIATE_CALL_ID)
  t.equal(frame.header.is_error, true)
  const status = ErrorStatusType.decode(frame.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, krpcCode, 'the frame carries the code')
  t.type(status.message, 'string')
}

t.test('an authenticator that refuses', async t => {
  t.test('synchronously', async t => {
    const seen: string[] = []
    const server = new ServerNegotiation({ authenticate: (user, password) => { seen.push(`${user}:${password}`); return false } })
    sync(server.onFrame(C_NEGOTIATE))
    const step = sync(server.onFrame(C_SASL_INITIATE))
    expectRefusal(t, step, KrpcCode.FATAL_UNAUTHORIZED)
    t.same(seen, ['user:'])

    // The client reads the refusal as a fatal negotiation error.
    const client = new ClientNegotiation({ user: 'user' })
    client.start()
    client.onFrame(S_NEGOTIATE)
    const clientStep = client.onFrame(joinFrames(step.send)[0]!) as NegotiationStep
    t.equal(clientStep.error?.code, ErrorCode.NEGOTIATION_FAILED)
    t.equal(clientStep.error?.remote?.code, KrpcCode.FATAL_UNAUTHORIZED)
    t.equal(clientStep.done, undefined)
  })
  t.test('asynchronously', async t => {
    const server = new ServerNegotiation({ authenticate: async () => false })
    sync(server.onFrame(C_NEGOTIATE))
    const pending = server.onFrame(C_SASL_INITIATE)
    t.ok(pending instanceof Promise, 'an async authenticator makes the step async')
    expectRefusal(t, await pending, KrpcCode.FATAL_UNAUTHORIZED)
  })
  t.test('by throwing', async t => {
    const server = new ServerNegotiation({ authenticate: () => { throw new Error('database down') } })
    sync(server.onFrame(C_NEGOTIATE))
    expectRefusal(t, sync(server.onFrame(C_SASL_INITIATE)), KrpcCode.FATAL_UNAUTHORIZED)
  })
  t.test('by rejecting', async t => {
    const server = new ServerNegotiation({ authenticate: async () => { throw new Error('database down') } })
    sync(server.onFrame(C_NEGOTIATE))
    expectRefusal(t, await server.onFrame(C_SASL_INITIATE), KrpcCode.FATAL_UNAUTHORIZED)
  })
  t.test('an async acceptance completes', async t => {
    const server = new ServerNegotiation({ authenticate: async (user, password) => user === 'u' && password === 'p w' })
    sync(server.onFrame(C_NEGOTIATE))
    const token = Buffer.from('z\0u\0p w', 'latin1')
    const step = await server.onFrame(negotiateFrame({ step: 2, token, sasl_mechanisms: [{ mechanism: 'PLAIN' }] }))
    t.equal(step.error, undefined)
    t.equal(joinFrames(step.send).length, 1)
    const done = sync(server.onFrame(C_CONNECTION_CONTEXT))
    t.equal(done.done?.user, 'u', 'the authcid, not the authzid')
  })
})

t.test('a wrong call id during negotiation is FATAL_INVALID_RPC_HEADER', async t => {
  t.test('on the NEGOTIATE step', async t => {
    const server = new ServerNegotiation()
    expectRefusal(t, sync(server.onFrame(negotiateFrame({ step: 1, authn_types: [{ sasl: {} }] }, 5))), KrpcCode.FATAL_INVALID_RPC_HEADER)
  })
  t.test('on SASL_INITIATE', async t => {
    const server = new ServerNegotiation()
    sync(server.onFrame(C_NEGOTIATE))
    const token = Buffer.from('\0user\0', 'latin1')
    expectRefusal(t, sync(server.onFrame(negotiateFrame({ step: 2, token, sasl_mechanisms: [{ mechanism: 'PLAIN' }] }, 0))),
      KrpcCode.FATAL_INVALID_RPC_HEADER)
  })
  t.test('on the connection context', async t => {
    const server = new ServerNegotiation()
    sync(server.onFrame(C_NEGOTIATE))
    sync(server.onFrame(C_SASL_INITIATE))
    const context = request(C_CONNECTION_CONTEXT).message
    const wrong = joinSlices(encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, context))
    expectRefusal(t, sync(server.onFrame(wrong)), KrpcCode.FATAL_INVALID_RPC_HEADER)
  })
})

t.test('other negotiation refusals', async t => {
  t.test('SASL_INITIATE before NEGOTIATE', async t => {
    expectRefusal(t, sync(new ServerNegotiation().onFrame(C_SASL_INITIATE)), KrpcCode.FATAL_UNAUTHORIZED)
  })
  t.test('a mechanism other than PLAIN', async t => {
    const server = new ServerNegotiation()
    sync(server.onFrame(C_NEGOTIATE))
    expectRefusal(t, sync(server.onFrame(negotiateFrame({ step: 2, token: Buffer.from('\0u\0'), sasl_mechanisms: [{ mechanism: 'GSSAPI' }] }))),
      KrpcCode.FATAL_UNAUTHORIZED)
  })
  t.test('a PLAIN token without two NULs', async t => {
    const server = new ServerNegotiation()
    sync(server.onFrame(C_NEGOTIATE))
    expectRefusal(t, sync(server.onFrame(negotiateFrame({ step: 2, token: Buffer.from('\0user'), sasl_mechanisms: [{ mechanism: 'PLAIN' }] }))),
      KrpcCode.FATAL_UNAUTHORIZED)
  })
  t.test('a NegotiatePB that does not parse', async t => {
    const bad = joinSlices(encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, hex('10')))
    expectRefusal(t, sync(new ServerNegotiation().onFrame(bad)), KrpcCode.FATAL_DESERIALIZING_REQUEST)
  })
  t.test('a frame after a refusal', async t => {
    const server = new ServerNegotiation()
    sync(server.onFrame(C_SASL_INITIATE))
    const again = sync(server.onFrame(C_NEGOTIATE))
    t.ok(again.error, 'the negotiation stays failed')
  })
  t.test('a malformed frame is an error without a reply', async t => {
    const step = sync(new ServerNegotiation().onFrame(hex('00 00 00 02 05 00')))
    t.equal(step.error?.code, ErrorCode.MALFORMED_FRAME)
    t.equal(step.send, undefined)
  })
})

t.test('feature negotiation is a set intersection', async t => {
  const cases: Array<[number[], number[]]> = [[[1, 2, 99], [1]], [[], []], [[2, 3], []], [[1], [1]]]
  for (const [offered, expected] of cases) {
    const server = new ServerNegotiation()
    const step = sync(server.onFrame(negotiateFrame({ step: 1, supported_features: offered, authn_types: [{ sasl: {} }] })))
    t.equal(step.error, undefined)
    const reply = NegotiateType.decode(response(joinFrames(step.send)[0]!).message)
    if (reply instanceof RpcError) throw reply
    t.same(reply.supported_features, expected, `client offering [${offered.join(',')}] gets [${expected.join(',')}]`)
    t.same(reply.authn_types, [{ sasl: {} }], 'SASL chosen')
    t.same(reply.sasl_mechanisms, [{ mechanism: 'PLAIN' }])
    sync(server.onFrame(C_SASL_INITIATE))
    const done = sync(server.onFrame(C_CONNECTION_CONTEXT))
    t.same([...(done.done?.features ?? [])], expected, 'the server records the same set')
  }

  // A client that names no authentication type means SASL.
  const legacy = sync(new ServerNegotiation().onFrame(negotiateFrame({ step: 1, supported_features: [1] })))
  t.equal(legacy.error, undefined, 'no authn_types is accepted as SASL')

  // The client intersects too: a server offering [1, 2, 99] leaves the client with [1].
  const client = new ClientNegotiation()
  client.start()
  const serverReply = joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({
    step: 1, supported_features: [1, 2, 99], sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }]
  })))
  t.equal((client.onFrame(serverReply) as NegotiationStep).error, undefined)
  const finish = client.onFrame(joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 0 })))) as NegotiationStep
  t.same([...(finish.done?.features ?? [])], [1])
  t.equal(finish.done?.user, 'nyala', 'the default user')
  t.equal(toHex(NegotiateType.encode({ step: 0 })), '10 00')
})

t.test('client negotiation refusals', async t => {
  const respond = (body: Record<string, unknown>, callId = NEGOTIATE_CALL_ID): Buffer =>
    joinSlices(encodeResponseFrame(callId, undefined, NegotiateType.encode(body)))
  const fresh = (): { onFrame: (frame: Buffer) => NegotiationStep } => {
    const c = new ClientNegotiation()
    c.start()
    return { onFrame: (frame) => c.onFrame(frame) as NegotiationStep }
  }
  t.equal(fresh().onFrame(respond({ step: 1, sasl_mechanisms: [{ mechanism: 'GSSAPI' }] })).error?.code, ErrorCode.NEGOTIATION_FAILED, 'no PLAIN')
  t.equal(fresh().onFrame(respond({ step: 0 })).error?.code, ErrorCode.NEGOTIATION_FAILED, 'SASL_SUCCESS first')
  t.equal(fresh().onFrame(respond({ step: 1, sasl_mechanisms: [{ mechanism: 'PLAIN' }] }, 0)).error?.code,
    ErrorCode.NEGOTIATION_FAILED, 'wrong call id')
  t.equal(fresh().onFrame(hex('00 00 00 01 00')).error?.code, ErrorCode.MALFORMED_FRAME, 'malformed frame')
})

// BUG (left failing on purpose): server-negotiation.ts tests `authn.sasl !== undefined`, but
// protobufjs gives every decoded oneof member a prototype default of null, so a
// decoded AuthenticationTypePB always looks like SASL.
t.test('authentication types other than SASL are refused', async t => {
  t.test('server: a client offering only token (or certificate, or jwt)', async t => {
    for (const offered of [[{ token: {} }], [{ certificate: {} }], [{ jwt: {} }], [{ token: {} }, { jwt: {} }]]) {
      const step = sync(new ServerNegotiation().onFrame(negotiateFrame({ step: 1, supported_features: [1], authn_types: offered })))
      t.equal(step.error?.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, `offering ${JSON.stringify(offered)} is FATAL_UNAUTHORIZED`)
    }
    const mixed = sync(new ServerNegotiation().onFrame(negotiateFrame({ step: 1, authn_types: [{ token: {} }, { sasl: {} }] })))
    t.equal(mixed.error, undefined, 'SASL among others is accepted')
  })
  t.test('client: a server that chose token', async t => {
    const client = new ClientNegotiation()
    client.start()
    const reply = joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({
      step: 1, sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ token: {} }]
    })))
    const step = client.onFrame(reply) as NegotiationStep
    t.equal(step.error?.code, ErrorCode.NEGOTIATION_FAILED, 'the client refuses')
    t.equal(step.send, undefined, 'and sends no SASL_INITIATE')
  })
})

t.test('writeResponseFrame writes, in place, the bytes encodeResponseFrame encodes', async t => {
  for (const callId of [0, 1, 127, 128, 16_383, 16_384, 0x7fffffff, -1, -33]) {
    for (const bodyBytes of [0, 1, 2, 32, 33, 127, 128, 300]) {
      const body = Buffer.alloc(bodyBytes)
      for (let i = 0; i < bodyBytes; i++) body[i] = (i * 7 + callId) & 0xff
      const expected = Buffer.concat(encodeResponseFrame(callId, false, body))
      const size = responseFrameBytes(callId, bodyBytes)
      t.equal(size, expected.length, `size of call ${callId}, body ${bodyBytes}`)
      const out = Buffer.alloc(size + 10, 0xee)
      const end = writeResponseFrame(out, 5, callId, body)
      t.equal(end, 5 + size)
      t.ok(out.subarray(5, end).equals(expected), `bytes of call ${callId}, body ${bodyBytes}`)
      t.equal(out[4], 0xee, 'nothing written before')
      t.equal(out[end], 0xee, 'nothing written after')
    }
  }
})

t.test('writeRequestFrame writes, in place, the bytes encodeRequestFrame encodes', async t => {
  const methods = [encodeRemoteMethod('nyala.demo.CalculatorService', 'Add'), encodeRemoteMethod('s', 'm'.repeat(40))]
  for (const remoteMethod of methods) {
    for (const callId of [0, 127, 128, 0x7fffffff, -3]) {
      for (const timeoutMs of [undefined, 0, 1, 127, 128, 30_000, 2 ** 40]) {
        for (const bodyBytes of [0, 5, 33, 200]) {
          const body = Buffer.alloc(bodyBytes, callId & 0xff)
          const expected = Buffer.concat(encodeRequestFrame({ callId, remoteMethod, timeoutMs }, body))
          const timeout = wireTimeout(timeoutMs)
          const tail = requestHeaderTail(remoteMethod, timeout)
          const size = requestFrameBytes(callId, tail, bodyBytes)
          const out = Buffer.alloc(size + 3, 0xee)
          const end = writeRequestFrame(out, 3, callId, tail, body)
          if (size !== expected.length || end !== 3 + size || !out.subarray(3, end).equals(expected) || out[2] !== 0xee) {
            t.fail(`call ${callId}, timeout ${timeoutMs}, body ${bodyBytes}: ${out.subarray(3, end).toString('hex')} != ${expected.toString('hex')}`)
            return
          }
        }
      }
    }
  }
  t.pass('every combination byte-identical')
})

t.test('the in-place writers take the body as the first bodyBytes of a longer scratch buffer, Buffer or not', async t => {
  for (const bodyBytes of [0, 3, 8, 9, 40]) {
    for (const scratch of [Buffer.alloc(64, 0x5a), new Uint8Array(64).fill(0x5a)]) {
      for (let i = 0; i < bodyBytes; i++) scratch[i] = i + 1
      const body = Buffer.from(scratch.subarray(0, bodyBytes))
      const response = Buffer.alloc(responseFrameBytes(7, bodyBytes))
      writeResponseFrame(response, 0, 7, scratch, bodyBytes)
      t.ok(response.equals(Buffer.concat(encodeResponseFrame(7, false, body))), `response, body ${bodyBytes}, ${Buffer.isBuffer(scratch) ? 'Buffer' : 'Uint8Array'}`)
      const remoteMethod = encodeRemoteMethod('s', 'm')
      const tail = requestHeaderTail(remoteMethod, 100)
      const request = Buffer.alloc(requestFrameBytes(7, tail, bodyBytes))
      writeRequestFrame(request, 0, 7, tail, scratch, bodyBytes)
      t.ok(request.equals(Buffer.concat(encodeRequestFrame({ callId: 7, remoteMethod, timeoutMs: 100 }, body))), `request, body ${bodyBytes}`)
    }
  }
})

t.test('parseResponseInto\'s fast path answers as the general path does: the same parts or the same refusal', async t => {
  const answer = (buf: Buffer, start: number, end: number, parse: typeof parseResponseInto): unknown => {
    const parts = new ResponseParts()
    const error = parse(buf, start, end, parts)
    if (error !== null) return { error: error.message }
    return {
      callId: parts.callId,
      isError: parts.isError,
      sidecarOffsets: parts.sidecarOffsets,
      message: buf.subarray(parts.messageStart, parts.messageEnd).toString('hex'),
      messageStart: parts.messageStart,
      sidecars: parts.sidecars.map((s) => s.toString('hex'))
    }
  }
  // Real frames (call ids of every varint length, bodies of 1- and 2-byte
  // lengths and beyond, sidecars or not), then bytes flipped, cut or added.
  const frame = fc.record({
    callId: fc.oneof(fc.integer({ min: 0, max: 300 }), fc.integer({ min: 0, max: 0x7fffffff }), fc.constantFrom(127, 128, 16383, 16384, 0x1fffff, 0x200000, 0xfffffff, 0x10000000, 0x7fffffff)),
    isError: fc.boolean(),
    body: fc.oneof(fc.uint8Array({ maxLength: 20 }), fc.uint8Array({ minLength: 120, maxLength: 140 }), fc.uint8Array({ minLength: 16380, maxLength: 16390 })),
    sidecars: fc.oneof(fc.constant(undefined), fc.array(fc.uint8Array({ maxLength: 8 }), { maxLength: 3 }))
  })
  const edit = fc.oneof(
    fc.constant(null),
    fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })).map(([at, v]) => (b: Buffer) => { const c = Buffer.from(b); if (c.length > 0) c[at % c.length] = v; return c }),
    fc.nat().map((n) => (b: Buffer) => b.subarray(0, n % (b.length + 1))),
    fc.uint8Array({ minLength: 1, maxLength: 4 }).map((extra) => (b: Buffer) => Buffer.concat([b, extra]))
  )
  let fast = 0
  fc.assert(fc.property(frame, edit, fc.uint8Array({ maxLength: 6 }), fc.uint8Array({ maxLength: 6 }), (f, change, before, after) => {
    const whole = Buffer.concat(encodeResponseFrame(f.callId, f.isError, f.body, f.sidecars))
    const bytes = change === null ? whole : change(whole)
    // The frame inside a larger read, as the decoder hands it on.
    const buf = Buffer.concat([before, bytes, after])
    const start = before.length
    const end = start + bytes.length
    assert.deepStrictEqual(answer(buf, start, end, parseResponseInto), answer(buf, start, end, parseResponseIntoGeneral))
    // The fast path is not a bystander: it takes every unedited frame of its shape.
    if (change === null && f.sidecars === undefined && f.body.length < 0x4000) {
      assert.ok(fastResponseFrame(buf, start, end, new ResponseParts()), 'taken by the fast path')
      fast++
    }
  }), { numRuns: 3000 })
  // And random bytes.
  fc.assert(fc.property(fc.uint8Array({ maxLength: 40 }), (bytes) => {
    const buf = Buffer.from(bytes)
    assert.deepStrictEqual(answer(buf, 0, buf.length, parseResponseInto), answer(buf, 0, buf.length, parseResponseIntoGeneral))
  }), { numRuns: 2000 })
  t.ok(fast > 100, `${fast} frames went the fast path`)
})
