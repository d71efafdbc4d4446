import { ErrorCode, RpcError } from '../errors.js'
import type { HandshakeStep, SecureChannel, TlsEngine } from '../protocol.js'
import { KrpcCode, krpcCodeName, krpcStatus } from './codes.js'
import {
  CONNECTION_CONTEXT_CALL_ID, ErrorStatusType, KRPC_PREAMBLE, KRPC_VERSION, NEGOTIATE_CALL_ID, RequestHeaderType,
  ResponseHeaderType, encodeErrorFrame, encodeRequestFrame, encodeResponseFrame, headerSchema, splitFrame
} from './frames.js'

/**
 * KRPC connection negotiation as two pure state machines:
 * they take frames and return what to send and whether negotiation is done.
 * The connection that drives them owns the socket and the deadline.
 *
 *   client                         server
 *   preamble, NEGOTIATE(1)   ──▶
 *                            ◀──   NEGOTIATE(1): common features, the authentication chosen (SASL: PLAIN)
 *   TLS_HANDSHAKE(5)         ◀─▶   (both offered TLS) the TLS handshake's records, as tokens,
 *                                  until both sides are done; then TLS on the socket, unless both
 *                                  offered TLS_AUTHENTICATION_ONLY (loopback): then plain again
 *   SASL_INITIATE(2) PLAIN   ──▶   (SASL authentication; none with CERTIFICATE: the client's
 *                            ◀──   SASL_SUCCESS(0)   certificate authenticated it in the handshake)
 *   ConnectionContext (-3)   ──▶   (no reply)
 *
 * Any refusal is an error frame (FATAL_UNAUTHORIZED, ...) and the close.
 * With TLS 1.3 the server's last handshake bytes (session tickets) are not
 * sent as a token: they go out raw just before its first encrypted bytes.
 */

/** How many of a peer's first bytes `notSpeakingKrpc` quotes. */
export const QUOTED_FIRST_BYTES = 24

/**
 * The error for a peer whose first bytes (kept by the connection) are no
 * KRPC negotiation answer, e.g. an HTTP server's `HTTP/1.1 400 Bad Request`,
 * whose first four bytes read as a frame length of 1213486164. `cause` is
 * what the frame decoder or the negotiation said about them.
 */
export function notSpeakingKrpc (peer: string, firstBytes: Uint8Array, cause: RpcError): RpcError {
  const quoted = firstBytes.subarray(0, QUOTED_FIRST_BYTES)
  let text = ''
  for (const byte of quoted) {
    text += byte === 0x22 ? '\\"' : byte === 0x5c ? '\\\\' : byte >= 0x20 && byte < 0x7f ? String.fromCharCode(byte) : `\\x${byte.toString(16).padStart(2, '0')}`
  }
  const more = firstBytes.length > QUOTED_FIRST_BYTES ? '...' : ''
  return new RpcError(ErrorCode.NEGOTIATION_FAILED, `${peer} is not speaking KRPC (its first bytes were "${text}${more}")`, { cause })
}

/** `RpcFeatureFlag` values. */
export const RpcFeature = {
  APPLICATION_FEATURE_FLAGS: 1,
  TLS: 2,
  TLS_AUTHENTICATION_ONLY: 3
} as const

/** `NegotiatePB.NegotiateStep` values. */
export const NegotiateStep = {
  SASL_SUCCESS: 0,
  NEGOTIATE: 1,
  SASL_INITIATE: 2,
  SASL_CHALLENGE: 3,
  SASL_RESPONSE: 4,
  TLS_HANDSHAKE: 5,
  TOKEN_EXCHANGE: 6,
  JWT_EXCHANGE: 7
} as const

interface NegotiatePB {
  supported_features?: number[]
  step: number
  token?: Uint8Array
  tls_handshake?: Uint8Array
  sasl_mechanisms?: Array<{ mechanism: string }>
  authn_types?: Array<{ sasl?: Record<string, never>, token?: object, certificate?: object, jwt?: object }>
}

interface ConnectionContextPB {
  DEPRECATED_user_info?: { effective_user?: string, real_user: string }
  encoded_nonce?: Uint8Array
}

const NegotiateType = headerSchema.type<NegotiatePB>('kudu.rpc.NegotiatePB')
const ConnectionContextType = headerSchema.type<ConnectionContextPB>('kudu.rpc.ConnectionContextPB')

/** What a finished negotiation agreed on. */
export interface Negotiated {
  /** Features both sides support. */
  features: ReadonlySet<number>
  /** The SASL PLAIN user (authcid), or the client certificate's CN under certificate authentication. */
  user: string
  /** How the client authenticated. */
  authentication: 'sasl' | 'certificate'
  /** The TLS version when the connection is encrypted ('TLSv1.3'); null in plain text (also after TLS that only authenticated). */
  tls: string | null
}

