import Denque from 'denque'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { ByteStream } from './byte-stream.js'
import { FrameChunk } from '../codec/frame-sink.js'
import { OWN_CHUNK_BYTES, SlabRun, copyIn, framesOf, slab, writeRun } from './slab-run.js'
import { DEFAULT_BATCH_FRAMES, DEFAULT_MAX_OUTBOUND_BYTES, OVER_BOUND_FACTOR, type OutboundTransfer, type TransferQueueOptions, type TransferQueueStats } from './transfer-queue-options.js'

export { DEFAULT_BATCH_FRAMES, DEFAULT_MAX_OUTBOUND_BYTES, OVER_BOUND_FACTOR } from './transfer-queue-options.js'
export type { OutboundTransfer, TransferQueueOptions, TransferQueueStats } from './transfer-queue-options.js'

/**
 * The part of a ByteStream the transfer queue writes to: the connection's
 * stream, or a test double that simulates a full kernel buffer.
 */
export type WritableSink = Pick<ByteStream, 'write' | 'writev' | 'writableLength' | 'writeRange'>

// Frames of a batch are copied into one buffer up to this size; a larger
// batch goes to writev as separate slices.
const CONCAT_BYTES = 64 * 1024
// A batch stops growing here, so one turn cannot hand the socket unbounded data.
const BATCH_BYTES = 1024 * 1024
// While waiting for 'drain', the owner hears of the queue again each time it grows by this much.
const BACKED_UP_SIGNAL_BYTES = 1024 * 1024
const RESOLVED = Promise.resolve()
// While backed up, transfers up to this size are copied into the queue's own chunk (enqueue).
const COPY_WHILE_BACKED_UP_BYTES = 4096

/**
 * The outbound transfer queue of one connection (Kudu's `outbound_transfers_`
 * with the 2020 "avoid an extra epoll cycle" change; docs/design.md,
 * 'The outbound transfer queue').
 *
 * - A lone frame, with nothing queued and the socket not backed up, is
 *   written at once, in the caller's stack: no deferral. With
 *   `coalesceMicrotasks` (what connections use), "at once" is the end of
 *   the current microtask checkpoint: the same turn, before any I/O wait,
 *   and together with whatever the other continuations of that checkpoint
 *   send.
 * - While the connection handles one read (`beginRead`..`endRead`), the
 *   frames it answers wait and go out together when the read is handled:
 *   one write per read, however many pipelined requests it carried. A read
 *   that carried one request is answered by one immediate write, as before.
 * - Frames that arrive later in the same event-loop turn are queued and
 *   written together at the end of the turn (`process.nextTick`) as one
 *   write, so N pipelined responses cost one `writev`, not N `write`s.
 * - A held batch goes out early once it has `batchFrames` frames: a long
 *   pipelined burst is answered in a few writes the peer can start on
 *   while the rest is produced, rather than all at the end of the read.
 * - Only when `write()` returns false (the kernel did not take the bytes and
 *   the socket's own buffer is over its high-water mark) does the queue wait
 *   for 'drain'.
 * - A transfer handed to the socket is always finished: Node owns its bytes
 *   and writes them out in order, so the stream stays framed. A transfer
 *   still in this queue can be dropped, and is when its call was cancelled.
 *
 * Bound: bytes queued here plus bytes the socket buffers may not exceed
 * `maxOutboundBytes`; `enqueue` then returns false and the caller decides
 * (a client fails the call, a server closes the slow reader's connection).
 * It judges what the kernel did not take: frames held for one write are
 * written before a frame past the bound is refused. With `onOverBound` (a
 * server's connections) a frame past it stops reading instead, and is
 * refused only past `OVER_BOUND_FACTOR` times the bound. A single transfer
 * is always accepted when nothing is backed up, so a frame larger than the
 * bound can still be sent.
 */
