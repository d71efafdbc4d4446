/**
 * The memcached example's binary protocol, driven directly with hand-built
 * packets (no server): framing, decodeHead, decodeRequest, the handlers and
 * the encoders. Every command gets a request and the exact bytes of its
 * answer (as memcached 1.6.18 sends them), quiet commands their silences,
 * and every refusal its error packet.
 */
import t from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { CallHead, InvalidRequest, type AnsweredCall, type RefusalReason } from '../../codec/protocol.js'
import { memcachedHandlers, type MemcachedHandler } from '../../examples/memcached/handlers.js'
import {
  MemcachedProtocolError, MemcachedRequest, Opcode, protocolErrorAnswer, isSilent, memcachedFraming, memcachedProtocol, methodOf, opaqueOf, opcodeOf, refusalStatus, type CommandName
} from '../../examples/memcached/protocol.js'
import { MemcachedStore } from '../../examples/memcached/store.js'
import { joinSlices, toHex } from '../helpers/bytes.js'
import { encodedSlices } from '../helpers/encode.js'

const OPAQUE = 0xdeadbeef

interface PacketFields {
  key?: string
  extras?: Buffer
  value?: Buffer | string
  opaque?: number
  cas?: bigint
}

/** A request packet, built with Buffer's own writers (independently of the protocol's). */
function request (opcode: number, { key = '', extras = Buffer.alloc(0), value = '', opaque = OPAQUE, cas = 0n }: PacketFields = {}): Buffer {
  return packet(0x80, opcode, 0, key, extras, value, opaque, cas)
}

/** The answer packet we expect. */
function response (opcode: number, { status = 0, key = '', extras = Buffer.alloc(0), value = '', opaque = OPAQUE, cas = 0n }: PacketFields & { status?: number } = {}): Buffer {
  return packet(0x81, opcode, status, key, extras, value, opaque, cas)
}

function packet (magic: number, opcode: number, status: number, key: string, extras: Buffer, value: Buffer | string, opaque: number, cas: bigint): Buffer {
  const keyBytes = Buffer.from(key, 'latin1')
  const valueBytes = typeof value === 'string' ? Buffer.from(value, 'latin1') : value
  const header = Buffer.alloc(24)
  header[0] = magic
  header[1] = opcode
  header.writeUInt16BE(keyBytes.length, 2)
  header[4] = extras.length
  header.writeUInt16BE(status, 6)
  header.writeUInt32BE(extras.length + keyBytes.length + valueBytes.length, 8)
  header.writeUInt32BE(opaque, 12)
  header.writeBigUInt64BE(cas, 16)
  return Buffer.concat([header, extras, keyBytes, valueBytes])
}

function u32s (...numbers: number[]): Buffer {
  const out = Buffer.alloc(4 * numbers.length)
  numbers.forEach((n, i) => out.writeUInt32BE(n, 4 * i))
  return out
}

function incrExtras (delta: bigint, initial: bigint, expiration: number): Buffer {
  const out = Buffer.alloc(20)
  out.writeBigUInt64BE(delta, 0)
  out.writeBigUInt64BE(initial, 8)
  out.writeUInt32BE(expiration, 16)
  return out
}

function u64 (n: bigint): Buffer {
  const out = Buffer.alloc(8)
  out.writeBigUInt64BE(n)
  return out
}

const set = (opcode: number, key: string, value: string, flags = 0, exptime = 0, cas = 0n): Buffer =>
  request(opcode, { key, value, extras: u32s(flags, exptime), cas })

const NOT_FOUND = { status: 0x01, value: 'Not found' }
const EXISTS = { status: 0x02, value: 'Data exists for key.' }
const NOT_STORED = { status: 0x05, value: 'Not stored.' }

const protocol = memcachedProtocol()

/** What one request came to: its answer bytes (null: silent), and whether the handler asked to close the connection. */
interface Outcome { answer: Buffer | null, closed: boolean, sliced: boolean }

/**
 * A server in miniature: one packet through framing, decodeHead, route
 * lookup, decodeRequest, the handler and the encoders, as the generic
 * server calls them. The answer is encoded at an offset into a larger
 * buffer, to check it writes exactly its own bytes.
 */
class Harness {
  readonly store: MemcachedStore
  readonly handlers: Record<string, MemcachedHandler>
  readonly head = new CallHead()

  constructor (store = new MemcachedStore({ now: () => 1_800_000_000_000 })) {
    this.store = store
    this.handlers = memcachedHandlers(store, { version: '1.6.0-test' })
  }