/**
 * One step of a negotiation: frames to send (each a list of slices), then
 * either nothing more (wait for the next frame), `done`, or `error`. With an
 * error the connection is closed after `send` is written. With `upgrade`
 * the connection switches to TLS after `send` (see HandshakeStep).
 */
export type NegotiationStep = HandshakeStep<Negotiated>

// The features both sides know, in the order Kudu lists them.
function featuresOf (tls: boolean, authOnly: boolean): number[] {
  const features: number[] = [RpcFeature.APPLICATION_FEATURE_FLAGS]
  if (tls) features.push(RpcFeature.TLS)
  if (tls && authOnly) features.push(RpcFeature.TLS_AUTHENTICATION_ONLY)
  return features
}

/** The server's error frame during negotiation (its body), as the client reports it. */
export function refusalOf (body: Buffer): RpcError {
  const status = ErrorStatusType.decode(body)
  if (status instanceof RpcError) return negotiationError('negotiation failed, and the error could not be parsed')
  const code = status.code === undefined || status.code === 0 ? KrpcCode.FATAL_UNKNOWN : status.code
  return negotiationError(`server refused negotiation: ${krpcCodeName(code)}: ${status.message}`, code)
}

/**
 * The client's channel after its last TLS token. With TLS 1.3 the client is
 * done before the server has checked its last flight (the client's
 * certificate): a server that refuses it answers with a plain error frame
 * where TLS records were expected. A TLS record's first byte is its type
 * (20 to 24), a frame's the top of its length (0): the refusal is read as
 * such and ends the stream with the server's own words.
 */
function watchForRefusal (channel: SecureChannel): SecureChannel {
  let first: Buffer | null = Buffer.alloc(0)
  return {
    stream: channel.stream,
    input: (chunk) => {
      if (first === null) {
        channel.input(chunk)
        return
      }
      if (first.length === 0 && chunk.length > 0 && chunk[0] !== 0) {
        first = null
        channel.input(chunk)
        return
      }
      first = Buffer.concat([first, chunk])
      if (first.length < 4) return
      const frameBytes = 4 + first.readUInt32BE(0)
      if (frameBytes > MAX_REFUSAL_BYTES) {
        first = null
        channel.stream.destroy(negotiationError('the server answered TLS with bytes that are neither TLS nor a KRPC frame'))
        return
      }
      if (first.length < frameBytes) return
      const parts = splitFrame(first.subarray(0, frameBytes))
      first = null
      const header = parts instanceof RpcError ? parts : ResponseHeaderType.decode(parts.header)
      const refusal = parts instanceof RpcError || header instanceof RpcError || header.is_error !== true
        ? negotiationError('the server answered TLS with a KRPC frame that is no refusal')
        : refusalOf(parts.body)
      channel.stream.destroy(refusal)
    }
  }
}

// Largest error frame read in place of TLS records.
const MAX_REFUSAL_BYTES = 64 * 1024

function tlsFrame (token: Buffer, fromServer: boolean): Buffer[] {
  return negotiateFrame({ step: NegotiateStep.TLS_HANDSHAKE, tls_handshake: token }, fromServer)
}

function negotiationError (message: string, krpcCode?: number): RpcError {
  return new RpcError(ErrorCode.NEGOTIATION_FAILED, message, krpcCode === undefined ? undefined : { remote: krpcStatus(krpcCode) })
}

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

function negotiateFrame (body: NegotiatePB, fromServer: boolean): Buffer[] {
  const bytes = NegotiateType.encode(body)
  return fromServer ? encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, bytes) : encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, bytes)
}

/** A host that is this machine: Kudu's loopback rule (TLS there may only authenticate). */
export function isLoopbackHost (host: string): boolean {
  const h = host.toLowerCase()
  return h === 'localhost' || h === '::1' || h === '[::1]' || /^127\./.test(h) || /^::ffff:127\./.test(h)
}

/** Longest SASL PLAIN user name (authcid) a server accepts, in bytes; a longer one is refused FATAL_UNAUTHORIZED. */
export const MAX_USER_BYTES = 256

/** Checks a user name and password from SASL PLAIN; resolve false to refuse. */
export type Authenticator = (user: string, password: string) => boolean | Promise<boolean>

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

