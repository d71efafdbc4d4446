import type { Socket } from 'node:net'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { FrameDecoder, type Framing } from '../codec/frame-decoder.js'
import type { BusyPoller } from './busy-poll.js'
import type { SocketReader } from './socket-reader.js'
import { TransferQueue, type OutboundTransfer, type TransferQueueStats } from './transfer-queue.js'

/**
 * A protocol's connection set-up (KRPC negotiation), driven by the
 * connection: it gets the raw preamble (server side) and then whole frames
 * until it says `done` or `error`. The KRPC negotiation classes of `codec/`
 * fit this shape.
 */
export interface Handshake<T> {
  /** Bytes the client sends before any frame, to be checked by `checkPreamble` (server side); 0 for none. */
  readonly preambleBytes?: number
  checkPreamble?: (bytes: Buffer) => RpcError | null
  /** What to send first (client side). */
  start?: () => Buffer[][]
  onFrame: (frame: Buffer) => HandshakeStep<T> | Promise<HandshakeStep<T>>
}

/** One step of a handshake: frames to send, then done, failed, or neither (wait for more). */
export interface HandshakeStep<T> {
  send?: Buffer[][] | undefined
  done?: T | undefined
  error?: RpcError | undefined
}

/** What a connection reports to its owner (the reactor's server or client). */
export interface ConnectionHandler {
  /**
   * A whole frame after set-up: `buf[start, end)`, length prefix included.
   * `buf` is the read chunk (or a buffer the frame was assembled in); views
   * of it stay valid as long as they are referenced, but the bytes outside
   * the range belong to other frames. Return false to stop reading.
   */
  onFrame: (buf: Buffer, start: number, end: number) => boolean | undefined | void
  /** The connection closed; `error` says why (undefined: closed by us without error). Called once. */
  onClose: (error: RpcError | undefined) => void
}

export interface ConnectionOptions {
  framing: Framing
  /** Largest inbound frame accepted; checked as soon as its length prefix arrives. */
  maxFrameBytes?: number | undefined
  /** Bound on outbound bytes queued or buffered. */
  maxOutboundBytes?: number | undefined
  /**
   * A frame sent with nothing queued waits for the end of the current
   * microtask checkpoint (the same event-loop turn) to go out with the
   * frames sent by the other continuations of that checkpoint, e.g. the
   * callers resumed by one read's responses. Default true; see
   * TransferQueueOptions.coalesceMicrotasks.
   */
  coalesceMicrotasks?: boolean | undefined
  /** The socket was made with this reader's `onread`: chunks come from it, not from 'data' events. */
  reader?: SocketReader | undefined
  /** Touched on every read and send, so the owner's event loop keeps polling a while (see BusyPoller); none by default. */
  busyPoller?: BusyPoller | undefined
}

/** Counters of one connection. */
export interface ConnectionStats extends TransferQueueStats {
  bytesRead: number
  framesRead: number
  /** Bytes handed to the socket (Node's `socket.bytesWritten`: set-up frames included). */
  bytesWritten: number
  /** How reads arrive: through a SocketReader (`onread`, the fast path) or as 'data' events. */
  readPath: 'onread' | 'data'
}

/**
 * One socket: inbound frame assembly, the outbound transfer queue, and the
 * set-up handshake. Knows nothing about calls, ids or deadlines: the owner
 * reacts to frames and destroys the connection when its timers say so.
 * No error escapes a socket callback: bad bytes end the connection with an
 * error passed to `onClose`.
 */
export class Connection {
  readonly socket: Socket
  readonly #decoder: FrameDecoder
  readonly #queue: TransferQueue
  #handler: ConnectionHandler | null = null
  #setup: { handshake: Handshake<unknown>, resolve: (value: unknown) => void, reject: (error: RpcError) => void } | null = null
  #preamble: Buffer | null = null
  #setupChain: Promise<void> = Promise.resolve()
  #closed = false
  #closeError: RpcError | undefined
  #bytesRead = 0
  #framesRead = 0
  #reads = 0
  #activity = 0
  readonly #poller: BusyPoller | null
  readonly #readPath: 'onread' | 'data'
  readonly #onFrame = (buf: Buffer, start: number, end: number): boolean => this.#dispatch(buf, start, end)

