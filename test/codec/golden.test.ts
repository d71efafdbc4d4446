/**
 * Golden bytes: the byte-exact transcript of test/helpers/golden.ts (the
 * frames docs/wire-format.md annotates), produced by the encoders and the
 * negotiation state machines, and read back by the decoders.
 */
import t from 'tap'
import fc from 'fast-check'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { encodeErrorFrame, encodeRemoteMethod, encodeRequestFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { ErrorStatusType, KRPC_PREAMBLE, RequestHeaderType, ResponseHeaderType, headerSchema } from '../../codec/krpc/frames.js'
import { parseRequestFrame, parseResponseFrame, splitFrame, type RequestFrame, type ResponseFrame } from '../../codec/krpc/parsed-frame.js'
import { ClientNegotiation } from '../../codec/krpc/client-negotiation.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { ServerNegotiation, checkPreamble } from '../../codec/krpc/server-negotiation.js'
import { decodeRequestHeader, decodeResponseHeader, type RequestHeader, type ResponseHeader } from '../../codec/krpc/header-decoder.js'
import { ProtoSchema } from '../../codec/protobuf/schema.js'
import { int32Bytes, writeInt32 } from '../../codec/varint.js'
import { hex, joinFrames, joinSlices, toHex } from '../helpers/bytes.js'

import {
  C_ADD, C_CONNECTION_CONTEXT, C_NEGOTIATE, C_SASL_INITIATE, PREAMBLE, S_ADD_RESPONSE, S_NEGOTIATE, S_SASL_SUCCESS,
  S_TOO_BUSY, S_TWO_SIDECARS
} from '../helpers/golden.js'

const NegotiateType = headerSchema.type<Record<string, unknown>>('kudu.rpc.NegotiatePB')
const ConnectionContextType = headerSchema.type<Record<string, unknown>>('kudu.rpc.ConnectionContextPB')

function sync (step: NegotiationStep | Promise<NegotiationStep>): NegotiationStep {
  if (step instanceof Promise) throw new Error('expected a synchronous negotiation step')
  return step
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

function ok<T> (value: T | RpcError): T {
  if (value instanceof RpcError) throw value
  return value
}

/** A decoded protobufjs message with its empty repeated fields left out, for comparing with `t.same`. */
function compact (message: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(message)) {
    // Unset repeated and bytes fields: decoded messages hold them as [] and an empty Buffer.
    if ((Array.isArray(value) || value instanceof Uint8Array) && value.length === 0) continue
    out[key] = value
  }
  return out
}

function own (object: object, key: string): boolean {
  return Object.prototype.hasOwnProperty.call(object, key)
}

t.test('sanity: the transcript lengths agree with their prefixes', async t => {
  for (const frame of [C_NEGOTIATE, S_NEGOTIATE, C_SASL_INITIATE, S_SASL_SUCCESS, C_CONNECTION_CONTEXT, C_ADD,
    S_ADD_RESPONSE, S_TOO_BUSY, S_TWO_SIDECARS]) {
    t.equal(frame.readUInt32BE(0), frame.length - 4, toHex(frame.subarray(0, 8)))
  }
  t.equal(C_ADD.length, 0x35 + 4)
  t.same(KRPC_PREAMBLE, PREAMBLE)
  t.equal(checkPreamble(PREAMBLE), null)
})

t.test('client negotiation writes the transcript bytes', async t => {
  const client = new ClientNegotiation({ user: 'user' })
  const start = client.start()
  t.equal(start.length, 2, 'preamble and NEGOTIATE')
  t.same(joinFrames(start).map(toHex), [toHex(PREAMBLE), toHex(C_NEGOTIATE)])

  const afterNegotiate = client.onFrame(S_NEGOTIATE) as NegotiationStep
  t.equal(afterNegotiate.error, undefined)
  t.equal(afterNegotiate.done, undefined)
  t.same(joinFrames(afterNegotiate.send).map(toHex), [toHex(C_SASL_INITIATE)])

  const afterSuccess = client.onFrame(S_SASL_SUCCESS) as NegotiationStep
  t.equal(afterSuccess.error, undefined)
  t.same(joinFrames(afterSuccess.send).map(toHex), [toHex(C_CONNECTION_CONTEXT)])
  t.ok(afterSuccess.done)
  t.equal(afterSuccess.done?.user, 'user')
  t.same([...(afterSuccess.done?.features ?? [])], [1])
})

t.test('server negotiation writes the transcript bytes', async t => {
  const seen: Array<[string, string]> = []
  const server = new ServerNegotiation({ authenticate: (user, password) => { seen.push([user, password]); return true } })

  const afterNegotiate = sync(server.onFrame(C_NEGOTIATE))
  t.equal(afterNegotiate.error, undefined)
  t.equal(afterNegotiate.done, undefined)
  t.same(joinFrames(afterNegotiate.send).map(toHex), [toHex(S_NEGOTIATE)])

  const afterInitiate = sync(server.onFrame(C_SASL_INITIATE))
  t.equal(afterInitiate.error, undefined)
  t.equal(afterInitiate.done, undefined)
  t.same(joinFrames(afterInitiate.send).map(toHex), [toHex(S_SASL_SUCCESS)])
  t.same(seen, [['user', '']], 'PLAIN token \\0user\\0 is user "user" with an empty password')

  const afterContext = sync(server.onFrame(C_CONNECTION_CONTEXT))
  t.equal(afterContext.error, undefined)
  t.same(joinFrames(afterContext.send), [], 'no reply to the connection context')
  t.equal(afterContext.done?.user, 'user')
  t.same([...(afterContext.done?.features ?? [])], [1])
})

t.test('the default server authenticator accepts the transcript synchronously', async t => {
  const server = new ServerNegotiation()
  sync(server.onFrame(C_NEGOTIATE))
  t.same(joinFrames(sync(server.onFrame(C_SASL_INITIATE)).send).map(toHex), [toHex(S_SASL_SUCCESS)])
  t.equal(sync(server.onFrame(C_CONNECTION_CONTEXT)).done?.user, 'user')
})

t.test('response and request encoders write the transcript bytes', async t => {
  t.equal(toHex(joinSlices(encodeResponseFrame(0, false, hex('08 03')))), toHex(S_ADD_RESPONSE), 'Add response')
  t.equal(toHex(joinSlices(encodeErrorFrame(0, 4, 'busy'))), toHex(S_TOO_BUSY), 'TOO_BUSY error')
  t.equal(toHex(joinSlices(encodeResponseFrame(7, false, hex('08 00 10 01'), [Buffer.from('abc'), Buffer.from('de')]))),
    toHex(S_TWO_SIDECARS), '2 sidecars')
  t.equal(toHex(joinSlices(encodeResponseFrame(7, false, hex('08 00 10 01'), [new Uint8Array([0x61, 0x62, 0x63]), new Uint8Array([0x64, 0x65])]))),
    toHex(S_TWO_SIDECARS), '2 sidecars given as plain Uint8Arrays')
  const add = encodeRequestFrame({
    callId: 0,
    remoteMethod: encodeRemoteMethod('kudu.rpc.GenericCalculatorService', 'Add'),
    timeoutMs: 10000
  }, hex('08 01 10 02'))
  t.equal(toHex(joinSlices(add)), toHex(C_ADD), 'Add request')
})

t.test('decoding the golden frames', async t => {
  t.test('Add request', async t => {
    const frame = request(C_ADD)
    t.same(frame.header, {
      call_id: 0,
      remote_method: { service_name: 'kudu.rpc.GenericCalculatorService', method_name: 'Add' },
      timeout_millis: 10000
    })
    t.equal(toHex(frame.message), '08 01 10 02')
    t.same(frame.sidecars, [])
  })
  t.test('Add response', async t => {
    const frame = response(S_ADD_RESPONSE)
    t.equal(frame.header.call_id, 0)
    t.equal(frame.header.is_error, false)
    t.ok(own(frame.header, 'is_error'), 'is_error is on the wire')
    t.equal(toHex(frame.message), '08 03')
    t.same(frame.sidecars, [])
  })
  t.test('TOO_BUSY error', async t => {
    const frame = response(S_TOO_BUSY)
    t.equal(frame.header.call_id, 0)
    t.equal(frame.header.is_error, true)
    const status = ok(ErrorStatusType.decode(frame.message))
    t.equal(status.message, 'busy')
    t.equal(status.code, 4)
    t.same(status.unsupported_feature_flags ?? [], [])
  })
  t.test('2 sidecars', async t => {
    const frame = response(S_TWO_SIDECARS)
    t.equal(frame.header.call_id, 7)
    t.equal(frame.header.is_error, false)
    t.same(frame.header.sidecar_offsets, [4, 7])
    t.equal(toHex(frame.message), '08 00 10 01')
    t.same(frame.sidecars.map(s => s.toString('latin1')), ['abc', 'de'])
  })
  t.test('negotiation frames', async t => {
    const clientNegotiate = request(C_NEGOTIATE)
    t.equal(clientNegotiate.header.call_id, -33)
    t.same(compact(ok(NegotiateType.decode(clientNegotiate.message))), { supported_features: [1], step: 1, authn_types: [{ sasl: {} }] })

    const serverNegotiate = response(S_NEGOTIATE)
    t.equal(serverNegotiate.header.call_id, -33)
    t.not(serverNegotiate.header.is_error, true, 'negotiation responses carry only call_id')
    t.same(compact(ok(NegotiateType.decode(serverNegotiate.message))),
      { supported_features: [1], step: 1, sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }] })

    const initiate = request(C_SASL_INITIATE)
    t.equal(initiate.header.call_id, -33)
    const initiateBody = ok(NegotiateType.decode(initiate.message))
    t.equal(initiateBody.step, 2)
    t.equal(toHex(initiateBody.token as Uint8Array), '00 75 73 65 72 00')
    t.same(initiateBody.sasl_mechanisms, [{ mechanism: 'PLAIN' }])

    const success = response(S_SASL_SUCCESS)
    t.equal(success.header.call_id, -33)
    t.same(compact(ok(NegotiateType.decode(success.message))), { step: 0 })

    const context = request(C_CONNECTION_CONTEXT)
    t.equal(context.header.call_id, -3)
    // Every field an own property: the unset ones at their defaults.
    t.same(ok(ConnectionContextType.decode(context.message)), { DEPRECATED_user_info: { real_user: 'user', effective_user: '' }, encoded_nonce: Buffer.alloc(0) })
  })
})

