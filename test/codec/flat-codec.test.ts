/**
 * The flat-message fast path (codec/protobuf/flat-codec.ts) against protobufjs: which
 * types qualify; encoding writes protobufjs's bytes exactly, where asked and
 * nowhere else; decoding gives the message protobufjs's decoder gives with
 * the schema's plain constructors (codec/protobuf/plain-messages.ts: a plain object,
 * the same fields and values, defaults as own properties) or leaves the
 * bytes to protobufjs, on valid messages,
 * every prefix of them, random bytes and bytes with unknown fields. Then
 * through MessageType: the fallbacks keep protobufjs's answers and errors.
 */
import t from 'tap'
import fc from 'fast-check'
import protobuf from 'protobufjs'
import { flatCodec } from '../../codec/protobuf/flat-codec.js'
import { ProtoSchema } from '../../codec/protobuf/schema.js'
import { usePlainMessages } from '../../codec/protobuf/plain-messages.js'
import { RpcError } from '../../codec/errors.js'

const source = `syntax = "proto2";
package t;
message All {
  required uint32 u = 1; optional int32 i = 2; optional sint32 s = 3; optional bool b = 4;
  optional fixed32 f = 5; optional sfixed32 sf = 6; optional float fl = 7; required double d = 8;
  optional uint32 last = 15;
}
message Empty {}
message Str { required string s = 1; }
message Strs { required string a = 1; optional string b = 2; optional uint32 n = 3; }
message Rep { repeated uint32 r = 1; }
message Big { optional uint32 x = 16; }
enum E { A = 0; B = 1; }
message En { optional E e = 1; }
message Long { optional uint64 l = 1; }
message One { oneof o { uint32 a = 1; uint32 b = 2; } }
message Nested { optional Empty e = 1; }
`
const proto3 = `syntax = "proto3";
package t3;
message Implicit { uint32 x = 1; }
message Explicit { optional uint32 x = 1; optional bool b = 2; }
`
const root = protobuf.parse(source, { keepCase: true }).root
const root3 = protobuf.parse(proto3, { keepCase: true }).root
root.resolveAll()
root3.resolveAll()
// protobufjs's decoders, the reference, build messages as ProtoSchema's do: plain objects with their defaults.
usePlainMessages(root, 'bigint')
usePlainMessages(root3, 'bigint')
const All = root.lookupType('t.All')
const flat = flatCodec(All)!

t.test('which types take the fast path', async t => {
  t.ok(flat, 'every scalar kind, required and optional, ids up to 15')
  t.ok(flatCodec(root.lookupType('t.Empty')), 'no fields at all')
  t.ok(flatCodec(root.lookupType('t.Str')), 'a string field')
  for (const name of ['t.Rep', 't.Big', 't.En', 't.Long', 't.One', 't.Nested']) {
    t.equal(flatCodec(root.lookupType(name)), null, `${name}: protobufjs's`)
  }
  t.equal(flatCodec(root3.lookupType('t3.Implicit')), null, 'proto3 implicit presence (zero is not written): protobufjs\'s')
  t.equal(flatCodec(root3.lookupType('t3.Explicit')), null, 'proto3 optional (a oneof of one): protobufjs\'s')
})

// Values each kind may hold once protobufjs's verify accepts them, edges included.
const int = fc.oneof(fc.integer({ min: -(2 ** 31), max: 2 ** 32 - 1 }), fc.constantFrom(0, -0, 1, 127, 128, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, -1, -(2 ** 31), 2 ** 40, -(2 ** 40), Number.MAX_SAFE_INTEGER))
const num = fc.oneof(fc.double(), fc.constantFrom(0, -0, NaN, Infinity, -Infinity, 1.5, 3.4e38, 1e-45))
const opt = <T>(arb: fc.Arbitrary<T>): fc.Arbitrary<T | null | undefined> => fc.option(arb, { nil: undefined, freq: 3 }).chain((v) => fc.constantFrom(v, v, v, null))
const message = fc.record({
  u: int, i: opt(int), s: opt(int), b: opt(fc.boolean()), f: opt(int), sf: opt(int), fl: opt(num), d: num, last: opt(int),
  extra: opt(fc.string())
}, { requiredKeys: ['u', 'd'] })

// Values verify refuses, next to valid ones.
const loose = fc.oneof(fc.constantFrom('1', 1.5, NaN, Infinity, true, null, undefined, {}, []), int, num)
const looseMessage = fc.record({ u: loose, i: loose, s: loose, b: fc.oneof(fc.boolean(), loose), f: loose, sf: loose, fl: loose, d: loose, last: loose })

