/**
 * `nyala gen`'s TypeScript (codec/protobuf/proto-typegen.ts) and the runtime mapping
 * it describes (codec/protobuf/plain-messages.ts): the text generated for a .proto of
 * every kind of field compiles under the repo's strict options (and with
 * exactOptionalPropertyTypes) in each int64 mode, typed handlers and stubs
 * included; a handler of the wrong type does not compile; each int64 mode
 * round-trips through a real server; unset bytes decode as an empty Buffer;
 * decoded messages are plain objects with their defaults as own properties.
 */
import t from 'tap'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import protobuf from 'protobufjs'
import { generateTypes } from '../../codec/protobuf/proto-typegen.js'
import { ProtoSchema, type Int64Mode } from '../../codec/protobuf/schema.js'
import { Server } from '../../reactor/krpc/server.js'
import { Client } from '../../reactor/krpc/client.js'
import { RpcError } from '../../codec/errors.js'
import { runTsc } from '../helpers/typegen.js'

const source = `syntax = "proto2";
package t.all;

enum Color { RED = 0; GREEN = 1; BLUE = 2; }

message Inner { optional uint32 n = 1; optional Color color = 2 [default = BLUE]; }

message Everything {
  required double d = 1; optional float f = 2; optional int32 i32 = 3; optional uint32 u32 = 4;
  optional sint32 s32 = 5; optional fixed32 fx32 = 6; optional sfixed32 sfx32 = 7;
  optional int64 i64 = 8; optional uint64 u64 = 9; optional sint64 s64 = 10; optional fixed64 fx64 = 11; optional sfixed64 sfx64 = 12;
  optional bool b = 13; optional string s = 14 [default = "dflt"]; optional bytes by = 15;
  optional Color color = 16; optional Inner inner = 17; required Inner must = 18;
  repeated uint32 nums = 19; repeated Inner inners = 20; repeated int64 longs = 21 [packed = true];
  map<string, Inner> by_name = 22; map<string, int64> counts = 23;
  oneof choice { string text = 24; uint32 number = 25; }
  message Nested { optional bool yes = 1; }
  optional Nested nested = 26;
}

message Empty {}

service EverythingService { rpc Echo(Everything) returns (Everything); rpc Nothing(Empty) returns (Empty); }
`
const usage = `import { KrpcServer, KrpcClient } from 'nyala/krpc'
import { Color, EverythingService, type Everything, type EverythingHandlers } from './all.js'

const handlers: EverythingHandlers = {
  Echo: (request) => {
    const first: number | undefined = request.nums?.[0]
    const inner = request.inner ?? null
    return { ...request, d: request.d + (first ?? 0), inner, color: Color.GREEN }
  },
  Nothing: () => ({})
}
const server = new KrpcServer().addService(EverythingService, handlers)
const stub = new KrpcClient({ endpoint: '127.0.0.1:1' }).service(EverythingService)
const message: Everything = { d: 1, must: {}, i64: LONG, by: Buffer.from('x'), by_name: { a: { n: 1 } }, text: 'hi' }
export const answer: Promise<Everything> = stub.Echo(message)
export const empty: Promise<Record<string, never>> = stub.Nothing({})
void server
`
const LONG_LITERAL: Record<Int64Mode, string> = { bigint: '5n', string: "'5'", number: '5' }

const root = (): protobuf.Root => protobuf.parse(source, { keepCase: true }).root