t.test('a negative call id is a 10-byte sign-extended varint', async t => {
  const out = Buffer.alloc(10)
  t.equal(int32Bytes(-33), 10)
  t.equal(writeInt32(out, 0, -33), 10)
  t.equal(toHex(out), 'df ff ff ff ff ff ff ff ff 01')
  t.equal(toHex(RequestHeaderType.encode({ call_id: -33 })), '18 df ff ff ff ff ff ff ff ff 01', 'protobufjs agrees')

  const frame = joinSlices(encodeResponseFrame(-33, undefined, new Uint8Array(0)))
  t.equal(toHex(frame), '00 00 00 0d 0b 08 df ff ff ff ff ff ff ff ff 01 00')
  t.equal(response(frame).header.call_id, -33)

  for (const value of [-1, -(2 ** 31), -128, -129]) {
    const mine = Buffer.alloc(10)
    writeInt32(mine, 0, value)
    t.equal(toHex(mine), toHex(ResponseHeaderType.encode({ call_id: value }).subarray(1)), `call id ${value}`)
  }
})

t.test('packed repeated sidecar_offsets are read', async t => {
  const header = ok(ResponseHeaderType.decode(hex('08 07 1a 02 04 07')))
  t.equal(header.call_id, 7)
  t.same(header.sidecar_offsets, [4, 7])

  const body = hex('08 00 10 01 61 62 63 64 65')
  const responseFrame = Buffer.concat([hex('00 00 00 11 | 06 08 07 1a 02 04 07 | 09'), body])
  t.equal(responseFrame.readUInt32BE(0), responseFrame.length - 4)
  const parsedResponse = response(responseFrame)
  t.same(parsedResponse.header.sidecar_offsets, [4, 7])
  t.equal(toHex(parsedResponse.message), '08 00 10 01')
  t.same(parsedResponse.sidecars.map(s => s.toString('latin1')), ['abc', 'de'])

  // RequestHeader field 16, wire type 2: tag 82 01.
  const requestHeader = hex('18 05 82 01 02 04 07')
  t.same(ok(RequestHeaderType.decode(requestHeader)).sidecar_offsets, [4, 7])
  const requestFrame = Buffer.concat([hex('00 00 00 12 07'), requestHeader, hex('09'), body])
  t.equal(requestFrame.readUInt32BE(0), requestFrame.length - 4)
  const parsedRequest = request(requestFrame)
  t.equal(parsedRequest.header.call_id, 5)
  t.same(parsedRequest.sidecars.map(s => s.toString('latin1')), ['abc', 'de'])
})

