/**
 * RESP2, client side: commands as arrays of bulk strings out, replies in
 * (`redisClientProtocol`, the `ClientProtocol` that `RedisClient` and
 * `Subscription` run on). Replies decode as `RedisReply` (see client.ts),
 * or compact (reply-array.ts) for a command made `compact`.
 */
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameScanner } from '../../codec/frame-decoder.js'
import type { FrameSink } from '../../codec/frame-sink.js'
import { CR, LF } from './resp.js'
import { ArrayIndex, INDEXED_ARRAY_MIN, decodeCompact, redisError, type RedisArrayReply } from './reply-array.js'

export { redisError }

/** A reply, decoded. */
export type RedisReply = string | number | bigint | Buffer | null | RpcError | readonly RedisReply[]

/** A command argument: strings are sent as UTF-8, numbers in decimal. */
export type RedisArg = string | Buffer | Uint8Array | number | bigint

/** Arguments above this size go out as their own slice (writev, no copy). */
const SLICE_ARG_BYTES = 16 * 1024
/** Arrays nest at most this deep in a reply. */
const MAX_DEPTH = 64

/** One command, its arguments as bytes (converted once, when made). */
export class RedisCommand {
  readonly args: readonly Buffer[]
  /** The frame's size: `*N\r\n` and `$len\r\n…\r\n` per argument. */
  readonly bytes: number
  readonly large: boolean
  /** Whether an array reply is decoded compact (a `RedisArrayReply`, see reply-array.ts) rather than as an array. */
  readonly compact: boolean

  constructor (args: readonly RedisArg[], compact = false) {
    if (args.length === 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a Redis command needs at least its name')
    const buffers = args.map(toBuffer)
    let bytes = headerBytes(buffers.length)
    let large = false
    for (const b of buffers) {
      bytes += headerBytes(b.length) + b.length + 2
      if (b.length > SLICE_ARG_BYTES) large = true
    }
    this.args = buffers
    this.bytes = bytes
    this.large = large
    this.compact = compact
  }
}

function toBuffer (arg: RedisArg): Buffer {
  if (Buffer.isBuffer(arg)) return arg
  if (arg instanceof Uint8Array) return Buffer.from(arg.buffer, arg.byteOffset, arg.byteLength)
  return Buffer.from(String(arg))
}

// `*N\r\n` or `$N\r\n`.
function headerBytes (n: number): number {
  return 3 + String(n).length
}

function writeHeader (out: Buffer, at: number, type: string, n: number): number {
  return at + out.write(`${type}${n}\r\n`, at, 'latin1')
}

function writeCommand (command: RedisCommand, out: Buffer, at: number): void {
  let p = writeHeader(out, at, '*', command.args.length)
  for (const arg of command.args) {
    p = writeHeader(out, p, '$', arg.length)
    p += arg.copy(out, p)
    out[p++] = CR
    out[p++] = LF
  }
}

function malformed (message: string): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, `malformed RESP reply: ${message}`)
}

/** At a value's first byte, its type. */
const AT_TYPE = 0
/** In a simple string, error or integer line: looking for its LF. */
const IN_LINE = 1
/** In the length of a `$` or `*` header, up to its CR. */
const IN_LENGTH = 2
/** At the LF after a length's CR. */
const AT_LENGTH_LF = 3
/** Skipping a bulk string's data and the CRLF after it. */
const IN_BULK = 4
/** A length of more digits than this can only be garbage (no frame is that long). */
const MAX_LENGTH_DIGITS = 15
/** The fewest bytes a value takes (`+\r\n`, an empty simple string). */
const MIN_ELEMENT_BYTES = 3
/** Elements left in an array from which bulk string headers are read a word at a time (a DataView per scan). */
const WORD_RUN_MIN = 16
/** `$`, a digit, CR, LF as a little-endian word, the digit masked out; and `$`, two digits, CR. */
const HEAD_1 = 0x0a0d0024
const HEAD_2 = 0x0d000024
/** Entries an array's index starts with (it grows with the elements that arrive, never by its count alone). */
const FIRST_INDEX_ENTRIES = 4096

