import { checkConstants, KvView, SqlError, type KvTable, type TypeName, type Value } from './engine.js'
import { columnsOf, execute, type Column, type Result } from './executor.js'
import { Extended } from './extended.js'
import { writeDataRow, writeRowDescription } from './results.js'
import { SqlSyntaxError, type Statement } from './sql.js'
import { parseCached, type Reply, type Shared } from './shared.js'
import { backendKey, cancelTarget, passwordMessage, startupMessage, type BackendKey, type Startup } from './startup.js'
import type { ScramExchange } from './auth.js'
import { MessageWriter, READY_FOR_QUERY, writeCommandComplete, writeError, type ErrorFields } from './wire.js'

const NONE: Reply = { bytes: null, close: false }
const CLOSE: Reply = { bytes: null, close: true }

/**
 * One client session: its start, its transaction, its prepared statements
 * and portals (extended.ts), and the messages it gets, one at a time.
 */
export class Session {
  readonly shared: Shared
  readonly view: KvView
  readonly extended: Extended
  /**
   * The session's answer being built: one buffer reused by every message
   * (the session runs one message at a time; `take()` copies the answer out).
   */
  readonly out = new MessageWriter(512)
  phase: 'startup' | 'auth-first' | 'auth-final' | 'ready' | 'closed' = 'startup'
  startup: Startup | null = null
  key: BackendKey | null = null
  scram: ScramExchange | null = null
  /** ReadyForQuery's status: idle, in a transaction block, in a failed one. */
  status: 'I' | 'T' | 'E' = 'I'
  /** Writes are buffered for an implicit transaction (a multi-statement Query, an extended batch until Sync). */
  implicit = false
  #sleep: { timer: NodeJS.Timeout, reject: (error: SqlError) => void } | null = null

  constructor (shared: Shared) {
    this.shared = shared
    this.view = new KvView(shared.table)
    this.extended = new Extended(this)
  }

  /** The untyped packet that starts the session: StartupMessage (or another version). */
  startupPacket (buf: Buffer, start: number, end: number): Reply {
    if (this.phase !== 'startup') return NONE
    this.key = backendKey(this.shared)
    const result = startupMessage(this.shared, this.key, buf, start, end)
    if (result.kind === 'fatal') return { bytes: result.bytes, close: true }
    this.startup = result.startup
    if (result.kind === 'auth') {
      this.scram = result.scram
      this.phase = 'auth-first'
    } else {
      this.#started()
    }
    return { bytes: result.bytes, close: false }
  }

  /** A CancelRequest: interrupts the target session's running statement; the requesting connection closes without a reply. */
  cancelPacket (buf: Buffer, start: number, end: number): Reply {
    const target = cancelTarget(buf, start, end)
    const session = target === null ? undefined : this.shared.sessions.get(target.pid)
    if (session !== undefined && session.secret === target!.secret) session.cancel()
    return CLOSE
  }

