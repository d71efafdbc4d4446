/**
 * `encodeScratch` writes into one writer the codec reuses: its bytes equal
 * `encode`'s, a message that grew the writer past its keep size leaves it
 * for a fresh one (so one large message pins no memory), and an encode that
 * fails leaves no half-written state for the next. `decodeRange` decodes a
 * slice of a larger buffer exactly as `decode` decodes a copy of it.
 */
import t from 'tap'
import { RpcError } from '../../codec/errors.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { ProtoSchema } from '../../codec/protobuf/schema.js'

const Add = CalculatorService.methods.Add
const Echo = CalculatorService.methods.Echo

t.test('scratch bytes equal encode bytes, and are valid until the next encode', async t => {
  for (const message of [{ x: 0, y: 0 }, { x: 1, y: 2 }, { x: 0xffffffff, y: 7 }]) {
    const scratch = Buffer.from(Add.requestType.encodeScratch(message))
    t.same(scratch, Buffer.from(Add.requestType.encode(message)))
  }
  const first = Add.requestType.encodeScratch({ x: 300, y: 1 })
  const copy = Buffer.from(first)
  Add.requestType.encodeScratch({ x: 1, y: 1 })
  t.notSame(Buffer.from(first), copy, 'the next encode reuses the same bytes: callers must copy at once')
})

t.test('a large message does not keep its writer; later encodes still match', async t => {
  const big = { data: 'x'.repeat(200 * 1024) }
  const bigBytes = Echo.requestType.encodeScratch(big)
  t.equal(bigBytes.length, Echo.requestType.encode(big).length)
  const small = Echo.requestType.encodeScratch({ data: 'hi' })
  t.not(small.buffer, bigBytes.buffer, 'a fresh writer after the large one')
  t.same(Buffer.from(small), Buffer.from(Echo.requestType.encode({ data: 'hi' })))
  t.equal(Buffer.from(bigBytes).toString('latin1', bigBytes.length - 3), 'xxx', 'the large result is untouched')
})

t.test('a failed encode leaves the scratch writer clean', async t => {
  t.throws(() => Add.requestType.encodeScratch({ x: 1 } as never), { message: /missing fields: y/ })
  t.throws(() => Add.requestType.encodeScratch({ x: 'one', y: 1 } as never), { message: /invalid nyala\.demo\.AddRequestPB/ })
  t.same(Buffer.from(Add.requestType.encodeScratch({ x: 5, y: 6 })), Buffer.from(Add.requestType.encode({ x: 5, y: 6 })))
})

t.test('decodeRange reads a slice in place, and reports bad bytes as errors', async t => {
  const body = Add.requestType.encode({ x: 41, y: 1 })
  const padded = Buffer.concat([Buffer.from([0xff, 0xff, 0xff]), body, Buffer.from([0x08, 0x09])])
  t.same(Add.requestType.decodeRange(padded, 3, 3 + body.length), { x: 41, y: 1 })
  const missing = Add.requestType.decodeRange(padded, 3, 5)
  t.type(missing, RpcError)
  t.match((missing as RpcError).message, /missing fields: y/)
  const truncated = Add.requestType.decodeRange(Buffer.from([0x08]), 0, 1)
  t.type(truncated, RpcError)
})

