import { connect as netConnect, isIP } from 'node:net'
import type { SecureContext } from 'node:tls'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from '../../codec/frame-decoder.js'
import { ErrorStatusType, NEGOTIATE_CALL_ID, krpcFraming, parseResponseInto, type ResponseParts } from '../../codec/krpc/frames.js'
import { ClientNegotiation, QUOTED_FIRST_BYTES, isLoopbackHost, notSpeakingKrpc, refusalOf, type Negotiated, type NegotiationStep } from '../../codec/krpc/negotiation.js'
import type { Clock } from '../../scheduling/clock.js'
import type { BusyPoller } from '../../transport/busy-poll.js'
import { Connection } from '../../transport/connection.js'
import { SocketReader } from '../../transport/socket-reader.js'
import { TlsTunnel } from '../../transport/tls-tunnel.js'
import type { Balancer, Slot } from '../balancer.js'
import { CallTable } from '../call-table.js'
import { labelOf, type OutboundCall, type OutboundCalls } from './outbound-call.js'

/** The TLS settings of a KRPC client (`ClientOptions.tls`). */
export interface ClientTlsOptions {
  /** CAs that may sign the server's certificate; default Node's. */
  ca?: string | Buffer | Array<string | Buffer>
  /** This client's certificate and key, for certificate authentication. */
  cert?: string | Buffer
  key?: string | Buffer
  /** The name the server's certificate must carry; default the endpoint's host. */
  servername?: string
  /** Check the server's certificate (default true). */
  rejectUnauthorized?: boolean
}

/** The client options a connection is opened with (`ClientOptions` has them all); read at each open. */
export interface ConnectionOptions {
  /** SASL PLAIN user and password sent in negotiation. */
  user?: string
  password?: string
  /** TLS in negotiation, and whether the client insists on it. */
  tls?: ClientTlsOptions
  requireTls?: boolean
  encryptLoopback?: boolean
  /** Largest inbound frame, checked at its length prefix; default 50 MiB (independent of the server's). */
  maxMessageBytes?: number
  /** Deadline of a connection's negotiation; default 3000 ms. A short call timeout does not shorten it. */
  negotiationTimeoutMs?: number
  /** Bound on a connection's queued request bytes; a call over it fails with RPC_ERR_QUEUE_FULL. */
  maxOutboundBytes?: number
}

/** What a connection needs of the pool it belongs to. */
export interface ConnectionOwner {
  readonly options: ConnectionOptions
  readonly clock: Clock
  readonly poller: BusyPoller | undefined
  readonly calls: OutboundCalls
  /** Where responses are taken apart: one reused object for every connection of the client. */
  readonly parts: ResponseParts
  /** With `options.tls`: the context every connection's TLS handshake uses. */
  readonly secureContext: SecureContext | null
  /** The connection answered FATAL_*: new calls must open another. */
  retire: (cc: ClientConnection) => void
  /** The connection closed (or never opened): its calls fail with `error`. */
  closed: (cc: ClientConnection, error: RpcError) => void
}

const DEFAULT_NEGOTIATION_TIMEOUT_MS = 3000

/**
 * A SocketReader that keeps a copy of the connection's first bytes, to name
 * a peer that is not speaking KRPC. Only the first chunk passes through the
 * copy: then the connection's own sink is attached again, so later reads
 * cost nothing more. (Exported for its test.)
 */
export class FirstBytesReader extends SocketReader {
  firstBytes: Buffer | null = null

  override attach (sink: (chunk: Buffer) => void): void {
    super.attach((chunk) => {
      // Chunks read before attach all come through here: only the first is kept.
      if (this.firstBytes === null) {
        this.firstBytes = Buffer.from(chunk.subarray(0, QUOTED_FIRST_BYTES + 1))
        super.attach(sink)
      }
      sink(chunk)
    })
  }
}

// Errors before negotiation that say the peer's bytes were no KRPC at all.
const GARBLED: ReadonlySet<string> = new Set([ErrorCode.FRAME_TOO_LARGE, ErrorCode.MALFORMED_FRAME, ErrorCode.NEGOTIATION_FAILED, ErrorCode.CONNECTION_CLOSED])

/**
 * One connection to one endpoint, shared by every call to it: opened and
 * negotiated here, and its responses matched to their calls.
 */
export class ClientConnection {
  readonly key: string
  readonly target: { host: string, port: number }
  readonly connection: Connection
  readonly outstanding = new CallTable<OutboundCall>()
  negotiated: Negotiated | null = null
  nextCallId = 0
  closed = false
  retired = false
  /** Why the connection closed, as its calls were told (e.g. a peer not speaking KRPC); undefined while open. */
  closeReason: RpcError | undefined = undefined
  /** The balancer slot this connection fills, if balanced. */
  slot: Slot | null = null
  balancer: Balancer | null = null
  readonly #owner: ConnectionOwner
  readonly #calls: OutboundCalls
  readonly #parts: ResponseParts
  readonly #reader: FirstBytesReader
  #connected = false

