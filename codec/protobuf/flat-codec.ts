/**
 * A fast path for flat messages: proto2 types whose every field is a
 * singular `required` or `optional` scalar of the kinds uint32, int32,
 * sint32, bool, fixed32, sfixed32, float, double, or a string, numbered
 * 1..15. Such messages (an `Add`'s x and y, an `Echo`'s data) are most
 * small calls; KRPC's are proto2.
 *
 * Why: protobufjs encodes through a writer into a buffer the frame then
 * copies, and decodes through a reader object, each costing more than the
 * few bytes of such a message (measured here: ~30 ns to encode and ~50 ns
 * to decode an AddRequestPB, of the ~1 µs a pipelined call costs each
 * side). The functions made here write a message straight into its frame
 * and read one in a single pass, and produce exactly what protobufjs does:
 *
 * - encoding writes the fields protobufjs would write (a required field
 *   always, an optional one when it is an own property that is not null or
 *   undefined), in field-number order, with the same conversions
 *   (`>>> 0`, `| 0`, zigzag, 0/1, IEEE 754 little-endian), for messages
 *   protobufjs's `verify` accepts: measuring reads each field once, checks
 *   it as `verify` does (an object; integers, booleans, numbers), and keeps
 *   the converted values; anything `verify` would refuse is handed back to
 *   protobufjs, which names the problem. Writing then reads nothing of the
 *   message, so no user code (a getter, a proxy) runs while the frame's
 *   room in the outbound slab is reserved, and the bytes written are
 *   exactly the bytes measured. An int32 negative after `| 0` (ten bytes)
 *   or a message carrying unknown fields it was decoded with is left to
 *   protobufjs.
 * - decoding builds the message protobufjs's decoder builds through the
 *   schema's plain constructors (codec/protobuf/plain-messages.ts: a plain object,
 *   every field an own property, an unset one at its default), as one
 *   object literal made once the bytes are read, for canonical input
 *   only: one-byte tags of the type's
 *   own fields with their wire type, varints of at most five bytes (bools
 *   of one), nothing
 *   past the end, every required field present. Anything else (unknown
 *   fields, a truncated or odd frame, a missing field) answers `undefined`
 *   and the caller asks protobufjs, which decodes it or names the error.
 *
 * test/codec/flat-codec.test.ts holds both to protobufjs on random
 * messages, every prefix and random bytes.
 */
import protobuf from 'protobufjs'
import { varintBytes as vlen, writeVarint as wv } from '../varint.js'

/** The fast encoder and decoder of one flat type. */
export interface FlatCodec<T = Record<string, unknown>> {
  /**
   * Bytes `message` encodes to; -1 when protobufjs must encode it (or
   * refuse it: a value its `verify` rejects is not checked further here).
   * Reads each field once, checks it as `verify` would, and keeps what it
   * read for `write`.
   */
  length: (message: T) => number
  /**
   * Writes the message the last `length` call measured (nothing may run in
   * between) at `out[at]`, exactly that many bytes; returns the offset after
   * them. Reads nothing of the message: no user code runs.
   */
  write: (out: Uint8Array, at: number) => number
  /** The message of `bytes[start, end)`, or undefined when the bytes are not canonical (ask protobufjs). */
  decode: (bytes: Uint8Array, start: number, end: number) => T | undefined
}

const VARINT = new Set(['uint32', 'int32', 'sint32'])
const FIXED32 = new Set(['fixed32', 'sfixed32', 'float'])
const WIRE_TYPE: Record<string, number> = { uint32: 0, int32: 0, sint32: 0, bool: 0, fixed32: 5, sfixed32: 5, float: 5, double: 1, string: 2 }

// Shared by the generated code: little-endian floats through one view each.
const f32 = new Float32Array(1)
const f64 = new Float64Array(1)
const f32Bytes = new Uint8Array(f32.buffer)
const f64Bytes = new Uint8Array(f64.buffer)
const littleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1

function wfixed (out: Uint8Array, at: number, u: number): number {
  out[at] = u & 0xff
  out[at + 1] = (u >>> 8) & 0xff
  out[at + 2] = (u >>> 16) & 0xff
  out[at + 3] = u >>> 24
  return at + 4
}

// Where the last `rv` ended (-1: not a canonical varint of 1..5 bytes before `end`).
const varintEnd = { p: 0 }

// A uint32 varint as protobufjs's reader reads it (the fifth byte gives 4 bits).
function rv (b: Uint8Array, p: number, end: number): number {
  let v = 0
  for (let shift = 0; shift < 28; shift += 7) {
    if (p >= end) { varintEnd.p = -1; return 0 }
    const byte = b[p++]!
    v |= (byte & 0x7f) << shift
    if (byte < 0x80) { varintEnd.p = p; return v >>> 0 }
  }
  if (p >= end) { varintEnd.p = -1; return 0 }
  const byte = b[p++]!
  // A fifth byte with its top bit set: a longer varint, protobufjs's to read.
  if (byte >= 0x80) { varintEnd.p = -1; return 0 }
  varintEnd.p = p
  return (v | (byte & 0x0f) << 28) >>> 0
}

