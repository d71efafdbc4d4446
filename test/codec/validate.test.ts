// Request validation (codec/protobuf/validate.ts): every kind of refusal names its
// field; valid requests pass, and those that need converting (int64 as
// strings or bigints, enums by name, bytes as base64) reach a real server
// with the values meant; the client refuses exactly what `nyala call`'s
// check refuses, with the same words.
import t from 'tap'
import protobuf from 'protobufjs'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ProtoSchema, type Message } from '../../codec/protobuf/schema.js'
import { isBase64 } from '../../codec/protobuf/validate.js'
import { Server } from '../../reactor/krpc/server.js'
import { CalculatorService, closeServer, newClient, rejection } from '../helpers/reactor-harness.js'

export const TEST_PROTO = `
syntax = "proto2";
package t;
enum Color { RED = 0; GREEN = 1; BLUE = -2; }
message Inner { required uint32 count = 1; optional string name = 2; optional Inner next = 3; }
message All {
  optional int32 i32 = 1; optional uint32 u32 = 2; optional int64 i64 = 3; optional uint64 u64 = 4;
  optional bool b = 5; optional string s = 6; optional bytes by = 7; optional float f = 8; optional double d = 9;
  optional Color color = 10; optional Inner inner = 11; repeated Inner items = 12; repeated uint32 nums = 13;
  map<string, int32> m = 14; oneof choice { int32 p = 15; string q = 16; }
  optional sint32 si = 17; optional fixed32 fx = 18; optional sfixed64 sf64 = 19; map<int32, string> byId = 20;
}
message Req { required uint32 x = 1; required uint32 y = 2; }
message Empty {}
service S { rpc Do(All) returns (All); rpc Add(Req) returns (All); rpc Nothing(Empty) returns (Empty); }
`
const schema = ProtoSchema.parse(TEST_PROTO)
const All = schema.type('t.All')
const Req = schema.type('t.Req')
const service = schema.service('t.S')