  send (frame: Buffer): Outcome {
    const size = memcachedFraming.frameBytes(frame, 0)
    if (typeof size !== 'number') throw size
    if (size !== frame.length) throw new Error(`frameBytes said ${size}, the packet has ${frame.length}`)
    const head = this.head
    head.reset(0, frame.length)
    const error = protocol.decodeHead(frame, 0, frame.length, head)
    // Lengths wrong for the command: memcached's error answer, then the close (as the server does through protocolError).
    if (error instanceof MemcachedProtocolError) return { answer: protocolErrorAnswer(error), closed: true, sliced: false }
    if (error !== null) throw error
    const call: AnsweredCall = { service: head.service, method: head.method, callId: head.callId, data: head.data, route: { service: head.service, method: head.method, spec: undefined } }
    const handler = Object.hasOwn(this.handlers, head.method) ? this.handlers[head.method] : undefined
    if (handler === undefined) return { answer: joinSlices(protocol.refusal(call, 'no-method', 'no such command')!), closed: false, sliced: false }
    const decoded = protocol.decodeRequest(call.route, frame, head)
    if (decoded instanceof InvalidRequest) return { answer: joinSlices(protocol.refusal(call, 'invalid', decoded.message)!), closed: false, sliced: false }
    let closed = false
    const answer = handler(decoded, { closeConnection: () => { closed = true } })
    const slices = encodedSlices((out) => protocol.encode(call, answer, out))
    if (slices.length === 0) return { answer: null, closed, sliced: false }
    return { answer: joinSlices(slices), closed, sliced: slices.length > 1 }
  }

  /** The answer's bytes, as hex for readable diffs; 'silent' when none. */
  answer (frame: Buffer): string {
    const { answer } = this.send(frame)
    return answer === null ? 'silent' : toHex(answer)
  }
}

const hexOf = (frame: Buffer): string => toHex(frame)

t.test('framing: the header carries the body length; bad magic and bad lengths close', async t => {
  t.equal(memcachedFraming.prefixBytes, 24)
  t.equal(memcachedFraming.frameBytes(request(Opcode.GET, { key: 'abc' }), 0), 27)
  const withPrefix = Buffer.concat([Buffer.from('junk'), set(Opcode.SET, 'k', 'value')])
  t.equal(memcachedFraming.frameBytes(withPrefix, 4), 24 + 8 + 1 + 5, 'reads at the offset')

  const ascii = Buffer.from('get foo\r\n'.padEnd(24, ' '))
  const bad = memcachedFraming.frameBytes(ascii, 0)
  t.ok(bad instanceof RpcError && bad.code === ErrorCode.MALFORMED_FRAME && bad.fatal, 'a text-protocol client is closed')
  const response81 = response(Opcode.GET)
  t.ok(memcachedFraming.frameBytes(response81, 0) instanceof RpcError, 'a response packet is not a request')

  const overlong = request(Opcode.GET, { key: 'abc' })
  overlong.writeUInt32BE(2, 8) // body 2 < key 3
  t.ok(memcachedFraming.frameBytes(overlong, 0) instanceof RpcError, 'key longer than the body')
  const extrasOver = set(Opcode.SET, 'k', '')
  extrasOver.writeUInt32BE(8, 8) // body 8 < extras 8 + key 1
  t.ok(memcachedFraming.frameBytes(extrasOver, 0) instanceof RpcError, 'extras and key longer than the body')

  t.equal(protocol.maxFrameBytes, 2 * 1024 * 1024, 'twice the item limit')
  t.equal(memcachedProtocol({ maxItemBytes: 4096 }).maxFrameBytes, 8192)
  t.equal(protocol.ordering, 'in-order')
  t.equal(protocol.name, 'memcached')
})

t.test('FrameDecoder splits a pipelined stream into packets however it is cut', async t => {
  const stream = Buffer.concat([set(Opcode.SETQ, 'a', 'x'.repeat(100)), request(Opcode.GETK, { key: 'a' }), request(Opcode.NOOP)])
  for (let cut = 0; cut <= stream.length; cut++) {
    const decoder = new FrameDecoder(memcachedFraming, protocol.maxFrameBytes)
    const sizes: number[] = []
    for (const chunk of [stream.subarray(0, cut), stream.subarray(cut)]) {
      t.equal(decoder.pushRanges(chunk, (_buf, start, end) => { sizes.push(end - start) }), null)
    }
    if (sizes.join() !== '133,25,24') t.fail(`cut at ${cut}: ${sizes.join()}`)
  }
  const decoder = new FrameDecoder(memcachedFraming, protocol.maxFrameBytes)
  const huge = request(Opcode.SET, { key: 'k', extras: u32s(0, 0) })
  huge.writeUInt32BE(2 * 1024 * 1024, 8)
  const error = decoder.pushRanges(huge, () => {})
  t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE, 'a frame past twice the item limit closes at its header')
})

