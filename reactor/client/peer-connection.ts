import { connect as netConnect, type Socket } from 'node:net'
import { connect as tlsConnect, type ConnectionOptions as TlsConnectionOptions } from 'node:tls'
import Denque from 'denque'
import type { ClientHandshake } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { TimerHandle } from '../../scheduling/clock.js'
import type { BusyPoller } from '../../transport/busy-poll.js'
import { FramedConnection } from '../../transport/framed-connection.js'
import { SocketReader, type ReadSink } from '../../transport/socket-reader.js'
import { socketStream } from '../../transport/net-stream.js'
import type { NativeReactor } from '../../transport/native/reactor.js'
import type { NativeStream } from '../../transport/native/native-stream.js'
import { isIP } from 'node:net'
import type { Balancer, Slot } from '../balancer.js'
import { CallTable } from '../call-table.js'
import type { ConnectionLiveness } from '../connection-liveness.js'

/** Where a push came from, for `ProtocolClient.onPush` handlers. */
export interface PushInfo {
  /** The connection's endpoint, `host:port`. */
  readonly endpoint: string
}

/** What a connection is opened with; the client makes it once. */
export interface PeerSettings {
  readonly framing: ConstructorParameters<typeof FramedConnection>[1]['framing']
  readonly maxFrameBytes: number
  readonly maxOutboundBytes: number | undefined
  readonly busyPoller: BusyPoller | undefined
  /** TLS from the first byte, its secure context built once. */
  readonly tls: TlsConnectionOptions | undefined
  /** TCP keepalive's idle time before the first probe; 0: off. */
  readonly keepAliveMs: number
  /** The native transport's reactor plain TCP connections to IP addresses go through (ProtocolClientOptions.io); null: node:net. */
  readonly reactor?: NativeReactor | null | undefined
}

/**
 * A SocketReader that keeps a copy of the connection's first bytes, to name
 * a peer that is not speaking the protocol (`ClientHandshake.failure`).
 * Only the first chunk passes through the copy: then the connection's own
 * sink is attached again, so later reads cost nothing more.
 */
export class FirstBytesReader extends SocketReader {
  /** The first chunk's first bytes (enough to quote); null until one is read. */
  firstBytes: Buffer | null = null

  override attach (sink: ReadSink): void {
    super.attach((buf, start, end) => {
      // Chunks read before attach all come through here: only the first is kept.
      if (this.firstBytes === null) {
        this.firstBytes = Buffer.from(buf.subarray(start, Math.min(end, start + QUOTED_BYTES)))
        super.attach(sink)
      }
      sink(buf, start, end)
    })
  }
}

// Enough of a peer's first bytes to show what it speaks.
const QUOTED_BYTES = 25

/** What a connection's calls (`C`) need of the client that owns it. */
export interface PeerOwner<C> {
  /** Checked before a queued call's request is written (`ClientProtocol.beforeSend`); undefined: none. */
  readonly beforeSend: ((call: C, session: unknown) => RpcError | undefined) | undefined
  /** Fails the call (unless it has settled). */
  readonly fail: (call: C, error: RpcError) => void
}

/** One connection of a client: its socket, its set-up, and the calls (`C`) awaiting answers on it. */
export class PeerConnection<C> {
  /** The balancer slot's key (`host:port#i`): the client's connections by it. */
  readonly key: string
  /** `host:port`, for errors, stats and push handlers. */
  readonly endpoint: string
  readonly slot: Slot
  readonly balancer: Balancer
  readonly connection: FramedConnection
  /** The node:net socket under the connection (its 'connect' and 'secureConnect' events); null on the native transport. */
  readonly socket: Socket | null
  readonly #native: NativeStream | null = null
  readonly #tls: boolean
  readonly owner: PeerOwner<C>
  readonly inOrderMatching: boolean
  /** The TCP (or TLS) connection is up. */
  connected = false
  /** TLS: the TCP connection is up (the TLS handshake under way, or done when `connected`). */
  tlsHandshaking = false
  /** Connected and set up: requests flow. */
  ready = false
  closed = false
  /** Retired after a fatal remote error: no new calls; it closes once its last call settles. */
  retired = false
  /** What the handshake was done with (KRPC: what negotiation agreed). */
  session: unknown = undefined
  /** The set-up deadline closed the connection. */
  setupTimedOut = false
  connectTimer: TimerHandle | null = null
  readonly reader: FirstBytesReader | undefined
  #nextId = 0
  #wrapped = false
  readonly #maxId: number
  nextSeq = 0
  /** `id` matching: calls by id (quiet ones included), keyed by `id | 0`. */
  readonly byId = new CallTable<C>()
  /** `in-order` matching: calls in the order their answers will come, settled ones included (their answers are dropped; a stream's call stays at the front until its last part). */
  readonly inOrder = new Denque<C>()
  /** `id` matching: calls with `maybe` answers, in writing order. */
  readonly quiet = new Denque<C>()
  flushNeeded = false
  flushScheduled = false
  /** What push handlers are told about this connection. */
  readonly pushInfo: PushInfo
  /** The silence check (protocols with a `ping`), or null. */
  liveness: ConnectionLiveness | null = null