export class TransferQueue {
  #sink: WritableSink
  readonly #maxOutboundBytes: number
  readonly #batchFrames: number
  readonly #coalesceMicrotasks: boolean
  readonly #onBackedUp: (() => void) | undefined
  readonly #onOverBound: (() => void) | undefined
  readonly #queue = new Denque<OutboundTransfer>()
  #queuedBytes = 0
  // Every byte taken (queued or written at once), a running total (outputBytes).
  #outputBytes = 0
  // Frames queued: a SlabRun entry holds several.
  #queuedFrames = 0
  // In-place frames: the run still open at the back of the queue (null when
  // something else was queued after it, or it was taken).
  #run: SlabRun | null = null
  // The chunk of its own frames are encoded into while waiting for 'drain'.
  #own: FrameChunk | null = null
  // The frame an idle queue holds for its checkpoint flush (coalesceMicrotasks):
  // it would have been written at once, so the outbound bound does not count it.
  #checkpointBytes = 0
  #held = false
  #waitingDrain = false
  /** Queued bytes when the owner was last told the queue is backed up. */
  #backedUpSignalled = 0
  #flushScheduled = false
  #reading = false
  #closedError: RpcError | null = null
  readonly #flush = (): void => { this.#flushScheduled = false; this.#drainQueue() }
  // The end of a microtask checkpoint that began with an idle queue: a lone
  // frame is an immediate write; several go out as batches.
  readonly #flushMicrotask = (): void => {
    this.#flushScheduled = false
    this.#checkpointBytes = 0
    if (this.#queuedFrames === 1 && !this.#held && !this.#waitingDrain && this.#closedError === null) this.#writeLoneQueued()
    else this.#drainQueue()
  }
  #stats = { immediateWrites: 0, batchedWrites: 0, batchedFrames: 0, partialWrites: 0, drainWaits: 0, dropped: 0 }

  constructor (sink: WritableSink, options: TransferQueueOptions = {}) {
    this.#sink = sink
    this.#maxOutboundBytes = options.maxOutboundBytes ?? DEFAULT_MAX_OUTBOUND_BYTES
    this.#batchFrames = Math.max(2, options.batchFrames ?? DEFAULT_BATCH_FRAMES)
    this.#coalesceMicrotasks = options.coalesceMicrotasks === true
    this.#onBackedUp = options.onBackedUp
    this.#onOverBound = options.onOverBound
  }