t.test('decodeHead: route, opaque, call data, body bounds; no allocation per opcode', async t => {
  const head = new CallHead()
  const frame = Buffer.concat([Buffer.alloc(3), request(Opcode.GETKQ, { key: 'abc', opaque: 0xfedcba98 })])
  head.reset(3, frame.length)
  t.equal(protocol.decodeHead(frame, 3, frame.length, head), null)
  t.equal(head.service, 'memcached')
  t.equal(head.method, 'GETKQ')
  t.equal(head.callId, 0xfedcba98)
  t.equal(opcodeOf(head.data), Opcode.GETKQ)
  t.equal(opaqueOf(head.data), 0xfedcba98)
  t.equal(head.bodyStart, 27)
  t.equal(head.bodyEnd, frame.length)
  const routeKey = head.routeKey
  t.type(routeKey, 'object')
  head.reset(3, frame.length)
  protocol.decodeHead(frame, 3, frame.length, head)
  t.equal(head.routeKey, routeKey, 'the same route key object for the same command')
  const other = request(Opcode.GET, { key: 'abc' })
  head.reset(0, other.length)
  protocol.decodeHead(other, 0, other.length, head)
  t.not(head.routeKey, routeKey)

  t.equal(methodOf(0x50), '0x50', 'an opcode with no command gets a name no route has')
  t.equal(methodOf(0x20), '0x20', 'SASL is not a command of this server')
  for (const [name, opcode] of Object.entries(Opcode)) t.equal(methodOf(opcode), name)
  t.equal(opcodeOf(undefined), 0)
  t.equal(opaqueOf(undefined), 0)
})

t.test('decodeRequest: extras, key and value of each command', async t => {
  const decode = (frame: Buffer): MemcachedRequest | InvalidRequest => {
    const head = new CallHead()
    head.reset(0, frame.length)
    protocol.decodeHead(frame, 0, frame.length, head)
    return protocol.decodeRequest({ service: head.service, method: head.method, spec: undefined }, frame, head)
  }
  const setFrame = request(Opcode.SET, { key: 'kéy', extras: u32s(0xfffffffe, 3600), value: 'val', cas: 0x1234_5678_9abcn })
  const s = decode(setFrame) as MemcachedRequest
  t.match(s, { opcode: Opcode.SET, flags: 0xfffffffe, exptime: 3600, cas: 0x1234_5678_9abc })
  t.equal(s.key.toString('latin1'), 'kéy', 'the key\'s bytes')
  t.equal(s.key.buffer, setFrame.buffer, 'the key is a view of the frame')
  t.equal(s.value.toString(), 'val')
  t.equal(s.value.buffer, setFrame.buffer, 'the value is a view of the frame')
  const i = decode(request(Opcode.DECREMENTQ, { key: 'n', extras: incrExtras(0xffff_ffff_ffff_ffffn, 1n << 40n, 0xffffffff) })) as MemcachedRequest
  t.match(i, { delta: 0xffff_ffff_ffff_ffffn, initial: 1n << 40n, exptime: 0xffffffff })
  const gat = decode(request(Opcode.GAT, { key: 'k', extras: u32s(77) })) as MemcachedRequest
  t.match(gat, { exptime: 77 })
  t.equal(gat.key.toString('latin1'), 'k')
  t.match(decode(request(Opcode.FLUSH, { extras: u32s(9) })), { exptime: 9 })
  t.match(decode(request(Opcode.FLUSH)), { exptime: 0 })
  t.match(decode(request(Opcode.VERBOSITY, { extras: u32s(2) })), { flags: 2 })
  t.equal((decode(request(Opcode.STAT, { key: 'settings' })) as MemcachedRequest).key.toString('latin1'), 'settings')
  const noValue = decode(request(Opcode.GET, { key: 'k' })) as MemcachedRequest
  t.equal(noValue.value.length, 0)
  t.equal(decode(request(Opcode.GET, { key: 'k', cas: 0xffff_ffff_ffff_ffffn })).constructor, MemcachedRequest, 'a CAS past 2^53 decodes (and matches nothing)')
})

