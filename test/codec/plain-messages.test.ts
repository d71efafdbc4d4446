/**
 * Decoded messages (codec/protobuf/plain-messages.ts): proto3 fields without
 * explicit presence stay own properties at their defaults even when the
 * wire carries the default explicitly (protobufjs's decoder deletes them);
 * proto3 `optional` fields and oneof members keep their presence; a oneof's
 * name is a non-enumerable property, and a proto3 `optional` field's
 * synthetic oneof leaves nothing on the message.
 */
import t from 'tap'
import { ProtoSchema, type Message } from '../../codec/protobuf/schema.js'

const PROTO3 = `syntax = "proto3";
package p3;
enum E { Z = 0; O = 1; }
message M {
  int32 i = 1; string s = 2; bytes by = 3; int64 l = 4; E e = 5; double d = 6; bool b = 7; uint32 u = 8;
  optional int32 opt = 9;
  oneof c { int32 x = 10; string y = 11; }
  N n = 12;
}
message N { int32 q = 1; }
`
const schema = ProtoSchema.parse(PROTO3)
const M = schema.type('p3.M')
const DEFAULTS = { i: 0, s: '', by: Buffer.alloc(0), l: 0n, e: 0, d: 0, b: false, u: 0, n: null }

t.test('proto3 implicit-presence fields carried at their default on the wire are still own properties', async (t) => {
  // Each field once, explicitly at its default (hand-built: encoders leave these out).
  const explicit = Buffer.from([
    0x08, 0x00, // i = 0
    0x12, 0x00, // s = ''
    0x1a, 0x00, // by = empty
    0x20, 0x00, // l = 0
    0x28, 0x00, // e = Z
    0x31, 0, 0, 0, 0, 0, 0, 0, 0, // d = 0
    0x38, 0x00, // b = false
    0x40, 0x00 // u = 0
  ])
  const m = M.decode(explicit) as Message
  t.notOk(m instanceof Error, 'decoded')
  for (const key of Object.keys(DEFAULTS)) t.ok(Object.hasOwn(m, key), `${key} is an own property`)
  t.same(m, DEFAULTS)
  // A later default after a non-default value: the field is the default, still present.
  const later = M.decode(Buffer.from([0x08, 0x05, 0x08, 0x00, 0x12, 0x01, 0x61, 0x12, 0x00, 0x20, 0x07, 0x20, 0x00])) as Message
  t.ok(Object.hasOwn(later, 'i') && Object.hasOwn(later, 's') && Object.hasOwn(later, 'l'))
  t.same(later, DEFAULTS)
  // Nested messages too.
  const nested = M.decode(Buffer.from([0x62, 0x02, 0x08, 0x00])) as Message
  t.ok(Object.hasOwn(nested.n as object, 'q'))
  t.same(nested.n, { q: 0 })
  // The int64 mode's default.
  const asString = ProtoSchema.parse(PROTO3, { int64: 'string' }).type('p3.M').decode(Buffer.from([0x20, 0x00])) as Message
  t.equal(asString.l, '0')
})

t.test('proto3 optional and oneof members keep their presence; oneof names are hidden, synthetic ones leave nothing', async (t) => {
  const unset = M.decode(Buffer.alloc(0)) as Message
  t.notOk(Object.hasOwn(unset, 'opt'), 'an unset optional field is absent')
  t.notOk(Object.hasOwn(unset, 'x') || Object.hasOwn(unset, 'y'), 'unset oneof members are absent')
  t.equal(unset.c, undefined)
  t.notOk(Object.hasOwn(unset, '_opt'), 'no property for the synthetic oneof')

  const set = M.decode(Buffer.from([0x48, 0x00, 0x50, 0x00])) as Message // opt = 0, x = 0
  t.ok(Object.hasOwn(set, 'opt'), 'an optional field set to its default is present')
  t.equal(set.opt, 0)
  t.ok(Object.hasOwn(set, 'x'))
  t.equal(set.x, 0)
  t.equal(set.c, 'x', 'the oneof names its member')
  t.notOk(Object.keys(set).includes('c'), 'the oneof name is not enumerable')
  t.notOk(Object.getOwnPropertyNames(set).includes('_opt'), 'the synthetic oneof leaves nothing')
  t.same(Object.keys(set), ['i', 's', 'by', 'l', 'e', 'd', 'b', 'u', 'n', 'opt', 'x'])
  t.notMatch(JSON.stringify(set, (_k, v: unknown) => typeof v === 'bigint' ? String(v) : v), /_opt|"c"/)
  // A decoded message is a valid request as it is, and encodes back to what set its fields.
  t.equal(M.validateRequest(set), null)
  t.same(Buffer.from(M.encode(set)), Buffer.from([0x48, 0x00, 0x50, 0x00]))
  const y = M.decode(Buffer.from([0x5a, 0x01, 0x61])) as Message
  t.equal(y.c, 'y')
  t.equal(y.y, 'a')
})