t.test('encodeToScratch leaves the bytes encode gives in the shared scratch; decodeRange reads a range of any buffer', async t => {
  const scratch = Add.requestType.encodeToScratch({ x: 300, y: 1 })
  t.same(Buffer.from(scratch.bytes.subarray(0, scratch.length)), Buffer.from(Add.requestType.encode({ x: 300, y: 1 })))
  const big = { data: 'x'.repeat(100_000) }
  const bigScratch = Echo.requestType.encodeToScratch(big)
  t.equal(bigScratch.length, Echo.requestType.encode(big).length, 'a message larger than the kept writer')
  t.same(Echo.requestType.decodeRange(Buffer.from(bigScratch.bytes.subarray(0, bigScratch.length)), 0, bigScratch.length), big)
  t.throws(() => Add.requestType.encodeToScratch({ x: 1 } as never), { message: /missing fields: y/ })
  const after = Add.requestType.encodeToScratch({ x: 5, y: 6 })
  t.same(Buffer.from(after.bytes.subarray(0, after.length)), Buffer.from(Add.requestType.encode({ x: 5, y: 6 })), 'a throw left no half-written scratch behind')

  // A range inside a larger buffer, a Buffer or a plain Uint8Array; a range cut short is an error, not a read past its end.
  const message = Buffer.from(Echo.requestType.encode({ data: 'hello' }))
  const framed = Buffer.concat([Buffer.from([9, 9]), message, Buffer.from([9, 9])])
  t.same(Echo.requestType.decodeRange(framed, 2, 2 + message.length), { data: 'hello' })
  t.same(Echo.requestType.decodeRange(new Uint8Array(framed), 2, 2 + message.length), { data: 'hello' })
  t.type(Echo.requestType.decodeRange(framed, 2, 2 + message.length - 1), RpcError)
  t.same(Echo.requestType.decodeRange(framed, 2, 2 + message.length), { data: 'hello' }, 'the shared reader recovers after an error')
})

t.test('a required field of any type that is absent is named, whichever encode is used', async t => {
  const schema = ProtoSchema.parse(`
    syntax = "proto2";
    package t;
    enum Color { RED = 0; BLUE = 1; }
    message Inner { optional uint32 a = 1; }
    message All {
      required uint32 u = 1; required int64 l = 2; required string s = 3; required bytes b = 4;
      required bool f = 5; required Color c = 6; required Inner m = 7; required double d = 8; required sint32 z = 9;
    }`)
  const All = schema.type<Record<string, unknown>>('t.All')
  const full: Record<string, unknown> = { u: 1, l: 2, s: 'x', b: Buffer.from('y'), f: true, c: 1, m: { a: 1 }, d: 1.5, z: -3 }
  t.ok(All.encode(full).length > 0, 'a complete message encodes')
  for (const name of Object.keys(full)) {
    const partial = { ...full }
    delete partial[name]
    for (const encode of [All.encode, All.encodeScratch, All.encodeToScratch]) {
      t.throws(() => encode(partial), { code: 'RPC_ERR_INVALID_ARGUMENT', message: new RegExp(`missing fields: ${name}$`) }, `${name} absent`)
    }
    t.throws(() => All.encodeToScratch({ ...full, [name]: null }), { message: new RegExp(`missing fields: ${name}$`) }, `${name} null`)
  }
})

t.test('decodeRange reads packed fixed-width fields of each buffer, not of the one it read before', async t => {
  const schema = ProtoSchema.parse(`
    syntax = "proto2";
    package t;
    message Packed { repeated double d = 1 [packed = true]; repeated fixed32 f = 2 [packed = true]; repeated float g = 3 [packed = true]; }`)
  const Packed = schema.type<Record<string, number[]>>('t.Packed')
  const message = (k: number): Record<string, number[]> => ({
    d: Array.from({ length: 16 }, (_, i) => k * 100 + i + 0.5),
    f: Array.from({ length: 200 }, (_, i) => k * 1000 + i),
    g: Array.from({ length: 16 }, (_, i) => k + i)
  })
  for (let k = 1; k <= 3; k++) {
    const bytes = Buffer.from(Packed.encode(message(k)))
    // At an offset inside a larger buffer, as in a frame.
    const frame = Buffer.concat([Buffer.alloc(k * 37, 0xff), bytes, Buffer.alloc(5, 0xff)])
    const decoded = Packed.decodeRange(frame, k * 37, k * 37 + bytes.length)
    t.same(decoded, message(k), `message ${k}: every packed value of this buffer`)
  }
})