t.test('measuring refuses exactly what protobufjs\'s verify refuses', async t => {
  fc.assert(fc.property(fc.oneof(looseMessage, message), (m) => {
    const refused = All.verify(m) !== null
    const length = flat.length(m)
    if (refused && length !== -1) throw new Error(`measured what verify refuses: ${JSON.stringify(m)}`)
    if (!refused && length === -1 && !(typeof m.i === 'number' && (m.i | 0) < 0)) throw new Error(`refused what verify accepts: ${JSON.stringify(m)}`)
  }), { numRuns: 5000 })
  for (const m of [null, 7, 'x', undefined]) t.equal(flat.length(m as never), -1, `${String(m)}: not an object`)
})

t.test('encoding: protobufjs\'s bytes, written where asked and nowhere else', async t => {
  let fast = 0
  fc.assert(fc.property(message, fc.integer({ min: 0, max: 20 }), (m, offset) => {
    if (All.verify(m) !== null) return
    const expected = Buffer.from(All.encode(m).finish())
    const length = flat.length(m)
    if (length < 0) {
      // Only an int32 negative once protobufjs takes it `| 0` (ten bytes) goes to protobufjs.
      if (!(((m.i ?? 0) | 0) < 0)) throw new Error(`unexpected fallback for ${JSON.stringify(m)}`)
      return
    }
    fast++
    const out = Buffer.alloc(offset + length + 20, 0xee)
    const end = flat.write(out, offset)
    if (length !== expected.length || end !== offset + length) throw new Error(`length ${length}, end ${end}, protobufjs ${expected.length}`)
    if (!out.subarray(offset, end).equals(expected)) throw new Error(`bytes ${out.subarray(offset, end).toString('hex')} != ${expected.toString('hex')}`)
    if (out.subarray(0, offset).some((x) => x !== 0xee) || out.subarray(end).some((x) => x !== 0xee)) throw new Error('wrote outside its bytes')
  }), { numRuns: 5000 })
  t.ok(fast > 1000, `${fast} messages took the fast path`)
  t.equal(flat.length({ u: 1, d: 1, $unknowns: [new Uint8Array([0x80, 0x01, 0x01])] }), -1, 'unknown fields from a decode: protobufjs writes them back')
})

t.test('measuring reads each field once, as protobufjs encodes; writing reads nothing', async t => {
  const reads: string[] = []
  const target = { u: 7, i: 3, b: true, d: 0.5, fl: 1.5 }
  const m = new Proxy(target, { get (o, key) { if (typeof key === 'string') reads.push(key); return Reflect.get(o, key) } })
  const length = flat.length(m)
  t.same(reads, ['$unknowns', 'u', 'i', 's', 'b', 'f', 'sf', 'fl', 'd', 'last'], 'each field once, in field-number order')
  reads.length = 0
  const out = Buffer.alloc(length)
  t.equal(flat.write(out, 0), length)
  t.same(reads, [], 'write ran no user code')
  t.same(out, Buffer.from(All.encode(target).finish()))
})

// Same message as protobufjs decodes it: a plain object, the same own keys (protobufjs's
// decoder adds required fields after the defaults, the fast path keeps .proto order), values
// (NaN and -0 included).
function sameMessage (a: object, b: object): boolean {
  if (Object.getPrototypeOf(a) !== Object.prototype || Object.getPrototypeOf(b) !== Object.prototype) return false
  const ka = Object.keys(a).sort()
  const kb = Object.keys(b).sort()
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && Object.is((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]))
}

// protobufjs's answer for bytes[start, end): the message, or 'error'.
function reference (bytes: Uint8Array, start: number, end: number): object | 'error' {
  try {
    const reader = protobuf.Reader.create(bytes)
    reader.pos = start
    return All.decode(reader, end - start)
  } catch {
    return 'error'
  }
}

function agrees (bytes: Uint8Array, start: number, end: number): void {
  const got = flat.decode(bytes, start, end)
  if (got === undefined) return
  const want = reference(bytes, start, end)
  if (want === 'error') throw new Error(`fast path decoded what protobufjs refuses: ${Buffer.from(bytes.subarray(start, end)).toString('hex')}`)
  if (!sameMessage(got, want)) throw new Error(`${JSON.stringify(got)} != ${JSON.stringify(want)} for ${Buffer.from(bytes.subarray(start, end)).toString('hex')}`)
}

