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

/** Called with each complete frame; return `false` to stop decoding (the connection is going away). */
export type FrameSink = (frame: Buffer) => boolean | undefined | void

/**
 * As FrameSink, with the frame as `buf[start, end)` instead of a view: what
 * a connection's hot path takes, so that no object is made per frame.
 */
export type FrameRangeSink = (buf: Buffer, start: number, end: number) => boolean | undefined | void

/** The default largest frame a receiver accepts: 50 MiB, as Kudu's `rpc_max_message_size`. */
export const DEFAULT_MAX_MESSAGE_BYTES = 50 * 1024 * 1024

// A frame that spans chunks starts with room for this much (or twice its
// first piece), and grows by doubling as more of it arrives.
const FIRST_PIECE_BYTES = 16 * 1024

/**
 * Splits a byte stream into frames.
 *
 * Chunks may end anywhere, even inside a length prefix. A frame that lies
 * within one chunk is handed on as a view of that chunk, not a copy, so the
 * sink must not write to it. A frame that spans chunks is assembled in a
 * buffer that grows with the bytes that actually arrived (doubling, from
 * 16 KiB or twice the first piece, up to the announced size), never with
 * what the length prefix claims: a peer that announces 50 MiB and sends
 * 1 MiB makes the decoder hold about 2 MiB, not 50. `heldBytes` says how
 * much it holds, for a budget shared by many connections. The size is
 * checked against `maxFrameBytes` as soon as the prefix is complete. Bad
 * input is reported as a returned error, never thrown; after an error the
 * decoder refuses further input.
 */
export class FrameDecoder {
  readonly #framing: Framing
  #maxFrameBytes: number
  // A frame (or, while #inPrefix, a prefix) that spans chunks: #filled bytes
  // of #partial hold its start; the whole frame is #frameBytes long (the
  // prefix's size while #inPrefix). #partial grows toward it as bytes come.
  #partial: Buffer | null = null
  #filled = 0
  #frameBytes = 0
  #inPrefix = false
  #error: RpcError | null = null
  #stopped = false

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

  /** Bytes of memory held for a frame that has not completed (at most twice `bufferedBytes`, or 16 KiB). */
  get heldBytes (): number {
    return this.#partial === null ? 0 : this.#partial.length
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

  /** Stops decoding: further chunks are ignored and the partial frame is released. */
  stop (): void {
    this.#stopped = true
    this.#partial = null
    this.#filled = 0
  }

  /** Feeds one chunk; every complete frame goes to `sink` in order, as a view. */
  push (chunk: Buffer, sink: FrameSink): RpcError | null {
    return this.pushRanges(chunk, (buf, start, end) => sink(start === 0 && end === buf.length ? buf : buf.subarray(start, end)))
  }

  /** Feeds one chunk; every complete frame goes to `sink` in order, as a range of a buffer. */
  pushRanges (chunk: Buffer, sink: FrameRangeSink): RpcError | null {
    if (this.#error !== null) return this.#error
    if (this.#stopped) return null
    let offset = 0
    const length = chunk.length

    while (this.#partial !== null) {
      let partial = this.#partial
      const take = Math.min(this.#frameBytes - this.#filled, length - offset)
      if (this.#filled + take > partial.length) partial = this.#grow(this.#filled + take)
      chunk.copy(partial, this.#filled, offset, offset + take)
      this.#filled += take
      offset += take
      if (this.#filled < this.#frameBytes) return null
      if (this.#inPrefix) {
        const frameBytes = this.#checkedSize(partial, 0)
        if (typeof frameBytes !== 'number') return frameBytes
        this.#inPrefix = false
        this.#frameBytes = frameBytes
        // #filled stays at prefixBytes.
        if (frameBytes > this.#filled) continue
      }
      const frame = this.#partial!
      this.#partial = null
      this.#filled = 0
      if (sink(frame, 0, this.#frameBytes) === false || this.#stopped) return null
    }

    const prefixBytes = this.#framing.prefixBytes
    while (offset < length) {
      const remaining = length - offset
      if (remaining < prefixBytes) {
        this.#partial = Buffer.allocUnsafe(Math.min(FIRST_PIECE_BYTES, prefixBytes))
        this.#frameBytes = prefixBytes
        chunk.copy(this.#partial, 0, offset)
        this.#filled = remaining
        this.#inPrefix = true
        return null
      }
      const frameBytes = this.#checkedSize(chunk, offset)
      if (typeof frameBytes !== 'number') return frameBytes
      if (remaining < frameBytes) {
        this.#partial = Buffer.allocUnsafe(Math.min(frameBytes, Math.max(FIRST_PIECE_BYTES, 2 * remaining)))
        this.#frameBytes = frameBytes
        chunk.copy(this.#partial, 0, offset)
        this.#filled = remaining
        this.#inPrefix = false
        return null
      }
      const start = offset
      offset += frameBytes
      if (sink(chunk, start, offset) === false || this.#stopped) return null
    }
    return null
  }

  // Room for at least `need` bytes of the partial frame: double what is
  // held (never past the frame's size), keeping what arrived.
  #grow (need: number): Buffer {
    const old = this.#partial!
    let size = Math.max(old.length, FIRST_PIECE_BYTES)
    while (size < need) size *= 2
    // `need` never passes #frameBytes: the buffer ends exactly at the frame's end.
    const grown = Buffer.allocUnsafe(Math.min(size, this.#frameBytes))
    old.copy(grown, 0, 0, this.#filled)
    this.#partial = grown
    return grown
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

  #fail (error: RpcError): RpcError {
    this.#error = error
    this.#partial = null
    this.#filled = 0
    return error
  }
}
