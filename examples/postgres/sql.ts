/**
 * The SQL this example understands, parsed into statements. The grammar is
 * PostgreSQL's, cut down to:
 *
 *   SELECT expr [[AS] name], ... [FROM kv [WHERE k = expr] [ORDER BY k [ASC]]]
 *   INSERT INTO kv [(k, v)] VALUES (expr, expr)[, ...]
 *   UPDATE kv SET v = expr [WHERE k = expr]
 *   DELETE FROM kv [WHERE k = expr]
 *   BEGIN | START TRANSACTION | COMMIT | END | ROLLBACK | ABORT
 *
 * where expr is an integer, decimal or string literal, NULL, $n, a column
 * of kv, pg_sleep(expr), expr + expr, expr::int|int4|integer|int8|bigint|text,
 * or one in parentheses. Anything else is a syntax error (42601) at the
 * token where the parse stopped, as PostgreSQL words it.
 */

export type Expr =
  | { kind: 'int', text: string, at: number }
  | { kind: 'numeric', text: string, at: number }
  | { kind: 'string', value: string, at: number }
  | { kind: 'null', at: number }
  | { kind: 'param', index: number, at: number }
  | { kind: 'column', name: 'k' | 'v', at: number }
  | { kind: 'sleep', arg: Expr, at: number }
  | { kind: 'add', left: Expr, right: Expr, at: number }
  | { kind: 'cast', expr: Expr, type: 'int4' | 'int8' | 'text', at: number }

export interface SelectItem { expr: Expr, name: string }

export type Statement =
  | { kind: 'select', items: SelectItem[], from: boolean, where: Expr | null, ordered: boolean, table?: TableRef }
  | { kind: 'insert', rows: Array<[Expr, Expr]>, table: TableRef }
  | { kind: 'update', value: Expr, where: Expr | null, table: TableRef }
  | { kind: 'delete', where: Expr | null, table: TableRef }
  | { kind: 'begin' } | { kind: 'commit' } | { kind: 'rollback' }

/** The table a statement names (only `kv` exists: another is 42P01 when the statement runs). */
export interface TableRef { name: string, at: number }

/** A syntax error: PostgreSQL's message and the 1-based position of the token. */
export class SqlSyntaxError {
  readonly message: string
  readonly position: number
  constructor (message: string, position: number) {
    this.message = message
    this.position = position
  }
}

interface Token { type: 'word' | 'quoted' | 'int' | 'numeric' | 'string' | 'param' | 'op' | 'end', text: string, at: number, raw?: string }

// Words that cannot name a table (the parse fails at them, as PostgreSQL's grammar does).
const RESERVED = new Set(['select', 'from', 'where', 'order', 'by', 'values', 'set', 'insert', 'update', 'delete', 'into', 'as', 'null', 'and', 'or', 'not'])

const TYPE_NAMES: Record<string, 'int4' | 'int8' | 'text'> = { int: 'int4', int4: 'int4', integer: 'int4', int8: 'int8', bigint: 'int8', text: 'text' }

function tokenize (sql: string): Token[] | SqlSyntaxError {
  const tokens: Token[] = []
  let i = 0
  while (i < sql.length) {
    const c = sql[i]!
    if (c === ' ' || c === '\t' || c === '\n' || c === '\r' || c === '\f') { i++; continue }
    if (c === '-' && sql[i + 1] === '-') { while (i < sql.length && sql[i] !== '\n') i++; continue }
    const at = i + 1
    if (/[A-Za-z_]/.test(c)) {
      let j = i + 1
      while (j < sql.length && /[A-Za-z0-9_$]/.test(sql[j]!)) j++
      tokens.push({ type: 'word', text: sql.slice(i, j).toLowerCase(), at, raw: sql.slice(i, j) })
      i = j
    } else if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(sql[i + 1] ?? ''))) {
      let j = i
      while (j < sql.length && /[0-9]/.test(sql[j]!)) j++
      let type: Token['type'] = 'int'
      if (sql[j] === '.') { type = 'numeric'; j++; while (j < sql.length && /[0-9]/.test(sql[j]!)) j++ }
      tokens.push({ type, text: sql.slice(i, j), at })
      i = j
    } else if (c === '\'') {
      let j = i + 1
      let value = ''
      for (;;) {
        if (j >= sql.length) return new SqlSyntaxError('unterminated quoted string at or near "' + sql.slice(i) + '"', at)
        if (sql[j] === '\'') {
          if (sql[j + 1] === '\'') { value += '\''; j += 2; continue }
          break
        }
        value += sql[j]
        j++
      }
      tokens.push({ type: 'string', text: value, at })
      i = j + 1
    } else if (c === '"') {
      const close = sql.indexOf('"', i + 1)
      if (close < 0) return new SqlSyntaxError('unterminated quoted identifier at or near "' + sql.slice(i) + '"', at)
      tokens.push({ type: 'quoted', text: sql.slice(i + 1, close), at })
      i = close + 1
    } else if (c === '$' && /[0-9]/.test(sql[i + 1] ?? '')) {
      let j = i + 1
      while (j < sql.length && /[0-9]/.test(sql[j]!)) j++
      tokens.push({ type: 'param', text: sql.slice(i, j), at })
      i = j
    } else if (c === ':' && sql[i + 1] === ':') {
      tokens.push({ type: 'op', text: '::', at })
      i += 2
    } else {
      tokens.push({ type: 'op', text: c, at })
      i++
    }
  }
  tokens.push({ type: 'end', text: '', at: sql.length + 1 })
  return tokens
}

