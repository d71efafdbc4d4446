import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import type { RpcError } from './errors.js'
import type { Framing, ScanFraming } from './frame-decoder.js'
import type { FrameSink } from './frame-sink.js'

/**
 * The protocol API: what a binary protocol tells nyala's generic server so
 * that it gets reactors, the transfer queue, the deadline-ordered service
 * queues with eviction, LIFO hand-off, burst absorption, expiry, limits,
 * per-route metrics and graceful close. KRPC is one implementation
 * (`reactor/krpc/protocol.ts`), the memcached example another. See
 * docs/custom-protocols.md.
 *
 * The server calls the protocol on its hot path with plain arguments and a
 * reused `CallHead`, so a protocol need not allocate per frame.
 */

/** A connection's set-up (KRPC negotiation): the raw preamble, then whole frames until `done` or `error`. */
export interface Handshake<T> {
  /** Bytes the client sends before any frame, to be checked by `checkPreamble` (server side); 0 for none. */
  readonly preambleBytes?: number
  /** Judges the `preambleBytes` bytes (server side): null to go on, an error to close the connection without a reply. */
  checkPreamble?: (bytes: Buffer) => RpcError | null
  /** What to send first (client side). */
  start?: () => Buffer[][]
  /**
   * Takes each whole frame the peer sends during the set-up (a copy it may
   * keep) and says what comes next; bytes after the frame wait while a
   * returned promise is pending. A throw or a rejection fails the set-up.
   * `pipelined`: bytes the peer sent behind this frame that have already
   * arrived (it did not wait for an answer): PostgreSQL refuses data sent
   * behind an SSLRequest (CVE-2021-23214).
   */
  onFrame: (frame: Buffer, pipelined: number) => HandshakeStep<T> | Promise<HandshakeStep<T>>
  /**
   * Where the set-up's frames end, when not where the protocol's do
   * (PostgreSQL's untyped start-up packets before its typed messages);
   * a step may switch it (`HandshakeStep.framing`). Once the set-up is
   * done, the protocol's `framing` reads the rest.
   */
  framing?: Framing | ScanFraming | undefined
  /**
   * Largest frame accepted while the handshake runs (checked as early as
   * the framing allows, like `maxFrameBytes`, which applies again once it
   * is done). Set-up frames are small; a peer must not park megabytes in them.
   */
  maxFrameBytes?: number | undefined
  /** The connection closed before the handshake finished: release what it holds (a TLS engine). */
  abort?: () => void
}

/**
 * One step of a handshake: frames to send, then done, failed, or neither
 * (wait for more). With `upgrade`, the connection switches to a secure
 * channel after writing `send`: every later byte, in both directions (the
 * bytes already read past this frame included), goes through it, and
 * `sendUpgraded` is the first thing written through it.
 */
export interface HandshakeStep<T> {
  /** Frames to write now, before any `upgrade` (on the raw socket when there is none yet). */
  send?: Buffer[][] | undefined
  /** Switches the connection to a secure channel over its socket `raw`, once `send` is written; a throw fails the set-up. */
  upgrade?: ((raw: Socket) => SecureChannel) | undefined
  /** Frames written through the new channel right after the switch (a refusal sent over TLS too). */
  sendUpgraded?: Buffer[][] | undefined
  /** The set-up succeeded with this result: later frames are calls, under the regular `maxFrameBytes`. */
  done?: T | undefined
  /** The set-up failed: what is queued is sent, then the connection closes with this error. */
  error?: RpcError | undefined
  /**
   * The set-up is over without a failure and without a session: `send`
   * goes out, then the connection ends (PostgreSQL's CancelRequest, a
   * health probe). Nothing is logged as a failed negotiation.
   */
  close?: boolean | undefined
  /** Frames after this one are read with this framing (until `done`, when the protocol's own takes over). */
  framing?: Framing | ScanFraming | undefined
}

/** A connection's stream after a handshake's `upgrade` (TLS over its socket). */
export interface SecureChannel {
  /** Frames are read from and written to this stream from now on. */
  readonly stream: Duplex
  /** Takes each chunk read from the socket (encrypted bytes). */
  input: (chunk: Buffer) => void
}