t.test('decoding: protobufjs\'s message, or protobufjs decides', async t => {
  let decoded = 0
  fc.assert(fc.property(message, fc.uint8Array({ maxLength: 8 }), (m, tail) => {
    if (All.verify(m) !== null) return
    const bytes = All.encode(m).finish()
    // Inside a larger buffer, as frames hold messages.
    const buf = Buffer.concat([Buffer.from([0xff, 0x08]), bytes, tail])
    const got = flat.decode(buf, 2, 2 + bytes.length)
    if (got !== undefined) decoded++
    else if (!(((m.i ?? 0) | 0) < 0)) throw new Error(`a canonical message fell back: ${Buffer.from(bytes).toString('hex')}`)
    agrees(buf, 2, 2 + bytes.length)
    for (let end = 2; end < 2 + bytes.length; end++) agrees(buf, 2, end)
    agrees(buf, 2, buf.length)
  }), { numRuns: 3000 })
  t.ok(decoded > 1000, `${decoded} messages decoded on the fast path`)
  fc.assert(fc.property(fc.uint8Array({ maxLength: 40 }), (bytes) => { agrees(bytes, 0, bytes.length) }), { numRuns: 20000 })
  // Fields repeated (the last wins), in any order, and a 5-byte varint whose top bits protobufjs drops.
  const shuffled = Buffer.from([0x41, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x08, 0x05, 0x20, 0x01, 0x08, 0x06, 0x78, 0xff, 0xff, 0xff, 0xff, 0x7f])
  t.ok(flat.decode(shuffled, 0, shuffled.length), 'decoded on the fast path')
  agrees(shuffled, 0, shuffled.length)
  t.same({ ...flat.decode(shuffled, 0, shuffled.length) }, { d: 1, u: 6, b: true, last: 0xffffffff, i: 0, s: 0, f: 0, sf: 0, fl: 0 })
  // A bool longer than a byte is protobufjs's: it reads every bit of all ten bytes (the fifth's top bits too).
  for (const hex of ['2080808080100801410000000000000000', '2080011001410000000000000000', '20020801410000000000000000']) {
    const bytes = Buffer.from(hex, 'hex')
    agrees(bytes, 0, bytes.length)
  }
  t.equal(flat.decode(Buffer.from('2080808080100801410000000000000000', 'hex'), 0, 17), undefined, 'a 5-byte bool: protobufjs decides')
  t.same({ ...flat.decode(Buffer.from('20020801410000000000000000', 'hex'), 0, 13) }, { b: true, u: 1, d: 0, i: 0, s: 0, f: 0, sf: 0, fl: 0, last: 0 }, 'bool 2 is true')
  // Unknown fields and wrong wire types are protobufjs's (it keeps unknowns).
  for (const hex of ['41000000000000f03f0805a80101', '41000000000000f03f0a0105', '41000000000000f03f', '0805']) {
    t.equal(flat.decode(Buffer.from(hex, 'hex'), 0, hex.length / 2), undefined, `${hex}: protobufjs decides`)
  }
})

t.test('through MessageType: the fast path and the fallbacks give protobufjs\'s answers', async t => {
  const schema = ProtoSchema.parse(source)
  const all = schema.type<Record<string, unknown>>('t.All')
  const m = { u: 300, i: -5, s: -7, b: true, d: 2.5 }
  t.equal(all.flatLength(m), -1, 'a negative int32 encodes through protobufjs')
  const n = { u: 300, i: 5, s: -7, b: true, d: 2.5 }
  const length = all.flatLength(n)
  const out = Buffer.alloc(length)
  t.equal(all.writeFlat(out, 0), length)
  t.same(out, Buffer.from(all.encode(n)))
  // What verify refuses is left to protobufjs, which names it.
  for (const bad of [{ u: 'x', d: 1 }, { d: 1 }, { u: 1.5, d: 1 }, { u: 1, d: '1' }, { u: 1, d: 1, b: 1 }]) {
    t.equal(all.flatLength(bad), -1, JSON.stringify(bad))
    t.throws(() => all.encodeToScratch(bad), RpcError)
  }
  t.throws(() => all.encodeToScratch({ d: 1 }), /missing fields: u/)
  // A missing required field: protobufjs's error, naming it.
  const missing = all.decodeRange(Buffer.from('0805', 'hex'), 0, 2)
  t.ok(missing instanceof RpcError)
  t.match((missing as RpcError).message, /missing fields: d/)
  // A message with an unknown field, decoded by protobufjs, encodes as protobufjs encodes it.
  const unknown = Buffer.from('41000000000000f03f0805a80101', 'hex')
  const decoded = all.decodeRange(unknown, 0, unknown.length) as Record<string, unknown>
  t.equal(decoded.u, 5)
  const reencoded = Buffer.alloc(Math.max(0, all.flatLength(decoded)))
  if (reencoded.length > 0) all.writeFlat(reencoded, 0)
  t.same(reencoded.length > 0 ? reencoded : Buffer.from(all.encode(decoded)), Buffer.from(all.encode(decoded)))
  const rep = schema.type('t.Rep')
  t.equal(rep.flatLength({ r: [1] }), -1, 'not a flat type')
  t.throws(() => rep.writeFlat(out, 0), /not a flat message type/)
})

