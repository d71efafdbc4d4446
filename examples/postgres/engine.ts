import type { Expr, Statement } from './sql.js'

/**
 * The in-memory engine: types of expressions (PostgreSQL's OIDs), their
 * values, and the table `kv (k text PRIMARY KEY, v text)` shared by every
 * session, with each session's uncommitted writes kept apart.
 *
 * Isolation: a session's writes inside a transaction (explicit, or the
 * implicit one of a multi-statement Query or an extended-protocol batch)
 * are buffered and applied at COMMIT, so others never see them before; its
 * reads see the table as committed now plus its own writes (PostgreSQL's
 * READ COMMITTED, statement by statement). Two sessions that write the same
 * key both commit, the last one winning: there are no row locks and no
 * serialization failures.
 */

export const Oid = { int4: 23, int8: 20, text: 25, unknown: 705, numeric: 1700, void: 2278 } as const
export type TypeName = 'int4' | 'int8' | 'text' | 'numeric' | 'void' | 'unknown'
export const OID_OF: Record<TypeName, number> = { int4: 23, int8: 20, text: 25, numeric: 1700, void: 2278, unknown: 705 }
const TYPE_OF_OID = new Map<number, TypeName>([[23, 'int4'], [20, 'int8'], [25, 'text'], [1043, 'text'], [1700, 'numeric'], [705, 'unknown']])

export type Value = string | number | bigint | null

/** An error with a SQLSTATE, as statements fail. */
export class SqlError extends Error {
  readonly code: string
  readonly detail: string | undefined
  readonly position: number | undefined
  readonly where: string | undefined
  constructor (code: string, message: string, detail?: string, position?: number, where?: string) {
    super(message)
    this.code = code
    this.detail = detail
    this.position = position
    this.where = where
  }
}

export function typeOfOid (oid: number): TypeName | undefined {
  return oid === 0 ? undefined : TYPE_OF_OID.get(oid)
}

/**
 * Infers the statement's parameter types (PostgreSQL's: from a cast, from
 * the other side of `+`, from the column compared or written; text when
 * nothing says) into `params`, whose given entries (from Parse) win.
 */
export function inferParams (statement: Statement, params: Array<TypeName | undefined>): void {
  const visit = (expr: Expr, wanted: TypeName | undefined): void => {
    switch (expr.kind) {
      case 'param': if (params[expr.index - 1] === undefined) params[expr.index - 1] = wanted; break
      case 'cast': visit(expr.expr, expr.type); break
      case 'add': {
        const l = staticType(expr.left, params)
        const r = staticType(expr.right, params)
        visit(expr.left, r === 'unknown' ? 'int4' : r)
        visit(expr.right, l === 'unknown' ? 'int4' : l)
        break
      }
      case 'sleep': visit(expr.arg, 'numeric'); break
      default: break
    }
  }
  switch (statement.kind) {
    case 'select':
      for (const item of statement.items) visit(item.expr, 'text')
      if (statement.where !== null) visit(statement.where, 'text')
      break
    case 'insert': for (const [k, v] of statement.rows) { visit(k, 'text'); visit(v, 'text') } break
    case 'update': visit(statement.value, 'text'); if (statement.where !== null) visit(statement.where, 'text'); break
    case 'delete': if (statement.where !== null) visit(statement.where, 'text'); break
    default: break
  }
  const highest = maxParam(statement)
  for (let i = 0; i < highest; i++) if (params[i] === undefined) params[i] = 'text'
}

function maxParam (statement: Statement): number {
  let highest = 0
  eachExpr(statement, (expr) => { if (expr.kind === 'param') highest = Math.max(highest, expr.index) })
  return highest
}

/** Calls `fn` on every expression of `statement`, each before those inside it. */
function eachExpr (statement: Statement, fn: (expr: Expr) => void): void {
  const visit = (expr: Expr | null): void => {
    if (expr === null) return
    fn(expr)
    if (expr.kind === 'cast') visit(expr.expr)
    else if (expr.kind === 'add') { visit(expr.left); visit(expr.right) } else if (expr.kind === 'sleep') visit(expr.arg)
  }
  switch (statement.kind) {
    case 'select': statement.items.forEach(i => visit(i.expr)); visit(statement.where); break
    case 'insert': statement.rows.forEach(([k, v]) => { visit(k); visit(v) }); break
    case 'update': visit(statement.value); visit(statement.where); break
    case 'delete': visit(statement.where); break
    default: break
  }
}

