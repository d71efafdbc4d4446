// A read this long or longer that fills at least half the memory it lies in
// (or lies in the memory the last view kept) is kept as a view of it; a
// shorter one is copied into a block of our own: a kept view keeps its
// whole backing store alive, and many small views would hold far more
// memory than they are.
const VIEW_MIN_BYTES = 16 * 1024
// Blocks for copied reads start at this size (or the read's) and grow with
// the frame, up to MAX_BLOCK_BYTES.
const FIRST_BLOCK_BYTES = 4096
const MAX_BLOCK_BYTES = 1024 * 1024

/**
 * The bytes of one frame that spans reads, kept as they came: a large read
 * as a view (a stream never rewrites what it handed on), small ones copied
 * into blocks of our own. `take` joins them with one copy into a buffer of
 * the frame's exact size, or hands on the one block that holds them all.
 * So a frame of many reads is copied once, not once per doubling of a
 * buffer it is assembled in, and what is held follows what arrived.
 */
export class FramePieces {
  #pieces: Buffer[] = []
  /** The block small reads are being copied into (not yet in #pieces), and its bytes. */
  #block: Buffer | null = null
  #blockFilled = 0
  #bytes = 0
  #held = 0
  /** The backing store of the last view: views in one store count its size once. */
  #lastStore: ArrayBufferLike | null = null

  /** Bytes of the frame kept so far. */
  get bytes (): number {
    return this.#bytes
  }

  /** Memory kept alive for them: blocks' sizes, and the backing stores of views (at most about twice `bytes`, or a first block). */
  get heldBytes (): number {
    return this.#held
  }

  /** Keeps `src[from, to)`, the frame's next bytes. */
  append (src: Buffer, from: number, to: number): void {
    const n = to - from
    if (n <= 0) return
    this.#bytes += n
    const block = this.#block
    if (block !== null && block.length - this.#blockFilled >= n) {
      src.copy(block, this.#blockFilled, from, to)
      this.#blockFilled += n
      return
    }
    this.#closeBlock()
    const store = src.buffer
    if (n >= VIEW_MIN_BYTES && (store === this.#lastStore || 2 * n >= store.byteLength)) {
      this.#pieces.push(src.subarray(from, to))
      if (store !== this.#lastStore) {
        this.#held += store.byteLength
        this.#lastStore = store
      }
      return
    }
    const size = Math.max(n, Math.min(MAX_BLOCK_BYTES, Math.max(FIRST_BLOCK_BYTES, this.#bytes)))
    const fresh = Buffer.allocUnsafe(size)
    src.copy(fresh, 0, from, to)
    this.#block = fresh
    this.#blockFilled = n
    this.#held += size
  }

  /**
   * The whole frame, its last bytes `src[from, to)`: a buffer whose first
   * `bytes + (to - from)` bytes are the frame's. Forgets the pieces.
   */
  take (src: Buffer, from: number, to: number): Buffer {
    const n = to - from
    const block = this.#block
    let frame: Buffer
    if (this.#pieces.length === 0 && block !== null && block.length - this.#blockFilled >= n) {
      src.copy(block, this.#blockFilled, from, to)
      frame = block
    } else {
      frame = Buffer.allocUnsafe(this.#bytes + n)
      let at = 0
      for (const piece of this.#pieces) at += piece.copy(frame, at)
      if (block !== null) at += block.copy(frame, at, 0, this.#blockFilled)
      src.copy(frame, at, from, to)
    }
    this.clear()
    return frame
  }

  /** Forgets the pieces. */
  clear (): void {
    this.#pieces.length = 0
    this.#block = null
    this.#blockFilled = 0
    this.#bytes = 0
    this.#held = 0
    this.#lastStore = null
  }

  #closeBlock (): void {
    if (this.#block === null) return
    this.#pieces.push(this.#block.subarray(0, this.#blockFilled))
    this.#block = null
    this.#blockFilled = 0
  }
}