// [request, the problem named] for each kind of refusal.
const REFUSED: Array<[unknown, string]> = [
  // Not an object.
  [[1, 2], 'expected an object (t.All), got an array'],
  [null, 'expected an object (t.All), got null'],
  [3, 'expected an object (t.All), got 3'],
  ['x', 'expected an object (t.All), got the string "x"'],
  // Unknown fields, at any depth.
  [{ zz: 1 }, 'zz: no such field in t.All'],
  [{ inner: { count: 1, zz: 2 } }, 'inner.zz: no such field in t.Inner'],
  [{ 'a b': 1 }, '"a b": no such field in t.All'],
  // Missing required fields, at any depth; null is missing too.
  [{ inner: {} }, 'inner.count: required field missing'],
  [{ inner: { count: null } }, 'inner.count: required field missing'],
  [{ inner: { count: 1, next: { name: 'n' } } }, 'inner.next.count: required field missing'],
  [{ items: [{ count: 1 }, {}] }, 'items[1].count: required field missing'],
  // 32-bit integers: type, integer, range.
  [{ u32: 'one' }, 'u32: expected an integer (uint32), got the string "one"'],
  [{ u32: -1 }, 'u32: -1 is out of range for uint32 (0 to 4294967295)'],
  [{ u32: 2 ** 32 }, 'u32: 4294967296 is out of range for uint32 (0 to 4294967295)'],
  [{ u32: 1.5 }, 'u32: 1.5 is not an integer (uint32)'],
  [{ u32: true }, 'u32: expected an integer (uint32), got true'],
  [{ i32: 2 ** 31 }, 'i32: 2147483648 is out of range for int32 (-2147483648 to 2147483647)'],
  [{ i32: '1' }, 'i32: expected an integer (int32), got the string "1"'],
  [{ si: -(2 ** 31) - 1 }, 'si: -2147483649 is out of range for sint32 (-2147483648 to 2147483647)'],
  [{ fx: -1 }, 'fx: -1 is out of range for fixed32 (0 to 4294967295)'],
  [{ inner: { count: -2 } }, 'inner.count: -2 is out of range for uint32 (0 to 4294967295)'],
  // 64-bit integers.
  [{ i64: 2 ** 60 }, 'i64: 1152921504606847000 is not a safe integer: give int64 values beyond 2^53 as a decimal string or a bigint'],
  [{ i64: 1.5 }, 'i64: 1.5 is not an integer (int64)'],
  [{ i64: '12x' }, 'i64: expected an integer (int64), got the string "12x"'],
  [{ i64: '9223372036854775808' }, 'i64: 9223372036854775808 is out of range for int64 (-9223372036854775808 to 9223372036854775807)'],
  [{ i64: true }, 'i64: expected an integer (int64: a number, a bigint, a decimal string or a Long), got true'],
  [{ u64: -1 }, 'u64: -1 is out of range for uint64 (0 to 18446744073709551615)'],
  [{ u64: '-1' }, 'u64: -1 is out of range for uint64 (0 to 18446744073709551615)'],
  [{ u64: 2n ** 64n }, 'u64: 18446744073709551616 is out of range for uint64 (0 to 18446744073709551615)'],
  [{ sf64: { low: 1 } }, 'sf64: expected an integer (sfixed64: a number, a bigint, a decimal string or a Long), got an object'],
  // Booleans, strings, numbers.
  [{ b: 1 }, 'b: expected a boolean, got 1'],
  [{ b: 'true' }, 'b: expected a boolean, got the string "true"'],
  [{ s: 3 }, 's: expected a string, got 3'],
  [{ s: ['a'] }, 's: expected a string, got an array'],
  [{ d: '1.5' }, 'd: expected a number (double), got the string "1.5"'],
  [{ f: 1e39 }, 'f: 1e+39 is out of range for float'],
  // Bytes.
  [{ by: 'A' }, 'by: not valid base64: the string "A"'],
  [{ by: '!!!!' }, 'by: not valid base64: the string "!!!!"'],
  [{ by: 'AA=A' }, 'by: not valid base64: the string "AA=A"'],
  [{ by: 5 }, 'by: expected bytes (a Uint8Array or a base64 string), got 5'],
  [{ by: [1, 2] }, 'by: expected bytes (a Uint8Array or a base64 string), got an array'],
  // Enums, by name or number.
  [{ color: 'PURPLE' }, 'color: expected a value of enum Color (RED, GREEN, BLUE, or its number), got the string "PURPLE"'],
  [{ color: 7 }, 'color: expected a value of enum Color (RED, GREEN, BLUE, or its number), got 7'],
  [{ color: 1.5 }, 'color: expected a value of enum Color (RED, GREEN, BLUE, or its number), got 1.5'],
  // Nested messages and repeated fields.
  [{ inner: 3 }, 'inner: expected an object (t.Inner), got 3'],
  [{ inner: [] }, 'inner: expected an object (t.Inner), got an array'],
  [{ items: { count: 1 } }, 'items: expected an array (repeated field), got an object'],
  [{ items: [{ count: 1 }, 3] }, 'items[1]: expected an object (t.Inner), got 3'],
  [{ items: [{ count: 1 }, { count: 'x' }] }, 'items[1].count: expected an integer (uint32), got the string "x"'],
  [{ nums: [1, -1] }, 'nums[1]: -1 is out of range for uint32 (0 to 4294967295)'],
  [{ nums: [1, null] }, 'nums[1]: expected an integer (uint32), got null'],
  [{ nums: 3 }, 'nums: expected an array (repeated field), got 3'],
  // Maps: values and keys.
  [{ m: { a: 1, b: 'x' } }, 'm["b"]: expected an integer (int32), got the string "x"'],
  [{ m: [] }, 'm: expected an object (map field), got an array'],
  [{ byId: { x: 'a' } }, 'byId: map key "x" is not an integer (int32)'],
  [{ byId: { 2147483648: 'a' } }, 'byId: map key 2147483648 is out of range for int32'],
  // Oneofs.
  [{ p: 1, q: 'a' }, 'q: oneof choice takes one field, got p and q']
]

