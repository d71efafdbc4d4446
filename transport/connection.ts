import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import type { TLSSocket } from 'node:tls'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { FrameDecoder, isScanFraming, type AnyFraming, type Deframer } from '../codec/frame-decoder.js'
import { ScanDecoder } from '../codec/scan-decoder.js'
import type { FrameSink } from '../codec/frame-sink.js'
import { abortFrame, beginFrame, endFrame, writeFrame, type FrameEncoder } from './frame-writer.js'
import type { Handshake, HandshakeStep, SecureChannel } from '../codec/protocol.js'
import type { BusyPoller } from './busy-poll.js'
import type { InboundBudget } from './inbound-budget.js'
import type { SocketReader } from './socket-reader.js'
import { TransferQueue, type OutboundTransfer, type TransferQueueStats } from './transfer-queue.js'

export type { Handshake, HandshakeStep } from '../codec/protocol.js'

/** What probe reads of a paused connection set aside before they stop (`Connection.probeRead`): 64 KiB, one read's worth. */
export const PROBE_BYTES = 64 * 1024

interface SetupState { handshake: Handshake<unknown>, resolve: (value: unknown) => void, reject: (error: RpcError) => void }

function setupFailed (err: unknown): HandshakeStep<unknown> {
  return { error: new RpcError(ErrorCode.NEGOTIATION_FAILED, `set-up failed: ${(err as Error).message}`, { cause: err }) }
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
  /**
   * The framing refused the stream after set-up. Return true to take it
   * over: the connection reads nothing more and the handler ends it (after
   * answering, say); false or absent: the connection is destroyed with `error`.
   */
  onFramingError?: (error: RpcError) => boolean
  /** The connection closed; `error` says why (undefined: closed by us without error). Called once. */
  onClose: (error: RpcError | undefined) => void
}

export interface ConnectionOptions {
  framing: AnyFraming
  /** Largest inbound frame accepted; checked as soon as its length prefix arrives. */
  maxFrameBytes?: number | undefined
  /**
   * Bound on outbound bytes queued or buffered, judged on what the kernel
   * did not take: past it `send` and `writeFrame` return false. With
   * `onReadingSuspended`, past it the connection reads nothing more until
   * the peer has taken enough to bring it back under (`isReadingSuspended`),
   * and the answers to requests already read are still taken, up to twice
   * the bound.
   */
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
  /** The reactor-wide budget for bytes held in incomplete inbound frames; none by default. */
  inboundBudget?: InboundBudget | undefined
  /** Called when the transfer queue starts waiting for 'drain' (the peer reads slower than we send). */
  onBackedUp?: (() => void) | undefined
  /**
   * With it, past `maxOutboundBytes` the connection stops reading instead of
   * refusing sends (see `maxOutboundBytes`), and this is called when it does
   * (`isReadingSuspended`): the owner judges whether the peer still takes
   * any. Without it, a send past the bound returns false.
   */
  onReadingSuspended?: (() => void) | undefined
}

export type { FrameEncoder } from './frame-writer.js'

