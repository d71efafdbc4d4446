import { ErrorCode, RpcError } from './errors.js'

/**
 * How a protocol finds frame boundaries. KRPC frames start with a 4-byte
 * big-endian length; a memcached binary frame has a 24-byte header that
 * carries its body length. The decoder needs nothing else.
 */
export interface Framing {
  /** Bytes that must be present before `frameBytes` can tell the frame's size. */
  readonly prefixBytes: number
  /**
   * The whole frame's size in bytes (prefix included) for the frame that
   * starts at `buf[offset]`, where at least `prefixBytes` bytes are present;
   * or an error when the prefix itself is malformed. Must not throw.
   */
  frameBytes: (buf: Buffer, offset: number) => number | RpcError
}

/**
 * How a protocol without a length field finds frame boundaries: by
 * scanning (RESP's `*2\r\n$3\r\nGET\r\n…`, text lines). Each connection
 * gets its own scanner, which may remember how far it got in a frame that
 * is still arriving, so that a frame split over many reads is not scanned
 * again from its start each time.
 */
export interface ScanFraming {
  /** A new scanner, one per connection (it may hold the state of a frame still arriving). */
  scanner: () => FrameScanner
}

/** Finds the end of one frame at a time; see `ScanFraming`. */
export interface FrameScanner {
  /**
   * Looks at `buf[start, end)`, the bytes of the current frame so far
   * (always from the frame's first byte; a frame that spans reads comes
   * back longer each time, at the same `start` relative to the frame).
   * Returns the frame's size when it is complete within them (it may be
   * followed by other frames); 0 when more bytes are needed; `-n` when more
   * are needed and the frame is known to be at least `n` bytes long (so the
   * decoder can refuse a too-large frame before it arrives); or an error
   * when the bytes can never form a frame. Must not throw.
   */
  scan: (buf: Buffer, start: number, end: number) => number | RpcError
  /** Forgets the current frame: the next `scan` starts a new one. */
  reset: () => void
  /**
   * Optional: after a `scan` that needed more bytes, the offset (from the
   * frame's first byte) of the first byte the next `scan` of this frame will
   * read; it never moves back within a frame. A scanner that says so is not
   * handed the whole frame again on each read, only its bytes from there
   * on: `buf[start]` is where the frame's first byte would be, and `start`
   * may be negative (the bytes before `buf[0]` are ones it no longer
   * reads). The decoder then keeps the reads of a large frame as they came
   * and copies them once, into a buffer of the frame's exact size, when it
   * ends. Without it, a frame that spans reads is assembled in one buffer
   * that grows by doubling, and scanned in it.
   */
  retainFrom?: () => number
}

/** A framing either kind: with a length field, or scanned. */
export type AnyFraming = Framing | ScanFraming

/** True for a scanned framing. */
export function isScanFraming (framing: AnyFraming): framing is ScanFraming {
  return typeof (framing as Partial<ScanFraming>).scanner === 'function'
}

/** What a connection needs of a frame decoder, whichever kind of framing it reads. */
export interface Deframer {
  readonly hasPartialFrame: boolean
  readonly bufferedBytes: number
  readonly heldBytes: number
  maxFrameBytes: number
  /** After a sink returned false: where decoding of that chunk stopped (an offset in it: the bytes from there on were not looked at). */
  readonly consumed: number
  stop: () => void
  /** Feeds `chunk[from, to)` (default: all of it); every complete frame goes to `sink` in order, as a range of a buffer. */
  pushRanges: (chunk: Buffer, sink: FrameRangeSink, from?: number, to?: number) => RpcError | null
}

/** Called with each complete frame; return `false` to stop decoding the chunk (`consumed` then says where it stopped). */
export type FrameSink = (frame: Buffer) => boolean | undefined | void

/**
 * As FrameSink, with the frame as `buf[start, end)` instead of a view: what
 * a connection's hot path takes, so that no object is made per frame.
 */
export type FrameRangeSink = (buf: Buffer, start: number, end: number) => boolean | undefined | void

/** The default largest frame a receiver accepts: 50 MiB, as Kudu's `rpc_max_message_size`. */
export const DEFAULT_MAX_MESSAGE_BYTES = 50 * 1024 * 1024