// Valid requests, and how each reaches the server (the echoed field, as a string).
const VALID: Array<[Message, Record<string, string>]> = [
  [{}, {}],
  [{ u32: 0 }, { u32: '0' }],
  [{ u32: 4294967295, i32: -2147483648, si: -5, fx: 7 }, { u32: '4294967295', i32: '-2147483648', si: '-5', fx: '7' }],
  [{ i64: 5 }, { i64: '5' }],
  [{ i64: '-9223372036854775808' }, { i64: '-9223372036854775808' }],
  [{ i64: -42n }, { i64: '-42' }],
  [{ u64: '18446744073709551615' }, { u64: '18446744073709551615' }],
  [{ u64: 2n ** 63n }, { u64: '9223372036854775808' }],
  [{ sf64: (protobuf.util.Long as unknown as { fromString: (s: string) => object }).fromString('-3') }, { sf64: '-3' }],
  [{ sf64: { low: 4294967293, high: 4294967295 } }, { sf64: '-3' }],
  [{ b: false, s: '', d: 1.5, f: 0.25 }, { b: 'false', s: '', d: '1.5', f: '0.25' }],
  [{ f: Infinity, d: NaN }, { f: 'Infinity', d: 'NaN' }],
  [{ by: 'AAE=' }, { by: '0001' }],
  [{ by: 'AAE' }, { by: '0001' }],
  [{ by: '-_8' }, { by: 'fbff' }],
  [{ by: Buffer.from([9]) }, { by: '09' }],
  [{ color: 'GREEN' }, { color: '1' }],
  [{ color: 'BLUE' }, { color: '-2' }],
  [{ color: 0 }, { color: '0' }],
  [{ inner: { count: 1, next: { count: 2 } } }, { inner: '1,2' }],
  [{ items: [{ count: 3 }, { count: 4, name: 'n' }] }, { items: '3,4' }],
  [{ nums: [1, 2, 3] }, { nums: '1,2,3' }],
  [{ m: { a: 1 }, byId: { '-1': 'x' } }, { m: 'a=1', byId: '-1=x' }],
  [{ p: 1 }, { p: '1' }],
  // Absent optional fields: null and undefined are absent.
  [{ u32: null, s: undefined, inner: null, items: null }, {}]
]

// What each field the request set looks like in the echoed response, as
// strings (whatever the decoder's int64 mode or defaults).
function seen (request: Message, response: Message): Record<string, string> {
  const out: Record<string, string> = {}
  for (const k of Object.keys(request)) {
    const v = response[k]
    if (request[k] == null || v === undefined || v === null) continue
    if (v instanceof Uint8Array) out[k] = Buffer.from(v).toString('hex')
    else if (k === 'inner') {
      const counts: string[] = []
      for (let n = v as Message | undefined; n != null; n = n.next as Message | undefined) counts.push(String(n.count))
      out[k] = counts.join(',')
    } else if (k === 'items') out[k] = (v as Message[]).map((i) => String(i.count)).join(',')
    else if (Array.isArray(v)) out[k] = v.map(String).join(',')
    else if (k === 'm' || k === 'byId') out[k] = Object.entries(v as object).map(([a, b]) => `${a}=${String(b)}`).join(',')
    else out[k] = String(v)
  }
  return out
}

t.test('each refusal names its field and its problem', async (t) => {
  for (const [request, problem] of REFUSED) {
    t.equal(All.validateRequest(request), problem, problem)
    t.throws(() => All.prepareRequest(request as Message), { code: ErrorCode.INVALID_ARGUMENT, message: `invalid t.All: ${problem}` })
  }
})

t.test('valid requests pass; those that encode as they are are not copied', async (t) => {
  for (const [request] of VALID) t.equal(All.validateRequest(request), null, JSON.stringify(request, (_k, v: unknown) => typeof v === 'bigint' ? `${v}n` : v))
  const plain = { u32: 1, inner: { count: 2 }, items: [{ count: 3 }] }
  t.equal(All.prepareRequest(plain), plain, 'the same object')
  const converted = All.prepareRequest({ i64: '7', color: 'GREEN', by: 'AAE=' })
  t.not(converted, undefined)
  t.same(converted.color, 1)
})

t.test('protobufjs messages: defaults on the prototype are not fields that were set', async (t) => {
  const root = protobuf.parse(TEST_PROTO, { keepCase: true }).root
  const ReqType = root.lookupType('t.Req')
  // fromObject leaves y to the prototype's default 0: still missing.
  t.equal(Req.validateRequest(ReqType.fromObject({ x: 1 })), 'y: required field missing')
  t.equal(Req.validateRequest(ReqType.fromObject({ x: 1, y: 2 })), null)
  t.equal(Req.validateRequest(ReqType.decode(ReqType.encode({ x: 1, y: 2 }).finish())), null, 'a decoded message')
  // The demo's Add, as the CLI used to send it.
  const Add = CalculatorService.methods.Add.requestType
  t.equal(Add.validateRequest({ x: 1 }), 'y: required field missing')
  t.equal(Add.validateRequest({ x: 1, y: 2 }), null)
})

