import type { Socket } from 'node:net'
import { TLSSocket, createSecureContext, type SecureContext, type TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { RateLimitedLog } from './logger.js'
import type { ServerContext } from './server-context.js'
import type { ConnectionRecord } from './connection-record.js'

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
  readonly #ctx: ServerContext
  readonly #logFailed: RateLimitedLog

  constructor (tls: TlsOptions, timeoutMs: number, ctx: ServerContext) {
    checkAcceptOptions(tls)
    if (tls.requestCert === true && tls.rejectUnauthorized !== false && tls.ca === undefined) {
      // Else any certificate from a public CA would pass, its CN becoming ctx.user.
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.requestCert needs tls.ca, the CA that signs the client certificates')
    }
    this.#tls = tls
    // Bad certificates and keys throw here, before listening.
    this.#secureContext = createSecureContext(tls)
    this.#timeoutMs = timeoutMs
    this.#ctx = ctx
    this.#logFailed = ctx.rateLimitedLog()
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
  handshake (sc: ConnectionRecord, socket: TLSSocket, secured: (user: string) => void): void {
    const ctx = this.#ctx
    const remoteAddress = sc.remoteAddress
    const connection = sc.connection
    const tls = this.#tls
    const timeoutMs = this.#timeoutMs
    const failed = (why: string, code: string | undefined): void => {
      ctx.counters.tlsHandshakeFailed()
      this.#logFailed.log(ctx.warn, () => `TLS handshake with ${remoteAddress} failed: ${why}; closing the connection`,
        () => ({ protocol: ctx.protocol.name, remote: remoteAddress, code }))
    }
    const onError = (err: NodeJS.ErrnoException): void => { failed(err.message.split('\n')[0]!, err.code) }
    const done = (): void => {
      ctx.clock.clearTimer(timer)
      socket.off('error', onError)
      socket.off('close', done)
    }
    const timer = ctx.clock.setTimer(() => {
      done()
      if (sc.closedAt >= 0) return
      ctx.counters.tlsHandshakeTimedOut()
      this.#logFailed.log(ctx.warn, () => `TLS handshake with ${remoteAddress} not done after ${timeoutMs} ms; closing the connection`,
        () => ({ protocol: ctx.protocol.name, remote: remoteAddress, tlsHandshakeTimeoutMs: timeoutMs }))
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
      ctx.counters.badFrame(remoteAddress, `TLS: ${why}; closing the connection`, (err as NodeJS.ErrnoException).code)
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
