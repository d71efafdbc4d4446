import { isIP } from 'node:net'
import { createSecureContext, type SecureContext } from 'node:tls'
import type { ClientHandshake, ClientProtocol } from '../../codec/client-protocol.js'
import type { FrameSink } from '../../codec/frame-sink.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import { encodeRequestFrame } from '../../codec/krpc/encode-frame.js'
import { ErrorStatusType, NEGOTIATE_CALL_ID, krpcFraming } from '../../codec/krpc/frames.js'
import { ResponseParts, parseResponseInto } from '../../codec/krpc/parsed-frame.js'
import { copySmall, reserveRequestFrame, wireTimeout } from '../../codec/krpc/write-frame.js'
import { ClientNegotiation, notSpeakingKrpc, refusalOf } from '../../codec/krpc/client-negotiation.js'
import { RpcFeature, isLoopbackHost, type Negotiated } from '../../codec/krpc/negotiation-step.js'
import type { Message, MessageType } from '../../codec/protobuf/schema.js'
import { TlsTunnel } from '../../codec/krpc/tls-tunnel.js'
import type { KrpcCall } from './prepared-method.js'

/** A response with its sidecars. */
export interface CallResult<Res> {
  /** The decoded response message. */
  response: Res
  /** Response sidecars (views of the received frame). */
  sidecars: Buffer[]
}

/** The TLS settings of a KRPC client (`ClientOptions.tls`). */
export interface ClientTlsOptions {
  /** CAs that may sign the server's certificate; default Node's. */
  ca?: string | Buffer | Array<string | Buffer>
  /** This client's certificate, for certificate authentication (with `key`). */
  cert?: string | Buffer
  /** The private key of `cert`. */
  key?: string | Buffer
  /** The name the server's certificate must carry; default the endpoint's host. */
  servername?: string
  /** Check the server's certificate (default true). */
  rejectUnauthorized?: boolean
}

/** How a KRPC client negotiates (`ClientOptions` has them all). */
export interface KrpcNegotiationOptions {
  /** SASL PLAIN user sent in negotiation. */
  user?: string
  /** SASL PLAIN password sent in negotiation. */
  password?: string
  /** TLS in negotiation. */
  tls?: ClientTlsOptions
  /** Fail negotiation with a server that does not offer TLS (needs `tls`). */
  requireTls?: boolean
  /** Encrypt loopback connections too. */
  encryptLoopback?: boolean
}

// A request with sidecars or required feature flags: the frame's head (the
// body copied in) in the sink's room, large sidecars appended as they are.
function encodeSlow (call: KrpcCall, requestType: MessageType<Message>, encodable: Message, id: number, timeoutMs: number, out: FrameSink): void {
  const body = requestType.encodeToScratch(encodable)
  const slices = encodeRequestFrame({
    callId: id,
    remoteMethod: call.method.remoteMethod,
    timeoutMs: wireTimeout(timeoutMs),
    requiredFeatureFlags: call.requiredFeatureFlags,
    sidecars: call.sidecars
  }, body.bytes.subarray(0, body.length))
  for (let i = 0; i < slices.length; i++) out.append(slices[i]!)
}

// Errors before negotiation that say the peer's bytes were no KRPC at all.
const GARBLED: ReadonlySet<string> = new Set([ErrorCode.FRAME_TOO_LARGE, ErrorCode.MALFORMED_FRAME, ErrorCode.NEGOTIATION_FAILED, ErrorCode.CONNECTION_CLOSED])

// Failures after which the call certainly did not run on the server.
const NOT_RUN_REMOTE: ReadonlySet<number> = new Set([KrpcCode.ERROR_SERVER_TOO_BUSY, KrpcCode.ERROR_UNAVAILABLE, KrpcCode.FATAL_SERVER_SHUTTING_DOWN])

/**
 * KRPC as a `ClientProtocol`: request frames written in place (or as
 * slices, with sidecars), responses matched by call id and decoded by the
 * call's method, and connection negotiation (SASL PLAIN, TLS inside
 * negotiation) as the handshake. One per client: what `check` prepared
 * and `answerId` parsed is kept for the `encode` or `decodeAnswer` that
 * follows at once.
 */
export class KrpcClientProtocol implements ClientProtocol<Message, Message | CallResult<Message>> {
  readonly name = 'krpc'
  readonly framing = krpcFraming
  readonly matching = 'id' as const
  readonly maxId = 0x7fffffff
  readonly setupName = 'connection negotiation'
  readonly #options: KrpcNegotiationOptions
  readonly #secureContext: SecureContext | null
  // The request check prepared, for the encode that follows.
  #checked: Message | null = null
  #encodable: Message | null = null
  // The response answerId parsed, for decodeAnswer: one reused object, no header, frame or view objects per call.
  readonly #parts = new ResponseParts()

