import { checkConstants, inferParams, OID_OF, SqlError, typeOfOid, type TypeName, type Value } from './engine.js'
import type { Column, Result } from './executor.js'
import { Prepared } from './prepared.js'
import { decodeParam, writeDataRow } from './results.js'
import type { KvView } from './engine.js'
import { parseCached, type Reply, type Shared } from './shared.js'
import { SqlSyntaxError, type Statement } from './sql.js'
import { MessageReader, READY_FOR_QUERY, writeCommandComplete, type MessageWriter } from './wire.js'

/**
 * The extended query protocol of one session: Parse, Bind, Describe,
 * Execute, Close, Flush and Sync, with named and unnamed statements and
 * portals. After an error every message up to the next Sync is skipped, as
 * PostgreSQL does; Sync ends the implicit transaction of the batch.
 */

interface Portal {
  readonly prepared: Prepared
  readonly params: readonly Value[]
  readonly formats: readonly number[]
  result: Result | null
  cursor: number
}

/** What the extended protocol needs of its session (session.ts). */
export interface ExtendedHost {
  readonly shared: Shared
  readonly view: KvView
  readonly out: MessageWriter
  status: 'I' | 'T' | 'E'
  implicit: boolean
  endImplicit: (commit: boolean) => void
  failWith: (out: MessageWriter, error: unknown) => void
  flushNotices: (out: MessageWriter) => void
  sleepSecondsOf: (statement: Statement, params: readonly Value[], types: Array<TypeName | undefined>) => number
  runStatement: (statement: Statement, params: readonly Value[], types: Array<TypeName | undefined>, columns?: Column[] | null) => Result
  sleep: (seconds: number) => Promise<void>
}

const MAX_STATEMENTS = 10_000
const MAX_PORTALS = 10_000
const NONE: Reply = { bytes: null, close: false }
/** Bind's lists when empty, or one text or binary code (what libpq sends): shared, never written. */
const NO_VALUES: readonly Value[] = Object.freeze([])
const NO_CODES: readonly number[] = Object.freeze([])
const TEXT_CODES: readonly number[] = Object.freeze([0])
const BINARY_CODES: readonly number[] = Object.freeze([1])
/** Held answers past this many bytes go out without waiting for Sync. */
const HOLD_BYTES = 64 * 1024

export class Extended {
  readonly #session: ExtendedHost
  readonly #statements = new Map<string, Prepared>()
  /** The named portals; the unnamed one apart (pgbench's and most drivers' only one). */
  readonly #portals = new Map<string, Portal>()
  #unnamed: Portal | null = null
  /** Reads each message in turn (one at a time: the session runs them in order). */
  readonly #reader = new MessageReader(Buffer.alloc(0))
  /** An error happened: every message up to Sync is skipped. */
  skipping = false

  constructor (session: ExtendedHost) {
    this.#session = session
  }

  /** The message of type `type` whose body is `buf[start, end)`. */
  message (type: number, buf: Buffer, start: number, end: number): Reply | Promise<Reply> {
    if (type === 0x53) return this.#sync()
    if (this.skipping) return NONE
    const out = this.#session.out
    try {
      const reader = this.#reader.over(buf, start, end)
      switch (type) {
        case 0x50: this.#parse(reader, out); break
        case 0x42: this.#bind(reader, out); break
        case 0x44: this.#describe(reader, out); break
        case 0x45: {
          const done = this.#execute(reader, out)
          if (done instanceof Promise) return done.then(() => this.#reply(out), (error: unknown) => this.#error(out, error))
          break
        }
        case 0x43: this.#close(reader, out); break
        case 0x48: return this.#flush(out)
        case 0x46: throw new SqlError('0A000', 'function calls are not supported')
        default: throw new SqlError('08P01', `invalid frontend message type ${type}`)
      }
    } catch (error) {
      return this.#error(out, error)
    }
    return this.#reply(out)
  }

  // As PostgreSQL, the answers of Parse, Bind, Describe, Execute and Close wait in the session's
  // buffer for Sync or Flush (one write for the batch), unless they pass HOLD_BYTES.
  #reply (out: MessageWriter): Reply {
    return out.length > HOLD_BYTES ? this.#flush(out) : NONE
  }