/** What one step of a tunnelled TLS handshake produced. */
export interface TlsEngineStep {
  /** The bytes TLS wrote in answer: the token to send (may be empty). */
  token: Buffer
  /** The handshake is complete on this side. */
  done: boolean
}

/**
 * A TLS handshake driven by tokens that another protocol carries (KRPC's
 * TLS_HANDSHAKE steps), then TLS on the connection's socket.
 * codec/krpc/tls-tunnel.ts implements it with node:tls.
 */
export interface TlsEngine {
  /** Feeds the peer's token (empty to begin, on the client). Rejects when TLS fails. */
  continue: (token: Uint8Array) => Promise<TlsEngineStep>
  /** The TLS version agreed, once done ('TLSv1.3', 'TLSv1.2'). */
  readonly protocol: string | null
  /** The verified peer certificate's subject CN; empty when none. */
  readonly peerName: string
  /** Switches the connection to TLS: `pending` goes out first, then every TLS write. */
  join: (raw: Socket, pending: Buffer | null) => SecureChannel
  /** Drops the engine (a failure, a timeout, or TLS that only authenticated). */
  close: () => void
}

/**
 * What `decodeHead` tells the server about one request frame. The server
 * owns one per protocol and hands it to every `decodeHead` call, so the
 * protocol fills fields rather than making an object per frame.
 */
export class CallHead<Data = unknown> {
  /** The route's group: its queue, its workers and its metrics label (KRPC: the service; memcached: one group). */
  service = ''
  /** The route within the group (KRPC: the method; memcached: the command). */
  method = ''
  /** Id that matches the answer to the request (KRPC call_id, memcached opaque); in-order protocols may leave it 0. */
  callId = 0
  /** Time budget from the wire in ms (KRPC timeout_millis); 0: none, the server's `requestTimeoutMs` applies. */
  timeoutMs = 0
  /**
   * The protocol's own per-call data, filled here and kept on the call
   * (`InboundCall.data`) for its encoders and handlers (memcached: opcode
   * and opaque; KRPC: the sidecars). Typed by the protocol's `Data`, so
   * its encoders read it without casts.
   */
  data: Data = undefined as Data
  /**
   * An object that stands for the route and is the same object every time
   * the same route is named (KRPC: the codec's cached remote-method
   * objects): the server then finds the route by identity, without string
   * lookups. Leave undefined otherwise.
   */
  routeKey: object | undefined = undefined
  /** The whole frame: `buf[start, end)`. */
  start = 0
  /** End of the frame in `buf` (exclusive); see `start`. */
  end = 0
  /** Where the request's body lies in the frame, for `decodeRequest` (defaults: the whole frame). */
  bodyStart = 0
  /** End of the body (exclusive); defaults to `end`. */
  bodyEnd = 0
  /**
   * The frame is not a request (RESP's empty command, a blank line): no
   * call, no answer, and in in-order protocols no place in the order.
   */
  skip = false

  /** Resets the fields for the frame `buf[start, end)`; the server calls it before `decodeHead`. */
  reset (start: number, end: number): void {
    this.service = ''
    this.method = ''
    this.callId = 0
    this.timeoutMs = 0
    this.data = undefined as Data
    this.routeKey = undefined
    this.start = start
    this.end = end
    this.bodyStart = start
    this.bodyEnd = end
    this.skip = false
  }
}

/** What a protocol's encoders see of a call: a `CallHead`'s fields as decoded (the server's call object, or the head itself before there is one). */
export interface CallInfo<Data = unknown> {
  /** The route's group, as `decodeHead` set it (`CallHead.service`). */
  readonly service: string
  /** The route within the group, as `decodeHead` set it (`CallHead.method`). */
  readonly method: string
  /** The id the head carried (in-order protocols: as decoded, usually 0). */
  readonly callId: number
  /** What `decodeHead` put in `CallHead.data`. */
  readonly data: Data
}

/** A call being answered: its head, and the route it was registered under. */
export interface AnsweredCall<Data = unknown> extends CallInfo<Data> {
  /** The registered route the call ran on. */
  readonly route: RouteInfo
}