/** Counters of one connection. */
export interface ConnectionStats extends TransferQueueStats {
  /** Bytes read from the socket so far. */
  bytesRead: number
  /** Frames received so far, set-up frames included. */
  framesRead: number
  /** Bytes handed to the socket (Node's `socket.bytesWritten`: set-up frames included). */
  bytesWritten: number
  /** How reads arrive: through a SocketReader (`onread`, the fast path) or as 'data' events. */
  readPath: 'onread' | 'data'
  /** The TLS version frames travel under ('TLSv1.3'), or null in plain text (KRPC on loopback after TLS that only authenticated, too). */
  tls: string | null
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
  readonly #decoder: Deframer
  readonly #queue: TransferQueue
  #handler: ConnectionHandler | null = null
  #setup: SetupState | null = null
  #preamble: Buffer | null = null
  // The stream frames travel on: the socket, or the secure channel set-up switched to.
  #stream: Socket
  #channel: SecureChannel | null = null
  // Bytes read while an asynchronous set-up step runs, decoded once it is
  // applied (the step may switch the stream: they are then its input).
  #held: Buffer[] | null = null
  #holdRest = false
  // The held bytes are the socket's (set-up before the stream switched), not the secure channel's.
  #heldRaw = false
  #closed = false
  /** Ending (endAfterFlush): no frame is delivered any more, though the socket still flushes. */
  #ending = false
  #closeError: RpcError | undefined
  #endingError: RpcError | undefined
  #bytesRead = 0
  #framesRead = 0
  #reads = 0
  #activity = 0
  #maxFrameBytes: number
  // Two reasons to stop reading, kept apart: the server's outbound budget
  // (pauseReading) and the application (holdReading, a broker holding back
  // a publisher). The socket reads again only when neither holds it.
  #readingPaused = false
  #readingHeld = false
  // A third reason, the connection's own: its unsent bytes passed
  // maxOutboundBytes (what the kernel left of them), so nothing more is read
  // until the peer has taken enough (see onOverBound in the constructor).
  #readingSuspended = false
  #drains = 0
  /** Called on each 'drain' of the stream (the kernel took what was buffered), after the queue wrote more; null: none. */
  onDrain: (() => void) | null = null
  readonly #budget: InboundBudget | null
  #heldReported = 0
  readonly #poller: BusyPoller | null
  readonly #readPath: 'onread' | 'data'
  readonly #onFrame = (buf: Buffer, start: number, end: number): boolean => this.#dispatch(buf, start, end)
  // Where reads go: the reader's sink or the socket's 'data' listener (swapped for a probe read, see probeRead).
  readonly #reader: SocketReader | null
  readonly #onData: (chunk: Buffer) => void
  readonly #onProbeData = (chunk: Buffer): void => this.#onProbe(chunk)
  readonly #onReadingSuspended: (() => void) | undefined
  /** A probe read is armed: the socket reads, and what it reads is set aside while reading is paused. */
  #probing = false
  /** What probe reads set aside, delivered first when reading resumes; null: nothing. */
  #probed: Buffer[] | null = null
  #probedBytes = 0

