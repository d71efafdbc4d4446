/**
 * The stock framings (lengthField, lines) read frames the way Netty's
 * LengthFieldBasedFrameDecoder and tokio-util's LinesCodec do, and write
 * them back; simpleProtocol and simpleClientProtocol turn three functions
 * into a whole protocol on the two-phase path. These tests drive the
 * codec objects directly; test/reactor/simple-protocol.test.ts serves them.
 */
import t, { type Test } from 'tap'
import fc from 'fast-check'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { ScanDecoder } from '../../codec/scan-decoder.js'
import { lengthField, lines, type LengthFieldOptions } from '../../codec/framings.js'
import { SLICE_FROM_BYTES, simpleClientProtocol, simpleProtocol } from '../../codec/simple-protocol.js'
import { CallHead, type AnsweredCall, type CallInfo, type RouteInfo } from '../../codec/protocol.js'
import { encoded, encodedSlices } from '../helpers/encode.js'

/** The frames a framing cuts `chunks` into (copied), and the first error. */
function frames (framing: ReturnType<typeof lengthField>, chunks: readonly Buffer[], max?: number): { frames: Buffer[], error: RpcError | null } {
  const decoder = new FrameDecoder(framing, max)
  const out: Buffer[] = []
  for (const chunk of chunks) {
    const error = decoder.push(chunk, (frame) => { out.push(Buffer.from(frame)) })
    if (error !== null) return { frames: out, error }
  }
  return { frames: out, error: null }
}

function scanned (framing: ReturnType<typeof lines>, chunks: readonly Buffer[], max = 1 << 20): { frames: Buffer[], error: RpcError | null } {
  const decoder = new ScanDecoder(framing, max)
  const out: Buffer[] = []
  for (const chunk of chunks) {
    const error = decoder.pushRanges(chunk, (buf, start, end) => { out.push(Buffer.from(buf.subarray(start, end))) })
    if (error !== null) return { frames: out, error }
  }
  return { frames: out, error: null }
}

const bytesOf = (...parts: Array<string | number[]>): Buffer => Buffer.concat(parts.map((p) => typeof p === 'string' ? Buffer.from(p, 'latin1') : Buffer.from(p)))
const joined = (parts: readonly Uint8Array[]): Buffer => Buffer.concat(parts)
const byteByByte = (buf: Buffer): Buffer[] => [...buf].map((b) => Buffer.from([b]))
const HELLO = 'HELLO, WORLD'

