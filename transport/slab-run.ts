// The slabs frames are encoded into in place, and a run of frames in one:
// the transfer queue's unit for frames that cannot be dropped once written.
import { FrameChunk } from '../codec/frame-sink.js'
import type { OutboundTransfer } from './transfer-queue-options.js'

const NO_SLICES: Buffer[] = []

// Frames encoded in place are laid out back to back in slabs of this size,
// shared by every queue of the thread: an idle connection holds none, and
// the frames of one read (or turn) still form one run. A slab is never
// written twice: it stays alive while runs of it are queued or in sockets.
// Only one frame is encoded in it at a time (a frame encoded while another
// is open goes elsewhere: FramedConnection.writeFrame).
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
