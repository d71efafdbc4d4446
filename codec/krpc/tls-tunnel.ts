import type { Socket } from 'node:net'
import { Duplex } from 'node:stream'
import { TLSSocket, connect as tlsConnect, type ConnectionOptions, type SecureContext } from 'node:tls'
import { ErrorCode, RpcError } from '../errors.js'
import type { SecureChannel, TlsEngine, TlsEngineStep } from '../protocol.js'

/**
 * A TLS handshake carried by another protocol's messages (KRPC tunnels it in
 * NegotiatePB TLS_HANDSHAKE steps), then TLS on the connection's socket.
 *
 * node:tls runs over a Duplex of ours. Until `join`, what TLS writes is
 * collected and handed out by `continue` as the token to send, and the
 * peer's tokens are pushed in as what it read. `join` then plugs the same
 * TLS session into the socket: TLS writes go to the socket, and the
 * connection hands every chunk it reads to `input`. There is no copy beyond
 * what TLS does: chunks pass through by reference.
 */
export class TlsTunnel implements TlsEngine {
  readonly socket: TLSSocket
  readonly #wire: Duplex
  readonly #isServer: boolean
  readonly #requestCert: boolean
  #written: Buffer[] = []
  #raw: Socket | null = null
  #done = false
  #failure: RpcError | null = null
  #settling: { resolve: (step: TlsEngineStep) => void, reject: (error: RpcError) => void } | null = null
  // Bumped on every write and event: a settle waits until it stops moving.
  #moves = 0