const PLUS = 0x2b
const MINUS = 0x2d
const COLON = 0x3a
const DOLLAR = 0x24
const STAR = 0x2a
const ZERO = 0x30
const NINE = 0x39

// The first LF in buf[from, end), or -1. Never looks past `end`: a frame
// being assembled lies in a larger buffer whose tail is not its bytes, and
// searching that tail on every read would cost as much as the frame so far.
function indexOfLf (buf: Buffer, from: number, end: number): number {
  if (end === buf.length) return buf.indexOf(LF, from)
  const at = buf.subarray(from, end).indexOf(LF)
  return at < 0 ? -1 : from + at
}

/**
 * Finds where one reply ends, resuming where it stopped when the reply
 * comes back longer (a reply split over many reads is looked at once in
 * all, not again from its first byte on each read). Its state: the phase
 * within the current value, the position of the next byte (relative to
 * the reply's start), the length being read, and how many elements each
 * open array still awaits (innermost last). Given an `ArrayIndex`, it
 * records there where the elements of a top-level array of at least
 * `INDEXED_ARRAY_MIN` elements start (for `decodeCompact`); the offsets it
 * holds meanwhile grow with the elements that arrived (4 bytes each, for
 * at least 3 bytes of reply), so a count claimed is never allocated.
 */
export class ReplyScanner implements FrameScanner {
  #phase = AT_TYPE
  /** The next byte to look at, relative to the reply's first byte. */
  #pos = 0
  /** The type byte of the header or line being read. */
  #type = 0
  /** The length being read: its value, digit count and sign. */
  #num = 0
  #digits = 0
  #negative = false
  /** Where the current bulk string's data and CRLF end, relative to the reply's first byte. */
  #bulkEnd = 0
  /** A lower bound of the reply's size, from its arrays' counts. */
  #atLeast = 0
  /** Elements still to come in each open array, the innermost last. */
  readonly #left: number[] = []
  /** Bytes looked at since made (tests count them: each byte once, however the reply is split). */
  examined = 0

  /** Entries of the element index being recorded (tests check it grows with what arrived, not with a count claimed). */
  get indexEntries (): number {
    return this.#starts === null ? 0 : this.#starts.length
  }

  /** Where this scan started, relative to the reply's first byte (for `examined`). */
  #from = 0

  /** Where a large top-level array's element starts go once it ends, or null. */
  readonly #index: ArrayIndex | null
  /** Its element starts so far (`#recorded` of them), while one is being scanned; else null. */
  #starts: Uint32Array | null = null
  #recorded = 0
  #count = 0

  constructor (index: ArrayIndex | null = null) {
    this.#index = index
  }

