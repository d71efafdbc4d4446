import { ErrorCode, RpcError } from '../errors.js'
import {
  RequestHeaderFields, ResponseHeaderFields, decodeRequestHeaderInto, decodeResponseHeaderInto, requestHeaderOf, responseHeaderOf,
  type RequestHeader, type ResponseHeader
} from './header-decoder.js'
import type { Framing } from '../frame-decoder.js'
import { ProtoSchema, assetPath } from '../protobuf/schema.js'
import { int32Bytes, readVarint32, varintBytes, writeInt32, writeVarint, type VarintRead } from '../varint.js'

/**
 * KRPC frames:
 *
 *   uint32 BE total_len | varint32 header_len | header PB | varint32 body_len | body PB | sidecar 0 | sidecar 1 ...
 *
 * body_len counts the body PB and every sidecar; sidecar_offsets in the
 * header are measured from the first byte of the body PB.
 */

/** The client's 7-byte connection preamble: `hrpc`, version 9, two zero bytes. */
export const KRPC_PREAMBLE = Buffer.from([0x68, 0x72, 0x70, 0x63, 0x09, 0x00, 0x00])
export const KRPC_VERSION = 9
/** Call id of every NegotiatePB frame. */
export const NEGOTIATE_CALL_ID = -33
/** Call id of the ConnectionContextPB frame. */
export const CONNECTION_CONTEXT_CALL_ID = -3
/** At most this many sidecars in one frame (Kudu's kMaxSidecars). */
export const MAX_SIDECARS = 10_000
/** Sidecars up to this many bytes in all are copied into the frame's head buffer; bigger ones are written as their own slices. */
const INLINE_SIDECAR_BYTES = 16 * 1024

/** The header protos of `rpc_header.proto`, parsed once. */
export const headerSchema = ProtoSchema.load(assetPath(import.meta.url, 'rpc_header.proto'))

/** KRPC framing: a 4-byte big-endian length of what follows. */
export const krpcFraming: Framing = {
  prefixBytes: 4,
  frameBytes: (buf, offset) => {
    const length = readU32(buf, offset)
    // An empty frame has no header: Kudu refuses it at the prefix too.
    return length === 0 ? malformed('frame with a length of 0: no header') : length + 4
  }
}

// Big-endian u32 reads and writes of the length prefix, as plain byte
// arithmetic: Buffer#readUInt32BE and #writeUInt32BE validate their
// arguments through Node's validators on every call (~2 % of a server's CPU
// per call under pipelined load, measured with perf). Callers keep within bounds.
function readU32 (buf: Uint8Array, at: number): number {
  return buf[at]! * 0x1000000 + ((buf[at + 1]! << 16) | (buf[at + 2]! << 8) | buf[at + 3]!)
}

function writeU32 (out: Uint8Array, at: number, value: number): void {
  out[at] = value >>> 24
  out[at + 1] = value >>> 16
  out[at + 2] = value >>> 8
  out[at + 3] = value
}

/** A frame split into its header PB and body (body PB plus sidecars), both views of the frame. */
export interface FrameParts { header: Buffer, body: Buffer }

const scratch: VarintRead = { value: 0, next: 0 }

function malformed (message: string, cause?: unknown): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, message, cause === undefined ? undefined : { cause })
}

/** Where a frame's parts lie in it: header PB and body (body PB plus sidecars). */
interface FrameBounds { headerStart: number, headerEnd: number, bodyStart: number }

const bounds: FrameBounds = { headerStart: 0, headerEnd: 0, bodyStart: 0 }

