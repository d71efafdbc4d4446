// The generic server's life cycle: listen, accept (within admission's
// limits, TLS first when asked), the protocol's set-up, and the graceful
// close. Its parts share one ServerContext (server-context.ts); the guards
// over the connections are composed here once (connection-guard.ts), and
// everything from a request frame to its answer is call-dispatch.ts's.
import type { Socket } from 'node:net'
import type { AddressInfo } from 'node:net'
import type { TLSSocket } from 'node:tls'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { ServerProtocol } from '../codec/protocol.js'
import type { Clock, TimerHandle } from '../scheduling/clock.js'
import { SocketReader, readThrough } from '../transport/socket-reader.js'
import { socketStream } from '../transport/net-stream.js'
import { BusyPoller } from '../transport/busy-poll.js'
import { FramedConnection } from '../transport/framed-connection.js'
import { CallDispatch, type RouteGroupOptions, type RouteHandlers } from './call-dispatch.js'
import { DEFAULT_HIGH_WATERMARK_BYTES, DEFAULT_LOW_WATERMARK_BYTES, ServerConnectionHandle, type Watermarks } from './connection-handle.js'
import type { CallEndObserver, Filter } from './filters.js'
import { PushOutputLimit } from './push-output-limit.js'
import { ServerMetrics } from './metrics.js'
import type { Logger } from './logger.js'
import { ConnectionRecord } from './connection-record.js'
import type { InboundBudget } from '../transport/inbound-budget.js'
import type { OutboundBudget } from './outbound-budget.js'
import { serverBudgets } from './server-budgets.js'
import { Admission } from './admission.js'
import { ConnectionGuards } from './connection-guard.js'
import { ConnectionScan } from './connection-scan.js'
import { ServerContext, type ResolvedServerOptions } from './server-context.js'
import { SlowConsumerWatch } from './slow-consumer.js'
import {
  checkReadBudgets, tlsHandshakeTimeoutOf, writeWatermarksOf,
  type ServerConnectionStats, type ServerLimits, type ServerOptions, type ServerStats
} from './server-options.js'
import { TlsAccept } from './tls-accept.js'
import { startIdleCollection } from './idle-collection.js'
import { ServerListener } from './server-listener.js'
import type { NativeStream } from '../transport/native/native-stream.js'
import type { ByteStream } from '../transport/byte-stream.js'
import { sayLastWords } from './last-words.js'
import { ConnectionSetUp } from './connection-set-up.js'

export type { Handler, RouteDefinition, RouteGroupOptions, RouteHandlers, CallExecutor } from './call-dispatch.js'
export type { CallEndObserver, CallOutcome, EndedCall, Filter } from './filters.js'
export type { PushOutputLimitOptions } from './server-options.js'
export type { WriteWatermarks } from './connection-handle.js'
export type { ServerConnectionStats, ServerLimits, ServerOptions, ServerStats } from './server-options.js'
export { ListenError } from './listen-error.js'

/**
 * A server for any protocol (`ServerProtocol`): accepts connections within
 * its limits, runs the protocol's set-up, hands each request frame to the
 * call dispatch (routes, deadline-ordered queues, workers, answers), and
 * closes connections that are idle, too slow, too old or broken. KRPC's
 * `KrpcServer` wraps one, with the KRPC protocol and services as its groups.
 */
export class ProtocolServer<Req = any, Res = any, State = any, Data = any> { // eslint-disable-line @typescript-eslint/no-explicit-any
  /** What the server's parts share: protocol, options, clock, logger, connections, counters. */
  readonly #ctx: ServerContext<ConnectionRecord>
  readonly #protocol: ServerProtocol
  readonly #options: ResolvedServerOptions
  readonly #clock: Clock
  readonly #log: Required<Logger>
  /** Per-group and per-route metrics; `metrics.text()` is the Prometheus exposition. */
  readonly metrics = new ServerMetrics()
  readonly #dispatch: CallDispatch
  readonly #connections: Set<ConnectionRecord>
  /** Admission of new connections (limits, evictions); its `negotiating` are the connections still in set-up, oldest first. */
  readonly #admission: Admission<ConnectionRecord>
  readonly #negotiating: Set<ConnectionRecord>
  /** The guards over the connections (told at accept, each scan tick, and close), composed once. */
  readonly #guards: ConnectionGuards<ConnectionRecord>
  readonly #pushes: PushOutputLimit
  readonly #slowConsumers: SlowConsumerWatch
  readonly #watermarks: Watermarks
  readonly #inbound: InboundBudget
  readonly #outbound: OutboundBudget
  /** The protocol's set-up of each new connection (connection-set-up.ts). */
  readonly #setUp: ConnectionSetUp
  /** Where #listen was asked to listen, for messages. */
  #listenAddress: string | null = null
  readonly #net: ServerListener
  /** While closing: called when the last connection has closed (the native listener's close waits for it, as node:net's does). */
  #onEmpty: (() => void) | null = null
  #closing: Promise<void> | null = null
  /** While closing: called when the last connection has closed. */
  #onLastClose: (() => void) | null = null
  readonly #poller: BusyPoller | undefined
  /** With `tls`: TLS from the first byte for every accepted connection. */
  readonly #tls: TlsAccept | null = null
  /** Stops the idle collection (`idleCollection`), once listening; null before and after. */
  #stopIdleCollection: (() => void) | null = null

