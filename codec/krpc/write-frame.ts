/**
 * Writes KRPC frames in place into an outbound buffer, with no slices or
 * intermediate buffers: the per-call encoders of a client's requests and a
 * server's answers, byte for byte what encode-frame.ts would encode.
 */
import type { FrameSink } from '../frame-sink.js'
import { int32Bytes, varintBytes, writeInt32, writeVarint } from '../varint.js'

// A big-endian u32 write of the length prefix, as plain byte arithmetic:
// Buffer#writeUInt32BE validates its arguments on every call (see readU32
// in frames.ts).
function writeU32 (out: Uint8Array, at: number, value: number): void {
  out[at] = value >>> 24
  out[at + 1] = value >>> 16
  out[at + 2] = value >>> 8
  out[at + 3] = value
}

// TypedArray#set, called as a known function: `out.set` is a property load
// that went through V8's generic LoadIC on every call (~2 % of a pipelining
// client's CPU in perf).
const typedArraySet = Uint8Array.prototype.set

/**
 * Copies src[0, n) to out[at]; returns the end. Measured here: a byte loop
 * wins up to ~10 bytes (8 vs 16 ns for 4 bytes), TypedArray#set beyond (17
 * vs 50 ns for 37 bytes), Buffer#copy when only part of src is wanted (no view).
 */
export function copySmall (src: Uint8Array, n: number, out: Uint8Array, at: number): number {
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

/**
 * Reserves in `out` the request frame `requestFrameBytes` sizes and writes
 * all of it but the body, sizing and writing in one pass (the client's
 * per-call path: `requestFrameBytes` then `writeRequestFrameHead` measured
 * the header twice and wrote the call id through a call). Returns where
 * the `bodyBytes` of the body PB go in `out.buffer`.
 */
export function reserveRequestFrame (out: FrameSink, callId: number, tail: Uint8Array, bodyBytes: number): number {
  const idBytes = callId < 0 ? 10 : callId < 0x80 ? 1 : callId < 0x4000 ? 2 : callId < 0x200000 ? 3 : callId < 0x10000000 ? 4 : 5
  const headerBytes = 1 + idBytes + tail.length
  const frameBytes = (headerBytes < 0x80 ? 1 : varintBytes(headerBytes)) + headerBytes + (bodyBytes < 0x80 ? 1 : varintBytes(bodyBytes)) + bodyBytes
  let at = out.reserve(4 + frameBytes)
  const buf = out.buffer
  writeU32(buf, at, frameBytes)
  at += 4
  if (headerBytes < 0x80) buf[at++] = headerBytes
  else at = writeVarint(buf, at, headerBytes)
  buf[at++] = 0x18 // field 3, call_id
  if (callId < 0) at = writeInt32(buf, at, callId)
  else {
    let id = callId
    while (id >= 0x80) {
      buf[at++] = (id & 0x7f) | 0x80
      id >>>= 7
    }
    buf[at++] = id
  }
  at = copySmall(tail, tail.length, buf, at)
  if (bodyBytes < 0x80) buf[at++] = bodyBytes
  else at = writeVarint(buf, at, bodyBytes)
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
