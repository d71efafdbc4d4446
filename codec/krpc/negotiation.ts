import { ErrorCode, RpcError } from '../errors.js'
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
 *                            ◀──   NEGOTIATE(1): common features, sasl, PLAIN
 *   SASL_INITIATE(2) PLAIN   ──▶
 *                            ◀──   SASL_SUCCESS(0)  (or FATAL_UNAUTHORIZED and close)
 *   ConnectionContext (-3)   ──▶   (no reply)
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
  sasl_mechanisms?: Array<{ mechanism: string }>
  authn_types?: Array<{ sasl?: Record<string, never>, token?: object, certificate?: object, jwt?: object }>
}

interface ConnectionContextPB {
  DEPRECATED_user_info?: { effective_user?: string, real_user: string }
  encoded_nonce?: Uint8Array
}

const NegotiateType = headerSchema.type<NegotiatePB>('kudu.rpc.NegotiatePB')
const ConnectionContextType = headerSchema.type<ConnectionContextPB>('kudu.rpc.ConnectionContextPB')

/** Features this build implements; TLS is not among them yet. */
const KNOWN_FEATURES: readonly number[] = [RpcFeature.APPLICATION_FEATURE_FLAGS]

/** What a finished negotiation agreed on. */
export interface Negotiated {
  /** Features both sides support. */
  features: ReadonlySet<number>
  /** The SASL PLAIN user (authcid). */
  user: string
}

/**
 * One step of a negotiation: frames to send (each a list of slices), then
 * either nothing more (wait for the next frame), `done`, or `error`. With an
 * error the connection is closed after `send` is written.
 */
export interface NegotiationStep {
  send?: Buffer[][]
  done?: Negotiated
  error?: RpcError
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

/** Longest SASL PLAIN user name (authcid) a server accepts, in bytes; a longer one is refused FATAL_UNAUTHORIZED. */
export const MAX_USER_BYTES = 256

/** Checks a user name and password from SASL PLAIN; resolve false to refuse. */
export type Authenticator = (user: string, password: string) => boolean | Promise<boolean>

export interface ServerNegotiationOptions {
  /** Verifies SASL PLAIN credentials; by default any user is accepted (as Kudu's PlainAuthCb). */
  authenticate?: Authenticator | undefined
}

/** The server's side of negotiation, after the preamble has passed `checkPreamble`. */
export class ServerNegotiation {
  readonly #authenticate: Authenticator | undefined
  #state: 'negotiate' | 'sasl' | 'context' | 'done' = 'negotiate'
  #features: ReadonlySet<number> = new Set()
  #user = ''

  constructor (options: ServerNegotiationOptions = {}) {
    this.#authenticate = options.authenticate
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
      return { done: { features: this.#features, user: this.#user } }
    }
    if (header.call_id !== NEGOTIATE_CALL_ID) {
      return this.#fatal(KrpcCode.FATAL_INVALID_RPC_HEADER, `expected negotiate call id ${NEGOTIATE_CALL_ID}, got ${header.call_id}`)
    }
    const message = NegotiateType.decode(parts.body)
    if (message instanceof RpcError) return this.#fatal(KrpcCode.FATAL_DESERIALIZING_REQUEST, `bad NegotiatePB: ${message.message}`)
    if (this.#state === 'negotiate') return this.#negotiate(message)
    if (this.#state === 'sasl') return this.#saslInitiate(message)
    return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'negotiation already finished')
  }

  #negotiate (message: NegotiatePB): NegotiationStep {
    if (message.step !== NegotiateStep.NEGOTIATE) return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, `expected NEGOTIATE step, got ${message.step}`)
    const offered = message.authn_types ?? []
    // A client that names no authentication type means SASL (Kudu's back-compat rule).
    if (offered.length > 0 && !offered.some(t => t.sasl != null)) {
      return this.#fatal(KrpcCode.FATAL_UNAUTHORIZED, 'no common authentication type: this server offers SASL only')
    }
    const clientFeatures = new Set(message.supported_features ?? [])
    const common = KNOWN_FEATURES.filter(f => clientFeatures.has(f))
    this.#features = new Set(common)
    this.#state = 'sasl'
    return {
      send: [negotiateFrame({
        supported_features: common,
        step: NegotiateStep.NEGOTIATE,
        sasl_mechanisms: [{ mechanism: 'PLAIN' }],
        authn_types: [{ sasl: {} }]
      }, true)]
    }
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
    return { send: [encodeErrorFrame(NEGOTIATE_CALL_ID, code, message)], error: negotiationError(message, code) }
  }
}

export interface ClientNegotiationOptions {
  /** SASL PLAIN user; default `nyala`. */
  user?: string | undefined
  /** SASL PLAIN password; default empty (what Kudu's Java client sends). */
  password?: string | undefined
}

/** The client's side of negotiation. `start()` gives the first bytes to send. */
export class ClientNegotiation {
  readonly #user: string
  readonly #password: string
  #state: 'negotiate' | 'sasl' | 'done' = 'negotiate'
  #features: ReadonlySet<number> = new Set()
  #heardKrpc = false