export interface ClientNegotiationOptions {
  /** SASL PLAIN user; default `nyala`. */
  user?: string | undefined
  /** SASL PLAIN password; default empty (what Kudu's Java client sends). */
  password?: string | undefined
  /** Makes the TLS engine when the server offers TLS; without it TLS is not offered. */
  tls?: (() => TlsEngine) | undefined
  /** Fail when the server does not offer TLS. */
  requireTls?: boolean | undefined
  /** The client has a certificate (and `tls`): offer CERTIFICATE authentication. */
  certificate?: boolean | undefined
  /** The server is on loopback and loopback is not encrypted: offer TLS_AUTHENTICATION_ONLY. */
  authOnlyLoopback?: boolean | undefined
}

/** The client's side of negotiation, step for step as Kudu's `ClientNegotiation`. `start()` gives the first bytes to send. */
export class ClientNegotiation {
  readonly #options: ClientNegotiationOptions
  readonly #user: string
  readonly #password: string
  readonly #offered: readonly number[]
  #state: 'negotiate' | 'tls' | 'sasl' | 'done' = 'negotiate'
  #features: ReadonlySet<number> = new Set()
  #authentication: 'sasl' | 'certificate' = 'sasl'
  #engine: TlsEngine | null = null
  #joined = false
  #tls: string | null = null
  #heardKrpc = false

  constructor (options: ClientNegotiationOptions = {}) {
    this.#options = options
    this.#user = options.user ?? 'nyala'
    this.#password = options.password ?? ''
    this.#offered = featuresOf(options.tls !== undefined, options.authOnlyLoopback === true)
  }