t.test('decodeRequest: lengths that are wrong for the command are Invalid arguments', async t => {
  const h = new Harness()
  const invalid = (opcode: number) => response(opcode, { status: 0x04, value: 'Invalid arguments' })
  const cases: [string, Buffer][] = [
    ['GET with extras', request(Opcode.GET, { key: 'k', extras: u32s(1) })],
    ['GET without a key', request(Opcode.GET)],
    ['GETQ with a value', request(Opcode.GETQ, { key: 'k', value: 'v' })],
    ['SET without extras', request(Opcode.SET, { key: 'k', value: 'v' })],
    ['SETQ without a key', request(Opcode.SETQ, { extras: u32s(0, 0), value: 'v' })],
    ['ADD with 4 bytes of extras', request(Opcode.ADD, { key: 'k', extras: u32s(0) })],
    ['DELETE with a value', request(Opcode.DELETE, { key: 'k', value: 'v' })],
    ['INCREMENT with 8 bytes of extras', request(Opcode.INCREMENT, { key: 'k', extras: u32s(0, 0) })],
    ['DECREMENT with a value', request(Opcode.DECREMENT, { key: 'k', extras: incrExtras(1n, 0n, 0), value: 'v' })],
    ['APPEND with extras', request(Opcode.APPEND, { key: 'k', extras: u32s(0), value: 'v' })],
    ['PREPENDQ without a key', request(Opcode.PREPENDQ, { value: 'v' })],
    ['FLUSH with a key', request(Opcode.FLUSH, { key: 'k' })],
    ['FLUSHQ with 8 bytes of extras', request(Opcode.FLUSHQ, { extras: u32s(0, 0) })],
    ['NOOP with a value', request(Opcode.NOOP, { value: 'x' })],
    ['VERSION with a key', request(Opcode.VERSION, { key: 'k' })],
    ['QUIT with extras', request(Opcode.QUIT, { extras: u32s(0) })],
    ['STAT with extras', request(Opcode.STAT, { extras: u32s(0) })],
    ['STAT with a value', request(Opcode.STAT, { key: 'k', value: 'v' })],
    ['TOUCH without extras', request(Opcode.TOUCH, { key: 'k' })],
    ['GAT without a key', request(Opcode.GAT, { extras: u32s(0) })],
    ['GATKQ with a value', request(Opcode.GATKQ, { key: 'k', extras: u32s(0), value: 'v' })],
    ['VERBOSITY without extras', request(Opcode.VERBOSITY)],
    ['a key of 251 bytes', request(Opcode.GET, { key: 'k'.repeat(251) })]
  ]
  for (const [what, frame] of cases) {
    const outcome = h.send(frame)
    t.equal(toHex(outcome.answer!), hexOf(invalid(frame[1]!)), what)
    t.equal(outcome.closed, true, `${what}: answered, then closed, as memcached 1.6 does`)
  }
  t.equal(h.answer(request(Opcode.GET, { key: 'k'.repeat(250) })), hexOf(response(Opcode.GET, NOT_FOUND)), 'a key of 250 bytes is fine')
})

t.test('GET, GETQ, GETK, GETKQ', async t => {
  const h = new Harness()
  t.equal(h.answer(set(Opcode.SET, 'key', 'hello', 0x01020304)), hexOf(response(Opcode.SET, { cas: 1n })))
  const hit = { extras: u32s(0x01020304), value: 'hello', cas: 1n }
  t.equal(h.answer(request(Opcode.GET, { key: 'key' })), hexOf(response(Opcode.GET, hit)))
  t.equal(h.answer(request(Opcode.GETQ, { key: 'key' })), hexOf(response(Opcode.GETQ, hit)), 'a quiet hit is sent')
  t.equal(h.answer(request(Opcode.GETK, { key: 'key' })), hexOf(response(Opcode.GETK, { ...hit, key: 'key' })))
  t.equal(h.answer(request(Opcode.GETKQ, { key: 'key' })), hexOf(response(Opcode.GETKQ, { ...hit, key: 'key' })))

  t.equal(h.answer(request(Opcode.GET, { key: 'nope' })), hexOf(response(Opcode.GET, NOT_FOUND)))
  t.equal(h.answer(request(Opcode.GETQ, { key: 'nope' })), 'silent', 'a quiet miss is not')
  t.equal(h.answer(request(Opcode.GETK, { key: 'nope' })), hexOf(response(Opcode.GETK, { status: 0x01, key: 'nope' })), 'GETK\'s miss carries the key, no text')
  t.equal(h.answer(request(Opcode.GETKQ, { key: 'nope' })), 'silent')
})

t.test('SET, SETQ: success carries the new CAS; errors are never quiet', async t => {
  const h = new Harness()
  t.equal(h.answer(set(Opcode.SET, 'k', 'v')), hexOf(response(Opcode.SET, { cas: 1n })))
  t.equal(h.answer(set(Opcode.SETQ, 'k', 'w')), 'silent')
  t.equal(h.answer(set(Opcode.SET, 'k', 'x', 0, 0, 2n)), hexOf(response(Opcode.SET, { cas: 3n })), 'the right CAS')
  t.equal(h.answer(set(Opcode.SET, 'k', 'y', 0, 0, 2n)), hexOf(response(Opcode.SET, EXISTS)), 'a stale CAS')
  t.equal(h.answer(set(Opcode.SETQ, 'k', 'y', 0, 0, 2n)), hexOf(response(Opcode.SETQ, EXISTS)), 'SETQ\'s failure is sent, with its own opcode')
  t.equal(h.answer(set(Opcode.SETQ, 'absent', 'y', 0, 0, 5n)), hexOf(response(Opcode.SETQ, NOT_FOUND)))
  const tooLarge = request(Opcode.SETQ, { key: 'k', extras: u32s(0, 0), value: Buffer.alloc(1024 * 1024) })
  t.equal(h.answer(tooLarge), hexOf(response(Opcode.SETQ, { status: 0x03, value: 'Too large.' })))
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, NOT_FOUND)), 'the failed SET dropped the old value')
})