  /** Opens the socket (net.connect throws on some addresses); `negotiate` starts the rest. */
  constructor (key: string, target: { host: string, port: number }, owner: ConnectionOwner) {
    this.key = key
    this.target = target
    this.#owner = owner
    this.#calls = owner.calls
    this.#parts = owner.parts
    const options = owner.options
    // Reads come through onread, not 'data' events (see SocketReader).
    const reader = new FirstBytesReader()
    this.#reader = reader
    const socket = netConnect({ host: target.host, port: target.port, noDelay: true, onread: reader.onread })
    this.connection = new Connection(socket, {
      reader,
      framing: krpcFraming,
      maxFrameBytes: options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      maxOutboundBytes: options.maxOutboundBytes,
      busyPoller: owner.poller
    })
    socket.once('connect', () => { this.#connected = true })
  }

  /** Handles frames and the close, and negotiates (bounded by `negotiationTimeoutMs`). */
  negotiate (): void {
    const key = this.key
    const connection = this.connection
    const { options, clock } = this.#owner
    const secureContext = this.#owner.secureContext
    const tls = options.tls
    const host = this.target.host
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
    let timedOut: RpcError | null = null
    connection.attach({
      onFrame: (buf, start, end) => this.#onFrame(buf, start, end),
      onClose: (error) => {
        // A connection that never negotiated marks its slot as failing, so balanced calls skip it for a while.
        if (this.negotiated === null && this.slot !== null && error !== undefined) this.balancer?.failed(this.slot)
        let reason = !this.#connected && error !== undefined && error.code === ErrorCode.CONNECTION_CLOSED
          ? new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${key}: ${error.message.replace(/^socket error: /, '')}`, { cause: error })
          : error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${key} closed`)
        // The peer answered, but not as a KRPC server would (an HTTP server's
        // "HTTP/1.1 400" reads as a frame of 1.2 GB): say so, with its bytes.
        const first = this.#reader.firstBytes
        if (error !== undefined && this.negotiated === null && first !== null && !negotiation.heardKrpc && reason !== timedOut &&
          reason.remote === undefined && GARBLED.has(reason.code)) {
          reason = notSpeakingKrpc(key, first, reason)
        }
        this.closeReason = reason
        this.#owner.closed(this, reason)
      }
    })
    const negotiationMs = options.negotiationTimeoutMs ?? DEFAULT_NEGOTIATION_TIMEOUT_MS
    const timer = clock.setTimer(() => {
      timedOut = new RpcError(ErrorCode.NEGOTIATION_FAILED, `connection negotiation to ${key} timed out after ${negotiationMs} ms`)
      connection.destroy(timedOut)
    }, negotiationMs)
    const record = (step: NegotiationStep): NegotiationStep => {
      if (step.done !== undefined) this.negotiated = step.done
      return step
    }
    connection.handshake<Negotiated>({
      start: () => negotiation.start(),
      onFrame: (frame) => {
        const step = negotiation.onFrame(frame)
        return step instanceof Promise ? step.then(record) : record(step)
      },
      abort: () => negotiation.abort()
    }).then((negotiated) => {
      clock.clearTimer(timer)
      this.negotiated = negotiated
      if (this.slot !== null) this.balancer?.succeeded(this.slot)
    }, () => {
      clock.clearTimer(timer)
    })
  }

  takeCallId (): number {
    const id = this.nextCallId
    this.nextCallId = id === 0x7fffffff ? 0 : id + 1
    return id
  }

  /** Closed: every pending call fails with `error`, and the socket is destroyed. */
  fail (error: RpcError): void {
    this.closed = true
    const calls = this.outstanding.values()
    this.outstanding.clear()
    for (const call of calls) {
      call.conn = null
      this.#calls.fail(call, error)
    }
    this.connection.destroy(error)
  }

  #onFrame (buf: Buffer, start: number, end: number): boolean {
    // Taken apart into one reused object: no header, frame or view objects per call.
    const parts = this.#parts
    const malformed = parseResponseInto(buf, start, end, parts)
    if (malformed !== null) {
      this.connection.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, `malformed response from ${this.key}: ${malformed.message}`))
      return false
    }
    // Out of the table at once (one probe): every path below finishes it.
    const call = this.outstanding.take(parts.callId)
    if (call === undefined) {
      // A server that refused certificate authentication after the
      // handshake (the client was done at its last TLS token) answers the
      // negotiation's call id: its words close the connection.
      if (parts.callId === NEGOTIATE_CALL_ID && parts.isError === true) {
        this.connection.destroy(refusalOf(buf.subarray(parts.messageStart, parts.messageEnd)))
        return false
      }
      // Unknown, timed out or cancelled: ignore.
      return true
    }
    if (parts.isError === true) {
      const status = ErrorStatusType.decodeRange(buf, parts.messageStart, parts.messageEnd)
      if (status instanceof RpcError) {
        this.#calls.fail(call, new RpcError(ErrorCode.INVALID_RESPONSE, `${labelOf(call)}: was an RPC error but could not parse error response`), true)
      } else {
        const code = status.code === undefined || status.code === 0 ? KrpcCode.FATAL_UNKNOWN : status.code
        const error = krpcError(code, status.message, status.unsupported_feature_flags)
        // FATAL_*: this connection must not be reused; new calls open another.
        if (error.fatal) this.#owner.retire(this)
        this.#calls.fail(call, error, true)
      }
      return true
    }
    const response = call.method.methodDef.responseType.decodeRange(buf, parts.messageStart, parts.messageEnd)
    if (response instanceof RpcError) {
      this.#calls.fail(call, new RpcError(ErrorCode.INVALID_RESPONSE, `${labelOf(call)}: invalid RPC response, ${response.message}`), true)
      return true
    }
    this.#calls.succeed(call, response, parts.sidecars)
    return true
  }
}
