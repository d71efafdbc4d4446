/**
 * Where nyala's servers, clients and reactor supervisors report what they
 * noticed. Each event is a short message plus structured fields (a plain
 * object: connection id, remote address, error code, ...), so any logger
 * that takes a message and an object fits through a few lines of adapter
 * (docs/logging.md shows pino's).
 */

/** Structured context of one log event: plain, JSON-serializable values. */
export type LogFields = Record<string, unknown>

/** A logger: one method per level, each taking a message and optional fields. */
export interface Logger {
  /** The process cannot serve as asked: listener errors, out of file descriptors, a reactor killed after close. */
  error: (message: string, fields?: LogFields) => void
  /** A peer or a limit needed action: connections refused or evicted, bad data, failed negotiations, budgets passed, a reactor died. */
  warn: (message: string, fields?: LogFields) => void
  /** Routine events: idle and aged-out connections closed, connections retired, reactors started and exited. */
  info: (message: string, fields?: LogFields) => void
  /** Each retry, with its delay. Optional: loggers written before it existed have only the three above. */
  debug?: (message: string, fields?: LogFields) => void
}

/** A level of {@link Logger}, lowest first; `silent` writes nothing. */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent'

const LEVELS: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 }

/** Reports nothing. Pass it (or `logger: null`) to silence a server, client or supervisor. */
export const silentLogger: Required<Logger> = { error () {}, warn () {}, info () {}, debug () {} }

/** Options of {@link consoleLogger}. */
export interface ConsoleLoggerOptions {
  /** Lowest level written; default `warn` (warnings and errors). */
  level?: LogLevel
  /** Where lines go; default `process.stderr`, looked up at each write. */
  stream?: {
    /** Takes one whole line, its newline included. */
    write: (line: string) => unknown
  }
  /** Append each event's fields as ` key=value` (default false: the message says what a person needs). */
  fields?: boolean
}

/**
 * One line per event, `TIME LEVEL message` (and ` key=value ...` with
 * `fields: true`), on stderr by default. `consoleLogger(true)` is the
 * verbose form (info and above).
 */
export function consoleLogger (options: boolean | ConsoleLoggerOptions = {}): Required<Logger> {
  const { level = 'warn', stream, fields: withFields = false }: ConsoleLoggerOptions = typeof options === 'boolean' ? { level: options ? 'info' : 'warn' } : options
  const threshold = LEVELS[level] ?? LEVELS.warn
  const write = (at: LogLevel, message: string, fields: LogFields | undefined): void => {
    if (LEVELS[at] < threshold) return
    const line = `${new Date().toISOString()} ${at.toUpperCase()} ${oneLine(message)}${withFields ? formatFields(fields) : ''}\n`
    ;(stream ?? process.stderr).write(line)
  }
  return {
    error (message, fields) { write('error', message, fields) },
    warn (message, fields) { write('warn', message, fields) },
    info (message, fields) { write('info', message, fields) },
    debug (message, fields) { write('debug', message, fields) }
  }
}

/**
 * The logger of a server, client or supervisor given `option`: undefined is
 * the default (warnings and errors on stderr; `NYALA_LOG_LEVEL` in the
 * environment sets another level), null is silence, a logger is used as is
 * (without `debug`, debug events are dropped). Methods are always called on
 * the logger object, so class-based loggers keep their `this`.
 */
export function resolveLogger (option: Logger | null | undefined): Required<Logger> {
  if (option === null) return silentLogger
  if (option === undefined) return consoleLogger({ level: envLevel() })
  if (typeof option.debug === 'function') return option as Required<Logger>
  return {
    error: (message, fields) => option.error(message, fields),
    warn: (message, fields) => option.warn(message, fields),
    info: (message, fields) => option.info(message, fields),
    debug () {}
  }
}

function envLevel (): LogLevel {
  const value = process.env.NYALA_LOG_LEVEL?.toLowerCase()
  return value !== undefined && Object.hasOwn(LEVELS, value) ? value as LogLevel : 'warn'
}

// Control characters (C0, DEL, C1): text from peers must not move the
// cursor, recolour the terminal or forge a line of its own.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\x00-\x1f\x7f-\x9f]/
// eslint-disable-next-line no-control-regex
const CONTROLS = /[\x00-\x1f\x7f-\x9f]/g
// Left by JSON.stringify, which escapes only U+0000 to U+001F.
const DEL_AND_C1 = /[\x7f-\x9f]/g
const NAMED: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' }

function escapeControl (c: string): string {
  return NAMED[c] ?? `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`
}

/** `text` with every control character escaped (`\n`, `\r`, `\t`, else `\xHH`): one line, nothing for a terminal to obey. */
export function oneLine (text: string): string {
  return CONTROL.test(text) ? text.replace(CONTROLS, escapeControl) : text
}

function json (value: unknown): string | undefined {
  const text = JSON.stringify(value)
  return text === undefined ? undefined : text.replace(DEL_AND_C1, (c) => `\\u00${c.charCodeAt(0).toString(16)}`)
}

/** ` key=value` per field; strings with spaces or quotes are JSON-quoted, errors show their message. */
export function formatFields (fields: LogFields | undefined): string {
  if (fields === undefined) return ''
  let out = ''
  for (const [key, value] of Object.entries(fields)) {
    if (value === undefined) continue
    out += ` ${key}=${formatValue(value)}`
  }
  return out
}

// A string written bare: no space, quote, '=' or control character.
// eslint-disable-next-line no-control-regex
const BARE = /^[^\s"=\x00-\x1f\x7f-\x9f]+$/

function formatValue (value: unknown): string {
  if (value instanceof Error) return json(value.message)!
  if (typeof value === 'string') return BARE.test(value) ? value : json(value)!
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint' || value === null) return String(value)
  try {
    return json(value) ?? oneLine(String(value))
  } catch {
    return oneLine(String(value))
  }
}

/**
 * At most one line per `intervalMs` for one kind of event (a flood of
 * refused connections must not become a flood of log lines): the first
 * event logs at once, the ones after it within the interval are counted and
 * reported with the next line that is written (as `suppressed` in its fields).
 */
export class RateLimitedLog {
  readonly #intervalMs: number
  readonly #now: () => number
  #next = Number.NEGATIVE_INFINITY
  #suppressed = 0

  constructor (intervalMs: number, now: () => number) {
    this.#intervalMs = intervalMs
    this.#now = now
  }

  /** Writes `message()` (and `fields()`) through `write` unless a line was written less than the interval ago. */
  log (write: (message: string, fields?: LogFields) => void, message: () => string, fields?: () => LogFields): void {
    const now = this.#now()
    if (now < this.#next) {
      this.#suppressed++
      return
    }
    this.#next = now + this.#intervalMs
    const suppressed = this.#suppressed
    this.#suppressed = 0
    const context = fields?.()
    if (suppressed === 0) write(message(), context)
    else write(`${message()} (and ${suppressed} more like it since the last such line)`, context === undefined ? undefined : { ...context, suppressed })
  }
}