t.test('ADD, ADDQ', async t => {
  const h = new Harness()
  t.equal(h.answer(set(Opcode.ADD, 'k', 'v')), hexOf(response(Opcode.ADD, { cas: 1n })))
  t.equal(h.answer(set(Opcode.ADD, 'k', 'v')), hexOf(response(Opcode.ADD, EXISTS)))
  t.equal(h.answer(set(Opcode.ADDQ, 'k2', 'v')), 'silent')
  t.equal(h.answer(set(Opcode.ADDQ, 'k2', 'v')), hexOf(response(Opcode.ADDQ, EXISTS)))
})

t.test('REPLACE, REPLACEQ', async t => {
  const h = new Harness()
  t.equal(h.answer(set(Opcode.REPLACE, 'k', 'v')), hexOf(response(Opcode.REPLACE, NOT_FOUND)))
  t.equal(h.answer(set(Opcode.REPLACEQ, 'k', 'v')), hexOf(response(Opcode.REPLACEQ, NOT_FOUND)))
  h.send(set(Opcode.SET, 'k', 'v'))
  t.equal(h.answer(set(Opcode.REPLACE, 'k', 'w', 9)), hexOf(response(Opcode.REPLACE, { cas: 2n })))
  t.equal(h.answer(set(Opcode.REPLACEQ, 'k', 'x')), 'silent')
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, { extras: u32s(0), value: 'x', cas: 3n })))
})

t.test('DELETE, DELETEQ: success has CAS 0', async t => {
  const h = new Harness()
  h.send(set(Opcode.SET, 'k', 'v'))
  t.equal(h.answer(request(Opcode.DELETE, { key: 'k', cas: 7n })), hexOf(response(Opcode.DELETE, EXISTS)))
  t.equal(h.answer(request(Opcode.DELETE, { key: 'k', cas: 1n })), hexOf(response(Opcode.DELETE)))
  t.equal(h.answer(request(Opcode.DELETE, { key: 'k' })), hexOf(response(Opcode.DELETE, NOT_FOUND)))
  h.send(set(Opcode.SET, 'k', 'v'))
  t.equal(h.answer(request(Opcode.DELETEQ, { key: 'k' })), 'silent')
  t.equal(h.answer(request(Opcode.DELETEQ, { key: 'k' })), hexOf(response(Opcode.DELETEQ, NOT_FOUND)))
})

t.test('INCREMENT, INCREMENTQ, DECREMENT, DECREMENTQ: the number as 8 bytes, and the CAS', async t => {
  const h = new Harness()
  t.equal(h.answer(request(Opcode.INCREMENT, { key: 'n', extras: incrExtras(1n, 10n, 0) })), hexOf(response(Opcode.INCREMENT, { value: u64(10n), cas: 1n })), 'created with the initial value')
  t.equal(h.answer(request(Opcode.INCREMENT, { key: 'n', extras: incrExtras(5n, 10n, 0) })), hexOf(response(Opcode.INCREMENT, { value: u64(15n), cas: 2n })))
  t.equal(h.answer(request(Opcode.INCREMENTQ, { key: 'n', extras: incrExtras(5n, 0n, 0) })), 'silent')
  t.equal(h.answer(request(Opcode.DECREMENT, { key: 'n', extras: incrExtras(30n, 0n, 0) })), hexOf(response(Opcode.DECREMENT, { value: u64(0n), cas: 4n })), 'stops at 0')
  t.equal(h.answer(request(Opcode.DECREMENTQ, { key: 'n', extras: incrExtras(1n, 0n, 0) })), 'silent')
  t.equal(h.answer(request(Opcode.INCREMENT, { key: 'n', extras: incrExtras(0xffff_ffff_ffff_ffffn, 0n, 0) })), hexOf(response(Opcode.INCREMENT, { value: u64(0xffff_ffff_ffff_ffffn), cas: 6n })))
  t.equal(h.answer(request(Opcode.INCREMENT, { key: 'n', extras: incrExtras(2n, 0n, 0) })), hexOf(response(Opcode.INCREMENT, { value: u64(1n), cas: 7n })), 'wraps at 2^64')

  t.equal(h.answer(request(Opcode.INCREMENT, { key: 'none', extras: incrExtras(1n, 0n, 0xffffffff) })), hexOf(response(Opcode.INCREMENT, NOT_FOUND)), 'exptime 0xffffffff: no creation')
  t.equal(h.answer(request(Opcode.DECREMENTQ, { key: 'none', extras: incrExtras(1n, 0n, 0xffffffff) })), hexOf(response(Opcode.DECREMENTQ, NOT_FOUND)))
  h.send(set(Opcode.SET, 'text', 'abc'))
  const badValue = { status: 0x06, value: 'Non-numeric server-side value for incr or decr' }
  t.equal(h.answer(request(Opcode.INCREMENTQ, { key: 'text', extras: incrExtras(1n, 0n, 0) })), hexOf(response(Opcode.INCREMENTQ, badValue)))
  t.equal(h.answer(request(Opcode.DECREMENT, { key: 'n', extras: incrExtras(1n, 0n, 0), cas: 1n })), hexOf(response(Opcode.DECREMENT, EXISTS)))
})

