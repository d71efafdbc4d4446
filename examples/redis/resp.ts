import { ErrorCode, RpcError, type AnswerSlices, type CallHead, type CallInfo, type FrameScanner, type FrameSink, type RefusalReason, type ScanFraming, type ServerProtocol } from '../../reactor/index.js'
import { commandOf, UNKNOWN_COMMAND, type Command } from './commands.js'
import { scanWholeArray } from './resp-scan-fast.js'
import type { Subscriptions } from './subscriptions.js'

/**
 * RESP2, the Redis serialization protocol, as a nyala `ServerProtocol`.
 *
 * A request is an array of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`)
 * or an inline command (`GET k\r\n`, or `\n` alone, split on spaces with
 * Redis's quoting rules). There is no length prefix, so frames are found by
 * a resumable scan (`RespScanner`), and no request id, so answers leave in
 * request order (`ordering: 'in-order'`). Replies are simple strings
 * (`+OK`), errors (`-ERR ...`), integers (`:1`), bulk strings (`$1\r\nv`,
 * `$-1` for nil) and arrays of them (`*-1` for a nil array).
 *
 * What Redis 7 does on bad input is the reference: a protocol error (a bad
 * array or bulk length, something other than `$` where a bulk must start,
 * an inline line over 64 KiB, unbalanced quotes) is answered
 * `-ERR Protocol error: ...` after the answers of the requests before it,
 * and the connection closes: the scanner (or `decodeHead`, for what only a
 * whole inline line shows) returns a `RespProtocolError` in Redis's words,
 * and the protocol's `protocolError` answers it. An empty command (`*0`,
 * `*-1`, a blank inline line) is not a request: Redis answers nothing and
 * gives it no place in the order, and neither does this server
 * (`CallHead.skip`). Like Redis, the two bytes after a bulk string's
 * data are skipped without being looked at (they should be CRLF; Redis 7
 * takes `$3\r\nfooXY` as `foo`), and a line ends at its CR (the byte after it
 * is skipped, as Redis skips it).
 *
 * Unlike Redis, which waits for the end of a line before judging it, the
 * scanner refuses at the first byte that can never become a valid frame: a
 * non-digit in a length, a digit that takes a bulk length past the limit, a
 * byte other than `$` that starts a bulk. Redis's "too big mbulk count
 * string" and "too big bulk count string" are thus never needed (a count
 * line goes wrong long before 64 KiB); "too big inline request" is.
 */

export const CR = 0x0d
export const LF = 0x0a
const STAR = 0x2a
const DOLLAR = 0x24
const MINUS = 0x2d
const ZERO = 0x30
const NINE = 0x39

/** Redis's PROTO_INLINE_MAX_SIZE: an inline line (or a count line) longer than this without its end is refused. */
export const INLINE_MAX_BYTES = 64 * 1024
/** Redis's proto-max-bulk-len default: 512 MiB. */
export const DEFAULT_PROTO_MAX_BULK_LEN = 512 * 1024 * 1024
/**
 * The default bound on a command's length, its name and arguments (the
 * array's `*N`): 1M. Redis allows INT_MAX, but here every argument costs
 * two numbers of the request's ranges (and a handler often a string or a
 * Buffer) on top of its bytes: a 50 MiB frame of empty bulks (`$0\r\n\r\n`)
 * would be ~17M arguments and some 200 MB of ranges. Past the bound the
 * count is answered as Redis answers one out of its range,
 * `-ERR Protocol error: invalid multibulk length`, at its first digit too
 * many, and the connection closes; an inline command with more words gets
 * the same. `RespProtocolOptions.maxArguments` (the example's
 * `--max-arguments`) changes it.
 */
export const DEFAULT_MAX_ARGUMENTS = 1024 * 1024
/** Digits of a negative array length accepted (any negative length is an empty command, as in Redis); more is refused. */
const MAX_NEGATIVE_DIGITS = 18

