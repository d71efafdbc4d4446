/**
 * Request validation: the one check that `nyala call` (on the JSON typed on
 * the command line) and the client (on every request, before it is encoded)
 * run, so both refuse the same inputs with the same words.
 *
 * protobufjs's `verify` lets through what encodes silently wrong (a uint32
 * of -1 or 2^32 wraps, an unknown field is dropped) and `fromObject` turns
 * anything into a default (`"one"` becomes 0, a missing required field reads
 * 0 from the prototype). Here a request is refused, naming the field (a
 * dotted path for nested ones: `inner.count`, `items[1].count`), when:
 *
 * - it or a nested message is not an object (null, an array, a number);
 * - it has an own property that is no field of its type;
 * - a required field is absent (not an own property, or null/undefined);
 * - a value has the wrong type or is out of its field's range: int32,
 *   sint32, sfixed32, uint32 and fixed32 take integer numbers in range;
 *   int64 kinds take safe integer numbers, bigints, decimal strings and
 *   Long objects ({ low, high }) in range; float and double take numbers
 *   (a finite float beyond float's range is refused); bool takes booleans;
 *   string takes strings; bytes take a Uint8Array or a base64 string
 *   (standard or URL-safe alphabet, padded or not); enums take a known
 *   value by number or by name; repeated fields take arrays (each element
 *   checked), map fields objects (keys checked against the key type);
 * - more than one field of a oneof is set.
 *
 * Optional fields that are absent, null or undefined are skipped, as
 * protobufjs's encoder skips them.
 *
 * The check of each type is compiled once into one function (as protobufjs
 * compiles `verify`): on a valid message it reads each field once and makes
 * no object; problem strings are built only on failure.
 *
 * A valid request may still need converting before protobufjs encodes it
 * (an enum by name, bytes as base64; the codec converts int64 bigints and
 * strings itself): `prepare` then returns a converted copy. For a type of singular scalars
 * and enums (what the flat fast path encodes) it returns the values it read,
 * in one reused object per type, so that the encoder does not read the
 * message again; otherwise the message itself.
 */
import protobuf from 'protobufjs'
import { ErrorCode, RpcError } from '../errors.js'

/**
 * 0: valid and encodable as it is; 1: valid, convert (copy) before
 * encoding; 2: valid, encode the type's snapshot (scalar-only types, see
 * `compile`); 3: the same, a value in it converted (a parent holding the
 * message must copy it: bit 0 is "convert"); -1: invalid (the problem is in
 * `failPath` and `failText`).
 */
type Scan = (message: unknown) => number

const hasOwn = Object.prototype.hasOwnProperty

// The last failure: where (relative to the message scanned) and what.
let failPath = ''
let failText = ''

function fail (path: string, text: string): number {
  failPath = path
  failText = text
  return -1
}

function problemOfLastFailure (): string {
  return failPath === '' ? failText : `${failPath}: ${failText}`
}

/** A value as the problem text names it: `the string "one"`, `1.5`, `an array`. */
export function describeValue (v: unknown): string {
  if (v === null) return 'null'
  if (v === undefined) return 'undefined'
  if (Array.isArray(v)) return 'an array'
  if (v instanceof Uint8Array) return `${v.length} bytes`
  switch (typeof v) {
    case 'string': return `the string ${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v)}`
    case 'number': return String(v)
    case 'bigint': return `${v}n`
    case 'boolean': return String(v)
    case 'object': return 'an object'
    default: return `a ${typeof v}`
  }
}

const INT_RANGES: Record<string, readonly [number, number]> = {
  int32: [-0x80000000, 0x7fffffff],
  sint32: [-0x80000000, 0x7fffffff],
  sfixed32: [-0x80000000, 0x7fffffff],
  uint32: [0, 0xffffffff],
  fixed32: [0, 0xffffffff]
}

const INT64_RANGES: Record<string, readonly [bigint, bigint]> = {
  int64: [-(1n << 63n), (1n << 63n) - 1n],
  sint64: [-(1n << 63n), (1n << 63n) - 1n],
  sfixed64: [-(1n << 63n), (1n << 63n) - 1n],
  uint64: [0n, (1n << 64n) - 1n],
  fixed64: [0n, (1n << 64n) - 1n]
}

const DECIMAL = /^-?[0-9]+$/
const BASE64 = /^[A-Za-z0-9+/_-]*$/

