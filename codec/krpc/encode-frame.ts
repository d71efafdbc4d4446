/**
 * Encodes KRPC frames as lists of slices to write: requests, responses and
 * error responses with any sidecars, and the remote_method field a client
 * builds once per method. The in-place writers of the hot paths are in
 * write-frame.ts.
 */
import { ErrorCode, RpcError } from '../errors.js'
import { int32Bytes, varintBytes, writeInt32, writeVarint } from '../varint.js'
import { ErrorStatusType, MAX_SIDECARS, type ErrorStatus } from './frames.js'
import { wireTimeout } from './write-frame.js'

/** Sidecars up to this many bytes in all are copied into the frame's head buffer; bigger ones are written as their own slices. */
const INLINE_SIDECAR_BYTES = 16 * 1024

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

/** Encodes an error response (`is_error` set, ErrorStatusPB body). */
export function encodeErrorFrame (callId: number, code: number, message: string, unsupportedFeatureFlags?: readonly number[]): Buffer[] {
  const status: ErrorStatus = { message, code }
  if (unsupportedFeatureFlags !== undefined && unsupportedFeatureFlags.length > 0) status.unsupported_feature_flags = [...unsupportedFeatureFlags]
  return encodeResponseFrame(callId, true, ErrorStatusType.encode(status))
}