/** The protocol errors, in Redis 7's words (networking.c). */
export const ProtocolErrors = {
  multibulkLength: 'Protocol error: invalid multibulk length',
  bulkLength: 'Protocol error: invalid bulk length',
  inlineTooBig: 'Protocol error: too big inline request',
  mbulkCountTooBig: 'Protocol error: too big mbulk count string',
  bulkCountTooBig: 'Protocol error: too big bulk count string',
  unbalancedQuotes: 'Protocol error: unbalanced quotes in request',
  expectedDollar: (got: number): string => `Protocol error: expected '$', got '${String.fromCharCode(got)}'`
} as const

/**
 * A stream this protocol cannot go on reading, with Redis's words for it
 * (`ProtocolErrors`): answered `-ERR <message>` before the close. Other
 * errors (a frame over the server's limit) close without a reply, as Redis
 * closes a client past its query buffer limit.
 */
export class RespProtocolError extends RpcError {
  constructor (message: string) {
    super(ErrorCode.MALFORMED_FRAME, message)
    this.name = 'RespProtocolError'
  }
}

/**
 * A request as handlers get it: its arguments (the command name excluded)
 * as ranges of `buf`, a view of the frame (or, for an inline command with
 * quotes, a buffer of its own). Handlers read what they need: a latin1
 * string for a key (`str`), a copy of the bytes to keep (`bytes`), a number
 * (`int`), an option word compared without making a string (`is`).
 */
export class RespRequest {
  readonly buf: Buffer
  /** start, end of argument i (0: the first after the command name) at 2i, 2i+1. */
  readonly ranges: number[]
  readonly command: Command

  constructor (buf: Buffer, ranges: number[], command: Command) {
    this.buf = buf
    this.ranges = ranges
    this.command = command
  }

  /** The number of arguments after the command name. */
  get argc (): number {
    return this.ranges.length >> 1
  }

  /** Argument i as a latin1 string: one char per byte, so binary-safe (keys, members, fields). */
  str (i: number): string {
    return latin1Slice.call(this.buf, this.ranges[2 * i]!, this.ranges[2 * i + 1]!)
  }

  /** At most the first `max` bytes of argument i, as a latin1 string (for error messages: no string of a whole large argument). */
  prefix (i: number, max: number): string {
    const start = this.ranges[2 * i]!
    return latin1Slice.call(this.buf, start, Math.min(this.ranges[2 * i + 1]!, start + Math.max(0, max)))
  }

  /** A copy of argument i's bytes, to keep (values). */
  bytes (i: number): Buffer {
    const start = this.ranges[2 * i]!
    const end = this.ranges[2 * i + 1]!
    const out = Buffer.allocUnsafe(end - start)
    this.buf.copy(out, 0, start, end)
    return out
  }

  length (i: number): number {
    return this.ranges[2 * i + 1]! - this.ranges[2 * i]!
  }

  /** Whether argument i is `word` (given in lower case), ignoring ASCII case. */
  is (i: number, word: string): boolean {
    const start = this.ranges[2 * i]!
    if (this.ranges[2 * i + 1]! - start !== word.length) return false
    const buf = this.buf
    for (let k = 0; k < word.length; k++) {
      let c = buf[start + k]!
      if (c >= 0x41 && c <= 0x5a) c |= 0x20
      if (c !== word.charCodeAt(k)) return false
    }
    return true
  }

  /**
   * Argument i as a signed 64-bit integer in Redis's strict form (string2ll:
   * no sign but `-`, no leading zeros, no spaces), or null. Numbers beyond
   * 2^53 come back as bigint.
   */
  int (i: number): number | bigint | null {
    return parseInteger(this.buf, this.ranges[2 * i]!, this.ranges[2 * i + 1]!)
  }
}

// Buffer's own latin1 methods, without toString's and write's argument checks (as codec/protobuf/flat-codec.ts uses them).
interface Latin1Buffer { latin1Slice: (start: number, end: number) => string, latin1Write: (s: string, at: number, len?: number) => number }
const latin1Methods = Buffer.prototype as unknown as Latin1Buffer
const latin1Slice = latin1Methods.latin1Slice
const latin1Write = latin1Methods.latin1Write

