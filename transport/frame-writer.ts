import { encodeToSlices, FrameBuffer, returnedValue, type FrameChunk, type FrameSink } from '../codec/frame-sink.js'
import type { TransferQueue } from './transfer-queue.js'

/** Encodes an answer or request frame into a sink (see `writeFrame`); a server protocol's `encode` has this shape. */
export interface FrameEncoder<A, B> {
  encode: (a: A, b: B, out: FrameSink) => void
}

// The frame being encoded in place: one per thread, as the shared slab is;
// only one is open at a time (a frame encoded while another is open goes
// into a buffer of its own).
const inPlace = new FrameBuffer()

/**
 * Encodes one frame with `encoder.encode(a, b, sink)` and queues it on
 * `queue`. In place when the queue allows (`inPlaceChunk`): the room the
 * encoder reserves is in the queue's coalesced outbound buffer, and the
 * frame is one more run there; a frame that appended slices (or took room
 * elsewhere) is queued as one transfer of its pieces. Otherwise into a
 * buffer of its own, queued as a transfer. An encoder that adds nothing
 * queues nothing (true). False: over the queue's outbound bound (nothing
 * queued). A throw from the encoder leaves nothing queued and reaches the
 * caller.
 */
export function writeFrame<A, B> (queue: TransferQueue, encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
  const chunk = queue.inPlaceChunk
  if (chunk === null || inPlace.open) return writeOwnFrame(queue, encoder, a, b)
  const frame = inPlace
  frame.begin(chunk)
  try {
    if (encoder.encode(a, b, frame) !== undefined) throw returnedValue()
  } catch (err) {
    frame.close()
    throw err
  }
  const home = frame.homeBuffer
  const start = frame.runStart
  const end = frame.runEnd
  if (!frame.isRun) return writePieces(queue, frame, chunk, end)
  frame.close()
  if (end === start) return true
  if (!queue.commitRun(home, start, end - start)) return false
  // Taken: the chunk's next frame starts after it.
  chunk.at = end
  return true
}

// A frame in place that took pieces (appended slices, rooms elsewhere): one transfer of them.
function writePieces (queue: TransferQueue, frame: FrameBuffer, chunk: FrameChunk, end: number): boolean {
  const bytes = frame.bytes
  const home = frame.homeBuffer
  const slices = frame.pieces()
  if (!queue.enqueue({ slices, bytes })) return false
  // Its last run in the chunk is taken: the chunk's next frame starts after it.
  if (chunk.buffer === home) chunk.at = end
  return true
}

// A frame that cannot go in place: encoded into a buffer of its own.
function writeOwnFrame<A, B> (queue: TransferQueue, encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
  const slices = encodeToSlices(encoder.encode, encoder, a, b)
  if (slices.length === 0) return true
  let bytes = 0
  for (let i = 0; i < slices.length; i++) bytes += slices[i]!.length
  return queue.enqueue({ slices, bytes })
}
