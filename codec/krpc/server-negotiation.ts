/**
 * The server's side of KRPC negotiation: the preamble check, then a pure
 * state machine that takes the client's frames and returns what to send
 * (the exchange is drawn in negotiation-step.ts). The connection that
 * drives it owns the socket and the deadline.
 */
import { RpcError } from '../errors.js'
import type { TlsEngine } from '../protocol.js'
import { KrpcCode } from './codes.js'
import { encodeErrorFrame } from './encode-frame.js'
import { CONNECTION_CONTEXT_CALL_ID, KRPC_PREAMBLE, KRPC_VERSION, NEGOTIATE_CALL_ID, RequestHeaderType } from './frames.js'
import { splitFrame } from './parsed-frame.js'
import {
  ConnectionContextType, NegotiateStep, NegotiateType, RpcFeature, featuresOf, negotiateFrame, negotiationError, tlsFrame,
  type NegotiatePB, type NegotiationStep
} from './negotiation-step.js'

const HTTP_VERBS = ['GET ', 'POST ', 'HEAD ', 'PUT ', 'OPTIONS', 'DELETE', 'CONNECT', 'PATCH', 'TRACE'].map(v => Buffer.from(v, 'latin1'))

/** Bytes of the client preamble that the server reads before any frame. */
export const PREAMBLE_BYTES = KRPC_PREAMBLE.length

/** Checks the 7-byte preamble; an error means: close without a reply. */
export function checkPreamble (bytes: Buffer): RpcError | null {
  for (const verb of HTTP_VERBS) {
    const n = Math.min(verb.length, bytes.length)
    if (bytes.subarray(0, n).equals(verb.subarray(0, n))) {
      return negotiationError('invalid negotiation, appears to be an HTTP client on the RPC port')
    }
  }
  if (!bytes.subarray(0, 4).equals(KRPC_PREAMBLE.subarray(0, 4))) return negotiationError('invalid negotiation: bad magic number')
  if (bytes[4] !== KRPC_VERSION) return negotiationError(`unsupported RPC version ${bytes[4] ?? 'none'}`)
  return null
}

/** Longest SASL PLAIN user name (authcid) a server accepts, in bytes; a longer one is refused FATAL_UNAUTHORIZED. */
export const MAX_USER_BYTES = 256

/** Checks a user name and password from SASL PLAIN; resolve false to refuse. */
export type Authenticator = (user: string, password: string) => boolean | Promise<boolean>

/** How a server negotiates: authentication, TLS, and what it requires of clients. */
export interface ServerNegotiationOptions {
  /** Verifies SASL PLAIN credentials; by default any user is accepted (as Kudu's PlainAuthCb). */
  authenticate?: Authenticator | undefined
  /**
   * Makes the TLS engine for a client that offers TLS; without it TLS is
   * not offered. `requestCert`: certificate authentication was chosen, so
   * the engine asks for the client's certificate and refuses an unsigned one.
   */
  tls?: ((requestCert: boolean) => TlsEngine) | undefined
  /** The server has the CA of client certificates: a client offering CERTIFICATE authentication gets it. */
  verifiesClientCerts?: boolean | undefined
  /** Refuse a client that does not offer TLS (FATAL_UNAUTHORIZED). */
  requireTls?: boolean | undefined
  /** Refuse a client that does not authenticate by certificate (FATAL_UNAUTHORIZED). */
  requireClientCert?: boolean | undefined
  /** The client is on loopback and loopback is not encrypted: offer TLS_AUTHENTICATION_ONLY. */
  authOnlyLoopback?: boolean | undefined
}

/** The server's side of negotiation, after the preamble has passed `checkPreamble`. */
export class ServerNegotiation {
  readonly #options: ServerNegotiationOptions
  readonly #authenticate: Authenticator | undefined
  #state: 'negotiate' | 'tls' | 'sasl' | 'context' | 'done' = 'negotiate'
  #features: ReadonlySet<number> = new Set()
  #user = ''
  #authentication: 'sasl' | 'certificate' = 'sasl'
  #engine: TlsEngine | null = null
  #joined = false
  #tls: string | null = null