/** Parses buf[start, end) as Redis's string2ll does; null if it is not a 64-bit integer. */
export function parseInteger (buf: Uint8Array, start: number, end: number): number | bigint | null {
  const n = end - start
  if (n === 0 || n > 20) return null
  let p = start
  const negative = buf[p] === MINUS
  if (negative) {
    p++
    if (p === end) return null
  }
  const first = buf[p]!
  if (first === ZERO) return n === 1 ? 0 : null
  if (first < ZERO || first > NINE) return null
  if (end - p <= 15) {
    let v = 0
    for (; p < end; p++) {
      const c = buf[p]!
      if (c < ZERO || c > NINE) return null
      v = v * 10 + (c - ZERO)
    }
    return negative ? -v : v
  }
  let v = 0n
  for (; p < end; p++) {
    const c = buf[p]!
    if (c < ZERO || c > NINE) return null
    v = v * 10n + BigInt(c - ZERO)
  }
  if (negative) v = -v
  if (v > 0x7fffffffffffffffn || v < -0x8000000000000000n) return null
  return Number.isSafeInteger(Number(v)) ? Number(v) : v
}

/**
 * What a connection's requests share: CLIENT SETNAME's name, an id for
 * HELLO and CLIENT ID, and its Pub/Sub subscriptions. One per connection,
 * made by the protocol's `connectionState`; handlers see it as
 * `ctx.connectionState`.
 */
export class ConnectionState {
  readonly id: number
  name = ''
  /** The channels and patterns it is subscribed to (subscriptions.ts, filled by pubsub.ts); null when none: then it is not in subscribed mode. */
  subscriptions: Subscriptions | null = null
  constructor (id: number) {
    this.id = id
  }
}

// Scanner states.
const S_START = 0
/** In the `*` line: reading the array length. */
const S_COUNT = 1
/** At the first byte of a bulk's header, which must be `$`. */
const S_BULK_HEAD = 2
/** In the `$` line: reading the bulk length. */
const S_BULK_LEN = 3
/** Skipping the bulk's data and the two bytes after it. */
const S_BULK_DATA = 4
/** Looking for the inline line's LF. */
const S_INLINE = 5

/**
 * Finds where each RESP request ends, resuming where it stopped when a
 * frame comes back longer (positions are kept relative to the frame's
 * start). A frame is a whole, well-formed request (`decodeHead` relies on
 * it); at the first byte that shows the request can never be valid, the
 * scan returns a `RespProtocolError` in Redis's words instead.
 */
export class RespScanner implements FrameScanner {
  readonly #maxBulk: number
  readonly #maxArguments: number
  #phase = S_START
  /** The next byte to look at, relative to the frame's start. */
  #pos = 0
  /** Bulks still to come in this array. */
  #left = 0
  /** The number being read, its digit count, and its sign. */
  #num = 0
  #digits = 0
  #negative = false
  /** Where the current bulk's data and its CRLF end, relative to the frame's start. */
  #dataEnd = 0

  constructor (maxBulk: number, maxArguments = DEFAULT_MAX_ARGUMENTS) {
    this.#maxBulk = maxBulk
    this.#maxArguments = maxArguments
  }

  reset (): void {
    this.#phase = S_START
    this.#pos = 0
  }

