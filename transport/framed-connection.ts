import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Deframer } from '../codec/frame-decoder.js'
import type { Handshake } from '../codec/protocol.js'
import type { FrameSink } from '../codec/frame-sink.js'
import type { ByteStream, ByteStreamListener } from './byte-stream.js'
import { ConnectionCounters } from './connection-counters.js'
import { HeldBytes } from './held-bytes.js'
import { ReadGate, ReadStop } from './read-gate.js'
import { ReadTurns } from './read-turns.js'
import { ConnectionEnd } from './connection-end.js'
import { SetUp, deframerOf } from './set-up.js'
import { TransferQueue, type OutboundTransfer } from './transfer-queue.js'
import { abortFrame, beginFrame, endFrame, writeFrame, type FrameEncoder } from './frame-writer.js'
import type { ConnectionHandler, ConnectionOptions, ConnectionStats } from './connection-options.js'

export type { Handshake, HandshakeStep } from '../codec/protocol.js'
export { PROBE_BYTES } from './read-gate.js'
export { DEFAULT_MAX_ANSWER_BYTES_PER_READ, DEFAULT_MAX_FRAMES_PER_READ } from './read-turns.js'
export type { ConnectionHandler, ConnectionOptions, ConnectionStats } from './connection-options.js'
export type { FrameEncoder } from './frame-writer.js'

/**
 * One framed connection over a ByteStream: it assembles frames from the
 * bytes read and writes frames through its transfer queue. Its parts do the
 * rest: the set-up (SetUp), the reasons it is not read (ReadGate), the
 * frame budget per read (ReadTurns), the ways it closes (ConnectionEnd),
 * its counters (ConnectionCounters) and what it holds for the inbound
 * budget (HeldBytes). Knows nothing about calls, ids or deadlines: the
 * owner reacts to frames and destroys the connection when its timers say
 * so. No error escapes a stream callback: bad bytes end the connection
 * with an error passed to `onClose`.
 */
