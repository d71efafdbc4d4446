/**
 * A protocol's encoder run as the server runs it, into a scratch sink: the
 * frame's bytes as one buffer (empty when it encoded nothing).
 */
import { FrameBuffer, type FrameSink } from '../../codec/frame-sink.js'

export function encoded (encode: (out: FrameSink) => void): Buffer {
  const frame = new FrameBuffer()
  frame.begin(null)
  encode(frame)
  return Buffer.concat(frame.take())
}

/** The same, as the slices the server would send (a large appended slice stays apart). */
export function encodedSlices (encode: (out: FrameSink) => void): Buffer[] {
  const frame = new FrameBuffer()
  frame.begin(null)
  encode(frame)
  return frame.take()
}
