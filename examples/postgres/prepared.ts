import type { TypeName } from './engine.js'
import { columnsOf, type Column } from './executor.js'
import { writeRowDescription } from './results.js'
import type { Statement } from './sql.js'
import { MessageWriter } from './wire.js'

/** NoData ('n'): the answer to Describe of a statement that returns no rows. */
const NO_DATA = Buffer.from([0x6e, 0, 0, 0, 4])

/**
 * A prepared statement (Parse): its statement (null: an empty query), its
 * parameters' types, and what describes its result, worked out once: the
 * columns, and the RowDescription bytes when every column has one format
 * (text, or binary), the answer to every Describe and the input of every
 * Execute of it.
 */
export class Prepared {
  readonly statement: Statement | null
  readonly types: Array<TypeName | undefined>
  /** A SELECT with pg_sleep among its columns (the session sleeps before it runs). */
  readonly sleeps: boolean
  /** undefined: not worked out yet (it may fail, 42883: it fails at Describe or Execute, each time, as before). */
  #columns: Column[] | null | undefined = undefined
  /** The RowDescription in all-text [0] and all-binary [1] formats, built at their first Describe. */
  readonly #descriptions: Array<Buffer | undefined> = [undefined, undefined]

  constructor (statement: Statement | null, types: Array<TypeName | undefined>) {
    this.statement = statement
    this.types = types
    this.sleeps = statement?.kind === 'select' && statement.items.some(item => item.expr.kind === 'sleep')
  }

  /** The result's columns (null: the statement returns no rows). */
  get columns (): Column[] | null {
    if (this.#columns === undefined) this.#columns = this.statement === null ? null : columnsOf(this.statement, this.types)
    return this.#columns
  }

  /** The columns, or undefined when working them out fails (the statement's run reports it, in its turn). */
  get knownColumns (): Column[] | null | undefined {
    try {
      return this.columns
    } catch {
      return undefined
    }
  }

  /** RowDescription of the result in `formats` (Bind's result format codes), or NoData. */
  writeDescription (out: MessageWriter, formats: readonly number[]): void {
    const columns = this.columns
    if (columns === null) {
      out.raw(NO_DATA)
      return
    }
    const uniform = formats.length === 0 ? 0 : formats.length === 1 && (formats[0] === 0 || formats[0] === 1) ? formats[0] : -1
    if (uniform < 0) {
      writeRowDescription(out, columns, formats)
      return
    }
    let bytes = this.#descriptions[uniform]
    if (bytes === undefined) {
      const writer = new MessageWriter(64)
      writeRowDescription(writer, columns, formats)
      bytes = this.#descriptions[uniform] = writer.take()
    }
    out.raw(bytes)
  }
}
