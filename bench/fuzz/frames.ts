// Protobuf and frame writing, free enough to write what no encoder would.
import { encodeRemoteMethod, encodeRequestFrame } from '../../codec/krpc/encode-frame.js'
import { varintBytes, writeInt32 } from '../../codec/varint.js'

/** A protobuf writer that writes any field number, wire type and length, also ones no encoder would. */
export class Pb {
  readonly out: number[] = []

  /** A varint of a non-negative integer up to 2^53. */
  varint (value: number): this {
    let v = value
    while (v >= 0x80) {
      this.out.push((v % 128) | 0x80)
      v = Math.floor(v / 128)
    }
    this.out.push(v)
    return this
  }

  /** A proto int32: negative values take 10 bytes. */
  int32 (value: number): this {
    if (value >= 0) return this.varint(value)
    const b = Buffer.alloc(10)
    const end = writeInt32(b, 0, value)
    for (let i = 0; i < end; i++) this.out.push(b[i]!)
    return this
  }

  tag (field: number, wireType: number): this {
    return this.varint(field * 8 + wireType)
  }

  len (bytes: Uint8Array): this {
    this.varint(bytes.length)
    return this.raw(bytes)
  }

  raw (bytes: Uint8Array | readonly number[]): this {
    for (let i = 0; i < bytes.length; i++) this.out.push(bytes[i]!)
    return this
  }

  buffer (): Buffer {
    return Buffer.from(this.out)
  }
}

/** `n` as 4 big-endian bytes. */
export function u32be (n: number): Buffer {
  const b = Buffer.alloc(4)
  b.writeUInt32BE(n >>> 0)
  return b
}

/** `value` as a protobuf varint. */
export function varintBuf (value: number): Buffer {
  return new Pb().varint(value).buffer()
}

/** `[u32 length][varint header length][header][varint body length][body][sidecars]`, the lengths true. */
export function frameOf (header: Uint8Array, body: Uint8Array, sidecars: readonly Uint8Array[] = []): Buffer {
  let bodyBytes = body.length
  for (const s of sidecars) bodyBytes += s.length
  const total = varintBytes(header.length) + header.length + varintBytes(bodyBytes) + bodyBytes
  return Buffer.concat([u32be(total), varintBuf(header.length), header, varintBuf(bodyBytes), body, ...sidecars])
}

/** The slices as one buffer. */
export function join (slices: readonly Buffer[]): Buffer {
  return slices.length === 1 ? slices[0]! : Buffer.concat(slices)
}

/** Rewrites the length prefix to what follows it (a frame whose inside may still lie). */
export function fixPrefix (frame: Buffer): Buffer {
  if (frame.length >= 4) frame.writeUInt32BE(frame.length - 4, 0)
  return frame
}

/** `frame` with its length prefix set to `value` (a frame shorter than a prefix gets one in front). */
export function withPrefix (frame: Buffer, value: number): Buffer {
  const f = frame.length >= 4 ? frame : Buffer.concat([Buffer.alloc(4), frame])
  f.writeUInt32BE(Math.min(0xffffffff, Math.max(0, Math.floor(value))), 0)
  return f
}

interface Layout { headerStart: number, headerEnd: number, bodyStart: number }

/** Where the parts of a well-formed frame lie; null when its lengths do not add up. */
export function layoutOf (frame: Buffer): Layout | null {
  if (frame.length < 6) return null
  const h = readVarint(frame, 4)
  if (h === null) return null
  const headerEnd = h.next + h.value
  const b = readVarint(frame, headerEnd)
  if (b === null) return null
  return { headerStart: h.next, headerEnd, bodyStart: b.next }
}

function readVarint (buf: Buffer, at: number): { value: number, next: number } | null {
  let value = 0
  let mul = 1
  for (let i = 0; i < 5 && at < buf.length; i++) {
    const byte = buf[at++]!
    value += (byte & 0x7f) * mul
    if (byte < 0x80) return { value, next: at }
    mul *= 128
  }
  return null
}

/** A KRPC request as the generator means it, before any mutation. */
export interface RequestSpec {
  callId: number
  service: string
  method: string
  timeoutMs: number
  flags: number[]
  body: Uint8Array
  sidecars: Uint8Array[]
}

const remoteMethods = new Map<string, Buffer>()

/** The encoded RemoteMethodPB of `service` and `method`, made once per pair. */
export function remoteMethodOf (service: string, method: string): Buffer {
  const key = `${service}\u0000${method}`
  let bytes = remoteMethods.get(key)
  if (bytes === undefined) {
    bytes = encodeRemoteMethod(service, method)
    if (remoteMethods.size < 256) remoteMethods.set(key, bytes)
  }
  return bytes
}

/** The frame nyala's client would write for `spec` (the codec's encoder). */
export function encodeSpec (spec: RequestSpec): Buffer {
  return join(encodeRequestFrame({
    callId: spec.callId,
    remoteMethod: remoteMethodOf(spec.service, spec.method),
    timeoutMs: spec.timeoutMs,
    requiredFeatureFlags: spec.flags.length > 0 ? spec.flags : undefined,
    sidecars: spec.sidecars.length > 0 ? spec.sidecars : undefined
  }, spec.body))
}

/** As `encodeSpec`, by hand, with the sidecar offsets given (packed or not). */
export function encodeSpecWithOffsets (spec: RequestSpec, offsets: readonly number[], packed: boolean): Buffer {
  const w = new Pb().tag(3, 0).int32(spec.callId).raw(remoteMethodOf(spec.service, spec.method))
  if (spec.timeoutMs > 0) w.tag(10, 0).varint(spec.timeoutMs)
  for (const f of spec.flags) w.tag(11, 0).varint(f)
  if (packed) {
    const inner = new Pb()
    for (const o of offsets) inner.varint(o)
    w.tag(16, 2).len(inner.buffer())
  } else {
    for (const o of offsets) w.tag(16, 0).varint(o)
  }
  return frameOf(w.buffer(), spec.body, spec.sidecars)
}
