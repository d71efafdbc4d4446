import { ErrorCode, RpcError } from './errors.js'
import type { RequestHeader, ResponseHeader } from './krpc.js'

/**
 * Hand-written decoders for the two headers every call carries, so that the
 * hot path allocates no protobufjs message per frame. They follow proto2
 * rules: any field order, unknown fields skipped, repeated scalars read
 * packed or unpacked, the last value of a singular field wins, required
 * fields checked. Tests check them against the protobufjs types.
 */

class Reader {
  pos: number
  readonly buf: Uint8Array
  readonly end: number
  error: string | null = null

  constructor (buf: Uint8Array, start: number, end: number) {
    this.buf = buf
    this.pos = start
    this.end = end
  }

  // A varint as a JS number; values above 2^53 lose precision, which only
  // int64 fields (request_id) could carry, and those are not read here.
  varint (): number {
    let result = 0
    let multiplier = 1
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) { this.error = 'truncated varint'; return 0 }
      const byte = this.buf[this.pos++]!
      result += (byte & 0x7f) * multiplier
      if (byte < 0x80) return result
      multiplier *= 128
    }
    this.error = 'varint longer than 10 bytes'
    return 0
  }

  // int32 on the wire is a 64-bit varint: keep the low 32 bits, signed.
  int32 (): number {
    const start = this.pos
    let low = 0
    let shift = 0
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) { this.error = 'truncated varint'; return 0 }
      const byte = this.buf[this.pos++]!
      if (shift < 32) low |= (byte & 0x7f) << shift
      shift += 7
      if (byte < 0x80) return low | 0
    }
    this.pos = start
    this.error = 'varint longer than 10 bytes'
    return 0
  }

  // uint32 keeps the low 32 bits of the varint, as protobufjs and Kudu do;
  // summing all 10 bytes as a float would lose them.
  uint32 (): number {
    return this.int32() >>> 0
  }

  /** End of the last length-delimited field read. */
  fieldEnd = 0

  // Skips a length-delimited field; returns where its bytes start (they end at `fieldEnd`).
  lengthDelimited (): number {
    const length = this.varint()
    const start = this.pos
    if (this.error === null && start + length > this.end) this.error = 'truncated length-delimited field'
    this.pos = start + length
    this.fieldEnd = this.pos
    return start
  }

  skip (wireType: number): void {
    switch (wireType) {
      case 0: this.varint(); break
      case 1: this.pos += 8; break
      case 2: this.lengthDelimited(); break
      case 5: this.pos += 4; break
      default: this.error = `unsupported wire type ${wireType}`
    }
    if (this.pos > this.end) this.error = 'truncated field'
  }

  // A repeated uint32 field, packed (wire type 2) or one unpacked value.
  repeatedUint32 (wireType: number, into: number[]): void {
    if (wireType === 0) {
      into.push(this.uint32())
      return
    }
    if (wireType !== 2) { this.error = 'bad wire type for a repeated uint32'; return }
    const start = this.lengthDelimited()
    const stop = this.fieldEnd
    if (this.error !== null) return
    const inner = new Reader(this.buf, start, stop)
    while (inner.pos < stop && inner.error === null) into.push(inner.uint32())
    if (inner.error !== null) this.error = inner.error
  }

  string (): string {
    const start = this.lengthDelimited()
    const stop = this.fieldEnd
    if (this.error !== null) return ''
    return Buffer.from(this.buf.buffer, this.buf.byteOffset + start, stop - start).toString('utf8')
  }
}

// A server sees the same few methods over and over: their RemoteMethodPB
// bytes map to one shared, frozen object, which spares two UTF-8 decodes and
// four allocations per request. A handful of entries, replaced in turn.
const REMOTE_CACHE_SIZE = 8
const remoteBytes: Array<Uint8Array | undefined> = []
const remoteValues: Array<RemoteMethod | undefined> = []
let remoteNext = 0
// Where the last lookup hit: a connection's calls mostly repeat one method.
let remoteLastHit = 0

type RemoteMethod = NonNullable<RequestHeader['remote_method']>

function cachedRemoteMethod (buf: Uint8Array, start: number, stop: number): RemoteMethod | undefined {
  const length = stop - start
  const entries = remoteBytes.length
  for (let k = 0; k < entries; k++) {
    const i = (remoteLastHit + k) % entries
    const bytes = remoteBytes[i]!
    if (bytes.length !== length) continue
    let j = 0
    while (j < length && bytes[j] === buf[start + j]) j++
    if (j === length) {
      remoteLastHit = i
      return remoteValues[i]
    }
  }
  return undefined
}