  constructor (socket: Socket, options: ConnectionOptions) {
    this.socket = socket
    this.#stream = socket
    this.#decoder = isScanFraming(options.framing) ? new ScanDecoder(options.framing, options.maxFrameBytes) : new FrameDecoder(options.framing, options.maxFrameBytes)
    this.#maxFrameBytes = this.#decoder.maxFrameBytes
    this.#queue = new TransferQueue(socket, {
      maxOutboundBytes: options.maxOutboundBytes,
      coalesceMicrotasks: options.coalesceMicrotasks ?? true,
      onBackedUp: options.onBackedUp,
      // Only an owner that judges a suspended connection (a server) stops reading past the bound; a client's send fails instead.
      onOverBound: options.onReadingSuspended === undefined ? undefined : () => this.#suspendReading()
    })
    this.#budget = options.inboundBudget ?? null
    this.#onReadingSuspended = options.onReadingSuspended
    this.#poller = options.busyPoller ?? null
    socket.setNoDelay(true)
    const onData = (chunk: Buffer): void => this.#onSocketData(chunk)
    this.#onData = onData
    this.#reader = options.reader ?? null
    this.#readPath = options.reader !== undefined ? 'onread' : 'data'
    if (options.reader !== undefined) options.reader.attach(onData)
    else socket.on('data', onData)
    this.#watch(socket)
  }

  #watch (stream: Socket | Duplex): void {
    stream.on('drain', () => {
      // The peer read what we sent: progress, for the owner's idle scan.
      this.#activity++
      this.#drains++
      this.#queue.onSocketDrain()
      if (this.#readingSuspended && this.#queue.backlogBytes <= this.#queue.maxOutboundBytes) {
        this.#readingSuspended = false
        this.#resumeUnlessHeld()
      }
      this.onDrain?.()
    })
    // An RpcError is already the reason (a secure channel that read the peer's refusal).
    stream.on('error', (err: Error) => this.destroy(err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECTION_CLOSED, `${stream === this.socket ? 'socket' : 'TLS'} error: ${err.message}`, { cause: err })))
    stream.on('end', () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed by peer')))
    stream.on('close', () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed')))
  }

  /** Starts delivering frames to `handler`. */
  attach (handler: ConnectionHandler): void {
    this.#handler = handler
  }

  /**
   * A counter that moves on every read, every send and every 'drain' (the
   * peer took bytes we had queued). The owner compares it between idle
   * scans, so this class needs no clock.
   */
  get activity (): number {
    return this.#activity
  }

  /** Reads handled so far: frames delivered under the same count came in the same read. */
  get reads (): number {
    return this.#reads
  }

  /** Frames received so far (set-up frames included): a partial frame seen under the same count is the same frame. */
  get framesRead (): number {
    return this.#framesRead
  }

  /** True while part of a frame has arrived and the rest has not. */
  get hasPartialFrame (): boolean {
    return this.#decoder.hasPartialFrame
  }

  /** Bytes received of the frame being received (0 when none is). */
  get partialFrameBytes (): number {
    return this.#decoder.bufferedBytes
  }

  /** Bytes queued or buffered in the socket that the peer has not taken yet. */
  get outboundBytes (): number {
    return this.#queue.backlogBytes
  }

  /**
   * Bytes libuv still has to write from requests already handed to it. It
   * falls as the kernel takes them, during one large write too (when
   * `outboundBytes` stays put until the write completes): the owner's
   * measure of a slow reader's progress.
   */
  get writeQueueBytes (): number {
    type Handle = { writeQueueSize?: unknown, _parent?: Handle } | null
    const handle = (this.socket as unknown as { _handle?: Handle })._handle
    // Under TLS the TCP handle beneath counts the kernel's progress (the TLS one holds a write whole until done).
    const size = (handle?._parent ?? handle)?.writeQueueSize
    return typeof size === 'number' ? size : 0
  }

  /** True while the transfer queue waits for 'drain'. */
  /** The bound on this connection's unsent bytes. */
  get maxOutboundBytes (): number {
    return this.#queue.maxOutboundBytes
  }

  get isBackedUp (): boolean {
    return this.#queue.isWaitingDrain
  }

  /** Stops reading from the socket (backpressure: the peer's requests wait in its own buffers and the kernel's). */
  pauseReading (): void {
    if (this.#readingPaused || this.#closed) return
    this.#readingPaused = true
    this.socket.pause()
  }

  /** Reads again after `pauseReading` (unless `holdReading` holds it too). */
  resumeReading (): void {
    if (!this.#readingPaused || this.#closed) return
    this.#readingPaused = false
    this.#resumeUnlessHeld()
  }

  /** Paused by `pauseReading` (the outbound budget's reason). */
  get isReadingPaused (): boolean {
    return this.#readingPaused
  }

  /** Stops reading for the application's reason (`ConnectionHandle.pauseReading`), independent of `pauseReading`. */
  holdReading (): void {
    if (this.#readingHeld || this.#closed) return
    this.#readingHeld = true
    this.socket.pause()
  }

  /** Ends `holdReading`; the socket reads again unless `pauseReading` holds it. */
  releaseReading (): void {
    if (!this.#readingHeld || this.#closed) return
    this.#readingHeld = false
    this.#resumeUnlessHeld()
  }

  // The socket reads again once no reason holds it.
  #resumeUnlessHeld (): void {
    if (this.#readingStopped) return
    if (this.#probing) this.#disarmProbe()
    // What a probe read set aside comes first (and may pause reading again).
    if (this.#probed !== null && !this.#releaseProbed()) return
    this.socket.resume()
  }

  /**
   * While reading is paused, held or suspended, reads on, to learn whether the
   * peer has gone: a paused socket is not polled for reading (libuv's
   * readStop), so its peer's FIN or RST goes unseen, and the connection,
   * its partial frame with it, stays until a timeout. The socket reads
   * on: the end or an error closes the connection at once; bytes are set
   * aside, counted in the inbound budget, and decoded first when reading
   * resumes. Once `PROBE_BYTES` are aside, reading stops again (so at most
   * one read more: under 128 KiB per paused connection, more only what a
   * 'data'-path stream had buffered already) and there is no further probe
   * until reading resumes: a peer that sent that much before it closed is
   * seen only then. The owner's periodic scan calls it; false when there is
   * nothing to probe (reading, closed, in set-up, or enough set aside).
   */
  probeRead (): boolean {
    if (this.#closed || this.#ending || this.#probedBytes >= PROBE_BYTES || this.#setup !== null || this.#held !== null) return false
    if (!this.#readingStopped) return false
    if (!this.#probing) {
      this.#probing = true
      if (this.#reader !== null) this.#reader.attach(this.#onProbeData)
      else {
        this.socket.off('data', this.#onData)
        this.socket.on('data', this.#onProbeData)
      }
    }
    // Again for an armed probe: a pause since then (holdReading) stopped its read.
    this.socket.resume()
    return true
  }

  /** Bytes a probe read set aside while reading is paused (counted in the inbound budget). */
  get probedBytes (): number {
    return this.#probedBytes
  }

  #onProbe (chunk: Buffer): void {
    if (this.#closed) return
    const probed = this.#probed ??= []
    probed.push(chunk)
    this.#probedBytes += chunk.length
    const paused = this.#readingStopped
    // Under PROBE_BYTES the probe stays armed: the peer's end may follow
    // what it sent, in a later read. A 'data'-path stream also hands on
    // what it had buffered: all of it, its end may be behind it.
    if (paused && (this.#probedBytes < PROBE_BYTES || (this.#readPath === 'data' && this.socket.readableLength > 0))) {
      this.#reportProbed()
      return
    }
    this.#disarmProbe()
    if (paused) {
      this.socket.pause()
      this.#reportProbed()
      return
    }
    // Reading resumed while the probe waited: the bytes go on now.
    this.#releaseProbed()
  }

  // Reads go to the decoder again.
  #disarmProbe (): void {
    this.#probing = false
    if (this.#reader !== null) this.#reader.attach(this.#onData)
    else {
      this.socket.off('data', this.#onProbeData)
      this.socket.on('data', this.#onData)
    }
  }

  // Decodes what probe reads set aside; false when that paused reading again (or closed the connection).
  #releaseProbed (): boolean {
    const probed = this.#probed!
    this.#probed = null
    this.#probedBytes = 0
    for (let i = 0; i < probed.length; i++) {
      if (this.#closed) return false
      if (this.#readingStopped) {
        // A frame paused reading again: the rest stays aside.
        const rest = probed.slice(i)
        this.#probed = rest
        for (const chunk of rest) this.#probedBytes += chunk.length
        this.#reportProbed()
        return false
      }
      this.#onSocketData(probed[i]!)
    }
    this.#reportHeld()
    return !this.#closed && !this.#readingStopped
  }

  // The inbound budget counts bytes set aside with the decoder's (it may close this connection).
  #reportProbed (): void {
    if (this.#budget === null) return
    const held = this.#decoder.heldBytes + this.#probedBytes
    if (held === this.#heldReported) return
    this.#heldReported = held
    this.#budget.update(this, held)
  }

  /** Held by `holdReading`. */
  get isReadingHeld (): boolean {
    return this.#readingHeld
  }

  /** Times the socket drained (the kernel took everything it buffered): the peer's progress, with `writeQueueBytes` falling. */
  get drains (): number {
    return this.#drains
  }

  /** Not read because its unsent bytes passed `maxOutboundBytes` (the kernel left more than that); reads again once the peer has taken enough. */
  get isReadingSuspended (): boolean {
    return this.#readingSuspended
  }

  // Some reason holds reading.
  get #readingStopped (): boolean {
    return this.#readingPaused || this.#readingHeld || this.#readingSuspended
  }

  // The queue passed the bound: nothing more is read until the peer takes enough.
  #suspendReading (): void {
    if (this.#readingSuspended || this.#closed) return
    this.#readingSuspended = true
    this.socket.pause()
    this.#onReadingSuspended?.()
  }

  get isClosed (): boolean {
    return this.#closed
  }

  get closeError (): RpcError | undefined {
    return this.#closeError
  }

  /**
   * True while bytes wait to go out. A half-received frame does not make a
   * connection busy: a peer that stops inside a frame is idle (see
   * `hasPartialFrame` and `framesRead` for the owner's frame deadline).
   */
  get isBusy (): boolean {
    return !this.#queue.isIdle
  }

  /**
   * Runs `handshake` to completion. Regular sends queue (held) until it is
   * done. Rejects with the handshake's error or the connection's close
   * reason; the owner enforces the deadline by destroying the connection.
   */
  handshake<T> (handshake: Handshake<T>): Promise<T> {
    this.#queue.hold()
    if (handshake.maxFrameBytes !== undefined) this.#decoder.maxFrameBytes = Math.min(this.#maxFrameBytes, handshake.maxFrameBytes)
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
   * True when `writeFrame` encodes in place now (the set-up is done and the
   * connection is open): a frame written then goes straight into the
   * coalesced outbound buffer and cannot be dropped any more; false: it
   * would be queued as a transfer of its own, behind the set-up.
   */
  get writesInPlace (): boolean {
    return this.#queue.inPlaceChunk !== null
  }

  /**
   * Encodes one frame with `encoder.encode(a, b, sink)` and queues it.
   * In place when it can (`writesInPlace`): the room the encoder reserves
   * is in the connection's coalesced outbound buffer (the frames of one
   * turn leave in one write), and the slices it appends follow it without
   * a copy; else into a buffer of its own, queued as a transfer. An encoder
   * that adds nothing queues nothing (true). False: the connection is
   * closed, or over its outbound bound (the frame is dropped; the caller
   * decides what follows). An encoder that throws leaves nothing queued,
   * and the throw reaches the caller.
   */
  writeFrame<A, B> (encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
    if (this.#closed) return false
    this.#activity++
    this.#poller?.touch()
    return writeFrame(this.#queue, encoder, a, b)
  }

  /**
   * Opens a frame to be encoded in place (see `writesInPlace`), for a caller
   * that runs the encoder itself (the server's answers, the client's
   * requests: in their own stack the encoder is inlined): encode into the
   * sink, then `endFrame`, or `abortFrame` if the encoder threw. Null when
   * the frame cannot go in place now: encode it into a buffer of its own
   * and `send` it.
   */
  beginFrame (): FrameSink | null {
    if (this.#closed) return null
    return beginFrame(this.#queue)
  }

  /** Queues the frame `beginFrame` opened (nothing added: nothing queued); false when over the outbound bound (dropped). */
  endFrame (): boolean {
    this.#activity++
    this.#poller?.touch()
    return endFrame(this.#queue)
  }

  /** Drops the frame `beginFrame` opened (its encoder threw): nothing queued. No-op when none is open. */
  abortFrame (): void {
    abortFrame()
  }

  /** Closes the connection. Queued transfers are dropped; the handler's `onClose` runs once. */
  destroy (error?: RpcError): void {
    if (this.#closed) return
    this.#closed = true
    // Ending for a reason (a refused negotiation): the peer's close that follows is not the reason.
    if (this.#endingError !== undefined) error = this.#endingError
    this.#closeError = error
    this.#decoder.stop()
    this.#reportHeld()
    this.#queue.close(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
    this.socket.destroy()
    if (this.#stream !== this.socket) this.#stream.destroy()
    this.#held = null
    this.#probed = null
    this.#probedBytes = 0
    const setup = this.#setup
    this.#setup = null
    setup?.handshake.abort?.()
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

  /**
   * Reads no more frames (the rest of the current read and later reads are
   * dropped), without ending the socket: answers already due still go out.
   */
  stopReading (): void {
    if (this.#closed) return
    this.#decoder.stop()
    this.#reportHeld()
  }

  /** Writes the queued frames, then ends the socket (after a fatal error reply, or a server's drained shutdown). */
  endAfterFlush (error?: RpcError): void {
    if (this.#closed || this.#ending) return
    this.#ending = true
    this.#endingError = error
    this.#decoder.stop()
    this.#reportHeld()
    this.#queue.flushNow()
    // Nothing may follow the end: later sends are dropped, not written after it.
    this.#queue.close(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection ending'))
    this.#stream.end(() => this.destroy(error))
  }

  stats (): ConnectionStats {
    const tls = (this.#stream as Partial<Pick<TLSSocket, 'getProtocol'>>).getProtocol?.() ?? null
    return { ...this.#queue.stats(), bytesRead: this.#bytesRead, framesRead: this.#framesRead, bytesWritten: this.socket.bytesWritten, readPath: this.#readPath, tls }
  }

  #onSocketData (chunk: Buffer): void {
    if (this.#closed) return
    this.#bytesRead += chunk.length
    this.#reads++
    this.#activity++
    this.#poller?.touch()
    if (this.#channel !== null) {
      this.#channel.input(chunk)
      return
    }
    if (this.#held !== null) {
      this.#held.push(chunk)
      return
    }
    if (this.#preamble !== null) {
      chunk = this.#takePreamble(chunk)
      if (chunk.length === 0 || this.#closed) return
    }
    this.#decode(chunk)
  }

  #decode (chunk: Buffer): void {
    // Answers produced while this read's frames are handled go out in one write.
    this.#queue.beginRead()
    try {
      const error = this.#decoder.pushRanges(chunk, this.#onFrame)
      if (this.#holdRest) {
        // An asynchronous set-up step stopped the decoding: the rest waits for it.
        this.#holdRest = false
        const rest = chunk.subarray(this.#decoder.consumed)
        if (rest.length > 0) this.#held?.push(rest)
      }
      if (error !== null) this.#framingError(error)
      else if (this.#budget !== null && this.#decoder.heldBytes !== this.#heldReported) this.#reportHeld()
    } finally {
      this.#queue.endRead()
    }
  }

  // The stream's framing broke: the handler may take over (and end the connection itself).
  #framingError (error: RpcError): void {
    if (this.#closed) return
    const handler = this.#setup === null ? this.#handler : null
    if (handler?.onFramingError !== undefined && !this.#ending && handler.onFramingError(error)) {
      this.stopReading()
      return
    }
    // The answers to the frames before the bad bytes (queued while this read
    // was handled) still go out, as for a frame the owner refuses.
    this.flushAndDestroy(error)
  }

  // Tells the inbound budget what the decoder holds now (it may close this connection, or another).
  #reportHeld (): void {
    if (this.#budget === null) return
    const held = this.#decoder.heldBytes
    if (held === this.#heldReported) return
    this.#heldReported = held
    this.#budget.update(this, held)
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
      // A bad preamble is closed without a reply.
      this.destroy(verdict)
      return chunk.subarray(chunk.length)
    }
    return chunk.subarray(take)
  }

  #dispatch (buf: Buffer, start: number, end: number): boolean {
    if (this.#closed || this.#ending) return false
    this.#framesRead++
    if (this.#setup === null) {
      const handler = this.#handler
      if (handler === null) {
        this.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, 'frame received before the connection was ready'))
        return false
      }
      return handler.onFrame(buf, start, end) !== false && !this.#closed
    }
    // A synchronous step runs now, so that a handshake that ends in this
    // read lets the frames after it through at once (and under the regular
    // frame limit). An asynchronous one (an authenticator, a TLS step)
    // holds every byte after its frame until it is applied: the step may
    // change what those bytes are (TLS records, not frames).
    const setup = this.#setup
    let step: HandshakeStep<unknown> | Promise<HandshakeStep<unknown>>
    try {
      step = setup.handshake.onFrame(Buffer.from(buf.subarray(start, end)))
    } catch (err) {
      step = setupFailed(err)
    }
    // A step that switches the stream is applied as an asynchronous one is: the rest of the chunk is the new stream's.
    if (!(step instanceof Promise) && step.upgrade === undefined) {
      this.#applyStep(setup, step)
      return !this.#closed
    }
    this.#held = []
    this.#holdRest = true
    this.#heldRaw = this.#channel === null
    this.socket.pause()
    const apply = (s: HandshakeStep<unknown>): void => {
      this.#applyStep(setup, s)
      this.#releaseHeld()
    }
    if (step instanceof Promise) step.then(apply, (err: unknown) => apply(setupFailed(err)))
    else queueMicrotask(() => apply(step))
    return false
  }

  // Decodes the bytes held while a set-up step ran (or feeds them to the secure channel it opened).
  #releaseHeld (): void {
    const held = this.#held
    this.#held = null
    if (held === null || this.#closed) return
    this.#resumeUnlessHeld()
    if (this.#heldRaw && this.#channel !== null) {
      // The socket's bytes, read before the switch: the channel's input,
      // all of them (what it decrypts meets any new hold on its own).
      for (const chunk of held) this.#channel.input(chunk)
      return
    }
    for (let i = 0; i < held.length; i++) {
      if (this.#closed || this.#ending) return
      if (this.#held !== null) {
        // Another asynchronous step began: the rest waits for it.
        for (let j = i; j < held.length; j++) (this.#held as Buffer[]).push(held[j]!)
        return
      }
      this.#decode(held[i]!)
    }
  }

  #applyStep (setup: SetupState, step: HandshakeStep<unknown>): void {
    if (this.#closed) return
    if (step.send !== undefined) this.#writeRaw(step.send)
    if (step.upgrade !== undefined) {
      try {
        this.#upgrade(step.upgrade(this.socket))
      } catch (err) {
        this.destroy(setupFailed(err).error)
        return
      }
    }
    // Through the new stream: the first frames it carries, a refusal too.
    if (step.sendUpgraded !== undefined) this.#writeRaw(step.sendUpgraded)
    if (step.error !== undefined) {
      this.#setup = null
      setup.reject(step.error)
      this.endAfterFlush(step.error)
      return
    }
    if (step.done !== undefined) {
      this.#setup = null
      this.#decoder.maxFrameBytes = this.#maxFrameBytes
      setup.resolve(step.done)
      this.#queue.release()
    }
  }

  // From now on frames travel on the channel's stream (TLS over the socket).
  #upgrade (channel: SecureChannel): void {
    this.#channel = channel
    const stream = channel.stream as Socket
    this.#stream = stream
    this.#queue.switchSink(stream)
    this.#watch(stream)
    stream.on('data', (chunk: Buffer) => {
      if (this.#closed) return
      // Decrypted bytes wait behind an asynchronous set-up step as the socket's do.
      if (this.#held !== null) this.#held.push(chunk)
      else this.#decode(chunk)
    })
  }

  // Set-up frames bypass the (held) transfer queue.
  #writeRaw (frames: Buffer[][]): void {
    const slices: Buffer[] = []
    for (const frame of frames) for (const slice of frame) slices.push(slice)
    this.#stream.write(slices.length === 1 ? slices[0]! : Buffer.concat(slices))
  }
}
