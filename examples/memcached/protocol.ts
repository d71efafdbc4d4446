import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Framing } from '../../codec/frame-decoder.js'
import type { FrameSink } from '../../codec/frame-sink.js'
import { InvalidRequest, type AnsweredCall, type AnswerSlices, type CallHead, type CallInfo, type RefusalReason, type RouteInfo, type ServerProtocol } from '../../codec/protocol.js'
import { DEFAULT_MAX_ITEM_BYTES, MAX_KEY_BYTES, SLAB_VALUE_BYTES, Status } from './store.js'

/**
 * memcached's binary protocol (protocol_binary.h, the BinaryProtocolRevamped
 * wiki) as a nyala `ServerProtocol`. Every packet, request or response, is
 * a 24-byte header and a body of extras, key and value:
 *
 *   magic | opcode | key length u16 | extras length | data type | vbucket / status u16 |
 *   body length u32 | opaque u32 | CAS u64 | extras | key | value
 *
 * Requests have magic 0x80, responses 0x81; all numbers are big-endian.
 * Answers leave in request order. What memcached does, byte for byte, is
 * the reference (proto_bin.c): which answers the quiet commands leave out,
 * what each error's body says, which extras each answer carries.
 */

/** The command opcodes. The route (method) of a request is its command's name here. */
export const Opcode = {
  GET: 0x00,
  SET: 0x01,
  ADD: 0x02,
  REPLACE: 0x03,
  DELETE: 0x04,
  INCREMENT: 0x05,
  DECREMENT: 0x06,
  QUIT: 0x07,
  FLUSH: 0x08,
  GETQ: 0x09,
  NOOP: 0x0a,
  VERSION: 0x0b,
  GETK: 0x0c,
  GETKQ: 0x0d,
  APPEND: 0x0e,
  PREPEND: 0x0f,
  STAT: 0x10,
  SETQ: 0x11,
  ADDQ: 0x12,
  REPLACEQ: 0x13,
  DELETEQ: 0x14,
  INCREMENTQ: 0x15,
  DECREMENTQ: 0x16,
  QUITQ: 0x17,
  FLUSHQ: 0x18,
  APPENDQ: 0x19,
  PREPENDQ: 0x1a,
  VERBOSITY: 0x1b,
  TOUCH: 0x1c,
  GAT: 0x1d,
  GATQ: 0x1e,
  GATK: 0x23,
  GATKQ: 0x24
} as const
export type CommandName = keyof typeof Opcode

/**
 * Response statuses: the store's (`Status` in store.ts) and those the
 * server answers itself. EBUSY and ETMPFAIL are not in memcached's own
 * header but in the protocol's (libmemcached's binary.h, the wiki).
 */
export const ResponseStatus = {
  // What the cache's operations answer with, then what only the server says.
  ...Status,
  UNKNOWN_COMMAND: 0x81,
  NOT_SUPPORTED: 0x83,
  EINTERNAL: 0x84,
  EBUSY: 0x85,
  ETMPFAIL: 0x86
} as const

/** The body of an error answer: memcached's words (write_bin_error), and the protocol's for those memcached never sends. */
const ERROR_TEXT: ReadonlyMap<number, string> = new Map([
  [0x01, 'Not found'],
  [0x02, 'Data exists for key.'],
  [0x03, 'Too large.'],
  [0x04, 'Invalid arguments'],
  [0x05, 'Not stored.'],
  [0x06, 'Non-numeric server-side value for incr or decr'],
  [0x81, 'Unknown command'],
  [0x82, 'Out of memory'],
  [0x83, 'Not supported'],
  [0x84, 'Internal error'],
  [0x85, 'Busy'],
  [0x86, 'Temporary failure']
])

export const HEADER_BYTES = 24
const REQUEST_MAGIC = 0x80
const RESPONSE_MAGIC = 0x81
const TWO_32 = 0x1_0000_0000
const EMPTY = Buffer.alloc(0)

/**
 * Values larger than this are sent as their own slice (writev, no copy)
 * rather than copied into the outbound buffer. It is the store's
 * SLAB_VALUE_BYTES: a value up to that size lies in a slab chunk that is
 * reused once its item goes, so it must be copied while the handler's
 * answer is encoded (at once, or into a buffer of its own when the answer
 * waits for its turn); larger values have buffers that are never written over.
 */
export const DEFAULT_SLICE_VALUE_BYTES = SLAB_VALUE_BYTES

