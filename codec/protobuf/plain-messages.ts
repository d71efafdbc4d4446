/**
 * How decoded messages look in JavaScript, for every type of a schema:
 *
 * - plain objects (`Object.getPrototypeOf(m) === Object.prototype`), every
 *   field an own property: an unset field holds its default (0, false, '',
 *   an empty Buffer for bytes, 0n / '0' / 0 for 64-bit integers, the
 *   first value of an enum, `null` for a message, `[]` for a repeated field,
 *   `{}` for a map), so `console.log`, `JSON.stringify` and spreading show
 *   all of them. Required fields are left to the decoder (protobufjs names
 *   the ones missing by checking own properties) and members of a oneof
 *   (proto3 `optional` included) are absent until set, so that their
 *   presence is not lost; a oneof's name is a non-enumerable own property
 *   holding the member set, as protobufjs's virtual property did (a proto3
 *   `optional` field's synthetic `_field` oneof leaves no property at all).
 *   A field without explicit presence (proto3's singular scalars and enums)
 *   stays at its default when the wire carries that default (protobufjs's
 *   decoder would delete it; see `plainDecoder`).
 * - 64-bit integers as the schema's `int64` mode says: `bigint` (the
 *   default), a decimal `string`, or a `number` (exact up to 2^53 only).
 *   Encoding accepts any of the three (and protobufjs's `Long`), whatever
 *   the mode.
 *
 * protobufjs builds its messages with `new type.ctor`; each type's ctor
 * here returns one object literal holding the defaults, so a decode makes
 * no other object for them. 64-bit values come from readers whose int64
 * methods answer in the mode (`int64Reader`), and are turned back into
 * what protobufjs writes by `wireForm` before encoding.
 */
import protobuf from 'protobufjs'

/** How 64-bit integer fields (int64, uint64, sint64, fixed64, sfixed64) appear in JavaScript. */
export type Int64Mode = 'bigint' | 'string' | 'number'

export const INT64_MODES: readonly Int64Mode[] = ['bigint', 'string', 'number']

/** The mode used when a schema names none: exact, and typed apart from `number` so mixing is a compile error. */
export const DEFAULT_INT64_MODE: Int64Mode = 'bigint'

const LONG_TYPES = new Set(['int64', 'uint64', 'sint64', 'fixed64', 'sfixed64'])
// protobufjs's Long (the long package, its dependency): what its readers answer for 64-bit fields.
interface LongValue { low: number, high: number, toBigInt: () => bigint, toString: () => string, toNumber: () => number }
interface LongStatic {
  fromNumber: (value: number, unsigned?: boolean) => LongValue
  fromValue: (value: unknown) => LongValue
  fromBigInt: (value: bigint, unsigned?: boolean) => LongValue
}
const Long = protobuf.util.Long as unknown as LongStatic

/** The one empty Buffer unset bytes fields hold (it has no bytes to change). */
export const EMPTY_BYTES_FIELD = Buffer.alloc(0)

// Set while `fromJSON` runs: protobufjs's fromObject builds its messages
// with the same ctor, and a message typed on a command line must carry only
// the fields given (a proto2 peer tells an absent field from a default one).
const bare = { on: false }

/** Runs `fn` with constructors that make empty objects (no defaults). */
export function withoutDefaults<T> (fn: () => T): T {
  bare.on = true
  try {
    return fn()
  } finally {
    bare.on = false
  }
}

function isLongField (field: protobuf.Field): boolean {
  return LONG_TYPES.has(field.type)
}

/** A 64-bit value (protobufjs `Long` or a number) in `mode`. */
export function longIn (mode: Int64Mode, value: unknown, unsigned: boolean): bigint | string | number {
  const long = typeof value === 'number' ? Long.fromNumber(value, unsigned) : Long.fromValue(value)
  if (mode === 'bigint') return long.toBigInt()
  if (mode === 'string') return long.toString()
  return long.toNumber()
}

// A default value as JavaScript source, for the generated constructors.
function literal (mode: Int64Mode, field: protobuf.Field, consts: unknown[]): string {
  if (field.map) return '{}'
  if (field.repeated) return '[]'
  if (field.resolvedType instanceof protobuf.Type) return 'null'
  const value: unknown = field.defaultValue
  if (isLongField(field)) {
    const v = longIn(mode, value, field.type.startsWith('u') || field.type === 'fixed64')
    return typeof v === 'bigint' ? `${v}n` : JSON.stringify(v)
  }
  if (field.type === 'bytes') {
    if (value == null || (value as ArrayLike<number>).length === 0) return 'E'
    // A default of its own: a copy per message, so that changing one changes no other.
    consts.push(Buffer.from(value as Uint8Array))
    return `Buffer.from(K[${consts.length - 1}])`
  }
  if (typeof value === 'number') return Object.is(value, -0) ? '-0' : String(value)
  if (typeof value === 'string' || typeof value === 'boolean') return JSON.stringify(value)
  consts.push(value)
  return `K[${consts.length - 1}]`
}

