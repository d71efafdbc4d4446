/**
 * An array reply kept as its bytes (`RedisClient.compact`): one buffer and
 * one offset per element instead of one JavaScript object per element. An
 * LRANGE of 4 M small elements decoded into 4 M Buffers costs seconds of
 * CPU and ~100 bytes of heap per element; kept compact, it costs 4 bytes
 * per element and no pass over the reply beyond the scanner's, which
 * records where a large array's elements start while it looks for the
 * reply's end (`ArrayIndex`); an element is decoded only when it is asked
 * for.
 */
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { CR, LF } from './resp.js'

const DOLLAR = 0x24
const STAR = 0x2a
const PLUS = 0x2b
const MINUS = 0x2d
const ZERO = 0x30

/** A top-level array reply this long or longer has its elements' starts recorded by the reply scanner (`ArrayIndex`). */
export const INDEXED_ARRAY_MIN = 1024

/**
 * Where the elements of the last large top-level array reply start, as the
 * reply scanner found them while looking for its end (offsets from the
 * reply's first byte; entry `count` is where the last element ends), so
 * that its compact decoding does not walk the reply a second time. One per
 * client protocol, shared by its connections' scanners: a reply is decoded
 * in the same turn as its scanner ends it, before any other reply is
 * scanned, and `decodeCompact` checks that the index is the reply's
 * (its size and count) before using it, and lets go of it.
 */
export class ArrayIndex {
  /** The offsets (`count + 1` of them), or null when none is held. */
  starts: Uint32Array | null = null
  /** The reply's elements and bytes. */
  count = 0
  bytes = 0

  /** The offsets if they are those of a reply of `bytes` bytes and `count` elements; forgets them either way. */
  take (count: number, bytes: number): Uint32Array | null {
    const starts = this.starts
    this.starts = null
    return starts !== null && this.count === count && this.bytes === bytes && starts.length === count + 1 ? starts : null
  }
}

/** A reply as `RedisClient.compact` gives it: as `RedisReply`, but every array a `RedisArrayReply`. */
export type CompactReply = string | number | bigint | Buffer | null | RpcError | RedisArrayReply

/**
 * An array reply as its bytes and where each element starts. Elements are
 * decoded on access, as `RedisReply`'s are (a bulk string as a Buffer, an
 * integer as a number, an error as an RpcError element, nil as null), but a
 * nested array is again a `RedisArrayReply`. `bytes(i)` and `string(i)`
 * read a bulk string without the copy `at(i)` makes.
 */
export class RedisArrayReply implements Iterable<CompactReply> {
  /** The reply's bytes: a view of the frame when the frame is most of its buffer, else a copy. */
  readonly #buf: Buffer
  /** Where element i starts (its type byte) in `#buf`; entry `length` is where the last ends. */
  readonly #starts: Uint32Array

  /** Made by `decodeCompact`: `starts` has one entry per element and one for the end. */
  constructor (buf: Buffer, starts: Uint32Array) {
    this.#buf = buf
    this.#starts = starts
  }

  /** How many elements the array has. */
  get length (): number {
    return this.#starts.length - 1
  }