/** Route names by opcode; an opcode with no command is `0x..`, a name no route has, so it is answered `no-method` (Unknown command). */
const METHOD_OF: readonly string[] = (() => {
  const names = Array.from({ length: 256 }, (_, opcode) => '0x' + opcode.toString(16).padStart(2, '0'))
  for (const [name, opcode] of Object.entries(Opcode)) names[opcode] = name
  return names
})()

/** One object per opcode, the same every time (`CallHead.routeKey`): the server finds the route by identity. */
const ROUTE_KEY_OF: readonly object[] = Array.from({ length: 256 }, (_, opcode) => Object.freeze({ opcode }))

/** The name of an opcode's command (`GETQ`), or `0x..` when it has none. */
export function methodOf (opcode: number): string {
  return METHOD_OF[opcode & 0xff]!
}

// Which answers the quiet commands leave out (proto_bin.c). The "Q"
// storage, delete, arithmetic, flush and quit commands send nothing on
// success; GETQ, GETKQ, GATQ and GATKQ send their hits and leave out their
// misses. Errors always go.
const QUIET_SUCCESS = 1
const QUIET_MISS = 2
const QUIET: Uint8Array = (() => {
  const quiet = new Uint8Array(256)
  for (const op of [Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ, Opcode.DELETEQ, Opcode.INCREMENTQ, Opcode.DECREMENTQ,
    Opcode.QUITQ, Opcode.FLUSHQ, Opcode.APPENDQ, Opcode.PREPENDQ]) quiet[op] = QUIET_SUCCESS
  for (const op of [Opcode.GETQ, Opcode.GETKQ, Opcode.GATQ, Opcode.GATKQ]) quiet[op] = QUIET_MISS
  return quiet
})()

/** True when the protocol sends nothing for this answer: a quiet command's success, or a quiet get's miss. */
export function isSilent (opcode: number, status: number): boolean {
  const quiet = QUIET[opcode & 0xff]!
  return (quiet === QUIET_SUCCESS && status === ResponseStatus.SUCCESS) ||
    (quiet === QUIET_MISS && status === ResponseStatus.KEY_ENOENT)
}

// What a call carries for its encoders (CallHead.data): the opcode and the
// opaque packed into one number (opcode * 2^32 + opaque; at most 2^40), so
// the head makes no object per frame.
function callData (opcode: number, opaque: number): number {
  return opcode * TWO_32 + opaque
}

/** The request's opcode, from a call's `data`. */
export function opcodeOf (data: unknown): number {
  return typeof data === 'number' ? Math.floor(data / TWO_32) : 0
}

/** The request's opaque, from a call's `data`. */
export function opaqueOf (data: unknown): number {
  // Not `data % TWO_32`: a remainder of numbers that are not small integers is a call to fmod.
  return typeof data === 'number' ? data - Math.floor(data / TWO_32) * TWO_32 : 0
}

/**
 * A request, as handlers get it. Which fields mean something depends on
 * the command; the others are 0 or empty. Its fields (as a response's)
 * are declared without a value (`declare`), none #private, and set in the
 * constructor in one order, so that V8 makes it in line.
 */
export class MemcachedRequest {
  declare readonly opcode: number
  /** The header's CAS (0: none). A number: CAS values up to 2^53 are exact, and a larger one matches no item's. */
  declare readonly cas: number
  /** The buffer the key lies in (the frame, or the key itself): the key is `keyBuffer[keyStart, keyEnd)`. */
  declare readonly keyBuffer: Buffer
  declare readonly keyStart: number
  declare readonly keyEnd: number
  /** The value: a view of the frame (copy it to keep it). */
  declare readonly value: Buffer
  /** SET, ADD, REPLACE: the flags. VERBOSITY: the level. */
  declare readonly flags: number
  /** SET, ADD, REPLACE, TOUCH, GAT, INCREMENT, DECREMENT: the expiration (0xffffffff on INCREMENT and DECREMENT: do not create). FLUSH: the delay. */
  declare readonly exptime: number
  /** INCREMENT, DECREMENT: the amount. */
  declare readonly delta: bigint
  /** INCREMENT, DECREMENT: the value of a key created. */
  declare readonly initial: bigint

  /** `key`: the key's bytes, or with `keyStart` and `keyEnd` the buffer it lies in (a frame: no view is made unless `key` is read). */
  constructor (opcode: number, cas: number, key: Buffer, value: Buffer, flags: number, exptime: number, delta: bigint, initial: bigint,
    keyStart = 0, keyEnd = key.length) {
    this.opcode = opcode
    this.cas = cas
    this.keyBuffer = key
    this.keyStart = keyStart
    this.keyEnd = keyEnd
    this.value = value
    this.flags = flags
    this.exptime = exptime
    this.delta = delta
    this.initial = initial
  }

