/**
 * The client's side of KRPC negotiation: a pure state machine that takes
 * the server's frames and returns what to send (the exchange is drawn in
 * negotiation-step.ts), the reading of a server's refusal, and the bytes a
 * raw client writes to set up a connection. The connection that drives the
 * state machine owns the socket and the deadline.
 */
import { ErrorCode, RpcError } from '../errors.js'
import type { SecureChannel, TlsEngine } from '../protocol.js'
import { KrpcCode, krpcCodeName } from './codes.js'
import { encodeRequestFrame } from './encode-frame.js'
import { CONNECTION_CONTEXT_CALL_ID, ErrorStatusType, KRPC_PREAMBLE, NEGOTIATE_CALL_ID, ResponseHeaderType } from './frames.js'
import { splitFrame } from './parsed-frame.js'
import {
  ConnectionContextType, NegotiateStep, NegotiateType, RpcFeature, featuresOf, negotiateFrame, negotiationError, tlsFrame,
  type Negotiated, type NegotiatePB, type NegotiationStep
} from './negotiation-step.js'
import { ServerNegotiation } from './server-negotiation.js'

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

/** How a client negotiates: its SASL PLAIN credentials, TLS, and what it requires of the server. */
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