/** Source of the constructor protobufjs calls for each message of `type`. */
function plainConstructor (mode: Int64Mode, type: protobuf.Type): new (properties?: object) => object {
  const consts: unknown[] = []
  const props: string[] = []
  for (const field of type.fieldsArray) {
    field.resolve()
    // Required fields: protobufjs checks they were read by looking for own properties.
    if (field.required || field.partOf !== null) continue
    props.push(`${JSON.stringify(field.name)}: ${literal(mode, field, consts)}`)
  }
  // A proto3 \`optional\` field's synthetic oneof gets no property (nothing
  // needs it: presence is the field's own property; its decoder is patched
  // not to write it, see \`plainDecoder\`).
  const oneofs = type.oneofsArray.filter((oneof) => !isSynthetic(oneof)).map((oneof) => `define(m, ${JSON.stringify(oneof.name)}, HIDDEN)`)
  const source = `return function PlainMessage (p) {
  if (bare.on) return p === undefined ? {} : Object.assign({}, p)
  const m = { ${props.join(', ')} }
  ${oneofs.join('\n  ')}
  if (p !== undefined) Object.assign(m, p)
  return m
}`
  const hidden = { value: undefined, writable: true, enumerable: false, configurable: true }
  // eslint-disable-next-line no-new-func
  return new Function('E', 'K', 'bare', 'define', 'HIDDEN', source)(EMPTY_BYTES_FIELD, consts, bare, Object.defineProperty, hidden) as new (properties?: object) => object
}

/** The oneof protobufjs makes for a proto3 \`optional\` field: \`_name\`, holding that field alone. */
function isSynthetic (oneof: protobuf.OneOf): boolean {
  const only = oneof.fieldsArray.length === 1 ? oneof.fieldsArray[0]! : null
  return only !== null && oneof.name === `_${only.name}`
}

// Singular scalar and enum fields without explicit presence (proto3's
// default): protobufjs's decoder \`delete\`s them when the wire carries their
// default, which would leave them absent.
function implicitFields (type: protobuf.Type): protobuf.Field[] {
  return type.fieldsArray.filter((f) => !f.required && !f.repeated && !f.map && f.partOf == null &&
    !(f.resolvedType instanceof protobuf.Type) && !f.hasPresence)
}

const hasOwnProp = Object.prototype.hasOwnProperty

/**
 * The decoder of \`type\` as the plain messages need it, made from
 * protobufjs's own (same source, same scope): \`delete m.f\` of an
 * implicit-presence field becomes \`m.f = <default>\`, and a synthetic oneof's
 * \`m._f = "f"\` is dropped. Nothing is added per decode. Null when the type
 * needs neither. When protobufjs's source does not read as expected (another
 * version), its decoder is wrapped instead: defaults put back and synthetic
 * oneof names hidden after each decode (correct, slower).
 */