// A frame that spans chunks starts with room for this much (or twice its
// first piece), and grows by doubling as more of it arrives, up to
// BLOCK_BYTES; a larger frame then takes further blocks of that size, so
// that it holds at most one block more than it received and leaves no
// outgrown buffers behind for the collector.
const FIRST_PIECE_BYTES = 16 * 1024
const BLOCK_BYTES = 1024 * 1024

/**
 * Splits a byte stream into frames.
 *
 * Chunks may end anywhere, even inside a length prefix. A frame that lies
 * within one chunk is handed on as a view of that chunk, not a copy, so the
 * sink must not write to it. A frame that spans chunks is assembled in a
 * buffer that grows with the bytes that actually arrived (doubling, from
 * 16 KiB or twice the first piece, up to 1 MiB, then in blocks of 1 MiB
 * joined once when the frame completes), never with what the length
 * prefix claims: a peer that announces 50 MiB and sends 1 MiB makes the
 * decoder hold 1 MiB, not 50. `heldBytes` says how
 * much it holds, for a budget shared by many connections. The size is
 * checked against `maxFrameBytes` as soon as the prefix is complete. Bad
 * input is reported as a returned error, never thrown; after an error the
 * decoder refuses further input.
 */
export class FrameDecoder implements Deframer {
  readonly #framing: Framing
  #maxFrameBytes: number
  // A frame (or, while #inPrefix, a prefix) that spans chunks: its first
  // #filled bytes, in #blocks and then #partial; the whole frame is
  // #frameBytes long (the prefix's size while #inPrefix).
  #partial: Buffer | null = null
  /** Bytes written into #partial, the block being filled. */
  #partialFilled = 0
  /** Full blocks before #partial (frames over BLOCK_BYTES), and their bytes. */
  #blocks: Buffer[] | null = null
  #blockBytes = 0
  /** Bytes of the frame received so far. */
  #filled = 0
  #frameBytes = 0
  #inPrefix = false
  #error: RpcError | null = null
  #stopped = false
  #consumed = 0

  constructor (framing: Framing, maxFrameBytes = DEFAULT_MAX_MESSAGE_BYTES) {
    this.#framing = framing
    this.#maxFrameBytes = maxFrameBytes
  }

  /** True while part of a frame is buffered. */
  get hasPartialFrame (): boolean {
    return this.#partial !== null
  }

  /** Bytes received of a frame that has not completed. */
  get bufferedBytes (): number {
    return this.#filled
  }

  /** Bytes of memory held for a frame that has not completed (at most twice `bufferedBytes` or 16 KiB, and at most 1 MiB more than it). */
  get heldBytes (): number {
    return this.#partial === null ? 0 : this.#blockBytes + this.#partial.length
  }

  /** Size the length prefix announced for the frame being received; 0 when none is (or its prefix is incomplete). */
  get announcedBytes (): number {
    return this.#partial === null || this.#inPrefix ? 0 : this.#frameBytes
  }

  /** The largest frame accepted from now on (checked at each frame's prefix). */
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

  /** Stops decoding: further chunks are ignored and the partial frame is released. */
  stop (): void {
    this.#stopped = true
    this.#release()
  }

  /** Feeds one chunk; every complete frame goes to `sink` in order, as a view. */
  push (chunk: Buffer, sink: FrameSink): RpcError | null {
    return this.pushRanges(chunk, (buf, start, end) => sink(start === 0 && end === buf.length ? buf : buf.subarray(start, end)))
  }