// Finds the parts of a whole frame (length prefix included) without making
// views of them; a frame whose parts do not add up exactly is an error. The
// answer is a shared object, valid until the next call.
function frameBounds (frame: Buffer, start = 0, end = frame.length): FrameBounds | RpcError {
  if (end - start < 4 || readU32(frame, start) !== end - start - 4) return malformed('frame length does not match its prefix')
  // Most frames: a header of under 128 bytes and a body of under 128 that
  // ends the frame, their one-byte lengths read here (this runs per
  // request; the varint reader is two calls). Anything else, and every
  // error, takes the general path below.
  const headerBytes = frame[start + 4]!
  if (headerBytes < 0x80 && end - start > 5) {
    const headerEnd = start + 5 + headerBytes
    if (headerEnd < end && frame[headerEnd]! < 0x80 && headerEnd + 1 + frame[headerEnd]! === end) {
      bounds.headerStart = start + 5
      bounds.headerEnd = headerEnd
      bounds.bodyStart = headerEnd + 1
      return bounds
    }
  }
  const header = readVarint32(frame, start + 4, end, scratch)
  if (header.next < 0) return malformed('bad header length varint')
  const headerStart = header.next
  const headerEnd = headerStart + header.value
  if (headerEnd > end) return malformed('truncated header')
  const body = readVarint32(frame, headerEnd, end, scratch)
  if (body.next < 0) return malformed('bad body length varint')
  const bodyStart = body.next
  const bodyEnd = bodyStart + body.value
  if (bodyEnd > end) return malformed('data too short: truncated body')
  if (bodyEnd < end) return malformed(`${end - bodyEnd} extra bytes at end of packet`)
  bounds.headerStart = headerStart
  bounds.headerEnd = headerEnd
  bounds.bodyStart = bodyStart
  return bounds
}

/** Splits a whole frame (length prefix included); a frame whose parts do not add up exactly is an error. */
export function splitFrame (frame: Buffer): FrameParts | RpcError {
  const b = frameBounds(frame)
  if (b instanceof RpcError) return b
  return { header: frame.subarray(b.headerStart, b.headerEnd), body: frame.subarray(b.bodyStart) }
}

const NO_SIDECARS: Buffer[] = []

// The sidecars of the body that starts at `bodyStart` in `frame` and ends at `frameEnd`, as views.
function sidecarsOf (frame: Buffer, bodyStart: number, offsets: readonly number[] | undefined, frameEnd = frame.length): Buffer[] | RpcError {
  if (offsets === undefined || offsets.length === 0) return NO_SIDECARS
  if (offsets.length > MAX_SIDECARS) return malformed(`${offsets.length} sidecars, more than the ${MAX_SIDECARS} allowed`)
  const end = frameEnd - bodyStart
  const sidecars = new Array<Buffer>(offsets.length)
  for (let i = 0; i < offsets.length; i++) {
    const start = offsets[i]!
    const stop = i + 1 < offsets.length ? offsets[i + 1]! : end
    if (stop < start || stop > end) return malformed(`bad sidecar offsets at index ${i}`)
    sidecars[i] = frame.subarray(bodyStart + start, bodyStart + stop)
  }
  return sidecars
}

// ---------------------------------------------------------------------------
// Header messages.

/** A decoded ErrorStatusPB. */
export interface ErrorStatus {
  message: string
  code?: number
  unsupported_feature_flags?: number[]
}

export const RequestHeaderType = headerSchema.type<RequestHeader>('kudu.rpc.RequestHeader')
export const ResponseHeaderType = headerSchema.type<ResponseHeader>('kudu.rpc.ResponseHeader')
export const ErrorStatusType = headerSchema.type<ErrorStatus>('kudu.rpc.ErrorStatusPB')

/**
 * The encoded `remote_method` field (tag included) of a RequestHeader. A
 * client builds it once per method and reuses it for every call.
 */
export function encodeRemoteMethod (serviceName: string, methodName: string): Buffer {
  const service = Buffer.from(serviceName, 'utf8')
  const method = Buffer.from(methodName, 'utf8')
  const inner = 1 + varintBytes(service.length) + service.length + 1 + varintBytes(method.length) + method.length
  const out = Buffer.allocUnsafe(1 + varintBytes(inner) + inner)
  let at = 0
  out[at++] = 0x32 // field 6, length-delimited
  at = writeVarint(out, at, inner)
  out[at++] = 0x0a
  at = writeVarint(out, at, service.length)
  at += service.copy(out, at)
  out[at++] = 0x12
  at = writeVarint(out, at, method.length)
  method.copy(out, at)
  return out
}

