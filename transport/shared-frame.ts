// Frames encoded once and queued on many connections (a push a group fans
// out, a push to one subscriber): laid out one after another in the thread's
// push slab, a buffer never written over, so that every connection queues
// the same range of it (FramedConnection.sendRange) and a connection's
// consecutive pushes form one run there: one range to write, however many
// pushes it holds, with no buffer, slice array or transfer object per push.
import { FrameBuffer, FrameChunk, copyPiecesOut, encodeOneToSlices, returnedValue, type FrameSink } from '../codec/frame-sink.js'
import { SLAB_BYTES } from './slab-run.js'

// Separate from the answers' slab: a subscriber's pushes stay side by side
// while the publisher's answers are laid out between them. A slab is kept
// alive by the runs of it still queued (or held by a socket), and renewed
// when full: its bytes are never taken again, however the runs were written.
const pushSlab = new FrameChunk(SLAB_BYTES)
const frame = new FrameBuffer()

/** Where the latest `encodeShared` that returned null laid its frame out: `[start, end)` of `buffer`. */
export const sharedRange: { buffer: Buffer, start: number, end: number } = { buffer: Buffer.alloc(0), start: 0, end: 0 }

/**
 * Encodes `encode.call(self, message, sink)` once for many connections.
 * Null: the frame is one run of the push slab, at `sharedRange` (read it
 * before the next call; its bytes stay as they are). Otherwise the frame's
 * bytes as slices of their own (its large appended slices as they are;
 * empty when nothing was encoded). A throw from the encoder passes through,
 * nothing kept.
 */
export function encodeShared<T, A> (encode: (this: T, a: A, out: FrameSink) => void, self: T, message: A): Buffer[] | null {
  // An encoder that pushes while it encodes: the inner frame goes into a buffer of its own.
  if (frame.open) return encodeOneToSlices(encode, self, message)
  frame.begin(pushSlab)
  const first = frame.homeBuffer
  try {
    if (encode.call(self, message, frame) !== undefined) throw returnedValue()
  } catch (err) {
    frame.close()
    throw err
  }
  const home = frame.homeBuffer
  const start = frame.runStart
  const end = frame.runEnd
  if (frame.isRun && end > start) {
    frame.close()
    // Taken whether or not a connection queues it: no later frame is laid over it.
    pushSlab.at = end
    const range = sharedRange
    if (range.buffer !== home) range.buffer = home
    range.start = start
    range.end = end
    return null
  }
  // Rooms elsewhere or appended slices: pieces. Those in the slab are
  // copied out into one buffer of the frame's own (a view would keep a
  // whole slab alive for the few bytes a connection's bounds count), the
  // appended slices stay as they are; the slab's room is free again.
  return copyPiecesOut(frame.pieces(), first.buffer, home.buffer)
}
