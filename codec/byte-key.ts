/**
 * A short byte string kept to be recognised again in incoming frames (a
 * method name a decoder caches, say), compared four bytes at a time.
 *
 * A byte-by-byte loop over two typed arrays costs V8 about 20 instructions
 * a byte (each element read is checked against its array, and the loop
 * re-checks the arrays each turn). Four bytes read in one expression and
 * compared as one 32-bit word cost about half that per byte; a `DataView`
 * read of a word costs about what one byte did. Making a DataView reads
 * its array's `buffer`, a call into V8's C++ dearer than a whole compare,
 * so one is made only for an array met twice in a row (the frames of one
 * read share their read's buffer): a read of one frame is compared word by
 * combined word, a read of many through the view.
 */
export class ByteKey {
  /** How many bytes. */
  readonly length: number
  /** A copy of the bytes. */
  readonly bytes: Uint8Array
  // The bytes as little-endian 32-bit words; a last partial word is compared bytewise.
  readonly #words: Int32Array

  constructor (buf: Uint8Array, start: number, end: number) {
    const length = end - start
    this.length = length
    this.bytes = Uint8Array.prototype.slice.call(buf, start, end)
    const words = new Int32Array(length >> 2)
    for (let i = 0; i < words.length; i++) words[i] = wordAt(this.bytes, i * 4)
    this.#words = words
  }

  /** True when `buf[start, start + length)` holds exactly these bytes; the caller has checked that range lies inside `buf`. */
  matches (buf: Uint8Array, start: number): boolean {
    const words = this.#words
    const count = words.length
    if (buf === lastArray) {
      const view = lastView ?? (lastView = new DataView(buf.buffer, buf.byteOffset, buf.byteLength))
      for (let i = 0; i < count; i++) if (view.getInt32(start + i * 4, true) !== words[i]) return false
    } else {
      lastArray = buf
      lastView = null
      for (let i = 0; i < count; i++) if (wordAt(buf, start + i * 4) !== words[i]) return false
    }
    const bytes = this.bytes
    for (let i = count * 4; i < this.length; i++) if (buf[start + i] !== bytes[i]) return false
    return true
  }
}

// The array compared last, and a view of it once it is compared again.
// (One read buffer stays referenced until another array is compared.)
let lastArray: Uint8Array | null = null
let lastView: DataView | null = null

// Four bytes as one little-endian signed 32-bit word.
function wordAt (buf: Uint8Array, at: number): number {
  return buf[at]! | (buf[at + 1]! << 8) | (buf[at + 2]! << 16) | (buf[at + 3]! << 24)
}