function sidecarBytesOf (sidecars: readonly Uint8Array[] | undefined): number {
  let total = 0
  if (sidecars !== undefined) for (const s of sidecars) total += s.length
  return total
}

function offsetsBytes (tagBytes: number, firstOffset: number, sidecars: readonly Uint8Array[] | undefined): number {
  if (sidecars === undefined) return 0
  let bytes = 0
  let offset = firstOffset
  for (const s of sidecars) {
    bytes += tagBytes + varintBytes(offset)
    offset += s.length
  }
  return bytes
}

function writeOffsets (out: Buffer, at: number, tag: readonly number[], firstOffset: number, sidecars: readonly Uint8Array[] | undefined): number {
  if (sidecars === undefined) return at
  let offset = firstOffset
  for (const s of sidecars) {
    for (const byte of tag) out[at++] = byte
    at = writeVarint(out, at, offset)
    offset += s.length
  }
  return at
}

const REQUEST_OFFSET_TAG = [0x80, 0x01] // field 16, varint
const RESPONSE_OFFSET_TAG = [0x18] // field 3, varint

/**
 * Lays out one frame: `[prefix][header varint][header][body varint][body PB]`
 * in one buffer, then the sidecars. Small sidecars are copied into that
 * buffer so a small frame is one slice; large ones stay separate slices so a
 * multi-MiB payload is never copied.
 */
function assemble (headerBytes: number, writeHeader: (out: Buffer, at: number) => number,
  body: Uint8Array, sidecars: readonly Uint8Array[] | undefined): Buffer[] {
  const sidecarBytes = sidecarBytesOf(sidecars)
  const bodyBytes = body.length + sidecarBytes
  const total = varintBytes(headerBytes) + headerBytes + varintBytes(bodyBytes) + bodyBytes
  const inline = sidecarBytes <= INLINE_SIDECAR_BYTES
  const headBytes = 4 + total - (inline ? 0 : sidecarBytes)
  const head = Buffer.allocUnsafe(headBytes)
  head.writeUInt32BE(total, 0)
  let at = writeVarint(head, 4, headerBytes)
  const headerEnd = writeHeader(head, at)
  if (headerEnd - at !== headerBytes) throw new Error('header size mismatch')
  at = writeVarint(head, headerEnd, bodyBytes)
  head.set(body, at)
  at += body.length
  if (sidecars === undefined || sidecars.length === 0) return [head]
  if (inline) {
    for (const s of sidecars) { head.set(s, at); at += s.length }
    return [head]
  }
  const out: Buffer[] = [head]
  for (const s of sidecars) out.push(Buffer.isBuffer(s) ? s : Buffer.from(s.buffer, s.byteOffset, s.length))
  return out
}

/** Fields of a request frame that a client sets. */
export interface RequestFrameFields {
  callId: number
  /** From `encodeRemoteMethod`, or undefined for negotiation frames. */
  remoteMethod?: Buffer | undefined
  /** Relative timeout in ms; 0 or undefined means none. */
  timeoutMs?: number | undefined
  requiredFeatureFlags?: readonly number[] | undefined
  sidecars?: readonly Uint8Array[] | undefined
}

