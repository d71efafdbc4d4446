import type { Socket } from 'node:net'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { FrameDecoder, isScanFraming, type AnyFraming, type Deframer } from '../codec/frame-decoder.js'
import { ScanDecoder } from '../codec/scan-decoder.js'
import type { Handshake } from '../codec/protocol.js'
import type { FrameSink } from '../codec/frame-sink.js'
import type { BusyPoller } from './busy-poll.js'
import type { ByteStream, ByteStreamListener } from './byte-stream.js'
import type { InboundBudget } from './inbound-budget.js'
import { ReadGate, ReadStop } from './read-gate.js'
import { ReadTurns } from './read-turns.js'
import { ConnectionEnd } from './connection-end.js'
import { SetUp, type SetUpHost } from './set-up.js'
import { TransferQueue, type OutboundTransfer } from './transfer-queue.js'
import { abortFrame, beginFrame, endFrame, writeFrame, type FrameEncoder } from './frame-writer.js'
import type { ConnectionHandler, ConnectionOptions, ConnectionStats } from './connection-options.js'

export type { Handshake, HandshakeStep } from '../codec/protocol.js'
export { PROBE_BYTES } from './read-gate.js'
export { DEFAULT_MAX_ANSWER_BYTES_PER_READ, DEFAULT_MAX_FRAMES_PER_READ } from './read-turns.js'
export type { ConnectionHandler, ConnectionOptions, ConnectionStats } from './connection-options.js'
export type { FrameEncoder } from './frame-writer.js'

function makeDeframer (framing: AnyFraming, maxFrameBytes: number | undefined): Deframer {
  return isScanFraming(framing) ? new ScanDecoder(framing, maxFrameBytes) : new FrameDecoder(framing, maxFrameBytes)
}

/**
 * One framed connection over a ByteStream: inbound frame assembly, the
 * outbound transfer queue, activity counters and the ways it closes. Its
 * set-up (SetUp) and the reasons it is not read (ReadGate) are parts of
 * their own. Knows nothing about calls, ids or deadlines: the owner reacts
 * to frames and destroys the connection when its timers say so. No error
 * escapes a stream callback: bad bytes end the connection with an error
 * passed to `onClose`.
 */