class Parser {
  readonly #tokens: Token[]
  #pos = 0
  constructor (tokens: Token[]) { this.#tokens = tokens }

  peek (): Token { return this.#tokens[this.#pos]! }
  next (): Token { return this.#tokens[this.#pos++]! }
  fail (token = this.peek()): never {
    throw token.type === 'end'
      ? new SqlSyntaxError('syntax error at end of input', token.at)
      : new SqlSyntaxError(`syntax error at or near "${tokenText(token)}"`, token.at)
  }

  isWord (word: string): boolean { const t = this.peek(); return t.type === 'word' && t.text === word }
  isOp (op: string): boolean { const t = this.peek(); return t.type === 'op' && t.text === op }
  word (word: string): void { if (!this.isWord(word)) this.fail(); this.#pos++ }
  op (op: string): void { if (!this.isOp(op)) this.fail(); this.#pos++ }
  atEnd (): boolean { return this.peek().type === 'end' || this.isOp(';') }

  statement (): Statement | null {
    const t = this.peek()
    if (this.atEnd()) return null
    if (t.type !== 'word') this.fail()
    this.#pos++
    switch (t.text) {
      case 'select': return this.select()
      case 'insert': return this.insert()
      case 'update': return this.update()
      case 'delete': { this.word('from'); const table = this.table(); return { kind: 'delete', where: this.where(), table } }
      case 'begin': this.optionalWork(); return { kind: 'begin' }
      case 'start': this.word('transaction'); return { kind: 'begin' }
      case 'commit': case 'end': this.optionalWork(); return { kind: 'commit' }
      case 'rollback': case 'abort': this.optionalWork(); return { kind: 'rollback' }
    }
    return this.fail(t)
  }

  optionalWork (): void { if (this.isWord('work') || this.isWord('transaction')) this.#pos++ }

  table (): TableRef {
    const t = this.peek()
    if (t.type === 'quoted' || (t.type === 'word' && !RESERVED.has(t.text))) { this.#pos++; return { name: t.text, at: t.at } }
    return this.fail()
  }

  where (): Expr | null {
    if (!this.isWord('where')) return null
    this.#pos++
    const column = this.peek()
    if (!((column.type === 'word' || column.type === 'quoted') && column.text === 'k')) this.fail()
    this.#pos++
    this.op('=')
    return this.expr()
  }

  select (): Statement {
    const items: SelectItem[] = []
    let star = false
    do {
      if (this.isOp('*')) {
        this.#pos++
        star = true
        items.push({ expr: { kind: 'column', name: 'k', at: 0 }, name: 'k' }, { expr: { kind: 'column', name: 'v', at: 0 }, name: 'v' })
        continue
      }
      const expr = this.expr()
      let name = columnName(expr)
      if (this.isWord('as')) {
        this.#pos++
        const alias = this.next()
        if (alias.type !== 'word' && alias.type !== 'quoted') this.fail(alias)
        name = alias.text
      } else if (this.peek().type === 'quoted' || (this.peek().type === 'word' && !['from', 'where', 'order'].includes(this.peek().text))) {
        name = this.next().text
      }
      items.push({ expr, name })
    } while (this.isOp(',') && this.next() !== undefined)
    let from = false
    let where: Expr | null = null
    let ordered = false
    let table: TableRef | undefined
    if (this.isWord('from')) {
      this.#pos++
      table = this.table()
      from = true
      where = this.where()
      if (this.isWord('order')) {
        this.#pos++
        this.word('by')
        const column = this.next()
        if (column.text !== 'k') this.fail(column)
        if (this.isWord('asc')) this.#pos++
        ordered = true
      }
    } else if (star) {
      // SELECT * without FROM.
      throw new SqlSyntaxError('SELECT * with no tables specified is not valid', 8)
    }
    return { kind: 'select', items, from, where, ordered, table }
  }

  insert (): Statement {
    this.word('into')
    const table = this.table()
    if (this.isOp('(')) {
      this.#pos++
      const k = this.next()
      if (k.text !== 'k') this.fail(k)
      this.op(',')
      const v = this.next()
      if (v.text !== 'v') this.fail(v)
      this.op(')')
    }
    this.word('values')
    const rows: Array<[Expr, Expr]> = []
    do {
      this.op('(')
      const k = this.expr()
      this.op(',')
      const v = this.expr()
      this.op(')')
      rows.push([k, v])
    } while (this.isOp(',') && this.next() !== undefined)
    return { kind: 'insert', rows, table }
  }

  update (): Statement {
    const table = this.table()
    this.word('set')
    const column = this.next()
    if (column.text !== 'v') this.fail(column)
    this.op('=')
    const value = this.expr()
    return { kind: 'update', value, where: this.where(), table }
  }

  expr (): Expr {
    let left = this.cast()
    while (this.isOp('+')) {
      const at = this.next().at
      left = { kind: 'add', left, right: this.cast(), at }
    }
    return left
  }

  cast (): Expr {
    let expr = this.primary()
    while (this.isOp('::')) {
      const at = this.next().at
      const type = this.next()
      const name = TYPE_NAMES[type.text]
      if (type.type !== 'word' || name === undefined) this.fail(type)
      expr = { kind: 'cast', expr, type: name, at }
    }
    return expr
  }

  primary (): Expr {
    const t = this.next()
    switch (t.type) {
      case 'int': return { kind: 'int', text: t.text, at: t.at }
      case 'numeric': return { kind: 'numeric', text: t.text, at: t.at }
      case 'string': return { kind: 'string', value: t.text, at: t.at }
      case 'param': return { kind: 'param', index: Number(t.text.slice(1)), at: t.at }
      case 'op':
        if (t.text === '(') { const inner = this.expr(); this.op(')'); return inner }
        if (t.text === '-' && (this.peek().type === 'int' || this.peek().type === 'numeric')) {
          const n = this.next()
          return { kind: n.type === 'int' ? 'int' : 'numeric', text: '-' + n.text, at: t.at }
        }
        return this.fail(t)
      case 'word':
        if (t.text === 'null') return { kind: 'null', at: t.at }
        if (t.text === 'pg_sleep' && this.isOp('(')) { this.#pos++; const arg = this.expr(); this.op(')'); return { kind: 'sleep', arg, at: t.at } }
        if (t.text === 'k' || t.text === 'v') return { kind: 'column', name: t.text, at: t.at }
        return this.fail(t)
      case 'quoted':
        if (t.text === 'k' || t.text === 'v') return { kind: 'column', name: t.text, at: t.at }
        return this.fail(t)
      default: return this.fail(t)
    }
  }
}

function tokenText (token: Token): string {
  switch (token.type) {
    case 'string': return `'${token.text.replaceAll('\'', '\'\'')}'`
    case 'quoted': return `"${token.text}"`
    default: return token.raw ?? token.text
  }
}

/** The output column's name as PostgreSQL's FigureColname gives it. */
function columnName (expr: Expr): string {
  switch (expr.kind) {
    case 'cast': return expr.expr.kind === 'string' || expr.expr.kind === 'param' || expr.expr.kind === 'int' || expr.expr.kind === 'numeric' || expr.expr.kind === 'null'
      ? expr.type
      : columnName(expr.expr) === '?column?' ? expr.type : columnName(expr.expr)
    case 'sleep': return 'pg_sleep'
    case 'column': return expr.name
    default: return '?column?'
  }
}

/** Parses a query string into its statements (empty ones dropped). The whole string is parsed before any statement runs, as PostgreSQL does. */
export function parse (sql: string): Statement[] | SqlSyntaxError {
  const tokens = tokenize(sql)
  if (tokens instanceof SqlSyntaxError) return tokens
  const parser = new Parser(tokens)
  const statements: Statement[] = []
  try {
    for (;;) {
      const statement = parser.statement()
      if (statement !== null) statements.push(statement)
      if (parser.peek().type === 'end') break
      if (!parser.isOp(';')) parser.fail()
      parser.next()
    }
  } catch (err) {
    if (err instanceof SqlSyntaxError) return err
    throw err
  }
  return statements
}