  /** The key's bytes: a view of the frame (made at each read), empty when there is none. STAT: the sub-command. */
  get key (): Buffer {
    const start = this.keyStart
    const end = this.keyEnd
    return start === end ? EMPTY : start === 0 && end === this.keyBuffer.length ? this.keyBuffer : this.keyBuffer.subarray(start, end)
  }
}

/**
 * A name and value of a STAT answer: what a STAT handler writes as each
 * part of its streamed answer (`ctx.write`), sent as one packet.
 */
export type StatEntry = readonly [name: string, value: string]

/**
 * An answer, as handlers return it. The encoder adds the opcode and the
 * opaque of the request, and leaves the answer out when the command is
 * quiet about it (`isSilent`). Its buffers must not change until the
 * handler has returned: the server encodes the answer then (copying values
 * up to `sliceValueBytes`, also when the answer waits behind slower ones),
 * and a larger value, sent as it is, must not change at all.
 */
export class MemcachedResponse {
  declare readonly status: number
  /** The header's CAS: the item's, on answers about one; else 0. */
  declare readonly cas: number
  /** The item's flags as 4 bytes of extras (GET, GAT and TOUCH hits); -1: no extras. */
  declare readonly flags: number
  /** A key, for GETK and GATK; empty for none. */
  declare readonly key: Uint8Array
  /** The value: the item's, an error's text, the version, an INCREMENT's 8-byte result. */
  declare readonly value: Uint8Array
  /**
   * A STAT answer in one piece: one packet per entry, then the empty one
   * that ends it, for a context that cannot stream parts. Null for other
   * answers (a streamed STAT's final answer included: `OK`, the empty packet).
   */
  declare readonly stats: readonly StatEntry[] | null

  constructor (status: number, cas = 0, flags = -1, key: Uint8Array = EMPTY, value: Uint8Array = EMPTY, stats: readonly StatEntry[] | null = null) {
    this.status = status
    this.cas = cas
    this.flags = flags
    this.key = key
    this.value = value
    this.stats = stats
  }
}

/** A success with no body, CAS 0 (DELETE, FLUSH, NOOP, QUIT, VERBOSITY). */
export const OK = new MemcachedResponse(ResponseStatus.SUCCESS)

const ERRORS = new Map<number, MemcachedResponse>()

/** The error answer for a status, with memcached's text as its body (one shared object per status). */
export function errorResponse (status: number): MemcachedResponse {
  let response = ERRORS.get(status)
  if (response === undefined) {
    response = new MemcachedResponse(status, 0, -1, EMPTY, Buffer.from(ERROR_TEXT.get(status) ?? 'Error', 'latin1'))
    ERRORS.set(status, response)
  }
  return response
}

/** The status of a refusal, in memcached's terms. */
export function refusalStatus (reason: RefusalReason): number {
  switch (reason) {
    // Too much queued, or queued too long: the server is overloaded.
    case 'busy':
    case 'expired':
    case 'timed-out':
      return ResponseStatus.EBUSY
    // Going away or not there yet: worth trying again (elsewhere, or later).
    case 'shutdown':
    case 'unavailable':
      return ResponseStatus.ETMPFAIL
    case 'no-service':
    case 'no-method':
      return ResponseStatus.UNKNOWN_COMMAND
    case 'invalid':
      return ResponseStatus.EINVAL
    case 'failed':
    case 'abandoned':
      return ResponseStatus.EINTERNAL
  }
}

export interface MemcachedProtocolOptions {
  /** The store's largest item (`maxItemBytes`); frames are accepted up to twice it. Default 1 MiB. */
  maxItemBytes?: number
  /** Values above this many bytes are sent as their own slice, without a copy. Default and least: SLAB_VALUE_BYTES (16 KiB). */
  sliceValueBytes?: number
}

// Big-endian reads and writes by hand, as in codec/krpc.ts: Buffer's
// methods validate their arguments on every call. Callers stay in bounds.
function readU16 (buf: Uint8Array, at: number): number {
  return (buf[at]! << 8) | buf[at + 1]!
}

function readU32 (buf: Uint8Array, at: number): number {
  return buf[at]! * 0x1000000 + ((buf[at + 1]! << 16) | (buf[at + 2]! << 8) | buf[at + 3]!)
}