// A string's UTF-8 bytes exactly as protobufjs's node writer produces them:
// its own encoder under 40 UTF-16 units (which writes a lone surrogate as
// its three-byte form), Buffer's at 40 and over (which writes U+FFFD).
const utf8 = protobuf.util.utf8
/** Buffer's UTF-8 methods that protobufjs's node writer and reader use (not in @types/node). */
const bufferMethods = Buffer.prototype as unknown as Utf8Buffer
interface Utf8Buffer { utf8Write: (s: string, at: number, len: number) => number, latin1Write: (s: string, at: number, len: number) => number, utf8Slice: (start: number, end: number) => string }

// An ASCII string (Buffer's byte length equals its UTF-16 length only
// then) is the same bytes whichever encoder writes it: measured and written
// natively (26 + 40 ns for 32 characters here, against 59 + 67 ns for
// protobufjs's JS encoder).
function slen (v: string): number {
  const bytes = Buffer.byteLength(v)
  return bytes === v.length || v.length >= 40 ? bytes : utf8.length(v)
}

function wstr (out: Uint8Array, at: number, v: string, len: number): number {
  // Buffer's methods work on any Uint8Array `out` (called on it).
  if (len === v.length) bufferMethods.latin1Write.call(out, v, at, len)
  else if (v.length < 40) utf8.write(v, out, at)
  else bufferMethods.utf8Write.call(out, v, at, len)
  return at + len
}

// protobufjs's node reader decodes strings with Buffer's utf8Slice; other arrays are left to it.
function rstr (b: Uint8Array, p: number, end: number): string | undefined {
  return typeof (b as unknown as Partial<Utf8Buffer>).utf8Slice === 'function' ? (b as unknown as Utf8Buffer).utf8Slice(p, end) : undefined
}

function wf32 (out: Uint8Array, at: number, v: number): number {
  f32[0] = v
  if (littleEndian) for (let i = 0; i < 4; i++) out[at + i] = f32Bytes[i]!
  else for (let i = 0; i < 4; i++) out[at + i] = f32Bytes[3 - i]!
  return at + 4
}

function wf64 (out: Uint8Array, at: number, v: number): number {
  f64[0] = v
  if (littleEndian) for (let i = 0; i < 8; i++) out[at + i] = f64Bytes[i]!
  else for (let i = 0; i < 8; i++) out[at + i] = f64Bytes[7 - i]!
  return at + 8
}

function rf32 (b: Uint8Array, p: number): number {
  if (littleEndian) for (let i = 0; i < 4; i++) f32Bytes[i] = b[p + i]!
  else for (let i = 0; i < 4; i++) f32Bytes[3 - i] = b[p + i]!
  return f32[0]!
}

function rf64 (b: Uint8Array, p: number): number {
  if (littleEndian) for (let i = 0; i < 8; i++) f64Bytes[i] = b[p + i]!
  else for (let i = 0; i < 8; i++) f64Bytes[7 - i] = b[p + i]!
  return f64[0]!
}

