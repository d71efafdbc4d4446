import type { RpcError } from './errors.js'
import type { Framing, ScanFraming } from './frame-decoder.js'
import type { FrameSink } from './frame-sink.js'
import type { Handshake } from './protocol.js'

/**
 * The client side of the protocol API: what a protocol tells nyala's
 * generic client (`ProtocolClient`, reactor/protocol-client.ts) so that it
 * gets endpoints and balancing, deadlines, retries with backoff and a
 * budget, coalesced writes, cancellation and bounded queues. The twin of
 * `ServerProtocol` (codec/protocol.ts): the same framing types, read here
 * for answers instead of requests.
 *
 * `Req` is what callers pass to `ProtocolClient.call`, `Res` what a
 * successful call resolves with.
 */

/**
 * How answers are matched to requests:
 * - `id`: the client gives each request an id (a per-connection counter,
 *   from 0 up to `maxId` and round again), the protocol writes it into the
 *   request (memcached's opaque) and reads it back from the answer's head
 *   (`answerId`); answers may come in any order.
 * - `in-order`: the n-th answer on a connection is the n-th request's
 *   (RESP, line protocols); the id passed to the encoders is still the
 *   counter, which such protocols ignore.
 */
export type ClientMatching = 'id' | 'in-order'

/**
 * Whether a request gets an answer:
 * - `yes`: exactly one answer.
 * - `maybe` (`id` matching only): an answer only in some outcomes
 *   (memcached's quiet commands answer their errors, and GETQ its hits).
 *   The call settles with its own answer when one comes; otherwise, with
 *   `silentResult`, once an answer to a request written after it on the
 *   same connection arrives (the server handles a connection's requests
 *   in order, so that answer proves this request was processed). The
 *   client sends `flushRequest` itself when nothing else follows a quiet
 *   request in the same turn.
 * - `no`: never an answer: the call settles with `silentResult` at once,
 *   as soon as its frame is handed to the connection (not when the peer
 *   has processed it).
 * - `stream`: several answer frames (memcached's STAT: one packet per
 *   statistic, then an empty one). Each frame matched to the call (by id,
 *   or at the head of the in-order queue) goes through `decodePart`; the
 *   call resolves with the array of the parts' values once a part says it
 *   is the last. The call's deadline covers the whole stream, and a call
 *   is not retried once any part of it has arrived.
 */
export type AnswerKind = 'yes' | 'maybe' | 'no' | 'stream'

/**
 * One frame of a streamed answer, as `decodePart` reads it: its value
 * (kept in the call's result unless it is `undefined`), and whether it
 * ends the stream.
 */
export interface AnswerPart {
  /** The part's value, appended to the call's result; `undefined` keeps nothing (a terminator). */
  readonly value: unknown
  /** True for the stream's final part: the call then resolves with the values kept. */
  readonly last: boolean
}

/**
 * A client connection's set-up (`ClientProtocol.handshake`): a `Handshake`,
 * plus a better error for a connection that failed before it finished.
 */
export interface ClientHandshake<T> extends Handshake<T> {
  /**
   * The connection failed with `error` before the handshake was done:
   * the error its calls get instead (a peer that is not speaking the
   * protocol, named from `firstBytes`, the first bytes it sent, or null).
   * Not asked when the set-up deadline closed the connection.
   */
  failure?: (error: RpcError, firstBytes: Buffer | null) => RpcError
}

/**
 * Hooks that take the call's protocol data get `data`: what the caller
 * passed with the request (KRPC: the method, sidecars), undefined for
 * protocols whose request says it all. Hooks that build error messages
 * get the connection's endpoint, `host:port`.
 */
