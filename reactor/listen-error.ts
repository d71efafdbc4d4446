/** Node's words for the errors a listen meets most. */
const LISTEN_ERRORS: Record<string, string> = {
  EADDRINUSE: 'address already in use',
  EACCES: 'permission denied',
  EADDRNOTAVAIL: 'address not available on this host',
  ENOTFOUND: 'host name not found',
  EAI_AGAIN: 'host name lookup failed for now',
  EINVAL: 'invalid address'
}

/**
 * `listen` could not bind its socket: `code` is the errno code
 * (EADDRINUSE, EACCES, ...), `host` and `port` what was asked for, `cause`
 * node's own error. The message is one line: `cannot listen on
 * 127.0.0.1:7050: address already in use (EADDRINUSE)`.
 */
export class ListenError extends Error {
  /** The errno code (EADDRINUSE, EACCES, ...); 'UNKNOWN' when node gave none. */
  readonly code: string
  /** The host `listen` was asked for. */
  readonly host: string
  /** The port `listen` was asked for (0: any free one). */
  readonly port: number
  /** The system call that failed (`listen`, `bind`, `getaddrinfo`), as node reported it. */
  readonly syscall: string | undefined

  constructor (cause: NodeJS.ErrnoException, host: string, port: number) {
    const code = cause.code ?? 'UNKNOWN'
    const where = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`
    super(`cannot listen on ${where}: ${LISTEN_ERRORS[code] ?? cause.message} (${code})`, { cause })
    this.name = 'ListenError'
    this.code = code
    this.host = host
    this.port = port
    this.syscall = cause.syscall
  }
}
