import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameScanner, ScanFraming } from '../../codec/frame-decoder.js'

/**
 * PostgreSQL's frontend/backend protocol v3 on the wire
 * (https://www.postgresql.org/docs/15/protocol-message-formats.html): the
 * framings of what a client sends, and a writer for what the server sends.
 *
 * A connection starts with untyped packets (int32 length, int32 code, body:
 * StartupMessage, SSLRequest, GSSENCRequest, CancelRequest), read by the
 * set-up (handshake.ts) with `startupFraming`; SCRAM's password messages
 * are typed (`authFraming`); once started every message is typed (a byte,
 * then an int32 length that counts itself): `messageFraming`.
 */

export const PROTOCOL_3_0 = 196608
export const SSL_REQUEST_CODE = 80877103
export const GSSENC_REQUEST_CODE = 80877104
export const CANCEL_REQUEST_CODE = 80877102
/** PostgreSQL's MAX_STARTUP_PACKET_LENGTH. */
export const MAX_STARTUP_PACKET_BYTES = 10000
/** PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH: the largest password message (its type byte and length aside). */
export const MAX_AUTH_MESSAGE_BYTES = 65535

/** The message types a client may send once started (PostgresMain's switch); any other byte is fatal. */
const FRONTEND_TYPES = new Uint8Array(256)
for (const c of 'QPBEDCHSXFdcfp') FRONTEND_TYPES[c.charCodeAt(0)] = 1
/** The extended-query messages a group holds (Parse, Bind, Describe, Execute, Close), and those that end one (Sync, Flush). */
const GROUPED = new Uint8Array(256)
for (const c of 'PBDEC') GROUPED[c.charCodeAt(0)] = 1
for (const c of 'SH') GROUPED[c.charCodeAt(0)] = 2
/** The most messages one group holds (pgbench's prepared transaction is 3: Bind, Execute, Sync; `pg`'s query 5). */
export const MAX_GROUP_MESSAGES = 64

/**
 * An error that closes the stream after `words` (null: without a reply), as
 * PostgreSQL does for what it cannot read; the protocol's `protocolError`
 * sends the words.
 */
export class StreamError extends RpcError {
  readonly words: Buffer | null

  constructor (message: string, words: Buffer | null) {
    super(ErrorCode.MALFORMED_FRAME, message)
    this.words = words
  }
}

function readI32 (buf: Uint8Array, at: number): number {
  return (buf[at]! << 24) | (buf[at + 1]! << 16) | (buf[at + 2]! << 8) | buf[at + 3]!
}

// The size of the typed message at `at` when it is whole before `end`; 0 when it is not (or its length is below 4).
function wholeMessage (buf: Buffer, at: number, end: number): number {
  if (end - at < 5) return 0
  const length = readI32(buf, at + 1)
  return length >= 4 && end - at >= length + 1 ? length + 1 : 0
}

/**
 * The scanner of a started connection's typed messages. Extended-query
 * messages that arrived together up to and including a Sync or Flush are
 * one frame (a group, at most MAX_GROUP_MESSAGES messages and the frame
 * limit): one call answers them at once, as PostgreSQL processes them and
 * flushes at Sync. A group is formed only from what has arrived; a
 * message is never held back waiting for the rest of one.
 */
class MessageScanner implements FrameScanner {
  readonly #maxFrameBytes: number

  constructor (maxFrameBytes: number) {
    this.#maxFrameBytes = maxFrameBytes
  }

  scan (buf: Buffer, start: number, end: number): number | RpcError {
    const type = buf[start]!
    if (FRONTEND_TYPES[type] !== 1) {
      return new StreamError('invalid frontend message type', fatalError('08P01', `invalid frontend message type ${type}`))
    }
    const have = end - start
    if (have < 5) return 0
    const length = readI32(buf, start + 1)
    // pq_getmessage: a length below its own 4 bytes is a lost stream, closed without a reply.
    if (length < 4) return new StreamError('invalid message length', null)
    if (have < length + 1) return -(length + 1)
    return GROUPED[type] === 1 ? this.#group(buf, start, end, length + 1) : length + 1
  }