// The helpers the compiled checks call for everything but the common scalars' success.
const helpers = {
  fail,
  notObject (path: string, typeName: string, v: unknown): number {
    return fail(path, `expected an object (${typeName}), got ${describeValue(v)}`)
  },
  unknown (path: string, key: string, typeName: string): number {
    const name = /^[\w$]+$/.test(key) ? key : JSON.stringify(key)
    return fail(path === '' ? name : `${path}.${name}`, `no such field in ${typeName}`)
  },
  missing (path: string): number {
    return fail(path, 'required field missing')
  },
  int (path: string, kind: string, v: unknown): number {
    if (typeof v !== 'number') return fail(path, `expected an integer (${kind}), got ${describeValue(v)}`)
    if (!Number.isInteger(v)) return fail(path, `${v} is not an integer (${kind})`)
    const [lo, hi] = INT_RANGES[kind]!
    return fail(path, `${v} is out of range for ${kind} (${lo} to ${hi})`)
  },
  float (path: string, kind: string, v: unknown): number {
    if (typeof v !== 'number') return fail(path, `expected a number (${kind}), got ${describeValue(v)}`)
    return fail(path, `${v} is out of range for float`)
  },
  bool (path: string, v: unknown): number {
    return fail(path, `expected a boolean, got ${describeValue(v)}`)
  },
  str (path: string, v: unknown): number {
    return fail(path, `expected a string, got ${describeValue(v)}`)
  },
  /** 0: a number, bigint, decimal string or Long in range (the codec's wire form converts bigints and strings); -1. */
  int64 (path: string, kind: string, v: unknown): number {
    const [lo, hi] = INT64_RANGES[kind]!
    let n: bigint
    if (typeof v === 'number') {
      if (!Number.isInteger(v)) return fail(path, `${v} is not an integer (${kind})`)
      if (!Number.isSafeInteger(v)) return fail(path, `${v} is not a safe integer: give ${kind} values beyond 2^53 as a decimal string or a bigint`)
      if (v < 0 && lo === 0n) return fail(path, `${v} is out of range for ${kind} (${lo} to ${hi})`)
      return 0
    }
    if (typeof v === 'bigint') n = v
    else if (typeof v === 'string') {
      if (!DECIMAL.test(v)) return fail(path, `expected an integer (${kind}), got ${describeValue(v)}`)
      n = BigInt(v)
    } else if (v !== null && typeof v === 'object' && typeof (v as { low?: unknown }).low === 'number' && typeof (v as { high?: unknown }).high === 'number' &&
      Number.isInteger((v as { low: number }).low) && Number.isInteger((v as { high: number }).high)) {
      return 0
    } else {
      return fail(path, `expected an integer (${kind}: a number, a bigint, a decimal string or a Long), got ${describeValue(v)}`)
    }
    if (n < lo || n > hi) return fail(path, `${n} is out of range for ${kind} (${lo} to ${hi})`)
    return 0
  },
  /** 0: a Uint8Array; 1: a base64 string (decoded before encoding); -1. */
  bytes (path: string, v: unknown): number {
    if (v instanceof Uint8Array) return 0
    if (typeof v !== 'string') return fail(path, `expected bytes (a Uint8Array or a base64 string), got ${describeValue(v)}`)
    return isBase64(v) ? 1 : fail(path, `not valid base64: ${describeValue(v)}`)
  },
  /** 0: a known number; 1: a known name (converted to its number before encoding); -1. */
  enumValue (path: string, e: protobuf.Enum, v: unknown): number {
    if (typeof v === 'number' && hasOwn.call(e.valuesById, v) && Number.isInteger(v)) return 0
    if (typeof v === 'string' && hasOwn.call(e.values, v)) return 1
    const names = Object.keys(e.values)
    const listed = names.length <= 8 ? names.join(', ') : `${names.slice(0, 8).join(', ')}, ...`
    return fail(path, `expected a value of enum ${e.name} (${listed}, or its number), got ${describeValue(v)}`)
  },
  notArray (path: string, v: unknown): number {
    return fail(path, `expected an array (repeated field), got ${describeValue(v)}`)
  },
  notMap (path: string, v: unknown): number {
    return fail(path, `expected an object (map field), got ${describeValue(v)}`)
  },
  /** A map key (always a string in JS) as its key type allows: -1 when not. */
  mapKey (path: string, keyType: string, k: string): number {
    if (keyType === 'string') return 0
    if (keyType === 'bool') return k === 'true' || k === 'false' ? 0 : fail(path, `map key ${JSON.stringify(k)} is not a bool key (true or false)`)
    if (!DECIMAL.test(k)) return fail(path, `map key ${JSON.stringify(k)} is not an integer (${keyType})`)
    const n = BigInt(k)
    const range = INT64_RANGES[keyType] ?? INT_RANGES[keyType]!.map(BigInt)
    if (n < range[0]! || n > range[1]!) return fail(path, `map key ${k} is out of range for ${keyType}`)
    return 0
  },
  /** A nested message failed at `failPath` relative to it: make that relative to the parent. */
  nested (path: string): number {
    failPath = failPath === '' ? path : failPath.startsWith('[') ? `${path}${failPath}` : `${path}.${failPath}`
    return -1
  },
  oneof (path: string, name: string, set: string[]): number {
    return fail(path, `oneof ${name} takes one field, got ${set.join(' and ')}`)
  },
  fromBase64: (v: string): Buffer => Buffer.from(v, 'base64')
}