const int32 = fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 })
const uint32 = fc.integer({ min: 0, max: 2 ** 32 - 1 })
const name = fc.string({ unit: 'grapheme', maxLength: 40 })
const sidecarList = fc.option(fc.array(fc.uint8Array({ maxLength: 40 }), { maxLength: 6 }), { nil: undefined })

t.test('hand-written RequestHeader encoder agrees with protobufjs', async t => {
  fc.assert(fc.property(
    int32,
    fc.option(fc.tuple(name, name), { nil: undefined }),
    fc.option(uint32, { nil: undefined }),
    fc.option(fc.array(uint32, { maxLength: 5 }), { nil: undefined }),
    fc.uint8Array({ maxLength: 60 }),
    sidecarList,
    (callId, method, timeoutMs, flags, body, sidecars) => {
      const frame = joinSlices(encodeRequestFrame({
        callId,
        remoteMethod: method === undefined ? undefined : encodeRemoteMethod(method[0], method[1]),
        timeoutMs,
        requiredFeatureFlags: flags,
        sidecars
      }, body))
      const expected: RequestHeader = { call_id: callId }
      if (method !== undefined) expected.remote_method = { service_name: method[0], method_name: method[1] }
      if (timeoutMs !== undefined && timeoutMs > 0) expected.timeout_millis = timeoutMs
      if (flags !== undefined && flags.length > 0) expected.required_feature_flags = flags
      if (sidecars !== undefined && sidecars.length > 0) {
        const offsets: number[] = []
        let at = body.length
        for (const s of sidecars) { offsets.push(at); at += s.length }
        expected.sidecar_offsets = offsets
      }
      const parts = ok(splitFrame(frame))
      if (toHex(parts.header) !== toHex(RequestHeaderType.encode(expected))) return false
      const parsed = request(frame)
      if (parsed.header.call_id !== callId) return false
      if (toHex(parsed.message) !== toHex(body)) return false
      const got = parsed.sidecars.map(toHex)
      const want = (sidecars ?? []).map(toHex)
      return JSON.stringify(got) === JSON.stringify(want)
    }
  ), { numRuns: 500 })
  t.pass('500 random request headers')
})

