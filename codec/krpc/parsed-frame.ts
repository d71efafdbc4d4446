/**
 * Takes KRPC frames apart: splitting a frame into header and body, parsing
 * requests and responses into ParsedFrame, and the hot paths' parsers into
 * reused RequestParts and ResponseParts, making no view of the frame.
 */
import { RpcError } from '../errors.js'
import {
  RequestHeaderFields, ResponseHeaderFields, decodeRequestHeaderInto, decodeResponseHeaderInto, requestHeaderOf, responseHeaderOf,
  type RequestHeader, type ResponseHeader
} from './header-decoder.js'
import { readVarint32, type VarintRead } from '../varint.js'
import { MAX_SIDECARS, malformed, readU32 } from './frames.js'

/** A frame split into its header PB and body (body PB plus sidecars), both views of the frame. */
export interface FrameParts { header: Buffer, body: Buffer }

const scratch: VarintRead = { value: 0, next: 0 }

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