/** Standard or URL-safe base64, padded or not (what Buffer and protobufjs decode). */
export function isBase64 (s: string): boolean {
  let end = s.length
  while (end > 0 && s.charCodeAt(end - 1) === 61 /* = */ && s.length - end < 2) end--
  const body = end === s.length ? s : s.slice(0, end)
  if (!BASE64.test(body) || body.length % 4 === 1) return false
  // Padding only where it completes a group of four.
  return end === s.length || s.length % 4 === 0
}

const scans = new WeakMap<protobuf.Type, Scan>()

function scanOf (type: protobuf.Type): Scan {
  let scan = scans.get(type)
  if (scan === undefined) {
    // Registered before compiling, so that a recursive type finds itself.
    let compiled: Scan | null = null
    scans.set(type, (m) => (compiled ??= compile(type))(m))
    compiled = compile(type)
    scan = compiled
    scans.set(type, scan)
  }
  return scan
}

const INT_CHECK: Record<string, (v: string) => string> = {
  int32: (v) => `(${v} | 0) !== ${v}`,
  sint32: (v) => `(${v} | 0) !== ${v}`,
  sfixed32: (v) => `(${v} | 0) !== ${v}`,
  uint32: (v) => `(${v} >>> 0) !== ${v}`,
  fixed32: (v) => `(${v} >>> 0) !== ${v}`
}

// A type whose fields are all singular scalars or enums: its check copies
// what it read into one object per type (see `compile`).
function isScalarOnly (type: protobuf.Type): boolean {
  return type.fieldsArray.every((f) => !f.repeated && !(f instanceof protobuf.MapField) && !(f.resolvedType instanceof protobuf.Type))
}

/**
 * Compiles the check of one type: `function (m) → 0 | 1 | 2 | -1` (see
 * `Scan`). For a type of singular scalars and enums (the flat fast path's
 * kind) every field is read once into a local, checked, converted if it
 * must be, and only then, after the last read, stored in the type's
 * snapshot object, which the check answers (2) instead of the message: the
 * encoder then reads the snapshot, never the message again, so a getter
 * runs once and what it answered is what is sent; no object is made. The
 * stores come after every read, so a getter that makes another call of the
 * same type (which fills the same snapshot) cannot mix its fields in.
 */
