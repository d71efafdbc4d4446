import { ErrorCode, RpcError } from './errors.js'
import type { Framing, ScanFraming } from './frame-decoder.js'
import { encodeToSlices, type FrameSink } from './frame-sink.js'
import { isPayloadFraming, type FramePayload, type PayloadFraming } from './framings.js'
import type { ClientMatching, ClientProtocol } from './client-protocol.js'
import type { AnswerSlices, CallHead, CallInfo, RefusalReason, ServerProtocol } from './protocol.js'

/**
 * The short way to a request/response protocol: three functions (`decode`,
 * `encode`, `refusal`) and a framing, turned into a whole `ServerProtocol`
 * (and, with `simpleClientProtocol`, a `ClientProtocol`) on the same
 * fast path a hand-written protocol uses (its answers encoded into the
 * connection's outbound buffer). With a stock framing
 * (`lengthField`, `lines`: codec/framings.ts), `decode` sees the payload
 * without the framing's bytes, and the framing adds them to what `encode`
 * and `refusal` return, so no encoder writes a length prefix.
 *
 * Each answer's payload is copied into the sink's room (on the hot path,
 * the connection's outbound slab) behind the framing's head, which the
 * framing writes around it. Payloads of `SLICE_FROM_BYTES` and more go out
 * as slices (writev, no copy).
 */

/** What `decode` returns for a request frame: the route, the call id (`ordering: 'id'`), and the handler's request. */
export interface SimpleFrame<Req = unknown> {
  /** The method: the handler registered under this name in the protocol's group (`service`) answers it. */
  readonly route: string
  /** The call id (`ordering: 'id'`: required, a 32-bit integer, unique among the connection's calls in flight). */
  readonly id?: number
  /** The time budget from the wire in ms; absent or 0: the server's `requestTimeoutMs` applies. */
  readonly timeoutMs?: number
  /** What the handler gets. */
  readonly request: Req
}

/**
 * The call `encode` and `refusal` answer: the very object `decode` returned
 * for its frame (so it may carry more fields of the protocol's own, an
 * opcode, a tag), kept with the call until it is answered.
 */
export type SimpleCall<Req = unknown> = SimpleFrame<Req>

/** Options of `simpleProtocol`. */
export interface SimpleProtocolOptions<Req, Res> {
  /** A short name for logs and metrics. */
  name: string
  /** Where frames end. A `PayloadFraming` (`lengthField`, `lines`) also strips and adds its own bytes; any other framing hands `decode` the whole frame and sends what `encode` returns as it is. */
  framing: Framing | ScanFraming
  /**
   * Reads one request frame's payload (a view into the read buffer: keep
   * it, or a part of it, only as long as you need). Returns a fresh
   * `SimpleFrame` per frame; `null` for a frame that is not a request (a
   * blank line: no call, no answer); an `RpcError` (usually
   * RPC_ERR_MALFORMED_FRAME) when the stream can no longer be trusted. An
   * error, returned or thrown, closes the connection after the answers
   * already queued, as a bad frame.
   */
  decode: (payload: Buffer) => SimpleFrame<Req> | RpcError | null
  /**
   * The answer's payload for the handler's `answer`; `null` for no answer
   * at all (a quiet command). May throw: the call is then answered with
   * the refusal `failed`.
   */
  encode: (call: SimpleCall<Req>, answer: Res) => FramePayload | null
  /**
   * The payload of an answer the server makes itself (`busy`, `expired`,
   * `shutdown`, `unavailable`, `no-service`, `no-method`, `invalid`,
   * `failed`, `abandoned`: see `RefusalReason`), or `null` to close the
   * connection instead. A throw closes it too. `detail` is the handler's
   * error for `failed`.
   */
  refusal: (call: SimpleCall<Req>, reason: RefusalReason, message: string, detail?: unknown) => FramePayload | null
  /** `'in-order'` (default): answers leave in request order. `'id'`: by `SimpleFrame.id`, as handlers finish. */
  ordering?: 'id' | 'in-order'
  /** The largest request frame; default the framing's `max`, else the server's default (50 MiB). The server's `maxMessageBytes` overrides it. */
  maxFrameBytes?: number
  /** The route group every route belongs to (`server.addRoutes(service, ...)`). Default `'simple'`. */
  service?: string
}

/** Payloads of this many bytes and more are sent as slices (writev, no copy) instead of being copied into the outbound slab. */
export const SLICE_FROM_BYTES = 32 * 1024

/** The default route group of `simpleProtocol`. */
export const SIMPLE_SERVICE = 'simple'

/**
 * A whole `ServerProtocol` from three functions and a framing; see
 * `SimpleProtocolOptions`. Throws RPC_ERR_INVALID_ARGUMENT for options it
 * cannot work with.
 */