  /**
   * Feeds `chunk[from, to)` (default: all of it); every complete frame goes
   * to `sink` in order, as a range of a buffer. A range spares the caller a
   * view of the bytes it was handed as a range (a read of a shared slab).
   */
  pushRanges (chunk: Buffer, sink: FrameRangeSink, from = 0, to = chunk.length): RpcError | null {
    if (this.#error !== null) return this.#error
    if (this.#stopped) return null
    let offset = from
    const length = to

    while (this.#partial !== null) {
      const take = Math.min(this.#frameBytes - this.#filled, length - offset)
      this.#append(chunk, offset, offset + take)
      offset += take
      if (this.#filled < this.#frameBytes) return null
      if (this.#inPrefix) {
        const frameBytes = this.#checkedSize(this.#partial, 0)
        if (typeof frameBytes !== 'number') return frameBytes
        this.#inPrefix = false
        this.#frameBytes = frameBytes
        // #filled stays at prefixBytes.
        if (frameBytes > this.#filled) continue
      }
      const frameBytes = this.#frameBytes
      const frame = this.#blocks === null ? this.#partial : Buffer.concat([...this.#blocks, this.#partial], frameBytes)
      this.#release()
      if (sink(frame, 0, frameBytes) === false || this.#stopped) return this.#stoppedAt(offset)
    }

    const prefixBytes = this.#framing.prefixBytes
    while (offset < length) {
      const remaining = length - offset
      if (remaining < prefixBytes) {
        this.#begin(prefixBytes, prefixBytes, true)
        this.#append(chunk, offset, length)
        return null
      }
      const frameBytes = this.#checkedSize(chunk, offset)
      if (typeof frameBytes !== 'number') return frameBytes
      if (remaining < frameBytes) {
        this.#begin(frameBytes, Math.min(frameBytes, BLOCK_BYTES, Math.max(FIRST_PIECE_BYTES, 2 * remaining)), false)
        this.#append(chunk, offset, length)
        return null
      }
      const start = offset
      offset += frameBytes
      if (sink(chunk, start, offset) === false || this.#stopped) return this.#stoppedAt(offset)
    }
    return null
  }

  #begin (frameBytes: number, firstBlock: number, inPrefix: boolean): void {
    this.#partial = Buffer.allocUnsafe(firstBlock)
    this.#partialFilled = 0
    this.#filled = 0
    this.#frameBytes = frameBytes
    this.#inPrefix = inPrefix
  }

  #release (): void {
    this.#partial = null
    this.#blocks = null
    this.#blockBytes = 0
    this.#partialFilled = 0
    this.#filled = 0
  }

  // Copies src[from, to) after what the partial frame holds, making room as it goes.
  #append (src: Buffer, from: number, to: number): void {
    while (from < to) {
      let block = this.#partial!
      if (this.#partialFilled === block.length) block = this.#room()
      const n = Math.min(block.length - this.#partialFilled, to - from)
      src.copy(block, this.#partialFilled, from, from + n)
      this.#partialFilled += n
      this.#filled += n
      from += n
    }
  }

  // The current block is full and the frame is not: double it while it is
  // under BLOCK_BYTES (keeping what it holds), else keep it and start the
  // next block. Blocks never reach past the frame's end, so the last one
  // ends exactly there; what was copied is never copied again until the
  // frame completes (then once, into one buffer, if it took several blocks).
  #room (): Buffer {
    const block = this.#partial!
    const rest = this.#frameBytes - this.#blockBytes
    if (block.length < BLOCK_BYTES) {
      const grown = Buffer.allocUnsafe(Math.min(Math.max(2 * block.length, FIRST_PIECE_BYTES), BLOCK_BYTES, rest))
      block.copy(grown, 0, 0, this.#partialFilled)
      this.#partial = grown
      return grown
    }
    (this.#blocks ??= []).push(block)
    this.#blockBytes += block.length
    const next = Buffer.allocUnsafe(Math.min(BLOCK_BYTES, this.#frameBytes - this.#blockBytes))
    this.#partial = next
    this.#partialFilled = 0
    return next
  }

  #checkedSize (buf: Buffer, offset: number): number | RpcError {
    const size = this.#framing.frameBytes(buf, offset)
    if (typeof size !== 'number') return this.#fail(size)
    if (size > this.#maxFrameBytes) {
      return this.#fail(new RpcError(ErrorCode.FRAME_TOO_LARGE,
        `RPC frame had a length of ${size}, but we only support messages up to ${this.#maxFrameBytes} bytes long`))
    }
    if (size < this.#framing.prefixBytes) {
      return this.#fail(new RpcError(ErrorCode.MALFORMED_FRAME, `RPC frame had invalid length of ${size}`))
    }
    return size
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
