import { ErrorCode, RpcError } from './errors.js'
import { DEFAULT_MAX_MESSAGE_BYTES, type Deframer, type FrameRangeSink, type FrameScanner, type ScanFraming } from './frame-decoder.js'
import { FramePieces } from './frame-pieces.js'

// A frame that spans chunks, for a scanner that needs all of it, is kept in
// one buffer, starting at this size or twice its first piece, and doubling
// as more arrives: at most twice what was received is held.
const FIRST_PIECE_BYTES = 4096
// For a scanner that says what it still reads (`retainFrom`), the bytes it
// still needs before a new chunk are joined with this many of the chunk's
// first bytes (or as many as they are), so it can read on in the chunk itself.
const STITCH_BYTES = 256

/**
 * Splits a byte stream into frames whose ends are found by scanning
 * (`ScanFraming`): the counterpart of `FrameDecoder` for protocols without
 * a length field.
 *
 * A frame within one chunk is handed on as a view of that chunk. A frame
 * that spans chunks is handed on whole, in a buffer of its own. With a
 * scanner that says which bytes it still reads (`retainFrom`), the chunks
 * are kept as they came (`FramePieces`: large ones as views, small ones
 * copied) and copied once, into a buffer of the frame's size, when it ends;
 * the scanner is handed each new chunk itself, joined with the few bytes
 * it still needs from before when there are any. Otherwise the frame is
 * copied, as it arrives, into a buffer that grows by doubling, and the
 * scanner sees it grow from the same start. Its size is checked against
 * `maxFrameBytes` as soon as the scanner knows a lower bound, and in any
 * case once that many bytes arrived without an end: what a scanner claims
 * is never allocated, only what arrived is held. Bad input is a returned
 * error, never a throw; after an error the decoder refuses further input.
 */
export class ScanDecoder implements Deframer {
  readonly #scanner: FrameScanner
  readonly #retains: boolean
  #maxFrameBytes: number
  /** True while a frame that spans chunks is being received; `#filled` of its bytes are in. */
  #active = false
  #filled = 0
  /**
   * The bytes the scanner reads, in one buffer: the whole frame so far
   * (a scanner without `retainFrom`: `#window[0, #filled)`), or those
   * from `retainFrom` on: `#window[#winStart, #winEnd)`, the frame's bytes
   * from offset `#winFrom` on.
   */
  #window: Buffer | null = null
  #winStart = 0
  #winEnd = 0
  #winFrom = 0
  /** The frame's chunks, for a scanner with `retainFrom`. */
  readonly #pieces: FramePieces | null
  #error: RpcError | null = null
  #stopped = false
  #consumed = 0

  constructor (framing: ScanFraming, maxFrameBytes = DEFAULT_MAX_MESSAGE_BYTES) {
    this.#scanner = framing.scanner()
    this.#retains = typeof this.#scanner.retainFrom === 'function'
    this.#pieces = this.#retains ? new FramePieces() : null
    this.#maxFrameBytes = maxFrameBytes
  }

  get hasPartialFrame (): boolean {
    return this.#active
  }

  get bufferedBytes (): number {
    return this.#filled
  }