export interface ClientProtocol<Req = unknown, Res = unknown> {
  /** A short name for errors (`memcached`, `redis`). */
  readonly name: string
  /** Where answer frames end: a length field or a scan. */
  readonly framing: Framing | ScanFraming
  /** How answers are matched to requests: by an id they carry, or by their order. */
  readonly matching: ClientMatching
  /** The largest answer frame accepted; the client's `maxMessageBytes` overrides it. Default 50 MiB. */
  readonly maxFrameBytes?: number
  /** Ids run from 0 to this and wrap (`id` matching); default 0xffffffff. */
  readonly maxId?: number
  /**
   * The connection's set-up, run before any request is sent (requests wait
   * for it); what it is done with is the connection's session, as
   * `beforeSend` sees it. `host` is the address connected to.
   */
  handshake?: (endpoint: string, host: string) => ClientHandshake<unknown>
  /** What errors call the set-up (`connection negotiation`); default `<name> set-up`. */
  readonly setupName?: string
  /** The call in errors, without its endpoint (`svc.Method RPC`); default `<name> call`. */
  describe?: (request: Req, data: unknown) => string
  /** The call in log records' fields (KRPC: service and method); default `{ protocol: name }`. */
  logFields?: (request: Req, data: unknown) => Record<string, unknown>
  /**
   * Checked just before a request goes out, with the session the handshake
   * was done with (for a request queued while the set-up runs: once it is
   * done): an error fails the call unsent.
   */
  beforeSend?: (request: Req, data: unknown, session: unknown) => RpcError | undefined
  /**
   * Checks `request` before a connection is chosen for it (none is opened
   * for a request that cannot be sent): an error, which may be thrown,
   * fails the call at once with RPC_ERR_INVALID_ARGUMENT (or its own code).
   * What it found may be kept for the `encode` that follows.
   */
  check?: (request: Req, data: unknown) => void
  /**
   * Encodes `request`'s frame into `out` (see `FrameSink`): room reserved
   * there is, once the connection is set up, straight in its coalesced
   * outbound buffer; large values are appended without a copy (the
   * caller's buffers must not change until the call settles). `id` is the
   * client's number for the request (write it in for `'id'` matching),
   * `timeoutMs` the attempt's budget (0 for none). May throw (an RpcError
   * or another error): the call then fails with RPC_ERR_INVALID_ARGUMENT
   * (or the error's own code), unsent.
   */
  encode: (request: Req, id: number, out: FrameSink, data?: unknown, timeoutMs?: number) => void
  /**
   * `id` matching: the id the answer `buf[start, end)` carries, or an error
   * when its head is malformed (the connection then fails: the stream can
   * no longer be trusted). Must not throw. `decodeAnswer` follows at once
   * for the same frame when a call waits for it, so that what this parsed
   * may be kept for it.
   */
  answerId?: (buf: Buffer, start: number, end: number, endpoint?: string) => number | RpcError
  /** Whether `request` gets an answer (see `AnswerKind`); default `yes` for every request. */
  answerOf?: (request: Req) => AnswerKind
  /** What a call that got no answer (`maybe`, `no`) resolves with. */
  silentResult?: (request: Req) => Res
  /** A request with an answer, sent by the client after quiet requests (memcached's NOOP); its result is dropped. */
  flushRequest?: () => Req
  /**
   * A cheap request whose answer proves the peer alive (memcached's NOOP):
   * the client sends it on a connection that has been silent while calls
   * wait (reactor/connection-liveness.ts), and closes the connection if
   * nothing at all comes back in time. Its result is dropped. Without it,
   * a silent peer is noticed by the calls' (attempt) deadlines only.
   */
  ping?: () => Req
  /**
   * The answer `buf[start, end)` to `request`: the response, or an error.
   * A remote error is an `RpcError` with code RPC_ERR_REMOTE and `remote`
   * in the protocol's words; the connection stays up. An error with a
   * connection-fatal code (RPC_ERR_MALFORMED_FRAME: the answer is garbage)
   * fails the connection and every call on it; a remote error that is
   * `fatal` (KRPC's FATAL_*) retires the connection: new calls open
   * another, and it closes once its last call settles. Views of `buf` stay
   * valid as long as they are referenced. Must not throw.
   */
  decodeAnswer: (request: Req, buf: Buffer, start: number, end: number, data?: unknown, endpoint?: string) => Res | RpcError
  /**
   * `stream` answers: one frame of the answer to `request` (see
   * `AnswerKind`). An `RpcError` ends the stream: a remote error fails the
   * call and the connection stays up; an error with a connection-fatal
   * code fails the connection, as `decodeAnswer`'s does. Called for every
   * frame of the stream, also after the call settled (deadline, abort), so
   * that an `in-order` connection finds where the stream ends. Must not
   * throw.
   */
  decodePart?: (request: Req, buf: Buffer, start: number, end: number) => AnswerPart | RpcError
  /**
   * Whether the frame `buf[start, end)` is a push: a message the peer sent
   * unasked (a RESP3 push, a subscription's message), not an answer. A
   * push is matched to no call, whatever the matching. Without it, every
   * frame is an answer (and an unasked frame on an `in-order` connection
   * fails it). Called first for every frame, so it should look at a byte
   * or two only. Must not throw.
   */
  isPush?: (buf: Buffer, start: number, end: number) => boolean
  /**
   * The push `buf[start, end)` as a value for `ProtocolClient.onPush` and
   * `pushes()`; without it, a push is a copy of its frame's bytes. An
   * `RpcError` with a connection-fatal code fails the connection, as
   * `decodeAnswer`'s does; another `RpcError` drops the push. Views of
   * `buf` stay valid as long as they are referenced. Must not throw.
   */
  decodePush?: (buf: Buffer, start: number, end: number) => unknown | RpcError
  /**
   * Whether a call that failed with `error` may be tried again (on another
   * connection, after a backoff): remote errors that say the request did
   * not run (busy, try again), or requests safe to repeat after a lost
   * connection. Calls that were never sent are retried without asking.
   */
  retryable?: (error: RpcError, request: Req, data?: unknown) => boolean
}
