import { ErrorCode, RpcError } from './errors.js'
import type { Framing, FrameScanner, ScanFraming } from './frame-decoder.js'

/**
 * Stock framings that work both ways: they find where a frame ends when
 * reading (the `Framing` and `ScanFraming` shapes the server and the client
 * take), and they take their own bytes off a frame's payload and put them
 * back on an answer's. `simpleProtocol` and `simpleClientProtocol`
 * (codec/simple-protocol.ts) use the second half, so that no encoder writes
 * a length prefix or a delimiter.
 *
 * - `lengthField`: a length field, read as Netty's
 *   LengthFieldBasedFrameDecoder reads it and written as its
 *   LengthFieldPrepender writes it.
 * - `lines`: delimited text lines, as tokio-util's LinesCodec.
 */

/** What a protocol's encoders give a framing: one buffer, or several to be sent one after another. */
export type FramePayload = Uint8Array | readonly Uint8Array[]

/**
 * The half of a framing that adds and removes its own bytes. A framing
 * with these members (the stock ones, or a protocol's own) makes
 * `simpleProtocol` hand its `decode` the payload only, and frame what
 * `encode` and `refusal` return.
 */
export interface PayloadFraming {
  /** The payload of the frame `buf[start, end)`, as a view (no copy). */
  payloadOf: (buf: Buffer, start: number, end: number) => Buffer
  /** Bytes the framing puts before a payload of `payloadBytes` bytes (0 when it writes inside it). Throws as `frameInto` for a payload it cannot frame. */
  headBytes: (payloadBytes: number) => number
  /** Bytes the framing puts after a payload (a delimiter). */
  readonly tailBytes: number
  /**
   * Completes the frame whose payload of `payloadBytes` bytes has been
   * copied to `out[at + headBytes(payloadBytes)]`: writes the head and the
   * tail around it. Throws an `RpcError` (RPC_ERR_INVALID_ARGUMENT) when the
   * payload cannot be framed (its length does not fit the field).
   */
  frameInto: (out: Buffer, at: number, payloadBytes: number) => void
  /** The frame of `payload` as buffers to send in order; the payload's own buffers are not copied where it can be helped. Throws as `frameInto`. */
  frame: (payload: FramePayload) => Buffer[]
  /** The largest frame accepted when reading, its own bytes included; undefined when the framing sets none. */
  readonly max: number | undefined
}

/** True when `framing` also strips and adds its own bytes (`PayloadFraming`). */
export function isPayloadFraming (framing: object): framing is PayloadFraming {
  const f = framing as Partial<PayloadFraming>
  return typeof f.payloadOf === 'function' && typeof f.frameInto === 'function' && typeof f.frame === 'function' && typeof f.headBytes === 'function'
}

/** Options of `lengthField`. */
export interface LengthFieldOptions {
  /** The length field's size: 1, 2 or 4 bytes (unsigned). */
  bytes: 1 | 2 | 4
  /**
   * Where the field starts in the frame (Netty's lengthFieldOffset).
   * Default 0. With 0, the field is a prefix: the payload is what follows
   * it. Past 0, the bytes before the field are the protocol's header, so
   * the payload is the whole frame with the field in place, and a payload
   * to send leaves `bytes` bytes at `offset`, which the framing fills.
   */
  offset?: number
  /**
   * Added to the field's value to get the bytes that follow the field
   * (Netty's lengthAdjustment). Default 0: the field counts what follows
   * it. `-bytes` when it counts itself too; the header bytes after the
   * field when it counts only the body (memcached: 12).
   */
  adjust?: number
  /** The largest frame, field and header included; a larger one is refused RPC_ERR_FRAME_TOO_LARGE as soon as its field is read. Default: none here (the server's and client's `maxFrameBytes` still apply). */
  max?: number
  /** The field is little-endian. Default false: big-endian (network order). */
  littleEndian?: boolean
}

/** A length-field framing: a `Framing` that also frames payloads. */
export interface LengthFieldFraming extends Framing, PayloadFraming {
  /** The length field's size, as given. */
  readonly bytes: 1 | 2 | 4
  /** Where the field starts in the frame (default 0 resolved). */
  readonly offset: number
  /** Added to the field's value to get the bytes after the field (default 0 resolved). */
  readonly adjust: number
  /** The field is little-endian (default false resolved). */
  readonly littleEndian: boolean
  /** The frame of `payload`: the field prepended (or filled in, past offset 0). An alias of `frame`, after Netty's LengthFieldPrepender. */
  prepend: (payload: FramePayload) => Buffer[]
}

const FIELD_MAX = { 1: 0xff, 2: 0xffff, 4: 0xffffffff } as const