/**
 * Parse analysis: literals cast to an integer type are converted now, so
 * a bad one fails the statement before it runs (at Parse, for the extended
 * protocol), at the literal's position, as PostgreSQL does.
 */
export function checkConstants (statement: Statement): void {
  eachExpr(statement, (expr) => {
    if (expr.kind === 'cast' && expr.expr.kind === 'string' && expr.type !== 'text') evaluate(expr, { params: [], row: null }, [])
  })
}

/** The type of an expression's result (an unknown-typed literal or parameter in a result column is text). */
export function staticType (expr: Expr, params: Array<TypeName | undefined>): TypeName {
  switch (expr.kind) {
    case 'int': {
      // Up to 9 digits always fit int4 (the common case, without a BigInt).
      if (expr.text.length < 10) return 'int4'
      const n = BigInt(expr.text)
      return n >= -2147483648n && n <= 2147483647n ? 'int4' : 'int8'
    }
    case 'numeric': return 'numeric'
    case 'string': return 'unknown'
    case 'null': return 'unknown'
    case 'param': return params[expr.index - 1] ?? 'unknown'
    case 'column': return 'text'
    case 'sleep': return 'void'
    case 'cast': return expr.type
    case 'add': {
      const l = staticType(expr.left, params)
      const r = staticType(expr.right, params)
      if (l === 'text' || r === 'text') throw new SqlError('42883', `operator does not exist: ${l} + ${r}`, undefined, expr.at)
      if (l === 'numeric' || r === 'numeric') return 'numeric'
      if (l === 'int8' || r === 'int8') return 'int8'
      return 'int4'
    }
  }
}

/** The type of a result column. */
export function columnType (expr: Expr, params: Array<TypeName | undefined>): TypeName {
  const type = staticType(expr, params)
  return type === 'unknown' ? 'text' : type
}

const INT4_MIN = -2147483648
const INT4_MAX = 2147483647

function toInt (value: Value, type: 'int4' | 'int8'): number | bigint | null {
  if (value === null) return null
  if (typeof value === 'number') return type === 'int8' ? BigInt(value) : value
  if (typeof value === 'bigint') {
    if (type === 'int8') return value
    if (value < -2147483648n || value > 2147483647n) throw new SqlError('22003', 'integer out of range')
    return Number(value)
  }
  const text = value.trim()
  if (!/^[+-]?[0-9]+$/.test(text)) throw new SqlError('22P02', `invalid input syntax for type ${type === 'int4' ? 'integer' : 'bigint'}: "${value}"`)
  const n = BigInt(text)
  if (type === 'int4') {
    if (n < -2147483648n || n > 2147483647n) throw new SqlError('22003', `value "${value}" is out of range for type integer`)
    return Number(n)
  }
  if (n < -9223372036854775808n || n > 9223372036854775807n) throw new SqlError('22003', `value "${value}" is out of range for type bigint`)
  return n
}

/** What evaluating an expression needs: the bound parameters, the current row, and a way to sleep. */
export interface EvalContext {
  params: readonly Value[]
  row: { k: string, v: string | null } | null
}