function compile (type: protobuf.Type): Scan {
  type.resolveAll()
  const typeName = type.fullName.replace(/^\./, '')
  const snapshot = isScalarOnly(type)
  const refs: unknown[] = []
  const ref = (value: unknown): string => {
    refs.push(value)
    return `R[${refs.length - 1}]`
  }
  const q = JSON.stringify
  const lines: string[] = []
  const out = (line: string): void => { lines.push(line) }
  const T = q(typeName)

  // The check of one value `v` at path `p` (a JS expression, evaluated only
  // on failure). `convert`: replace the variable by what protobufjs
  // encodes (snapshot types), rather than flag the message for a copy.
  const value = (field: protobuf.Field, v: string, p: string, convert: boolean): void => {
    const rt = field.resolvedType
    // A snapshot type converting into its local still sets c: a parent that
    // is no snapshot type (or a message kept as it is, see $unknowns below)
    // must copy, or the unconverted value would reach the encoder.
    const flagged = (conversion: string): string => convert ? `if (r > 0) { ${v} = ${conversion}; c = 1 }` : 'c |= r'
    if (rt instanceof protobuf.Type) {
      out(`r = ${ref(scanOf(rt))}(${v}); if (r < 0) return H.nested(${p}); c |= r & 1`)
    } else if (rt instanceof protobuf.Enum) {
      out(`if (typeof ${v} !== 'number' || !has.call(${ref(rt.valuesById)}, ${v})) { r = H.enumValue(${p}, ${ref(rt)}, ${v}); if (r < 0) return r; ${flagged(`${ref(rt.values)}[${v}]`)} }`)
    } else if (INT_CHECK[field.type] !== undefined) {
      out(`if (typeof ${v} !== 'number' || ${INT_CHECK[field.type]!(v)}) return H.int(${p}, ${q(field.type)}, ${v})`)
    } else if (INT64_RANGES[field.type] !== undefined) {
      out(`if (H.int64(${p}, ${q(field.type)}, ${v}) < 0) return -1`)
    } else if (field.type === 'double') {
      out(`if (typeof ${v} !== 'number') return H.float(${p}, 'double', ${v})`)
    } else if (field.type === 'float') {
      // Finite, but infinite as a float: out of range.
      out(`if (typeof ${v} !== 'number' || (${v} - ${v} === 0 && Math.fround(${v}) - Math.fround(${v}) !== 0)) return H.float(${p}, 'float', ${v})`)
    } else if (field.type === 'bool') {
      out(`if (typeof ${v} !== 'boolean') return H.bool(${p}, ${v})`)
    } else if (field.type === 'string') {
      out(`if (typeof ${v} !== 'string') return H.str(${p}, ${v})`)
    } else if (field.type === 'bytes') {
      out(`if (!(${v} instanceof Uint8Array)) { r = H.bytes(${p}, ${v}); if (r < 0) return r; ${flagged(`H.fromBase64(${v})`)} }`)
    } else {
      throw new Error(`cannot validate field ${field.name} of type ${field.type} in ${typeName}`)
    }
  }

  const fields = type.fieldsArray
  out('if (typeof m !== "object" || m === null || Array.isArray(m)) return H.notObject("", ' + T + ', m)')
  out(`var c = 0, r = 0, v, e, i, k, p${fields.map((_f, j) => `, f${j}, s${j} = 0`).join('')}`)
  // Own properties that are no field: refused (protobufjs would drop them).
  if (fields.length === 0) {
    out(`for (k in m) if (has.call(m, k)) return H.unknown("", k, ${T})`)
  } else {
    // Fields for-in visits are marked: see the field checks below.
    out('for (k in m) { switch (k) {')
    fields.forEach((field, j) => out(`case ${q(field.name)}: s${j} = 1; break`))
    out(`default: if (has.call(m, k)) return H.unknown("", k, ${T}) } }`)
  }
  fields.forEach((field, j) => {
    const n = q(field.name)
    out(`v = m[${n}]`)
    // A plain object (or one without a prototype) inherits nothing
    // enumerable: a field for-in visited is its own, and needs no
    // hasOwnProperty call (a call per field per request). Asked after the
    // first load, whose map check lets the compiler answer it in line.
    if (j === 0) out('p = Object.getPrototypeOf(m); p = p === OP || p === null')
    // Absent: not an own property, or null or undefined.
    out(`if (v == null || ((s${j} & p) !== 1 && !has.call(m, ${n}))) { ${field.required ? `return H.missing(${n})` : 'v = undefined'} } else {`)
    if (field instanceof protobuf.MapField) {
      out(`if (typeof v !== 'object' || Array.isArray(v) || v instanceof Uint8Array) return H.notMap(${n}, v)`)
      out('for (k in v) { if (!has.call(v, k)) continue')
      out(`if (H.mapKey(${n}, ${q(field.keyType)}, k) < 0) return -1`)
      out('e = v[k]')
      value(field, 'e', `${n} + "[" + JSON.stringify(k) + "]"`, false)
      out('}')
    } else if (field.repeated) {
      out(`if (!Array.isArray(v)) return H.notArray(${n}, v)`)
      out('for (i = 0; i < v.length; i++) { e = v[i]')
      value(field, 'e', `${n} + "[" + i + "]"`, false)
      out('}')
    } else {
      value(field, 'v', n, snapshot)
    }
    out(`} f${j} = v`)
  })
  const index = new Map(fields.map((f, j) => [f.name, j]))
  for (const oneof of type.oneofsArray) {
    if (oneof.fieldsArray.length < 2) continue
    const names = oneof.fieldsArray.map((f) => f.name)
    const set = names.map((name) => `(f${index.get(name)!} !== undefined ? 1 : 0)`).join(' + ')
    const list = `[${names.map((name) => `f${index.get(name)!} !== undefined ? ${q(name)} : ''`).join(', ')}].filter(Boolean)`
    out(`if (${set} > 1) { e = ${list}; return H.oneof(e[1], ${q(oneof.name)}, e) }`)
  }
  if (snapshot) {
    // One object per type, its fields always in the same order (one shape for the encoder).
    const snap: Record<string, unknown> = {}
    for (const field of fields) snap[field.name] = undefined
    const S = ref(snap)
    // A message decoded with unknown fields keeps them only as it is.
    // (1 when a value needs converting: the copy keeps them too.)
    out('if (m.$unknowns != null) return c')
    fields.forEach((field, j) => out(`${S}[${q(field.name)}] = f${j}`))
    // 3: the snapshot, holding converted values (its parent copies).
    out('return 2 | c')
  } else {
    out('return c')
  }
  // eslint-disable-next-line no-new-func, @typescript-eslint/no-implied-eval
  const make = new Function('H', 'R', 'has', 'OP', `return function check_${typeName.replace(/\W/g, '_')} (m) {\n${lines.join('\n')}\n}`) as
    (h: typeof helpers, r: unknown[], has: typeof hasOwn, op: object) => Scan
  const scan = make(helpers, refs, hasOwn, Object.prototype)
  if (snapshot) snapshots.set(scan, refs[refs.length - 1] as Record<string, unknown>)
  return scan
}

