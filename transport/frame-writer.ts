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

// The chunk the open frame is encoded in (between beginFrame and endFrame).
let openChunk: FrameChunk | null = null

/**
 * Opens a frame to be encoded in place for `queue` (its `inPlaceChunk`): the
 * room the encoder reserves is in the queue's coalesced outbound buffer.
 * Null when the frame cannot go in place now (the queue is held or closed,
 * or another frame is open): encode it into a buffer of its own and
 * `enqueue` it. The caller encodes into the sink, then calls `endFrame`
 * (or `abortFrame` when the encoder threw). No closure, no object per
 * frame: the encoder runs in the caller's stack, where TurboFan inlines it.
 */
export function beginFrame (queue: TransferQueue): FrameBuffer | null {
  const chunk = queue.inPlaceChunk
  if (chunk === null || inPlace.open) return null
  openChunk = chunk
  inPlace.begin(chunk)
  return inPlace
}

/**
 * Queues the frame opened by `beginFrame` on `queue`: one more run of the
 * chunk, or, when it appended slices (or took room elsewhere), one
 * transfer of its pieces. Nothing added: nothing queued (true). False:
 * over the queue's outbound bound (nothing queued).
 */
export function endFrame (queue: TransferQueue): boolean {
  const frame = inPlace
  const chunk = openChunk!
  openChunk = null
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

/** Drops the frame opened by `beginFrame` (its encoder threw): nothing is queued, its room is free again. No-op when none is open. */
export function abortFrame (): void {
  if (!inPlace.open) return
  openChunk = null
  inPlace.close()
}

/**
 * Encodes one frame with `encoder.encode(a, b, sink)` and queues it on
 * `queue`: in place when it can (`beginFrame`), else into a buffer of its
 * own, queued as a transfer. An encoder that adds nothing queues nothing
 * (true). False: over the queue's outbound bound (nothing queued). A throw
 * from the encoder leaves nothing queued and reaches the caller.
 */
export function writeFrame<A, B> (queue: TransferQueue, encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
  const frame = beginFrame(queue)
  if (frame === null) return writeOwnFrame(queue, encoder, a, b)
  try {
    if (encoder.encode(a, b, frame) !== undefined) throw returnedValue()
  } catch (err) {
    abortFrame()
    throw err
  }
  return endFrame(queue)
}

// A frame in place that took pieces (appended slices, rooms elsewhere): one transfer of them.
function writePieces (queue: TransferQueue, frame: FrameBuffer, chunk: FrameChunk, end: number): boolean {
  const bytes = frame.bytes
  const home = frame.homeBuffer
  const slices = frame.pieces()
  // Its last run in the chunk is taken before it is queued, not after: a
  // backed-up queue copies a small frame into this same chunk (enqueue's
  // copy-in), which must land after the frame's runs (not over a run it has
  // yet to copy) and must not be undone by moving `at` back to `end` (the
  // next frame would overwrite the copy while it waits for drain). Refused
  // by the bound, its room stays taken until the chunk is renewed.
  if (chunk.buffer === home) chunk.at = end
  return queue.enqueue({ slices, bytes })
}

// A frame that cannot go in place: encoded into a buffer of its own.
function writeOwnFrame<A, B> (queue: TransferQueue, encoder: FrameEncoder<A, B>, a: A, b: B): boolean {
  const slices = encodeToSlices(encoder.encode, encoder, a, b)
  if (slices.length === 0) return true
  let bytes = 0
  for (let i = 0; i < slices.length; i++) bytes += slices[i]!.length
  return queue.enqueue({ slices, bytes })
}