t.test('APPEND, APPENDQ, PREPEND, PREPENDQ', async t => {
  const h = new Harness()
  h.send(set(Opcode.SET, 'k', 'mid', 5))
  t.equal(h.answer(request(Opcode.APPEND, { key: 'k', value: '>' })), hexOf(response(Opcode.APPEND, { cas: 2n })))
  t.equal(h.answer(request(Opcode.APPENDQ, { key: 'k', value: '>' })), 'silent')
  t.equal(h.answer(request(Opcode.PREPEND, { key: 'k', value: '<' })), hexOf(response(Opcode.PREPEND, { cas: 4n })))
  t.equal(h.answer(request(Opcode.PREPENDQ, { key: 'k', value: '<' })), 'silent')
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, { extras: u32s(5), value: '<<mid>>', cas: 5n })), 'flags kept')
  t.equal(h.answer(request(Opcode.APPEND, { key: 'none', value: 'x' })), hexOf(response(Opcode.APPEND, NOT_STORED)))
  t.equal(h.answer(request(Opcode.PREPENDQ, { key: 'none', value: 'x' })), hexOf(response(Opcode.PREPENDQ, NOT_STORED)))
  t.equal(h.answer(request(Opcode.APPENDQ, { key: 'k', value: 'x', cas: 1n })), hexOf(response(Opcode.APPENDQ, EXISTS)))
})

t.test('FLUSH, FLUSHQ', async t => {
  const h = new Harness()
  h.send(set(Opcode.SET, 'k', 'v'))
  t.equal(h.answer(request(Opcode.FLUSH)), hexOf(response(Opcode.FLUSH)))
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, NOT_FOUND)))
  h.send(set(Opcode.SET, 'k', 'v'))
  t.equal(h.answer(request(Opcode.FLUSHQ, { extras: u32s(0) })), 'silent', 'with a 4-byte delay of 0')
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, NOT_FOUND)))
  h.send(set(Opcode.SET, 'k', 'v'))
  t.equal(h.answer(request(Opcode.FLUSH, { extras: u32s(60) })), hexOf(response(Opcode.FLUSH)), 'a delayed flush')
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, { extras: u32s(0), value: 'v', cas: 3n })), 'the delay has not passed')
})

t.test('NOOP, VERSION, VERBOSITY', async t => {
  const h = new Harness()
  t.equal(h.answer(request(Opcode.NOOP)), hexOf(response(Opcode.NOOP)))
  t.equal(h.answer(request(Opcode.VERSION)), hexOf(response(Opcode.VERSION, { value: '1.6.0-test' })))
  t.equal(h.answer(request(Opcode.VERBOSITY, { extras: u32s(1) })), hexOf(response(Opcode.VERBOSITY)))
  const byDefault = memcachedHandlers(new MemcachedStore()).VERSION(null as unknown as MemcachedRequest, { closeConnection () {} })
  t.equal(Buffer.from(byDefault.value).toString(), '1.6.0-nyala', 'the default version leads with major.minor.patch')
})

t.test('QUIT answers, then closes; QUITQ closes without a word', async t => {
  const h = new Harness()
  t.same(h.send(request(Opcode.QUIT)), { answer: response(Opcode.QUIT), closed: true, sliced: false })
  t.same(h.send(request(Opcode.QUITQ)), { answer: null, closed: true, sliced: false })
  t.equal(h.send(request(Opcode.NOOP)).closed, false)
})