export function simpleProtocol<Req = unknown, Res = unknown> (options: SimpleProtocolOptions<Req, Res>): ServerProtocol<Req, Res> {
  const { name, framing, decode, encode, refusal } = options
  if (typeof name !== 'string' || name === '') throw invalidOption('simpleProtocol: name must be a non-empty string')
  if (typeof decode !== 'function' || typeof encode !== 'function' || typeof refusal !== 'function') throw invalidOption(`simpleProtocol ${name}: decode, encode and refusal must be functions`)
  if (typeof framing !== 'object' || framing === null) throw invalidOption(`simpleProtocol ${name}: framing must be a Framing or a ScanFraming`)
  const ordering = options.ordering ?? 'in-order'
  if (ordering !== 'id' && ordering !== 'in-order') throw invalidOption(`simpleProtocol ${name}: ordering must be 'id' or 'in-order', not ${String(ordering)}`)
  const service = options.service ?? SIMPLE_SERVICE
  if (typeof service !== 'string' || service === '') throw invalidOption(`simpleProtocol ${name}: service must be a non-empty string`)
  const byId = ordering === 'id'
  const framer = isPayloadFraming(framing) ? framing : null
  const maxFrameBytes = options.maxFrameBytes ?? framer?.max

  const protocol: ServerProtocol<Req, Res> = {
    name,
    framing,
    ordering,
    decodeHead (buf: Buffer, start: number, end: number, head: CallHead): RpcError | null {
      const payload = framer === null ? buf.subarray(start, end) : framer.payloadOf(buf, start, end)
      let frame: SimpleFrame<Req> | RpcError | null
      try {
        frame = decode(payload)
      } catch (err) {
        return new RpcError(ErrorCode.MALFORMED_FRAME, `${name}: decode threw: ${describe(err)}`, { cause: err })
      }
      if (frame === null) {
        head.skip = true
        return null
      }
      if (frame instanceof RpcError) return frame
      if (typeof frame !== 'object' || typeof frame.route !== 'string') return new RpcError(ErrorCode.MALFORMED_FRAME, `${name}: decode returned no route`)
      head.service = service
      head.method = frame.route
      const id = frame.id
      if (id !== undefined) head.callId = id
      else if (byId) return new RpcError(ErrorCode.MALFORMED_FRAME, `${name}: a request frame without an id (ordering 'id')`)
      const timeoutMs = frame.timeoutMs
      if (timeoutMs !== undefined && timeoutMs > 0) head.timeoutMs = timeoutMs
      head.data = frame
      return null
    },
    decodeRequest: (_route, _buf, head) => (head.data as SimpleFrame<Req>).request,
    encode (call, answer, out) {
      const payload = encode(callOf<Req>(call), answer)
      if (payload !== null) putFrame(framer, payload, out)
    },
    refusal (call: CallInfo, reason: RefusalReason, message: string, detail?: unknown): AnswerSlices {
      try {
        const payload = refusal(callOf<Req>(call), reason, message, detail)
        if (payload === null) return null
        return encodeToSlices(putFrame, null, framer, payload)
      } catch {
        return null // a refusal that cannot be said closes the connection
      }
    }
  }
  return maxFrameBytes === undefined ? protocol : { ...protocol, maxFrameBytes }
}

/** Options of `simpleClientProtocol`. */
export interface SimpleClientProtocolOptions<Req, Res> {
  /** A short name for errors. */
  name: string
  /** Where answer frames end; a `PayloadFraming` also strips and adds its own bytes, as with `simpleProtocol`. */
  framing: Framing | ScanFraming
  /** `'id'`: answers carry the request's id (`answerId` reads it). `'in-order'`: the n-th answer is the n-th request's. */
  matching: ClientMatching
  /** The request's payload; `id` is the client's number for it (write it into the request for `'id'` matching). May throw: the call fails RPC_ERR_INVALID_ARGUMENT, unsent. */
  encode: (request: Req, id: number) => FramePayload
  /**
   * The answer's payload to `request`: the response, or an `RpcError`
   * (RPC_ERR_REMOTE with `remote` in the protocol's words keeps the
   * connection; RPC_ERR_MALFORMED_FRAME fails it). A throw fails the
   * connection as a malformed frame.
   */
  decode: (request: Req, payload: Buffer) => Res | RpcError
  /** `'id'` matching (required there): the id an answer's payload carries, or an error for a malformed head. A throw is a malformed frame. */
  answerId?: (payload: Buffer) => number | RpcError
  /** Which failed calls may be tried again (see `ClientProtocol.retryable`). */
  retryable?: (error: RpcError, request: Req) => boolean
  /** The largest answer frame; default the framing's `max`, else the client's default. */
  maxFrameBytes?: number
  /** Ids run from 0 to this and wrap (`'id'` matching); default 0xffffffff. Set it to what the protocol's id field holds (0xffff for 2 bytes). */
  maxId?: number
}