  constructor (options: ServerNegotiationOptions = {}) {
    this.#options = options
    this.#authenticate = options.authenticate
  }

  /** The connection closed mid-negotiation: drops the TLS engine. */
  abort (): void {
    if (!this.#joined) this.#engine?.close()
    this.#engine = null
  }

  /** Handles one client frame. May be async when an authenticator is. */
  onFrame (frame: Buffer): NegotiationStep | Promise<NegotiationStep> {
    const parts = splitFrame(frame)
    if (parts instanceof RpcError) return { error: parts }
    const header = RequestHeaderType.decode(parts.header)
    if (header instanceof RpcError) return this.#fatal(KrpcCode.FATAL_INVALID_RPC_HEADER, `bad request header: ${header.message}`)
    if (this.#state === 'context') {
      if (header.call_id !== CONNECTION_CONTEXT_CALL_ID) {
        return this.#fatal(KrpcCode.FATAL_INVALID_RPC_HEADER, `expected connection context call id ${CONNECTION_CONTEXT_CALL_ID}, got ${header.call_id}`)
      }
      const context = ConnectionContextType.decode(parts.body)
      if (context instanceof RpcError) return this.#fatal(KrpcCode.FATAL_DESERIALIZING_REQUEST, `bad connection context: ${context.message}`)
      this.#state = 'done'
      return { done: { features: this.#features, user: this.#user, authentication: this.#authentication, tls: this.#tls } }
    }
    if (header.call_id !== NEGOTIATE_CALL_ID) {
      return this.#fatal(KrpcCode.FATAL_INVALID_RPC_HEADER, `expected negotiate call id ${NEGOTIATE_CALL_ID}, got ${header.call_id}`)
    }
    const message = NegotiateType.decode(parts.body)
    if (message instanceof RpcError) return this.#fatal(KrpcCode.FATAL_DESERIALIZING_REQUEST, `bad NegotiatePB: ${message.message}`)
    if (this.#state === 'negotiate') return this.#negotiate(message)
    if (this.#state === 'tls') return this.#tlsHandshake(message)
    if (this.#state === 'sasl') return this.#saslInitiate(message)
    return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'negotiation already finished')
  }

  #negotiate (message: NegotiatePB): NegotiationStep {
    if (message.step !== NegotiateStep.NEGOTIATE) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, `expected NEGOTIATE step, got ${message.step}`)
    const options = this.#options
    const clientFeatures = new Set(message.supported_features ?? [])
    const clientTls = clientFeatures.has(RpcFeature.TLS)
    if ((options.requireTls === true || options.requireClientCert === true) && !clientTls) {
      return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'client does not support required TLS encryption')
    }
    const tls = options.tls !== undefined && clientTls
    const offered = message.authn_types ?? []
    // A client that names no authentication type means SASL (Kudu's back-compat rule).
    const offersSasl = offered.length === 0 || offered.some(t => t.sasl != null)
    if (tls && options.verifiesClientCerts === true && offered.some(t => t.certificate != null)) {
      this.#authentication = 'certificate'
    } else if (options.requireClientCert === true) {
      return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'this server requires certificate authentication, and the client offered none')
    } else if (!offersSasl) {
      return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'no mutually supported authentication types')
    }
    const common = featuresOf(tls, options.authOnlyLoopback === true).filter(f => clientFeatures.has(f))
    this.#features = new Set(common)
    const certificate = this.#authentication === 'certificate'
    if (tls) {
      this.#engine = options.tls!(certificate)
      this.#state = 'tls'
    } else {
      this.#state = 'sasl'
    }
    return {
      send: [negotiateFrame({
        supported_features: common,
        step: NegotiateStep.NEGOTIATE,
        ...(certificate ? { authn_types: [{ certificate: {} }] } : { sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }] })
      }, true)]
    }
  }

  // One TLS_HANDSHAKE token from the client: TLS's answer goes back as one, until TLS is done.
  #tlsHandshake (message: NegotiatePB): NegotiationStep | Promise<NegotiationStep> {
    if (message.step !== NegotiateStep.TLS_HANDSHAKE) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, `expected TLS_HANDSHAKE step, got ${message.step}`)
    // An absent token decodes as an empty one: TLS then asks for more (an empty token back).
    const engine = this.#engine!
    return engine.continue(message.tls_handshake ?? new Uint8Array(0)).then(({ token, done }): NegotiationStep => {
      if (!done) return { send: [tlsFrame(token, true)] }
      // TLS 1.3: what the server writes after the client's Finished (session
      // tickets) goes out raw, before the first encrypted bytes (Kudu's
      // StorePendingData); TLS 1.2's last flight is a token.
      const tls13 = engine.protocol === 'TLSv1.3'
      const send = !tls13 && token.length > 0 ? [tlsFrame(token, true)] : undefined
      // Checked after the handshake, as Kudu's AuthenticateByCertificate: a refusal goes out the way the client now reads.
      let refusal: string | null = null
      if (this.#authentication === 'certificate') {
        const user = engine.peerName
        const bytes = Buffer.byteLength(user)
        if (user === '') refusal = 'the client certificate names no user (its subject has no CN)'
        else if (bytes > MAX_USER_BYTES) refusal = `client certificate CN of ${bytes} bytes refused (at most ${MAX_USER_BYTES})`
        this.#user = user
        this.#state = 'context'
      } else {
        this.#state = 'sasl'
      }
      let step: NegotiationStep
      if (this.#features.has(RpcFeature.TLS_AUTHENTICATION_ONLY)) {
        // Both sides on loopback: TLS authenticated, the connection stays plain.
        engine.close()
        this.#engine = null
        step = { send }
      } else {
        this.#tls = engine.protocol
        this.#joined = true
        const pending = tls13 && token.length > 0 ? token : null
        step = { send, upgrade: (raw) => engine.join(raw, pending) }
      }
      if (refusal === null) return step
      const fatal = this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, refusal)
      if (step.upgrade === undefined) return { send: [...(send ?? []), ...fatal.send!], error: fatal.error }
      return { ...step, sendUpgraded: fatal.send, error: fatal.error }
    }, (err: RpcError) => this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, err.message))
  }

  #saslInitiate (message: NegotiatePB): NegotiationStep | Promise<NegotiationStep> {
    if (message.step !== NegotiateStep.SASL_INITIATE) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, `expected SASL_INITIATE step, got ${message.step}`)
    const mechanism = message.sasl_mechanisms?.[0]?.mechanism
    if (mechanism !== 'PLAIN') return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, `unsupported SASL mechanism ${mechanism ?? '(none)'}`)
    // RFC 4616: [authzid] NUL authcid NUL passwd
    const token = Buffer.from(message.token ?? new Uint8Array(0))
    const first = token.indexOf(0)
    const second = first < 0 ? -1 : token.indexOf(0, first + 1)
    if (second < 0) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'malformed SASL PLAIN token')
    if (second - first - 1 > MAX_USER_BYTES) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, `SASL PLAIN user name of ${second - first - 1} bytes refused (at most ${MAX_USER_BYTES})`)
    const user = token.subarray(first + 1, second).toString('utf8')
    const password = token.subarray(second + 1).toString('utf8')
    const accept = (ok: boolean): NegotiationStep => {
      if (!ok) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'SASL PLAIN authentication failed: bad user name or password')
      this.#user = user
      this.#state = 'context'
      return { send: [negotiateFrame({ step: NegotiateStep.SASL_SUCCESS }, true)] }
    }
    if (this.#authenticate === undefined) return accept(true)
    try {
      const verdict = this.#authenticate(user, password)
      if (typeof verdict === 'boolean') return accept(verdict)
      return verdict.then(accept, () => accept(false))
    } catch {
      return accept(false)
    }
  }

  #fatal (code: number, message: string): NegotiationStep {
    this.#state = 'done'
    this.abort()
    return { send: [encodeErrorFrame(NEGOTIATE_CALL_ID, code, message)], error: negotiationError(message, code) }
  }
}