t.test('own fields and inherited ones, on plain objects, prototype-less objects and instances', async (t) => {
  // Plain objects skip hasOwnProperty for the fields for-in visits: what
  // counts as set must not change with the kind of object.
  t.equal(Req.validateRequest({ x: 1, y: 2 }), null, 'plain')
  t.equal(Req.validateRequest(Object.assign(Object.create(null), { x: 1, y: 2 })), null, 'no prototype')
  t.equal(Req.validateRequest(Object.create({ y: 2 }, { x: { value: 1, enumerable: true } })), 'y: required field missing', 'y only inherited')
  t.equal(Req.validateRequest(Object.defineProperty({ x: 1 }, 'y', { value: 2, enumerable: false })), null, 'y own but not enumerable')
  class Pair { x = 1; y = 2 }
  t.equal(Req.validateRequest(new Pair()), null, 'an instance')
  class Base { y = 2 }
  class Derived extends Base { x = 1 }
  t.equal(Req.validateRequest(new Derived()), null, 'fields set by a base class constructor are own')
  const proto = { y: 2 }
  t.equal(Req.validateRequest(Object.assign(Object.create(proto), { x: 1 })), 'y: required field missing', 'inherited y, x own')
  t.equal(Req.validateRequest(Object.assign(Object.create(proto), { x: 1, y: 3 })), null, 'y own and inherited')
  // The snapshot a scalar-only type answers holds this request's values, call after call.
  t.same({ ...Req.prepareRequest({ x: 1, y: 2 }) }, { x: 1, y: 2 })
  t.same({ ...Req.prepareRequest({ x: 5, y: 6 }) }, { x: 5, y: 6 })
})

t.test('base64 as Buffer and protobufjs decode it', async (t) => {
  for (const s of ['', 'AA', 'AAA', 'AAAA', 'AA==', 'AAA=', '-_8', '+/8=', 'SGVsbG8']) t.ok(isBase64(s), s)
  for (const s of ['A', 'AAAAA', 'A===', 'AA=', '=', 'AA=A', 'AA AA', 'Zm9v\n', 'é']) t.notOk(isBase64(s), s)
})

t.test('the client refuses exactly what the CLI check refuses, with the same words; the rest reach the server as meant', async (t) => {
  const server = new Server()
  let handled = 0
  server.addService(service, {
    Do: (request: unknown) => { handled++; return request },
    Add: () => ({}),
    Nothing: () => ({})
  })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => closeServer(server))
  const endpoint = `127.0.0.1:${port}`
  const client = newClient(t, { endpoint })
  const stub = client.service(service)
  const counts = { refused: 0, sameWords: 0, ok: 0, asMeant: 0 }
  for (const [request, problem] of REFUSED) {
    const cli = All.validateRequest(request)
    const error = await rejection(client.call(endpoint, service, 'Do', request as Message, { timeoutMs: 5000 }))
    if (error.code === ErrorCode.INVALID_ARGUMENT) counts.refused++
    if (cli !== null && error.message === `invalid t.All: ${cli}`) counts.sameWords++
    else t.fail(`${problem}: the client said ${error.message}`)
    // Through the typed stub too.
    const viaStub = await rejection((stub.Do as (r: unknown) => Promise<unknown>)(request))
    t.equal(viaStub.message, `invalid t.All: ${problem}`)
  }
  for (const [request, expected] of VALID) {
    t.equal(All.validateRequest(request), null)
    const result = await client.call(endpoint, service, 'Do', request, { timeoutMs: 5000 })
    counts.ok++
    const got = seen(request, result.response)
    if (JSON.stringify(got) === JSON.stringify(expected)) counts.asMeant++
    else t.same(got, expected, JSON.stringify(request, (_k, v: unknown) => typeof v === 'bigint' ? `${v}n` : v))
  }
  // A type without fields.
  t.same((await client.call(endpoint, service, 'Nothing', {})).response, {})
  t.equal((await rejection(client.call(endpoint, service, 'Nothing', { a: 1 }))).message, 'invalid t.Empty: a: no such field in t.Empty')
  t.same(counts, { refused: REFUSED.length, sameWords: REFUSED.length, ok: VALID.length, asMeant: VALID.length })
  t.equal(handled, VALID.length, 'no refused request reached the server')
})

t.test('refused before anything is sent: no connection is opened', async (t) => {
  const client = newClient(t)
  const error = await rejection(client.call('127.0.0.1:1', service, 'Add', { x: 1, y: 2, z: 3 }))
  t.equal(error.code, ErrorCode.INVALID_ARGUMENT)
  t.equal(error.message, 'invalid t.Req: z: no such field in t.Req')
  t.ok(error instanceof RpcError)
  t.equal(client.connectionCount, 0)
})