  // The frame's size, 0 or -(lower bound) for more bytes, or the protocol error at the first bad byte.
  scan (buf: Buffer, start: number, end: number): number | RpcError {
    let p = start + this.#pos
    for (;;) {
      switch (this.#phase) {
        case S_START: {
          if (p >= end) return this.#more(p, start, 0)
          if (buf[p] === STAR) {
            // A whole, well-formed array in one pass; anything else is read from here by the states below.
            const size = scanWholeArray(buf, p, end, this.#maxArguments, this.#maxBulk)
            if (size > 0) return size
            this.#phase = S_COUNT
            this.#num = 0
            this.#digits = 0
            this.#negative = false
            p++
          } else {
            this.#phase = S_INLINE
          }
          break
        }
        case S_COUNT: {
          for (; p < end; p++) {
            const c = buf[p]!
            if (c === CR) break
            if (!this.#digit(c, this.#maxArguments, true)) return new RespProtocolError(ProtocolErrors.multibulkLength)
          }
          // The CR and the byte after it.
          if (p + 1 >= end) return this.#more(p, start, 0)
          if (this.#digits === 0) return new RespProtocolError(ProtocolErrors.multibulkLength)
          p += 2
          const count = this.#negative ? 0 : this.#num
          if (count === 0) return p - start // `*0`, `*-1`: an empty command (decodeHead skips it)
          this.#left = count
          this.#phase = S_BULK_HEAD
          break
        }
        case S_BULK_HEAD: {
          if (p >= end) return this.#more(p, start, 0)
          if (buf[p] !== DOLLAR) return new RespProtocolError(ProtocolErrors.expectedDollar(buf[p]!))
          this.#num = 0
          this.#digits = 0
          this.#negative = false
          this.#phase = S_BULK_LEN
          p++
          break
        }
        case S_BULK_LEN: {
          for (; p < end; p++) {
            const c = buf[p]!
            if (c === CR) break
            if (!this.#digit(c, this.#maxBulk, false)) return new RespProtocolError(ProtocolErrors.bulkLength)
          }
          if (p + 1 >= end) return this.#more(p, start, 0)
          if (this.#digits === 0) return new RespProtocolError(ProtocolErrors.bulkLength)
          p += 2
          this.#dataEnd = p - start + this.#num + 2
          this.#phase = S_BULK_DATA
          break
        }
        case S_BULK_DATA: {
          const dataEnd = start + this.#dataEnd
          if (dataEnd > end) return this.#more(end, start, this.#dataEnd)
          p = dataEnd
          if (--this.#left === 0) return p - start
          this.#phase = S_BULK_HEAD
          break
        }
        case S_INLINE: {
          const limit = Math.min(end, start + INLINE_MAX_BYTES + 1)
          // Never past `limit`: beyond `end` lies the unfilled rest of the buffer the frame is assembled in.
          const lf = p < limit ? (limit === buf.length ? buf : buf.subarray(0, limit)).indexOf(LF, p) : -1
          if (lf >= 0) return lf + 1 - start
          if (limit - start > INLINE_MAX_BYTES) return new RespProtocolError(ProtocolErrors.inlineTooBig)
          return this.#more(end, start, 0)
        }
      }
    }
  }

  // One more byte of a length: false when the byte shows it can never be valid
  // (string2ll's rules: an optional `-` for array lengths only, no leading zero,
  // at most `max`).
  #digit (c: number, max: number, signed: boolean): boolean {
    if (c === MINUS && signed && this.#digits === 0 && !this.#negative) {
      this.#negative = true
      return true
    }
    if (c < ZERO || c > NINE) return false
    if (this.#digits > 0 && this.#num === 0) return false // a leading zero
    if (c === ZERO && this.#digits === 0 && this.#negative) return false // `-0`
    this.#digits++
    if (this.#negative) return this.#digits <= MAX_NEGATIVE_DIGITS
    this.#num = this.#num * 10 + (c - ZERO)
    return this.#num <= max
  }

  #more (p: number, start: number, atLeast: number): number {
    this.#pos = p - start
    return atLeast > 0 ? -atLeast : 0
  }

  /** The first byte the next scan reads: a bulk's data is skipped, not read. */
  retainFrom (): number {
    return this.#phase === S_BULK_DATA ? this.#dataEnd : this.#pos
  }
}

export interface RespProtocolOptions {
  /** The largest bulk string (Redis's proto-max-bulk-len); default 512 MiB, and never above the largest frame less 4 KiB. */
  protoMaxBulkLen?: number
  /** The largest request frame (the server's `maxMessageBytes`); default 50 MiB like the server's, at least 1 MiB. */
  maxFrameBytes?: number
  /** The most elements of a command, its name included (see DEFAULT_MAX_ARGUMENTS); default 1M, at least 1. */
  maxArguments?: number
}

/** The server's default largest frame (its `maxMessageBytes`). */
export const DEFAULT_MAX_FRAME_BYTES = 50 * 1024 * 1024
/** Room in a frame for the headers and other arguments around its largest bulk. */
const FRAME_ROOM_BYTES = 4096

/** The limits the protocol ends up with: the bulk limit is never above the frame limit. */
export function respLimits (options: RespProtocolOptions = {}): { maxBulk: number, maxFrameBytes: number } {
  const maxFrameBytes = Math.max(options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES, 1024 * 1024)
  const maxBulk = Math.min(options.protoMaxBulkLen ?? DEFAULT_PROTO_MAX_BULK_LEN, maxFrameBytes - FRAME_ROOM_BYTES)
  return { maxBulk, maxFrameBytes }
}

/** The RESP2 protocol, for handlers that take `RespRequest` and return `Reply`. */
export function respProtocol (options: RespProtocolOptions = {}): ServerProtocol<RespRequest, Reply> {
  const { maxBulk, maxFrameBytes } = respLimits(options)
  const maxArguments = Math.max(1, options.maxArguments ?? DEFAULT_MAX_ARGUMENTS)
  let nextConnectionId = 1
  const framing: ScanFraming = {
    scanner: () => new RespScanner(maxBulk, maxArguments)
  }
  return {
    name: 'redis',
    framing,
    ordering: 'in-order',
    maxFrameBytes,

    connectionState: (): ConnectionState => new ConnectionState(nextConnectionId++),

    decodeHead: (buf: Buffer, start: number, end: number, head: CallHead): RpcError | null => {
      const request = buf[start] === STAR ? decodeArray(buf, start) : decodeInline(buf, start, end, maxArguments)
      if (request === null) {
        // An empty command: Redis answers nothing.
        head.skip = true
        return null
      }
      if (request instanceof RpcError) return request
      head.service = 'redis'
      head.method = request.command.method
      head.routeKey = request.command
      head.data = request
      return null
    },

    decodeRequest: (_route, _buf, head) => head.data as RespRequest,

    encode: (_call, reply, out) => { putReply(reply, out) },
    // Pushes (Pub/Sub messages) and the parts of a streamed answer (SUBSCRIBE's confirmations but the last) are replies too.
    encodePush: (message: unknown, out) => {
      if (message instanceof EncodedPush) message.encode(out)
      else putReply(message as Reply, out)
    },
    encodePart: (_call, part: unknown, out) => { putReply(part as Reply, out) },

    // Redis's words for a protocol error; anything else (a frame over the limit) closes without a reply.
    protocolError: (error: RpcError): AnswerSlices =>
      error instanceof RespProtocolError ? [Buffer.from(`-ERR ${oneLine(error.message)}\r\n`, 'latin1')] : null,

    refusal: (_call: CallInfo, reason: RefusalReason, message: string): AnswerSlices =>
      [Buffer.from(`${refusalWords(reason)} ${oneLine(message)}\r\n`, 'latin1')]
  }
}

/** The error prefix of a refusal: overload is `-BUSY`, the rest `-ERR`. */
export function refusalWords (reason: RefusalReason): string {
  switch (reason) {
    case 'busy': return '-BUSY server overloaded:'
    case 'expired': return '-ERR request expired in the queue:'
    case 'timed-out': return '-ERR request timed out:'
    case 'shutdown': return '-ERR server shutting down:'
    case 'unavailable': return '-ERR server not ready:'
    case 'no-service':
    case 'no-method': return '-ERR unknown command:'
    case 'invalid': return '-ERR invalid request:'
    case 'failed': return '-ERR internal error:'
    case 'abandoned': return '-ERR handler abandoned:'
  }
}

/** Error text on one line (Redis turns CR and LF into spaces in errors). */
export function oneLine (text: string): string {
  return text.replace(/[\r\n]/g, ' ')
}

/**
 * An array frame, which the scanner let through only whole and well formed:
 * its bulks' ranges and command, or null for an empty command (`*0`, `*-1`).
 * Every length is digits up to a CR, and the byte after the CR and the two
 * after a bulk's data are skipped.
 */
function decodeArray (buf: Buffer, start: number): RespRequest | null {
  if (buf[start + 1] === MINUS) return null
  let p = start + 1
  let count = 0
  for (let c = buf[p]!; c !== CR; c = buf[++p]!) count = count * 10 + (c - ZERO)
  if (count === 0) return null
  p += 2 // past the count's CR and the byte after it: at the name's `$`
  let length = 0
  for (let c = buf[++p]!; c !== CR; c = buf[++p]!) length = length * 10 + (c - ZERO)
  const nameStart = p + 2
  const nameEnd = nameStart + length
  p = nameEnd + 2
  // The command is known before its arguments are read, so their ranges go in an array of the exact size.
  let command = commandOf(buf, nameStart, nameEnd)
  let ranges: number[]
  let at = 0
  if (command !== null) {
    ranges = new Array<number>(2 * (count - 1))
  } else {
    // Unknown: the name goes first, for the error that quotes it.
    command = UNKNOWN_COMMAND
    ranges = new Array<number>(2 * count)
    ranges[at++] = nameStart
    ranges[at++] = nameEnd
  }
  for (let i = 1; i < count; i++) {
    // p is at the bulk's `$`.
    length = 0
    for (let c = buf[++p]!; c !== CR; c = buf[++p]!) length = length * 10 + (c - ZERO)
    ranges[at++] = p + 2
    ranges[at++] = p + 2 + length
    p += length + 4
  }
  return new RespRequest(buf, ranges, command)
}

function isSpace (c: number): boolean {
  // C's isspace: space, \t, \n, \v, \f, \r.
  return c === 0x20 || (c >= 0x09 && c <= 0x0d)
}

function hexValue (c: number): number {
  if (c >= ZERO && c <= NINE) return c - ZERO
  const lower = c | 0x20
  return lower >= 0x61 && lower <= 0x66 ? lower - 0x61 + 10 : -1
}

/**
 * An inline command: the line up to its LF (a CR before it dropped), split
 * as Redis's sdssplitargs splits it: on whitespace; "double quotes" with
 * \n \r \t \b \a \\ \" and \xHH escapes; 'single quotes' with \' only; a
 * closing quote must be followed by whitespace or the end. Without quotes
 * the arguments are views of the frame; with them, of a buffer of their own.
 */
function decodeInline (buf: Buffer, start: number, end: number, maxArguments: number): RespRequest | RespProtocolError | null {
  let lineEnd = end - 1
  if (lineEnd > start && buf[lineEnd - 1] === CR) lineEnd--
  let quoted = false
  for (let k = start; k < lineEnd; k++) {
    const c = buf[k]!
    if (c === 0x22 || c === 0x27) { quoted = true; break }
  }
  let ranges: number[]
  let source = buf
  if (!quoted) {
    ranges = []
    let p = start
    for (;;) {
      while (p < lineEnd && isSpace(buf[p]!)) p++
      if (p >= lineEnd) break
      const from = p
      while (p < lineEnd && !isSpace(buf[p]!)) p++
      ranges.push(from, p)
    }
  } else {
    const split = splitQuoted(buf, start, lineEnd)
    if (split === null) return new RespProtocolError(ProtocolErrors.unbalancedQuotes)
    source = split.buf
    ranges = split.ranges
  }
  if (ranges.length === 0) return null // a blank line: an empty command
  if (ranges.length > 2 * maxArguments) return new RespProtocolError(ProtocolErrors.multibulkLength)
  const command = commandOf(source, ranges[0]!, ranges[1]!)
  if (command === null) return new RespRequest(source, ranges, UNKNOWN_COMMAND)
  return new RespRequest(source, ranges.slice(2), command)
}

function splitQuoted (buf: Buffer, start: number, end: number): { buf: Buffer, ranges: number[] } | null {
  const out = Buffer.allocUnsafe(end - start)
  const ranges: number[] = []
  let o = 0
  let p = start
  for (;;) {
    while (p < end && isSpace(buf[p]!)) p++
    if (p >= end) return { buf: out, ranges }
    const from = o
    let inDouble = false
    let inSingle = false
    let done = false
    while (!done) {
      if (inDouble) {
        if (p >= end) return null
        const c = buf[p]!
        if (c === 0x5c && p + 3 < end && buf[p + 1] === 0x78 && hexValue(buf[p + 2]!) >= 0 && hexValue(buf[p + 3]!) >= 0) {
          out[o++] = hexValue(buf[p + 2]!) * 16 + hexValue(buf[p + 3]!)
          p += 4
        } else if (c === 0x5c && p + 1 < end) {
          p++
          const e = buf[p]!
          out[o++] = e === 0x6e ? 0x0a : e === 0x72 ? 0x0d : e === 0x74 ? 0x09 : e === 0x62 ? 0x08 : e === 0x61 ? 0x07 : e
          p++
        } else if (c === 0x22) {
          // The closing quote must be followed by a space or the end.
          if (p + 1 < end && !isSpace(buf[p + 1]!)) return null
          done = true
          p++
        } else {
          out[o++] = c
          p++
        }
      } else if (inSingle) {
        if (p >= end) return null
        const c = buf[p]!
        if (c === 0x5c && p + 1 < end && buf[p + 1] === 0x27) {
          out[o++] = 0x27
          p += 2
        } else if (c === 0x27) {
          if (p + 1 < end && !isSpace(buf[p + 1]!)) return null
          done = true
          p++
        } else {
          out[o++] = c
          p++
        }
      } else {
        if (p >= end) { done = true; break }
        const c = buf[p]!
        if (isSpace(c)) { done = true; p++; break }
        if (c === 0x22) inDouble = true
        else if (c === 0x27) inSingle = true
        else out[o++] = c
        p++
      }
    }
    ranges.push(from, o)
  }
}

// ---------------------------------------------------------------------------
// Replies.

/**
 * A reply, as handlers return it:
 * - a number or bigint: an integer (`:1`);
 * - a Buffer: a bulk string; a string: a bulk string of its latin1 bytes;
 * - null: the nil bulk string (`$-1`);
 * - an array of replies: an array;
 * - a `Raw`: bytes sent as they are (simple strings, errors, the nil array),
 *   made once and shared.
 */
export type Reply = number | bigint | Buffer | string | null | Raw | readonly Reply[]

/**
 * A push already encoded, as the slices to send (Pub/Sub messages: encoded
 * once per PUBLISH and pattern, the same slices queued on every
 * subscriber). The slices are never written over.
 */
export class EncodedPush {
  readonly #slices: Uint8Array[]
  constructor (slices: Uint8Array[]) {
    this.#slices = slices
  }

  /** The push's bytes, in order. */
  get slices (): Uint8Array[] {
    return this.#slices
  }

  /** Writes the push into `out` (a subclass may lay its bytes out there itself). */
  encode (out: FrameSink): void {
    for (const slice of this.#slices) out.append(slice)
  }
}

/** Pre-encoded reply bytes. */
export class Raw {
  readonly bytes: Buffer
  constructor (bytes: Buffer) {
    this.bytes = bytes
  }
}

/** A simple string reply (`+OK`). */
export function simple (text: string): Raw {
  return new Raw(Buffer.from(`+${text}\r\n`, 'latin1'))
}

/** An error reply; `text` starts with its code (`ERR ...`, `WRONGTYPE ...`). */
export function error (text: string): Raw {
  return new Raw(Buffer.from(`-${oneLine(text)}\r\n`, 'latin1'))
}

export const OK = simple('OK')
export const PONG = simple('PONG')
export const NIL_ARRAY = new Raw(Buffer.from('*-1\r\n', 'latin1'))

/** Bulk strings above this size are sent as their own slice, without a copy (stored values are never written over). */
export const SLICE_BULK_BYTES = 64 * 1024

const NIL_BULK_BYTES = 5 // $-1\r\n

function digitsOf (n: number): number {
  // n >= 0, an integer
  if (n < 10) return 1
  if (n < 100) return 2
  if (n < 1000) return 3
  if (n < 10000) return 4
  if (n < 100000) return 5
  return String(n).length
}

function integerLength (n: number): number {
  return n < 0 ? 1 + digitsOf(-n) : digitsOf(n)
}

/** The reply's size in bytes, or -1 when it is a large bulk string (sent by `replySlices`). */
export function replyLength (reply: Reply): number {
  if (reply === null) return NIL_BULK_BYTES
  switch (typeof reply) {
    case 'number': return Number.isSafeInteger(reply) ? 3 + integerLength(reply) : 3 + String(Math.trunc(reply)).length
    case 'bigint': return 3 + String(reply).length
    case 'string': return 5 + digitsOf(reply.length) + reply.length
  }
  if (reply instanceof Raw) return reply.bytes.length
  if (reply instanceof Uint8Array) {
    if (reply.length > SLICE_BULK_BYTES) return -1
    return 5 + digitsOf(reply.length) + reply.length
  }
  const items = reply as readonly Reply[]
  let bytes = 3 + digitsOf(items.length)
  for (let i = 0; i < items.length; i++) {
    const item = items[i]!
    // Large bulks inside arrays are copied.
    bytes += item instanceof Uint8Array ? 5 + digitsOf(item.length) + item.length : replyLength(item)
  }
  return bytes
}

function writeInt (out: Buffer, at: number, n: number): number {
  if (n < 0) {
    out[at++] = MINUS
    n = -n
  }
  if (n < 10) {
    out[at] = ZERO + n
    return at + 1
  }
  const digits = digitsOf(n)
  let p = at + digits - 1
  while (n >= 10) {
    const q = Math.floor(n / 10)
    out[p--] = ZERO + (n - q * 10)
    n = q
  }
  out[p] = ZERO + n
  return at + digits
}

function writeHeader (out: Buffer, at: number, type: number, n: number): number {
  out[at] = type
  at = writeInt(out, at + 1, n)
  out[at] = CR
  out[at + 1] = LF
  return at + 2
}

/** Writes the reply at `out[at]`; returns where it ends. */
export function writeReply (reply: Reply, out: Buffer, at: number): number {
  if (reply === null) {
    out[at] = DOLLAR; out[at + 1] = MINUS; out[at + 2] = 0x31; out[at + 3] = CR; out[at + 4] = LF
    return at + 5
  }
  switch (typeof reply) {
    case 'number':
      if (Number.isSafeInteger(reply)) return writeHeader(out, at, 0x3a, reply)
      at += latin1Write.call(out, `:${Math.trunc(reply)}\r\n`, at)
      return at
    case 'bigint':
      return at + latin1Write.call(out, `:${reply}\r\n`, at)
    case 'string':
      at = writeHeader(out, at, DOLLAR, reply.length)
      at += latin1Write.call(out, reply, at)
      out[at] = CR; out[at + 1] = LF
      return at + 2
  }
  if (reply instanceof Raw) {
    out.set(reply.bytes, at)
    return at + reply.bytes.length
  }
  if (reply instanceof Uint8Array) {
    at = writeHeader(out, at, DOLLAR, reply.length)
    out.set(reply, at)
    at += reply.length
    out[at] = CR; out[at + 1] = LF
    return at + 2
  }
  const items = reply as readonly Reply[]
  at = writeHeader(out, at, STAR, items.length)
  for (let i = 0; i < items.length; i++) at = writeReply(items[i]!, out, at)
  return at
}

const CRLF = Buffer.from('\r\n', 'latin1')

/** A large bulk string as slices: its header, its bytes (not copied), CRLF. */
export function replySlices (reply: Reply): Uint8Array[] {
  const value = reply as Buffer
  const head = Buffer.allocUnsafe(3 + digitsOf(value.length))
  writeHeader(head, 0, DOLLAR, value.length)
  return [head, value, CRLF]
}

/** Encodes a reply into a sink: measured, then written in its room; a large bulk string's bytes appended, not copied. */
export function putReply (reply: Reply, out: FrameSink): void {
  const length = replyLength(reply)
  if (length < 0) {
    const slices = replySlices(reply)
    for (let i = 0; i < slices.length; i++) out.append(slices[i]!)
    return
  }
  const at = out.reserve(length)
  writeReply(reply, out.buffer, at)
}

/** A whole reply as one buffer (tests, and replies kept for later). */
export function encodeReply (reply: Reply): Buffer {
  const length = replyLength(reply)
  if (length < 0) return Buffer.concat(replySlices(reply))
  const out = Buffer.allocUnsafe(length)
  writeReply(reply, out, 0)
  return out
}