function writeU16 (out: Uint8Array, at: number, value: number): void {
  out[at] = value >>> 8
  out[at + 1] = value
}

function writeU32 (out: Uint8Array, at: number, value: number): void {
  out[at] = value >>> 24
  out[at + 1] = value >>> 16
  out[at + 2] = value >>> 8
  out[at + 3] = value
}

/** Writes a response header at `out[at]`; the data type and the CAS's high bytes as the numbers give them. */
function writeHeader (out: Uint8Array, at: number, opcode: number, keyBytes: number, extrasBytes: number,
  status: number, bodyBytes: number, opaque: number, cas: number): void {
  out[at] = RESPONSE_MAGIC
  out[at + 1] = opcode
  writeU16(out, at + 2, keyBytes)
  out[at + 4] = extrasBytes
  out[at + 5] = 0
  writeU16(out, at + 6, status)
  writeU32(out, at + 8, bodyBytes)
  writeU32(out, at + 12, opaque)
  const casHigh = Math.floor(cas / TWO_32)
  writeU32(out, at + 16, casHigh)
  // Not `cas % TWO_32`: see opaqueOf.
  writeU32(out, at + 20, cas - casHigh * TWO_32)
}

function malformed (message: string): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, message)
}

/**
 * A request memcached answers with an error and then closes its
 * connection (handle_binary_protocol_error): lengths wrong for the command
 * (`Invalid arguments`), extras and key longer than the body (`Unknown
 * command`). The answer keeps the request's opcode and opaque.
 */
export class MemcachedProtocolError extends RpcError {
  readonly opcode: number
  readonly opaque: number
  readonly status: number

  constructor (message: string, opcode: number, opaque: number, status: number) {
    super(ErrorCode.MALFORMED_FRAME, message)
    this.name = 'MemcachedProtocolError'
    this.opcode = opcode
    this.opaque = opaque
    this.status = status
  }
}

/** The error answer of a `MemcachedProtocolError`, sent before the connection closes. */
export function protocolErrorAnswer (error: MemcachedProtocolError): Buffer {
  const response = errorResponse(error.status)
  const out = Buffer.allocUnsafe(HEADER_BYTES + response.value.length)
  out.set(response.value, encodeHead(out, 0, error.opcode, error.opaque, response))
  return out
}

/**
 * Framing: the 24-byte header holds the body's length. A first byte that
 * is not the request magic (0x80) closes the connection, as memcached does
 * with a binary connection; so does a header whose extras and key do not
 * fit in its body, answered "Unknown command" first as memcached does.
 */
export const memcachedFraming: Framing = {
  prefixBytes: HEADER_BYTES,
  frameBytes: (buf, offset) => {
    if (buf[offset] !== REQUEST_MAGIC) return malformed(`bad magic 0x${buf[offset]!.toString(16)}: not a memcached binary request`)
    const bodyBytes = readU32(buf, offset + 8)
    if (buf[offset + 4]! + readU16(buf, offset + 2) > bodyBytes) {
      return new MemcachedProtocolError('the extras and key are longer than the body', buf[offset + 1]!, readU32(buf, offset + 12), ResponseStatus.UNKNOWN_COMMAND)
    }
    return HEADER_BYTES + bodyBytes
  }
}