function rememberRemoteMethod (buf: Uint8Array, start: number, stop: number, service: string, method: string): RemoteMethod {
  const value: RemoteMethod = Object.freeze({ service_name: service, method_name: method })
  // Long names are not worth keeping.
  if (stop - start <= 256) {
    remoteBytes[remoteNext] = Uint8Array.prototype.slice.call(buf, start, stop)
    remoteValues[remoteNext] = value
    remoteNext = (remoteNext + 1) % REMOTE_CACHE_SIZE
  }
  return value
}

function fail (what: string, detail: string): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, `bad ${what}: ${detail}`)
}

/** Decodes a ResponseHeader (of `buf[start, end)`); a malformed one or a missing `call_id` is returned as an error. */
export function decodeResponseHeader (buf: Uint8Array, start = 0, end = buf.length): ResponseHeader | RpcError {
  const r = new Reader(buf, start, end)
  let callId: number | undefined
  let isError: boolean | undefined
  let offsets: number[] | undefined
  while (r.pos < r.end && r.error === null) {
    const tag = r.varint()
    if (r.error !== null) break
    const field = Math.floor(tag / 8)
    const wireType = tag & 7
    if (field === 1 && wireType === 0) callId = r.int32()
    else if (field === 2 && wireType === 0) isError = r.varint() !== 0
    else if (field === 3) r.repeatedUint32(wireType, offsets ??= [])
    else if (field === 0) r.error = 'field number 0'
    else r.skip(wireType)
  }
  if (r.error !== null) return fail('ResponseHeader', r.error)
  if (callId === undefined) return fail('ResponseHeader', 'missing required call_id')
  const header: ResponseHeader = { call_id: callId }
  if (isError !== undefined) header.is_error = isError
  if (offsets !== undefined) header.sidecar_offsets = offsets
  return header
}

/** Decodes a RequestHeader (of `buf[start, end)`); a malformed one or a missing required field is returned as an error. */
export function decodeRequestHeader (buf: Uint8Array, start = 0, end = buf.length): RequestHeader | RpcError {
  const r = new Reader(buf, start, end)
  const header: RequestHeader = { call_id: 0 }
  let hasCallId = false
  while (r.pos < r.end && r.error === null) {
    const tag = r.varint()
    if (r.error !== null) break
    const field = Math.floor(tag / 8)
    const wireType = tag & 7
    if (field === 3 && wireType === 0) {
      header.call_id = r.int32()
      hasCallId = true
    } else if (field === 6 && wireType === 2) {
      const start = r.lengthDelimited()
      const stop = r.fieldEnd
      if (r.error !== null) break
      const cached = cachedRemoteMethod(buf, start, stop)
      if (cached !== undefined) {
        header.remote_method = cached
        continue
      }
      const inner = new Reader(buf, start, stop)
      let service: string | undefined
      let method: string | undefined
      while (inner.pos < stop && inner.error === null) {
        const innerTag = inner.varint()
        if (inner.error !== null) break
        const innerField = Math.floor(innerTag / 8)
        const innerWire = innerTag & 7
        if (innerField === 1 && innerWire === 2) service = inner.string()
        else if (innerField === 2 && innerWire === 2) method = inner.string()
        else if (innerField === 0) inner.error = 'field number 0'
        else inner.skip(innerWire)
      }
      if (inner.error !== null) { r.error = `remote_method: ${inner.error}`; break }
      if (service === undefined || method === undefined) {
        r.error = `remote_method: missing required ${service === undefined ? 'service_name' : 'method_name'}`
        break
      }
      header.remote_method = rememberRemoteMethod(buf, start, stop, service, method)
    } else if (field === 10 && wireType === 0) {
      header.timeout_millis = r.uint32()
    } else if (field === 11) {
      r.repeatedUint32(wireType, header.required_feature_flags ??= [])
    } else if (field === 16) {
      r.repeatedUint32(wireType, header.sidecar_offsets ??= [])
    } else if (field === 0) {
      r.error = 'field number 0'
    } else {
      // request_id (15) and unknown fields: exactly-once is not implemented, so skipped.
      r.skip(wireType)
    }
  }
  if (r.error !== null) return fail('RequestHeader', r.error)
  if (!hasCallId) return fail('RequestHeader', 'missing required call_id')
  return header
}
