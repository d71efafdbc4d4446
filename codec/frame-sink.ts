import { ErrorCode, RpcError } from './errors.js'

/**
 * Where a protocol's encoders put one frame: the shape of tokio-util's
 * `Encoder`, which writes into a `BytesMut` it is handed, here with two
 * ways in. `reserve` makes room in the buffer the frame is being laid
 * out in (on the server's and client's hot path: straight in the
 * connection's coalesced outbound buffer, so a small frame costs no
 * allocation of its own); `append` adds bytes the protocol already has
 * (a large value, a sidecar), which are sent as they are, without a copy.
 * The two may be used in any order and any number of times; the frame is
 * what they add, in that order. An encoder that adds nothing sends no
 * frame (memcached's quiet commands). An encoder that throws sends
 * nothing of what it added.
 */
export interface FrameSink {
  /**
   * The buffer the latest `reserve` made room in. It may be another one
   * after each `reserve`: read it after the call, and keep it (with the
   * offset) to write the room later in the same encode, a length field
   * filled in once the body is known.
   */
  readonly buffer: Buffer
  /**
   * Room for the next `bytes` bytes of the frame: where they start in
   * `buffer`. The encoder must write all of them before it returns, and
   * nothing outside them. Throws RPC_ERR_INVALID_ARGUMENT for a count
   * that is not an integer of 0 or more.
   */
  reserve: (bytes: number) => number
  /**
   * Adds `slice` as the next bytes of the frame. From 1 KiB up
   * (`APPEND_COPY_BYTES`) it is sent as it is (writev, no copy): it must
   * not change until the frame has been written (a client: until its call
   * settles). Smaller slices are copied, as a `reserve` would.
   */
  append: (slice: Uint8Array) => void
}

/** Appended slices shorter than this are copied into the frame's buffer (cheaper than a slice of their own); longer ones are sent as they are. */
export const APPEND_COPY_BYTES = 1024

/** A single `reserve` larger than this gets a buffer of its own rather than room in a shared chunk (which it would mostly fill). */
export const MAX_CHUNK_RESERVE_BYTES = 16 * 1024

/**
 * A buffer frames are laid out in one after another (the transport's
 * shared outbound slab, a backed-up connection's own chunk): the frame
 * being encoded takes room from `at` on, and `at` moves past it only once
 * the frame is queued. Internal to nyala.
 */
export class FrameChunk {
  buffer: Buffer | null = null
  at = 0
  readonly bytes: number

  constructor (bytes: number) {
    this.bytes = bytes
  }

  /** A fresh buffer of `bytes` (at least), from 0; the old one lives on while frames in it are queued. */
  renew (bytes = this.bytes): Buffer {
    this.at = 0
    return (this.buffer = Buffer.allocUnsafeSlow(Math.max(bytes, this.bytes)))
  }
}

const EMPTY = Buffer.alloc(0)
const SCRATCH_BYTES = 4096
// The scratch buffer grows to this, and no further: a frame larger than that continues in fresh ones (its pieces then are views of them, not copies).
const MAX_SCRATCH_BYTES = 64 * 1024
const NO_PIECES: Buffer[] = []

/**
 * The `FrameSink` nyala hands to encoders: a frame in progress. Either in
 * place in a `FrameChunk` (`begin(chunk)`: the transport then queues the
 * run the frame took there, or its pieces), or in a scratch buffer of its
 * own that `take` copies out (`begin(null)`: answers held for their turn,
 * pushes shared by many connections, requests that stay droppable).
 * Rooms that do not fit where the frame is become pieces of their own.
 * Internal to nyala: protocols see the `FrameSink` interface.
 */
export class FrameBuffer implements FrameSink {
  buffer: Buffer = EMPTY
  /** A frame is being encoded. */
  open = false
  // Where the frame's bytes go in place: a chunk, or the scratch chunk.
  #home: FrameChunk
  readonly #scratch = new FrameChunk(SCRATCH_BYTES)
  // The home's buffer, and the frame's current run in it: [#start, #at).
  // #limit is the room's end; -1 while `buffer` is a piece of its own (a
  // large reserve), so that the next reserve goes back home first.
  #homeBuffer: Buffer = EMPTY
  #start = 0
  #at = 0
  #limit = -1
  // Earlier parts of the frame, in order: closed runs, own pieces, appended slices. Null while there is only the run.
  #pieces: Buffer[] | null = null
  #pieceBytes = 0