function plainDecoder (mode: Int64Mode, type: protobuf.Type, decode: (...args: unknown[]) => unknown): ((...args: unknown[]) => unknown) | null {
  const implicit = implicitFields(type)
  const synthetic = type.oneofsArray.filter(isSynthetic)
  if (implicit.length === 0 && synthetic.length === 0) return null
  const consts: unknown[] = []
  const safeProp = (protobuf.util as unknown as { safeProp: (name: string) => string }).safeProp
  const escape = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  let source = (protobuf as unknown as { decoder: (type: protobuf.Type) => { toString: () => string } }).decoder(type).toString()
  let patched = true
  const replace = (statement: string, by: string): void => {
    const pattern = new RegExp(`${escape(statement)}(?=\\n)`, 'g')
    if (!pattern.test(source)) patched = false
    source = source.replace(pattern, () => by)
  }
  for (const field of implicit) {
    const ref = `m${safeProp(field.name)}`
    replace(`delete ${ref}`, `${ref}=${literal(mode, field, consts)}`)
  }
  for (const oneof of synthetic) replace(`m${safeProp(oneof.name)}=${JSON.stringify(oneof.fieldsArray[0]!.name)}`, '')
  if (patched) {
    const types = type.fieldsArray.map((f) => f.resolve().resolvedType)
    // eslint-disable-next-line no-new-func
    return new Function('Reader', 'types', 'util', 'C', 'E', 'K', `return ${source}`)(protobuf.Reader, types, protobuf.util, type.ctor, EMPTY_BYTES_FIELD, consts) as (...args: unknown[]) => unknown
  }
  const defaults = implicit.map((field) => {
    const k: unknown[] = []
    const value: unknown = new Function('E', 'K', `return ${literal(mode, field, k)}`)(EMPTY_BYTES_FIELD, k) // eslint-disable-line no-new-func
    return { name: field.name, bytes: field.type === 'bytes' && value !== EMPTY_BYTES_FIELD, value }
  })
  const hidden = synthetic.map((oneof) => oneof.name)
  return function decodeThenFix (this: unknown, ...args: unknown[]): unknown {
    const m = decode.apply(this, args) as Record<string, unknown>
    for (const { name, bytes, value } of defaults) if (!hasOwnProp.call(m, name)) m[name] = bytes ? Buffer.from(value as Buffer) : value
    for (const name of hidden) if (hasOwnProp.call(m, name)) Object.defineProperty(m, name, { enumerable: false })
    return m
  }
}

function * typesOf (ns: protobuf.NamespaceBase): Generator<protobuf.Type> {
  for (const nested of ns.nestedArray) {
    if (nested instanceof protobuf.Type) yield nested
    if (nested instanceof protobuf.Namespace || nested instanceof protobuf.Type) yield * typesOf(nested as protobuf.NamespaceBase)
  }
}

/** Makes every message type of `root` decode to plain objects with own defaults, 64-bit fields in `mode`. */
export function usePlainMessages (root: protobuf.Root, mode: Int64Mode): void {
  for (const type of typesOf(root)) {
    type.ctor = plainConstructor(mode, type)
    // protobufjs makes its codecs in setup (at first use, again after a
    // change to the type): the decoder is replaced each time it is made.
    type.setup = function setup (this: protobuf.Type): protobuf.Type {
      protobuf.Type.prototype.setup.call(this)
      const own = this as unknown as { decode: (...args: unknown[]) => unknown }
      own.decode = plainDecoder(mode, this, own.decode) ?? own.decode
      return this
    }
  }
}

// ---------------------------------------------------------------------------
// Reading 64-bit fields in a mode.

type LongRead = (this: protobuf.Reader) => LongValue | number
const base = protobuf.Reader.prototype as unknown as Record<'int64' | 'uint64' | 'sint64' | 'fixed64' | 'sfixed64', LongRead>

function convertWith (mode: Int64Mode): (long: LongValue | number) => bigint | string | number {
  // protobufjs's reader answers a Long (with the long package, a dependency of protobufjs) or a number.
  if (mode === 'bigint') return (l) => typeof l === 'number' ? BigInt(l) : l.toBigInt()
  if (mode === 'string') return (l) => typeof l === 'number' ? String(l) : l.toString()
  return (l) => typeof l === 'number' ? l : l.toNumber()
}

/**
 * A BufferReader whose 64-bit reads answer in `mode` (protobufjs's decoders
 * call them on the reader they are given, nested messages and packed
 * arrays included). One per mode: decoding runs no user code, so it is
 * never used twice at once.
 */
export function int64Reader (mode: Int64Mode): protobuf.Reader {
  const reader = protobuf.Reader.create(Buffer.alloc(0))
  const to = convertWith(mode)
  const reads: Record<string, (this: protobuf.Reader) => unknown> = {
    int64 () { return to(base.int64.call(this)) },
    uint64 () { return to(base.uint64.call(this)) },
    sint64 () { return to(base.sint64.call(this)) },
    fixed64 () { return to(base.fixed64.call(this)) },
    sfixed64 () { return to(base.sfixed64.call(this)) }
  }
  return Object.assign(reader, reads)
}

// ---------------------------------------------------------------------------
// Writing 64-bit fields given in any mode.

const DECIMAL = /^-?\d+$/
const MIN_I64 = -(2n ** 63n)
const MAX_I64 = 2n ** 63n - 1n
const MAX_U64 = 2n ** 64n - 1n

