import { columnType, evaluate, SqlError, type EvalContext, type KvView, type TypeName, type Value } from './engine.js'
import type { Expr, Statement } from './sql.js'

/** A result column: its name and type. */
export interface Column { name: string, type: TypeName }

/** What a statement produced: its columns (null: it returns no rows), its rows and its command tag. */
export interface Result {
  columns: Column[] | null
  rows: Value[][]
  tag: string
}

/** The columns a statement returns (for RowDescription before it runs); null when it returns no rows. */
export function columnsOf (statement: Statement, types: Array<TypeName | undefined>): Column[] | null {
  if (statement.kind !== 'select') return null
  return statement.items.map(item => ({ name: item.name, type: columnType(item.expr, types) }))
}

function keyOf (expr: Expr, ctx: EvalContext, types: Array<TypeName | undefined>): string | null {
  const key = evaluate(expr, ctx, types)
  return key === null ? null : String(key)
}

/**
 * Runs a statement that is not a transaction command (pg_sleep already
 * slept) against the session's view of the table; `columns`: its result's
 * columns when known (a prepared statement's), else worked out here.
 */
export function execute (statement: Statement, params: readonly Value[], types: Array<TypeName | undefined>, view: KvView, columns?: Column[] | null): Result {
  const ctx: EvalContext = { params, row: null }
  const table = statement.kind === 'select' || statement.kind === 'insert' || statement.kind === 'update' || statement.kind === 'delete' ? statement.table : undefined
  if (table !== undefined && table.name !== 'kv') throw new SqlError('42P01', `relation "${table.name}" does not exist`, undefined, table.at)
  switch (statement.kind) {
    case 'select': {
      columns ??= columnsOf(statement, types)!
      if (!statement.from) {
        const row = statement.items.map(item => evaluate(item.expr, ctx, types))
        return { columns, rows: [row], tag: 'SELECT 1' }
      }
      let source: Array<{ k: string, v: string | null }>
      if (statement.where !== null) {
        const k = keyOf(statement.where, ctx, types)
        const hit = k === null ? { found: false, v: null } : view.get(k)
        source = hit.found ? [{ k: k!, v: hit.v }] : []
      } else {
        source = view.all()
        if (statement.ordered) source.sort((a, b) => a.k < b.k ? -1 : a.k > b.k ? 1 : 0)
      }
      const rows = source.map(row => { ctx.row = row; return statement.items.map(item => evaluate(item.expr, ctx, types)) })
      return { columns, rows, tag: `SELECT ${rows.length}` }
    }
    case 'insert': {
      const pending: Array<[string, string | null]> = []
      for (const [kExpr, vExpr] of statement.rows) {
        const k = keyOf(kExpr, ctx, types)
        const vValue = evaluate(vExpr, ctx, types)
        const v = vValue === null ? null : String(vValue)
        if (k === null) throw new SqlError('23502', 'null value in column "k" of relation "kv" violates not-null constraint', `Failing row contains (null, ${v ?? 'null'}).`)
        if (view.get(k).found || pending.some(([p]) => p === k)) {
          throw new SqlError('23505', 'duplicate key value violates unique constraint "kv_pkey"', `Key (k)=(${k}) already exists.`)
        }
        pending.push([k, v])
      }
      for (const [k, v] of pending) view.set(k, v)
      return { columns: null, rows: [], tag: `INSERT 0 ${pending.length}` }
    }
    case 'update': {
      const targets = targetKeys(statement.where, ctx, types, view)
      for (const k of targets) {
        ctx.row = { k, v: view.get(k).v }
        const value = evaluate(statement.value, ctx, types)
        view.set(k, value === null ? null : String(value))
      }
      return { columns: null, rows: [], tag: `UPDATE ${targets.length}` }
    }
    case 'delete': {
      const targets = targetKeys(statement.where, ctx, types, view)
      for (const k of targets) view.delete(k)
      return { columns: null, rows: [], tag: `DELETE ${targets.length}` }
    }
    default:
      throw new Error(`not a data statement: ${statement.kind}`)
  }
}

function targetKeys (where: Expr | null, ctx: EvalContext, types: Array<TypeName | undefined>, view: KvView): string[] {
  if (where === null) return view.all().map(row => row.k)
  const k = keyOf(where, ctx, types)
  return k !== null && view.get(k).found ? [k] : []
}