  #flush (out: MessageWriter): Reply {
    return out.length === 0 ? NONE : { bytes: out.take(), close: false }
  }

  #error (out: MessageWriter, error: unknown): Reply {
    if (error instanceof RangeError) error = new SqlError('08P01', error.message)
    this.#session.failWith(out, error)
    this.skipping = true
    // An error goes out at once (PostgreSQL flushes it), with what was held before it.
    return this.#flush(out)
  }

  #sync (): Reply {
    const session = this.#session
    this.skipping = false
    if (session.implicit) session.endImplicit(true)
    // Portals live until their transaction ends.
    if (session.status === 'I') {
      this.#unnamed = null
      if (this.#portals.size > 0) this.#portals.clear()
    }
    const out = session.out
    session.flushNotices(out)
    out.raw(READY_FOR_QUERY[session.status])
    return { bytes: out.take(), close: false }
  }

  #parse (reader: MessageReader, out: MessageWriter): void {
    const name = reader.cstr()
    const sql = reader.cstr()
    const count = reader.i16()
    const types: Array<TypeName | undefined> = []
    for (let i = 0; i < count; i++) {
      const oid = reader.i32()
      const type = typeOfOid(oid)
      if (oid !== 0 && type === undefined) throw new SqlError('0A000', `parameters of type ${oid} are not supported`)
      types.push(type)
    }
    const parsed = parseCached(this.#session.shared, sql)
    if (parsed instanceof SqlSyntaxError) throw new SqlError('42601', parsed.message, undefined, parsed.position)
    if (parsed.length > 1) throw new SqlError('42601', 'cannot insert multiple commands into a prepared statement')
    const statement = parsed[0] ?? null
    if (statement !== null) {
      if (this.#session.status === 'E' && statement.kind !== 'commit' && statement.kind !== 'rollback') {
        throw new SqlError('25P02', 'current transaction is aborted, commands ignored until end of transaction block')
      }
      inferParams(statement, types)
      checkConstants(statement)
    }
    if (name !== '' && this.#statements.has(name)) throw new SqlError('42P05', `prepared statement "${name}" already exists`)
    if (name !== '' && this.#statements.size >= MAX_STATEMENTS) throw new SqlError('53000', `too many prepared statements (at most ${MAX_STATEMENTS})`)
    this.#statements.set(name, new Prepared(statement, types))
    out.begin('1').end()
  }

  #statement (name: string): Prepared {
    const prepared = this.#statements.get(name)
    if (prepared === undefined) {
      throw new SqlError('26000', name === '' ? 'unnamed prepared statement does not exist' : `prepared statement "${name}" does not exist`)
    }
    return prepared
  }

  #portal (name: string): Portal {
    const portal = name === '' ? this.#unnamed : this.#portals.get(name) ?? null
    if (portal === null) throw new SqlError('34000', `portal "${name}" does not exist`)
    return portal
  }

  #bind (reader: MessageReader, out: MessageWriter): void {
    const portalName = reader.cstr()
    const statementName = reader.cstr()
    const formatCount = reader.i16()
    const paramFormats = readCodes(reader, formatCount)
    const paramCount = reader.i16()
    const prepared = this.#statement(statementName)
    const wanted = prepared.types.length
    if (paramCount !== wanted) {
      throw new SqlError('08P01', `bind message supplies ${paramCount} parameters, but prepared statement "${statementName}" requires ${wanted}`)
    }
    if (formatCount > 1 && formatCount !== paramCount) {
      throw new SqlError('08P01', `bind message has ${formatCount} parameter formats but ${paramCount} parameters`)
    }
    const raw: Array<Buffer | null> = paramCount === 0 ? [] : new Array(paramCount)
    for (let i = 0; i < paramCount; i++) {
      const length = reader.i32()
      raw[i] = length === -1 ? null : reader.bytes(length)
    }
    const formats = readCodes(reader, reader.i16())
    const statement = prepared.statement
    if (this.#session.status === 'E' && statement !== null && statement.kind !== 'commit' && statement.kind !== 'rollback') {
      throw new SqlError('25P02', 'current transaction is aborted, commands ignored until end of transaction block')
    }
    const params = paramCount === 0 ? NO_VALUES : raw.map((bytes, i) => decodeParam(bytes, paramFormats.length === 0 ? 0 : paramFormats[paramFormats.length === 1 ? 0 : i]!, prepared.types[i] ?? 'text', i, portalName))
    const portal: Portal = { prepared, params, formats, result: null, cursor: 0 }
    if (portalName === '') {
      this.#unnamed = portal
    } else {
      if (this.#portals.has(portalName)) throw new SqlError('42P03', `cursor "${portalName}" already exists`)
      if (this.#portals.size >= MAX_PORTALS) throw new SqlError('53000', `too many portals (at most ${MAX_PORTALS})`)
      this.#portals.set(portalName, portal)
    }
    out.raw(BIND_COMPLETE)
  }

  #describe (reader: MessageReader, out: MessageWriter): void {
    const what = reader.byte()
    const name = reader.cstr()
    if (what === 0x53) {
      const prepared = this.#statement(name)
      out.begin('t').i16(prepared.types.length)
      for (const type of prepared.types) out.i32(OID_OF[type ?? 'text'])
      out.end()
      prepared.writeDescription(out, NO_CODES)
    } else if (what === 0x50) {
      const portal = this.#portal(name)
      portal.prepared.writeDescription(out, portal.formats)
    } else {
      throw new SqlError('08P01', `invalid DESCRIBE message subtype ${what}`)
    }
  }

  #execute (reader: MessageReader, out: MessageWriter): void | Promise<void> {
    const portal = this.#portal(reader.cstr())
    const maxRows = reader.i32()
    const session = this.#session
    const statement = portal.prepared.statement
    if (statement === null) {
      out.begin('I').end()
      return
    }
    if (portal.result !== null) return this.#send(portal, maxRows, out)
    if (session.status === 'I' && !session.implicit && statement.kind !== 'begin') {
      session.implicit = true
      session.view.begin()
    }
    // A statement without pg_sleep goes straight to runStatement (which checks for a failed transaction too).
    const seconds = portal.prepared.sleeps ? session.sleepSecondsOf(statement, portal.params, portal.prepared.types) : 0
    if (seconds > 0) return session.sleep(seconds).then(() => this.#run(statement, portal, maxRows, out))
    this.#run(statement, portal, maxRows, out)
  }

  #run (statement: Statement, portal: Portal, maxRows: number, out: MessageWriter): void {
    const session = this.#session
    const prepared = portal.prepared
    portal.result = session.runStatement(statement, portal.params, prepared.types, prepared.knownColumns)
    session.flushNotices(out)
    this.#send(portal, maxRows, out)
  }

  #send (portal: Portal, maxRows: number, out: MessageWriter): void {
    const result = portal.result!
    const end = maxRows > 0 ? Math.min(result.rows.length, portal.cursor + maxRows) : result.rows.length
    const sent = end - portal.cursor
    if (result.columns !== null) for (let i = portal.cursor; i < end; i++) writeDataRow(out, result.columns, result.rows[i]!, portal.formats)
    portal.cursor = end
    // As PostgreSQL: a fetch that filled its row limit is suspended, even when no row is left (the next Execute says SELECT 0).
    if (maxRows > 0 && result.columns !== null && sent === maxRows) {
      out.begin('s').end()
      return
    }
    const tag = result.columns !== null && maxRows > 0 ? `SELECT ${sent}` : result.tag
    writeCommandComplete(out, tag)
  }

  #close (reader: MessageReader, out: MessageWriter): void {
    const what = reader.byte()
    const name = reader.cstr()
    if (what === 0x53) this.#statements.delete(name)
    else if (what === 0x50 && name === '') this.#unnamed = null
    else if (what === 0x50) this.#portals.delete(name)
    else throw new SqlError('08P01', `invalid CLOSE message subtype ${what}`)
    out.begin('3').end()
  }
}

/** BindComplete ('2'). */
const BIND_COMPLETE = Buffer.from([0x32, 0, 0, 0, 4])

// Format codes of a Bind (`count` int16s): the common lists shared.
function readCodes (reader: MessageReader, count: number): readonly number[] {
  if (count <= 0) return NO_CODES
  if (count === 1) {
    const code = reader.i16()
    return code === 0 ? TEXT_CODES : code === 1 ? BINARY_CODES : [code]
  }
  const codes: number[] = new Array(count)
  for (let i = 0; i < count; i++) codes[i] = reader.i16()
  return codes
}