  constructor (options: KrpcNegotiationOptions) {
    this.#options = options
    if (options.requireTls === true && options.tls === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'requireTls needs tls (the client\'s TLS settings)')
    const tls = options.tls
    if (tls !== undefined && (tls.cert === undefined) !== (tls.key === undefined)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.cert and tls.key go together')
    try {
      // Built once: every connection's handshake shares it.
      this.#secureContext = tls === undefined ? null : createSecureContext({ ca: tls.ca, cert: tls.cert, key: tls.key })
    } catch (err) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad tls option: ${(err as Error).message}`, { cause: err })
    }
  }

  /** Negotiation with `host`: SASL PLAIN, or TLS inside negotiation with `tls`. */
  handshake (endpoint: string, host: string): ClientHandshake<Negotiated> {
    const options = this.#options
    const secureContext = this.#secureContext
    const tls = options.tls
    const negotiation = new ClientNegotiation({
      user: options.user,
      password: options.password,
      requireTls: options.requireTls,
      certificate: tls?.cert !== undefined,
      authOnlyLoopback: options.encryptLoopback !== true && isLoopbackHost(host),
      tls: secureContext === null
        ? undefined
        : () => TlsTunnel.client({
          secureContext,
          host,
          // SNI takes names, not addresses; the certificate check takes either.
          servername: tls?.servername ?? (isIP(host) === 0 ? host : undefined),
          rejectUnauthorized: tls?.rejectUnauthorized !== false
        })
    })
    return {
      start: () => negotiation.start(),
      onFrame: (frame) => negotiation.onFrame(frame),
      abort: () => negotiation.abort(),
      // The peer answered, but not as a KRPC server would (an HTTP server's
      // "HTTP/1.1 400" reads as a frame of 1.2 GB): say so, with its bytes.
      failure: (error, firstBytes) => firstBytes !== null && !negotiation.heardKrpc && error.remote === undefined && GARBLED.has(error.code)
        ? notSpeakingKrpc(endpoint, firstBytes, error)
        : error
    }
  }

  describe (_request: Message, data: unknown): string {
    const method = (data as KrpcCall).method
    return `${method.service}.${method.methodDef.name} RPC`
  }

  logFields (_request: Message, data: unknown): Record<string, unknown> {
    const method = (data as KrpcCall).method
    return { service: method.service, method: method.methodDef.name }
  }

  beforeSend (request: Message, data: unknown, session: unknown): RpcError | undefined {
    if ((data as KrpcCall).requiredFeatureFlags === undefined || (session as Negotiated | undefined)?.features.has(RpcFeature.APPLICATION_FEATURE_FLAGS) === true) return undefined
    return new RpcError(ErrorCode.NOT_SUPPORTED, `${this.describe(request, data)}: server does not support the required RPC features`)
  }

  /** The same check `nyala call` runs (it makes no object for a valid request that encodes as it is), before a connection is chosen. */
  check (request: Message, data: unknown): void {
    this.#checked = request
    this.#encodable = (data as KrpcCall).method.methodDef.requestType.prepareRequest(request)
  }

  encode (request: Message, id: number, out: FrameSink, data: unknown, timeoutMs = 0): void {
    const call = data as KrpcCall
    const requestType = call.method.methodDef.requestType
    // The request was checked just before: what the check prepared is used.
    const encodable = request === this.#checked ? this.#encodable! : requestType.prepareRequest(request)
    this.#checked = null
    this.#encodable = null
    if (call.slow) return encodeSlow(call, requestType, encodable, id, timeoutMs, out)
    const tail = call.method.tailForMs(timeoutMs)
    const bodyBytes = requestType.flatLength(encodable)
    if (bodyBytes < 0) {
      // Encoded into the codec's scratch buffer, copied into the frame at once.
      const scratch = requestType.encodeToScratch(encodable)
      const at = reserveRequestFrame(out, id, tail, scratch.length)
      copySmall(scratch.bytes, scratch.length, out.buffer, at)
      return
    }
    // A flat request is written straight into its frame.
    const at = reserveRequestFrame(out, id, tail, bodyBytes)
    requestType.writeFlat(out.buffer, at)
  }

  answerId (buf: Buffer, start: number, end: number, endpoint?: string): number | RpcError {
    const parts = this.#parts
    const malformed = parseResponseInto(buf, start, end, parts)
    if (malformed !== null) return new RpcError(ErrorCode.MALFORMED_FRAME, `malformed response from ${endpoint ?? 'the server'}: ${malformed.message}`)
    // A server that refused certificate authentication after the handshake
    // (the client was done at its last TLS token) answers the negotiation's
    // call id: its words close the connection.
    if (parts.callId === NEGOTIATE_CALL_ID && parts.isError === true) return refusalOf(buf.subarray(parts.messageStart, parts.messageEnd))
    return parts.callId
  }

  decodeAnswer (request: Message, buf: Buffer, _start: number, _end: number, data: unknown, endpoint?: string): Message | CallResult<Message> | RpcError {
    const parts = this.#parts
    const call = data as KrpcCall
    // The error answer out of line: this runs per answer, inlined into the client's.
    if (parts.isError === true) return this.#errorOf(request, buf, data, endpoint)
    const response = call.method.methodDef.responseType.decodeRange(buf, parts.messageStart, parts.messageEnd)
    if (response instanceof RpcError) return new RpcError(ErrorCode.INVALID_RESPONSE, `${this.describe(request, data)} to ${endpoint}: invalid RPC response, ${response.message}`)
    return call.responseOnly ? response : { response, sidecars: parts.sidecars }
  }

  // An error answer (is_error set): its ErrorStatusPB as the call's error.
  #errorOf (request: Message, buf: Buffer, data: unknown, endpoint: string | undefined): RpcError {
    const parts = this.#parts
    const status = ErrorStatusType.decodeRange(buf, parts.messageStart, parts.messageEnd)
    if (status instanceof RpcError) {
      return new RpcError(ErrorCode.INVALID_RESPONSE, `${this.describe(request, data)} to ${endpoint}: was an RPC error but could not parse error response`)
    }
    const code = status.code === undefined || status.code === 0 ? KrpcCode.FATAL_UNKNOWN : status.code
    return krpcError(code, status.message, status.unsupported_feature_flags)
  }

  retryable (error: RpcError): boolean {
    const code = error.remote?.code
    return code !== undefined && NOT_RUN_REMOTE.has(code)
  }
}