  /** Queues `transfer`, writing it at once when possible; false when the bound is exceeded (nothing was queued). */
  enqueue (transfer: OutboundTransfer): boolean {
    if (this.#closedError !== null) {
      this.#stats.dropped++
      transfer.onSent?.(this.#closedError)
      return true
    }
    // Backed up, a small frame without hooks (a push, a streamed part) is copied into the own chunk, as answers
    // are encoded there: it costs its bytes, not a buffer, slice array and transfer (~8 x a 30-byte part's bytes).
    if (this.#waitingDrain && transfer.bytes <= COPY_WHILE_BACKED_UP_BYTES && transfer.beforeWrite === undefined && transfer.onSent === undefined && !this.#held) return this.#copyIn(transfer)
    const backlog = this.#queuedBytes - this.#checkpointBytes + this.#sink.writableLength
    if (backlog > 0 && backlog + transfer.bytes > this.#maxOutboundBytes && this.#overBound(transfer.bytes)) return false
    if (this.#held || this.#waitingDrain || this.#flushScheduled || this.#reading || this.#coalesceMicrotasks) {
      this.#push(transfer)
      this.#queuedFrames++
      this.#queued(transfer.bytes)
      return true
    }
    // Nothing queued and not backed up: write now, and batch whatever else
    // this turn produces.
    if (this.#dropIfCancelled(transfer)) return true
    this.#outputBytes += transfer.bytes
    this.#stats.immediateWrites++
    this.#writeTransfer(transfer)
    this.#scheduleFlush()
    return true
  }

  // A small transfer copied into the queue's own chunk (see enqueue; its slices may be plain Uint8Arrays); false when over the bound.
  #copyIn (transfer: OutboundTransfer): boolean {
    const chunk = (this.#own ??= new FrameChunk(OWN_CHUNK_BYTES))
    const start = copyIn(chunk, transfer)
    if (!this.commitRun(chunk.buffer!, start, transfer.bytes)) return false
    chunk.at = start + transfer.bytes
    return true
  }

  /** The bound on bytes queued or buffered (`maxOutboundBytes`). */
  get maxOutboundBytes (): number { return this.#maxOutboundBytes }

  /** Bytes taken since the queue was made, a running total: what one read's requests produced is its rise while they were handled. */
  get outputBytes (): number { return this.#outputBytes }

  /**
   * Where a frame with no hooks (a server's answer, a client's request
   * that needs none) may be encoded in place now: the thread's shared slab,
   * or, while the queue waits for 'drain', a chunk of its own. The encoder
   * takes room from the chunk's `at` on and `commitRun` queues it, so the
   * frame costs no buffer, slice array or transfer object of its own, and a
   * batch of such frames is written without a copy. Null when frames must
   * go through `enqueue`: the queue is held (they must stay droppable) or
   * closed.
   */
  get inPlaceChunk (): FrameChunk | null {
    if (this.#held || this.#closedError !== null) return null
    if (this.#waitingDrain) return (this.#own ??= new FrameChunk(OWN_CHUNK_BYTES))
    return slab
  }

  // A frame of `bytes` would pass the bound; true: refuse it. Frames queued
  // but not written (one read's answers, held for one write) are written
  // first, and the bound judges what the kernel left: a peer that reads
  // at once is not judged by what one read of its requests asked for.
  // Still over: with `onOverBound` the owner stops reading (the answers to
  // requests already read still come), and frames are taken up to twice
  // the bound; past that, or without it, refused. Out of line: only a queue
  // at its bound comes here.
  #overBound (bytes: number): boolean {
    if (this.#queue.length > 0 && !this.#held && !this.#waitingDrain) this.#drainQueue()
    const backlog = this.#queuedBytes - this.#checkpointBytes + this.#sink.writableLength
    if (backlog === 0 || backlog + bytes <= this.#maxOutboundBytes) return false
    if (this.#onOverBound === undefined || this.#held || backlog + bytes > OVER_BOUND_FACTOR * this.#maxOutboundBytes) return true
    this.#onOverBound()
    return false
  }

  /**
   * Queues the frame of `bytes` encoded in place at `buffer[start]` (a
   * buffer `inPlaceChunk` gave); sent as `enqueue` would send a frame. False
   * when it would pass the outbound bound (`enqueue` would refuse it):
   * nothing is queued. The caller then moves the chunk's `at` past it.
   */
  commitRun (buffer: Buffer, start: number, bytes: number): boolean {
    const backlog = this.#queuedBytes - this.#checkpointBytes + this.#sink.writableLength
    if (backlog > 0 && backlog + bytes > this.#maxOutboundBytes && this.#overBound(bytes)) return false
    let run = this.#run
    if (run === null || run.slab !== buffer || run.start + run.bytes !== start) {
      run = new SlabRun(buffer, start)
      this.#push(run)
      this.#run = run
    }
    run.bytes += bytes
    run.frames++
    this.#queuedFrames++
    // While waiting for 'drain', the owner hears of each MiB the queue grows (#queued).
    this.#queued(bytes)
    return true
  }

  // A frame was queued: write it (or schedule it) as the queue's state says.
  #queued (bytes: number): void {
    this.#queuedBytes += bytes
    this.#outputBytes += bytes
    if (this.#waitingDrain && this.#queuedBytes >= this.#backedUpSignalled + BACKED_UP_SIGNAL_BYTES) this.#signalBackedUp()
    this.#schedule(bytes)
  }

  #schedule (bytes: number): void {
    if (this.#held || this.#waitingDrain || this.#flushScheduled || this.#reading) {
      // #drainQueue writes nothing while held or waiting for drain.
      if (this.#queuedFrames >= this.#batchFrames) this.#drainQueue()
      return
    }
    if (this.#coalesceMicrotasks) {
      // Written by #flushMicrotask once this checkpoint's continuations ran.
      this.#checkpointBytes = bytes
      this.#flushScheduled = true
      // A resolved promise's then: unlike queueMicrotask, no AsyncResource per call (~30 vs ~100 ns).
      void RESOLVED.then(this.#flushMicrotask)
      return
    }
    // Nothing else queued and not backed up: write now, and batch whatever
    // else this turn produces.
    if (this.#writeLoneQueued()) this.#scheduleFlush()
  }

  // Queues an entry; its frames are counted by the caller.
  #push (transfer: OutboundTransfer): void {
    this.#queue.push(transfer)
    this.#run = null
  }

  // Takes the front entry; a slab run becomes one slice of its slab (unless `asRange`: it is written as a range, #writeRun).
  #shift (asRange = false): OutboundTransfer {
    const transfer = this.#queue.shift()!
    this.#queuedBytes -= transfer.bytes
    if (transfer instanceof SlabRun) {
      this.#queuedFrames -= transfer.frames
      if (transfer === this.#run) this.#run = null
      if (!asRange) transfer.slices = [transfer.slab.subarray(transfer.start, transfer.start + transfer.bytes)]
    } else {
      this.#queuedFrames--
    }
    return transfer
  }

  /**
   * The connection starts handling one read: frames enqueued until `endRead`
   * are held back and written together then (one write for the read's
   * answers instead of one for the first and one for the rest).
   */
  beginRead (): void { this.#reading = true }

  /** The read is handled: its answers go out now, a lone one as an immediate write, several as one batch. */
  endRead (): void {
    if (!this.#reading) return
    this.#reading = false
    if (this.#queuedFrames === 0 || this.#held || this.#waitingDrain || this.#flushScheduled || this.#closedError !== null) return
    if (this.#queuedFrames === 1) {
      // A dropped lone answer wrote nothing: nothing to coalesce behind.
      if (!this.#writeLoneQueued()) return
    } else {
      this.#drainQueue()
    }
    // Frames enqueued later in this turn: coalesced by their own microtask
    // flush, or by the end-of-turn one.
    if (!this.#coalesceMicrotasks) this.#scheduleFlush()
  }

  // The one queued frame, as an immediate write; false if it was dropped (cancelled meanwhile).
  #writeLoneQueued (): boolean {
    if (this.#sink.writeRange !== undefined && this.#queue.peekFront() instanceof SlabRun) return this.#writeRun()
    const transfer = this.#shift()
    if (this.#dropIfCancelled(transfer)) return false
    this.#stats.immediateWrites++
    this.#writeTransfer(transfer)
    return true
  }

  // Frames enqueued later in this turn wait for one write at its end.
  #scheduleFlush (): void {
    if (this.#waitingDrain || this.#flushScheduled) return
    this.#flushScheduled = true
    process.nextTick(this.#flush)
  }

  /** Holds writes (queued, not sent) until `release`: used while the connection negotiates. */
  hold (): void { this.#held = true }

  /** Ends a hold and sends what queued meanwhile. */
  release (): void {
    if (!this.#held) return
    this.#held = false
    this.#drainQueue()
  }

  /**
   * Hands every queued transfer to the socket now, even while waiting for
   * 'drain' (Node buffers what the kernel does not take): used just before
   * the socket is ended, so that nothing already produced is lost.
   */
  flushNow (): void {
    if (this.#closedError !== null) return
    this.#held = false
    this.#waitingDrain = false
    this.#checkpointBytes = 0
    const queue = this.#queue
    while (queue.length > 0) {
      this.#writeBatch()
      this.#waitingDrain = false
    }
  }

  /**
   * Writes to `sink` from now on (a TLS stream that took over the socket
   * during set-up, while the queue was held and nothing was in flight).
   */
  switchSink (sink: WritableSink): void {
    this.#sink = sink
  }

  /** The stream can take writes again (its 'drain', `ByteStreamListener.onWritable`). */
  onSocketDrain (): void {
    if (!this.#waitingDrain) return
    this.#waitingDrain = false
    // Runs already in the chunk keep it alive until written; new frames go to the shared slab again.
    this.#own = null
    this.#drainQueue()
  }

  /** Drops every queued transfer with `error`; later transfers are dropped at once. */
  close (error: RpcError): void {
    if (this.#closedError !== null) return
    this.#closedError = error
    while (this.#queue.length > 0) {
      const transfer = this.#queue.shift()!
      this.#stats.dropped += framesOf(transfer)
      transfer.onSent?.(error)
    }
    this.#run = null
    this.#own = null
    this.#queuedFrames = 0
    this.#queuedBytes = 0
    this.#checkpointBytes = 0
  }

  /** Bytes queued here plus bytes the socket still buffers. */
  get backlogBytes (): number {
    return this.#queuedBytes + this.#sink.writableLength
  }

  /** True while the queue waits for the socket's 'drain'. */
  get isWaitingDrain (): boolean { return this.#waitingDrain }

  /** True when a run `commitRun` queues now leaves this turn, straight through the stream (not held, backed up, closed, or behind bytes the stream holds): it may be of a buffer other queues share, which a write waiting in the stream would pin uncounted. */
  get takesRuns (): boolean { return !this.#held && !this.#waitingDrain && this.#closedError === null && this.#sink.writableLength === 0 }

  /** True when nothing waits here or in the socket's buffer. */
  get isIdle (): boolean {
    return this.#queue.length === 0 && this.#sink.writableLength === 0
  }

  stats (): TransferQueueStats {
    return { queuedTransfers: this.#queuedFrames, queuedEntries: this.#queue.length, queuedBytes: this.#queuedBytes, socketBufferedBytes: this.#sink.writableLength, ...this.#stats }
  }

  #drainQueue (): void {
    this.#checkpointBytes = 0
    const queue = this.#queue
    while (queue.length > 0 && !this.#held && !this.#waitingDrain && this.#closedError === null) {
      if (queue.length === 1 && !(queue.peekFront() instanceof SlabRun)) {
        const transfer = this.#shift()
        if (this.#dropIfCancelled(transfer)) continue
        this.#writeTransfer(transfer)
        continue
      }
      // One run (the frames of a read, most often) to a sink that takes ranges: a batch of one slice, as a range.
      if (queue.length === 1 && this.#sink.writeRange !== undefined) this.#writeRun()
      else this.#writeBatch()
    }
  }

  // Writes the front entry, a run, as a range of its chunk (slab-run.ts: writeRun); true.
  #writeRun (): true {
    const run = this.#shift(true) as SlabRun
    this.#countWrite(run.frames)
    this.#afterWrite(writeRun(this.#sink, run, this.#own))
    return true
  }

  #countWrite (frames: number): void {
    if (frames > 1) { this.#stats.batchedWrites++; this.#stats.batchedFrames += frames } else this.#stats.immediateWrites++
  }

  #dropIfCancelled (transfer: OutboundTransfer): boolean {
    if (transfer.beforeWrite === undefined || transfer.beforeWrite()) return false
    this.#stats.dropped++
    transfer.onSent?.(new RpcError(ErrorCode.CANCELLED, 'dropped before sending: the call was cancelled or timed out'))
    return true
  }

  // One frame, written now. Its first slice is always the codec's own head
  // buffer; further slices are the caller's large sidecars, which the kernel
  // must have taken before the caller may reuse them.
  #writeTransfer (transfer: OutboundTransfer): void {
    const slices = transfer.slices
    let ok: boolean
    if (slices.length === 1) {
      ok = this.#sink.write(slices[0]!)
      transfer.onSent?.(undefined)
    } else {
      const callback = transfer.onSent === undefined ? undefined : (error: Error | null | undefined) => transfer.onSent!(toRpcError(error))
      ok = this.#sink.writev(slices, callback)
    }
    this.#afterWrite(ok)
  }

  // Several frames, one write: copied into one buffer when small, otherwise
  // handed to writev as slices.
  #writeBatch (): void {
    const queue = this.#queue
    const batch: OutboundTransfer[] = []
    let bytes = 0
    let slices = 0
    let frames = 0
    while (queue.length > 0 && bytes < BATCH_BYTES) {
      const transfer = this.#shift()
      if (this.#dropIfCancelled(transfer)) continue
      batch.push(transfer)
      bytes += transfer.bytes
      slices += transfer.slices.length
      frames += framesOf(transfer)
    }
    if (batch.length === 0) return
    // A batch cut to one frame by cancellations is a lone write, not a batch.
    this.#countWrite(frames)
    let ok: boolean
    if (slices === 1) {
      // One slab run: its frames are already one contiguous slice.
      ok = this.#sink.write(batch[0]!.slices[0]!)
      batch[0]!.onSent?.(undefined)
    } else if (bytes <= CONCAT_BYTES) {
      const out = Buffer.allocUnsafe(bytes)
      let at = 0
      // A protocol's slices may be plain Uint8Arrays (no Buffer.copy): set them.
      for (const transfer of batch) for (const slice of transfer.slices) { out.set(slice, at); at += slice.length }
      ok = this.#sink.write(out)
      for (const transfer of batch) transfer.onSent?.(undefined)
    } else {
      // One writev; the transfers that wait for the kernel to take their slices hear once it has.
      const all: Buffer[] = []
      let waiting: OutboundTransfer[] | null = null
      for (const transfer of batch) {
        for (const slice of transfer.slices) all.push(slice)
        if (transfer.onSent !== undefined) (waiting ??= []).push(transfer)
      }
      const done = waiting
      ok = this.#sink.writev(all, done === null ? undefined : (error) => { for (const transfer of done) transfer.onSent!(toRpcError(error)) })
    }
    this.#afterWrite(ok)
  }

  // After each write (or corked writev): bytes the socket still holds mean
  // the kernel took only part of it; false from write() means the socket's
  // buffer is over its high-water mark, so wait for 'drain'.
  #afterWrite (ok: boolean): void {
    if (this.#sink.writableLength > 0) this.#stats.partialWrites++
    if (!ok) {
      this.#waitingDrain = true
      this.#stats.drainWaits++
      this.#signalBackedUp()
    }
  }

  #signalBackedUp (): void {
    this.#backedUpSignalled = this.#queuedBytes
    this.#onBackedUp?.()
  }
}

function toRpcError (error: Error | null | undefined): RpcError | undefined {
  return error === null || error === undefined ? undefined : new RpcError(ErrorCode.CONNECTION_CLOSED, `write failed: ${error.message}`, { cause: error })
}