  // The group that starts with the message of `first` bytes at `start`, if the rest of it up to a Sync or Flush is here; else the message alone.
  #group (buf: Buffer, start: number, end: number, first: number): number {
    const limit = Math.min(end, start + this.#maxFrameBytes)
    let at = start + first
    for (let count = 1; count < MAX_GROUP_MESSAGES && at < limit; count++) {
      const kind = GROUPED[buf[at]!]
      if (kind === 0) break
      const size = wholeMessage(buf, at, limit)
      if (size === 0) break
      at += size
      if (kind === 2) return at - start
    }
    return first
  }

  reset (): void {}
}

/** True when the frame `buf[start, end)` is a group of messages (messageFraming), not one. */
export function isGroup (buf: Buffer, start: number, end: number): boolean {
  return start + 1 + readI32(buf, start + 1) < end
}

/** The framing of a started connection's messages, grouping extended-query messages up to Sync within `maxFrameBytes`. */
export function messageFraming (maxFrameBytes: number): ScanFraming {
  return { scanner: () => new MessageScanner(maxFrameBytes) }
}

/** The untyped start-up packets; a length outside 8..MAX_STARTUP_PACKET_BYTES closes the connection without a reply. */
class StartupScanner implements FrameScanner {
  scan (buf: Buffer, start: number, end: number): number | RpcError {
    if (end - start < 4) return 0
    const length = readI32(buf, start)
    if (length < 8 || length > MAX_STARTUP_PACKET_BYTES) return new StreamError('invalid length of startup packet', null)
    return end - start >= length ? length : -length
  }

  reset (): void {}
}

/** The framing of the set-up's untyped packets (StartupMessage, SSLRequest, GSSENCRequest, CancelRequest). */
export const startupFraming: ScanFraming = { scanner: () => new StartupScanner() }

/** Typed messages during authentication, any type (the set-up refuses all but a password message, as PostgreSQL does). */
class AuthScanner implements FrameScanner {
  scan (buf: Buffer, start: number, end: number): number | RpcError {
    if (end - start < 5) return 0
    const length = readI32(buf, start + 1)
    if (length < 4) return new StreamError('invalid message length', null)
    return end - start >= length + 1 ? length + 1 : -(length + 1)
  }

  reset (): void {}
}

/** The framing of SCRAM's password messages in the set-up. */
export const authFraming: ScanFraming = { scanner: () => new AuthScanner() }

/**
 * Builds backend messages into one growing buffer: `begin(type)`, fields,
 * `end()` fills the length; `take()` returns the bytes and starts over.
 */
export class MessageWriter {
  #buf: Buffer
  #len = 0
  #msgStart = -1

  constructor (initial = 256) {
    this.#buf = Buffer.allocUnsafe(initial)
  }

  get length (): number {
    return this.#len
  }