t.test('the generated file compiles in every int64 mode, with typed handlers and stubs', async (t) => {
  for (const int64 of ['bigint', 'string', 'number'] as const) {
    const dir = mkdtempSync(join(tmpdir(), `nyala-typegen-${int64}-`))
    t.teardown(() => rmSync(dir, { recursive: true, force: true }))
    const text = generateTypes(root(), 't.all', { int64 })
    t.match(text, `export type EverythingMethods = {`, 'the method map is a type alias')
    t.match(text, `  i64?: ${int64}\n`, `int64 fields are ${int64}s`)
    t.match(text, '  must: Inner\n', 'a required message is required')
    t.match(text, '  inner?: Inner | null\n', 'an optional one may be null')
    t.match(text, '  by?: Buffer\n')
    t.match(text, '  by_name?: Record<string, Inner>\n')
    t.match(text, 'export interface Everything_Nested {')
    writeFileSync(join(dir, 'all.ts'), text)
    writeFileSync(join(dir, 'use.ts'), usage.replace('LONG', LONG_LITERAL[int64]))
    const strict = await runTsc(dir, ['all.ts', 'use.ts'])
    t.equal(strict.code, 0, `${int64}: compiles with the repo's options:\n${strict.output}`)
    // exactOptionalPropertyTypes, which the repo does not use: only the temp files are judged.
    const exact = await runTsc(dir, ['all.ts', 'use.ts'], { exactOptionalPropertyTypes: true })
    const ours = exact.output.split('\n').filter((line) => /^(all|use)\.ts\(/.test(line))
    t.same(ours, [], `${int64}: no error in the generated file or its use with exactOptionalPropertyTypes`)
  }
})

t.test('a handler of the wrong type does not compile', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-typegen-wrong-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, 'all.ts'), generateTypes(root(), 't.all', { int64: 'bigint' }))
  writeFileSync(join(dir, 'wrong.ts'), `import { KrpcServer } from 'nyala/krpc'
import { EverythingService } from './all.js'
new KrpcServer().addService(EverythingService, {
  Echo: (request) => ({ d: 'one', must: request.must }),
  Nothing: () => ({})
})
`)
  const ran = await runTsc(dir, ['all.ts', 'wrong.ts'])
  t.not(ran.code, 0, 'tsc refuses it')
  t.match(ran.output, /wrong\.ts\(4,\d+\): error TS2322: Type 'string' is not assignable to type 'number'/)
})

const echoProto = `syntax = "proto2";
package t.longs;
message Longs {
  optional int64 i = 1; optional uint64 u = 2; optional sint64 s = 3; optional fixed64 f = 4; optional sfixed64 sf = 5;
  repeated int64 many = 6; optional bytes data = 7; optional string name = 8; optional uint32 n = 9 [default = 7];
}
service Echo { rpc Echo(Longs) returns (Longs); }
`

async function echoThrough (int64: Int64Mode, request: Record<string, unknown>): Promise<Record<string, unknown>> {
  const schema = ProtoSchema.fromDescriptor(ProtoSchema.parse(echoProto).descriptor(), { int64 })
  const def = schema.service('t.longs.Echo')
  let seen: Record<string, unknown> | undefined
  const server = new Server().addService(def, { Echo: (req) => { seen = req as Record<string, unknown>; return req } })
  const { port } = await server.listen(0, '127.0.0.1')
  const client = new Client({ endpoint: `127.0.0.1:${port}` })
  try {
    const response = await client.service(def).Echo!(request, { timeoutMs: 5000 }) as Record<string, unknown>
    if (seen === undefined) throw new Error('the handler did not run')
    return response
  } finally {
    client.close()
    await server.close()
  }
}

t.test('each int64 mode round-trips through a real server', async (t) => {
  const big = { i: -(2n ** 63n), u: 2n ** 64n - 1n, s: -(2n ** 62n) - 3n, f: 2n ** 64n - 2n, sf: 2n ** 63n - 1n, many: [1n, -2n, 2n ** 60n] }
  t.same(await echoThrough('bigint', big), { ...big, data: Buffer.alloc(0), name: '', n: 7 }, 'bigint: exact at the ends of each range')
  const asStrings = { i: '-9223372036854775808', u: '18446744073709551615', s: '-5', f: '0', sf: '9223372036854775807', many: ['1', '-2'] }
  t.same(await echoThrough('string', asStrings), { ...asStrings, data: Buffer.alloc(0), name: '', n: 7 }, 'string: decimal strings both ways')
  t.same(await echoThrough('number', { i: -5, u: 2 ** 53 - 1, s: -(2 ** 40), f: 3, sf: -1, many: [1, 2] }),
    { i: -5, u: 2 ** 53 - 1, s: -(2 ** 40), f: 3, sf: -1, many: [1, 2], data: Buffer.alloc(0), name: '', n: 7 }, 'number: numbers')
  // Encoding takes any form in any mode.
  const mixed = await echoThrough('bigint', { i: '-7', u: 8, s: 9n })
  t.same([mixed.i, mixed.u, mixed.s], [-7n, 8n, 9n], 'strings, numbers and bigints are all taken')
  const Longs = ProtoSchema.parse(echoProto).type('t.longs.Longs')
  t.throws(() => Longs.encode({ u: -1n }), RpcError, 'a bigint out of the field\'s range is refused')
  t.throws(() => Longs.encode({ i: 2n ** 63n }), RpcError)
  t.throws(() => Longs.encode({ i: '12abc' }), RpcError, 'so is a string that is no decimal integer')
})