  /**
   * The server's types follow the protocol's: `addRoutes` takes handlers
   * of `ServerProtocol<Req, Res, State, Data>`'s request and answer, and
   * their `ctx.connectionState` is its `State`.
   */
  constructor (protocol: ServerProtocol<Req, Res, State, Data>, options: ServerOptions = {}) {
    const ctx = this.#ctx = new ServerContext<ConnectionRecord>(protocol as ServerProtocol, options)
    this.#protocol = ctx.protocol
    this.#options = ctx.options
    this.#clock = ctx.clock
    this.#log = ctx.log
    this.#connections = ctx.connections
    this.#poller = (options.busyPollUs ?? 0) > 0 ? new BusyPoller(options.busyPollUs!) : undefined
    const scan = new ConnectionScan(ctx)
    this.#admission = new Admission(ctx)
    this.#negotiating = this.#admission.negotiating
    this.#setUp = new ConnectionSetUp(ctx, this.#negotiating)
    this.#slowConsumers = new SlowConsumerWatch(ctx)
    this.#watermarks = writeWatermarksOf(options, DEFAULT_HIGH_WATERMARK_BYTES, DEFAULT_LOW_WATERMARK_BYTES)
    const handshakeMs = tlsHandshakeTimeoutOf(options)
    checkReadBudgets(options)
    if (options.tls !== undefined) this.#tls = new TlsAccept(options.tls, handshakeMs, ctx)
    const budgets = serverBudgets(ctx)
    this.#inbound = budgets.inbound
    this.#outbound = budgets.outbound
    this.#pushes = new PushOutputLimit(ctx, options.pushOutputLimit, () => this.#outbound.isOver)
    this.metrics.limitCounters = () => ctx.counters.limitCounters(this.#inbound.closedConnections, this.#outbound.pauses)
    this.#dispatch = new CallDispatch(ctx, this.metrics, this.#admission.maxConnections)
    // In the order of today's scan: abandonment, the soft push limit, the descriptor count, then each connection's progress.
    this.#guards = new ConnectionGuards(this.#clock, this.#connections, [this.#dispatch.abandonment, this.#pushes, this.#admission, this.#slowConsumers, scan])
    this.#net = new ServerListener({
      onSocket: (socket) => this.#onSocket(socket),
      onStream: (stream) => this.#onStream(stream),
      outOfDescriptors: (code) => this.#admission.outOfDescriptors(code),
      listenerError: (err) => this.#log.error(`listener error: ${err.message}`, { protocol: protocol.name, code: err.code, address: this.#addressText() })
    }, { io: options.io, tls: options.tls !== undefined || protocol.upgradesInSetUp === true, log: this.#log, name: protocol.name })
  }

  /** The protocol this server speaks. */
  get protocol (): ServerProtocol {
    return this.#protocol
  }

  /**
   * Registers a group of routes: `name` is what the protocol's
   * `decodeHead` puts in `CallHead.service`, and each handler's key what it
   * puts in `CallHead.method`. A group has its own queue and workers (the
   * server's defaults unless `options` says otherwise) and its own metrics.
   */
  addRoutes (name: string, handlers: RouteHandlers<Req, Res, State>, options?: RouteGroupOptions<Req, Res, State>): this {
    this.#dispatch.addRoutes(name, handlers as RouteHandlers, options as RouteGroupOptions)
    return this
  }

  /**
   * Adds a filter around the handlers of every group, those registered
   * later too: `(request, ctx, next) => answer`, outside each group's own
   * filters (`RouteGroupOptions.filters`); the first added is outermost.
   * Composed now, not per call. Filters of a group with an executor (worker
   * threads) run in the event loop around the executor.
   */
  use (filter: Filter<Req, Res, State>): this {
    this.#dispatch.use(filter as Filter)
    return this
  }

  /**
   * Calls `observer(call, outcome)` once for every call's end: answered
   * (`ok`), refused by the server (busy, expired, shutdown, invalid,
   * no-method, ... and `failed` when a handler threw), or dropped with its
   * connection (`closed`). Returns a function that removes it.
   */
  onCallEnd (observer: CallEndObserver): () => void {
    return this.#dispatch.onCallEnd(observer)
  }

  /** Sets `maxConnectionAgeMs` (0 or less: no limit) for connections accepted from now on. */
  setMaxConnectionAgeMs (ms: number): void {
    this.#options.maxConnectionAgeMs = ms
    if (this.#net.listening) this.#guards.arm()
  }

  /** Marks the routes as registered: unknown groups are now refused `no-service` rather than `unavailable`. */
  markReady (): void {
    this.#dispatch.markReady()
  }

  /**
   * Starts listening; resolves with the bound address (the real port when
   * `port` is 0). Loopback by default. Groups with an executor (worker
   * threads) are waited for first; it rejects if one could not start.
   * `reusePort` (Node ≥ 22.12) binds this process's own socket with
   * SO_REUSEPORT, also in a cluster worker (see reactor/cluster.ts).
   * A port outside 0-65535 rejects with RPC_ERR_INVALID_ARGUMENT; a socket
   * that cannot be bound rejects with a `ListenError` (`code` EADDRINUSE,
   * EACCES, EADDRNOTAVAIL, ..., with the address). The server is then not
   * listening and may listen again; `close()` releases the rest (threads).
   */
  listen (port = 0, host = '127.0.0.1', options: { reusePort?: boolean } = {}): Promise<AddressInfo> {
    if (!Number.isInteger(port) || port < 0 || port > 65535) {
      return Promise.reject(new RpcError(ErrorCode.INVALID_ARGUMENT, `port must be an integer 0-65535, got ${port}`))
    }
    const executors = this.#dispatch.executors.filter(e => e.ready !== undefined)
    if (executors.length > 0) {
      return Promise.all(executors.map(e => e.ready)).then(() => this.#listen(port, host, options.reusePort === true))
    }
    return this.#listen(port, host, options.reusePort === true)
  }

  #listen (port: number, host: string, reusePort: boolean): Promise<AddressInfo> {
    this.#listenAddress = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`
    return this.#net.listen(port, host, reusePort).then((address) => {
      this.#guards.arm()
      const idle = this.#options.idleCollection
      if (idle !== false && this.#stopIdleCollection === null) this.#stopIdleCollection = startIdleCollection(idle)
      return address
    })
  }

  #addressText (): string | null {
    const bound = this.#net.address()
    if (bound === null || typeof bound === 'string') return bound ?? this.#listenAddress
    return bound.family === 'IPv6' ? `[${bound.address}]:${bound.port}` : `${bound.address}:${bound.port}`
  }