// Why a request's lengths are wrong for its command, or null when they are
// right: memcached's checks (dispatch_bin_command), each of which it
// answers "Invalid arguments" before it closes the connection.
function shapeProblem (opcode: number, extras: number, key: number, body: number): string | null {
  if (key > MAX_KEY_BYTES) return `a key of ${key} bytes: at most ${MAX_KEY_BYTES}`
  switch (opcode) {
    case Opcode.NOOP:
    case Opcode.VERSION:
    case Opcode.QUIT:
    case Opcode.QUITQ:
      return body === 0 ? null : `${methodOf(opcode)} takes no extras, key or value`
    case Opcode.FLUSH:
    case Opcode.FLUSHQ:
      return key === 0 && body === extras && (extras === 0 || extras === 4) ? null : `${methodOf(opcode)} takes only an optional 4-byte delay`
    case Opcode.SET:
    case Opcode.SETQ:
    case Opcode.ADD:
    case Opcode.ADDQ:
    case Opcode.REPLACE:
    case Opcode.REPLACEQ:
      return extras === 8 && key > 0 ? null : `${methodOf(opcode)} takes 8 bytes of extras (flags, expiration) and a key`
    case Opcode.GET:
    case Opcode.GETQ:
    case Opcode.GETK:
    case Opcode.GETKQ:
    case Opcode.DELETE:
    case Opcode.DELETEQ:
      return extras === 0 && key > 0 && body === key ? null : `${methodOf(opcode)} takes a key only`
    case Opcode.INCREMENT:
    case Opcode.INCREMENTQ:
    case Opcode.DECREMENT:
    case Opcode.DECREMENTQ:
      return extras === 20 && key > 0 && body === key + 20 ? null : `${methodOf(opcode)} takes 20 bytes of extras (delta, initial, expiration) and a key`
    case Opcode.APPEND:
    case Opcode.APPENDQ:
    case Opcode.PREPEND:
    case Opcode.PREPENDQ:
      return extras === 0 && key > 0 ? null : `${methodOf(opcode)} takes a key and a value, no extras`
    case Opcode.STAT:
      return extras === 0 && body === key ? null : 'STAT takes an optional key only'
    case Opcode.TOUCH:
    case Opcode.GAT:
    case Opcode.GATQ:
    case Opcode.GATK:
    case Opcode.GATKQ:
      return extras === 4 && key > 0 && body === key + 4 ? null : `${methodOf(opcode)} takes 4 bytes of extras (expiration) and a key`
    case Opcode.VERBOSITY:
      return extras === 4 && key === 0 && body === 4 ? null : 'VERBOSITY takes 4 bytes of extras (the level) only'
    default:
      return null
  }
}

function readU64 (buf: Buffer, at: number): bigint {
  return (BigInt(readU32(buf, at)) << 32n) | BigInt(readU32(buf, at + 4))
}