  #started (): void {
    this.phase = 'ready'
    const key = this.key!
    this.shared.sessions.set(key.pid, { secret: key.secret, cancel: () => this.cancel() })
  }

  /** The connection closed: the session leaves the cancel registry and its sleep ends. */
  closed (): void {
    this.phase = 'closed'
    if (this.key !== null && this.shared.sessions.get(this.key.pid)?.secret === this.key.secret) this.shared.sessions.delete(this.key.pid)
    this.cancel()
    this.view.rollback()
  }

  /** Interrupts a running pg_sleep (57014); does nothing when idle, as PostgreSQL. */
  cancel (): void {
    const sleep = this.#sleep
    if (sleep === null) return
    this.#sleep = null
    clearTimeout(sleep.timer)
    sleep.reject(new SqlError('57014', 'canceling statement due to user request'))
  }

  /** Sleeps for `seconds`, unless cancelled. */
  sleep (seconds: number): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => { this.#sleep = null; resolve() }, Math.min(seconds * 1000, 2_147_483_647))
      this.#sleep = { timer, reject }
    })
  }

  /** A typed message (`type` its byte) with its body `buf[start, end)`, once started. */
  message (type: number, buf: Buffer, start: number, end: number): Reply | Promise<Reply> {
    if (this.phase !== 'ready') return NONE
    switch (type) {
      case 0x51: return this.extended.skipping ? NONE : this.query(buf.toString('utf8', start, Math.max(start, end - 1)))
      case 0x58: return CLOSE // Terminate
      case 0x70: return fatal('08P01', 'invalid frontend message type 112')
      case 0x64: case 0x63: case 0x66: return NONE // CopyData/CopyDone/CopyFail outside COPY: ignored, as PostgreSQL does
      default: return this.extended.message(type, buf, start, end)
    }
  }

  /**
   * The messages of a group (wire.ts's messageFraming: extended-query
   * messages up to a Sync or Flush that arrived together), `frame` holding
   * them whole, one after another: each in turn, as if it came alone, and
   * their answers in one reply. A message that closes the session ends it.
   */
  messages (frame: Buffer): Reply | Promise<Reply> {
    return this.#group(frame, 0, null)
  }

  #group (frame: Buffer, from: number, answers: Buffer[] | null): Reply | Promise<Reply> {
    let at = from
    while (at < frame.length) {
      const type = frame[at]!
      const end = at + 1 + frame.readInt32BE(at + 1)
      const reply = this.message(type, frame, at + 5, end)
      at = end
      if (reply instanceof Promise) {
        const rest = at
        return reply.then(r => this.#groupNext(frame, rest, answers, r))
      }
      if (reply.bytes !== null) (answers ??= []).push(reply.bytes)
      if (reply.close) return joined(answers, true)
    }
    return joined(answers, false)
  }

  #groupNext (frame: Buffer, at: number, answers: Buffer[] | null, reply: Reply): Reply | Promise<Reply> {
    if (reply.bytes !== null) (answers ??= []).push(reply.bytes)
    return reply.close ? joined(answers, true) : this.#group(frame, at, answers)
  }

  /** A password message (`type` should be 'p') of the SCRAM exchange the start-up asked for. */
  password (type: number, body: Buffer): Reply {
    if (type !== 0x70) return fatal('08P01', `expected SASL response, got message type ${type}`)
    const first = this.phase === 'auth-first'
    const result = passwordMessage(this.shared, this.key!, this.scram!, this.startup!, first, body)
    if (result.kind === 'fatal') return { bytes: result.bytes, close: true }
    if (result.kind === 'ready') { this.scram = null; this.#started() } else this.phase = 'auth-final'
    return { bytes: result.bytes, close: false }
  }

  /** A simple Query: every statement in turn, then ReadyForQuery. */
  query (sql: string): Reply | Promise<Reply> {
    const out = this.out
    const parsed = parseCached(this.shared, sql)
    if (parsed instanceof SqlSyntaxError) {
      this.fail(out, { severity: 'ERROR', code: '42601', message: parsed.message, position: parsed.position })
      return this.#ready(out)
    }
    if (parsed.length === 0) {
      out.begin('I').end()
      return this.#ready(out)
    }
    // Several statements outside a transaction block run in one implicit transaction.
    if (parsed.length > 1 && this.status === 'I') { this.implicit = true; this.view.begin() }
    return this.#run(parsed, 0, out)
  }

  #run (statements: Statement[], from: number, out: MessageWriter): Reply | Promise<Reply> {
    for (let i = from; i < statements.length; i++) {
      const statement = statements[i]!
      try {
        checkConstants(statement)
        const seconds = this.sleepSecondsOf(statement, [], [])
        if (seconds > 0) {
          // The row description goes before the statement runs, as PostgreSQL's portal start sends it.
          writeRowDescription(out, columnsOf(statement, [])!, [])
          return this.sleep(seconds).then(() => {
            this.emit(out, this.runStatement(statement, [], []), [], true)
            return this.#run(statements, i + 1, out)
          }, (error: unknown) => {
            this.failWith(out, error)
            return this.#ready(out)
          })
        }
        this.emit(out, this.runStatement(statement, [], []), [])
      } catch (error) {
        this.failWith(out, error)
        return this.#ready(out)
      }
    }
    if (this.implicit) this.endImplicit(true)
    return this.#ready(out)
  }

  #emit (out: MessageWriter, result: Result, formats: readonly number[], described: boolean): void {
    if (result.columns !== null) {
      if (!described) writeRowDescription(out, result.columns, formats)
      for (const row of result.rows) writeDataRow(out, result.columns, row, formats)
    }
    writeCommandComplete(out, result.tag)
  }

  #ready (out: MessageWriter): Reply {
    out.raw(READY_FOR_QUERY[this.status])
    return { bytes: out.take(), close: false }
  }

  /** The seconds a statement sleeps (its pg_sleep calls), 0 when none; 25P02 first in a failed transaction. */
  sleepSecondsOf (statement: Statement, params: readonly Value[], types: Array<TypeName | undefined>): number {
    if (statement.kind !== 'select') return 0
    this.#checkNotAborted(statement)
    let seconds = 0
    for (const item of statement.items) {
      if (item.expr.kind !== 'sleep') continue
      const arg = item.expr.arg
      const value = arg.kind === 'param' ? params[arg.index - 1] : arg.kind === 'int' || arg.kind === 'numeric' ? arg.text : arg.kind === 'string' ? arg.value : null
      const s = Number(value ?? 0)
      if (Number.isNaN(s)) throw new SqlError('22P02', `invalid input syntax for type double precision: "${String(value)}"`)
      seconds += Math.max(0, s)
    }
    void types
    return seconds
  }

  #checkNotAborted (statement: Statement): void {
    if (this.status === 'E' && statement.kind !== 'commit' && statement.kind !== 'rollback') {
      throw new SqlError('25P02', 'current transaction is aborted, commands ignored until end of transaction block')
    }
  }

  /** Runs one statement (after its sleep): a transaction command, or a data statement on the session's view (`columns`: its result's, when known). */
  runStatement (statement: Statement, params: readonly Value[], types: Array<TypeName | undefined>, columns?: Column[] | null): Result {
    this.#checkNotAborted(statement)
    switch (statement.kind) {
      case 'begin':
        if (this.status !== 'I') this.notice = { severity: 'WARNING', code: '25001', message: 'there is already a transaction in progress' }
        this.status = 'T'
        this.implicit = false
        this.view.begin()
        return { columns: null, rows: [], tag: 'BEGIN' }
      case 'commit': {
        const failed = this.status === 'E'
        if (this.status === 'I') this.notice = { severity: 'WARNING', code: '25P01', message: 'there is no transaction in progress' }
        if (failed) this.view.rollback(); else this.view.commit()
        this.status = 'I'
        this.implicit = false
        return { columns: null, rows: [], tag: failed ? 'ROLLBACK' : 'COMMIT' }
      }
      case 'rollback':
        if (this.status === 'I') this.notice = { severity: 'WARNING', code: '25P01', message: 'there is no transaction in progress' }
        this.view.rollback()
        this.status = 'I'
        this.implicit = false
        return { columns: null, rows: [], tag: 'ROLLBACK' }
      default:
        return execute(statement, params, types, this.view, columns)
    }
  }

  /** A notice (WARNING) a transaction command raised, written before its CommandComplete by `flushNotice`. */
  set notice (fields: ErrorFields) {
    this.#notices.push(fields)
  }

  #notices: ErrorFields[] = []

  /** Writes the notices raised so far. */
  flushNotices (out: MessageWriter): void {
    const notices = this.#notices
    if (notices.length === 0) return
    for (const fields of notices) writeError(out, fields, 'N')
    notices.length = 0
  }

  /** Ends an implicit transaction: its writes applied, or dropped. */
  endImplicit (commit: boolean): void {
    if (commit) this.view.commit(); else this.view.rollback()
    this.implicit = false
  }

  /** Writes an ErrorResponse for a thrown error and marks the transaction failed (an implicit one rolls back). */
  failWith (out: MessageWriter, error: unknown): void {
    if (error instanceof SqlError) {
      this.fail(out, { severity: 'ERROR', code: error.code, message: error.message, detail: error.detail, position: error.position, where: error.where })
    } else {
      this.fail(out, { severity: 'ERROR', code: 'XX000', message: error instanceof Error ? error.message : String(error) })
    }
  }

  fail (out: MessageWriter, fields: ErrorFields): void {
    this.flushNotices(out)
    writeError(out, fields)
    if (this.implicit) this.endImplicit(false)
    else if (this.status === 'T') this.status = 'E'
  }

  /** Writes a result (notices first) in the given formats. */
  emit (out: MessageWriter, result: Result, formats: readonly number[], described = false): void {
    this.flushNotices(out)
    this.#emit(out, result, formats, described)
  }
}

// The answers of a group's messages as one reply (in the common case, Sync's alone).
function joined (answers: Buffer[] | null, close: boolean): Reply {
  const bytes = answers === null ? null : answers.length === 1 ? answers[0]! : Buffer.concat(answers)
  return bytes === null && !close ? NONE : { bytes, close }
}

function fatal (code: string, message: string): Reply {
  const out = new MessageWriter(128)
  writeError(out, { severity: 'FATAL', code, message })
  return { bytes: out.take(), close: true }
}