/**
 * Why the server answers a request without (or instead of) its handler's
 * result; each protocol says it in its own words (`ServerProtocol.refusal`):
 *
 * - `busy`: its group's queue was full, or a later arrival with an earlier deadline evicted it;
 * - `expired`: its deadline passed while it waited in the queue;
 * - `timed-out`: its handler gave up when its deadline passed (it threw or rejected with `ctx.signal`'s reason);
 * - `shutdown`: the server is closing, or the connection reached its maximum age;
 * - `unavailable`: the server is not ready yet (`markReady` not called);
 * - `no-service`: no group of that name; `no-method`: no such route in the group;
 * - `invalid`: `decodeRequest` refused the body (the message says why);
 * - `failed`: the handler threw or rejected (`error` is what it threw), or returned a response the encoder refused;
 * - `abandoned`: the handler ran too long past its deadline and its worker was given back.
 */
export type RefusalReason = 'busy' | 'expired' | 'timed-out' | 'shutdown' | 'unavailable' | 'no-service' | 'no-method' | 'invalid' | 'failed' | 'abandoned'

/** A request body `decodeRequest` could not accept: answered as the refusal `invalid` (the connection stays up). */
export class InvalidRequest {
  /** Why the body was refused: the text of the `invalid` refusal. */
  readonly message: string
  /** Anything the protocol wants to carry to its `refusal` encoder (KRPC: unsupported feature flags). */
  readonly detail: unknown
  constructor (message: string, detail?: unknown) {
    this.message = message
    this.detail = detail
  }
}

/**
 * What a registered route is to the protocol: its names and what the
 * application registered with it (`spec`: KRPC's method definition; often
 * nothing).
 */
export interface RouteInfo {
  /** The group the route was registered in. */
  readonly service: string
  /** The route's name within its group. */
  readonly method: string
  /** What the application registered with the route (`RouteDefinition.spec`); undefined when nothing. */
  readonly spec: unknown
}

/** The answer to a request: bytes to send, or none. */
export type AnswerSlices = Uint8Array[] | null

/**
 * One open connection of a server, as a handler, a protocol's
 * `connectionState` or `handshake`, and the application see it: for
 * sending what no request asked for (pushes), closing, and flow control.
 * It may be kept after the call that handed it over; once the connection
 * has closed, `send` returns false and nothing else happens.
 *
 * Ordering: a push is queued at once, between whole frames. It leaves
 * after every answer already sent or queued on the connection and before
 * any answer not produced yet, so a push a handler sends goes before that
 * handler's own answer, and a push never splits an answer. With
 * `'in-order'` protocols, answers that wait for an earlier one (their
 * handlers finished first) follow the push.
 */
export interface ConnectionHandle<State = unknown> {
  /** `ip:port` of the peer. */
  readonly remoteAddress: string
  /** Who the connection's set-up said the peer is; '' without one. */
  readonly user: string
  /** The protocol's own state of the connection (`ServerProtocol.connectionState`; undefined while it is being made). */
  readonly state: State
  /** Resolves once the connection has closed (never rejects). */
  readonly closed: Promise<void>
  /** True once the connection has closed. */
  readonly isClosed: boolean
  /**
   * True while the connection is a session: marked with `markSession`, or a
   * member of any `ConnectionGroup` (a channel's subscribers, a room). At
   * `maxConnections` a session is never closed to make room for a newcomer,
   * however long it has been quiet: connections still negotiating, silent
   * ones, trickling ones and other idle ones go first, and when only
   * sessions (and busy connections) are left the newcomer is refused.
   */
  readonly isSession: boolean
  /**
   * Marks the connection as a session (`false`: unmarks it), for a protocol
   * that keeps quiet connections of its own outside any `ConnectionGroup`
   * (a subscriber it pushes to, a logged-in user): see `isSession`. Group
   * membership marks a connection by itself; unmarking does not take it
   * out of its groups.
   */
  markSession: (session?: boolean) => void
  /**
   * Gives this connection an idle timeout of its own, in place of the
   * server's `idleTimeoutMs`, from now on: closed (after the protocol's
   * `lastWords('idle')`) once `ms` pass without activity. 0: never closed
   * for idleness (a session that may sit quiet: psql, an MQTT client with
   * keep-alive 0). `inboundOnly`: only bytes from the peer count, not
   * pushes or answers going out (MQTT's keep-alive: 1.5 × the client's
   * value). A call in flight always counts as activity. Checked at an
   * eighth of `ms` (at least 10 ms): the close comes up to ms/8 late.
   * Callable from `connectionState`, `handshake` or a handler.
   */
  setIdleTimeout: (ms: number, options?: { inboundOnly?: boolean }) => void
  /**
   * Encodes `message` with the protocol's `encodePush` and queues it (at
   * once when the socket is free, coalesced with the turn's other frames).
   * False when the connection is closed, or closed by this send for going
   * over its limits (the message is dropped). Throws RPC_ERR_INVALID_ARGUMENT
   * when the protocol has no `encodePush`.
   */
  send: (message: unknown) => boolean
  /**
   * Sends the queued bytes, then ends the connection; nothing more is
   * read. `reason` is logged and reported to close listeners. With
   * `{ reset: true }` the connection is dropped at once with a TCP reset
   * (the peer sees ECONNRESET; nothing queued is sent).
   */
  close: (reason?: string | { reason?: string, reset?: boolean }) => void
  /** False once `bufferedBytes` passed the high watermark, true again (with a `'drain'` event) once it fell to the low one. */
  readonly writable: boolean
  /** Bytes queued for the peer and not taken by the kernel yet (answers waiting for their turn included). */
  readonly bufferedBytes: number
  /** Stops reading the peer's requests (a broker holding back a publisher) until `resumeReading`. */
  pauseReading: () => void
  /** Reads the peer's requests again after `pauseReading`. */
  resumeReading: () => void
  /** `'drain'`: writable again. `'close'`: the connection closed (its error, if any, as the argument). */
  on: (event: 'drain' | 'close', listener: (error?: Error) => void) => this
  /** Like `on`, for the next such event only. */
  once: (event: 'drain' | 'close', listener: (error?: Error) => void) => this
  /** Removes a listener added with `on` or `once`. */
  off: (event: 'drain' | 'close', listener: (error?: Error) => void) => this
}

