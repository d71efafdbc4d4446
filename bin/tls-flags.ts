import { readFileSync } from 'node:fs'
import type { TlsOptions } from 'node:tls'

/**
 * The `--tls-*` flags of the example servers and of `nyala serve` and
 * `nyala call`: one parser. Every error is a RangeError with a one-line
 * message naming the flags (the commands print it and exit 2).
 */

/** The TLS flags the example servers take, for their `parseArgs` options. */
export const TLS_FLAG_OPTIONS = {
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  'tls-ca': { type: 'string' },
  'tls-require-client-cert': { type: 'boolean' }
} as const

/** The client's TLS flags (`nyala call`), for its `parseArgs` options. */
export const CLIENT_TLS_FLAG_OPTIONS = {
  tls: { type: 'boolean' },
  'tls-ca': { type: 'string' },
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  'tls-servername': { type: 'string' },
  'tls-insecure': { type: 'boolean' }
} as const

/** The file a flag names, read now; a file that cannot be read is a RangeError naming the flag. */
export function readFlagFile (flag: string, path: string): Buffer {
  try {
    return readFileSync(path)
  } catch (err) {
    const e = err as NodeJS.ErrnoException
    const why = e.code === 'ENOENT' ? 'no such file' : e.code === 'EACCES' ? 'permission denied' : e.code === 'EISDIR' ? 'is a directory' : e.message
    throw new RangeError(`${flag} ${path}: cannot read it (${why})`)
  }
}

/** A server's certificate, key and (optional) CA, read from their files. */
export interface ServerTlsFiles { cert: Buffer, key: Buffer, ca?: Buffer }

/**
 * `--tls-cert FILE --tls-key FILE [--tls-ca FILE]`, the files read:
 * undefined without `--tls-cert` and `--tls-key`. `dependents` are other
 * flags given that need them (named in the error when they are missing);
 * `requireClientCert`, when given, is the flag that asks for client
 * certificates and so needs `--tls-ca`.
 */
export function serverTlsFiles (values: { 'tls-cert'?: string, 'tls-key'?: string, 'tls-ca'?: string }, dependents: string[] = [], requireClientCert?: string): ServerTlsFiles | undefined {
  const cert = values['tls-cert']
  const key = values['tls-key']
  if (cert === undefined && key === undefined) {
    const needing = [...(values['tls-ca'] === undefined ? [] : ['--tls-ca']), ...dependents]
    if (needing.length > 0) throw new RangeError(`${needing.join(' and ')} ${needing.length > 1 ? 'need' : 'needs'} --tls-cert and --tls-key`)
    return undefined
  }
  if (cert === undefined || key === undefined) throw new RangeError('--tls-cert and --tls-key go together')
  if (requireClientCert !== undefined && values['tls-ca'] === undefined) throw new RangeError(`${requireClientCert} needs --tls-ca (the CA that signs client certificates)`)
  const files: ServerTlsFiles = { cert: readFlagFile('--tls-cert', cert), key: readFlagFile('--tls-key', key) }
  if (values['tls-ca'] !== undefined) files.ca = readFlagFile('--tls-ca', values['tls-ca'])
  return files
}

/**
 * `--tls-cert FILE --tls-key FILE [--tls-ca FILE] [--tls-require-client-cert]`
 * as `ServerOptions.tls` (TLS from the first byte): undefined without `--tls-cert`.
 */
export function tlsFromFlags (values: { 'tls-cert'?: string, 'tls-key'?: string, 'tls-ca'?: string, 'tls-require-client-cert'?: boolean }): TlsOptions | undefined {
  const requireClientCert = values['tls-require-client-cert'] === true
  const flag = requireClientCert ? '--tls-require-client-cert' : undefined
  const files = serverTlsFiles(values, flag === undefined ? [] : [flag], flag)
  if (files === undefined) return undefined
  return { ...files, requestCert: requireClientCert, rejectUnauthorized: requireClientCert }
}

/** A client's TLS settings (the shape of the KRPC `ClientTlsOptions`). */
export interface ClientTlsFlags {
  ca?: Buffer
  cert?: Buffer
  key?: Buffer
  servername?: string
  rejectUnauthorized?: boolean
}

/**
 * `[--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]
 * [--tls-servername NAME] [--tls-insecure]` as a client's TLS settings, the
 * files read: undefined when none is given (any of them offers TLS; `--tls`
 * alone, with the default settings: Node's CAs, the endpoint's host name).
 * `--tls-insecure` does not check the server's certificate.
 */
export function clientTlsFromFlags (values: { tls?: boolean, 'tls-ca'?: string, 'tls-cert'?: string, 'tls-key'?: string, 'tls-servername'?: string, 'tls-insecure'?: boolean }): ClientTlsFlags | undefined {
  const given = values.tls === true || values['tls-insecure'] === true ||
    values['tls-ca'] !== undefined || values['tls-cert'] !== undefined || values['tls-key'] !== undefined || values['tls-servername'] !== undefined
  if (!given) return undefined
  if ((values['tls-cert'] === undefined) !== (values['tls-key'] === undefined)) throw new RangeError('--tls-cert and --tls-key go together')
  const tls: ClientTlsFlags = {}
  if (values['tls-ca'] !== undefined) tls.ca = readFlagFile('--tls-ca', values['tls-ca'])
  if (values['tls-cert'] !== undefined) tls.cert = readFlagFile('--tls-cert', values['tls-cert'])
  if (values['tls-key'] !== undefined) tls.key = readFlagFile('--tls-key', values['tls-key'])
  if (values['tls-servername'] !== undefined) {
    if (values['tls-servername'] === '') throw new RangeError('--tls-servername must not be empty')
    tls.servername = values['tls-servername']
  }
  if (values['tls-insecure'] === true) tls.rejectUnauthorized = false
  return tls
}