  /** Element i decoded (a bulk string copied into a Buffer of its own); undefined when out of range. */
  at (i: number): CompactReply | undefined {
    const p = this.#start(i)
    return p < 0 ? undefined : valueAt(this.#buf, p, this.#starts[i + 1]!, true)
  }

  /** Bulk string i as a view of the reply's bytes (no copy: it keeps them alive); null for a nil; undefined when i is out of range or not a bulk string. */
  bytes (i: number): Buffer | null | undefined {
    const p = this.#start(i)
    if (p < 0 || this.#buf[p] !== DOLLAR) return undefined
    return bulkAt(this.#buf, p, false)
  }

  /** Bulk string i, or a simple string, as text (`encoding` default utf8); null for a nil; undefined when i is out of range or it is neither. */
  string (i: number, encoding: BufferEncoding = 'utf8'): string | null | undefined {
    const p = this.#start(i)
    if (p < 0) return undefined
    const buf = this.#buf
    const type = buf[p]
    if (type === PLUS) return buf.toString(encoding, p + 1, this.#starts[i + 1]! - 2)
    if (type !== DOLLAR) return undefined
    const q = dataStart(buf, p)
    if (q < 0) return null
    return buf.toString(encoding, q, this.#starts[i + 1]! - 2)
  }

  /** Every element, decoded as `at` decodes it. */
  toArray (): CompactReply[] {
    const out: CompactReply[] = new Array(this.length)
    for (let i = 0; i < out.length; i++) out[i] = valueAt(this.#buf, this.#starts[i]!, this.#starts[i + 1]!, true)
    return out
  }

  * [Symbol.iterator] (): Iterator<CompactReply> {
    for (let i = 0; i < this.length; i++) yield valueAt(this.#buf, this.#starts[i]!, this.#starts[i + 1]!, true)
  }

  #start (i: number): number {
    return Number.isInteger(i) && i >= 0 && i < this.#starts.length - 1 ? this.#starts[i]! : -1
  }
}

/** The RpcError of an error reply: Redis's text, its first word as the name. */
export function redisError (text: string): RpcError {
  const space = text.indexOf(' ')
  const name = space < 0 ? text : text.slice(0, space)
  return new RpcError(ErrorCode.REMOTE, text, { remote: { protocol: 'redis', code: 0, name, fatal: false } })
}

/** Where the data of the bulk string whose `$` is at p starts; -1 for the nil bulk. */
function dataStart (buf: Buffer, p: number): number {
  let q = p + 1
  if (buf[q] === MINUS) return -1
  while (buf[q] !== CR) q++
  return q + 2
}

/** The bulk string at p: a copy, or a view of `buf`; null for the nil bulk. */
function bulkAt (buf: Buffer, p: number, copy: boolean): Buffer | null {
  let q = p + 1
  if (buf[q] === MINUS) return null
  let n = 0
  for (let c = buf[q]!; c !== CR; c = buf[++q]!) n = n * 10 + (c - ZERO)
  const from = q + 2
  if (!copy) return buf.subarray(from, from + n)
  const out = Buffer.allocUnsafe(n)
  buf.copy(out, 0, from, from + n)
  return out
}

/** The value in buf[p, end) (whole and well formed: the reply scanner checked it). */
function valueAt (buf: Buffer, p: number, end: number, copy: boolean): CompactReply {
  const type = buf[p]!
  if (type === DOLLAR) return bulkAt(buf, p, copy)
  if (type === STAR) {
    if (buf[p + 1] === MINUS) return null
    return arrayAt(buf, p)
  }
  const line = buf.toString('utf8', p + 1, end - 2)
  if (type === PLUS) return line
  if (type === MINUS) return redisError(line)
  const n = Number(line)
  return Number.isSafeInteger(n) ? n : BigInt(line)
}

/** Where the (whole, well-formed) value at p ends. */
function skip (buf: Buffer, p: number): number {
  const type = buf[p]!
  if (type !== DOLLAR && type !== STAR) return buf.indexOf(LF, p) + 1
  let q = p + 1
  if (buf[q] === MINUS) return q + 4 // `-1\r\n`
  let n = 0
  for (let c = buf[q]!; c !== CR; c = buf[++q]!) n = n * 10 + (c - ZERO)
  q += 2
  if (type === DOLLAR) return q + n + 2
  for (let i = 0; i < n; i++) q = skip(buf, q)
  return q
}

/** The array whose `*` is at p (not nil), over `buf` as it is. */
function arrayAt (buf: Buffer, p: number): RedisArrayReply {
  let q = p + 1
  let n = 0
  for (let c = buf[q]!; c !== CR; c = buf[++q]!) n = n * 10 + (c - ZERO)
  q += 2
  return new RedisArrayReply(buf, startsOf(buf, q, n))
}

/** Where each of the n elements from q on starts, and where the last ends. */
function startsOf (buf: Buffer, q: number, n: number): Uint32Array {
  const starts = new Uint32Array(n + 1)
  for (let i = 0; i < n; i++) {
    starts[i] = q
    const type = buf[q]!
    if (type === DOLLAR) {
      // The common case in line: `$len\r\n` data `\r\n`.
      let r = q + 1
      if (buf[r] === MINUS) {
        q = r + 4
        continue
      }
      let len = 0
      for (let c = buf[r]!; c !== CR; c = buf[++r]!) len = len * 10 + (c - ZERO)
      q = r + 2 + len + 2
    } else {
      q = skip(buf, q)
    }
  }
  starts[n] = q
  return starts
}

/**
 * The (whole, scanned) reply buf[start, end) in compact form: an array as
 * a `RedisArrayReply` over the reply's bytes (a view of `buf` when the
 * reply is at least half of the memory behind it, as a reply assembled
 * from many reads is, else a copy, so that a small reply does not keep a
 * whole read buffer alive), anything else as `decodeAnswer` decodes it.
 * With `index`, the starts the reply scanner recorded for a large array
 * are used instead of walking its elements again.
 */
export function decodeCompact (buf: Buffer, start: number, end: number, index?: ArrayIndex): CompactReply {
  if (buf[start] !== STAR) return valueAt(buf, start, end, true)
  if (buf[start + 1] === MINUS) return null
  let bytes: Buffer
  if (2 * (end - start) >= buf.buffer.byteLength) {
    bytes = buf.subarray(start, end)
  } else {
    bytes = Buffer.allocUnsafe(end - start)
    buf.copy(bytes, 0, start, end)
  }
  let q = 1
  let n = 0
  for (let c = bytes[q]!; c !== CR; c = bytes[++q]!) n = n * 10 + (c - ZERO)
  // A large array's starts were found by the scanner (offsets from the reply's first byte: positions in `bytes`).
  const known = index !== undefined && n >= INDEXED_ARRAY_MIN ? index.take(n, end - start) : null
  return new RedisArrayReply(bytes, known ?? startsOf(bytes, q + 2, n))
}