/**
 * A protocol, as the generic server sees it. `Req` is what handlers get,
 * `Res` what they return, `State` its per-connection state and `Data` its
 * per-call data (`CallHead.data`, on the call as `data`).
 */
export interface ServerProtocol<Req = unknown, Res = unknown, State = unknown, Data = unknown> {
  /** A short name for logs and metrics (`krpc`, `memcached`). */
  readonly name: string
  /** Where frames end: a length field (`Framing`) or a scan (`ScanFraming`). */
  readonly framing: Framing | ScanFraming
  /**
   * `id`: answers are matched by `CallHead.callId` and leave as handlers finish
   * (KRPC, memcached's opaque would allow it too). `in-order`: answers leave
   * in request order even when handlers finish out of order (memcached,
   * RESP, line protocols); a request answered with no bytes keeps its place.
   */
  readonly ordering: 'id' | 'in-order'
  /**
   * With `'id'` ordering, a request whose id is already in flight on its
   * connection: `'close'` (default) takes it for a broken peer and closes
   * the connection; `'allow'` runs it too and answers both, each with its
   * id (DNS over TCP lets a client repeat an id, RFC 7766).
   */
  readonly duplicateIds?: 'close' | 'allow'
  /**
   * `'concurrent'` (default): a connection's calls run as workers take
   * them, several at once. `'sequential'`: one at a time per connection,
   * in arrival order, each after the previous one was answered (a
   * session: PostgreSQL, Redis's MULTI, an MQTT session); pipelined bytes
   * are still read. A route group may say otherwise
   * (`RouteGroupOptions.execution`). See docs/scheduling.md.
   */
  readonly execution?: 'concurrent' | 'sequential'
  /** The largest frame accepted; the server's `maxMessageBytes` option overrides it. Default 50 MiB. */
  readonly maxFrameBytes?: number
  /**
   * The connection's set-up, if the protocol has one; its result is the
   * connection's peer identity (`user`) for the calls that follow.
   */
  handshake?: (remoteAddress: string, connection: ConnectionHandle) => Handshake<{
    /** The peer's identity for its calls (`ctx.user`); left out, the one TLS gave (its certificate's CN) or ''. */
    user?: string
  }>
  /**
   * State of the protocol's own per connection (RESP: the client's name),
   * made when the connection is accepted. `decodeHead` and
   * `protocolError` get it, handlers see it as `ctx.connectionState`.
   * `connection` is the connection's handle (`ctx.connection`), which the
   * state may keep to push to it later.
   */
  connectionState?: (remoteAddress: string, connection: ConnectionHandle) => State
  /**
   * Reads the head of the frame `buf[start, end)` into `head`. Return null
   * to go on, or an error to close the connection (the stream can no
   * longer be trusted: bad magic, a malformed header; `protocolError` may
   * answer it first). `state` is the connection's `connectionState`
   * (undefined without one). Must not throw.
   */
  decodeHead: (buf: Buffer, start: number, end: number, head: CallHead<Data>, state?: State) => RpcError | null
  /**
   * The protocol's words for a stream it cannot go on reading: the framing's
   * scan or `decodeHead` returned `error`. The answer's bytes are sent after
   * the answers to the requests before it (in order, for in-order
   * protocols), then the connection closes; nothing after the bad bytes is
   * read. Without it, or when it returns null, the connection closes
   * without a reply (the earlier answers still go out). RESP answers
   * `-ERR Protocol error: ...` this way. Must not throw.
   */
  protocolError?: (error: RpcError, state: State) => AnswerSlices
  /**
   * Decodes the body the head pointed at, for the route it named. What it
   * returns is the handler's request; `InvalidRequest` is answered with the
   * refusal `invalid`. Must not throw. Views of `buf` stay valid as long as
   * they are referenced (the read chunk is not reused).
   */
  decodeRequest: (route: RouteInfo, buf: Buffer, head: CallHead<Data>) => Req | InvalidRequest
  /**
   * Encodes the answer frame to `response` into `out` (see `FrameSink`):
   * room reserved there is, on the hot path, straight in the connection's
   * coalesced outbound buffer; large payloads are appended without a copy.
   * Adding nothing means no answer at all (memcached's quiet commands).
   * May throw: what it added is dropped and the call is answered `failed`.
   * An answer that finishes before its turn (`'in-order'`) is encoded at
   * once, into a buffer of its own, and waits there.
   */
  encode: (call: AnsweredCall<Data>, response: Res, out: FrameSink) => void
  /**
   * The protocol's words for a request the server answers itself (see
   * `RefusalReason`): the answer's bytes, an empty array for no answer, or
   * null to close the connection instead. `detail` is the handler's error
   * (`failed`) or the `InvalidRequest`'s detail (`invalid`). `state` is the
   * connection's (`connectionState`; undefined without one): PostgreSQL's
   * refusal depends on whether the session is in a transaction.
   */
  refusal: (call: CallInfo<Data>, reason: RefusalReason, message: string, detail?: unknown, state?: State) => AnswerSlices
  /**
   * Encodes a message the server sends unasked (`ctx.connection.send`,
   * `ConnectionGroup.send`: a publish/subscribe message, a notification)
   * into `out`. Called once per message and protocol, however many
   * connections it goes to: the bytes are shared. May throw (the send
   * then throws, nothing sent). Without it, pushes are refused.
   */
  encodePush?: (message: unknown, out: FrameSink) => void
  /**
   * Encodes one part of a streamed answer (`ctx.write(part)`) into `out`;
   * it is sent before the handler's final answer, in the request's place
   * in the order. May throw (`ctx.write` then throws, nothing sent).
   * Without it, `ctx.write` is refused.
   */
  encodePart?: (call: AnsweredCall<Data>, part: unknown, out: FrameSink) => void
  /**
   * The protocol's words before a close the server decides itself, sent
   * after what is already queued, then the connection ends (PostgreSQL's
   * FATAL, an MQTT 5 DISCONNECT). `reason`: `'idle'` (the server's
   * `idleTimeoutMs`, or the connection's own `setIdleTimeout`),
   * `'frame-timeout'` (a frame not complete within `frameTimeoutMs`),
   * `'slow-frame'` (below `minFrameBytesPerSecond`), `'inbound-budget'`
   * (the server's inbound buffers passed their budget), `'age'`
   * (`maxConnectionAgeMs`), `'shutdown'` (`close()`). Null or `[]`: none.
   * At most 64 KiB, flushed within 1 s (then the connection is destroyed
   * anyway); not asked for a connection still in set-up. Must not throw.
   */
  lastWords?: (reason: 'idle' | 'frame-timeout' | 'slow-frame' | 'inbound-budget' | 'age' | 'shutdown', state: State) => AnswerSlices
}