/**
 * A frame with an unsigned length field of 1, 2 or 4 bytes at `offset`.
 * Read as Netty's LengthFieldBasedFrameDecoder: the frame is
 * `offset + bytes + value + adjust` bytes long, the field included. Written
 * as its LengthFieldPrepender: the field's value is the bytes after it
 * minus `adjust`. Examples: DNS over TCP (RFC 7766) is `{ bytes: 2 }`,
 * KRPC `{ bytes: 4 }`, memcached's binary header
 * `{ bytes: 4, offset: 8, adjust: 12 }`.
 *
 * A field whose frame would be shorter than the field itself is refused
 * RPC_ERR_MALFORMED_FRAME; a frame over `max`, RPC_ERR_FRAME_TOO_LARGE. On
 * the way out, a payload whose length does not fit the field throws
 * RPC_ERR_INVALID_ARGUMENT (a server answers that call `failed`).
 */
export function lengthField (options: LengthFieldOptions): LengthFieldFraming {
  const bytes = options.bytes
  const offset = options.offset ?? 0
  const adjust = options.adjust ?? 0
  const littleEndian = options.littleEndian ?? false
  const max = options.max
  if (bytes !== 1 && bytes !== 2 && bytes !== 4) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lengthField: bytes must be 1, 2 or 4, not ${String(bytes)}`)
  if (!Number.isInteger(offset) || offset < 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lengthField: offset must be an integer >= 0, not ${offset}`)
  if (!Number.isInteger(adjust)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lengthField: adjust must be an integer, not ${adjust}`)
  if (max !== undefined && !(Number.isInteger(max) && max > 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lengthField: max must be an integer > 0, not ${max}`)
  const fieldEnd = offset + bytes
  const fieldMax = FIELD_MAX[bytes]
  // The field's bytes belong to the framing only when it is a prefix.
  const stripped = offset === 0 ? bytes : 0

  const read = bytes === 1
    ? (buf: Buffer, at: number) => buf[at]!
    : bytes === 2
      ? littleEndian ? (buf: Buffer, at: number) => buf.readUInt16LE(at) : (buf: Buffer, at: number) => buf.readUInt16BE(at)
      : littleEndian ? (buf: Buffer, at: number) => buf.readUInt32LE(at) : (buf: Buffer, at: number) => buf.readUInt32BE(at)
  const write = bytes === 1
    ? (out: Buffer, value: number, at: number) => { out[at] = value }
    : bytes === 2
      ? littleEndian ? (out: Buffer, value: number, at: number) => { out.writeUInt16LE(value, at) } : (out: Buffer, value: number, at: number) => { out.writeUInt16BE(value, at) }
      : littleEndian ? (out: Buffer, value: number, at: number) => { out.writeUInt32LE(value, at) } : (out: Buffer, value: number, at: number) => { out.writeUInt32BE(value, at) }

  // The field's value for a payload of `payloadBytes`, or a throw when it cannot be written.
  const valueFor = (payloadBytes: number): number => {
    const frameBytes = payloadBytes + stripped
    if (frameBytes < fieldEnd) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lengthField: a payload of ${payloadBytes} bytes has no room for the header and length field (${fieldEnd} bytes)`)
    const value = frameBytes - fieldEnd - adjust
    if (value < 0 || value > fieldMax) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lengthField: a payload of ${payloadBytes} bytes needs a length of ${value}, which a ${bytes}-byte field cannot hold`)
    return value
  }

  const frame = (payload: FramePayload): Buffer[] => {
    const parts = slicesOf(payload)
    let payloadBytes = 0
    for (const p of parts) payloadBytes += p.length
    const value = valueFor(payloadBytes)
    if (stripped > 0) {
      const head = Buffer.allocUnsafe(bytes)
      write(head, value, 0)
      return [head, ...parts]
    }
    // The field lies inside the payload's header: that header is copied
    // and filled in, the caller's buffers are never written to.
    const first = parts[0]!
    if (first.length >= fieldEnd) {
      const head = Buffer.from(first.subarray(0, fieldEnd))
      write(head, value, offset)
      const rest = first.subarray(fieldEnd)
      return rest.length > 0 ? [head, rest, ...parts.slice(1)] : [head, ...parts.slice(1)]
    }
    const whole = Buffer.concat(parts, payloadBytes)
    write(whole, value, offset)
    return [whole]
  }

  return {
    bytes,
    offset,
    adjust,
    littleEndian,
    max,
    prefixBytes: fieldEnd,
    frameBytes (buf: Buffer, at: number): number | RpcError {
      const value = read(buf, at + offset)
      const size = fieldEnd + value + adjust
      if (size < fieldEnd) return new RpcError(ErrorCode.MALFORMED_FRAME, `length field says ${value}, which makes a frame shorter than its ${fieldEnd}-byte head`)
      if (max !== undefined && size > max) return new RpcError(ErrorCode.FRAME_TOO_LARGE, `frame had a length of ${size}, but this framing takes frames up to ${max} bytes`)
      return size
    },
    payloadOf: (buf, start, end) => buf.subarray(start + stripped, end),
    headBytes (payloadBytes) {
      valueFor(payloadBytes)
      return stripped
    },
    tailBytes: 0,
    frameInto (out, at, payloadBytes) {
      write(out, valueFor(payloadBytes), at + offset)
    },
    frame,
    prepend: frame
  }
}