t.test('scalar-only types: each field is read once, and what was read is what is encoded', async (t) => {
  let reads = 0
  const request = { get x () { return reads++ === 0 ? 1 : 2 ** 40 }, y: 2 }
  const prepared = Req.prepareRequest(request)
  t.equal(reads, 1, 'x read once')
  t.not(prepared, request, 'the fields as read, not the message')
  t.same(Req.encode(prepared), Req.encode({ x: 1, y: 2 }))
  // Absent optional fields stay absent; conversions land in the snapshot.
  const Scalars = ProtoSchema.parse(`syntax = "proto2"; package s; enum E { A = 0; B = 1; }
    message M { optional int64 n = 1; optional E e = 2; optional bytes b = 3; optional string s = 4; }`).type('s.M')
  const m = Scalars.prepareRequest({ n: '300', e: 'B', b: 'AAE=' })
  t.same(Buffer.from(Scalars.encode(m)), Buffer.from(Scalars.encode({ n: 300, e: 1, b: Buffer.from([0, 1]) })))
  t.equal(m.s, undefined)
  // Out of range is refused even where the fast encoder would wrap it.
  t.throws(() => Req.prepareRequest({ x: -1, y: 2 }), { message: 'invalid t.Req: x: -1 is out of range for uint32 (0 to 4294967295)' })
})

// Scalar-only nested types (their check fills a snapshot) holding an enum by name.
const NESTED_ENUM_PROTO = `syntax = "proto2";
package ne;
enum Kind { RED = 0; GREEN = 1; }
message Leaf { optional Kind kind = 1; optional uint32 n = 2; }
message Outer { optional Leaf inner = 1; repeated Leaf items = 2; map<string, Leaf> byName = 3; }
service N { rpc Echo(Outer) returns (Outer); rpc Leaf(Leaf) returns (Leaf); }
`

t.test('an enum by name in a nested scalar-only message (a field, a repeated field, a map value) is converted', async (t) => {
  const nested = ProtoSchema.parse(NESTED_ENUM_PROTO)
  const Outer = nested.type('ne.Outer')
  const Leaf = nested.type('ne.Leaf')
  const def = nested.service('ne.N')
  const request = { inner: { kind: 'GREEN' }, items: [{ kind: 'GREEN', n: 1 }, { kind: 1 }], byName: { a: { kind: 'GREEN' } } }
  t.equal(Outer.validateRequest(request), null)
  const prepared = Outer.prepareRequest(request as Message)
  t.equal(Outer.verify(prepared), null, 'what prepare answers encodes')
  t.same(Buffer.from(Outer.encode(prepared)), Buffer.from(Outer.encode({ inner: { kind: 1 }, items: [{ kind: 1, n: 1 }, { kind: 1 }], byName: { a: { kind: 1 } } })))
  t.equal(request.inner.kind, 'GREEN', 'the caller\'s message is not changed')
  // A message decoded with unknown fields, given an enum by name: converted too, the unknown fields kept.
  // (As protobufjs's decoder keeps them: a non-enumerable own property.)
  const withUnknown: Message = { kind: 'GREEN' }
  Object.defineProperty(withUnknown, '$unknowns', { value: [new Uint8Array([0x78, 0x05])], writable: true, enumerable: false, configurable: true })
  const preparedLeaf = Leaf.prepareRequest(withUnknown)
  t.equal(Leaf.verify(preparedLeaf), null)
  t.same(Buffer.from(Leaf.encode(preparedLeaf)), Buffer.from([0x08, 0x01, 0x78, 0x05]), 'the enum converted, the unknown field written back')

  const server = new Server().addService(def, { Echo: (req: unknown) => req, Leaf: (req: unknown) => req })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => closeServer(server))
  const endpoint = `127.0.0.1:${port}`
  const client = newClient(t, { endpoint })
  const { response } = await client.call(endpoint, def, 'Echo', request as Message, { timeoutMs: 5000 })
  t.same(response, { inner: { kind: 1, n: 0 }, items: [{ kind: 1, n: 1 }, { kind: 1, n: 0 }], byName: { a: { kind: 1, n: 0 } } })
  t.same((await client.call(endpoint, def, 'Leaf', withUnknown, { timeoutMs: 5000 })).response.kind, 1)
})