  constructor (socket: Socket, options: ConnectionOptions) {
    this.socket = socket
    this.#decoder = new FrameDecoder(options.framing, options.maxFrameBytes)
    this.#queue = new TransferQueue(socket, { maxOutboundBytes: options.maxOutboundBytes, coalesceMicrotasks: options.coalesceMicrotasks ?? true })
    this.#poller = options.busyPoller ?? null
    socket.setNoDelay(true)
    const onData = (chunk: Buffer): void => this.#onSocketData(chunk)
    this.#readPath = options.reader !== undefined ? 'onread' : 'data'
    if (options.reader !== undefined) options.reader.attach(onData)
    else socket.on('data', onData)
    socket.on('drain', () => this.#queue.onSocketDrain())
    socket.on('error', (err: Error) => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `socket error: ${err.message}`, { cause: err })))
    socket.on('end', () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed by peer')))
    socket.on('close', () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed')))
  }

  /** Starts delivering frames to `handler`. */
  attach (handler: ConnectionHandler): void {
    this.#handler = handler
  }

  /**
   * A counter that moves on every read and every send. The owner compares it
   * between idle scans, so this class needs no clock.
   */
  get activity (): number {
    return this.#activity
  }

  /** Reads handled so far: frames delivered under the same count came in the same read. */
  get reads (): number {
    return this.#reads
  }

  get isClosed (): boolean {
    return this.#closed
  }

  get closeError (): RpcError | undefined {
    return this.#closeError
  }

  /** True while a frame is half-received or bytes wait to go out. */
  get isBusy (): boolean {
    return this.#decoder.hasPartialFrame || !this.#queue.isIdle
  }

  /**
   * Runs `handshake` to completion. Regular sends queue (held) until it is
   * done. Rejects with the handshake's error or the connection's close
   * reason; the owner enforces the deadline by destroying the connection.
   */
  handshake<T> (handshake: Handshake<T>): Promise<T> {
    this.#queue.hold()
    return new Promise<T>((resolve, reject) => {
      this.#setup = { handshake: handshake as Handshake<unknown>, resolve: resolve as (value: unknown) => void, reject }
      if ((handshake.preambleBytes ?? 0) > 0) this.#preamble = Buffer.alloc(0)
      const first = handshake.start?.()
      if (first !== undefined) this.#writeRaw(first)
    })
  }

  /** Sends one frame through the transfer queue; false when the outbound bound is exceeded. */
  send (transfer: OutboundTransfer): boolean {
    this.#activity++
    this.#poller?.touch()
    return this.#queue.enqueue(transfer)
  }

  /**
   * Room for a small frame with no hooks, encoded in place (see
   * `TransferQueue.reserve`): write `bytes` bytes at `reservedAt`, then
   * `commit(bytes)`. Null: send it with `send` instead.
   */
  reserve (bytes: number): Buffer | null {
    return this.#queue.reserve(bytes)
  }

  get reservedAt (): number {
    return this.#queue.reservedAt
  }

  /** Queues the frame written at `reservedAt`. */
  commit (bytes: number): void {
    this.#activity++
    this.#poller?.touch()
    this.#queue.commit(bytes)
  }

  /** Closes the connection. Queued transfers are dropped; the handler's `onClose` runs once. */
  destroy (error?: RpcError): void {
    if (this.#closed) return
    this.#closed = true
    this.#closeError = error
    this.#decoder.stop()
    this.#queue.close(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
    this.socket.destroy()
    const setup = this.#setup
    this.#setup = null
    setup?.reject(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed during set-up'))
    this.#handler?.onClose(error)
  }

  /**
   * Hands the queued frames to the socket (the kernel takes what fits and
   * sends it even after the close), then destroys the connection at once.
   */
  flushAndDestroy (error?: RpcError): void {
    if (this.#closed) return
    this.#queue.flushNow()
    this.destroy(error)
  }

  /** Writes the queued frames, then ends the socket (after a fatal error reply, or a server's drained shutdown). */
  endAfterFlush (error?: RpcError): void {
    if (this.#closed) return
    this.#decoder.stop()
    this.#queue.flushNow()
    // Nothing may follow the end: later sends are dropped, not written after it.
    this.#queue.close(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection ending'))
    this.socket.end(() => this.destroy(error))
  }

  stats (): ConnectionStats {
    return { ...this.#queue.stats(), bytesRead: this.#bytesRead, framesRead: this.#framesRead, bytesWritten: this.socket.bytesWritten, readPath: this.#readPath }
  }

  #onSocketData (chunk: Buffer): void {
    if (this.#closed) return
    this.#bytesRead += chunk.length
    this.#reads++
    this.#activity++
    this.#poller?.touch()
    if (this.#preamble !== null) {
      chunk = this.#takePreamble(chunk)
      if (chunk.length === 0 || this.#closed) return
    }
    // Answers produced while this read's frames are handled go out in one write.
    this.#queue.beginRead()
    try {
      const error = this.#decoder.pushRanges(chunk, this.#onFrame)
      if (error !== null) this.destroy(error)
    } finally {
      this.#queue.endRead()
    }
  }

  // Collects the client preamble (server side) before any frame.
  #takePreamble (chunk: Buffer): Buffer {
    const setup = this.#setup
    const need = setup?.handshake.preambleBytes ?? 0
    const have = this.#preamble!
    const take = Math.min(need - have.length, chunk.length)
    const collected = have.length === 0 && take === need ? chunk.subarray(0, take) : Buffer.concat([have, chunk.subarray(0, take)])
    if (collected.length < need) {
      // Wait for the rest; a peer that never sends it meets the set-up deadline.
      this.#preamble = collected
      return chunk.subarray(chunk.length)
    }
    this.#preamble = null
    const verdict = setup?.handshake.checkPreamble?.(collected) ?? null
    if (verdict !== null) {
      // A bad preamble is closed without a reply (wire-contract §1).
      this.destroy(verdict)
      return chunk.subarray(chunk.length)
    }
    return chunk.subarray(take)
  }

  #dispatch (buf: Buffer, start: number, end: number): boolean {
    if (this.#closed) return false
    this.#framesRead++
    if (this.#setup === null) {
      const handler = this.#handler
      if (handler === null) {
        this.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, 'frame received before the connection was ready'))
        return false
      }
      return handler.onFrame(buf, start, end) !== false && !this.#closed
    }
    // Set-up frames are handled in order even when a step is async: keep a copy.
    const owned = Buffer.from(buf.subarray(start, end))
    this.#setupChain = this.#setupChain.then(() => this.#setupFrame(owned))
    return true
  }

  async #setupFrame (frame: Buffer): Promise<void> {
    const setup = this.#setup
    if (setup === null || this.#closed) {
      // Set-up finished while this frame waited: it is a regular frame.
      if (!this.#closed && this.#handler !== null) this.#handler.onFrame(frame, 0, frame.length)
      return
    }
    let step: HandshakeStep<unknown>
    try {
      step = await setup.handshake.onFrame(frame)
    } catch (err) {
      step = { error: new RpcError(ErrorCode.NEGOTIATION_FAILED, `set-up failed: ${(err as Error).message}`, { cause: err }) }
    }
    if (this.#closed) return
    if (step.send !== undefined) this.#writeRaw(step.send)
    if (step.error !== undefined) {
      this.#setup = null
      setup.reject(step.error)
      this.endAfterFlush(step.error)
      return
    }
    if (step.done !== undefined) {
      this.#setup = null
      setup.resolve(step.done)
      this.#queue.release()
    }
  }

  // Set-up frames bypass the (held) transfer queue.
  #writeRaw (frames: Buffer[][]): void {
    const slices: Buffer[] = []
    for (const frame of frames) for (const slice of frame) slices.push(slice)
    this.socket.write(slices.length === 1 ? slices[0]! : Buffer.concat(slices))
  }
}