  /** Opens the socket (net.connect throws on some addresses); the owner attaches and sets it up. */
  constructor (owner: PeerOwner<C>, slot: Slot, balancer: Balancer, settings: PeerSettings, inOrder: boolean, maxId: number, keepFirstBytes: boolean) {
    const { host, port } = slot.address
    this.owner = owner
    this.key = slot.key
    this.endpoint = `${host}:${port}`
    this.pushInfo = Object.freeze({ endpoint: this.endpoint })
    this.slot = slot
    this.balancer = balancer
    this.inOrderMatching = inOrder
    this.#maxId = maxId
    const tls = settings.tls
    this.#tls = tls !== undefined
    const reactor = settings.reactor ?? null
    // The native transport: plain TCP to an address (names go through node:net's lookup), without the first bytes kept.
    if (reactor !== null && tls === undefined && !keepFirstBytes && isIP(host) !== 0) {
      const native = this.#native = reactor.connectNow(port, host, settings.keepAliveMs)
      this.socket = null
      this.connection = new FramedConnection(native, {
        readPath: 'onread',
        framing: settings.framing,
        maxFrameBytes: settings.maxFrameBytes,
        maxOutboundBytes: settings.maxOutboundBytes,
        busyPoller: settings.busyPoller
      })
      return
    }
    // TLS sockets read through 'data' events (onread applies to raw TCP handles only).
    const reader = tls !== undefined ? undefined : keepFirstBytes ? new FirstBytesReader() : new SocketReader()
    this.reader = reader instanceof FirstBytesReader ? reader : undefined
    // Keepalive finds a peer gone while the connection idles (a crashed host's kernel answers nothing; the calls' deadlines cover busy connections).
    const keepAlive = settings.keepAliveMs > 0
    const socket: Socket = tls === undefined
      ? netConnect({ host, port, noDelay: true, onread: reader!.onread, keepAlive, keepAliveInitialDelay: settings.keepAliveMs })
      : tlsConnect({ ...tls, host, port })
    if (tls !== undefined && keepAlive) socket.setKeepAlive(true, settings.keepAliveMs)
    this.socket = socket
    const stream = socketStream(socket, reader)
    this.connection = new FramedConnection(stream, {
      socket,
      readPath: stream.readPath,
      framing: settings.framing,
      maxFrameBytes: settings.maxFrameBytes,
      maxOutboundBytes: settings.maxOutboundBytes,
      // A client reads only answers to its own calls (and pushes, bounded by
      // bytes): a read's answers are settled in one turn, not split like a
      // server's requests (the split costs a setImmediate and a read stop).
      maxFramesPerRead: Infinity,
      maxAnswerBytesPerRead: Infinity,
      busyPoller: settings.busyPoller
    })
    if (tls !== undefined) socket.once('connect', () => { this.tlsHandshaking = true })
  }

  /** Calls `then` once connected (TLS: once its handshake is done); never if the connect fails (the connection closes). */
  whenConnected (then: () => void): void {
    if (this.#native !== null) this.#native.whenConnected((error) => { if (error === null) then() })
    else this.socket!.once(this.#tls ? 'secureConnect' : 'connect', then)
  }

  /** Calls awaiting an answer. */
  get inFlight (): number {
    return this.inOrderMatching ? this.inOrder.length : this.byId.size
  }

  /** The next request's id; `id` matching skips ids still waiting once the counter has wrapped. */
  takeId (): number {
    const next = this.#nextId
    // Small on purpose (inlined per call): the wrap is taken out of line.
    if (next < this.#maxId && !this.#wrapped) {
      this.#nextId = next + 1
      return next
    }
    return this.#takeIdWrapping()
  }

  #takeIdWrapping (): number {
    for (;;) {
      const id = this.#nextId
      if (id >= this.#maxId) {
        this.#nextId = 0
        this.#wrapped = true
      } else {
        this.#nextId = id + 1
      }
      if (!this.#wrapped || this.inOrderMatching || !this.byId.has(id | 0)) return id
    }
  }

  /**
   * Why the connection closed, as its calls are told: a failure before it
   * connected is a failed connect; one before the set-up finished may be
   * named better by the handshake (`failure`).
   */
  closeReason (error: RpcError | undefined, handshake: ClientHandshake<unknown> | undefined): RpcError {
    if (error === undefined) return new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${this.endpoint} closed`)
    if (this.tlsHandshaking && error.code === ErrorCode.CONNECTION_CLOSED && this.connection.framesRead === 0 && isCertificateRefusal(error.cause)) {
      // Under TLS 1.3 the server judges our certificate after our side of the
      // handshake is done: its refusal, before any answer, still means it
      // took no request. Other TLS errors may follow requests it ran.
      this.connected = false
      return new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${this.endpoint}: TLS: ${error.message.replace(/^socket error: /, '')}`, { cause: error })
    }
    if (!this.connected && error.code === ErrorCode.CONNECTION_CLOSED) {
      return new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${this.endpoint}: ${this.tlsHandshaking ? 'TLS: ' : ''}${error.message.replace(/^socket error: /, '')}`, { cause: error })
    }
    if (!this.ready && !this.setupTimedOut && handshake?.failure !== undefined) return handshake.failure(error, this.reader?.firstBytes ?? null)
    return error
  }
}

// The alerts of a server refusing the client's certificate (OpenSSL's codes as Node names them).
const CERTIFICATE_REFUSAL = /^ERR_SSL_(?:SSLV3|TLSV1|TLSV13)_ALERT_(?:CERTIFICATE_REQUIRED|BAD_CERTIFICATE|UNSUPPORTED_CERTIFICATE|UNKNOWN_CA|CERTIFICATE_UNKNOWN|CERTIFICATE_EXPIRED|CERTIFICATE_REVOKED|ACCESS_DENIED)$/

function isCertificateRefusal (err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code
  return typeof code === 'string' && CERTIFICATE_REFUSAL.test(code)
}
