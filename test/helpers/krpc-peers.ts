/**
 * Hand-driven KRPC peers for the reactor tests, built from the codec only:
 *
 * - `RawClient`: a socket that writes whatever bytes a test builds (one at a
 *   time, garbage, pipelined frames) and parses what the server answers.
 * - `FakeServer`: a listener that negotiates like a KRPC server (or never
 *   does), records each request frame, and lets the test answer by hand:
 *   out of order, malformed, for unknown call ids, or not at all.
 */
import { createServer, connect, type Server as NetServer, type Socket } from 'node:net'
import { once } from 'node:events'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { encodeErrorFrame, encodeRemoteMethod, encodeRequestFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { KRPC_PREAMBLE, NEGOTIATE_CALL_ID, headerSchema, krpcFraming } from '../../codec/krpc/frames.js'
import { parseRequestFrame, parseResponseFrame, type ResponseFrame } from '../../codec/krpc/parsed-frame.js'
import type { RequestHeader } from '../../codec/krpc/header-decoder.js'
import { clientHandshakeBytes as handshakeBytes } from '../../codec/krpc/client-negotiation.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { ServerNegotiation } from '../../codec/krpc/server-negotiation.js'
import { RpcError } from '../../codec/errors.js'
import type { MessageType } from '../../codec/protobuf/schema.js'

const NegotiateType = headerSchema.type<{
  step: number, supported_features?: number[], sasl_mechanisms?: Array<{ mechanism: string }>, authn_types?: Array<{ sasl?: object }>
}>('kudu.rpc.NegotiatePB')

/** Joins frame slices (or lists of frames) into one buffer. */
export function join (frames: ReadonlyArray<Buffer | readonly Buffer[]>): Buffer {
  const parts: Buffer[] = []
  for (const f of frames) {
    if (Buffer.isBuffer(f)) parts.push(f)
    else parts.push(...f)
  }
  return Buffer.concat(parts)
}

/** The client's whole handshake as one buffer (see the codec's clientHandshakeBytes). */
export function clientHandshakeBytes (user = 'raw', password = ''): Buffer {
  return handshakeBytes({ user, password })
}

/** Bytes of one request frame for `service.method`. */
export function requestFrame (callId: number, service: string, method: string, body: Uint8Array,
  options: { timeoutMs?: number, sidecars?: Uint8Array[], requiredFeatureFlags?: number[] } = {}): Buffer {
  return join(encodeRequestFrame({
    callId,
    remoteMethod: encodeRemoteMethod(service, method),
    timeoutMs: options.timeoutMs,
    sidecars: options.sidecars,
    requiredFeatureFlags: options.requiredFeatureFlags
  }, body))
}

/** A socket to a KRPC server that the test drives byte by byte. */
export class RawClient {
  readonly socket: Socket
  /** Every frame received, negotiation frames included, in order. */
  readonly frames: ResponseFrame[] = []
  bytesReceived = 0
  parseError: RpcError | null = null
  readonly closed: Promise<void>
  #closed = false
  readonly #decoder = new FrameDecoder(krpcFraming)
  #waiters: Array<() => void> = []
  #taken = 0

  private constructor (socket: Socket) {
    this.socket = socket
    socket.on('error', () => {})
    socket.on('data', (chunk: Buffer) => {
      this.bytesReceived += chunk.length
      const error = this.#decoder.push(chunk, (frame) => {
        const parsed = parseResponseFrame(Buffer.from(frame))
        if (parsed instanceof RpcError) this.parseError = parsed
        else this.frames.push(parsed)
      })
      if (error !== null) this.parseError = error
      this.#wake()
    })
    this.closed = new Promise((resolve) => socket.once('close', () => {
      this.#closed = true
      this.#wake()
      resolve()
    }))
  }

  static async connect (port: number): Promise<RawClient> {
    const socket = connect({ host: '127.0.0.1', port })
    const raw = new RawClient(socket)
    await once(socket, 'connect')
    return raw
  }

  get isClosed (): boolean {
    return this.#closed
  }

  write (bytes: Uint8Array): void {
    this.socket.write(bytes)
  }

  /** Writes `bytes` one byte per event-loop turn, so the server reads them in tiny pieces. */
  async writeByteByByte (bytes: Uint8Array): Promise<void> {
    for (let i = 0; i < bytes.length; i++) {
      await new Promise<void>((resolve) => this.socket.write(bytes.subarray(i, i + 1), () => resolve()))
      await new Promise<void>((resolve) => setImmediate(resolve))
    }
  }

  /** The next regular (call id ≥ 0) response frame; rejects if the connection closes first. */
  async nextResponse (): Promise<ResponseFrame> {
    for (;;) {
      while (this.#taken < this.frames.length) {
        const frame = this.frames[this.#taken++]!
        if (frame.header.call_id >= 0) return frame
      }
      if (this.#closed) throw new Error('connection closed before a response arrived')
      await new Promise<void>((resolve) => this.#waiters.push(resolve))
    }
  }

  close (): void {
    this.socket.destroy()
  }

  #wake (): void {
    const waiters = this.#waiters
    this.#waiters = []
    for (const w of waiters) w()
  }
}

/** A request frame as the fake server saw it. */
export interface FakeCall {
  header: RequestHeader
  message: Buffer
  sidecars: Buffer[]
}

export interface FakeServerOptions {
  /** false: accept and never answer (nor read a frame). Default true. */
  negotiate?: boolean
  /** When given, each connection's bytes wait for this before negotiation goes on. */
  hold?: Promise<void>
  /** RPC features to advertise in the NEGOTIATE answer instead of the common ones (e.g. [] for an old server). */
  features?: number[]
}

/** One connection to the fake server. */
export class FakePeer {
  readonly socket: Socket
  readonly calls: FakeCall[] = []
  readonly parseErrors: RpcError[] = []
  negotiated = false
  bytesReceived = 0
  readonly closed: Promise<void>
  #closed = false
  #preamble = Buffer.alloc(0)
  readonly #decoder = new FrameDecoder(krpcFraming)
  readonly #negotiation = new ServerNegotiation()
  readonly #features: number[] | undefined
  #chain: Promise<void>
  #waiters: Array<() => void> = []
  #taken = 0
  #sentNegotiate = false

  constructor (socket: Socket, options: FakeServerOptions) {
    this.socket = socket
    socket.on('error', () => {})
    this.closed = new Promise((resolve) => socket.once('close', () => {
      this.#closed = true
      this.#wake()
      resolve()
    }))
    this.#chain = options.hold ?? Promise.resolve()
    this.#features = options.features
    const negotiate = options.negotiate ?? true
    socket.on('data', (chunk: Buffer) => {
      this.bytesReceived += chunk.length
      if (!negotiate) return
      const copy = Buffer.from(chunk)
      this.#chain = this.#chain.then(() => this.#onData(copy))
    })
  }

  get isClosed (): boolean {
    return this.#closed
  }

  #onData (chunk: Buffer): void {
    if (this.#closed) return
    if (this.#preamble.length < KRPC_PREAMBLE.length) {
      const take = Math.min(KRPC_PREAMBLE.length - this.#preamble.length, chunk.length)
      this.#preamble = Buffer.concat([this.#preamble, chunk.subarray(0, take)])
      chunk = chunk.subarray(take)
      if (this.#preamble.length === KRPC_PREAMBLE.length && !this.#preamble.equals(KRPC_PREAMBLE)) {
        this.socket.destroy()
        return
      }
    }
    this.#decoder.push(chunk, (frame) => {
      const owned = Buffer.from(frame)
      if (!this.negotiated) {
        const step = this.#negotiation.onFrame(owned) as NegotiationStep
        let send = step.send ?? []
        if (this.#features !== undefined && this.#preamble.length > 0 && !this.#sentNegotiate) {
          send = [encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({
            step: 1, supported_features: this.#features, sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }]
          }))]
        }
        this.#sentNegotiate = true
        for (const s of send) this.socket.write(join(s))
        if (step.done !== undefined) this.negotiated = true
        if (step.error !== undefined) this.socket.end()
        return
      }
      const parsed = parseRequestFrame(owned)
      if (parsed instanceof RpcError) { this.parseErrors.push(parsed); return }
      this.calls.push({ header: parsed.header, message: parsed.message, sidecars: parsed.sidecars })
    })
    this.#wake()
  }

  /** The next request frame received after negotiation; rejects if the connection closes first. */
  async nextCall (): Promise<FakeCall> {
    for (;;) {
      if (this.#taken < this.calls.length) return this.calls[this.#taken++]!
      if (this.#closed) throw new Error('connection closed before a call arrived')
      await new Promise<void>((resolve) => this.#waiters.push(resolve))
    }
  }

  /** Resolves once `n` request frames have been received in all. */
  async callsReceived (n: number): Promise<void> {
    while (this.calls.length < n) {
      if (this.#closed) throw new Error(`connection closed after ${this.calls.length} of ${n} calls`)
      await new Promise<void>((resolve) => this.#waiters.push(resolve))
    }
  }

  write (bytes: Uint8Array | readonly Buffer[]): boolean {
    return this.socket.write(Buffer.isBuffer(bytes) || bytes instanceof Uint8Array ? bytes : join(bytes))
  }

  /** Answers `callId` with `message` encoded as `type` (is_error false). */
  respond<T> (callId: number, type: MessageType<T>, message: T, sidecars?: Uint8Array[]): void {
    this.write(encodeResponseFrame(callId, false, type.encode(message), sidecars))
  }

  /** Answers `callId` with raw body bytes (which need not parse as the response type). */
  respondRaw (callId: number, body: Uint8Array, isError = false): void {
    this.write(encodeResponseFrame(callId, isError, body))
  }

  respondError (callId: number, code: number, message: string): void {
    this.write(encodeErrorFrame(callId, code, message))
  }

  #wake (): void {
    const waiters = this.#waiters
    this.#waiters = []
    for (const w of waiters) w()
  }
}

/** A listener on 127.0.0.1 whose connections are FakePeers. */
export class FakeServer {
  readonly peers: FakePeer[] = []
  readonly #net: NetServer
  #port = 0
  #waiters: Array<() => void> = []

  private constructor (options: FakeServerOptions) {
    this.#net = createServer((socket) => {
      this.peers.push(new FakePeer(socket, options))
      const waiters = this.#waiters
      this.#waiters = []
      for (const w of waiters) w()
    })
  }

  static async start (options: FakeServerOptions = {}): Promise<FakeServer> {
    const server = new FakeServer(options)
    server.#net.listen(0, '127.0.0.1')
    await once(server.#net, 'listening')
    server.#port = (server.#net.address() as { port: number }).port
    return server
  }

  get port (): number {
    return this.#port
  }

  get endpoint (): string {
    return `127.0.0.1:${this.#port}`
  }

  /** The `i`th accepted connection, once it exists. */
  async peer (i = 0): Promise<FakePeer> {
    while (this.peers.length <= i) await new Promise<void>((resolve) => this.#waiters.push(resolve))
    return this.peers[i]!
  }

  async close (): Promise<void> {
    for (const p of this.peers) p.socket.destroy()
    await new Promise<void>((resolve) => this.#net.close(() => resolve()))
  }
}

/** An endpoint nothing listens on (defined with the core harness, which uses it too). */
export { CLOSED_ENDPOINT } from './core-harness.js'

/** Lets I/O run until `ready()` holds (at most `limit` loop turns); returns whether it did. */
export async function untilReady (ready: () => boolean, limit = 2000): Promise<boolean> {
  for (let i = 0; i < limit; i++) {
    if (ready()) return true
    await new Promise<void>((resolve) => setImmediate(resolve))
  }
  return ready()
}

/** A raw client that has negotiated (its handshake answered), or closed trying. */
export async function negotiatedRaw (port: number): Promise<RawClient> {
  const raw = await RawClient.connect(port)
  // No Nagle: a small frame behind one the server has not answered must not wait for an ACK.
  raw.socket.setNoDelay(true)
  raw.write(clientHandshakeBytes())
  await untilReady(() => raw.frames.length >= 2 || raw.isClosed)
  return raw
}