  scan (buf: Buffer, start: number, end: number): number | RpcError {
    this.#from = this.#pos
    let p = start + this.#pos
    for (;;) {
      switch (this.#phase) {
        case AT_TYPE: {
          if (p >= end) return this.#more(p, start, 0)
          const type = buf[p]!
          if (type === DOLLAR) {
            // The common case first: bulk strings whose headers and data are all here, one after the other in an array.
            const left = this.#left
            const depth = left.length - 1
            let remaining = depth < 0 ? 1 : left[depth]!
            const first = p
            // The top-level array's element starts, when they are recorded: room for as many as
            // these bytes may hold (a bulk string takes at least 6), so the loop stores without a check.
            const starts = depth === 0 && this.#starts !== null ? this.#room(Math.min(remaining, Math.floor((end - p) / 6) + 1)) : null
            let recorded = this.#recorded
            // Many elements: headers of one or two digits are read four bytes at once.
            const words = remaining >= WORD_RUN_MIN ? new DataView(buf.buffer, buf.byteOffset, buf.byteLength) : null
            // In line (a call per element costs as much as the rest): `$`, digits, CRLF, the data, CRLF.
            while (remaining > 0 && p < end) {
              let stop = 0
              const w = words !== null && p + 4 < end ? words.getUint32(p, true) : 0
              const d1 = ((w >>> 8) & 0xff) - ZERO
              const d2 = ((w >>> 16) & 0xff) - ZERO
              if ((w & 0xffff00ff) === HEAD_1 && d1 >= 0 && d1 <= 9) {
                // `$` digit CR LF
                stop = p + 6 + d1
              } else if ((w & 0xff0000ff) === HEAD_2 && d1 >= 0 && d1 <= 9 && d2 >= 0 && d2 <= 9 && buf[p + 4] === LF) {
                // `$` digit digit CR, then LF
                stop = p + 7 + d1 * 10 + d2
              } else {
                if (buf[p] !== DOLLAR) break
                let q = p + 1
                let n = 0
                const digitsEnd = Math.min(end, q + MAX_LENGTH_DIGITS)
                let c = 0
                for (; q < digitsEnd; q++) {
                  c = buf[q]!
                  if (c < ZERO || c > NINE) break
                  n = n * 10 + (c - ZERO)
                }
                if (q === p + 1 || c !== CR || q + 1 >= end || buf[q + 1] !== LF) break
                stop = q + 4 + n
              }
              if (stop > end) break
              if (buf[stop - 2] !== CR || buf[stop - 1] !== LF) return malformed('a bulk string not ended by CRLF')
              if (starts !== null) starts[recorded++] = p - start
              p = stop
              remaining--
            }
            if (starts !== null) this.#recorded = recorded
            if (p !== first) {
              if (depth < 0) return this.#frameEnded(p, start)
              left[depth] = remaining
              // The innermost array ended: it is a value of the one around it.
              if (remaining === 0) {
                left.pop()
                if (depth === 0 || this.#valueEnded()) return this.#frameEnded(p, start)
              }
              break
            }
            // Not whole here: the general path reads it, whatever its state.
          }
          if (type === DOLLAR || type === STAR) {
            this.#phase = IN_LENGTH
            this.#num = 0
            this.#digits = 0
            this.#negative = false
          } else if (type === PLUS || type === MINUS || type === COLON) {
            this.#phase = IN_LINE
          } else {
            return malformed(`unknown type byte 0x${type.toString(16)}`)
          }
          this.#type = type
          if (this.#starts !== null && this.#left.length === 1) this.#record(p - start)
          p++
          break
        }
        case IN_LINE: {
          const lf = indexOfLf(buf, p, end)
          if (lf < 0) return this.#more(end, start, 0)
          if (buf[lf - 1] !== CR) return malformed('a line not ended by CRLF')
          p = lf + 1
          if (this.#valueEnded()) return this.#frameEnded(p, start)
          break
        }
        case IN_LENGTH: {
          for (; p < end; p++) {
            const c = buf[p]!
            if (c === CR) break
            if (c === MINUS && this.#digits === 0 && !this.#negative) {
              this.#negative = true
              continue
            }
            if (c < ZERO || c > NINE || this.#digits === MAX_LENGTH_DIGITS) return malformed(`bad length in a ${String.fromCharCode(this.#type)} header`)
            this.#num = this.#num * 10 + (c - ZERO)
            this.#digits++
          }
          if (p >= end) return this.#more(p, start, 0)
          if (this.#digits === 0) return malformed(`bad length in a ${String.fromCharCode(this.#type)} header`)
          this.#phase = AT_LENGTH_LF
          p++
          break
        }
        case AT_LENGTH_LF: {
          if (p >= end) return this.#more(p, start, 0)
          if (buf[p] !== LF) return malformed('a line not ended by CRLF')
          p++
          // The one negative length is -1 (nil).
          if (this.#negative && this.#num !== 1) return malformed(`bad length -${this.#num}`)
          const n = this.#negative ? -1 : this.#num
          if (this.#type === DOLLAR && n >= 0) {
            this.#bulkEnd = p - start + n + 2
            this.#phase = IN_BULK
            break
          }
          if (this.#type === STAR && n > 0) {
            if (this.#left.length >= MAX_DEPTH) return malformed('arrays nested too deep')
            // Each element takes at least 3 bytes (`+\r\n`): a count the reply cannot be that long for is refused before it arrives.
            this.#atLeast = Math.max(this.#atLeast, p - start + MIN_ELEMENT_BYTES * n)
            if (this.#left.length === 0 && n >= INDEXED_ARRAY_MIN && this.#index !== null) {
              this.#starts = new Uint32Array(Math.min(n + 1, FIRST_INDEX_ENTRIES))
              this.#recorded = 0
              this.#count = n
            }
            this.#left.push(n)
            this.#phase = AT_TYPE
            break
          }
          // A nil bulk string, a nil or empty array: a whole value.
          if (this.#valueEnded()) return this.#frameEnded(p, start)
          break
        }
        default: { // IN_BULK
          const stop = start + this.#bulkEnd
          // Not there yet: the reply is at least this long (so a too-large one is refused before it arrives).
          if (stop > end) return this.#more(p, start, this.#bulkEnd)
          if (buf[stop - 2] !== CR || buf[stop - 1] !== LF) return malformed('a bulk string not ended by CRLF')
          p = stop
          if (this.#valueEnded()) return this.#frameEnded(p, start)
          break
        }
      }
    }
  }

  // A value ended: counts it in its array, closing every array it completes.
  // True when no array is left open (the reply is whole); else the next value starts.
  #valueEnded (): boolean {
    const left = this.#left
    for (let i = left.length - 1; i >= 0; i--) {
      if (--left[i]! > 0) {
        this.#phase = AT_TYPE
        return false
      }
      left.pop()
    }
    return true
  }

  #frameEnded (p: number, start: number): number {
    this.examined += p - start - this.#from
    if (this.#starts !== null) this.#publish(p - start)
    this.reset()
    return p - start
  }

  // The start of element `#recorded` of the top-level array.
  #record (at: number): void {
    this.#room(1)[this.#recorded++] = at
  }

  // The starts, with room for `more` after those recorded (at most one per element and one for the end): doubled when short.
  #room (more: number): Uint32Array {
    const old = this.#starts!
    const need = this.#recorded + more
    if (need <= old.length) return old
    const grown = new Uint32Array(Math.min(Math.max(2 * old.length, need), this.#count + 1))
    grown.set(old)
    this.#starts = grown
    return grown
  }

  // The array ended `bytes` into the reply: its starts, and its end, go to the index.
  #publish (bytes: number): void {
    const index = this.#index!
    this.#record(bytes)
    index.starts = this.#starts
    index.count = this.#count
    index.bytes = bytes
  }

  #more (p: number, start: number, atLeast: number): number {
    this.#pos = p - start
    this.examined += this.#pos - this.#from
    const bound = Math.max(atLeast, this.#atLeast)
    return bound > 0 ? -bound : 0
  }

  /** The first byte the next scan reads: a line's CR may be the byte before where it stopped; a bulk string's data is skipped, only its CRLF read. */
  retainFrom (): number {
    const phase = this.#phase
    if (phase === IN_LINE) return this.#pos - 1
    if (phase === IN_BULK) return this.#bulkEnd - 2
    return this.#pos
  }

  reset (): void {
    this.#phase = AT_TYPE
    this.#pos = 0
    this.#atLeast = 0
    this.#left.length = 0
    this.#starts = null
  }
}


/** Where the value `decodeAt` decoded last ends (no tuple made per value). */
let decodedEnd = 0

// The (complete, scanned) value at p; where it ends goes to `decodedEnd`.
// Lengths are read from the bytes as the scanner checked them: digits, or -1.
function decodeAt (buf: Buffer, p: number): RedisReply {
  const type = buf[p]!
  if (type === DOLLAR || type === STAR) {
    let q = p + 1
    if (buf[q] === MINUS) {
      decodedEnd = buf.indexOf(LF, q) + 1
      return null
    }
    let n = 0
    for (let c = buf[q]!; c !== CR; c = buf[++q]!) n = n * 10 + (c - ZERO)
    const stop = q + 2
    if (type === DOLLAR) {
      // A copy: a view would pin the whole read chunk (or reply).
      const bytes = Buffer.allocUnsafe(n)
      buf.copy(bytes, 0, stop, stop + n)
      decodedEnd = stop + n + 2
      return bytes
    }
    const items: RedisReply[] = new Array(n)
    let at = stop
    for (let i = 0; i < n; i++) {
      items[i] = decodeAt(buf, at)
      at = decodedEnd
    }
    decodedEnd = at
    return items
  }
  const stop = buf.indexOf(LF, p) + 1
  decodedEnd = stop
  const line = buf.toString('utf8', p + 1, stop - 2)
  if (type === PLUS) return line
  if (type === MINUS) return redisError(line)
  const n = Number(line)
  return Number.isSafeInteger(n) ? n : BigInt(line)
}

/** Decodes the (complete, scanned) value at p; returns it and where it ends. */
export function decodeValue (buf: Buffer, p: number): [RedisReply, number] {
  const value = decodeAt(buf, p)
  return [value, decodedEnd]
}

function putLatin1 (out: FrameSink, text: string): void {
  const at = out.reserve(text.length)
  out.buffer.write(text, at, 'latin1')
}

// Errors after which the command did not run: worth trying again.
const RETRYABLE_ERRORS: ReadonlySet<string> = new Set(['BUSY', 'LOADING', 'TRYAGAIN'])
// Commands safe to send again after a lost connection: they change nothing.
const READ_ONLY: ReadonlySet<string> = new Set(['GET', 'MGET', 'EXISTS', 'STRLEN', 'TTL', 'PTTL', 'TYPE', 'LRANGE', 'LLEN',
  'SMEMBERS', 'SCARD', 'HGET', 'HGETALL', 'ZRANGE', 'ZCARD', 'PING', 'ECHO', 'DBSIZE', 'KEYS'])

/** RESP2, client side: replies decode as `RedisReply`, a `compact` command's array reply as a `RedisArrayReply`. */
export function redisClientProtocol (): ClientProtocol<RedisCommand, RedisReply | RedisArrayReply> {
  // A large array's element starts, from the scanner that ended it to the decodeAnswer that follows in the same turn.
  const index = new ArrayIndex()
  return {
    name: 'redis',
    framing: { scanner: () => new ReplyScanner(index) },
    matching: 'in-order',
    encode (command, _id, out): void {
      if (!command.large) {
        const at = out.reserve(command.bytes)
        writeCommand(command, out.buffer, at)
        return
      }
      let head = `*${command.args.length}\r\n`
      // Each argument appended as it is (a large one not copied), between the headers and CRLFs around it.
      for (const arg of command.args) {
        putLatin1(out, `${head}$${arg.length}\r\n`)
        out.append(arg)
        head = '\r\n'
      }
      putLatin1(out, head)
    },
    decodeAnswer (command, buf, start, end) {
      if (command.compact) return decodeCompact(buf, start, end, index)
      // An index recorded for this reply is not needed: not kept alive either.
      if (index.starts !== null) index.starts = null
      return decodeAt(buf, start)
    },
    retryable: (error, command) => error.remote !== undefined
      ? RETRYABLE_ERRORS.has(error.remote.name)
      : READ_ONLY.has(command.args[0]!.toString('latin1').toUpperCase())
  }
}