// The snapshot object of each compiled scalar-only check.
const snapshots = new WeakMap<Scan, Record<string, unknown>>()

function convertValue (field: protobuf.Field, v: unknown): unknown {
  const rt = field.resolvedType
  if (rt instanceof protobuf.Type) return convert(rt, v as Record<string, unknown>)
  if (rt instanceof protobuf.Enum) return typeof v === 'string' ? rt.values[v] : v
  if (field.type === 'bytes' && typeof v === 'string') return Buffer.from(v, 'base64')
  return v
}

// A copy of a valid message that protobufjs encodes as meant (see `prepare`).
function convert (type: protobuf.Type, m: Record<string, unknown>): Record<string, unknown> {
  const copy: Record<string, unknown> = {}
  for (const field of type.fieldsArray) {
    const v = m[field.name]
    if (v == null || !hasOwn.call(m, field.name)) continue
    if (field instanceof protobuf.MapField) {
      const entries: Record<string, unknown> = {}
      for (const k of Object.keys(v)) entries[k] = convertValue(field, (v as Record<string, unknown>)[k])
      copy[field.name] = entries
    } else if (field.repeated) {
      copy[field.name] = (v as unknown[]).map((e) => convertValue(field, e))
    } else {
      copy[field.name] = convertValue(field, v)
    }
  }
  // Unknown fields a decode kept: written back by the encoder, as from the message.
  if (m.$unknowns != null && hasOwn.call(m, '$unknowns')) Object.defineProperty(copy, '$unknowns', { value: m.$unknowns, writable: true, enumerable: false, configurable: true })
  return copy
}

/** The checks of one message type, compiled at first use. */
export interface RequestValidator<T> {
  /** The first problem with `message` as a request (`field: problem`, or the problem alone for the message itself), or null. */
  validate: (message: unknown) => string | null
  /**
   * What to encode for `message`: itself; or, when it holds enums by name
   * or bytes as base64, a converted copy;
   * or, for a type of singular scalars and enums, the fields as read, in an
   * object of the type's own that the next `prepare` of the type reuses
   * (encode it at once). Throws RPC_ERR_INVALID_ARGUMENT `invalid <type>:
   * <problem>` when `validate` finds a problem.
   */
  prepare: (message: T) => T
}

/** The request checks of `type` (compiled once per type, on first use). */
export function requestValidator<T> (type: protobuf.Type): RequestValidator<T> {
  let scan: Scan | null = null
  let snapshot: T | undefined
  const typeName = type.fullName.replace(/^\./, '')
  return {
    validate (message: unknown): string | null {
      return (scan ??= scanOf(type))(message) < 0 ? problemOfLastFailure() : null
    },
    prepare (message: T): T {
      const check = (scan ??= scanOf(type))
      const r = check(message)
      if (r === 0) return message
      // The snapshot, looked up once (a WeakMap lookup per request otherwise).
      if (r >= 2) return (snapshot ??= snapshots.get(check) as T)
      if (r < 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `invalid ${typeName}: ${problemOfLastFailure()}`)
      return convert(type, message as Record<string, unknown>) as T
    }
  }
}