export class FramedConnection {
  readonly #decoder: Deframer
  readonly #queue: TransferQueue
  readonly #gate: ReadGate
  readonly #options: ConnectionOptions
  #handler: ConnectionHandler | null = null
  #setup: SetUp<unknown> | null = null
  // The stream frames travel on: the socket's, or the secure channel set-up switched to.
  #stream: ByteStream
  readonly #end: ConnectionEnd
  #bytesRead = 0
  #framesRead = 0
  #reads = 0
  #activity = 0
  #drains = 0
  /** Called on each 'drain' of the stream (the kernel took what was buffered), after the queue wrote more; null: none. */
  onDrain: (() => void) | null = null
  readonly #budget: InboundBudget | null
  #heldReported = 0
  readonly #poller: BusyPoller | null
  readonly #turns: ReadTurns
  readonly #onFrame = (buf: Buffer, start: number, end: number): boolean => this.#dispatch(buf, start, end)
  /** What the stream reports: reads, writability, the peer's end, errors and the close. */
  readonly #listener: ByteStreamListener = {
    onRead: (buf, start, end) => this.#onRead(buf, start, end),
    onWritable: () => this.#onWritable(),
    // An RpcError is already the reason (a secure channel that read the peer's refusal).
    onError: (err) => this.destroy(err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECTION_CLOSED, `socket error: ${err.message}`, { cause: err })),
    onEnd: () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed by peer')),
    onClose: () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
  }

  constructor (stream: ByteStream, options: ConnectionOptions) {
    this.#stream = stream
    this.#options = options
    this.#decoder = makeDeframer(options.framing, options.maxFrameBytes)
    this.#queue = new TransferQueue(stream, {
      maxOutboundBytes: options.maxOutboundBytes,
      coalesceMicrotasks: options.coalesceMicrotasks ?? true,
      onBackedUp: options.onBackedUp,
      // Only an owner that judges a suspended connection (a server) stops reading past the bound; a client's send fails instead.
      onOverBound: options.onReadingSuspended === undefined ? undefined : () => this.#suspendReading()
    })
    this.#budget = options.inboundBudget ?? null
    this.#poller = options.busyPoller ?? null
    const connection = this
    this.#gate = new ReadGate(stream, {
      listener: this.#listener,
      get probeRefused () { return connection.#end.closed || connection.#end.ending || connection.#setup !== null },
      get isClosed () { return connection.#end.closed },
      reportHeld: () => this.#reportHeld(),
      decodeKept: (chunk) => { if (!this.#end.closed && !this.#end.ending) this.#decode(chunk) }
    })
    this.#turns = new ReadTurns(this.#gate, options.maxFramesPerRead, options.maxAnswerBytesPerRead)
    this.#end = new ConnectionEnd({
      decoder: this.#decoder,
      gate: this.#gate,
      queue: this.#queue,
      get stream () { return connection.#stream },
      takeSetUp: () => {
        const setup = this.#setup
        this.#setup = null
        return setup
      },
      reportHeld: () => this.#reportHeld(),
      closed: (error) => this.#handler?.onClose(error)
    })
    stream.listen(this.#listener)
  }

  /** Starts delivering frames to `handler`. */
  attach (handler: ConnectionHandler): void { this.#handler = handler }

  /**
   * A counter that moves on every read, every send and every 'drain' (the
   * peer took bytes we had queued). The owner compares it between idle
   * scans, so this class needs no clock.
   */
  get activity (): number { return this.#activity }

  /** Reads handled so far: frames delivered under the same count came in the same read. */
  get reads (): number { return this.#reads }

  /** Frames received so far (set-up frames included): a partial frame seen under the same count is the same frame. */
  get framesRead (): number { return this.#framesRead }

  /** True while part of a frame has arrived and the rest has not. */
  get hasPartialFrame (): boolean { return this.#decoder.hasPartialFrame || (this.#setup?.hasPartialFrame ?? false) }

  /** Bytes received of the frame being received (0 when none is). */
  get partialFrameBytes (): number { return this.#decoder.bufferedBytes + (this.#setup?.partialFrameBytes ?? 0) }

  /** Bytes queued or buffered in the stream that the peer has not taken yet. */
  get outboundBytes (): number { return this.#queue.backlogBytes }

  /**
   * Bytes the kernel still has to take from writes already handed to it. It
   * falls as the peer reads, during one large write too (when
   * `outboundBytes` stays put until the write completes): the owner's
   * measure of a slow reader's progress.
   */
  get writeQueueBytes (): number { return this.#stream.writeQueueBytes }

  /** The bound on this connection's unsent bytes. */
  get maxOutboundBytes (): number { return this.#queue.maxOutboundBytes }

  /** True while the transfer queue waits for 'drain'. */
  get isBackedUp (): boolean { return this.#queue.isWaitingDrain }

  /** Stops reading (backpressure: the peer's requests wait in its own buffers and the kernel's). */
  pauseReading (): void { if (!this.#end.closed) this.#gate.stop(ReadStop.Paused) }

  /** Reads again after `pauseReading` (unless another reason holds reading). */
  resumeReading (): void { if (!this.#end.closed) this.#gate.start(ReadStop.Paused) }

  /** Paused by `pauseReading` (the outbound budget's reason). */
  get isReadingPaused (): boolean { return this.#gate.has(ReadStop.Paused) }

  /** Stops reading for the application's reason (`ConnectionHandle.pauseReading`), independent of `pauseReading`. */
  holdReading (): void { if (!this.#end.closed) this.#gate.stop(ReadStop.Held) }

  /** Ends `holdReading`; the stream reads again unless another reason holds it. */
  releaseReading (): void { if (!this.#end.closed) this.#gate.start(ReadStop.Held) }

  /** Held by `holdReading`. */
  get isReadingHeld (): boolean { return this.#gate.has(ReadStop.Held) }

  /** Not read because its unsent bytes passed `maxOutboundBytes` (the kernel left more than that); reads again once the peer has taken enough. */
  get isReadingSuspended (): boolean { return this.#gate.has(ReadStop.Suspended) }

  /** Reads on while reading is stopped, to see the peer's end (see ReadGate.probe); false when there is nothing to probe. */
  probeRead (): boolean { return this.#gate.probe() }

  /** Bytes a probe read set aside while reading is stopped (counted in the inbound budget). */
  get probedBytes (): number { return this.#gate.asideBytes }

  /** Times the stream drained (the kernel took everything it buffered): the peer's progress, with `writeQueueBytes` falling. */
  get drains (): number { return this.#drains }

  // The queue passed the bound: nothing more is read until the peer takes enough.
  #suspendReading (): void {
    if (this.#end.closed || this.#gate.has(ReadStop.Suspended)) return
    this.#gate.stop(ReadStop.Suspended)
    this.#options.onReadingSuspended?.()
  }

  get isClosed (): boolean { return this.#end.closed }

  get closeError (): RpcError | undefined { return this.#end.closeError }

  /**
   * True while bytes wait to go out. A half-received frame does not make a
   * connection busy: a peer that stops inside a frame is idle (see
   * `hasPartialFrame` and `framesRead` for the owner's frame deadline).
   */
  get isBusy (): boolean { return !this.#queue.isIdle }

  /**
   * Runs `handshake` to completion (SetUp). Regular sends queue (held) until
   * it is done; the bytes read past its last frame are then decoded as the
   * first regular ones. Rejects with the handshake's error or the
   * connection's close reason; the owner enforces the deadline by
   * destroying the connection.
   */
  handshake<T> (handshake: Handshake<T>): Promise<T> {
    this.#queue.hold()
    const maxFrameBytes = Math.min(this.#decoder.maxFrameBytes, handshake.maxFrameBytes ?? Infinity)
    const setup = new SetUp<T>(handshake, this.#stream, makeDeframer(this.#options.framing, maxFrameBytes), this.#setUpHost())
    this.#setup = setup as SetUp<unknown>
    setup.start()
    return setup.promise
  }

  // What the set-up may do to this connection.
  #setUpHost (): SetUpHost {
    const connection = this
    return {
      socket: this.#options.socket ?? null,
      get isClosed () { return connection.#end.closed },
      get isEnding () { return connection.#end.ending },
      frameRead: () => { this.#framesRead++ },
      switchStream: (stream) => {
        this.#stream = stream
        this.#queue.switchSink(stream)
        this.#gate.switchStream(stream)
        stream.listen(this.#listener)
      },
      holdReads: (stop) => {
        if (stop) this.#gate.stop(ReadStop.SetUp)
        else this.#gate.start(ReadStop.SetUp)
      },
      reportHeld: () => this.#reportHeld(),
      finished: (rest) => {
        this.#setup = null
        this.#queue.release()
        this.#reportHeld()
        // Read already: decoded now, whatever reading does next (as the rest
        // of a read is), until the frame budget keeps the rest for later turns.
        for (let i = 0; i < rest.length; i++) {
          if (this.#end.closed || this.#end.ending) return
          if (this.#turns.waiting) {
            this.#gate.keep(rest.slice(i))
            return
          }
          this.#decode(rest[i]!)
        }
      },
      framingError: (error) => this.flushAndDestroy(error),
      endAfterFlush: (error) => this.endAfterFlush(error),
      destroy: (error) => this.destroy(error)
    }
  }

  /** Sends one frame through the transfer queue; false when the outbound bound is exceeded. */
  send (transfer: OutboundTransfer): boolean {
    this.#activity++
    this.#poller?.touch()
    return this.#queue.enqueue(transfer)
  }

  /**
   * Encodes one frame with `encoder.encode(a, b, sink)` and queues it.
   * In place when it can (the set-up is done and the connection is open:
   * it cannot be dropped any more then): the room the encoder reserves
   * is in the connection's coalesced outbound buffer (the frames of one
   * turn leave in one write), and the slices it appends follow it without
   * a copy; else into a buffer of its own, queued as a transfer. An encoder
   * that adds nothing queues nothing (true). False: the connection is
   * closed, or over its outbound bound (the frame is dropped; the caller
   * decides what follows). An encoder that throws leaves nothing queued,
   * and the throw reaches the caller.
   */
  writeFrame<A, B> (encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
    if (this.#end.closed) return false
    this.#activity++
    this.#poller?.touch()
    return writeFrame(this.#queue, encoder, a, b)
  }

  /**
   * Opens a frame to be encoded in place (see `writeFrame`), for a caller
   * that runs the encoder itself (the server's answers, the client's
   * requests: in their own stack the encoder is inlined): encode into the
   * sink, then `endFrame`, or `abortFrame` if the encoder threw. Null when
   * the frame cannot go in place now: encode it into a buffer of its own
   * and `send` it.
   */
  beginFrame (): FrameSink | null {
    if (this.#end.closed) return null
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
  destroy (error?: RpcError): void { this.#end.destroy(error) }

  /** Closes the connection with an RST (the peer sees ECONNRESET), as `destroy` otherwise. */
  reset (error?: RpcError): void { this.#end.reset(error) }

  /** Hands the queued frames to the stream (the kernel takes what fits, and sends it even after the close), then destroys the connection at once. */
  flushAndDestroy (error?: RpcError): void { this.#end.flushAndDestroy(error) }

  /**
   * Reads no more frames (the rest of the current read and later reads are
   * dropped), without ending the socket: answers already due still go out.
   */
  stopReading (): void {
    if (this.#end.closed) return
    this.#decoder.stop()
    this.#reportHeld()
  }

  /** Writes the queued frames, then ends the stream (after a fatal error reply, or a server's drained shutdown). */
  endAfterFlush (error?: RpcError): void {
    // A drained shutdown: a read's rest waiting for its turn is answered first (ReadTurns.flushNow).
    if (error === undefined && !this.#end.ending) this.#turns.flushNow()
    this.#end.endAfterFlush(error)
  }

  stats (): ConnectionStats {
    const stream = this.#stream
    return { ...this.#queue.stats(), bytesRead: this.#bytesRead, framesRead: this.#framesRead, bytesWritten: stream.bytesWritten, readPath: this.#options.readPath ?? 'onread', tls: stream.secureProtocol }
  }

  #onRead (buf: Buffer, start: number, end: number): void {
    if (this.#end.closed) return
    this.#bytesRead += end - start
    this.#reads++
    this.#activity++
    this.#poller?.touch()
    if (this.#setup !== null) {
      this.#setup.input(buf, start, end)
      return
    }
    this.#decode(start === 0 && end === buf.length ? buf : buf.subarray(start, end))
  }

  // The stream took what it held: the peer read what we sent (progress, for the owner's idle scan).
  #onWritable (): void {
    this.#activity++
    this.#drains++
    this.#queue.onSocketDrain()
    if (this.#gate.has(ReadStop.Suspended) && this.#queue.backlogBytes <= this.#queue.maxOutboundBytes) this.#gate.start(ReadStop.Suspended)
    this.onDrain?.()
  }

  #decode (chunk: Buffer): void {
    // Answers produced while this read's frames are handled go out in one write.
    this.#queue.beginRead()
    const turns = this.#turns
    turns.startRead(this.#queue.outputBytes)
    try {
      const error = this.#decoder.pushRanges(chunk, this.#onFrame)
      if (error !== null) this.#framingError(error)
      // The read's budget (frames, answer bytes) is spent: the rest waits for the next turn (ReadTurns).
      else if (turns.spent) { if (!this.#end.closed && !this.#end.ending) turns.keepRest(chunk, this.#decoder.consumed) }
      else if (this.#budget !== null && this.#decoder.heldBytes !== this.#heldReported) this.#reportHeld()
    } finally {
      this.#queue.endRead()
    }
  }

  // The stream's framing broke: the handler may take over (and end the connection itself).
  #framingError (error: RpcError): void {
    if (this.#end.closed) return
    const handler = this.#handler
    if (handler?.onFramingError !== undefined && !this.#end.ending && handler.onFramingError(error)) {
      this.stopReading()
      return
    }
    // The answers to the frames before the bad bytes (queued while this read
    // was handled) still go out, as for a frame the owner refuses.
    this.flushAndDestroy(error)
  }

  // Tells the inbound budget what the decoder, a set-up and a probe hold now (it may close this connection, or another).
  #reportHeld (): void {
    if (this.#budget === null) return
    const held = this.#decoder.heldBytes + this.#gate.asideBytes + (this.#setup?.heldBytes ?? 0)
    if (held === this.#heldReported) return
    this.#heldReported = held
    this.#budget.update(this, held)
  }

  #dispatch (buf: Buffer, start: number, end: number): boolean {
    if (this.#end.closed || this.#end.ending) return false
    this.#framesRead++
    const handler = this.#handler
    if (handler === null) {
      this.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, 'frame received before the connection was ready'))
      return false
    }
    return handler.onFrame(buf, start, end) !== false && !this.#end.closed && this.#turns.frame(this.#queue.outputBytes)
  }
}