t.test('lengthField reads and writes the frames of Netty\'s LengthFieldBasedFrameDecoder examples', async (t) => {
  const cases: Array<{ name: string, options: LengthFieldOptions, frame: Buffer, payload: Buffer }> = [
    // Netty: lengthFieldOffset 0, lengthFieldLength 2, lengthAdjustment 0.
    { name: '2-byte prefix', options: { bytes: 2 }, frame: bytesOf([0x00, 0x0c], HELLO), payload: bytesOf(HELLO) },
    // The length counts the whole frame (lengthAdjustment -2).
    { name: 'a length that counts itself', options: { bytes: 2, adjust: -2 }, frame: bytesOf([0x00, 0x0e], HELLO), payload: bytesOf(HELLO) },
    // A header before the length field (lengthFieldOffset 2): the payload is the whole frame.
    { name: 'a header before the field', options: { bytes: 2, offset: 2 }, frame: bytesOf([0xca, 0xfe, 0x00, 0x0c], HELLO), payload: bytesOf([0xca, 0xfe, 0x00, 0x0c], HELLO) },
    // A header after the length field (lengthAdjustment 2): the payload is header and body.
    { name: 'a header after the field', options: { bytes: 2, adjust: 2 }, frame: bytesOf([0x00, 0x0c, 0xca, 0xfe], HELLO), payload: bytesOf([0xca, 0xfe], HELLO) },
    // Header on both sides, a field that counts only the body (memcached binary: 24-byte header, body length at 8).
    { name: 'memcached\'s header', options: { bytes: 4, offset: 8, adjust: 12 }, frame: bytesOf([0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0c], new Array(12).fill(7), HELLO), payload: bytesOf([0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0c], new Array(12).fill(7), HELLO) },
    { name: '1-byte prefix', options: { bytes: 1 }, frame: bytesOf([0x0c], HELLO), payload: bytesOf(HELLO) },
    { name: '4-byte prefix (KRPC)', options: { bytes: 4 }, frame: bytesOf([0, 0, 0, 0x0c], HELLO), payload: bytesOf(HELLO) },
    { name: '2-byte little-endian', options: { bytes: 2, littleEndian: true }, frame: bytesOf([0x0c, 0x00], HELLO), payload: bytesOf(HELLO) },
    { name: '4-byte little-endian', options: { bytes: 4, littleEndian: true }, frame: bytesOf([0x0c, 0, 0, 0], HELLO), payload: bytesOf(HELLO) },
    { name: 'an empty payload', options: { bytes: 2 }, frame: bytesOf([0, 0]), payload: Buffer.alloc(0) }
  ]
  for (const { name, options, frame, payload } of cases) {
    const framing = lengthField(options)
    const stream = Buffer.concat([frame, frame])
    for (const chunks of [[stream], byteByByte(stream)]) {
      const got = frames(framing, chunks)
      t.equal(got.error, null, `${name}: no error`)
      t.same(got.frames.map((f) => f.toString('hex')), [frame.toString('hex'), frame.toString('hex')], `${name}: two whole frames (${chunks.length} chunks)`)
    }
    t.equal(framing.payloadOf(frame, 0, frame.length).toString('hex'), payload.toString('hex'), `${name}: the payload`)
    // Writing: what decode gives is what encode hands back.
    const written = payload.length > 0 && options.offset !== undefined && options.offset > 0
      ? Buffer.from(payload).fill(0, options.offset, options.offset + options.bytes) // the field left blank
      : payload
    t.equal(joined(framing.prepend(written)).toString('hex'), frame.toString('hex'), `${name}: prepend builds the frame`)
    t.equal(joined(framing.prepend([written.subarray(0, 3), written.subarray(3)])).toString('hex'), frame.toString('hex'), `${name}: from two buffers too`)
    const out = Buffer.alloc(framing.headBytes(written.length) + written.length + 4, 0xee)
    written.copy(out, 2 + framing.headBytes(written.length))
    framing.frameInto(out, 2, written.length)
    t.equal(out.subarray(2, 2 + frame.length).toString('hex'), frame.toString('hex'), `${name}: frameInto writes it in place`)
    t.equal(out[0], 0xee, `${name}: nothing before it`)
  }
})

t.test('lengthField past offset 0 never writes into the caller\'s buffers', async (t) => {
  const framing = lengthField({ bytes: 2, offset: 2 })
  const payload = bytesOf([0xca, 0xfe, 0xaa, 0xbb], HELLO)
  const before = payload.toString('hex')
  const frame = joined(framing.frame(payload))
  t.equal(frame.toString('hex'), bytesOf([0xca, 0xfe, 0x00, 0x0c], HELLO).toString('hex'), 'the field is filled in the copy')
  t.equal(payload.toString('hex'), before, 'the payload is unchanged')
  t.equal(joined(framing.frame([bytesOf([0xca]), bytesOf([0xfe, 0, 0], HELLO)])).toString('hex'), frame.toString('hex'), 'a header split over buffers')
})

t.test('lengthField refuses a frame over max as soon as its field is read, and a field shorter than its head', async (t) => {
  const framing = lengthField({ bytes: 2, max: 16 })
  t.equal(framing.max, 16)
  const ok = bytesOf([0, 14], 'x'.repeat(14))
  const got = frames(framing, [ok])
  t.equal(got.frames.length, 1, 'a frame of exactly max bytes passes')
  const over = frames(framing, [bytesOf([0, 15])])
  t.equal(over.error?.code, ErrorCode.FRAME_TOO_LARGE, 'max + 1 is refused from the two field bytes alone')
  const malformed = frames(lengthField({ bytes: 4, adjust: -4 }), [bytesOf([0, 0, 0, 1])])
  t.equal(malformed.error?.code, ErrorCode.MALFORMED_FRAME, 'a length that counts itself but says 1')
  const decoderMax = frames(lengthField({ bytes: 4 }), [bytesOf([0, 0, 1, 0])], 100)
  t.equal(decoderMax.error?.code, ErrorCode.FRAME_TOO_LARGE, 'the decoder\'s own maximum still applies')
})