  /** The bound address, once listening. */
  address (): AddressInfo | null {
    return this.#net.address() as AddressInfo | null
  }

  /** The server's counters now, in a new object. */
  stats (): ServerStats {
    let inFlight = 0
    for (const sc of this.#connections) inFlight += sc.inFlight.size
    return this.#ctx.counters.stats({
      connectionsOpen: this.#connections.size,
      callsInFlight: inFlight,
      inboundBudgetClosed: this.#inbound.closedConnections,
      outboundPauses: this.#outbound.pauses,
      abandonedRunning: this.#dispatch.abandonedRunning,
      io: this.#net.backend
    })
  }

  /** The limits in force (defaults resolved), as `nyala serve` reports them. */
  limits (): ServerLimits {
    return {
      maxConnections: this.#admission.maxConnections,
      maxNegotiatingConnections: this.#admission.maxNegotiating,
      maxInboundBufferedBytes: this.#inbound.maxBytes,
      maxOutboundBufferedBytes: this.#outbound.maxBytes
    }
  }

  /**
   * Counters of each open connection, as Kudu's `DumpConnections`: its
   * outbound transfer queue (frames and bytes queued, bytes the socket still
   * buffers, immediate and batched writes, partial writes, drain waits) and
   * the bytes and frames read and written.
   */
  connectionStats (): ServerConnectionStats[] {
    const out: ServerConnectionStats[] = []
    for (const sc of this.#connections) out.push({ remoteAddress: sc.remoteAddress, callsInFlight: sc.inFlight.size, ...sc.connection.stats() })
    return out
  }

  /**
   * Stops accepting, refuses requests that arrive from now on (`shutdown`:
   * KRPC's FATAL_SERVER_SHUTTING_DOWN), lets calls in flight finish (up to
   * `graceMs`, default 30 s; then their signals abort and their connections
   * close), and resolves when every connection is closed (and executors,
   * such as worker threads, have stopped). Once drained, each connection
   * is ended after its answers are flushed; a peer that does not read them
   * cannot hold the shutdown: when the grace period ends, every connection
   * still open is destroyed. So `close()` resolves by the end of the grace
   * period, whatever the peers do.
   */
  close (options: { graceMs?: number } = {}): Promise<void> {
    if (this.#closing !== null) return this.#closing
    this.#poller?.stop()
    this.#stopIdleCollection?.()
    this.#stopIdleCollection = null
    const closed = new Promise<void>((resolve) => {
      const graceMs = options.graceMs ?? 30_000
      const startedAt = this.#clock.now()
      this.#net.close(() => {
        if (this.#connections.size === 0) resolve()
        else this.#onEmpty = resolve
      })
      this.#guards.stop()
      for (const sc of this.#connections) {
        if (!sc.ready) sc.connection.destroy()
      }
      let graceTimer: TimerHandle | null = null
      // Drained: answers produced in this turn may still wait in the transfer
      // queues, so each connection is ended after its queue is flushed. After
      // the grace period they are destroyed right after the flush (a peer
      // that does not read must not hold the shutdown).
      // The grace timer stays armed after the drain: connections still
      // flushing to a peer that does not read are destroyed when it fires.
      const finish = (flush = true): void => {
        this.#dispatch.whenDrained(null)
        for (const sc of [...this.#connections]) {
          // Drained: the protocol's last words ('shutdown'), if it has any, then the end.
          if (flush) {
            if (!sayLastWords(this.#ctx, sc, 'shutdown')) sc.connection.endAfterFlush()
          } else sc.connection.flushAndDestroy()
        }
        if (this.#connections.size === 0 && graceTimer !== null) {
          this.#clock.clearTimer(graceTimer)
          graceTimer = null
        }
      }
      this.#onLastClose = () => {
        if (graceTimer !== null) this.#clock.clearTimer(graceTimer)
        graceTimer = null
      }
      // Requests are refused from here on (once), with what is left of the grace for queued calls.
      let refusing = false
      const refuse = (): boolean => {
        if (refusing) return false
        refusing = true
        this.#dispatch.close(Math.max(0, graceMs - (this.#clock.now() - startedAt)))
        return true
      }
      const graceOver = (): void => {
        graceTimer = null
        const reason = new RpcError(ErrorCode.CONNECTION_CLOSED, 'server shutting down: grace period over')
        for (const sc of this.#connections) for (const call of sc.inFlight.values()) call.abort(reason)
        finish(false)
      }
      const graceFired = (): void => {
        // A grace over before refusing began: queued calls are refused first, then connections close.
        if (refuse()) graceTimer = this.#clock.setTimer(graceOver, 0)
        else graceOver()
      }
      graceTimer = this.#clock.setTimer(graceFired, graceMs)
      this.#outbound.stop()
      // The rest of the read close() was called in (requests that arrived
      // before it) is answered as usual: requests are refused (`shutdown`)
      // from the next read on. Queued calls keep draining to workers within
      // the grace period; those left then are refused (before connections
      // close). Once drained, connections end after the next poll of the
      // event loop (an I/O turn, not time), so that requests already in
      // the kernel's receive buffers are read and refused, not dropped unanswered.
      queueMicrotask(() => {
        if (!refuse()) return
        // Re-armed after the queues' own grace timers, so that queued calls are refused before connections close.
        if (graceTimer !== null) this.#clock.clearTimer(graceTimer)
        graceTimer = this.#clock.setTimer(graceFired, Math.max(0, graceMs - (this.#clock.now() - startedAt)))
        this.#dispatch.whenDrained(() => {
          this.#dispatch.whenDrained(null)
          setImmediate(() => setImmediate(() => finish()))
        })
      })
    })
    const executors = this.#dispatch.executors.filter(e => e.close !== undefined)
    this.#closing = executors.length === 0
      ? closed
      : closed.then(() => Promise.all(executors.map(e => e.close!()))).then(() => undefined)
    return this.#closing
  }

  // A peer is let in (or refused, or room is made for it).
  #admitted (peer: Socket | NativeStream): boolean {
    if (this.#closing !== null) {
      peer.destroy()
      return false
    }
    if (!this.#admission.admit(peer)) return false
    this.#ctx.counters.accepted()
    return true
  }

  // A connection of the native transport (plain TCP).
  #onStream (stream: NativeStream): void {
    if (this.#admitted(stream)) this.#open(stream, null, null, `${stream.remoteAddress}:${stream.remotePort}`)
  }

  // A node:net connection: TLS from the first byte, or plain TCP read through a SocketReader.
  #onSocket (accepted: Socket): void {
    if (!this.#admitted(accepted)) return
    const remoteAddress = `${accepted.remoteAddress ?? '?'}:${accepted.remotePort ?? 0}`
    let secure: TLSSocket | null
    try {
      // node:tls may throw: the connection goes, the server stays.
      // TLS sockets read through 'data' events (onread applies to raw TCP handles only).
      secure = this.#tls === null ? null : this.#tls.socket(accepted)
    } catch (err) {
      accepted.destroy()
      this.#admission.setUpFailed(remoteAddress, err)
      return
    }
    const reader = secure === null ? new SocketReader() : undefined
    const socket = secure ?? readThrough(accepted, reader!)
    const stream = socketStream(socket, socket === accepted || secure !== null ? undefined : reader)
    this.#open(stream, socket, secure, remoteAddress)
  }

  // The framed connection over `stream` (`socket`: node:net's, for a set-up's TLS upgrade), then TLS or the set-up.
  #open (stream: ByteStream & { readonly readPath?: 'onread' | 'data' }, socket: Socket | null, secure: TLSSocket | null, remoteAddress: string): void {
    const connection = new FramedConnection(stream, {
      socket: socket ?? undefined,
      readPath: stream.readPath ?? 'onread',
      framing: this.#protocol.framing,
      maxFrameBytes: this.#options.maxMessageBytes,
      maxOutboundBytes: this.#options.maxOutboundBytes,
      maxFramesPerRead: this.#options.maxFramesPerRead,
      maxAnswerBytesPerRead: this.#options.maxAnswerBytesPerRead,
      busyPoller: this.#poller,
      inboundBudget: this.#inbound,
      onBackedUp: () => this.#outbound.watch(connection),
      onReadingSuspended: () => this.#slowConsumers.watch(sc)
    })
    const sc = new ConnectionRecord(connection, remoteAddress, this.#clock.now(), this.#dispatch.answerOrder)
    const handle = new ServerConnectionHandle(sc, this.#ctx, this.#pushes, this.#watermarks)
    sc.handle = handle
    try {
      // The protocol's code may throw: the connection goes, the server stays.
      sc.state = this.#connectionState(remoteAddress, handle)
      sc.setPeer('', handle)
    } catch (err) {
      connection.destroy()
      this.#admission.setUpFailed(remoteAddress, err)
      return
    }
    this.#guards.accepted(sc)
    this.#connections.add(sc)
    const dispatch = this.#dispatch
    connection.attach({
      onFrame: (buf, start, end) => dispatch.onFrame(sc, buf, start, end),
      onFramingError: (error) => dispatch.framingError(sc, error),
      onClose: (error) => this.#onClose(sc, error)
    })
    if (secure === null) {
      this.#setUp.start(sc, remoteAddress)
      return
    }
    // In its TLS handshake the connection counts as negotiating (admission, eviction, close()).
    this.#negotiating.add(sc)
    this.#tls!.handshake(sc, secure, (user) => {
      this.#negotiating.delete(sc)
      if (user !== '') sc.setPeer(user, sc.handle!)
      this.#setUp.start(sc, remoteAddress)
    })
  }

  // The protocol's own state for a new connection (undefined without a connectionState hook).
  #connectionState (remoteAddress: string, handle: ServerConnectionHandle): unknown {
    const make = this.#protocol.connectionState
    return make === undefined ? undefined : make(remoteAddress, handle)
  }

  #onClose (sc: ConnectionRecord, error: RpcError | undefined): void {
    this.#connections.delete(sc)
    this.#guards.closed(sc, error)
    sc.closedAt = this.#clock.now()
    if (this.#connections.size === 0) {
      this.#onLastClose?.()
      this.#onEmpty?.()
      this.#onEmpty = null
    }
    // A frame the decoder refused at its prefix is a bad frame too.
    if (error?.code === ErrorCode.MALFORMED_FRAME && !sc.badFrame) this.#ctx.counters.badFrame(sc.remoteAddress, `${error.message}; closing the connection`, error.code)
    this.#dispatch.connectionClosed(sc, error)
    sc.handle?.connectionClosed(error)
    this.#dispatch.checkDrained()
  }

}

/** What `serveReactors` needs of a server it runs in each reactor: a `ProtocolServer`, or a server wrapping one (KRPC's). */
export type ServesReactor = Pick<ProtocolServer, 'listen' | 'close' | 'metrics' | 'setMaxConnectionAgeMs' | 'stats'>
