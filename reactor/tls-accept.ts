import type { Socket } from 'node:net'
import { TLSSocket, createSecureContext, type SecureContext, type TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Clock } from '../scheduling/clock.js'
import { RateLimitedLog, type LogFields } from './logger.js'
import { LOG_INTERVAL_MS } from './server-options.js'
import type { ServerConnection } from './server-connection.js'

/** What TLS from the first byte needs of the server around it. */
export interface TlsAcceptHost {
  readonly clock: Clock
  /** The protocol's name, for log fields. */
  readonly protocolName: string
  readonly stats: { tlsHandshakeFailures: number, tlsHandshakeTimeouts: number, badFrames: number }
  warn: (message: string, fields?: LogFields) => void
  /** A peer sent bytes TLS refused after the handshake: logged, rate-limited. */
  badData: (remoteAddress: string, why: string, code: string | undefined) => void
}

/**
 * The server's `tls` option: TLS from the first byte. Checks the options
 * and builds the secure context once (bad certificates throw before
 * listening), wraps each accepted socket, and runs its handshake within
 * `tlsHandshakeTimeoutMs`; the protocol's set-up follows it.
 */
export class TlsAccept {
  readonly #tls: TlsOptions
  readonly #secureContext: SecureContext
  readonly #timeoutMs: number
  readonly #host: TlsAcceptHost
  readonly #logFailed: RateLimitedLog

  constructor (tls: TlsOptions, timeoutMs: number, host: TlsAcceptHost) {
    checkAcceptOptions(tls)
    if (tls.requestCert === true && tls.rejectUnauthorized !== false && tls.ca === undefined) {
      // Else any certificate from a public CA would pass, its CN becoming ctx.user.
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.requestCert needs tls.ca, the CA that signs the client certificates')
    }
    this.#tls = tls
    // Bad certificates and keys throw here, before listening.
    this.#secureContext = createSecureContext(tls)
    this.#timeoutMs = timeoutMs
    this.#host = host
    this.#logFailed = new RateLimitedLog(LOG_INTERVAL_MS, () => host.clock.now())
  }

  /** The TLS socket over an accepted one (paused: it takes the handle before any byte is read). May throw (node:tls). */
  socket (accepted: Socket): TLSSocket {
    const tls = this.#tls
    const socket = new TLSSocket(accepted, {
      isServer: true, secureContext: this.#secureContext, requestCert: tls.requestCert === true, rejectUnauthorized: tls.rejectUnauthorized !== false,
      ALPNProtocols: tls.ALPNProtocols, SNICallback: tls.SNICallback
    })
    // A client's renegotiation is a TLS error (closing the connection), not CPU spent on new handshakes.
    socket.disableRenegotiation()
    return socket
  }

  /**
   * The TLS handshake of an accepted connection, bounded by
   * tlsHandshakeTimeoutMs: `secured(user)` once it is done, `user` being
   * the verified client certificate's CN ('' without one). A failure
   * closes the connection.
   */
  handshake (sc: ServerConnection, socket: TLSSocket, secured: (user: string) => void): void {
    const host = this.#host
    const remoteAddress = sc.remoteAddress
    const connection = sc.connection
    const tls = this.#tls
    const timeoutMs = this.#timeoutMs
    const failed = (why: string, code: string | undefined): void => {
      host.stats.tlsHandshakeFailures++
      this.#logFailed.log(host.warn, () => `TLS handshake with ${remoteAddress} failed: ${why}; closing the connection`,
        () => ({ protocol: host.protocolName, remote: remoteAddress, code }))
    }
    const onError = (err: NodeJS.ErrnoException): void => { failed(err.message.split('\n')[0]!, err.code) }
    const done = (): void => {
      host.clock.clearTimer(timer)
      socket.off('error', onError)
      socket.off('close', done)
    }
    const timer = host.clock.setTimer(() => {
      done()
      if (sc.closedAt >= 0) return
      host.stats.tlsHandshakeTimeouts++
      this.#logFailed.log(host.warn, () => `TLS handshake with ${remoteAddress} not done after ${timeoutMs} ms; closing the connection`,
        () => ({ protocol: host.protocolName, remote: remoteAddress, tlsHandshakeTimeoutMs: timeoutMs }))
      connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `TLS handshake with ${remoteAddress} timed out after ${timeoutMs} ms`))
    }, timeoutMs)
    socket.on('error', onError)
    socket.once('close', done)
    // A TLS socket made outside tls.Server reports TLS errors after the
    // handshake (bad records, alerts, renegotiation) only as '_tlsError'
    // until its control is released: each one closes the connection.
    socket.on('_tlsError', (err: Error) => {
      if (sc.closedAt >= 0 || connection.isClosed) return
      const why = err.message.split('\n')[0]!
      host.stats.badFrames++
      host.badData(remoteAddress, `TLS: ${why}; closing the connection`, (err as NodeJS.ErrnoException).code)
      connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `TLS: ${why}`, { cause: err }))
    })
    socket.once('secure', () => {
      done()
      if (sc.closedAt >= 0) return
      let user = ''
      if (tls.requestCert === true) {
        // What tls.Server checks after the handshake: OpenSSL's verdict on the client's certificate.
        const verify = (socket as unknown as { _handle?: { verifyError?: () => Error | null } | null })._handle?.verifyError
        const verifyError = typeof verify === 'function' ? verify.call((socket as unknown as { _handle: unknown })._handle) : new Error('cannot check the client certificate')
        if (verifyError !== null && verifyError !== undefined) {
          if (tls.rejectUnauthorized !== false) {
            failed(`client certificate refused: ${verifyError.message}`, (verifyError as NodeJS.ErrnoException).code)
            connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `TLS client certificate of ${remoteAddress} refused: ${verifyError.message}`))
            return
          }
        } else {
          // Only a verified certificate names the user.
          const cn = socket.getPeerCertificate().subject?.CN as string | string[] | undefined
          user = (Array.isArray(cn) ? cn[0] : cn) ?? ''
        }
      }
      // As tls.Server does once the client is accepted: later TLS errors are 'error' events too.
      (socket as unknown as { _releaseControl?: () => void })._releaseControl?.()
      secured(user)
    })
  }
}

// The options each accepted connection's TLSSocket takes beyond the secure context, checked once.
function checkAcceptOptions (tls: TlsOptions): void {
  const alpn = tls.ALPNProtocols
  if (alpn !== undefined) {
    const names: unknown[] = Array.isArray(alpn) ? alpn : [alpn]
    // A single buffer is the wire format already; an array lists names of 1 to 255 bytes.
    const ok = Array.isArray(alpn)
      ? names.every(n => (typeof n === 'string' || ArrayBuffer.isView(n)) && Buffer.byteLength(n as string) >= 1 && Buffer.byteLength(n as string) <= 255)
      : ArrayBuffer.isView(alpn)
    if (!ok) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.ALPNProtocols must be an array of protocol names (strings or buffers of 1 to 255 bytes) or a buffer')
  }
  if (tls.SNICallback !== undefined && typeof tls.SNICallback !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.SNICallback must be a function')
}