t.test('STAT: one packet per statistic, then an empty one; sub-commands', async t => {
  const h = new Harness()
  h.send(set(Opcode.SET, 'k', 'v'))
  h.send(request(Opcode.GET, { key: 'k' }))
  const { answer } = h.send(request(Opcode.STAT))
  const packets: { key: string, value: string }[] = []
  let at = 0
  while (at < answer!.length) {
    const keyBytes = answer!.readUInt16BE(at + 2)
    const bodyBytes = answer!.readUInt32BE(at + 8)
    t.equal(answer![at], 0x81)
    t.equal(answer![at + 1], Opcode.STAT)
    t.equal(answer![at + 4], 0, 'no extras')
    t.equal(answer!.readUInt16BE(at + 6), 0, 'success')
    t.equal(answer!.readUInt32BE(at + 12), OPAQUE)
    t.equal(answer!.readBigUInt64BE(at + 16), 0n, 'CAS 0')
    packets.push({ key: answer!.toString('latin1', at + 24, at + 24 + keyBytes), value: answer!.toString('latin1', at + 24 + keyBytes, at + 24 + bodyBytes) })
    at += 24 + bodyBytes
  }
  t.equal(at, answer!.length)
  t.same(packets.at(-1), { key: '', value: '' }, 'the last packet is empty')
  const stats = new Map(packets.slice(0, -1).map(p => [p.key, p.value]))
  t.equal(stats.get('pid'), String(process.pid))
  t.equal(stats.get('version'), '1.6.0-test')
  t.equal(stats.get('curr_items'), '1')
  t.equal(stats.get('get_hits'), '1')
  t.equal(stats.get('cmd_set'), '1')
  t.equal(stats.get('limit_maxbytes'), String(64 * 1024 * 1024))
  t.ok(packets.slice(0, -1).every(p => p.key.length > 0 && p.value.length > 0))

  t.equal(h.answer(request(Opcode.STAT, { key: 'reset' })), hexOf(response(Opcode.STAT)), 'reset: the end packet alone')
  t.equal(h.store.stats.get_hits, 0)
  t.equal(h.answer(request(Opcode.STAT, { key: 'bogus' })), hexOf(response(Opcode.STAT, NOT_FOUND)))
  const settings = h.send(request(Opcode.STAT, { key: 'settings' })).answer!
  t.ok(settings.includes('item_size_max1048576'))
  t.same(settings.subarray(-24), response(Opcode.STAT))
})

t.test('TOUCH, GAT, GATQ, GATK, GATKQ', async t => {
  const h = new Harness()
  h.send(set(Opcode.SET, 'k', 'hello', 7))
  const hit = { extras: u32s(7), cas: 1n }
  t.equal(h.answer(request(Opcode.TOUCH, { key: 'k', extras: u32s(100) })), hexOf(response(Opcode.TOUCH, hit)), 'TOUCH: the flags, no value (as memcached)')
  t.equal(h.answer(request(Opcode.GAT, { key: 'k', extras: u32s(100) })), hexOf(response(Opcode.GAT, { ...hit, value: 'hello' })))
  t.equal(h.answer(request(Opcode.GATQ, { key: 'k', extras: u32s(100) })), hexOf(response(Opcode.GATQ, { ...hit, value: 'hello' })))
  t.equal(h.answer(request(Opcode.GATK, { key: 'k', extras: u32s(100) })), hexOf(response(Opcode.GATK, { ...hit, key: 'k', value: 'hello' })))
  t.equal(h.answer(request(Opcode.GATKQ, { key: 'k', extras: u32s(100) })), hexOf(response(Opcode.GATKQ, { ...hit, key: 'k', value: 'hello' })))

  t.equal(h.answer(request(Opcode.TOUCH, { key: 'no', extras: u32s(100) })), hexOf(response(Opcode.TOUCH, NOT_FOUND)))
  t.equal(h.answer(request(Opcode.GAT, { key: 'no', extras: u32s(100) })), hexOf(response(Opcode.GAT, NOT_FOUND)))
  t.equal(h.answer(request(Opcode.GATQ, { key: 'no', extras: u32s(100) })), 'silent')
  t.equal(h.answer(request(Opcode.GATK, { key: 'no', extras: u32s(100) })), hexOf(response(Opcode.GATK, { status: 0x01, key: 'no' })))
  t.equal(h.answer(request(Opcode.GATKQ, { key: 'no', extras: u32s(100) })), 'silent')
})

t.test('TOUCH and GAT change the expiry', async t => {
  let now = 1_800_000_000_000
  const h = new Harness(new MemcachedStore({ now: () => now }))
  h.send(set(Opcode.SET, 'k', 'v', 0, 10))
  h.send(request(Opcode.TOUCH, { key: 'k', extras: u32s(100) }))
  now += 50_000
  t.equal(h.send(request(Opcode.GET, { key: 'k' })).answer![7], 0, 'still there after 50 s')
  h.send(request(Opcode.GAT, { key: 'k', extras: u32s(1) }))
  now += 1000
  t.equal(h.answer(request(Opcode.GET, { key: 'k' })), hexOf(response(Opcode.GET, NOT_FOUND)))
})

t.test('every command has a handler; an unknown opcode is Unknown command', async t => {
  const h = new Harness()
  t.same(Object.keys(h.handlers).sort(), (Object.keys(Opcode) as CommandName[]).sort())
  for (const opcode of [0x1f, 0x20, 0x21, 0x50, 0xff]) {
    t.equal(h.answer(request(opcode, { key: 'k', value: 'abc' })), hexOf(response(opcode, { status: 0x81, value: 'Unknown command' })), `opcode 0x${opcode.toString(16)}`)
  }
})