/** The memcached binary protocol, for handlers that take `MemcachedRequest` and return `MemcachedResponse`. */
export function memcachedProtocol (options: MemcachedProtocolOptions = {}): ServerProtocol<MemcachedRequest, MemcachedResponse> {
  // Never below the slab limit: a slab value sent as a slice could be overwritten before it is written.
  const sliceValueBytes = Math.max(options.sliceValueBytes ?? DEFAULT_SLICE_VALUE_BYTES, SLAB_VALUE_BYTES)
  return {
    name: 'memcached',
    framing: memcachedFraming,
    ordering: 'in-order',
    // memcached reads a value too large to store and answers E2BIG ("Too
    // large."), whatever its size (up to 1 GiB). Here a frame is buffered
    // whole before it is decoded, so that answer costs its size in memory:
    // values up to twice the item limit still get it, larger frames close
    // the connection (FRAME_TOO_LARGE) rather than let a peer park
    // megabytes to be told no. memccapable sends no large values.
    maxFrameBytes: 2 * (options.maxItemBytes ?? DEFAULT_MAX_ITEM_BYTES),

    decodeHead: (buf: Buffer, start: number, end: number, head: CallHead): RpcError | null => {
      // The framing checked the magic and the lengths.
      const opcode = buf[start + 1]!
      const opaque = readU32(buf, start + 12)
      head.service = 'memcached'
      head.method = METHOD_OF[opcode]!
      head.routeKey = ROUTE_KEY_OF[opcode]!
      head.callId = opaque
      head.data = callData(opcode, opaque)
      head.bodyStart = start + HEADER_BYTES
      // Lengths wrong for the command: Invalid arguments, then the connection closes (protocolError).
      const problem = shapeProblem(opcode, buf[start + 4]!, readU16(buf, start + 2), end - start - HEADER_BYTES)
      return problem === null ? null : new MemcachedProtocolError(problem, opcode, opaque, ResponseStatus.EINVAL)
    },

    protocolError: (error: RpcError): AnswerSlices => error instanceof MemcachedProtocolError ? [protocolErrorAnswer(error)] : null,

    // decodeHead checked the lengths against the command (shapeProblem): they are right here.
    decodeRequest: (_route: RouteInfo, buf: Buffer, head: CallHead): MemcachedRequest | InvalidRequest => {
      const bodyStart = head.bodyStart
      const at = bodyStart - HEADER_BYTES
      const opcode = buf[at + 1]!
      const keyBytes = readU16(buf, at + 2)
      const extrasBytes = buf[at + 4]!
      const cas = readU32(buf, at + 16) * TWO_32 + readU32(buf, at + 20)
      const keyStart = bodyStart + extrasBytes
      const valueStart = keyStart + keyBytes
      const value = valueStart === head.bodyEnd ? EMPTY : buf.subarray(valueStart, head.bodyEnd)
      let flags = 0
      let exptime = 0
      let delta = 0n
      let initial = 0n
      switch (extrasBytes) {
        case 8: // SET, ADD, REPLACE
          flags = readU32(buf, bodyStart)
          exptime = readU32(buf, bodyStart + 4)
          break
        case 4: // TOUCH and GAT, FLUSH: an expiration; VERBOSITY: the level
          if (opcode === Opcode.VERBOSITY) flags = readU32(buf, bodyStart)
          else exptime = readU32(buf, bodyStart)
          break
        case 20: // INCREMENT, DECREMENT
          delta = readU64(buf, bodyStart)
          initial = readU64(buf, bodyStart + 8)
          exptime = readU32(buf, bodyStart + 16)
          break
      }
      return new MemcachedRequest(opcode, cas, buf, value, flags, exptime, delta, initial, keyStart, valueStart)
    },

    encode: (call: AnsweredCall, response: MemcachedResponse, out: FrameSink): void => {
      const data = call.data
      const opcode = opcodeOf(data)
      if (isSilent(opcode, response.status)) return
      // opaqueOf(data), from the opcode already found.
      const opaque = typeof data === 'number' ? data - opcode * TWO_32 : 0
      const stats = response.stats
      if (stats !== null) {
        // One packet per entry (key: the name, value: the value, CAS 0),
        // then one with no key and no value, which ends the answer.
        for (const [name, value] of stats) {
          let at = out.reserve(HEADER_BYTES + name.length + value.length)
          const buf = out.buffer
          writeHeader(buf, at, opcode, name.length, 0, response.status, name.length + value.length, opaque, 0)
          at += HEADER_BYTES
          at += buf.write(name, at, 'latin1')
          buf.write(value, at, 'latin1')
        }
        const end = out.reserve(HEADER_BYTES)
        writeHeader(out.buffer, end, opcode, 0, 0, response.status, 0, opaque, 0)
        return
      }
      const value = response.value
      const headBytes = HEADER_BYTES + (response.flags >= 0 ? 4 : 0) + response.key.length
      if (value.length > sliceValueBytes) {
        // A large value has a buffer of its own that never changes: sent as it is.
        const at = out.reserve(headBytes)
        encodeHead(out.buffer, at, opcode, opaque, response)
        out.append(value)
        return
      }
      // Copied: a smaller value lies in a store chunk that a later SET may overwrite.
      const at = out.reserve(headBytes + value.length)
      const buf = out.buffer
      const valueAt = encodeHead(buf, at, opcode, opaque, response)
      if (value.length > 0) buf.set(value, valueAt)
    },

    // A part of a streamed STAT answer: one packet with the entry's name as
    // its key and its value as its value, CAS 0, the request's opaque.
    encodePart: (call: AnsweredCall, part: unknown, out: FrameSink): void => {
      const [name, value] = part as StatEntry
      const keyBytes = Buffer.byteLength(name, 'latin1')
      const bodyBytes = keyBytes + Buffer.byteLength(value, 'latin1')
      const at = out.reserve(HEADER_BYTES + bodyBytes)
      const buf = out.buffer
      writeHeader(buf, at, opcodeOf(call.data), keyBytes, 0, ResponseStatus.SUCCESS, bodyBytes, opaqueOf(call.data), 0)
      buf.write(name, at + HEADER_BYTES, 'latin1')
      buf.write(value, at + HEADER_BYTES + keyBytes, 'latin1')
    },

    refusal: (call: CallInfo, reason: RefusalReason): AnswerSlices => {
      // Errors are never quiet: a quiet command's refusal is sent too.
      const response = errorResponse(refusalStatus(reason))
      const out = Buffer.allocUnsafe(HEADER_BYTES + response.value.length)
      const at = encodeHead(out, 0, opcodeOf(call.data), opaqueOf(call.data), response)
      out.set(response.value, at)
      return [out]
    }
  }
}

// Writes the header, extras and key of an answer; returns where its value goes.
function encodeHead (out: Buffer, at: number, opcode: number, opaque: number, response: MemcachedResponse): number {
  const extrasBytes = response.flags >= 0 ? 4 : 0
  const keyBytes = response.key.length
  writeHeader(out, at, opcode, keyBytes, extrasBytes, response.status, extrasBytes + keyBytes + response.value.length, opaque, response.cas)
  at += HEADER_BYTES
  if (extrasBytes !== 0) {
    writeU32(out, at, response.flags)
    at += 4
  }
  if (keyBytes !== 0) {
    out.set(response.key, at)
    at += keyBytes
  }
  return at
}

