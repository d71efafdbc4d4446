import { getSystemErrorName } from 'node:util'

/** An Error as node:net makes them: `code` ('ECONNRESET'), `errno` (negative) and `syscall`. */
export function errnoError (errno: number, syscall: string): NodeJS.ErrnoException {
  const code = errnoName(errno)
  const error: NodeJS.ErrnoException = new Error(`${syscall} ${code}`)
  error.code = code
  error.errno = -Math.abs(errno)
  error.syscall = syscall
  return error
}

/** 'ECONNRESET' for 104 (or -104). */
export function errnoName (errno: number): string {
  try {
    return getSystemErrorName(-Math.abs(errno))
  } catch {
    return `errno ${Math.abs(errno)}`
  }
}
