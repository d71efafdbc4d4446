import { ErrorCode, RpcError } from './errors.js'
import { DEFAULT_MAX_MESSAGE_BYTES, type Deframer, type FrameRangeSink, type FrameScanner, type ScanFraming } from './frame-decoder.js'

// A frame that spans chunks is kept in one buffer (a scanner needs its
// bytes in one piece), starting at this size or twice its first piece, and
// doubling as more arrives: at most twice what was received is held.
const FIRST_PIECE_BYTES = 4096

/**
 * Splits a byte stream into frames whose ends are found by scanning
 * (`ScanFraming`): the counterpart of `FrameDecoder` for protocols without
 * a length field.
 *
 * A frame within one chunk is handed on as a view of that chunk. A frame
 * that spans chunks is copied, as it arrives, into a buffer of its own
 * that grows by doubling; the scanner sees it grow from the same start,
 * so it can resume where it stopped. Its size is checked against
 * `maxFrameBytes` as soon as the scanner knows a lower bound, and in any
 * case once that many bytes arrived without an end. Bad input is a
 * returned error, never a throw; after an error the decoder refuses
 * further input.
 */
export class ScanDecoder implements Deframer {
  readonly #scanner: FrameScanner
  #maxFrameBytes: number
  /** The frame being assembled across chunks, and how many of its bytes are in. */
  #partial: Buffer | null = null
  #filled = 0
  #error: RpcError | null = null
  #stopped = false
  #consumed = 0

  constructor (framing: ScanFraming, maxFrameBytes = DEFAULT_MAX_MESSAGE_BYTES) {
    this.#scanner = framing.scanner()
    this.#maxFrameBytes = maxFrameBytes
  }

  get hasPartialFrame (): boolean {
    return this.#partial !== null
  }

  get bufferedBytes (): number {
    return this.#filled
  }

  get heldBytes (): number {
    return this.#partial === null ? 0 : this.#partial.length
  }

  get maxFrameBytes (): number {
    return this.#maxFrameBytes
  }

  set maxFrameBytes (bytes: number) {
    this.#maxFrameBytes = bytes
  }

  /** After a sink returned false: how many bytes of that chunk were decoded (the rest was not looked at). */
  get consumed (): number {
    return this.#consumed
  }

  stop (): void {
    this.#stopped = true
    this.#partial = null
    this.#filled = 0
  }

  pushRanges (chunk: Buffer, sink: FrameRangeSink): RpcError | null {
    if (this.#error !== null) return this.#error
    if (this.#stopped) return null
    let offset = 0
    const length = chunk.length
    if (this.#partial !== null) {
      // Append what the chunk may hold of the frame, then scan the whole of it again from where the scanner left off.
      const room = Math.min(length, this.#maxFrameBytes + 1 - this.#filled)
      this.#append(chunk, 0, room)
      const size = this.#scanner.scan(this.#partial, 0, this.#filled)
      if (typeof size !== 'number') return this.#fail(size)
      if (size <= 0) {
        const tooLarge = this.#checkBound(Math.max(-size, this.#filled))
        if (tooLarge !== null) return tooLarge
        return null
      }
      if (size > this.#maxFrameBytes) return this.#fail(this.#tooLarge(size))
      // The frame ends inside this chunk: `size - (filled - room)` of the chunk's bytes were its.
      offset = size - (this.#filled - room)
      const frame = this.#partial
      this.#partial = null
      this.#filled = 0
      this.#scanner.reset()
      if (sink(frame, 0, size) === false || this.#stopped) return this.#stoppedAt(offset)
    }
    while (offset < length) {
      const size = this.#scanner.scan(chunk, offset, length)
      if (typeof size !== 'number') return this.#fail(size)
      if (size <= 0) {
        const tooLarge = this.#checkBound(Math.max(-size, length - offset))
        if (tooLarge !== null) return tooLarge
        // Sized by what arrived, never by what the scanner says the frame will need.
        const first = Math.max(FIRST_PIECE_BYTES, 2 * (length - offset))
        this.#partial = Buffer.allocUnsafe(Math.min(first, this.#maxFrameBytes + 1))
        this.#filled = 0
        this.#append(chunk, offset, length)
        return null
      }
      if (size > this.#maxFrameBytes) return this.#fail(this.#tooLarge(size))
      const start = offset
      offset += size
      this.#scanner.reset()
      if (sink(chunk, start, offset) === false || this.#stopped) return this.#stoppedAt(offset)
    }
    return null
  }

  // A frame known to be at least `atLeast` bytes long (or holding that many without an end) may not exceed the maximum.
  #checkBound (atLeast: number): RpcError | null {
    return atLeast > this.#maxFrameBytes ? this.#fail(this.#tooLarge(atLeast)) : null
  }

  #tooLarge (size: number): RpcError {
    return new RpcError(ErrorCode.FRAME_TOO_LARGE, `frame of at least ${size} bytes, but we only support messages up to ${this.#maxFrameBytes} bytes long`)
  }

  #append (src: Buffer, from: number, to: number): void {
    let partial = this.#partial!
    const need = this.#filled + (to - from)
    if (need > partial.length) {
      const grown = Buffer.allocUnsafe(Math.min(Math.max(2 * partial.length, need), this.#maxFrameBytes + 1))
      partial.copy(grown, 0, 0, this.#filled)
      partial = this.#partial = grown
    }
    src.copy(partial, this.#filled, from, to)
    this.#filled += to - from
  }

  // The sink stopped the chunk's decoding after its first `offset` bytes.
  #stoppedAt (offset: number): null {
    this.#consumed = offset
    return null
  }

  #fail (error: RpcError): RpcError {
    this.#error = error
    this.#partial = null
    this.#filled = 0
    return error
  }
}
