/**
 * The KRPC frame layout shared by every encoder and parser: the constants,
 * the header messages of rpc_header.proto, and the length-prefix framing.
 * Frames are encoded by encode-frame.ts (slice lists) and write-frame.ts (in
 * place), and taken apart by parsed-frame.ts.
 */
import { ErrorCode, RpcError } from '../errors.js'
import type { Framing } from '../frame-decoder.js'
import { ProtoSchema, assetPath } from '../protobuf/schema.js'
import type { RequestHeader, ResponseHeader } from './header-decoder.js'

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
/** The KRPC protocol version the preamble carries. */
export const KRPC_VERSION = 9
/** Call id of every NegotiatePB frame. */
export const NEGOTIATE_CALL_ID = -33
/** Call id of the ConnectionContextPB frame. */
export const CONNECTION_CONTEXT_CALL_ID = -3
/** At most this many sidecars in one frame (Kudu's kMaxSidecars). */
export const MAX_SIDECARS = 10_000

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

/**
 * Reads the big-endian u32 at `buf[at]` (a frame's length prefix), as plain
 * byte arithmetic: Buffer#readUInt32BE validates its arguments through
 * Node's validators on every call (~2 % of a server's CPU per call under
 * pipelined load, measured with perf). Callers keep within bounds.
 */
export function readU32 (buf: Uint8Array, at: number): number {
  return buf[at]! * 0x1000000 + ((buf[at + 1]! << 16) | (buf[at + 2]! << 8) | buf[at + 3]!)
}

/** A MALFORMED_FRAME error. */
export function malformed (message: string, cause?: unknown): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, message, cause === undefined ? undefined : { cause })
}

/** A decoded ErrorStatusPB. */
export interface ErrorStatus {
  message: string
  code?: number
  unsupported_feature_flags?: number[]
}

/** Encodes and decodes RequestHeader. */
export const RequestHeaderType = headerSchema.type<RequestHeader>('kudu.rpc.RequestHeader')
/** Encodes and decodes ResponseHeader. */
export const ResponseHeaderType = headerSchema.type<ResponseHeader>('kudu.rpc.ResponseHeader')
/** Encodes and decodes ErrorStatusPB. */
export const ErrorStatusType = headerSchema.type<ErrorStatus>('kudu.rpc.ErrorStatusPB')