t.test('large values go as their own slice, the stored buffer itself', async t => {
  const h = new Harness()
  const value = Buffer.alloc(100_000)
  for (let i = 0; i < value.length; i++) value[i] = i % 251
  h.send(request(Opcode.SET, { key: 'big', extras: u32s(3, 0), value }))
  const outcome = h.send(request(Opcode.GETK, { key: 'big' }))
  t.equal(outcome.sliced, true)
  t.same(outcome.answer, response(Opcode.GETK, { key: 'big', extras: u32s(3), value, cas: 1n }))
  const head = new CallHead()
  const frame = request(Opcode.GET, { key: 'big' })
  head.reset(0, frame.length)
  protocol.decodeHead(frame, 0, frame.length, head)
  const call: AnsweredCall = { service: head.service, method: head.method, callId: head.callId, data: head.data, route: { service: 'memcached', method: 'GET', spec: undefined } }
  const answer = h.handlers.GET!(protocol.decodeRequest(call.route, frame, head) as MemcachedRequest, { closeConnection () {} })
  const slices = encodedSlices((out) => protocol.encode(call, answer, out))
  t.equal(slices.length, 2)
  const stored = h.store.get('big')!.value
  t.ok(slices[1]!.buffer === stored.buffer && slices[1]!.byteOffset === stored.byteOffset && slices[1]!.length === stored.length, 'no copy of the value')
  t.equal(slices[0]!.length, 28)
  const small = memcachedProtocol({ sliceValueBytes: 200_000 })
  const copied = encodedSlices((out) => small.encode(call, answer, out))
  t.equal(copied.length, 1, 'under the threshold it is copied')
  t.equal(copied[0]!.length, 24 + 4 + 100_000)
})

t.test('refusals: the status of each reason, opcode and opaque kept, never quiet', async t => {
  const expected: Record<RefusalReason, [number, string]> = {
    busy: [0x85, 'Busy'],
    expired: [0x85, 'Busy'],
    'timed-out': [0x85, 'Busy'],
    shutdown: [0x86, 'Temporary failure'],
    unavailable: [0x86, 'Temporary failure'],
    'no-service': [0x81, 'Unknown command'],
    'no-method': [0x81, 'Unknown command'],
    invalid: [0x04, 'Invalid arguments'],
    failed: [0x84, 'Internal error'],
    abandoned: [0x84, 'Internal error']
  }
  const head = new CallHead()
  const frame = set(Opcode.SETQ, 'k', 'v')
  head.reset(0, frame.length)
  protocol.decodeHead(frame, 0, frame.length, head)
  for (const [reason, [status, text]] of Object.entries(expected) as [RefusalReason, [number, string]][]) {
    t.equal(refusalStatus(reason), status)
    const slices = protocol.refusal(head, reason, 'server-side detail that is not sent')
    t.equal(toHex(joinSlices(slices!)), hexOf(response(Opcode.SETQ, { status, value: text })), reason)
  }
})

t.test('isSilent: which commands leave out which answers', async t => {
  const successQuiet = [Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ, Opcode.DELETEQ, Opcode.INCREMENTQ, Opcode.DECREMENTQ, Opcode.QUITQ, Opcode.FLUSHQ, Opcode.APPENDQ, Opcode.PREPENDQ]
  const missQuiet = [Opcode.GETQ, Opcode.GETKQ, Opcode.GATQ, Opcode.GATKQ]
  for (const opcode of Object.values(Opcode)) {
    t.equal(isSilent(opcode, 0x00), successQuiet.includes(opcode as never), `${methodOf(opcode)} success`)
    t.equal(isSilent(opcode, 0x01), missQuiet.includes(opcode as never), `${methodOf(opcode)} miss`)
    for (const status of [0x02, 0x03, 0x04, 0x05, 0x06, 0x81, 0x84, 0x85]) {
      if (isSilent(opcode, status)) t.fail(`${methodOf(opcode)} status ${status} must be sent`)
    }
  }
})

t.test('a pipeline of quiet gets ended by a NOOP, as clients send multi-gets', async t => {
  const h = new Harness()
  for (const key of ['a', 'c']) h.send(set(Opcode.SETQ, key, key.toUpperCase()))
  const answers = ['a', 'b', 'c', 'd'].map((key, i) => h.send(request(Opcode.GETKQ, { key, opaque: i })).answer)
  answers.push(h.send(request(Opcode.NOOP, { opaque: 9 })).answer)
  t.same(answers, [
    response(Opcode.GETKQ, { key: 'a', extras: u32s(0), value: 'A', cas: 1n, opaque: 0 }),
    null,
    response(Opcode.GETKQ, { key: 'c', extras: u32s(0), value: 'C', cas: 2n, opaque: 2 }),
    null,
    response(Opcode.NOOP, { opaque: 9 })
  ])
})
