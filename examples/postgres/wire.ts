import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameScanner, ScanFraming } from '../../codec/frame-decoder.js'

/**
 * PostgreSQL's frontend/backend protocol v3 on the wire
 * (https://www.postgresql.org/docs/15/protocol-message-formats.html): the
 * framing of what a client sends, and a writer for what the server sends.
 *
 * A connection starts with untyped packets (int32 length, int32 code, body:
 * StartupMessage, SSLRequest, GSSENCRequest, CancelRequest); once a
 * StartupMessage has been read every message is typed (a byte, then an
 * int32 length that counts itself). The scanner of each connection
 * follows that switch itself.
 */

export const PROTOCOL_3_0 = 196608
export const SSL_REQUEST_CODE = 80877103
export const GSSENC_REQUEST_CODE = 80877104
export const CANCEL_REQUEST_CODE = 80877102
/** PostgreSQL's MAX_STARTUP_PACKET_LENGTH. */
export const MAX_STARTUP_PACKET_BYTES = 10000

/** The message types a client may send once started (PostgresMain's switch); any other byte is fatal. */
const FRONTEND_TYPES = new Set('QPBEDCHSXFdcfp'.split('').map(c => c.charCodeAt(0)))

// What to say before closing, per scan error (protocolError reads it back): bytes, or null for a silent close.
const LAST_WORDS = new WeakMap<RpcError, Buffer | null>()

/** An error that closes the stream after `words` (null: without a reply), as PostgreSQL does for what it cannot read. */
export function streamError (message: string, words: Buffer | null): RpcError {
  const error = new RpcError(ErrorCode.MALFORMED_FRAME, message)
  LAST_WORDS.set(error, words)
  return error
}

/** The words a stream error carries (`streamError`); null for any other error (an oversized frame: PostgreSQL closes silently). */
export function lastWordsOf (error: RpcError): Buffer | null {
  return LAST_WORDS.get(error) ?? null
}

function readI32 (buf: Uint8Array, at: number): number {
  return (buf[at]! << 24) | (buf[at + 1]! << 16) | (buf[at + 2]! << 8) | buf[at + 3]!
}

/** The scanner of one connection: untyped start-up packets, then typed messages. */
class PgScanner implements FrameScanner {
  #typed = false
  // The last packet was an SSLRequest or GSSENCRequest with bytes behind it in the same read.
  #dataAfterRequest = false

  scan (buf: Buffer, start: number, end: number): number | RpcError {
    if (this.#dataAfterRequest) {
      // CVE-2021-23214: bytes pipelined behind an SSLRequest are refused, not read as the start-up.
      return streamError('unencrypted data after SSL request', fatalError('08P01', 'received unencrypted data after SSL request',
        'This could be either a client-software bug or evidence of an attempted man-in-the-middle attack.'))
    }
    const have = end - start
    if (this.#typed) {
      if (!FRONTEND_TYPES.has(buf[start]!)) {
        return streamError('invalid frontend message type', fatalError('08P01', `invalid frontend message type ${buf[start]!}`))
      }
      if (have < 5) return 0
      const length = readI32(buf, start + 1)
      // pq_getmessage: a length below its own 4 bytes is a lost stream, closed without a reply.
      if (length < 4) return streamError('invalid message length', null)
      return have >= length + 1 ? length + 1 : -(length + 1)
    }
    if (have < 4) return 0
    const length = readI32(buf, start)
    if (length < 8 || length > MAX_STARTUP_PACKET_BYTES) return streamError('invalid length of startup packet', null)
    if (have < length) return -length
    const code = readI32(buf, start + 4)
    if (code === SSL_REQUEST_CODE || code === GSSENC_REQUEST_CODE) {
      this.#dataAfterRequest = have > length
    } else {
      this.#typed = true
    }
    return length
  }

  reset (): void {}
}

/** The framing of PostgreSQL's client messages: one scanner per connection. */
export const pgFraming: ScanFraming = { scanner: () => new PgScanner() }

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

/** Reads the fields of a client message body in order. Out-of-range reads throw `RangeError` (a malformed message). */
export class MessageReader {
  readonly buf: Buffer
  pos: number
  readonly end: number

  constructor (buf: Buffer, start = 0, end = buf.length) {
    this.buf = buf
    this.pos = start
    this.end = end
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
    const at = this.buf.indexOf(0, this.pos)
    if (at < 0 || at >= this.end) throw new RangeError('invalid string in message')
    const text = this.buf.toString('utf8', this.pos, at)
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
