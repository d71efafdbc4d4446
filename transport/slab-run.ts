// The slabs frames are encoded into in place, and a run of frames in one:
// the transfer queue's unit for frames that cannot be dropped once written.
import { FrameChunk } from '../codec/frame-sink.js'
import type { ByteStream } from './byte-stream.js'
import type { OutboundTransfer } from './transfer-queue-options.js'

const NO_SLICES: Buffer[] = []

// Frames encoded in place are laid out back to back in slabs of this size,
// shared by every queue of the thread: an idle connection holds none, and
// the frames of one read (or turn) still form one run. A slab stays alive
// while runs of it are queued or in sockets, and its bytes are not written
// over while any view of them may be held: only the room of a run that a
// copying stream took whole, with nothing laid out after it, is taken
// again (writeRun). Only one frame is encoded in it at a time (a frame
// encoded while another is open goes elsewhere: FramedConnection.writeFrame).
export const SLAB_BYTES = 64 * 1024
export const slab = new FrameChunk(SLAB_BYTES)
// While a queue waits for 'drain', its small frames are encoded in place into
// chunks of its own instead (a backed-up queue must not pin shared slabs that
// other connections' written frames filled), so each costs its wire bytes,
// not a buffer and a transfer object of its own (~190 bytes on the heap for
// a 7-byte answer, which let tiny pipelined requests on a connection that
// never reads grow the heap far past the outbound bounds).
export const OWN_CHUNK_BYTES = 16 * 1024

/**
 * Frames encoded in place one after another in a slab: one queue entry, one
 * slice when taken, however many frames it holds. Has no hooks: such frames
 * cannot be dropped once committed (as a frame written at once cannot).
 */
export class SlabRun implements OutboundTransfer {
  slices: Buffer[] = NO_SLICES
  bytes = 0
  frames = 0
  readonly slab: Buffer
  readonly start: number

  constructor (slab: Buffer, start: number) {
    this.slab = slab
    this.start = start
  }
}

/**
 * Writes `run` as a range of its chunk (no view, no slice array) to a sink
 * that takes ranges (`ByteStream.writeRange`); returns what it returned.
 * Such a sink copies what it takes: when it took the whole run at once, it
 * holds nothing of the chunk, and if no frame was laid out after the run
 * (`at` is at its end), the chunk's next frames take its room again, so
 * the slab is renewed only when frames still queued or held in sockets
 * fill it, not every 64 KiB of answers. The chunk is the shared `slab`,
 * or `own`, the queue's own while it waits for drain.
 */
export function writeRun (sink: Pick<ByteStream, 'writeRange' | 'writableLength'>, run: SlabRun, own: FrameChunk | null): boolean {
  const end = run.start + run.bytes
  const ok = sink.writeRange!(run.slab, run.start, end)
  if (ok && sink.writableLength === 0) {
    const chunk = slab.buffer === run.slab ? slab : own !== null && own.buffer === run.slab ? own : null
    if (chunk !== null && chunk.at === end) chunk.at = run.start
  }
  return ok
}

/** Copies `transfer`'s slices into `chunk` from its `at` (a fresh buffer when they do not fit): where they start. The caller moves `at` once they are queued. */
export function copyIn (chunk: FrameChunk, transfer: OutboundTransfer): number {
  const bytes = transfer.bytes
  const buffer = chunk.buffer !== null && chunk.at + bytes <= chunk.buffer.length ? chunk.buffer : chunk.renew(bytes)
  const start = chunk.at
  let at = start
  for (const slice of transfer.slices) { buffer.set(slice, at); at += slice.length }
  return start
}

/** Frames in a transfer taken off a queue: a run's, or 1. */
export function framesOf (transfer: OutboundTransfer): number {
  return transfer instanceof SlabRun ? transfer.frames : 1
}