/** Encodes a client→server frame: RequestHeader, body PB, sidecars. Returns the slices to write, in order. */
export function encodeRequestFrame (fields: RequestFrameFields, body: Uint8Array): Buffer[] {
  const { callId, remoteMethod, timeoutMs, requiredFeatureFlags, sidecars } = fields
  if (sidecars !== undefined && sidecars.length > MAX_SIDECARS) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `at most ${MAX_SIDECARS} sidecars may be sent`)
  }
  let headerBytes = 1 + int32Bytes(callId)
  if (remoteMethod !== undefined) headerBytes += remoteMethod.length
  // timeout_millis is a uint32: a longer timeout (over 49 days) is clamped.
  const timeout = wireTimeout(timeoutMs)
  if (timeout > 0) headerBytes += 1 + varintBytes(timeout)
  if (requiredFeatureFlags !== undefined) {
    for (const f of requiredFeatureFlags) {
      if (!Number.isInteger(f) || f < 0 || f > 0xffffffff) {
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, `required feature flag ${f} is not a uint32`)
      }
      headerBytes += 1 + varintBytes(f)
    }
  }
  headerBytes += offsetsBytes(2, body.length, sidecars)
  return assemble(headerBytes, (out, at) => {
    out[at++] = 0x18 // field 3, call_id
    at = writeInt32(out, at, callId)
    if (remoteMethod !== undefined) at += remoteMethod.copy(out, at)
    if (timeout > 0) {
      out[at++] = 0x50 // field 10, timeout_millis
      at = writeVarint(out, at, timeout)
    }
    if (requiredFeatureFlags !== undefined) {
      for (const f of requiredFeatureFlags) {
        out[at++] = 0x58 // field 11, unpacked
        at = writeVarint(out, at, f)
      }
    }
    return writeOffsets(out, at, REQUEST_OFFSET_TAG, body.length, sidecars)
  }, body, sidecars)
}

/**
 * Encodes a server→client frame. `isError` undefined leaves the field out, as
 * Kudu does for negotiation responses; regular responses set it, false
 * included.
 */
export function encodeResponseFrame (callId: number, isError: boolean | undefined, body: Uint8Array,
  sidecars?: readonly Uint8Array[]): Buffer[] {
  if (sidecars !== undefined && sidecars.length > MAX_SIDECARS) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `at most ${MAX_SIDECARS} sidecars may be sent`)
  }
  const headerBytes = 1 + int32Bytes(callId) + (isError === undefined ? 0 : 2) + offsetsBytes(1, body.length, sidecars)
  return assemble(headerBytes, (out, at) => {
    out[at++] = 0x08 // field 1, call_id
    at = writeInt32(out, at, callId)
    if (isError !== undefined) {
      out[at++] = 0x10 // field 2, is_error
      out[at++] = isError ? 1 : 0
    }
    return writeOffsets(out, at, RESPONSE_OFFSET_TAG, body.length, sidecars)
  }, body, sidecars)
}

// TypedArray#set, called as a known function: `out.set` is a property load
// that went through V8's generic LoadIC on every call (~2 % of a pipelining
// client's CPU in perf).
const typedArraySet = Uint8Array.prototype.set

// Copies src[0, n) to out[at]; returns the end. Measured here: a byte loop
// wins up to ~10 bytes (8 vs 16 ns for 4 bytes), TypedArray#set beyond (17
// vs 50 ns for 37 bytes), Buffer#copy when only part of src is wanted (no view).
function copySmall (src: Uint8Array, n: number, out: Buffer, at: number): number {
  if (n <= 8) {
    for (let i = 0; i < n; i++) out[at++] = src[i]!
    return at
  }
  if (n === src.length) typedArraySet.call(out, src, at)
  else Buffer.prototype.copy.call(src, out, at, 0, n)
  return at + n
}

/** A request's `timeout_millis` as the frame encoders write it: whole ms, clamped to a uint32; 0 for none. */
export function wireTimeout (timeoutMs: number | undefined): number {
  return Math.min(Math.floor(timeoutMs ?? 0), 0xffffffff)
}

/**
 * The part of a RequestHeader after call_id, for calls to one method with
 * one timeout (as `wireTimeout` gives it; 0 for none): remote_method and
 * timeout_millis, encoded once and copied into each such request by the
 * in-place writers below.
 */
export function requestHeaderTail (remoteMethod: Buffer, timeout: number): Buffer {
  const out = Buffer.allocUnsafe(remoteMethod.length + (timeout > 0 ? 1 + varintBytes(timeout) : 0))
  let at = remoteMethod.copy(out, 0)
  if (timeout > 0) {
    out[at++] = 0x50 // field 10, timeout_millis
    writeVarint(out, at, timeout)
  }
  return out
}