  get heldBytes (): number {
    return (this.#window === null ? 0 : this.#window.length) + (this.#pieces === null ? 0 : this.#pieces.heldBytes)
  }

  get maxFrameBytes (): number {
    return this.#maxFrameBytes
  }

  set maxFrameBytes (bytes: number) {
    this.#maxFrameBytes = bytes
  }

  /** After a sink returned false: where decoding of that chunk stopped (an offset in it; the rest was not looked at). */
  get consumed (): number {
    return this.#consumed
  }

  stop (): void {
    this.#stopped = true
    this.#release()
  }

  pushRanges (chunk: Buffer, sink: FrameRangeSink, from = 0, to = chunk.length): RpcError | null {
    if (this.#error !== null) return this.#error
    if (this.#stopped) return null
    // The rest of a frame still arriving is read from the chunk's first byte: a range becomes a view then.
    let base = 0
    if (this.#active && (from !== 0 || to !== chunk.length)) {
      chunk = chunk.subarray(from, to)
      base = from
      from = 0
      to = chunk.length
    }
    let offset = from
    const length = to
    if (this.#active) {
      // What the chunk may hold of the frame, scanned from where the scanner left off.
      const before = this.#filled
      const room = Math.min(length, this.#maxFrameBytes + 1 - before)
      const size = this.#retains ? this.#scanRetained(chunk, room) : this.#scanWhole(chunk, room)
      if (typeof size !== 'number') return this.#fail(size)
      if (size <= 0) {
        const tooLarge = this.#checkBound(Math.max(-size, this.#filled))
        if (tooLarge !== null) return tooLarge
        if (this.#retains) this.#keep(chunk, room, before)
        return null
      }
      if (size > this.#maxFrameBytes) return this.#fail(this.#tooLarge(size))
      // The frame ends inside this chunk: `size - before` of the chunk's bytes were its.
      offset = size - before
      const frame = this.#retains ? this.#pieces!.take(chunk, 0, offset) : this.#window!
      this.#release()
      this.#scanner.reset()
      if (sink(frame, 0, size) === false || this.#stopped) return this.#stoppedAt(base + offset)
    }
    while (offset < length) {
      const size = this.#scanner.scan(chunk, offset, length)
      if (typeof size !== 'number') return this.#fail(size)
      if (size <= 0) {
        const tooLarge = this.#checkBound(Math.max(-size, length - offset))
        if (tooLarge !== null) return tooLarge
        this.#active = true
        if (this.#retains) {
          this.#pieces!.append(chunk, offset, length)
          this.#filled = length - offset
          const from = this.#scanner.retainFrom!()
          if (from < this.#filled) this.#setWindow(chunk, offset + from, length, from)
          else this.#winFrom = this.#filled
          return null
        }
        // Sized by what arrived, never by what the scanner says the frame will need.
        const first = Math.max(FIRST_PIECE_BYTES, 2 * (length - offset))
        this.#window = Buffer.allocUnsafe(Math.min(first, this.#maxFrameBytes + 1))
        this.#appendWhole(chunk, offset, length)
        return null
      }
      if (size > this.#maxFrameBytes) return this.#fail(this.#tooLarge(size))
      const start = offset
      offset += size
      this.#scanner.reset()
      if (sink(chunk, start, offset) === false || this.#stopped) return this.#stoppedAt(base + offset)
    }
    return null
  }

  // A scanner that reads the whole frame: the chunk's bytes go after it, and it is scanned again from where the scanner stopped.
  #scanWhole (chunk: Buffer, room: number): number | RpcError {
    this.#appendWhole(chunk, 0, room)
    return this.#scanner.scan(this.#window!, 0, this.#filled)
  }

  #appendWhole (src: Buffer, from: number, to: number): void {
    let window = this.#window!
    const need = this.#filled + (to - from)
    if (need > window.length) {
      const grown = Buffer.allocUnsafe(Math.min(Math.max(2 * window.length, need), this.#maxFrameBytes + 1))
      window.copy(grown, 0, 0, this.#filled)
      window = this.#window = grown
    }
    src.copy(window, this.#filled, from, to)
    this.#filled += to - from
  }

  // A scanner with `retainFrom`: chunk[0, room) are the frame's bytes from
  // offset `#filled` on. The scanner reads them in the chunk itself, after
  // the bytes it still reads from before (if any) joined in the window with
  // the chunk's first few. Counts them in `#filled`.
  #scanRetained (chunk: Buffer, room: number): number | RpcError {
    const scanner = this.#scanner
    const before = this.#filled
    this.#filled = before + room
    if (this.#window === null) return scanner.scan(chunk, -before, room)
    const tail = this.#winEnd - this.#winStart
    const joined = Math.min(room, Math.max(tail, STITCH_BYTES))
    this.#appendWindow(chunk, 0, joined)
    const size = scanner.scan(this.#window, this.#winStart - this.#winFrom, this.#winEnd)
    if (typeof size !== 'number' || size > 0 || joined === room) return size
    if (scanner.retainFrom!() >= before) return scanner.scan(chunk, -before, room)
    // It still reads bytes from before the chunk: the window takes all of it.
    this.#appendWindow(chunk, joined, room)
    return scanner.scan(this.#window, this.#winStart - this.#winFrom, this.#winEnd)
  }

  // chunk[0, room), the frame's bytes from offset `before` on, did not end
  // it: they are kept, and the window keeps what the scanner still reads.
  #keep (chunk: Buffer, room: number, before: number): void {
    this.#pieces!.append(chunk, 0, room)
    const from = this.#scanner.retainFrom!()
    if (from >= this.#filled) {
      this.#window = null
      this.#winFrom = this.#filled
    } else if (this.#window !== null && this.#winFrom + this.#winEnd - this.#winStart === this.#filled) {
      // The window took the whole chunk: it lets go of what the scanner no longer reads.
      const drop = Math.max(0, from - this.#winFrom)
      this.#winStart += drop
      this.#winFrom += drop
    } else {
      const at = Math.max(from, before)
      this.#setWindow(chunk, at - before, room, at)
    }
  }

  // The window holds src[from, to), the frame's bytes from offset `frameFrom` on.
  #setWindow (src: Buffer, from: number, to: number, frameFrom: number): void {
    const n = to - from
    if (this.#window === null || this.#window.length < n) this.#window = Buffer.allocUnsafe(Math.max(n, 2 * STITCH_BYTES))
    src.copy(this.#window, 0, from, to)
    this.#winStart = 0
    this.#winEnd = n
    this.#winFrom = frameFrom
  }

  // Puts src[from, to) after the window's bytes, making room (moving them to its start, or into a larger buffer).
  #appendWindow (src: Buffer, from: number, to: number): void {
    const n = to - from
    let window = this.#window!
    if (this.#winEnd + n > window.length) {
      const live = this.#winEnd - this.#winStart
      if (live + n <= window.length) {
        window.copyWithin(0, this.#winStart, this.#winEnd)
      } else {
        const grown = Buffer.allocUnsafe(Math.max(2 * window.length, live + n))
        window.copy(grown, 0, this.#winStart, this.#winEnd)
        window = this.#window = grown
      }
      this.#winStart = 0
      this.#winEnd = live
    }
    src.copy(window, this.#winEnd, from, to)
    this.#winEnd += n
  }

  #release (): void {
    this.#active = false
    this.#filled = 0
    this.#window = null
    this.#winStart = 0
    this.#winEnd = 0
    this.#winFrom = 0
    this.#pieces?.clear()
  }

  // A frame known to be at least `atLeast` bytes long (or holding that many without an end) may not exceed the maximum.
  #checkBound (atLeast: number): RpcError | null {
    return atLeast > this.#maxFrameBytes ? this.#fail(this.#tooLarge(atLeast)) : null
  }

  #tooLarge (size: number): RpcError {
    return new RpcError(ErrorCode.FRAME_TOO_LARGE, `frame of at least ${size} bytes, but we only support messages up to ${this.#maxFrameBytes} bytes long`)
  }

  // The sink stopped the chunk's decoding after its first `offset` bytes.
  #stoppedAt (offset: number): null {
    this.#consumed = offset
    return null
  }

  #fail (error: RpcError): RpcError {
    this.#error = error
    this.#release()
    return error
  }
}