/**
 * A whole `ClientProtocol` from two functions (three with `answerId`) and
 * a framing; see `SimpleClientProtocolOptions`. Throws
 * RPC_ERR_INVALID_ARGUMENT for options it cannot work with.
 */
export function simpleClientProtocol<Req = unknown, Res = unknown> (options: SimpleClientProtocolOptions<Req, Res>): ClientProtocol<Req, Res> {
  const { name, framing, matching, encode, decode, answerId } = options
  if (typeof name !== 'string' || name === '') throw invalidOption('simpleClientProtocol: name must be a non-empty string')
  if (typeof encode !== 'function' || typeof decode !== 'function') throw invalidOption(`simpleClientProtocol ${name}: encode and decode must be functions`)
  if (typeof framing !== 'object' || framing === null) throw invalidOption(`simpleClientProtocol ${name}: framing must be a Framing or a ScanFraming`)
  if (matching !== 'id' && matching !== 'in-order') throw invalidOption(`simpleClientProtocol ${name}: matching must be 'id' or 'in-order', not ${String(matching)}`)
  if (matching === 'id' && typeof answerId !== 'function') throw invalidOption(`simpleClientProtocol ${name}: 'id' matching needs answerId`)
  const framer = isPayloadFraming(framing) ? framing : null
  const payloadOf = framer === null ? (buf: Buffer, start: number, end: number) => buf.subarray(start, end) : framer.payloadOf
  const maxFrameBytes = options.maxFrameBytes ?? framer?.max

  const protocol: ClientProtocol<Req, Res> = {
    name,
    framing,
    matching,
    encode (request, id, out) {
      putFrame(framer, encode(request, id), out)
    },
    decodeAnswer (request, buf, start, end) {
      try {
        return decode(request, payloadOf(buf, start, end))
      } catch (err) {
        return new RpcError(ErrorCode.MALFORMED_FRAME, `${name}: decode threw: ${describe(err)}`, { cause: err })
      }
    }
  }
  if (answerId !== undefined) {
    protocol.answerId = (buf, start, end) => {
      try {
        return answerId(payloadOf(buf, start, end))
      } catch (err) {
        return new RpcError(ErrorCode.MALFORMED_FRAME, `${name}: answerId threw: ${describe(err)}`, { cause: err })
      }
    }
  }
  if (options.retryable !== undefined) protocol.retryable = options.retryable
  if (maxFrameBytes === undefined && options.maxId === undefined) return protocol
  return { ...protocol, ...(maxFrameBytes === undefined ? {} : { maxFrameBytes }), ...(options.maxId === undefined ? {} : { maxId: options.maxId }) }
}

// The frame of `payload` into the sink: small ones copied into its room
// behind the framing's head (which is written around them), large ones as
// the framing's slices, the payload's own buffers appended without a copy.
function putFrame (framer: PayloadFraming | null, payload: FramePayload, out: FrameSink): void {
  if (framer === null) {
    if (payload instanceof Uint8Array) out.append(payload)
    else for (let i = 0; i < payload.length; i++) out.append(payload[i]!)
    return
  }
  const bytes = lengthOf(payload)
  if (bytes >= SLICE_FROM_BYTES) {
    const slices = framer.frame(payload)
    for (let i = 0; i < slices.length; i++) out.append(slices[i]!)
    return
  }
  const headBytes = framer.headBytes(bytes)
  const at = out.reserve(headBytes + bytes + framer.tailBytes)
  const buffer = out.buffer
  copyInto(payload, buffer, at + headBytes)
  framer.frameInto(buffer, at, bytes)
}

// The call as the protocol's functions see it: the object decode returned.
function callOf<Req> (call: CallInfo): SimpleCall<Req> {
  const data = call.data
  if (typeof data === 'object' && data !== null && typeof (data as SimpleFrame<Req>).route === 'string') return data as SimpleFrame<Req>
  // Not from decode (a head refused before decode filled it): what the head says.
  return { route: call.method, id: call.callId, request: undefined as Req }
}

function lengthOf (payload: FramePayload): number {
  if (payload instanceof Uint8Array) return payload.length
  let bytes = 0
  for (let i = 0; i < payload.length; i++) bytes += payload[i]!.length
  return bytes
}

function copyInto (payload: FramePayload, out: Buffer, at: number): void {
  if (payload instanceof Uint8Array) {
    out.set(payload, at)
    return
  }
  for (let i = 0; i < payload.length; i++) {
    const part = payload[i]!
    out.set(part, at)
    at += part.length
  }
}

function invalidOption (message: string): RpcError {
  return new RpcError(ErrorCode.INVALID_ARGUMENT, message)
}

function describe (err: unknown): string {
  try {
    return err instanceof Error ? String(err.message) : String(err)
  } catch {
    return 'a value with no string form'
  }
}