// A 64-bit value as protobufjs's writer and verify take it (a number or a
// Long); a value they must refuse is returned as it was (verify names it).
function toLong (value: unknown, unsigned: boolean): unknown {
  let big: bigint
  if (typeof value === 'bigint') big = value
  else if (typeof value === 'string' && DECIMAL.test(value)) big = BigInt(value)
  else return value
  if (unsigned ? big < 0n || big > MAX_U64 : big < MIN_I64 || big > MAX_I64) return value
  return Long.fromBigInt(big, unsigned)
}

interface WirePlan {
  /** 64-bit fields: name, unsigned, repeated/map. */
  longs: Array<{ name: string, unsigned: boolean, kind: 'one' | 'list' | 'map' }>
  /** Message fields whose type has 64-bit fields somewhere below. */
  messages: Array<{ name: string, plan: WirePlan, kind: 'one' | 'list' | 'map' }>
}

const plans = new WeakMap<protobuf.Type, WirePlan | null>()
const kindOf = (field: protobuf.Field): 'one' | 'list' | 'map' => field.map ? 'map' : field.repeated ? 'list' : 'one'

// Which fields of `type` (and below) hold 64-bit values; null when none.
function planOf (type: protobuf.Type, visiting = new Set<protobuf.Type>()): WirePlan | null {
  if (plans.has(type)) return plans.get(type)!
  if (visiting.has(type)) return null
  visiting.add(type)
  const plan: WirePlan = { longs: [], messages: [] }
  for (const field of type.fieldsArray) {
    field.resolve()
    if (isLongField(field)) plan.longs.push({ name: field.name, unsigned: field.type.startsWith('u') || field.type === 'fixed64', kind: kindOf(field) })
    else if (field.resolvedType instanceof protobuf.Type) {
      const sub = planOf(field.resolvedType, visiting)
      if (sub !== null || visiting.has(field.resolvedType)) plan.messages.push({ name: field.name, plan: sub ?? lazyPlan(field.resolvedType), kind: kindOf(field) })
    }
  }
  visiting.delete(type)
  const result = plan.longs.length === 0 && plan.messages.length === 0 ? null : plan
  if (visiting.size === 0) plans.set(type, result)
  return result
}

// A recursive type's own plan, looked up when first used.
function lazyPlan (type: protobuf.Type): WirePlan {
  return {
    get longs () { return planOf(type)?.longs ?? [] },
    get messages () { return planOf(type)?.messages ?? [] }
  }
}

function mapValues (value: unknown, fn: (v: unknown) => unknown): unknown {
  if (Array.isArray(value)) {
    let out: unknown[] | null = null
    for (let i = 0; i < value.length; i++) {
      const v = fn(value[i])
      if (v !== value[i]) (out ??= value.slice())[i] = v
    }
    return out ?? value
  }
  if (value === null || typeof value !== 'object') return value
  let out: Record<string, unknown> | null = null
  for (const [k, v] of Object.entries(value)) {
    const w = fn(v)
    if (w !== v) (out ??= { ...value as Record<string, unknown> })[k] = w
  }
  return out ?? value
}

function applyPlan (plan: WirePlan, message: unknown): unknown {
  if (message === null || typeof message !== 'object') return message
  const m = message as Record<string, unknown>
  let copy: Record<string, unknown> | null = null
  const set = (name: string, value: unknown): void => {
    if (value === m[name]) return
    if (copy === null) {
      copy = { ...m }
      // Unknown fields a decode kept (not enumerable): written back too.
      if (Object.hasOwn(m, '$unknowns')) copy.$unknowns = m.$unknowns
    }
    copy[name] = value
  }
  for (const { name, unsigned, kind } of plan.longs) {
    const v = m[name]
    if (v == null) continue
    set(name, kind === 'one' ? toLong(v, unsigned) : mapValues(v, (x) => toLong(x, unsigned)))
  }
  for (const { name, plan: sub, kind } of plan.messages) {
    const v = m[name]
    if (v == null) continue
    set(name, kind === 'one' ? applyPlan(sub, v) : mapValues(v, (x) => applyPlan(sub, x)))
  }
  return copy ?? m
}

/**
 * For a type with 64-bit fields (itself or in messages below): a function
 * giving the message as protobufjs encodes and verifies it (bigints and
 * decimal strings as Longs; a copy, the caller's message is not changed).
 * Null for other types, which need nothing.
 */
export function wireForm (type: protobuf.Type): ((message: unknown) => unknown) | null {
  const plan = planOf(type)
  return plan === null ? null : (message) => applyPlan(plan, message)
}