/** Evaluates an expression that does not sleep (pg_sleep is run by the session, which can cancel it). */
export function evaluate (expr: Expr, ctx: EvalContext, types: Array<TypeName | undefined>): Value {
  switch (expr.kind) {
    case 'int': { const t = staticType(expr, types); return t === 'int4' ? Number(expr.text) : BigInt(expr.text) }
    case 'numeric': return expr.text
    case 'string': return expr.value
    case 'null': return null
    case 'param': return ctx.params[expr.index - 1] ?? null
    case 'column': return ctx.row === null ? null : ctx.row[expr.name]
    case 'sleep': return ''
    case 'cast': {
      const value = evaluate(expr.expr, ctx, types)
      if (value === null) return null
      if (expr.type === 'text') return String(value)
      try {
        return toInt(value, expr.type)
      } catch (error) {
        // A constant that does not convert is reported at the constant, as PostgreSQL does at parse time.
        if (error instanceof SqlError && expr.expr.kind === 'string') throw new SqlError(error.code, error.message, error.detail, expr.expr.at)
        throw error
      }
    }
    case 'add': {
      const type = staticType(expr, types)
      const l = evaluate(expr.left, ctx, types)
      const r = evaluate(expr.right, ctx, types)
      if (l === null || r === null) return null
      if (type === 'numeric') return String(Number(l) + Number(r))
      if (type === 'int8') {
        const sum = (toInt(l, 'int8') as bigint) + (toInt(r, 'int8') as bigint)
        if (sum < -9223372036854775808n || sum > 9223372036854775807n) throw new SqlError('22003', 'bigint out of range')
        return sum
      }
      const sum = (toInt(l, 'int4') as number) + (toInt(r, 'int4') as number)
      if (sum < INT4_MIN || sum > INT4_MAX) throw new SqlError('22003', 'integer out of range')
      return sum
    }
  }
}

/** The expressions of a statement that sleep (`SELECT pg_sleep(s)`), with their argument's seconds. */
export function sleepSeconds (statement: Statement, ctx: EvalContext, types: Array<TypeName | undefined>): number {
  if (statement.kind !== 'select') return 0
  let seconds = 0
  for (const item of statement.items) {
    if (item.expr.kind === 'sleep') {
      const arg = evaluate(item.expr.arg, ctx, types)
      const s = arg === null ? 0 : Number(arg)
      if (Number.isNaN(s)) throw new SqlError('22P02', `invalid input syntax for type double precision: "${String(arg)}"`)
      seconds += Math.max(0, s)
    }
  }
  return seconds
}

/** The committed table, shared by every session of a server. */
export class KvTable {
  readonly rows = new Map<string, string | null>()
}

/** A session's view of the table: committed rows plus its buffered writes (null value in `writes`: deleted). */
export class KvView {
  readonly table: KvTable
  /** Writes not committed yet: key → value (`undefined` entry absent; `DELETED`: removed); made at the first one. */
  writes: Map<string, string | null | typeof DELETED> | null = null
  /** In a transaction: writes are buffered until commit. */
  #buffering = false

  constructor (table: KvTable) {
    this.table = table
  }

  get (k: string): { found: boolean, v: string | null } {
    const w = this.writes?.get(k)
    if (w === DELETED) return { found: false, v: null }
    if (w !== undefined) return { found: true, v: w }
    return this.table.rows.has(k) ? { found: true, v: this.table.rows.get(k)! } : { found: false, v: null }
  }

  /** Every row, in the table's order with this session's changes applied. */
  all (): Array<{ k: string, v: string | null }> {
    const out: Array<{ k: string, v: string | null }> = []
    const writes = this.writes
    for (const [k, v] of this.table.rows) {
      if (writes?.has(k) === true) continue
      out.push({ k, v })
    }
    if (writes !== null) for (const [k, v] of writes) if (v !== DELETED) out.push({ k, v })
    return out
  }

  set (k: string, v: string | null): void {
    if (!this.#buffering) {
      // Outside a transaction block: straight to the table (an UPDATE moves the row to the end, as a new tuple version does).
      this.table.rows.delete(k)
      this.table.rows.set(k, v)
      return
    }
    const writes = this.writes ??= new Map()
    writes.delete(k)
    writes.set(k, v)
  }

  delete (k: string): void {
    if (!this.#buffering) this.table.rows.delete(k)
    else (this.writes ??= new Map()).set(k, DELETED)
  }

  /** Starts buffering writes (a transaction that writes nothing allocates nothing). */
  begin (): void {
    this.#buffering = true
  }

  /** Applies the buffered writes to the table and stops buffering. */
  commit (): void {
    const writes = this.writes
    this.writes = null
    this.#buffering = false
    if (writes === null) return
    for (const [k, v] of writes) {
      this.table.rows.delete(k)
      if (v !== DELETED) this.table.rows.set(k, v)
    }
  }

  /** Drops the buffered writes. */
  rollback (): void {
    this.writes = null
    this.#buffering = false
  }
}

export const DELETED: unique symbol = Symbol('deleted')
