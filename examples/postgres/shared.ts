import type { KvTable } from './engine.js'
import { parse, type SqlSyntaxError, type Statement } from './sql.js'
import type { StartupConfig } from './startup.js'

/** What every session of a server shares. */
export interface Shared extends StartupConfig {
  table: KvTable
  /** Parsed query strings (bounded: cleared when full). */
  parsed: Map<string, Statement[] | SqlSyntaxError>
}

const MAX_PARSED = 1024

/** A query string's statements, parsed once per distinct string. */
export function parseCached (shared: Shared, sql: string): Statement[] | SqlSyntaxError {
  let parsed = shared.parsed.get(sql)
  if (parsed === undefined) {
    parsed = parse(sql)
    if (shared.parsed.size >= MAX_PARSED) shared.parsed.clear()
    shared.parsed.set(sql, parsed)
  }
  return parsed
}

/** What a message handler answers: bytes (or none), and whether the connection closes after them. */
export interface Reply { bytes: Buffer | null, close: boolean }

