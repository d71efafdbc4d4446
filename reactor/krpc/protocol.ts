import { createSecureContext, type SecureContext, type TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameSink } from '../../codec/frame-sink.js'
import { KrpcCode, krpcCodeName, krpcCodeOf } from '../../codec/krpc/codes.js'
import { encodeErrorFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { RequestParts, parseRequestInto } from '../../codec/krpc/parsed-frame.js'
import { responseFrameBytes, writeResponseFrame, writeResponseFrameHead } from '../../codec/krpc/write-frame.js'
import { RpcFeature, isLoopbackHost, type Negotiated } from '../../codec/krpc/negotiation-step.js'
import { PREAMBLE_BYTES, ServerNegotiation, checkPreamble, type Authenticator } from '../../codec/krpc/server-negotiation.js'
import { InvalidRequest, type AnsweredCall, type AnswerSlices, type CallHead, type CallInfo, type Handshake, type RefusalReason, type RouteInfo, type ServerProtocol } from '../../codec/protocol.js'
import type { Message, MethodDef } from '../../codec/protobuf/schema.js'
import { TlsTunnel } from '../../codec/krpc/tls-tunnel.js'
import { KrpcCallData } from './call.js'

/** What the KRPC server registers with each route (`RouteInfo.spec`). */
export interface KrpcRouteSpec {
  readonly methodDef: MethodDef<Message, Message>
  /** Application feature flags the service supports. */
  readonly featureFlags: ReadonlySet<number>
  /** The service runs in worker threads: the request is decoded there, from the frame's bytes. */
  readonly threaded: boolean
}

/** A thread-mode request: the whole frame and the request message in it, decoded by the thread; null once posted there. */
export class ThreadRequest {
  frame: Buffer | null
  message: Buffer | null
  constructor (frame: Buffer, message: Buffer) {
    this.frame = frame
    this.message = message
  }
}

/** A response already encoded (by a worker thread): its message bytes and sidecars. */
export class EncodedBody {
  readonly body: Uint8Array
  readonly sidecars: Uint8Array[] | undefined
  constructor (body: Uint8Array, sidecars: Uint8Array[] | undefined) {
    this.body = body
    this.sidecars = sidecars
  }
}

/** Features the server offers in negotiation. */
export const SERVER_FEATURES = [RpcFeature.APPLICATION_FEATURE_FLAGS]

// A refusal that sends nothing.
const NO_ANSWER: Uint8Array[] = []

const REFUSAL_CODES: Record<RefusalReason, number> = {
  busy: KrpcCode.ERROR_SERVER_TOO_BUSY,
  // As Kudu: a call that waited in the queue past its deadline is answered TOO_BUSY.
  expired: KrpcCode.ERROR_SERVER_TOO_BUSY,
  // Only for a call without a client timeout (never on KRPC's wire: see refusal).
  'timed-out': KrpcCode.ERROR_SERVER_TOO_BUSY,
  shutdown: KrpcCode.FATAL_SERVER_SHUTTING_DOWN,
  unavailable: KrpcCode.ERROR_UNAVAILABLE,
  'no-service': KrpcCode.ERROR_NO_SUCH_SERVICE,
  'no-method': KrpcCode.ERROR_NO_SUCH_METHOD,
  invalid: KrpcCode.ERROR_INVALID_REQUEST,
  failed: KrpcCode.ERROR_APPLICATION,
  abandoned: KrpcCode.ERROR_APPLICATION
}

export interface KrpcProtocolOptions {
  /** SASL PLAIN verification; by default any user is accepted. */
  authenticate?: Authenticator | undefined
  /** TLS inside negotiation (cert, key; ca for client certificates); see `KrpcServerOptions.tls`. */
  tls?: TlsOptions | undefined
  requireTls?: boolean | undefined
  requireClientCert?: boolean | undefined
  encryptLoopback?: boolean | undefined
}

/**
 * KRPC, Kudu's RPC protocol, as a `ServerProtocol`: 4-byte length-prefixed
 * frames, SASL negotiation as the set-up, answers matched by call id, the
 * deadline from the header's timeout_millis, and the response encoded in
 * place from the message (flat messages straight into the frame).
 */
export class KrpcServerProtocol implements ServerProtocol<unknown, Message | EncodedBody, unknown, KrpcCallData> {
  readonly name = 'krpc'
  readonly framing = krpcFraming
  readonly ordering = 'id'
  /** With `tls`, negotiation may switch to TLS: connections stay on node:net. */
  readonly upgradesInSetUp: boolean
  readonly #authenticate: Authenticator | undefined
  readonly #options: KrpcProtocolOptions
  readonly #secureContext: SecureContext | null
  // One reused header object: no header, frame or view objects per call.
  readonly #parts = new RequestParts()

  constructor (options: KrpcProtocolOptions = {}) {
    this.#authenticate = options.authenticate
    this.#options = options
    const tls = options.tls
    this.upgradesInSetUp = tls !== undefined
    if (tls === undefined && (options.requireTls === true || options.requireClientCert === true)) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${options.requireTls === true ? 'requireTls' : 'requireClientCert'} needs tls (the server's certificate and key)`)
    }
    if (tls !== undefined && (tls.cert === undefined || tls.key === undefined) && tls.pfx === undefined) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls needs cert and key (or pfx)')
    }
    if (options.requireClientCert === true && tls?.ca === undefined) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'requireClientCert needs tls.ca, the CA that signs the client certificates')
    }
    try {
      // Built once: every connection's handshake shares it.
      this.#secureContext = tls === undefined ? null : createSecureContext(tls)
    } catch (err) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad tls option: ${(err as Error).message}`, { cause: err })
    }
  }

  handshake = (remoteAddress: string): Handshake<Negotiated> => {
    const options = this.#options
    const secureContext = this.#secureContext
    const negotiation = new ServerNegotiation({
      authenticate: this.#authenticate,
      tls: secureContext === null ? undefined : (requestCert) => TlsTunnel.server(secureContext, requestCert),
      verifiesClientCerts: options.tls?.ca !== undefined,
      requireTls: options.requireTls,
      requireClientCert: options.requireClientCert,
      // remoteAddress is host:port.
      authOnlyLoopback: options.encryptLoopback !== true && isLoopbackHost(remoteAddress.slice(0, remoteAddress.lastIndexOf(':')))
    })
    return { preambleBytes: PREAMBLE_BYTES, checkPreamble, onFrame: (frame) => negotiation.onFrame(frame), abort: () => negotiation.abort() }
  }

  decodeHead (buf: Buffer, start: number, end: number, head: CallHead<KrpcCallData>): RpcError | null {
    const parts = this.#parts
    const malformed = parseRequestInto(buf, start, end, parts)
    if (malformed !== null) return malformed
    const callId = parts.callId
    if (callId < 0) return new RpcError(ErrorCode.MALFORMED_FRAME, `unexpected call id ${callId} after negotiation`)
    const remote = parts.remoteMethod
    if (remote === undefined) return new RpcError(ErrorCode.MALFORMED_FRAME, 'request header has no remote_method')
    head.callId = callId
    head.service = remote.service_name
    head.method = remote.method_name
    head.timeoutMs = parts.timeoutMillis
    // The codec hands out one object per method it has cached; others are new each time.
    if (parts.remoteMethodCached) head.routeKey = remote
    head.data = new KrpcCallData(parts.sidecars, parts.timeoutMillis)
    head.bodyStart = parts.messageStart
    head.bodyEnd = parts.messageEnd
    return null
  }

  decodeRequest (route: RouteInfo, buf: Buffer, head: CallHead<KrpcCallData>): unknown {
    const spec = route.spec as KrpcRouteSpec
    const required = this.#parts.requiredFeatureFlags
    if (required !== undefined && required.length > 0) {
      const unsupported = required.filter(flag => !spec.featureFlags.has(flag))
      if (unsupported.length > 0) return new InvalidRequest('unsupported feature flags', unsupported)
    }
    // Thread mode: the thread decodes the request from the frame's bytes.
    if (spec.threaded) return new ThreadRequest(buf.subarray(head.start, head.end), buf.subarray(head.bodyStart, head.bodyEnd))
    const request = spec.methodDef.requestType.decodeRange(buf, head.bodyStart, head.bodyEnd)
    if (request instanceof RpcError) return new InvalidRequest(`invalid parameter for call ${head.service}.${head.method}: ${request.message}`)
    return request
  }

  encode (call: AnsweredCall<KrpcCallData>, response: Message | EncodedBody, out: FrameSink): void {
    const callId = call.callId
    if (response instanceof EncodedBody) {
      const body = response.body
      if (response.sidecars !== undefined && response.sidecars.length > 0) return appendAll(out, encodeResponseFrame(callId, false, body, response.sidecars))
      const at = out.reserve(responseFrameBytes(callId, body.length))
      writeResponseFrame(out.buffer, at, callId, body)
      return
    }
    const type = (call.route.spec as KrpcRouteSpec).methodDef.responseType
    const sidecars = call.data.responseSidecars
    if (sidecars !== undefined && sidecars.length > 0) return appendAll(out, encodeResponseFrame(callId, false, type.encode(response), sidecars))
    const bodyBytes = type.flatLength(response)
    if (bodyBytes < 0) {
      // In the codec's scratch buffer: copied into the frame at once.
      const scratch = type.encodeToScratch(response)
      const at = out.reserve(responseFrameBytes(callId, scratch.length))
      writeResponseFrame(out.buffer, at, callId, scratch.bytes, scratch.length)
      return
    }
    // A flat message is written straight into its frame.
    const at = out.reserve(responseFrameBytes(callId, bodyBytes))
    const buffer = out.buffer
    type.writeFlat(buffer, writeResponseFrameHead(buffer, at, callId, bodyBytes))
  }

  refusal (call: CallInfo<KrpcCallData | undefined>, reason: RefusalReason, message: string, detail?: unknown): AnswerSlices {
    // A handler that gave up at the deadline its client set: the client has
    // given up too, and reports its own timeout, as against a Kudu server
    // whose handler answers after the client gave up. An answer now would
    // race the client's timer, and Kudu's Java client surfaces whichever
    // comes first: a remote error, not its TimedOut.
    if (reason === 'timed-out' && (call.data?.clientTimeoutMs ?? 0) > 0) return NO_ANSWER
    // Kudu's text of a TimedOut status: "Timed out: Call waited in the queue past client deadline".
    if (reason === 'expired' || reason === 'timed-out') return encodeErrorFrame(call.callId, REFUSAL_CODES[reason], `Timed out: ${message}`)
    if (reason === 'failed') {
      const code = krpcCodeOf(detail)
      if (code !== undefined) return encodeErrorFrame(call.callId, code, stripCodePrefix(message, code))
    }
    const flags = reason === 'invalid' && Array.isArray(detail) ? detail as number[] : undefined
    return encodeErrorFrame(call.callId, REFUSAL_CODES[reason], message, flags)
  }
}

// Frames of several slices (sidecars) go into the sink as they are.
function appendAll (out: FrameSink, slices: Uint8Array[]): void {
  for (let i = 0; i < slices.length; i++) out.append(slices[i]!)
}

// A handler's `krpcError(KrpcCode.X, 'X: why')` answers 'why', as Kudu's status text is the message alone.
function stripCodePrefix (message: string, code: number): string {
  const prefix = `${krpcCodeName(code)}: `
  return message.startsWith(prefix) ? message.slice(prefix.length) : message
}