t.test('decoded messages: plain objects, every field an own property, unset bytes an empty Buffer', async (t) => {
  for (const int64 of ['bigint', 'string', 'number'] as const) {
    const schema = ProtoSchema.parse(source, { int64 })
    const Everything = schema.type<Record<string, unknown>>('t.all.Everything')
    const m = Everything.decode(Everything.encode({ d: 1.5, must: {} })) as Record<string, unknown>
    t.notOk(m instanceof RpcError)
    t.equal(Object.getPrototypeOf(m), Object.prototype, `${int64}: a plain object`)
    t.ok(Buffer.isBuffer(m.by) && (m.by as Buffer).length === 0, 'unset bytes: an empty Buffer')
    const zero = { bigint: 0n, string: '0', number: 0 }[int64]
    t.same({ ...m }, {
      f: 0, i32: 0, u32: 0, s32: 0, fx32: 0, sfx32: 0, i64: zero, u64: zero, s64: zero, fx64: zero, sfx64: zero,
      b: false, s: 'dflt', by: Buffer.alloc(0), color: 0, inner: null, nums: [], inners: [], longs: [], by_name: {}, counts: {}, nested: null,
      d: 1.5, must: { n: 0, color: 2 }
    }, 'spreading keeps every field, defaults ([default = ...] too) included; an unset oneof member stays absent')
    t.equal(Object.getPrototypeOf(m.must), Object.prototype, 'nested messages too')
    t.notOk('text' in m || 'number' in m, 'no oneof member is set')
    if (int64 === 'string') t.equal(JSON.parse(JSON.stringify(m)).u64, '0', 'JSON.stringify keeps defaults')
    const chosen = Everything.decode(Everything.encode({ d: 1, must: {}, number: 4 })) as Record<string, unknown>
    t.equal(chosen.number, 4)
    t.equal(chosen.choice, 'number', 'the oneof names its member')
    t.notOk(Object.keys(chosen).includes('choice'), 'not as an enumerable property')
  }
  // The flat fast path answers the same kind of object.
  const flat = ProtoSchema.parse('syntax = "proto2"; package f; message F { required uint32 x = 1; optional string s = 2; optional bool b = 3 [default = true]; }').type<Record<string, unknown>>('f.F')
  const m = flat.decode(flat.encode({ x: 3 })) as Record<string, unknown>
  t.equal(Object.getPrototypeOf(m), Object.prototype)
  t.same(Object.entries(m), [['x', 3], ['s', ''], ['b', true]], 'fields in .proto order, defaults own')
  // A message with bytes, decoded from a plain Uint8Array: Buffers still.
  const Longs = ProtoSchema.parse(echoProto).type<Record<string, unknown>>('t.longs.Longs')
  const fromArray = Longs.decode(new Uint8Array(Longs.encode({ data: Buffer.from('ab') }))) as Record<string, unknown>
  t.ok(Buffer.isBuffer(fromArray.data), 'bytes from a Uint8Array: a Buffer')
  t.equal((fromArray.data as Buffer).toString(), 'ab')
})

t.test('console.log shows a plain object', async (t) => {
  const { calculatorSchema } = await import('../../examples/calculator/index.js')
  const Add = calculatorSchema.type('nyala.demo.AddResponsePB')
  const { inspect } = await import('node:util')
  t.equal(inspect(Add.decode(Add.encode({ result: 3 }))), '{ result: 3 }')
})