/** The flat codec of `type`, or null when a field is of another kind (protobufjs then does all). */
export function flatCodec<T = Record<string, unknown>> (type: protobuf.Type): FlatCodec<T> | null {
  const fields = type.fieldsArray.slice().sort((a, b) => a.id - b.id)
  for (const f of fields) {
    // proto3 fields are left out: implicit ones skip zero values, explicit ones are oneofs.
    const presence = (f as protobuf.Field & { hasPresence?: boolean }).hasPresence
    if (f.repeated || f.map || f.partOf !== null || f.resolvedType !== null || WIRE_TYPE[f.type] === undefined) return null
    if (f.id < 1 || f.id > 15 || (!f.required && presence !== true)) return null
  }
  // length() reads each field once, as protobufjs's encoder does, and keeps
  // its converted value (cN) and presence (hN) for write(): so write() runs
  // no user code (getters, proxies) while its frame's room is reserved.
  const captured: string[] = []
  const lengthBody: string[] = ["if (typeof m !== 'object' || m === null || m.$unknowns != null) return -1", 'let n = 0']
  const writeBody: string[] = []
  const cases: string[] = []
  const locals: string[] = []
  let requiredMask = 0
  fields.forEach((f, i) => {
    const key = JSON.stringify(f.name)
    const tag = (f.id << 3) | WIRE_TYPE[f.type]!
    const bit = 1 << i
    const slot = `f${i}`
    const c = `c${i}`
    const h = `h${i}`
    captured.push(`let ${c} = 0`, `let ${h} = false`)
    if (f.required) requiredMask |= bit
    // The value as protobufjs's writer converts it, its bytes, and how they are written.
    let convert: string
    let size: string
    // Values under 128 (most) are one byte written in line: no call, whatever
    // the inlining budget of the function these end up inlined into.
    let put = `if (${c} < 0x80) out[at++] = ${c}; else at = wv(out, at, ${c})`
    switch (f.type) {
      case 'uint32': convert = 'v >>> 0'; size = `(${c} < 0x80 ? 1 : vlen(${c}))`; break
      // protobufjs writes `v | 0`; a negative one takes ten bytes: left to it.
      case 'int32': convert = 'v | 0'; size = `(${c} < 0 ? NaN : ${c} < 0x80 ? 1 : vlen(${c}))`; break
      case 'sint32': convert = '(v << 1 ^ v >> 31) >>> 0'; size = `(${c} < 0x80 ? 1 : vlen(${c}))`; break
      case 'bool': convert = 'v ? 1 : 0'; size = '1'; put = `out[at++] = ${c}`; break
      case 'fixed32': case 'sfixed32': convert = 'v >>> 0'; size = '4'; put = `at = wfixed(out, at, ${c})`; break
      case 'float': convert = '+v'; size = '4'; put = `at = wf32(out, at, ${c})`; break
      // Length-delimited: the byte length (kept as lN) as a varint, then the bytes.
      case 'string': convert = 'v'; size = `vlen(l${i} = slen(${c})) + l${i}`; put = `at = wv(out, at, l${i}); at = wstr(out, at, ${c}, l${i})`; captured.push(`let l${i} = 0`); break
      default: convert = '+v'; size = '8'; put = `at = wf64(out, at, ${c})`
    }
    const presence = f.required ? 'true' : `v != null && hasOwn.call(m, ${key})`
    // protobufjs's verify, field by field: a value it would refuse is left to it (it names the problem).
    const valid = f.type === 'bool' ? "typeof v === 'boolean'" : f.type === 'float' || f.type === 'double' ? "typeof v === 'number'" : f.type === 'string' ? "typeof v === 'string'" : 'isInteger(v)'
    lengthBody.push(`{ const v = m[${key}]; ${h} = ${presence}; if (${h}) { if (!(${valid})) return -1; ${c} = ${convert}; n += 1 + ${size} } }`)
    writeBody.push(`if (${h}) { out[at++] = ${tag}; ${put} }`)
    // The value at p, as protobufjs's reader converts it.
    let read: string
    if (f.type === 'bool') {
      // One byte, as bools are written; protobufjs reads longer ones its own way.
      read = `const v = b[p]; if (p >= end || v >= 0x80) return undefined; ${slot} = v !== 0; p++`
    } else if (VARINT.has(f.type)) {
      const to = f.type === 'uint32' ? 'v' : f.type === 'int32' ? 'v | 0' : '(v >>> 1 ^ -(v & 1)) | 0'
      read = `const v = rv(b, p, end); if (rvEnd.p < 0) return undefined; p = rvEnd.p; ${slot} = ${to}`
    } else if (f.type === 'string') {
      read = `const n = rv(b, p, end); if (rvEnd.p < 0 || end - rvEnd.p < n) return undefined; p = rvEnd.p; const v = rstr(b, p, p + n); if (v === undefined) return undefined; ${slot} = v; p += n`
    } else if (FIXED32.has(f.type)) {
      const to = f.type === 'fixed32'
        ? '(b[p] | b[p + 1] << 8 | b[p + 2] << 16 | b[p + 3] << 24) >>> 0'
        : f.type === 'sfixed32' ? 'b[p] | b[p + 1] << 8 | b[p + 2] << 16 | b[p + 3] << 24' : 'rf32(b, p)'
      read = `if (end - p < 4) return undefined; ${slot} = ${to}; p += 4`
    } else {
      read = `if (end - p < 8) return undefined; ${slot} = rf64(b, p); p += 8`
    }
    cases.push(`case ${tag}: { ${read}; seen |= ${bit}; continue }`)
    // Each field's value in a local until the end, then one object literal: no message before the bytes proved canonical.
    const initial: unknown = f.defaultValue
    locals.push(`let ${slot} = ${typeof initial === 'number' ? (Object.is(initial, -0) ? '-0' : String(initial)) : JSON.stringify(initial ?? 0)}`)
  })
  // NaN: a negative int32.
  lengthBody.push('return Number.isNaN(n) ? -1 : n')
  writeBody.push('return at')
  // The message: a plain object, its fields in .proto order, each an own property (unset ones at their default).
  const literal = type.fieldsArray.map((f) => `${JSON.stringify(f.name)}: f${fields.indexOf(f)}`).join(', ')
  const helpers = { hasOwn: Object.prototype.hasOwnProperty, isInteger: Number.isInteger, vlen, wv, wfixed, wf32, wf64, rv, rf32, rf64, slen, wstr, rstr, rvEnd: varintEnd }
  const source = `${captured.join('\n')}
return {
  length (m) {
    ${lengthBody.join('\n    ')}
  },
  write (out, at) {
    ${writeBody.join('\n    ')}
  },
  decode (b, p, end) {
    let seen = 0
    ${locals.join('\n    ')}
    while (p < end) {
      switch (b[p++]) {
        ${cases.join('\n        ')}
      }
      return undefined
    }
    return (seen & ${requiredMask}) === ${requiredMask} ? { ${literal} } : undefined
  }
}`
  // eslint-disable-next-line no-new-func
  const { length, write, decode } = new Function(...Object.keys(helpers), source)(...Object.values(helpers)) as FlatCodec<T>
  return { length, write, decode }
}