/** Options of `lines`. */
export interface LinesOptions {
  /** The longest line, its delimiter included; a longer one is refused RPC_ERR_FRAME_TOO_LARGE once that many bytes have arrived without a delimiter. */
  max: number
  /**
   * What ends a line, stripped when reading and appended when writing.
   * Default `'\n'`, which also strips a `'\r'` before it when reading (so
   * `\r\n` lines are read too) and writes `'\n'`. Any other delimiter
   * (`'\r\n'`, `'\0'`) is matched exactly.
   */
  delimiter?: string | Uint8Array
}

/** A line framing: a `ScanFraming` that also frames payloads. */
export interface LineFraming extends ScanFraming, PayloadFraming {
  /** What ends a line, as bytes (default `'\n'` resolved). */
  readonly delimiter: Buffer
  /** The longest line, its delimiter included. */
  readonly max: number
}

const CR = 0x0d

/**
 * Delimited lines (tokio-util's LinesCodec): a resumable scanner finds the
 * delimiter, looking at each byte once however many reads a line spans.
 * The payload is the line without its delimiter; an answer's payload gets
 * the delimiter appended (a payload with delimiters inside goes out as
 * several lines, which multi-line answers rely on).
 */
export function lines (options: LinesOptions): LineFraming {
  const max = options.max
  if (!(Number.isInteger(max) && max > 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lines: max must be an integer > 0, not ${String(max)}`)
  const given = options.delimiter ?? '\n'
  const delimiter = typeof given === 'string' ? Buffer.from(given, 'latin1') : Buffer.from(given)
  if (delimiter.length === 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'lines: the delimiter must not be empty')
  if (delimiter.length >= max) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `lines: max (${max}) must be longer than the delimiter`)
  const lenient = options.delimiter === undefined
  const width = delimiter.length
  const single = width === 1 ? delimiter[0]! : -1

  return {
    delimiter,
    max,
    scanner: () => new LineScanner(delimiter, single, max),
    payloadOf (buf, start, end) {
      let stop = end - width
      if (lenient && stop > start && buf[stop - 1] === CR) stop--
      return buf.subarray(start, stop)
    },
    headBytes: () => 0,
    tailBytes: width,
    frameInto (out, at, payloadBytes) {
      if (single >= 0) out[at + payloadBytes] = single
      else delimiter.copy(out, at + payloadBytes)
    },
    frame: (payload) => [...slicesOf(payload), delimiter]
  }
}

/** Finds one line at a time, resuming where the last scan of the same line stopped. */
class LineScanner implements FrameScanner {
  readonly #delimiter: Buffer
  readonly #single: number
  readonly #max: number
  /** Bytes of the current line already looked at, without finding the delimiter. */
  #scanned = 0

  constructor (delimiter: Buffer, single: number, max: number) {
    this.#delimiter = delimiter
    this.#single = single
    this.#max = max
  }

  scan (buf: Buffer, start: number, end: number): number | RpcError {
    const limit = Math.min(end, start + this.#max)
    const from = start + this.#scanned
    // The search stops at `limit`: past `end` lies the rest of a line still
    // being assembled (not its bytes), and searching it on every read would
    // make a line trickled in many reads cost the square of its length.
    const within = limit === buf.length ? buf : buf.subarray(0, limit)
    const at = this.#single >= 0 ? within.indexOf(this.#single, from) : within.indexOf(this.#delimiter, from)
    const width = this.#delimiter.length
    if (at >= 0) return at + width - start
    if (end - start >= this.#max) return new RpcError(ErrorCode.FRAME_TOO_LARGE, `no line end within ${this.#max} bytes`)
    // A delimiter of several bytes may be split across reads: look at its first bytes again next time.
    this.#scanned = Math.max(0, end - start - (width - 1))
    return 0
  }

  reset (): void {
    this.#scanned = 0
  }

  /** The first byte the next scan reads: the line's bytes before it hold no delimiter. */
  retainFrom (): number {
    return this.#scanned
  }
}

// The payload as a list of Buffers (views, not copies).
function slicesOf (payload: FramePayload): Buffer[] {
  if (payload instanceof Uint8Array) return [asBuffer(payload)]
  const out: Buffer[] = new Array(payload.length)
  for (let i = 0; i < payload.length; i++) out[i] = asBuffer(payload[i]!)
  return out
}

function asBuffer (bytes: Uint8Array): Buffer {
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
}