t.test('hand-written ResponseHeader encoder agrees with protobufjs', async t => {
  fc.assert(fc.property(
    int32,
    fc.option(fc.boolean(), { nil: undefined }),
    fc.uint8Array({ maxLength: 60 }),
    sidecarList,
    (callId, isError, body, sidecars) => {
      const frame = joinSlices(encodeResponseFrame(callId, isError, body, sidecars))
      const expected: ResponseHeader = { call_id: callId }
      if (isError !== undefined) expected.is_error = isError
      if (sidecars !== undefined && sidecars.length > 0) {
        const offsets: number[] = []
        let at = body.length
        for (const s of sidecars) { offsets.push(at); at += s.length }
        expected.sidecar_offsets = offsets
      }
      const parts = ok(splitFrame(frame))
      if (toHex(parts.header) !== toHex(ResponseHeaderType.encode(expected))) return false
      const parsed = response(frame)
      if (parsed.header.call_id !== callId || (parsed.header.is_error ?? false) !== (isError ?? false)) return false
      if (toHex(parsed.message) !== toHex(body)) return false
      return JSON.stringify(parsed.sidecars.map(toHex)) === JSON.stringify((sidecars ?? []).map(toHex))
    }
  ), { numRuns: 500 })
  t.pass('500 random response headers')
})