  private constructor (isServer: boolean, requestCert: boolean, make: (wire: Duplex) => TLSSocket) {
    this.#isServer = isServer
    this.#requestCert = requestCert
    const writeOut = (chunks: Buffer[], callback: (error?: Error | null) => void): void => {
      this.#moves++
      const raw = this.#raw
      if (raw === null) {
        for (const chunk of chunks) this.#written.push(chunk)
        callback()
        return
      }
      // Joined: straight to the socket; its backpressure is TLS's.
      if (chunks.length > 1) raw.cork()
      let ok = true
      for (const chunk of chunks) ok = raw.write(chunk)
      if (chunks.length > 1) raw.uncork()
      if (ok) callback()
      else raw.once('drain', () => callback())
    }
    this.#wire = new Duplex({
      // The connection pushes what it reads; it pauses the socket itself.
      read: () => {},
      write: (chunk: Buffer, _encoding, callback) => writeOut([chunk], callback),
      writev: (chunks, callback) => writeOut(chunks.map(c => c.chunk as Buffer), callback),
      // TLS ended (close_notify written): the socket ends once it has sent everything.
      final: (callback) => {
        if (this.#raw === null) callback()
        else this.#raw.end(() => callback())
      }
    })
    const socket = make(this.#wire)
    this.socket = socket
    socket.on('error', (err: Error) => this.#fail(err))
    if (isServer) {
      socket.once('secure', () => this.#secured())
    } else {
      socket.once('secureConnect', () => this.#secured())
    }
    // A renegotiation request is an error, not CPU spent on handshakes.
    socket.disableRenegotiation()
  }

  /**
   * The server's end. `requestCert`: ask for the client's certificate and
   * refuse one that `secureContext`'s CAs did not sign (certificate authentication).
   */
  static server (secureContext: SecureContext, requestCert: boolean): TlsTunnel {
    return new TlsTunnel(true, requestCert, (wire) => new TLSSocket(wire, {
      isServer: true, secureContext, requestCert, rejectUnauthorized: requestCert
    }))
  }

  /** The client's end: node:tls's `connect` over the tunnel (its server checks: CA, name, dates). */
  static client (options: ConnectionOptions): TlsTunnel {
    return new TlsTunnel(false, false, (wire) => tlsConnect({ ...options, socket: wire }))
  }

  /** The TLS version agreed ('TLSv1.3', 'TLSv1.2'), once the handshake is done. */
  get protocol (): string | null {
    return this.socket.getProtocol()
  }

  /**
   * The verified peer certificate's subject CN: the client's user under
   * certificate authentication. Empty when there is none.
   */
  get peerName (): string {
    const cn = this.socket.getPeerCertificate()?.subject?.CN as string | string[] | undefined
    return (Array.isArray(cn) ? cn[0] : cn) ?? ''
  }

  /**
   * Hands TLS the peer's token (empty to begin, on the client) and resolves
   * with what TLS wrote in answer, once it has stopped writing, and whether
   * the handshake is complete. Rejects when TLS fails (the peer's
   * certificate refused, bad records, an alert).
   */
  continue (token: Uint8Array): Promise<TlsEngineStep> {
    if (this.#failure !== null) return Promise.reject(this.#failure)
    if (this.#settling !== null) return Promise.reject(new RpcError(ErrorCode.NEGOTIATION_FAILED, 'TLS handshake step while another is running'))
    return new Promise((resolve, reject) => {
      this.#settling = { resolve, reject }
      if (token.length > 0) this.#wire.push(Buffer.isBuffer(token) ? token : Buffer.from(token.buffer, token.byteOffset, token.length))
      this.#settle(this.#moves)
    })
  }

  // node:tls answers within the turns that follow its input (the stream
  // wrapper reads, OpenSSL runs, the answer is written): the step is over
  // when two turns pass with nothing new.
  #settle (seen: number): void {
    setImmediate(() => setImmediate(() => {
      const settling = this.#settling
      if (settling === null) return
      if (this.#moves !== seen) {
        this.#settle(this.#moves)
        return
      }
      this.#settling = null
      const token = this.#written.length === 1 ? this.#written[0]! : Buffer.concat(this.#written)
      this.#written = []
      settling.resolve({ token, done: this.#done })
    }))
  }

  #secured (): void {
    this.#moves++
    if (this.#isServer && this.#requestCert) {
      // What tls.Server checks after the handshake: OpenSSL's verdict on the client's certificate.
      const handle = (this.socket as unknown as { _handle?: { verifyError?: () => Error | null } | null })._handle
      const verifyError = typeof handle?.verifyError === 'function' ? handle.verifyError() : new Error('cannot check the client certificate')
      if (verifyError !== null && verifyError !== undefined) {
        this.#fail(verifyError)
        return
      }
    }
    this.#done = true
  }

  #fail (err: Error): void {
    this.#moves++
    if (this.#failure !== null) return
    const why = err.message.split('\n')[0]!
    this.#failure = new RpcError(ErrorCode.NEGOTIATION_FAILED, `TLS handshake failed: ${why}`, { cause: err })
    const settling = this.#settling
    this.#settling = null
    settling?.reject(this.#failure)
  }

  /**
   * Plugs the TLS session into `raw`: `pending` (what TLS wrote after the
   * handshake's last token, e.g. TLS 1.3 session tickets) goes out first,
   * then every TLS write. Chunks read from `raw` go to the channel's `input`.
   */
  join (raw: Socket, pending: Buffer | null): SecureChannel {
    this.#raw = raw
    const written = this.#written
    this.#written = []
    if (pending !== null && pending.length > 0) raw.write(pending)
    for (const chunk of written) raw.write(chunk)
    // As tls.Server does once the peer is accepted: later TLS errors are 'error' events too.
    const control = this.socket as unknown as { _releaseControl?: () => void }
    control._releaseControl?.()
    const wire = this.#wire
    return {
      stream: this.socket,
      // The stream wrapper beneath TLS reads each chunk at once ('data' events).
      input: (chunk: Buffer) => { wire.push(chunk) }
    }
  }

  /** Drops the tunnel (the handshake failed, timed out, or only authenticated). */
  close (): void {
    this.#settling = null
    this.socket.destroy()
    this.#wire.destroy()
  }
}