/**
 * Bytes of a request frame without sidecars or feature flags (prefix
 * included) whose header ends with `tail` (`requestHeaderTail`) and whose
 * body PB is `bodyBytes` long.
 */
export function requestFrameBytes (callId: number, tail: Uint8Array, bodyBytes: number): number {
  const headerBytes = 1 + int32Bytes(callId) + tail.length
  return 4 + varintBytes(headerBytes) + headerBytes + varintBytes(bodyBytes) + bodyBytes
}

/**
 * Writes the frame `requestFrameBytes` sized at `out[at]`, the bytes
 * `encodeRequestFrame` would encode for it, and returns where it ends.
 */
export function writeRequestFrame (out: Buffer, at: number, callId: number, tail: Uint8Array,
  body: Uint8Array, bodyBytes = body.length): number {
  at = writeRequestFrameHead(out, at, callId, tail, bodyBytes)
  return copySmall(body, bodyBytes, out, at)
}

/**
 * As `writeRequestFrame`, all but the body: returns where the caller then
 * writes the `bodyBytes` of the body PB (`MessageType.writeFlat`).
 */
export function writeRequestFrameHead (out: Buffer, at: number, callId: number, tail: Uint8Array, bodyBytes: number): number {
  const headerBytes = 1 + int32Bytes(callId) + tail.length
  writeU32(out, at, varintBytes(headerBytes) + headerBytes + varintBytes(bodyBytes) + bodyBytes)
  at += 4
  // One-byte lengths (the usual case) written here: writeVarint is a call.
  if (headerBytes < 0x80) out[at++] = headerBytes
  else at = writeVarint(out, at, headerBytes)
  out[at++] = 0x18 // field 3, call_id
  at = writeInt32(out, at, callId)
  at = copySmall(tail, tail.length, out, at)
  if (bodyBytes < 0x80) out[at++] = bodyBytes
  else at = writeVarint(out, at, bodyBytes)
  return at
}

/** Bytes of a successful response frame without sidecars whose body PB is `bodyBytes` long (prefix included). */
export function responseFrameBytes (callId: number, bodyBytes: number): number {
  // The header (call_id, is_error) is at most 13 bytes: its length is one byte.
  const headerBytes = 3 + callIdBytes(callId)
  return 5 + headerBytes + (bodyBytes < 0x80 ? 1 : varintBytes(bodyBytes)) + bodyBytes
}

// int32Bytes, written out: this runs per response, inside encoders that
// TurboFan inlines into the connection's writer, past the budget at which
// it still inlines small helpers (each left a call of ~60 instructions,
// counted with bench/server-instructions.ts).
function callIdBytes (callId: number): number {
  return callId < 0 ? 10 : callId < 0x80 ? 1 : callId < 0x4000 ? 2 : callId < 0x200000 ? 3 : callId < 0x10000000 ? 4 : 5
}

/**
 * Writes the frame `responseFrameBytes` sized at `out[at]`, as
 * `encodeResponseFrame(callId, false, body)` would encode it, and returns
 * where it ends. For encoding straight into an outbound buffer. The body is
 * `body[0, bodyBytes)` (a scratch buffer may be longer).
 */
export function writeResponseFrame (out: Buffer, at: number, callId: number, body: Uint8Array, bodyBytes = body.length): number {
  at = writeResponseFrameHead(out, at, callId, bodyBytes)
  return copySmall(body, bodyBytes, out, at)
}