// Strings: protobufjs's node writer encodes under 40 UTF-16 units with its
// own UTF-8 encoder (a lone surrogate as three bytes of its own) and from 40
// on with Buffer's (U+FFFD); its reader decodes with Buffer's utf8Slice.
const Strs = root.lookupType('t.Strs')
// A message as JSON with its keys sorted: the same fields and values, whatever their order.
const sorted = (m: object): string => JSON.stringify(Object.fromEntries(Object.entries(m).sort(([a], [b]) => a < b ? -1 : 1)))
const strs = flatCodec(Strs)!
const text = fc.oneof(
  fc.string({ maxLength: 60 }), fc.string({ unit: 'grapheme', maxLength: 50 }), fc.string({ unit: 'binary', maxLength: 50 }),
  fc.constantFrom('', 'a'.repeat(39), 'a'.repeat(40), 'é'.repeat(39), '\ud800', 'x\udc00y', '😀'.repeat(20), 'z'.repeat(200)))
const strMessage = fc.record({ a: text, b: fc.option(text, { nil: undefined }), n: fc.option(fc.integer({ min: 0, max: 2 ** 32 - 1 }), { nil: undefined }) }, { requiredKeys: ['a'] })

t.test('string fields: encoding writes protobufjs\'s bytes exactly, and decoding gives its message', async t => {
  t.ok(strs, 'strings and scalars together take the fast path')
  fc.assert(fc.property(strMessage, fc.integer({ min: 0, max: 7 }), (m, offset) => {
    const want = Buffer.from(Strs.encode(m).finish())
    const length = strs.length(m)
    if (length !== want.length) throw new Error(`measured ${length}, protobufjs wrote ${want.length} for ${JSON.stringify(m)}`)
    const out = Buffer.alloc(offset + length + 3, 0xee)
    if (strs.write(out, offset) !== offset + length) throw new Error('write returned another end')
    if (!out.subarray(offset, offset + length).equals(want)) throw new Error(`bytes differ for ${JSON.stringify(m)}`)
    if (out[offset + length] !== 0xee || (offset > 0 && out[offset - 1] !== 0xee)) throw new Error('wrote outside its room')
    const framed = Buffer.concat([Buffer.from([1, 2]), want, Buffer.from([3])])
    const got = strs.decode(framed, 2, 2 + want.length) as Record<string, unknown>
    const expected = Strs.decode(want) as unknown as Record<string, unknown>
    if (got === undefined || sorted(got) !== sorted(expected) || Object.getPrototypeOf(got) !== Object.prototype || Object.getPrototypeOf(expected) !== Object.prototype) {
      throw new Error(`decoded ${JSON.stringify(got)}, protobufjs ${JSON.stringify(expected)}`)
    }
  }), { numRuns: 3000 })
  // Not a string (verify refuses it): left to protobufjs.
  for (const bad of [{ a: 5 }, { a: 'x', b: 7 }, { a: Object('boxed') }, {}]) t.equal(strs.length(bad as never), -1, JSON.stringify(bad))
})

t.test('string fields: random and truncated bytes decode as protobufjs decodes them, or are left to it', async t => {
  const check = (bytes: Buffer): void => {
    const got = strs.decode(bytes, 0, bytes.length)
    let want: unknown
    try { want = Strs.decode(bytes) } catch { want = undefined }
    if (got === undefined) return
    if (want === undefined || sorted(got) !== sorted(want as object)) throw new Error(`${bytes.toString('hex')}: ${JSON.stringify(got)} != ${JSON.stringify(want)}`)
  }
  fc.assert(fc.property(fc.uint8Array({ maxLength: 40 }), (b) => check(Buffer.from(b))), { numRuns: 20000 })
  const whole = Buffer.from(Strs.encode({ a: 'héllo wörld', b: '\ud800x', n: 300 }).finish())
  for (let end = 0; end <= whole.length; end++) check(whole.subarray(0, end))
  // Invalid UTF-8 becomes U+FFFD, as protobufjs's reader (utf8Slice) makes it.
  const invalid = Buffer.from('0a03ff6162', 'hex')
  t.same({ ...strs.decode(invalid, 0, invalid.length)! }, { ...(Strs.decode(invalid) as object) })
  t.same(Object.keys(strs.decode(invalid, 0, invalid.length)!), ['a', 'b', 'n'], 'fields in .proto order, every one an own property')
})