  /** The preamble and the NEGOTIATE request. */
  start (): Buffer[][] {
    const authn: NonNullable<NegotiatePB['authn_types']> = [{ sasl: {} }]
    if (this.#options.tls !== undefined && this.#options.certificate === true) authn.push({ certificate: {} })
    return [[KRPC_PREAMBLE], negotiateFrame({
      supported_features: [...this.#offered],
      step: NegotiateStep.NEGOTIATE,
      authn_types: authn
    }, false)]
  }

  /**
   * True once the server sent a frame with a KRPC response header for the
   * negotiation's call id: until then a peer whose bytes fail to parse may
   * be no KRPC server at all.
   */
  get heardKrpc (): boolean {
    return this.#heardKrpc
  }

  /** The connection closed mid-negotiation: drops the TLS engine. */
  abort (): void {
    if (!this.#joined) this.#engine?.close()
    this.#engine = null
  }

  /** Handles one server frame. */
  onFrame (frame: Buffer): NegotiationStep | Promise<NegotiationStep> {
    const parts = splitFrame(frame)
    if (parts instanceof RpcError) return this.#error(parts)
    const header = ResponseHeaderType.decode(parts.header)
    if (header instanceof RpcError) return this.#error(negotiationError(`bad response header during negotiation: ${header.message}`))
    if (header.call_id !== NEGOTIATE_CALL_ID) return this.#error(negotiationError(`unexpected call id ${header.call_id} during negotiation`))
    this.#heardKrpc = true
    if (header.is_error === true) return this.#error(refusalOf(parts.body))
    const message = NegotiateType.decode(parts.body)
    if (message instanceof RpcError) return this.#error(negotiationError(`bad NegotiatePB from server: ${message.message}`))
    if (this.#state === 'negotiate') return this.#negotiate(message)
    if (this.#state === 'tls') return this.#tlsHandshake(message)
    if (this.#state === 'sasl') {
      if (message.step !== NegotiateStep.SASL_SUCCESS) return this.#error(negotiationError(`expected SASL_SUCCESS, got step ${message.step}`))
      this.#state = 'done'
      return { send: [this.#context()], done: this.#negotiated() }
    }
    return this.#error(negotiationError('unexpected frame after negotiation finished'))
  }

  #negotiate (message: NegotiatePB): NegotiationStep | Promise<NegotiationStep> {
    if (message.step !== NegotiateStep.NEGOTIATE) return this.#error(negotiationError(`expected NEGOTIATE, got step ${message.step}`))
    const serverFeatures = new Set(message.supported_features ?? [])
    if (this.#options.requireTls === true && !serverFeatures.has(RpcFeature.TLS)) {
      return this.#error(negotiationError('server does not support required TLS encryption'))
    }
    this.#features = new Set(this.#offered.filter(f => serverFeatures.has(f)))
    const tls = this.#features.has(RpcFeature.TLS)
    // No authentication type named means SASL (Kudu's back-compat rule).
    const chosen = message.authn_types?.[0]
    if (chosen !== undefined && chosen.certificate != null) {
      if (this.#options.certificate !== true || !tls) return this.#error(negotiationError('server chose certificate authentication, but client has no certificate'))
      this.#authentication = 'certificate'
    } else if (chosen !== undefined && chosen.sasl == null) {
      return this.#error(negotiationError('server chose an authentication type other than SASL or certificate'))
    } else if (!(message.sasl_mechanisms ?? []).some(m => m.mechanism === 'PLAIN')) {
      return this.#error(negotiationError('server does not offer SASL PLAIN'))
    }
    if (!tls) {
      this.#state = 'sasl'
      return { send: [this.#saslInitiate()] }
    }
    // To begin, TLS takes an empty token: its answer is the ClientHello.
    const engine = this.#engine = this.#options.tls!()
    this.#state = 'tls'
    return engine.continue(new Uint8Array(0)).then(
      ({ token }): NegotiationStep => ({ send: [tlsFrame(token, false)] }),
      (err: RpcError) => this.#error(err))
  }

  // One TLS_HANDSHAKE token from the server. Once TLS is done the client
  // goes on at once: SASL_INITIATE (or, with certificate authentication,
  // the connection context) is the first thing it encrypts.
  #tlsHandshake (message: NegotiatePB): NegotiationStep | Promise<NegotiationStep> {
    if (message.step !== NegotiateStep.TLS_HANDSHAKE) return this.#error(negotiationError(`expected TLS_HANDSHAKE step, got ${message.step}`))
    const engine = this.#engine!
    return engine.continue(message.tls_handshake ?? new Uint8Array(0)).then(({ token, done }): NegotiationStep => {
      // As Kudu's NeedsExtraStep: an unfinished handshake always answers; a finished one answers when TLS wrote something (TLS 1.3's Finished).
      const send = !done || token.length > 0 ? [tlsFrame(token, false)] : []
      if (!done) return { send }
      const certificate = this.#authentication === 'certificate'
      this.#state = certificate ? 'done' : 'sasl'
      const next = certificate ? this.#context() : this.#saslInitiate()
      if (this.#features.has(RpcFeature.TLS_AUTHENTICATION_ONLY)) {
        engine.close()
        this.#engine = null
        send.push(next)
        return certificate ? { send, done: this.#negotiated() } : { send }
      }
      this.#joined = true
      this.#tls = engine.protocol
      const step: NegotiationStep = { send, upgrade: (raw) => watchForRefusal(engine.join(raw, null)), sendUpgraded: [next] }
      if (certificate) step.done = this.#negotiated()
      return step
    }, (err: RpcError) => this.#error(err))
  }

  #saslInitiate (): Buffer[] {
    const token = Buffer.concat([Buffer.from([0]), Buffer.from(this.#user, 'utf8'), Buffer.from([0]), Buffer.from(this.#password, 'utf8')])
    return negotiateFrame({ step: NegotiateStep.SASL_INITIATE, token, sasl_mechanisms: [{ mechanism: 'PLAIN' }] }, false)
  }

  #context (): Buffer[] {
    return encodeRequestFrame({ callId: CONNECTION_CONTEXT_CALL_ID }, ConnectionContextType.encode({ DEPRECATED_user_info: { real_user: this.#user } }))
  }

  #negotiated (): Negotiated {
    return { features: this.#features, user: this.#user, authentication: this.#authentication, tls: this.#tls }
  }

  #error (error: RpcError): NegotiationStep {
    this.#state = 'done'
    this.abort()
    return { error }
  }
}

/**
 * Everything a client writes to set up a connection (preamble, NEGOTIATE,
 * SASL_INITIATE, ConnectionContext) as one buffer, produced by running the
 * client and server state machines against each other. A KRPC server reads
 * these in order, so a raw peer (a test, a fuzzer, a hostile-peer script)
 * may write them all before any answer arrives.
 */
export function clientHandshakeBytes (options: ClientNegotiationOptions = {}): Buffer {
  const client = new ClientNegotiation(options)
  const server = new ServerNegotiation()
  const join = (frame: Buffer[]): Buffer => frame.length === 1 ? frame[0]! : Buffer.concat(frame)
  const out: Buffer[] = []
  let pending: Buffer[][] = client.start()
  out.push(...pending.map(join))
  // The first list holds the preamble, which the server does not frame.
  pending = pending.slice(1)
  for (let guard = 0; guard < 10 && pending.length > 0; guard++) {
    const next: Buffer[][] = []
    for (const frame of pending) {
      const reply = server.onFrame(join(frame)) as NegotiationStep
      for (const r of reply.send ?? []) {
        for (const s of (client.onFrame(join(r)) as NegotiationStep).send ?? []) {
          out.push(join(s))
          next.push(s)
        }
      }
    }
    pending = next
  }
  return Buffer.concat(out)
}