t.test('remote_method agrees with protobufjs for any unicode names', async t => {
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 200 }), fc.string({ unit: 'binary', maxLength: 200 }), (service, method) => {
    const mine = encodeRemoteMethod(service, method)
    const theirs = RequestHeaderType.encode({ call_id: 0, remote_method: { service_name: service, method_name: method } }).subarray(2)
    return toHex(mine) === toHex(theirs)
  }), { numRuns: 300 })
  t.pass('300 random names')
})

// The same headers with packed repeated fields, as another writer might send them.
const packedSchema = ProtoSchema.parse(`
syntax = "proto2";
package nyala.test;
message RemoteMethodPB { required string service_name = 1; required string method_name = 2; }
message RequestIdPB { required string client_id = 1; required int64 seq_no = 2; required int64 first_incomplete_seq_no = 3; required int64 attempt_no = 4; }
message PackedRequestHeader {
  required int32 call_id = 3; optional RemoteMethodPB remote_method = 6; optional uint32 timeout_millis = 10;
  repeated uint32 required_feature_flags = 11 [packed = true]; optional RequestIdPB request_id = 15;
  repeated uint32 sidecar_offsets = 16 [packed = true];
}
message PackedResponseHeader { required int32 call_id = 1; optional bool is_error = 2; repeated uint32 sidecar_offsets = 3 [packed = true]; }
`)
const PackedRequestHeaderType = packedSchema.type<Record<string, unknown>>('nyala.test.PackedRequestHeader')
const PackedResponseHeaderType = packedSchema.type<Record<string, unknown>>('nyala.test.PackedResponseHeader')

const requestHeaderArb = fc.record({
  call_id: int32,
  remote_method: fc.record({ service_name: name, method_name: name }),
  timeout_millis: uint32,
  required_feature_flags: fc.array(uint32, { minLength: 1, maxLength: 5 }),
  request_id: fc.record({
    client_id: name,
    seq_no: fc.integer({ min: 0, max: 2 ** 31 }),
    first_incomplete_seq_no: fc.integer({ min: 0, max: 2 ** 31 }),
    attempt_no: fc.integer({ min: 0, max: 100 })
  }),
  sidecar_offsets: fc.array(uint32, { minLength: 1, maxLength: 8 })
}, { requiredKeys: ['call_id'] })

const responseHeaderArb = fc.record({
  call_id: int32,
  is_error: fc.boolean(),
  sidecar_offsets: fc.array(uint32, { minLength: 1, maxLength: 8 })
}, { requiredKeys: ['call_id'] })

// Unknown fields of each wire type: 20 varint, 21 fixed64, 22 length-delimited, 23 fixed32.
const UNKNOWN_FIELDS = hex('a0 01 05 | a9 01 01 02 03 04 05 06 07 08 | b2 01 02 aa bb | bd 01 01 02 03 04')