t.test('lengthField throws RPC_ERR_INVALID_ARGUMENT for a payload its field cannot hold, and for bad options', async (t) => {
  const one = lengthField({ bytes: 1 })
  t.doesNotThrow(() => one.prepend(Buffer.alloc(255)), '255 fits a byte')
  t.throws(() => one.prepend(Buffer.alloc(256)), { code: ErrorCode.INVALID_ARGUMENT }, '256 does not')
  t.throws(() => one.headBytes(256), { code: ErrorCode.INVALID_ARGUMENT }, 'headBytes says so before anything is written')
  t.throws(() => lengthField({ bytes: 2, offset: 4 }).prepend(Buffer.alloc(3)), { code: ErrorCode.INVALID_ARGUMENT }, 'a payload shorter than the header')
  t.throws(() => lengthField({ bytes: 2, adjust: 10 }).prepend(Buffer.alloc(3)), { code: ErrorCode.INVALID_ARGUMENT }, 'a payload shorter than the adjustment')
  t.throws(() => lengthField({ bytes: 3 as 2 }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => lengthField({ bytes: 2, offset: -1 }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => lengthField({ bytes: 2, max: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
})

t.test('property: any payload round-trips through prepend and decode, however the stream is cut', async (t) => {
  const config = fc.record({
    bytes: fc.constantFrom<1 | 2 | 4>(1, 2, 4),
    offset: fc.integer({ min: 0, max: 6 }),
    adjust: fc.integer({ min: -4, max: 8 }),
    littleEndian: fc.boolean()
  })
  fc.assert(fc.property(config, fc.array(fc.uint8Array({ maxLength: 300 }), { minLength: 1, maxLength: 4 }), fc.array(fc.nat(2000), { maxLength: 6 }), (options, bodies, cuts) => {
    const framing = lengthField(options)
    const head = options.offset > 0 ? options.offset + options.bytes : 0
    // Payloads that fit the field and the header (and the adjustment's bytes after the field).
    const payloads = bodies.map((b) => Buffer.concat([Buffer.alloc(head + Math.max(0, options.adjust)), b]))
      .filter((p) => { try { framing.headBytes(p.length); return true } catch { return false } })
    if (payloads.length === 0) return
    const stream = Buffer.concat(payloads.flatMap((p) => framing.prepend(p)))
    const points = [...new Set(cuts.map((c) => c % (stream.length + 1)))].sort((a, b) => a - b)
    const chunks: Buffer[] = []
    let from = 0
    for (const point of points) { chunks.push(stream.subarray(from, point)); from = point }
    chunks.push(stream.subarray(from))
    const got = frames(framing, chunks)
    if (got.error !== null) throw got.error
    if (got.frames.length !== payloads.length) throw new Error(`${got.frames.length} frames for ${payloads.length} payloads`)
    got.frames.forEach((frame, i) => {
      const payload = framing.payloadOf(frame, 0, frame.length)
      const expected = Buffer.from(payloads[i]!)
      // Past offset 0 the payload holds the field, which the framing wrote.
      if (options.offset > 0) frame.copy(expected, options.offset, options.offset, options.offset + options.bytes)
      if (!payload.equals(expected)) throw new Error(`frame ${i} differs`)
    })
  }), { numRuns: 300 })
  t.pass('300 runs')
})

t.test('lines strips its delimiter on reading, appends it on writing, and reads a line split at every byte', async (t) => {
  const framing = lines({ max: 64 })
  const stream = bytesOf('GET a\r\nSET b c\n\nlast\n')
  const expected = ['GET a\r\n', 'SET b c\n', '\n', 'last\n']
  for (let cut = 0; cut <= stream.length; cut++) {
    const got = scanned(framing, [stream.subarray(0, cut), stream.subarray(cut)])
    t.same(got.frames.map((f) => f.toString('latin1')), expected, `cut at ${cut}`)
  }
  t.same(scanned(framing, byteByByte(stream)).frames.map((f) => f.toString('latin1')), expected, 'one byte at a time')
  t.same(expected.map((l) => framing.payloadOf(Buffer.from(l), 0, l.length).toString()), ['GET a', 'SET b c', '', 'last'], 'the default strips \\n and a \\r before it')
  t.equal(joined(framing.frame(Buffer.from('OK'))).toString(), 'OK\n', 'writes \\n')
  t.equal(framing.tailBytes, 1)
  const out = Buffer.alloc(3)
  out.write('OK')
  framing.frameInto(out, 0, 2)
  t.equal(out.toString(), 'OK\n', 'frameInto appends it in place')
})

t.test('lines with a delimiter of its own matches it exactly, split across reads too', async (t) => {
  const framing = lines({ max: 32, delimiter: '\r\n' })
  const stream = bytesOf('a\nb\r\nc\r\n')
  const expected = ['a\nb\r\n', 'c\r\n']
  for (let cut = 0; cut <= stream.length; cut++) {
    t.same(scanned(framing, [stream.subarray(0, cut), stream.subarray(cut)]).frames.map((f) => f.toString('latin1')), expected, `cut at ${cut}`)
  }
  t.same(scanned(framing, byteByByte(stream)).frames.map((f) => f.toString('latin1')), expected, 'one byte at a time')
  t.equal(framing.payloadOf(bytesOf('a\nb\r\n'), 0, 5).toString('latin1'), 'a\nb')
  t.equal(joined(framing.frame([Buffer.from('x'), Buffer.from('y')])).toString(), 'xy\r\n')
  const nul = lines({ max: 8, delimiter: new Uint8Array([0]) })
  t.same(scanned(nul, [bytesOf('ab', [0], 'c', [0])]).frames.map((f) => f.toString('latin1')), ['ab\0', 'c\0'], 'a NUL delimiter')
})

t.test('lines refuses a line longer than max (its delimiter included) once max bytes came without an end', async (t) => {
  const framing = lines({ max: 8 })
  t.same(scanned(framing, [bytesOf('1234567\n')]).frames.length, 1, 'seven bytes and the newline: exactly max')
  const over = scanned(framing, [bytesOf('12345678\n')])
  t.equal(over.error?.code, ErrorCode.FRAME_TOO_LARGE, 'eight bytes and the newline: one over')
  const slow = scanned(framing, byteByByte(bytesOf('ok\n123456789')))
  t.same(slow.frames.map((f) => f.toString()), ['ok\n'], 'the line before it still came out')
  t.equal(slow.error?.code, ErrorCode.FRAME_TOO_LARGE, 'refused byte by byte, at the max-th byte')
  t.throws(() => lines({ max: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => lines({ max: 4, delimiter: '' }), { code: ErrorCode.INVALID_ARGUMENT })
})

// A binary protocol for the unit tests: [u8 op][u32 id][body] in a 2-byte prefix.
const OPS = ['', 'echo', 'fail']
const route: RouteInfo = { service: 'simple', method: 'echo', spec: undefined }
function binary (overrides: Partial<Parameters<typeof simpleProtocol<Buffer, Buffer>>[0]> = {}): ReturnType<typeof simpleProtocol<Buffer, Buffer>> {
  return simpleProtocol<Buffer, Buffer>({
    name: 'bin',
    framing: lengthField({ bytes: 2, max: 1024 }),
    ordering: 'id',
    decode: (payload) => {
      if (payload.length < 5) return new RpcError(ErrorCode.MALFORMED_FRAME, 'short')
      if (payload[0] === 0xff) throw new Error('a broken decoder')
      return { route: OPS[payload[0]!] ?? `op-${payload[0]}`, id: payload.readUInt32BE(1), request: payload.subarray(5) }
    },
    encode: (call, answer) => [idHead(0, call.id ?? 0), answer],
    refusal: (call, reason) => reason === 'shutdown' ? null : [idHead(1, call.id ?? 0), Buffer.from(reason)],
    ...overrides
  })
}
function idHead (status: number, id: number): Buffer {
  const head = Buffer.alloc(5)
  head[0] = status
  head.writeUInt32BE(id, 1)
  return head
}
const requestFrame = (op: number, id: number, body = ''): Buffer => joined(lengthField({ bytes: 2 }).prepend([Buffer.from([op]), idHead(0, id).subarray(1), Buffer.from(body)]))
function decodeHead (protocol: ReturnType<typeof binary>, frame: Buffer): { error: RpcError | null, head: CallHead } {
  const head = new CallHead()
  head.reset(0, frame.length)
  return { error: protocol.decodeHead(frame, 0, frame.length, head), head }
}
function answerOf (t: Test, protocol: ReturnType<typeof binary>, call: AnsweredCall, answer: Buffer): Buffer {
  const slices = encodedSlices((out) => protocol.encode(call, answer, out))
  t.ok(slices.length <= 1, 'a small answer is one buffer')
  return joined(slices)
}
const callFrom = (head: CallHead): AnsweredCall => ({ service: head.service, method: head.method, callId: head.callId, data: head.data, route })

t.test('simpleProtocol: decode sees the payload without the prefix, and the head says route, id and request', async (t) => {
  const protocol = binary()
  t.equal(protocol.ordering, 'id')
  t.equal(protocol.maxFrameBytes, 1024, 'the framing\'s max')
  const { error, head } = decodeHead(protocol, requestFrame(1, 0xdeadbeef, 'hi'))
  t.equal(error, null)
  t.equal(head.service, 'simple', 'the default group')
  t.equal(head.method, 'echo')
  t.equal(head.callId, 0xdeadbeef)
  t.equal((protocol.decodeRequest(route, Buffer.alloc(0), head) as Buffer).toString(), 'hi')
  const answer = answerOf(t, protocol, callFrom(head), Buffer.from('hi'))
  t.equal(answer.toString('hex'), bytesOf([0, 7, 0, 0xde, 0xad, 0xbe, 0xef], 'hi').toString('hex'), 'the answer got its prefix')
  t.equal(simpleProtocol({ ...optionsOf(), service: 'kv' }).decodeHead(Buffer.from('GET\n'), 0, 4, new CallHead()), null)
})

function optionsOf (): Parameters<typeof simpleProtocol<string, string>>[0] {
  return {
    name: 'l',
    framing: lines({ max: 64 }),
    decode: (line) => line.length === 0 ? null : { route: line.toString(), request: '' },
    encode: (_call, answer) => Buffer.from(answer),
    refusal: (_call, reason) => Buffer.from(`-ERR ${reason}`)
  }
}

t.test('simpleProtocol: bad frames, thrown decoders, blank lines and missing ids', async (t) => {
  const protocol = binary()
  t.equal(decodeHead(protocol, requestFrame(1, 1).subarray(0, 5)).error?.code, ErrorCode.MALFORMED_FRAME, 'an RpcError decode returned')
  t.equal(decodeHead(protocol, requestFrame(0xff, 1)).error?.code, ErrorCode.MALFORMED_FRAME, 'a thrown decode is a malformed frame')
  const noId = binary({ decode: () => ({ route: 'echo', request: Buffer.alloc(0) }) })
  t.equal(decodeHead(noId, requestFrame(1, 1)).error?.code, ErrorCode.MALFORMED_FRAME, 'ordering id without an id')
  const noRoute = binary({ decode: () => ({ request: Buffer.alloc(0) }) as never })
  t.equal(decodeHead(noRoute, requestFrame(1, 1)).error?.code, ErrorCode.MALFORMED_FRAME, 'no route')
  const text = simpleProtocol(optionsOf())
  t.equal(text.ordering, 'in-order', 'in-order by default')
  const head = new CallHead()
  head.reset(0, 1)
  t.equal(text.decodeHead(Buffer.from('\n'), 0, 1, head), null)
  t.equal(head.skip, true, 'null: not a request')
  const timed = simpleProtocol({ ...optionsOf(), decode: () => ({ route: 'x', timeoutMs: 250, request: '' }) })
  head.reset(0, 2)
  timed.decodeHead(Buffer.from('x\n'), 0, 2, head)
  t.equal(head.timeoutMs, 250, 'a time budget from the wire')
})

t.test('simpleProtocol: large answers go as slices, quiet answers as nothing, throws as failures', async (t) => {
  const protocol = binary()
  const { head } = decodeHead(protocol, requestFrame(1, 9))
  const call = callFrom(head)
  const big = Buffer.alloc(SLICE_FROM_BYTES, 7)
  const wide = binary({ framing: lengthField({ bytes: 4 }) })
  const slices = encodedSlices((out) => wide.encode(call, big, out))
  t.ok(slices.length > 1, 'a large payload: slices')
  t.ok(slices.some((s) => s.buffer === big.buffer), 'the payload itself is sent, not a copy')
  t.equal(joined(slices).length, 4 + 5 + SLICE_FROM_BYTES)
  t.throws(() => encodedSlices((out) => protocol.encode(call, Buffer.alloc(70000), out)), { code: ErrorCode.INVALID_ARGUMENT }, 'too long for a 2-byte field: the call is answered failed')
  const quiet = binary({ encode: () => null })
  t.same(encodedSlices((out) => quiet.encode(call, Buffer.alloc(1), out)), [], 'null: no answer')
  const throwing = binary({ encode: () => { throw new Error('no') } })
  t.throws(() => encodedSlices((out) => throwing.encode(call, Buffer.alloc(1), out)), /no/)
  t.equal(answerOf(t, protocol, call, Buffer.from('ab')).toString('hex'), bytesOf([0, 7, 0, 0, 0, 0, 9], 'ab').toString('hex'))
})

t.test('simpleProtocol: refusals get the prefix, null and throws close', async (t) => {
  const protocol = binary()
  const { head } = decodeHead(protocol, requestFrame(7, 42))
  t.equal(head.method, 'op-7')
  const busy = protocol.refusal(head, 'busy', 'queue full')
  t.equal(joined(busy!).toString('hex'), bytesOf([0, 9, 1, 0, 0, 0, 42], 'busy').toString('hex'), 'the refusal names the request, prefixed')
  t.equal(protocol.refusal(head, 'shutdown', 'closing'), null, 'null closes')
  const throwing = binary({ refusal: () => { throw new Error('no words') } })
  t.equal(throwing.refusal(head, 'busy', 'x'), null, 'a throw closes too')
  const bare: CallInfo = { service: 'simple', method: 'echo', callId: 5, data: undefined }
  t.equal(joined(protocol.refusal(bare, 'busy', 'x')!).readUInt32BE(3), 5, 'a head decode never filled: the id from the head')
})

t.test('simpleProtocol and simpleClientProtocol refuse options they cannot work with', async (t) => {
  t.throws(() => simpleProtocol({ ...optionsOf(), name: '' }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => simpleProtocol({ ...optionsOf(), ordering: 'fifo' as 'id' }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => simpleProtocol({ ...optionsOf(), encode: undefined as never }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => simpleProtocol({ ...optionsOf(), service: '' }), { code: ErrorCode.INVALID_ARGUMENT })
  const client = { name: 'c', framing: lines({ max: 8 }), encode: () => Buffer.alloc(0), decode: () => 1 }
  t.throws(() => simpleClientProtocol({ ...client, matching: 'id' }), { code: ErrorCode.INVALID_ARGUMENT }, 'id matching without answerId')
  t.throws(() => simpleClientProtocol({ ...client, matching: 'sorted' as 'id' }), { code: ErrorCode.INVALID_ARGUMENT })
  t.equal(simpleClientProtocol({ ...client, matching: 'in-order' }).maxFrameBytes, 8, 'the framing\'s max')
})

t.test('simpleClientProtocol: requests framed without an encoder writing a prefix, answers read from the payload', async (t) => {
  const protocol = simpleClientProtocol<string, string>({
    name: 'c',
    framing: lengthField({ bytes: 2 }),
    matching: 'id',
    maxId: 0xffff,
    encode: (request, id) => [Buffer.from([id >> 8, id & 0xff]), Buffer.from(request)],
    decode: (_request, payload) => payload[2] === 0x21 ? new RpcError(ErrorCode.REMOTE, 'no', { remote: { protocol: 'c', code: 1, name: 'NO', fatal: false } }) : payload.subarray(2).toString(),
    answerId: (payload) => { if (payload.length < 2) throw new Error('short'); return payload.readUInt16BE(0) }
  })
  t.equal(protocol.maxId, 0xffff)
  t.equal(encoded((out) => protocol.encode('hey', 3, out)).toString('hex'), bytesOf([0, 5, 0, 3], 'hey').toString('hex'))
  const answer = bytesOf([0, 4, 0, 3], 'ok')
  t.equal(protocol.answerId!(answer, 0, answer.length), 3)
  t.equal(protocol.decodeAnswer('hey', answer, 0, answer.length), 'ok')
  const remote = bytesOf([0, 3, 0, 3], '!')
  t.equal((protocol.decodeAnswer('hey', remote, 0, remote.length) as RpcError).code, ErrorCode.REMOTE)
  const short = bytesOf([0, 1, 0])
  t.equal((protocol.answerId!(short, 0, short.length) as RpcError).code, ErrorCode.MALFORMED_FRAME, 'a thrown answerId is a malformed frame')
  const big = 'x'.repeat(SLICE_FROM_BYTES)
  const slices = encodedSlices((out) => protocol.encode(big, 1, out))
  t.ok(slices.length > 1, 'large requests go as slices')
  t.equal(joined(slices).length, 2 + 2 + SLICE_FROM_BYTES)
})
