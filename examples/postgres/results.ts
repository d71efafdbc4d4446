import { OID_OF, SqlError, type TypeName, type Value } from './engine.js'
import type { Column } from './executor.js'
import type { MessageWriter } from './wire.js'

/** pg_type.typlen of each type a result column can have. */
const TYPLEN: Record<TypeName, number> = { int4: 4, int8: 8, text: -1, numeric: -1, void: 4, unknown: -2 }

/** The format code of result column `i` (Bind's result formats: none, one for all, or one each). */
export function formatOf (formats: readonly number[], i: number): number {
  return formats.length === 0 ? 0 : formats.length === 1 ? formats[0]! : formats[i] ?? 0
}

/** RowDescription ('T'). */
export function writeRowDescription (out: MessageWriter, columns: readonly Column[], formats: readonly number[]): void {
  out.begin('T').i16(columns.length)
  for (let i = 0; i < columns.length; i++) {
    const column = columns[i]!
    out.cstr(column.name).i32(0).i16(0).i32(OID_OF[column.type]).i16(TYPLEN[column.type]).i32(-1).i16(formatOf(formats, i))
  }
  out.end()
}

const EIGHT = Buffer.alloc(8)

/** DataRow ('D'): each value in its column's format (binary for int4, int8, text and void; text otherwise). */
export function writeDataRow (out: MessageWriter, columns: readonly Column[], row: readonly Value[], formats: readonly number[]): void {
  out.begin('D').i16(row.length)
  for (let i = 0; i < row.length; i++) {
    const value = row[i]!
    if (value === null) { out.i32(-1); continue }
    const type = columns[i]!.type
    if (formatOf(formats, i) === 1 && (type === 'int4' || type === 'int8')) {
      if (type === 'int4') { out.i32(4).i32(Number(value)); continue }
      EIGHT.writeBigInt64BE(BigInt(value))
      out.i32(8).bytes(EIGHT)
      continue
    }
    if (type === 'void') out.i32(0)
    else if (typeof value === 'number' && Number.isSafeInteger(value)) out.decimalField(value)
    else out.field(typeof value === 'string' ? value : String(value))
  }
  out.end()
}

/** A Bind parameter's value: text or binary, read as its type (22P02 / 22P03 when the bytes do not fit). */
export function decodeParam (bytes: Buffer | null, format: number, type: TypeName, index: number, portal: string): Value {
  try {
    return decode(bytes, format, type, index)
  } catch (error) {
    // PostgreSQL's error context names the parameter (its value hidden: log_parameter_max_length_on_error is 0).
    if (!(error instanceof SqlError)) throw error
    const where = `${portal === '' ? 'unnamed portal' : `portal "${portal}"`} parameter $${index + 1}${format === 1 ? '' : ' = \'...\''}`
    throw new SqlError(error.code, error.message, error.detail, undefined, where)
  }
}

function decode (bytes: Buffer | null, format: number, type: TypeName, index: number): Value {
  if (bytes === null) return null
  if (format === 1) {
    const size = type === 'int4' ? 4 : type === 'int8' ? 8 : -1
    if (size > 0 && bytes.length < size) throw new SqlError('08P01', 'insufficient data left in message')
    if (size > 0 && bytes.length > size) throw new SqlError('22P03', `incorrect binary data format in bind parameter ${index + 1}`)
    if (type === 'int4') return bytes.readInt32BE(0)
    if (type === 'int8') return bytes.readBigInt64BE(0)
    return bytes.toString('utf8')
  }
  const text = bytes.toString('utf8')
  if (type === 'int4' || type === 'int8') {
    const trimmed = text.trim()
    const name = type === 'int4' ? 'integer' : 'bigint'
    if (!/^[+-]?[0-9]+$/.test(trimmed)) throw new SqlError('22P02', `invalid input syntax for type ${name}: "${text}"`)
    const n = BigInt(trimmed)
    const [min, max] = type === 'int4' ? [-2147483648n, 2147483647n] : [-9223372036854775808n, 9223372036854775807n]
    if (n < min || n > max) throw new SqlError('22003', `value "${text}" is out of range for type ${name}`)
    return type === 'int4' ? Number(n) : n
  }
  return text
}