t.test('hand-written header decoders agree with protobufjs', async t => {
  fc.assert(fc.property(requestHeaderArb, fc.boolean(), fc.boolean(), (fields, packed, unknown) => {
    const encoded = (packed ? PackedRequestHeaderType : RequestHeaderType).encode(fields as RequestHeader & Record<string, unknown>)
    const bytes = unknown ? Buffer.concat([UNKNOWN_FIELDS, encoded, UNKNOWN_FIELDS]) : Buffer.from(encoded)
    const decoded = decodeRequestHeader(bytes)
    if (decoded instanceof RpcError) return false
    const { request_id: _ignored, ...expected } = fields
    t.same(decoded, expected)
    const reference = ok(RequestHeaderType.decode(bytes))
    return reference.call_id === decoded.call_id
  }), { numRuns: 300 })
  fc.assert(fc.property(responseHeaderArb, fc.boolean(), fc.boolean(), (fields, packed, unknown) => {
    const encoded = (packed ? PackedResponseHeaderType : ResponseHeaderType).encode(fields as ResponseHeader & Record<string, unknown>)
    const bytes = unknown ? Buffer.concat([UNKNOWN_FIELDS, encoded, UNKNOWN_FIELDS]) : Buffer.from(encoded)
    const decoded = decodeResponseHeader(bytes)
    if (decoded instanceof RpcError) return false
    t.same(decoded, fields)
    const reference = ok(ResponseHeaderType.decode(bytes))
    return reference.call_id === decoded.call_id && (reference.is_error ?? false) === (decoded.is_error ?? false)
  }), { numRuns: 300 })
})

t.test('hand-written header decoders: proto2 rules', async t => {
  const last = decodeRequestHeader(hex('18 01 18 02'))
  t.equal(ok(last).call_id, 2, 'the last value of a singular field wins')

  const missing = decodeRequestHeader(hex('50 90 4e'))
  t.ok(missing instanceof RpcError)
  t.equal((missing as RpcError).code, ErrorCode.MALFORMED_FRAME, 'missing call_id')
  const missingResponse = decodeResponseHeader(hex('10 01'))
  t.equal((missingResponse as RpcError).code, ErrorCode.MALFORMED_FRAME, 'missing response call_id')

  const noMethodName = decodeRequestHeader(hex('18 00 32 03 0a 01 61'))
  t.equal((noMethodName as RpcError).code, ErrorCode.MALFORMED_FRAME, 'remote_method without method_name')
  const noServiceName = decodeRequestHeader(hex('18 00 32 03 12 01 61'))
  t.equal((noServiceName as RpcError).code, ErrorCode.MALFORMED_FRAME, 'remote_method without service_name')

  const truncated = decodeRequestHeader(hex('18 00 32 10 0a 01'))
  t.equal((truncated as RpcError).code, ErrorCode.MALFORMED_FRAME, 'truncated remote_method')
  const badVarint = decodeResponseHeader(hex('08 ff ff ff ff ff ff ff ff ff ff'))
  t.equal((badVarint as RpcError).code, ErrorCode.MALFORMED_FRAME, 'varint over 10 bytes')
  const fieldZero = decodeResponseHeader(hex('08 01 00 00'))
  t.equal((fieldZero as RpcError).code, ErrorCode.MALFORMED_FRAME, 'field number 0')

  const mixed = ok(decodeResponseHeader(hex('08 07 18 01 1a 02 02 03 18 04')))
  t.same(mixed.sidecar_offsets, [1, 2, 3, 4], 'packed and unpacked runs of one repeated field concatenate')
})

t.test('a uint32 field written as a 10-byte varint keeps its low 32 bits, as protobufjs and Kudu read it', async t => {
  // 0xffffffff sign-extended to 64 bits, as an encoder that treats the field as int32 -1 writes it.
  const offsets = hex('08 01 18 ff ff ff ff ff ff ff ff ff 01')
  t.same(ok(ResponseHeaderType.decode(offsets)).sidecar_offsets, [0xffffffff], 'protobufjs')
  t.same(ok(decodeResponseHeader(offsets)).sidecar_offsets, [0xffffffff], 'hand-written decoder')
  const timeout = hex('18 01 50 ff ff ff ff ff ff ff ff ff 01')
  t.equal(ok(decodeRequestHeader(timeout)).timeout_millis, 0xffffffff, 'timeout_millis')
})