  constructor () {
    this.#home = this.#scratch
  }

  /** Starts a frame in place in `chunk` (from its `at`), or, with null, in the scratch buffer. */
  begin (chunk: FrameChunk | null): void {
    const home = chunk ?? this.#scratch
    const buffer = home.buffer ?? home.renew()
    // Stored only when they change: a fresh slab is a young object, and
    // each store of one into this long-lived frame is a write barrier's
    // slow path (measured: ~100 instructions per client call).
    if (this.#home !== home) this.#home = home
    if (this.#homeBuffer !== buffer) this.#homeBuffer = buffer
    if (this.buffer !== buffer) this.buffer = buffer
    this.#start = this.#at = home.at
    this.#limit = buffer.length
    this.#pieces = null
    this.#pieceBytes = 0
    this.open = true
  }

  reserve (bytes: number): number {
    const at = this.#at
    const end = at + bytes
    // `>>> 0` keeps whole counts of 0 or more: a negative or fractional one goes the slow way, to be refused.
    if (end <= this.#limit && bytes >>> 0 === bytes) {
      this.#at = end
      return at
    }
    return this.#reserveSlow(bytes)
  }

  // Out of line: a count to refuse, a frame not open, the way back from an own piece, or a run that needs a fresh buffer.
  #reserveSlow (bytes: number): number {
    if (!Number.isInteger(bytes) || bytes < 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `FrameSink.reserve: ${String(bytes)} is not a byte count`)
    if (!this.open) throw new Error('FrameSink used after its encode returned')
    const home = this.#homeBuffer
    if (this.buffer !== home) {
      this.buffer = home
      this.#limit = home.length
      if (this.#at + bytes <= this.#limit) {
        const at = this.#at
        this.#at += bytes
        return at
      }
    }
    this.#closeRun()
    if (bytes > MAX_CHUNK_RESERVE_BYTES) {
      const own = Buffer.allocUnsafe(bytes)
      this.#pushPiece(own)
      this.buffer = own
      this.#limit = -1
      return 0
    }
    // A fresh home buffer: the run so far stays in the old one, as a piece.
    const chunk = this.#home
    const fresh = chunk.renew(chunk === this.#scratch ? Math.max(bytes, Math.min(MAX_SCRATCH_BYTES, 2 * this.#homeBuffer.length)) : bytes)
    this.#homeBuffer = this.buffer = fresh
    this.#start = 0
    this.#at = bytes
    this.#limit = fresh.length
    return 0
  }

  append (slice: Uint8Array): void {
    const bytes = slice.length
    if (bytes < APPEND_COPY_BYTES) {
      if (bytes === 0) return
      const at = this.reserve(bytes)
      this.buffer.set(slice, at)
      return
    }
    if (!this.open) throw new Error('FrameSink used after its encode returned')
    this.#closeRun()
    this.#pushPiece(Buffer.isBuffer(slice) ? slice : Buffer.from(slice.buffer, slice.byteOffset, bytes))
  }

  /** Bytes the frame holds so far. */
  get bytes (): number {
    return this.#pieceBytes + this.#at - this.#start
  }

  /** True when the frame is one run in its chunk, `[runStart, runEnd)` (maybe empty): no pieces. */
  get isRun (): boolean {
    return this.#pieces === null
  }

  /** Where the frame's run starts in `homeBuffer`. */
  get runStart (): number {
    return this.#start
  }

  /** Where it ends: also where the chunk's next frame may start once this one is queued. */
  get runEnd (): number {
    return this.#at
  }

  /** The chunk's buffer the run is in. */
  get homeBuffer (): Buffer {
    return this.#homeBuffer
  }

  /** Closes the frame (in place) and returns its pieces, its last run included; the chunk's `at` is for the caller to move (to `runEnd`) once they are queued. */
  pieces (): Buffer[] {
    this.#closeRun()
    this.open = false
    this.#limit = -1
    return this.#pieces ?? NO_PIECES
  }

  /**
   * Closes the frame; what it added is dropped (the chunk's room is free
   * again). `buffer` stays the home buffer (the next frame's, most often):
   * `reserve` refuses until the next `begin`.
   */
  close (): void {
    this.open = false
    this.#limit = -1
    this.#pieces = null
    if (this.buffer !== this.#homeBuffer) this.buffer = this.#homeBuffer
  }

  /**
   * Closes a frame begun with `begin(null)` and returns its bytes as
   * slices of their own: the scratch bytes copied out into one buffer,
   * the appended slices as they are. Empty when nothing was added.
   */
  take (): Buffer[] {
    this.#closeRun()
    const pieces = this.#pieces
    this.close()
    if (pieces === null) return NO_PIECES
    return copyPiecesOut(pieces, this.#scratch.buffer!.buffer)
  }

  // The run so far becomes a piece; the next starts where it ended.
  #closeRun (): void {
    const start = this.#start
    const at = this.#at
    if (at === start) return
    this.#pushPiece(this.#homeBuffer.subarray(start, at))
    this.#start = at
  }

  #pushPiece (piece: Buffer): void {
    if (this.#pieces === null) this.#pieces = [piece]
    else this.#pieces.push(piece)
    this.#pieceBytes += piece.length
  }
}

// The scratch frames of this thread: one, unless an encoder encodes another frame while its own is open.
let spare: FrameBuffer | null = null

function scratchFrame (): FrameBuffer {
  let frame = spare
  if (frame === null || frame.open) frame = spare = new FrameBuffer()
  frame.begin(null)
  return frame
}

/**
 * Replaces, in `pieces`, those that are views of `a` or `b` (a buffer that
 * is reused, or must not be kept alive by a few bytes of it) with views of
 * one copy of their bytes, in order; the others stay as they are. Returns
 * `pieces`, changed in place.
 */
export function copyPiecesOut (pieces: Buffer[], a: ArrayBufferLike, b: ArrayBufferLike = a): Buffer[] {
  let bytes = 0
  for (let i = 0; i < pieces.length; i++) if (pieces[i]!.buffer === a || pieces[i]!.buffer === b) bytes += pieces[i]!.length
  if (bytes === 0) return pieces
  const out = Buffer.allocUnsafe(bytes)
  let at = 0
  for (let i = 0; i < pieces.length; i++) {
    const piece = pieces[i]!
    if (piece.buffer !== a && piece.buffer !== b) continue
    piece.copy(out, at)
    pieces[i] = out.subarray(at, at + piece.length)
    at += piece.length
  }
  return pieces
}

/**
 * Runs `encode(a, b, sink)` (with `self` as `this`) into a scratch frame and
 * returns the frame's bytes as slices of their own (empty: nothing was
 * encoded). A throw from the encoder passes through, nothing kept.
 * Internal to nyala.
 */
export function encodeToSlices<T, A, B> (encode: (this: T, a: A, b: B, out: FrameSink) => void, self: T, a: A, b: B): Buffer[] {
  const frame = scratchFrame()
  try {
    if (encode.call(self, a, b, frame) !== undefined) throw returnedValue()
  } catch (err) {
    frame.close()
    throw err
  }
  return frame.take()
}

/** `encodeToSlices` for an encoder of one value (`encodePush(message, out)`). Internal to nyala. */
export function encodeOneToSlices<T, A> (encode: (this: T, a: A, out: FrameSink) => void, self: T, a: A): Buffer[] {
  const frame = scratchFrame()
  try {
    if (encode.call(self, a, frame) !== undefined) throw returnedValue()
  } catch (err) {
    frame.close()
    throw err
  }
  return frame.take()
}

/**
 * The error for an encoder that returned something: encoders write into
 * their sink and return nothing (one written for the former contract,
 * which returned its slices, would otherwise send nothing, silently).
 * Internal to nyala.
 */
export function returnedValue (): RpcError {
  return new RpcError(ErrorCode.INVALID_ARGUMENT, 'an encoder returned a value: it must write its frame into its FrameSink (reserve, append) and return nothing')
}
