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
