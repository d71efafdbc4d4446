import { readFileSync } from 'node:fs'
import type { TlsOptions } from 'node:tls'

/** The TLS flags the example servers take, for their `parseArgs` options. */
export const TLS_FLAG_OPTIONS = {
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  'tls-ca': { type: 'string' },
  'tls-require-client-cert': { type: 'boolean' }
} as const

/**
 * `--tls-cert FILE --tls-key FILE [--tls-ca FILE] [--tls-require-client-cert]`
 * as `ServerOptions.tls`: undefined without `--tls-cert`.
 */
export function tlsFromFlags (values: { 'tls-cert'?: string, 'tls-key'?: string, 'tls-ca'?: string, 'tls-require-client-cert'?: boolean }): TlsOptions | undefined {
  const cert = values['tls-cert']
  const key = values['tls-key']
  if (cert === undefined && key === undefined) {
    if (values['tls-ca'] !== undefined || values['tls-require-client-cert'] === true) throw new RangeError('--tls-ca and --tls-require-client-cert need --tls-cert and --tls-key')
    return undefined
  }
  if (cert === undefined || key === undefined) throw new RangeError('--tls-cert and --tls-key go together')
  const requireClientCert = values['tls-require-client-cert'] === true
  if (requireClientCert && values['tls-ca'] === undefined) throw new RangeError('--tls-require-client-cert needs --tls-ca (the CA that signs client certificates)')
  return {
    cert: readFileSync(cert),
    key: readFileSync(key),
    ca: values['tls-ca'] === undefined ? undefined : readFileSync(values['tls-ca']),
    requestCert: requireClientCert,
    rejectUnauthorized: requireClientCert
  }
}