/** As `writeResponseFrame`, all but the body: returns where the caller writes its `bodyBytes`. */
export function writeResponseFrameHead (out: Buffer, at: number, callId: number, bodyBytes: number): number {
  const headerBytes = 3 + callIdBytes(callId)
  // headerBytes is under 128 (at most 13); small bodies' lengths are one
  // byte. The prefix and the call id are written in line (see callIdBytes).
  const frameBytes = 1 + headerBytes + (bodyBytes < 0x80 ? 1 : varintBytes(bodyBytes)) + bodyBytes
  out[at] = frameBytes >>> 24
  out[at + 1] = frameBytes >>> 16
  out[at + 2] = frameBytes >>> 8
  out[at + 3] = frameBytes
  at += 4
  out[at++] = headerBytes
  out[at++] = 0x08 // field 1, call_id
  if (callId >= 0) {
    let id = callId
    while (id >= 0x80) {
      out[at++] = (id & 0x7f) | 0x80
      id >>>= 7
    }
    out[at++] = id
  } else {
    at = writeInt32(out, at, callId)
  }
  out[at++] = 0x10 // field 2, is_error: false
  out[at++] = 0
  if (bodyBytes < 0x80) {
    out[at++] = bodyBytes
    return at
  }
  return writeVarint(out, at, bodyBytes)
}

/** Encodes an error response (`is_error` set, ErrorStatusPB body). */
export function encodeErrorFrame (callId: number, code: number, message: string, unsupportedFeatureFlags?: readonly number[]): Buffer[] {
  const status: ErrorStatus = { message, code }
  if (unsupportedFeatureFlags !== undefined && unsupportedFeatureFlags.length > 0) status.unsupported_feature_flags = [...unsupportedFeatureFlags]
  return encodeResponseFrame(callId, true, ErrorStatusType.encode(status))
}

/**
 * A frame as a peer reads it: its header, where its main message lies in
 * the frame, and its sidecars (views of the frame). The message is decoded
 * from `frame[messageStart, messageEnd)` (`MessageType.decodeRange`), or
 * taken as a view with `message`.
 */
export class ParsedFrame<H> {
  readonly header: H
  readonly frame: Buffer
  readonly messageStart: number
  readonly messageEnd: number
  readonly sidecars: Buffer[]

  constructor (header: H, frame: Buffer, messageStart: number, messageEnd: number, sidecars: Buffer[]) {
    this.header = header
    this.frame = frame
    this.messageStart = messageStart
    this.messageEnd = messageEnd
    this.sidecars = sidecars
  }

  /** The main message's bytes, a view of the frame. */
  get message (): Buffer {
    return this.frame.subarray(this.messageStart, this.messageEnd)
  }
}

/** A request as the server reads it off one frame. */
export type RequestFrame = ParsedFrame<RequestHeader>

/** A response as the client reads it off one frame. */
export type ResponseFrame = ParsedFrame<ResponseHeader>

/** Parses a client→server frame; any malformation is returned as RPC_ERR_MALFORMED_FRAME. */
export function parseRequestFrame (frame: Buffer): RequestFrame | RpcError {
  const parts = new RequestParts()
  const error = parseRequestInto(frame, 0, frame.length, parts)
  return error ?? new ParsedFrame(requestHeaderOf(parts), frame, parts.messageStart, parts.messageEnd, parts.sidecars)
}

/** Parses a server→client frame; any malformation is returned as RPC_ERR_MALFORMED_FRAME. */
export function parseResponseFrame (frame: Buffer): ResponseFrame | RpcError {
  const parts = new ResponseParts()
  const error = parseResponseInto(frame, 0, frame.length, parts)
  return error ?? new ParsedFrame(responseHeaderOf(parts), frame, parts.messageStart, parts.messageEnd, parts.sidecars)
}

/**
 * A request frame taken apart by `parseRequestInto`, into one object its
 * owner reuses frame after frame: the header's fields, where the request
 * message lies in the read buffer, and the sidecars (views of it).
 */
export class RequestParts extends RequestHeaderFields {
  sidecars: Buffer[] = NO_SIDECARS
  messageStart = 0
  messageEnd = 0
}

/** A response frame taken apart by `parseResponseInto`, into one reused object. */
export class ResponseParts extends ResponseHeaderFields {
  sidecars: Buffer[] = NO_SIDECARS
  messageStart = 0
  messageEnd = 0
}