  constructor (options: ClientNegotiationOptions = {}) {
    this.#user = options.user ?? 'nyala'
    this.#password = options.password ?? ''
  }

  /** The preamble and the NEGOTIATE request. */
  start (): Buffer[][] {
    return [[KRPC_PREAMBLE], negotiateFrame({
      supported_features: [...KNOWN_FEATURES],
      step: NegotiateStep.NEGOTIATE,
      authn_types: [{ sasl: {} }]
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

  /** Handles one server frame. */
  onFrame (frame: Buffer): NegotiationStep {
    const parts = splitFrame(frame)
    if (parts instanceof RpcError) return { error: parts }
    const header = ResponseHeaderType.decode(parts.header)
    if (header instanceof RpcError) return { error: negotiationError(`bad response header during negotiation: ${header.message}`) }
    if (header.call_id !== NEGOTIATE_CALL_ID) return { error: negotiationError(`unexpected call id ${header.call_id} during negotiation`) }
    this.#heardKrpc = true
    if (header.is_error === true) {
      const status = ErrorStatusType.decode(parts.body)
      if (status instanceof RpcError) return { error: negotiationError('negotiation failed, and the error could not be parsed') }
      const code = status.code === undefined || status.code === 0 ? KrpcCode.FATAL_UNKNOWN : status.code
      return { error: negotiationError(`server refused negotiation: ${krpcCodeName(code)}: ${status.message}`, code) }
    }
    const message = NegotiateType.decode(parts.body)
    if (message instanceof RpcError) return { error: negotiationError(`bad NegotiatePB from server: ${message.message}`) }
    if (this.#state === 'negotiate') {
      if (message.step !== NegotiateStep.NEGOTIATE) return { error: negotiationError(`expected NEGOTIATE, got step ${message.step}`) }
      const authn = message.authn_types ?? []
      if (authn.length > 0 && authn[0]?.sasl == null) return { error: negotiationError('server chose an authentication type other than SASL') }
      if (!(message.sasl_mechanisms ?? []).some(m => m.mechanism === 'PLAIN')) {
        return { error: negotiationError('server does not offer SASL PLAIN') }
      }
      const serverFeatures = new Set(message.supported_features ?? [])
      this.#features = new Set(KNOWN_FEATURES.filter(f => serverFeatures.has(f)))
      this.#state = 'sasl'
      const token = Buffer.concat([Buffer.from([0]), Buffer.from(this.#user, 'utf8'), Buffer.from([0]), Buffer.from(this.#password, 'utf8')])
      return {
        send: [negotiateFrame({ step: NegotiateStep.SASL_INITIATE, token, sasl_mechanisms: [{ mechanism: 'PLAIN' }] }, false)]
      }
    }
    if (this.#state === 'sasl') {
      if (message.step !== NegotiateStep.SASL_SUCCESS) return { error: negotiationError(`expected SASL_SUCCESS, got step ${message.step}`) }
      this.#state = 'done'
      const context = ConnectionContextType.encode({ DEPRECATED_user_info: { real_user: this.#user } })
      return {
        send: [encodeRequestFrame({ callId: CONNECTION_CONTEXT_CALL_ID }, context)],
        done: { features: this.#features, user: this.#user }
      }
    }
    return { error: negotiationError('unexpected frame after negotiation finished') }
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
        for (const s of client.onFrame(join(r)).send ?? []) {
          out.push(join(s))
          next.push(s)
        }
      }
    }
    pending = next
  }
  return Buffer.concat(out)
}
