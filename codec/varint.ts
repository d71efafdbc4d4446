/**
 * Protobuf base-128 varints, as KRPC frames use them for the header and body
 * lengths and as the hand-written header encoders write them.
 */

/** Bytes a varint of the unsigned 32-bit value `value` takes. */
export function varintBytes (value: number): number {
  if (value < 0x80) return 1
  if (value < 0x4000) return 2
  if (value < 0x200000) return 3
  if (value < 0x10000000) return 4
  return 5
}

/** Bytes the proto `int32` `value` takes: negative values are sign-extended to 10 bytes. */
export function int32Bytes (value: number): number {
  return value < 0 ? 10 : varintBytes(value)
}

/** Writes the unsigned 32-bit `value` at `offset`; returns the offset after it. */
export function writeVarint (buf: Uint8Array, offset: number, value: number): number {
  while (value >= 0x80) {
    buf[offset++] = (value & 0x7f) | 0x80
    value >>>= 7
  }
  buf[offset++] = value
  return offset
}

/** Writes the proto `int32` `value` (10 bytes when negative); returns the offset after it. */
export function writeInt32 (buf: Uint8Array, offset: number, value: number): number {
  if (value >= 0) return writeVarint(buf, offset, value)
  // Sign extension to 64 bits: the low 32 bits, then ones.
  let low = value >>> 0
  for (let i = 0; i < 4; i++) {
    buf[offset++] = (low & 0x7f) | 0x80
    low >>>= 7
  }
  // Bits 28..31 of the low word and the first 3 bits of the all-ones high word.
  buf[offset++] = (low & 0x0f) | 0x70 | 0x80
  for (let i = 0; i < 4; i++) buf[offset++] = 0xff
  buf[offset++] = 0x01
  return offset
}

/**
 * The result of reading a varint: the value, and the offset after it. `-1`
 * as the offset means the bytes ran out; `-2` that the varint is longer than
 * 32 bits allow. Reused by the caller to avoid an allocation per read.
 */
export interface VarintRead { value: number, next: number }

/** Reads an unsigned 32-bit varint at `offset`, no further than `end`. */
export function readVarint32 (buf: Uint8Array, offset: number, end: number, out: VarintRead): VarintRead {
  let value = 0
  let shift = 0
  while (offset < end) {
    const byte = buf[offset++]!
    if (shift === 28) {
      // The fifth byte may carry only the top 4 bits.
      if (byte > 0x0f) { out.value = 0; out.next = -2; return out }
      value = (value | (byte << 28)) >>> 0
      out.value = value
      out.next = offset
      return out
    }
    value |= (byte & 0x7f) << shift
    if (byte < 0x80) {
      out.value = value >>> 0
      out.next = offset
      return out
    }
    shift += 7
  }
  out.value = 0
  out.next = -1
  return out
}