  #room (bytes: number): void {
    if (this.#len + bytes <= this.#buf.length) return
    const next = Buffer.allocUnsafe(Math.max(this.#buf.length * 2, this.#len + bytes))
    this.#buf.copy(next, 0, 0, this.#len)
    this.#buf = next
  }

  begin (type: string): this {
    this.#room(5)
    this.#buf[this.#len] = type.charCodeAt(0)
    this.#msgStart = this.#len + 1
    this.#len += 5
    return this
  }

  end (): this {
    this.#buf.writeInt32BE(this.#len - this.#msgStart, this.#msgStart)
    return this
  }

  byte (value: number): this {
    this.#room(1)
    this.#buf[this.#len++] = value
    return this
  }

  i16 (value: number): this {
    this.#room(2)
    this.#buf.writeInt16BE(value, this.#len)
    this.#len += 2
    return this
  }

  i32 (value: number): this {
    this.#room(4)
    this.#buf.writeInt32BE(value | 0, this.#len)
    this.#len += 4
    return this
  }

  /** A NUL-terminated string. */
  cstr (text: string): this {
    const bytes = Buffer.byteLength(text)
    this.#room(bytes + 1)
    this.#buf.write(text, this.#len)
    this.#len += bytes
    this.#buf[this.#len++] = 0
    return this
  }

  bytes (data: Uint8Array): this {
    this.#room(data.length)
    this.#buf.set(data, this.#len)
    this.#len += data.length
    return this
  }

  /** A DataRow field: an int32 length, then `text` in UTF-8. */
  field (text: string): this {
    const n = text.length
    this.#room(4 + n * 3)
    const buf = this.#buf
    const at = this.#len + 4
    let i = 0
    // ASCII, the common case, byte by byte; from the first other character, Buffer's encoder.
    for (; i < n; i++) {
      const c = text.charCodeAt(i)
      if (c >= 0x80) break
      buf[at + i] = c
    }
    const bytes = i === n ? n : i + buf.write(text.slice(i), at + i)
    buf.writeInt32BE(bytes, this.#len)
    this.#len = at + bytes
    return this
  }

  /** A DataRow field: an int32 length, then the integer `value` (a safe integer) in decimal. */
  decimalField (value: number): this {
    let magnitude = value < 0 ? -value : value
    let digits = 1
    for (let rest = magnitude; rest >= 10; rest = Math.floor(rest / 10)) digits++
    const bytes = value < 0 ? digits + 1 : digits
    this.#room(4 + bytes)
    const buf = this.#buf
    buf.writeInt32BE(bytes, this.#len)
    const at = this.#len + 4
    if (value < 0) buf[at] = 0x2d
    for (let i = at + bytes - 1; i >= at + bytes - digits; i--) {
      buf[i] = 0x30 + (magnitude % 10)
      magnitude = Math.floor(magnitude / 10)
    }
    this.#len = at + bytes
    return this
  }

  /** Raw bytes already framed (a cached message). */
  raw (data: Uint8Array): this {
    return this.bytes(data)
  }

  /** The bytes written since the last `take`, in a buffer of their own. */
  take (): Buffer {
    const out = Buffer.allocUnsafe(this.#len)
    this.#buf.copy(out, 0, 0, this.#len)
    this.#len = 0
    return out
  }
}

/** ReadyForQuery ('Z') for each transaction status, built once. */
export const READY_FOR_QUERY: Readonly<Record<'I' | 'T' | 'E', Buffer>> = {
  I: Buffer.from([0x5a, 0, 0, 0, 5, 0x49]),
  T: Buffer.from([0x5a, 0, 0, 0, 5, 0x54]),
  E: Buffer.from([0x5a, 0, 0, 0, 5, 0x45])
}

// CommandComplete messages by tag, built once each (bounded: cleared when full; tags repeat: SELECT 1, INSERT 0 1, BEGIN).
const COMMAND_COMPLETE = new Map<string, Buffer>()
const MAX_COMMAND_TAGS = 256

/** CommandComplete ('C') with `tag`. */
export function writeCommandComplete (out: MessageWriter, tag: string): void {
  let message = COMMAND_COMPLETE.get(tag)
  if (message === undefined) {
    const length = Buffer.byteLength(tag)
    message = Buffer.allocUnsafe(6 + length)
    message[0] = 0x43
    message.writeInt32BE(5 + length, 1)
    message.write(tag, 5)
    message[5 + length] = 0
    if (COMMAND_COMPLETE.size >= MAX_COMMAND_TAGS) COMMAND_COMPLETE.clear()
    COMMAND_COMPLETE.set(tag, message)
  }
  out.raw(message)
}

/** The fields of an ErrorResponse or NoticeResponse. */
export interface ErrorFields {
  severity: 'ERROR' | 'FATAL' | 'WARNING' | 'NOTICE'
  code: string
  message: string
  detail?: string
  hint?: string
  /** 1-based character position in the query. */
  position?: number
  /** Where the error happened (a Bind parameter). */
  where?: string
}

/** Writes an ErrorResponse ('E') or NoticeResponse ('N'). */
export function writeError (out: MessageWriter, fields: ErrorFields, type: 'E' | 'N' = 'E'): void {
  out.begin(type)
  out.byte(0x53).cstr(fields.severity) // S
  out.byte(0x56).cstr(fields.severity) // V
  out.byte(0x43).cstr(fields.code) // C
  out.byte(0x4d).cstr(fields.message) // M
  if (fields.detail !== undefined) out.byte(0x44).cstr(fields.detail)
  if (fields.hint !== undefined) out.byte(0x48).cstr(fields.hint)
  if (fields.position !== undefined) out.byte(0x50).cstr(String(fields.position))
  if (fields.where !== undefined) out.byte(0x57).cstr(fields.where)
  out.byte(0).end()
}

/** A FATAL ErrorResponse's bytes. */
export function fatalError (code: string, message: string, detail?: string): Buffer {
  const out = new MessageWriter(128)
  writeError(out, { severity: 'FATAL', code, message, detail })
  return out.take()
}

/**
 * A FATAL error in protocol 2's shape ('E', text, NUL): what PostgreSQL
 * sends before it knows the client's protocol (after an SSLRequest).
 */
export function fatalV2 (message: string): Buffer {
  return Buffer.from(`EFATAL:  ${message}\n\0`, 'utf8')
}

/** Strings shorter than this are remembered by MessageReader.cstr. */
const MEMO_BYTES = 64

/**
 * Reads the fields of a client message body in order. Out-of-range reads
 * throw `RangeError` (a malformed message). `over` points one reader at the
 * next message (a session reads its messages one at a time with one reader).
 */
export class MessageReader {
  buf: Buffer
  pos: number
  end: number
  /** The last short string read (below MEMO_BYTES bytes): its bytes and its text. */
  readonly #memo = new Uint8Array(MEMO_BYTES)
  #memoLength = -1
  #memoText = ''

  constructor (buf: Buffer, start = 0, end = buf.length) {
    this.buf = buf
    this.pos = start
    this.end = end
  }

  /** Reads `buf[start, end)` from now on. */
  over (buf: Buffer, start: number, end: number): this {
    this.buf = buf
    this.pos = start
    this.end = end
    return this
  }

  #need (bytes: number): void {
    if (this.pos + bytes > this.end) throw new RangeError('insufficient data left in message')
  }

  byte (): number {
    this.#need(1)
    return this.buf[this.pos++]!
  }

  i16 (): number {
    this.#need(2)
    const value = this.buf.readInt16BE(this.pos)
    this.pos += 2
    return value
  }

  i32 (): number {
    this.#need(4)
    const value = this.buf.readInt32BE(this.pos)
    this.pos += 4
    return value
  }

  cstr (): string {
    const buf = this.buf
    const pos = this.pos
    // The unnamed statement or portal: no search, no decoding.
    if (pos < this.end && buf[pos] === 0) {
      this.pos++
      return ''
    }
    // A short name (a prepared statement's, bound again and again): found and compared with the last one in one pass.
    const memo = this.#memo
    const limit = Math.min(this.end - pos, MEMO_BYTES)
    let same = true
    for (let i = 0; i < limit; i++) {
      const c = buf[pos + i]!
      if (c === 0) {
        if (!same || i !== this.#memoLength) {
          for (let j = 0; j < i; j++) memo[j] = buf[pos + j]!
          this.#memoLength = i
          this.#memoText = buf.toString('utf8', pos, pos + i)
        }
        this.pos = pos + i + 1
        return this.#memoText
      }
      if (same && memo[i] !== c) same = false
    }
    const at = buf.indexOf(0, pos)
    if (at < 0 || at >= this.end) throw new RangeError('invalid string in message')
    const text = buf.toString('utf8', pos, at)
    this.pos = at + 1
    return text
  }

  bytes (count: number): Buffer {
    this.#need(count)
    const out = this.buf.subarray(this.pos, this.pos + count)
    this.pos += count
    return out
  }

  get remaining (): number {
    return this.end - this.pos
  }
}