/**
 * As `parseRequestFrame`, of the frame `buf[start, end)` (length prefix
 * included), into `out`, making no view of the frame: the hot path of a
 * server. Returns the malformation, or null.
 */
export function parseRequestInto (buf: Buffer, start: number, end: number, out: RequestParts): RpcError | null {
  const b = frameBounds(buf, start, end)
  if (b instanceof RpcError) return b
  const bodyStart = b.bodyStart
  const error = decodeRequestHeaderInto(buf, b.headerStart, b.headerEnd, out)
  if (error !== null) return error
  return bodyParts(buf, bodyStart, end, out)
}

/** As `parseResponseFrame`, of the frame `buf[start, end)`, into `out`: the hot path of a client. */
export function parseResponseInto (buf: Buffer, start: number, end: number, out: ResponseParts): RpcError | null {
  if (fastResponseFrame(buf, start, end, out)) return null
  return parseResponseIntoGeneral(buf, start, end, out)
}

/** `parseResponseInto` without its fast path (tests hold the two to the same answers). */
export function parseResponseIntoGeneral (buf: Buffer, start: number, end: number, out: ResponseParts): RpcError | null {
  const b = frameBounds(buf, start, end)
  if (b instanceof RpcError) return b
  const bodyStart = b.bodyStart
  const error = decodeResponseHeaderInto(buf, b.headerStart, b.headerEnd, out)
  if (error !== null) return error
  return bodyParts(buf, bodyStart, end, out)
}

/**
 * The answer frames servers send for calls without sidecars, taken apart in
 * one pass: `[u32 length][header length, 1 byte][0x08 call_id (1-5 bytes,
 * <= 2^31 - 1) 0x10 is_error (0 or 1)][body length, 1-2 bytes][body]`.
 * False for anything else, which the general path then parses (or refuses):
 * it accepts exactly the frames this one does, with the same parts.
 */
export function fastResponseFrame (buf: Buffer, start: number, end: number, out: ResponseParts): boolean {
  if (end - start < 10 || readU32(buf, start) !== end - start - 4) return false
  const headerEnd = start + 5 + buf[start + 4]!
  if (buf[start + 4]! > 0x7f || headerEnd >= end || buf[start + 5] !== 0x08) return false
  let p = start + 6
  let b = buf[p++]!
  let callId = b & 0x7f
  if (b > 0x7f) {
    b = buf[p++]!
    callId |= (b & 0x7f) << 7
    if (b > 0x7f) {
      b = buf[p++]!
      callId |= (b & 0x7f) << 14
      if (b > 0x7f) {
        b = buf[p++]!
        callId |= (b & 0x7f) << 21
        if (b > 0x7f) {
          b = buf[p++]!
          // A fifth byte of at most 7 keeps the id within 2^31 - 1.
          if (b > 0x07) return false
          callId |= b << 28
        }
      }
    }
  }
  if (p + 2 !== headerEnd || buf[p] !== 0x10 || buf[p + 1]! > 1) return false
  let q = headerEnd
  b = buf[q++]!
  let bodyBytes = b & 0x7f
  if (b > 0x7f) {
    b = buf[q++]!
    if (b > 0x7f) return false
    bodyBytes |= b << 7
  }
  if (q + bodyBytes !== end) return false
  out.callId = callId
  out.isError = buf[p + 1] === 1
  out.sidecarOffsets = undefined
  out.sidecars = NO_SIDECARS
  out.messageStart = q
  out.messageEnd = end
  return true
}

function bodyParts (buf: Buffer, bodyStart: number, end: number,
  out: { sidecarOffsets: number[] | undefined, sidecars: Buffer[], messageStart: number, messageEnd: number }): RpcError | null {
  const offsets = out.sidecarOffsets
  const sidecars = sidecarsOf(buf, bodyStart, offsets, end)
  if (sidecars instanceof RpcError) return sidecars
  out.sidecars = sidecars
  out.messageStart = bodyStart
  out.messageEnd = offsets === undefined || offsets.length === 0 ? end : bodyStart + offsets[0]!
  return null
}
