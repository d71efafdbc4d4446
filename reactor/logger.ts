/** Where nyala's servers and clients report what they noticed. */
export interface Logger {
  info: (message: string) => void
  warn: (message: string) => void
  error: (message: string) => void
}

/** Reports nothing: the default for embedded servers and tests. */
export const silentLogger: Logger = { info () {}, warn () {}, error () {} }

/** Writes warnings and errors (and info when `verbose`) to stderr, one line each. */
export function consoleLogger (verbose = false): Logger {
  const line = (level: string, message: string): void => { process.stderr.write(`${new Date().toISOString()} ${level} ${message}\n`) }
  return {
    info (message) { if (verbose) line('INFO', message) },
    warn (message) { line('WARN', message) },
    error (message) { line('ERROR', message) }
  }
}

/**
 * At most one line per `intervalMs` for one kind of event (a flood of
 * refused connections must not become a flood of log lines): the first
 * event logs at once, the ones after it within the interval are counted and
 * reported with the next line that is written.
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

  /** Writes `message()` through `write` unless a line was written less than the interval ago. */
  log (write: (message: string) => void, message: () => string): void {
    const now = this.#now()
    if (now < this.#next) {
      this.#suppressed++
      return
    }
    this.#next = now + this.#intervalMs
    const suppressed = this.#suppressed
    this.#suppressed = 0
    write(suppressed === 0 ? message() : `${message()} (and ${suppressed} more like it since the last such line)`)
  }
}