// The decoders' fast paths take the common layouts (request: call_id,
// remote_method of the method last seen, optional timeout_millis; response:
// call_id, is_error) and leave everything else to the general loop: their
// answers must be the general loop's, for every prefix of such a header too.
t.test('header fast paths agree with protobufjs on the common layouts and on every prefix of them', async t => {
  const requestLayout = fc.record({
    call_id: int32,
    remote_method: fc.record({ service_name: name, method_name: name }),
    timeout_millis: uint32
  }, { requiredKeys: ['call_id', 'remote_method'] })
  fc.assert(fc.property(requestLayout, (fields) => {
    const bytes = Buffer.from(RequestHeaderType.encode(fields as RequestHeader & Record<string, unknown>))
    const first = ok(decodeRequestHeader(bytes))
    const again = ok(decodeRequestHeader(bytes)) // the method is cached now: the fast path's case
    t.same(first, fields)
    t.same(again, fields)
    for (let cut = 0; cut < bytes.length; cut++) {
      const prefix = bytes.subarray(0, cut)
      const ours = decodeRequestHeader(prefix)
      const reference = RequestHeaderType.decode(prefix)
      if (reference instanceof RpcError) {
        if (!(ours instanceof RpcError)) return false
      } else if (ours instanceof RpcError || ours.call_id !== reference.call_id || (ours.timeout_millis ?? 0) !== (reference.timeout_millis ?? 0)) {
        return false
      }
    }
    return true
  }), { numRuns: 300 })
  fc.assert(fc.property(int32, fc.boolean(), (callId, isError) => {
    const bytes = Buffer.from(ResponseHeaderType.encode({ call_id: callId, is_error: isError }))
    const decoded = ok(decodeResponseHeader(bytes))
    if (decoded.call_id !== callId || decoded.is_error !== isError) return false
    for (let cut = 0; cut < bytes.length; cut++) {
      const ours = decodeResponseHeader(bytes.subarray(0, cut))
      // Every proper prefix lacks is_error or has a truncated call_id: only call_id-complete prefixes decode.
      if (!(ours instanceof RpcError) && ours.is_error !== undefined) return false
    }
    return true
  }), { numRuns: 300 })
})

t.test('header fast paths: the bytes they refuse go to the general loop', async t => {
  // is_error written as 2 (any nonzero varint is true), trailing sidecar offsets, a 5-byte call id.
  t.same(ok(decodeResponseHeader(hex('08 07 10 02'))), { call_id: 7, is_error: true })
  t.same(ok(decodeResponseHeader(hex('08 07 10 00 18 05'))), { call_id: 7, is_error: false, sidecar_offsets: [5] })
  t.same(ok(decodeResponseHeader(hex('08 ff ff ff ff 07 10 00'))), { call_id: 0x7fffffff, is_error: false })
  const method = hex('0a 01 73 12 01 6d')
  const header = (rest: string): Buffer => Buffer.concat([hex('18 05 32 06'), method, hex(rest)])
  t.same(ok(decodeRequestHeader(header(''))), { call_id: 5, remote_method: { service_name: 's', method_name: 'm' } })
  // Now cached: a timeout of 5 varint bytes, feature flags after it, and a timeout of 0.
  t.equal(ok(decodeRequestHeader(header('50 ff ff ff ff 0f'))).timeout_millis, 0xffffffff)
  t.same(ok(decodeRequestHeader(header('50 01 58 02'))).required_feature_flags, [2])
  t.same(ok(decodeRequestHeader(header('50 00'))), { call_id: 5, remote_method: { service_name: 's', method_name: 'm' }, timeout_millis: 0 })
})