export class FramedConnection {
  readonly #decoder: Deframer
  readonly #queue: TransferQueue
  readonly #gate: ReadGate
  readonly #options: ConnectionOptions
  #handler: ConnectionHandler | null = null
  #setup: SetUp<unknown> | null = null
  readonly #end: ConnectionEnd
  readonly #counters: ConnectionCounters
  readonly #held: HeldBytes
  readonly #turns: ReadTurns
  /** Called on each 'drain' of the stream (the kernel took what was buffered), after the queue wrote more; null: none. */
  onDrain: (() => void) | null = null
  readonly #onFrame = (buf: Buffer, start: number, end: number): boolean => this.#dispatch(buf, start, end)
  readonly #peerEnded = (): void => { this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed by peer')) }
  /** What the stream reports: reads, writability, the peer's end, errors and the close. */
  readonly #listener: ByteStreamListener = {
    onRead: (buf, start, end) => this.#onRead(buf, start, end),
    onWritable: () => this.#onWritable(),
    // An RpcError is already the reason (a secure channel that read the peer's refusal).
    onError: (err) => this.destroy(err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECTION_CLOSED, `socket error: ${err.message}`, { cause: err })),
    // While the rest of a read waits for its turn on a stream not paused for it, the end waits behind it.
    onEnd: () => { if (this.#gate.lazyTurn) this.#gate.keepEnd(this.#peerEnded); else this.#peerEnded() },
    onClose: () => this.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
  }

  constructor (stream: ByteStream, options: ConnectionOptions) {
    this.#options = options
    this.#decoder = deframerOf(options.framing, options.maxFrameBytes)
    this.#queue = new TransferQueue(stream, {
      maxOutboundBytes: options.maxOutboundBytes,
      coalesceMicrotasks: options.coalesceMicrotasks ?? true,
      onBackedUp: options.onBackedUp,
      // Only an owner that judges a suspended connection (a server) stops reading past the bound; a client's send fails instead.
      onOverBound: options.onReadingSuspended === undefined ? undefined : () => { if (this.#gate.suspend()) options.onReadingSuspended?.() }
    })
    this.#counters = new ConnectionCounters(options.busyPoller ?? null)
    const connection = this
    this.#gate = new ReadGate(stream, {
      listener: this.#listener,
      get probeRefused () { return connection.#end.closed || connection.#end.ending || connection.#setup !== null },
      get isClosed () { return connection.#end.closed },
      reportHeld: () => this.#reportHeld(),
      decodeKept: (chunk) => { if (!this.#end.closed && !this.#end.ending) this.#decode(chunk) }
    })
    this.#held = new HeldBytes(options.inboundBudget ?? null, this, this.#decoder, this.#gate)
    this.#turns = new ReadTurns(this.#gate, options.maxFramesPerRead, options.maxAnswerBytesPerRead)
    this.#end = new ConnectionEnd({
      decoder: this.#decoder,
      gate: this.#gate,
      queue: this.#queue,
      takeSetUp: () => { const setup = this.#setup; this.#setup = null; return setup },
      reportHeld: () => this.#reportHeld(),
      closed: (error) => this.#handler?.onClose(error)
    })
    stream.listen(this.#listener)
  }

  /** Starts delivering frames to `handler`. */
  attach (handler: ConnectionHandler): void { this.#handler = handler }

  /** Moves on every read, send and 'drain': the owner compares it between idle scans (this class needs no clock). */
  get activity (): number { return this.#counters.activity }

  /** Reads handled so far: frames delivered under the same count came in the same read. */
  get reads (): number { return this.#counters.reads }

  /** Frames received so far (set-up frames included): a partial frame seen under the same count is the same frame. */
  get framesRead (): number { return this.#counters.framesRead }

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
  get writeQueueBytes (): number { return this.#gate.stream.writeQueueBytes }

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
  get drains (): number { return this.#counters.drains }

  get isClosed (): boolean { return this.#end.closed }

  /**
   * True while bytes wait to go out. A half-received frame does not make a
   * connection busy: a peer that stops inside a frame is idle (see
   * `hasPartialFrame` and `framesRead` for the owner's frame deadline).
   */
  get isBusy (): boolean { return !this.#queue.isIdle }

  /**
   * Runs `handshake` to completion (SetUp): regular sends are held until it
   * is done, the bytes read past its last frame are the first regular ones.
   * Rejects with its error or the close reason; the owner's deadline destroys the connection.
   */
  handshake<T> (handshake: Handshake<T>): Promise<T> {
    this.#queue.hold()
    const maxFrameBytes = Math.min(this.#decoder.maxFrameBytes, handshake.maxFrameBytes ?? Infinity)
    const parts = { socket: this.#options.socket ?? null, end: this.#end, gate: this.#gate, queue: this.#queue, counters: this.#counters, held: this.#held }
    const setup = new SetUp<T>(handshake, deframerOf(this.#options.framing, maxFrameBytes), parts, (rest) => this.#setUpDone(rest))
    this.#setup = setup as SetUp<unknown>
    setup.start()
    return setup.promise
  }

  // The set-up succeeded: regular frames flow from `rest` (read past its last frame) on.
  #setUpDone (rest: Buffer[]): void {
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
  }

  /** Sends one frame through the transfer queue; false when the outbound bound is exceeded. */
  send (transfer: OutboundTransfer): boolean {
    this.#counters.sent()
    return this.#queue.enqueue(transfer)
  }

  /**
   * Queues the frame at `buffer[start, start + bytes)`, a range of a buffer
   * that is never written over (shared-frame.ts: a push encoded once for
   * many connections), as one more run: consecutive ranges of the buffer
   * form one run, written as one range. True when queued, false when over
   * the outbound bound (dropped); null when the queue cannot take a run of
   * a shared buffer now (held for the set-up, waiting for 'drain', bytes of
   * earlier writes still in the stream: it must not pin the buffer; or
   * closed): `send` the frame as a transfer instead. The write that stalls
   * (the kernel refuses its rest, or a native send is still in flight)
   * keeps its range, so a connection that stops reading holds at most that
   * one buffer beyond what its bounds count.
   */
  sendRange (buffer: Buffer, start: number, bytes: number): boolean | null {
    if (this.#end.closed || !this.#queue.takesRuns) return null
    this.#counters.sent()
    return this.#queue.commitRun(buffer, start, bytes)
  }

  /**
   * Encodes one frame with `encoder.encode(a, b, sink)` and queues it (see
   * frame-writer.ts): in place, in the coalesced outbound buffer (the frames
   * of one turn leave in one write), once the set-up is done. False: the
   * connection is closed, or over its outbound bound (the frame is dropped;
   * the caller decides what follows). A throw from the encoder queues
   * nothing and reaches the caller.
   */
  writeFrame<A, B> (encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
    if (this.#end.closed) return false
    this.#counters.sent()
    return writeFrame(this.#queue, encoder, a, b)
  }

  /**
   * Opens a frame to be encoded in place (see `writeFrame`) by a caller that
   * runs the encoder in its own stack: encode into the sink, then
   * `endFrame`, or `abortFrame` if the encoder threw. Null: it cannot go in
   * place now (encode it into a buffer of its own and `send` it).
   */
  beginFrame (): FrameSink | null {
    if (this.#end.closed) return null
    return beginFrame(this.#queue)
  }

  /** Queues the frame `beginFrame` opened (nothing added: nothing queued); false when over the outbound bound (dropped). */
  endFrame (): boolean {
    this.#counters.sent()
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
  stopReading (): void { this.#end.stopReading() }

  /** Writes the queued frames, then ends the stream (after a fatal error reply, or a server's drained shutdown). */
  endAfterFlush (error?: RpcError): void {
    // A drained shutdown: a read's rest waiting for its turn is answered first (ReadTurns.flushNow).
    if (error === undefined && !this.#end.ending) this.#turns.flushNow()
    this.#end.endAfterFlush(error)
  }

  stats (): ConnectionStats {
    const stream = this.#gate.stream
    return { ...this.#queue.stats(), bytesRead: this.#counters.bytesRead, framesRead: this.#counters.framesRead, bytesWritten: stream.bytesWritten, readPath: this.#options.readPath ?? 'onread', tls: stream.secureProtocol }
  }

  #onRead (buf: Buffer, start: number, end: number): void {
    if (this.#end.closed) return
    this.#counters.read(end - start)
    if (this.#setup !== null) {
      this.#setup.input(buf, start, end)
      return
    }
    // The read's budget holds reading and the stream read again before the turn came: this read waits behind the rest.
    if (this.#gate.lazyTurn) {
      this.#gate.keepLate(start === 0 && end === buf.length ? buf : buf.subarray(start, end))
      return
    }
    // The range as it came (a read of the stream's slab): no view of it per read.
    this.#decode(buf, start, end)
  }

  // The stream took what it held: the peer read what we sent (progress, for the owner's idle scan).
  #onWritable (): void {
    this.#counters.drained()
    this.#queue.onSocketDrain()
    if (this.#gate.has(ReadStop.Suspended) && this.#queue.backlogBytes <= this.#queue.maxOutboundBytes) this.#gate.start(ReadStop.Suspended)
    this.onDrain?.()
  }

  // Decodes chunk[from, to) (default: all of it).
  #decode (chunk: Buffer, from = 0, to = chunk.length): void {
    // Answers produced while this read's frames are handled go out in one write.
    this.#queue.beginRead()
    const turns = this.#turns
    turns.startRead(this.#queue.outputBytes)
    try {
      const error = this.#decoder.pushRanges(chunk, this.#onFrame, from, to)
      if (error !== null) this.#end.framingError(error, this.#handler)
      // The read's budget (frames, answer bytes) is spent: the rest waits for the next turn (ReadTurns).
      else if (turns.spent) { if (!this.#end.closed && !this.#end.ending) this.#keepRest(chunk, from, to) }
      else if (this.#held.moved) this.#reportHeld()
    } finally {
      this.#queue.endRead()
    }
  }

  // The budget stopped decoding chunk[from, to): what is left of it waits for the next turn.
  #keepRest (chunk: Buffer, from: number, to: number): void {
    const range = from === 0 && to === chunk.length ? chunk : chunk.subarray(from, to)
    this.#turns.keepRest(range, this.#decoder.consumed - from)
  }

  // Tells the inbound budget what the decoder, a set-up and the read gate hold now (it may close this connection, or another).
  #reportHeld (): void { this.#held.report(this.#setup?.heldBytes ?? 0) }

  #dispatch (buf: Buffer, start: number, end: number): boolean {
    if (this.#end.closed || this.#end.ending) return false
    this.#counters.framesRead++
    const handler = this.#handler
    if (handler === null) {
      this.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, 'frame received before the connection was ready'))
      return false
    }
    return handler.onFrame(buf, start, end) !== false && !this.#end.closed && this.#turns.frame(this.#queue.outputBytes)
  }
}
