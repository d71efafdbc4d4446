import { createServer, type Server as NetServer, type Socket } from 'node:net'
import type { AddressInfo } from 'node:net'
import { TLSSocket, createSecureContext, type SecureContext, type TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { ServerProtocol } from '../codec/protocol.js'
import { realClock, type Clock, type TimerHandle } from '../scheduling/clock.js'
import { SocketReader, readThrough } from '../transport/socket-reader.js'
import { BusyPoller } from '../transport/busy-poll.js'
import { Connection, type ConnectionStats, type Handshake } from '../transport/connection.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { CallDispatch, type DispatchHost, type RouteGroupOptions, type RouteHandlers } from './call-dispatch.js'
import { DEFAULT_HIGH_WATERMARK_BYTES, DEFAULT_LOW_WATERMARK_BYTES, ServerConnectionHandle, type PushHost, type WriteWatermarks } from './connection-handle.js'
import type { CallEndObserver, Filter } from './filters.js'
import { PushOutputLimit, type PushOutputLimitOptions } from './push-output-limit.js'
import { ServerMetrics, type LimitCounters } from './metrics.js'
import { RateLimitedLog, resolveLogger, type LogFields, type Logger } from './logger.js'
import { ServerConnection } from './server-connection.js'
import { InboundBudget, DEFAULT_MAX_INBOUND_BUFFERED_BYTES } from '../transport/inbound-budget.js'
import { OutboundBudget, DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES } from './outbound-budget.js'
import { DEFAULT_MAX_NEGOTIATING_CONNECTIONS, DEFAULT_MIN_FRAME_BYTES_PER_SECOND, DEFAULT_SLOW_FRAME_GRACE_MS, MIN_EVICTABLE_IDLE_MS, countOpenDescriptors, defaultMaxConnections, descriptorLimit, isSlowFrame, longestIdle, slowestFrame, type FrameProgress } from './admission.js'

export type { Handler, RouteDefinition, RouteGroupOptions, RouteHandlers, CallExecutor } from './call-dispatch.js'
export type { CallEndObserver, CallOutcome, EndedCall, Filter } from './filters.js'
export type { PushOutputLimitOptions } from './push-output-limit.js'
export type { WriteWatermarks } from './connection-handle.js'

export interface ServerOptions {
  /** Largest inbound frame, checked as early as the framing allows; default: the protocol's `maxFrameBytes`, else 50 MiB. */
  maxMessageBytes?: number
  /** Deadline for a new connection's set-up (the protocol's handshake, KRPC negotiation); default 3000 ms. */
  negotiationTimeoutMs?: number
  /**
   * Time budget of a request whose frame carries none (memcached, RESP;
   * KRPC without timeout_millis), from the moment its frame arrived: it
   * orders the queue (earliest deadline first) and expires the request
   * there. Default 0: no deadline.
   */
  requestTimeoutMs?: number
  /** Idle connections are closed after this long, never while a call is in flight; default 65000 ms; 0 or less disables. */
  idleTimeoutMs?: number
  /**
   * A frame that has started arriving must be complete within this long
   * (default 60 000 ms; 0 or less disables): a peer that trickles a large
   * frame byte by byte cannot hold its buffer forever. One that stops
   * sending inside a frame is idle and meets `idleTimeoutMs` first.
   */
  frameTimeoutMs?: number
  /**
   * The slowest a frame in progress may arrive, in bytes per second
   * (default 1000; 0 disables): a peer that trickles a frame (slowloris)
   * is never idle, yet holds a connection for the whole `frameTimeoutMs`.
   * A frame that has been arriving for more than `slowFrameGraceMs` with
   * fewer than this many bytes per second past the grace is closed by the
   * idle scan; at `maxConnections`, one that has after only 1 s makes room
   * for a newcomer (as an idle connection does). Time the server is not
   * reading the connection (the outbound budget, `pauseReading`) does not count.
   */
  minFrameBytesPerSecond?: number
  /** How long a frame in progress may take before `minFrameBytesPerSecond` closes it; default 10 000 ms. */
  slowFrameGraceMs?: number
  /**
   * Budget for bytes held in incomplete inbound frames over all connections
   * of this server (default 256 MiB): past it, the connection holding the
   * largest incomplete frame is closed (FRAME_TOO_LARGE).
   */
  maxInboundBufferedBytes?: number
  /** Bound on a connection's unsent response bytes (default 100 MiB); a client that reads slower than that is disconnected. */
  maxOutboundBytes?: number
  /**
   * The slow-consumer limits of connections that have received a push
   * (`ConnectionHandle.send`, `ConnectionGroup.send`), as Redis's
   * `client-output-buffer-limit pubsub`: past `hardBytes` unsent bytes
   * (default 32 MiB) the connection is closed at once; above `softBytes`
   * (default 8 MiB) for `softMs` (default 60 000 ms) without a break, it
   * is closed then. 0 turns either limit off. Closes are counted
   * (`pushHardLimitClosed`, `pushSoftLimitClosed`) and logged, rate-limited.
   */
  pushOutputLimit?: PushOutputLimitOptions
  /** When `ConnectionHandle.writable` turns false (past `highBytes` unsent, default 64 KiB) and true again with a `'drain'` event (at `lowBytes`, default 32 KiB). */
  writeWatermarks?: WriteWatermarks
  /**
   * Budget for unsent response bytes over all connections (default 512 MiB):
   * while over it, the server stops reading requests from the connections
   * holding the most unsent bytes, and reads again once below it.
   */
  maxOutboundBufferedBytes?: number
  /**
   * Connections this server keeps open (default: the process's descriptor
   * limit less a reserve; 960 under `ulimit -n 1024`). A newcomer at the
   * limit closes the connection idle longest (≥ 1 s, nothing in flight), or
   * is refused at once when none is.
   */
  maxConnections?: number
  /**
   * Connections still negotiating (default 1000, at most half of
   * `maxConnections`); past it the oldest negotiating one is closed for the
   * newcomer. At `maxConnections` with no idle connection, the oldest
   * negotiating one makes room too.
   */
  maxNegotiatingConnections?: number
  /** Largest set-up frame (default 1 MiB), checked as early as the framing allows. */
  maxNegotiationBytes?: number
  /**
   * A handler still running this long after its call's deadline, or after
   * its connection closed, gives its worker back (default 5000 ms; 0
   * disables): its result is dropped and it is counted as abandoned. Per
   * group with `RouteGroupOptions.abandonAfterMs`. In-loop handlers only
   * (a call on an executor, such as a worker thread, holds it until done).
   */
  abandonAfterMs?: number
  /** Abandoned handlers still running, per group, past which no more are abandoned (their workers stay held, so the group answers busy); default 100. */
  maxAbandonedHandlers?: number
  /**
   * Connections older than this (±10 % jitter) are retired, so long-lived
   * clients rebalance across reactors (gRPC's MAX_CONNECTION_AGE): calls in
   * flight are answered, calls arriving later are refused `shutdown` (KRPC:
   * FATAL_SERVER_SHUTTING_DOWN, which clients retry on a new connection), and the connection closes once
   * it is quiet. Default: no limit. See docs/cluster.md.
   */
  maxConnectionAgeMs?: number
  /** Until `markReady()`, requests for unknown groups are refused `unavailable` instead of `no-service`; default true (ready at once). */
  ready?: boolean
  /**
   * `pool` (default): each group's calls go through its deadline-ordered
   * queue to LIFO-parked workers. `direct`: every handler
   * runs at once, unbounded (for comparison; no queue, never busy).
   */
  scheduler?: 'pool' | 'direct'
  /** Workers (concurrent handlers) per group; default 10. */
  workers?: number
  /** Bound of each group's queue; default 50. */
  queueLength?: number
  /** `edf` (default): earliest deadline first, a full queue evicts the latest deadline. `fifo`: arrival order, a full queue refuses the newcomer. */
  queue?: QueueDiscipline
  /**
   * Calls per group held back while a burst is absorbed (default 4096):
   * past it, newcomers are judged by the queue at once (busy or
   * eviction). See docs/scheduling.md.
   */
  burstLimit?: number
  /**
   * Busy polling: after a connection reads or sends, keep the event loop
   * polling this many microseconds instead of sleeping, so the next request
   * needs no wake-up. Lowers latency and raises calls/s (most on VMs, where
   * wake-ups are dear) at the price of spinning a core while busy. Off (0)
   * by default. See docs/performance.md.
   */
  busyPollUs?: number
  clock?: Clock
  /**
   * TLS from the first byte: every accepted connection runs a TLS handshake
   * (`node:tls`, these options: cert, key, ca, requestCert,
   * rejectUnauthorized, ...) before the protocol sees a byte; the protocol
   * reads and writes plaintext frames as without it. Connections in their
   * TLS handshake count as negotiating (`maxNegotiatingConnections`,
   * `maxConnections`). With `requestCert` and `rejectUnauthorized`, a
   * handler's `ctx.user` is the client certificate's subject CN (unless
   * the protocol's set-up names a user). See docs/security.md.
   */
  tls?: TlsOptions
  /** Deadline of a connection's TLS handshake (with `tls`), on the server's clock; default 10 000 ms. */
  tlsHandshakeTimeoutMs?: number
  /**
   * Where the server reports refused, evicted and broken connections and
   * listener errors, with structured fields. Default: warnings and errors
   * on stderr (`NYALA_LOG_LEVEL` sets the level); `null` silences it.
   * See docs/logging.md.
   */
  logger?: Logger | null
}

/** Counters of one open connection of the server (`Server.connectionStats`). */
export interface ServerConnectionStats extends ConnectionStats {
  remoteAddress: string
  callsInFlight: number
}

/** Counters the server keeps (the limits' counters are also Prometheus counters). */
export interface ServerStats extends LimitCounters {
  connectionsAccepted: number
  connectionsOpen: number
  callsReceived: number
  callsSucceeded: number
  callsFailed: number
  callsInFlight: number
  badFrames: number
  /** Connections closed because they reached `maxConnectionAgeMs`. */
  agedClosed: number
  /** Handlers abandoned after `abandonAfterMs` (their workers given back). */
  handlersAbandoned: number
  /** Abandoned handlers still running. */
  abandonedRunning: number
  /** TLS handshakes that failed (bad records, plaintext, an untrusted or missing client certificate); 0 without `tls`. */
  tlsHandshakeFailures: number
  /** TLS handshakes closed by `tlsHandshakeTimeoutMs`; 0 without `tls`. */
  tlsHandshakeTimeouts: number
}

const DEFAULT_NEGOTIATION_TIMEOUT_MS = 3000
const DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS = 10_000
const DEFAULT_MAX_MESSAGE_BYTES = 50 * 1024 * 1024
const DEFAULT_IDLE_TIMEOUT_MS = 65_000
const DEFAULT_FRAME_TIMEOUT_MS = 60_000
const DEFAULT_MAX_NEGOTIATION_BYTES = 1024 * 1024
const DEFAULT_ABANDON_AFTER_MS = 5000
const DEFAULT_MAX_ABANDONED = 100
/** Open descriptors this close to the limit mean accept() fails (libuv keeps one in reserve). */
const DESCRIPTOR_SLACK = 2
/** Refusals, evictions and accept errors are logged at most this often, each kind. */
const LOG_INTERVAL_MS = 10_000
const DEFAULT_WORKERS = 10
const DEFAULT_QUEUE_LENGTH = 50
/**
 * A retired connection closes once it has been quiet this long: its client
 * stopped using it (the nyala client does on the first FATAL answer), so a
 * call crossing the close on the wire is unlikely.
 */
const RETIRED_QUIET_MS = 1000
/** A retired connection whose client keeps sending (each call answered FATAL) closes this long after retirement, between calls. */
const RETIRED_BUSY_LIMIT_MS = 5000

/**
 * A server for any protocol (`ServerProtocol`): accepts connections within
 * its limits, runs the protocol's set-up, hands each request frame to the
 * call dispatch (routes, deadline-ordered queues, workers, answers), and
 * closes connections that are idle, too slow, too old or broken. KRPC's
 * `Server` is this server with the KRPC protocol and services.
 */
export class ProtocolServer<Req = any, Res = any, State = any> { // eslint-disable-line @typescript-eslint/no-explicit-any
  readonly #protocol: ServerProtocol
  readonly #options: Required<Pick<ServerOptions, 'maxMessageBytes' | 'negotiationTimeoutMs' | 'idleTimeoutMs'>> & ServerOptions
  readonly #clock: Clock
  readonly #log: Required<Logger>
  /** Per-group and per-route metrics; `metrics.text()` is the Prometheus exposition. */
  readonly metrics = new ServerMetrics()
  readonly #dispatch: CallDispatch
  readonly #connections = new Set<ServerConnection>()
  /** Connections still in set-up, oldest first. */
  readonly #negotiating = new Set<ServerConnection>()
  readonly #maxConnections: number
  readonly #maxNegotiating: number
  readonly #inbound: InboundBudget
  readonly #outbound: OutboundBudget
  /** Some group abandons overdue handlers. */
  #abandoning = false
  readonly #logRefused: RateLimitedLog
  readonly #logEvicted: RateLimitedLog
  readonly #logNegotiatingEvicted: RateLimitedLog
  readonly #logAcceptError: RateLimitedLog
  // Peers choose how often these happen: each kind is rate-limited too.
  readonly #logNegotiationFailed: RateLimitedLog
  readonly #logBadData: RateLimitedLog
  readonly #logFrameTimeout: RateLimitedLog
  readonly #logSlowFrame: RateLimitedLog
  /** `minFrameBytesPerSecond` (0: off) and `slowFrameGraceMs`, resolved. */
  readonly #minFrameRate: number
  readonly #slowFrameGraceMs: number
  // Called on the logger, so a class-based logger keeps its `this`.
  readonly #warn = (message: string, fields?: LogFields): void => { this.#log.warn(message, fields) }
  readonly #error = (message: string, fields?: LogFields): void => { this.#log.error(message, fields) }
  /** Where #listen was asked to listen, for messages. */
  #listenAddress: string | null = null
  readonly #net: NetServer
  #ready: boolean
  #idleTimer: TimerHandle | null = null
  #closing: Promise<void> | null = null
  #drained: (() => void) | null = null
  /** While closing: called when the last connection has closed. */
  #onLastClose: (() => void) | null = null
  #stats = {
    connectionsAccepted: 0, callsReceived: 0, callsSucceeded: 0, callsFailed: 0, badFrames: 0, idleClosed: 0, agedClosed: 0,
    frameTimeouts: 0, connectionsRefused: 0, connectionsEvicted: 0, negotiatingEvicted: 0, acceptErrors: 0, descriptorsExhausted: 0, handlersAbandoned: 0,
    tlsHandshakeFailures: 0, tlsHandshakeTimeouts: 0, pushesSent: 0, pushHardLimitClosed: 0, pushSoftLimitClosed: 0, slowFramesClosed: 0
  }
  readonly #pushLimit: PushOutputLimit
  readonly #pushHost: PushHost
  /** Connections that received a push and are over the soft limit: the scan watches them. */
  readonly #overSoft = new Set<ServerConnection>()
  readonly #logPushLimit: RateLimitedLog

  /** The process's descriptor limit (Linux), and whether a count of open descriptors is under way. */
  readonly #fdLimit = descriptorLimit()
  #countingFds = false
  readonly #poller: BusyPoller | undefined
  /** With `tls`: the context every accepted connection's handshake uses. */
  readonly #secureContext: SecureContext | null = null
  #logTlsFailed: RateLimitedLog | null = null

  /**
   * The server's types follow the protocol's: `addRoutes` takes handlers
   * of `ServerProtocol<Req, Res, State>`'s request and answer, and their
   * `ctx.connectionState` is its `State`.
   */
  constructor (protocol: ServerProtocol<Req, Res, State>, options: ServerOptions = {}) {
    this.#protocol = protocol as ServerProtocol
    this.#options = {
      ...options,
      maxMessageBytes: options.maxMessageBytes ?? protocol.maxFrameBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      negotiationTimeoutMs: options.negotiationTimeoutMs ?? DEFAULT_NEGOTIATION_TIMEOUT_MS,
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS
    }
    this.#clock = options.clock ?? realClock
    this.#log = resolveLogger(options.logger)
    this.#ready = options.ready ?? true
    this.#poller = (options.busyPollUs ?? 0) > 0 ? new BusyPoller(options.busyPollUs!) : undefined
    this.#maxConnections = atLeastOne(options.maxConnections ?? defaultMaxConnections(), 'maxConnections')
    // At most half the connections may be in set-up, so silent openers cannot take them all.
    this.#maxNegotiating = atLeastOne(options.maxNegotiatingConnections ?? Math.min(DEFAULT_MAX_NEGOTIATING_CONNECTIONS, Math.ceil(this.#maxConnections / 2)), 'maxNegotiatingConnections')
    const now = (): number => this.#clock.now()
    this.#logRefused = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logEvicted = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logNegotiatingEvicted = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logAcceptError = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logNegotiationFailed = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logBadData = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logFrameTimeout = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logSlowFrame = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#minFrameRate = nonNegative(options.minFrameBytesPerSecond ?? DEFAULT_MIN_FRAME_BYTES_PER_SECOND, 'minFrameBytesPerSecond')
    this.#slowFrameGraceMs = nonNegative(options.slowFrameGraceMs ?? DEFAULT_SLOW_FRAME_GRACE_MS, 'slowFrameGraceMs')
    this.#logPushLimit = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#pushLimit = new PushOutputLimit(options.pushOutputLimit)
    const highBytes = options.writeWatermarks?.highBytes ?? DEFAULT_HIGH_WATERMARK_BYTES
    const lowBytes = options.writeWatermarks?.lowBytes ?? Math.min(DEFAULT_LOW_WATERMARK_BYTES, highBytes)
    if (!(Number.isSafeInteger(highBytes) && Number.isSafeInteger(lowBytes) && lowBytes >= 0 && lowBytes <= highBytes)) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `writeWatermarks needs integers 0 <= lowBytes <= highBytes, got ${lowBytes} and ${highBytes}`)
    }
    this.#pushHost = {
      protocol: this.#protocol,
      highBytes,
      lowBytes,
      push: (sc, slices, bytes) => this.#push(sc, slices, bytes),
      closeByApplication: (sc, reason) => this.#closeByApplication(sc, reason)
    }
    const handshakeMs = options.tlsHandshakeTimeoutMs
    if (handshakeMs !== undefined && !(Number.isSafeInteger(handshakeMs) && handshakeMs > 0)) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `tlsHandshakeTimeoutMs must be a positive integer, got ${handshakeMs}`)
    }
    if (options.tls !== undefined) {
      const tls = options.tls
      checkAcceptOptions(tls)
      if (tls.requestCert === true && tls.rejectUnauthorized !== false && tls.ca === undefined) {
        // Else any certificate from a public CA would pass, its CN becoming ctx.user.
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.requestCert needs tls.ca, the CA that signs the client certificates')
      }
      // Bad certificates and keys throw here, before listening.
      this.#secureContext = createSecureContext(tls)
      this.#logTlsFailed = new RateLimitedLog(LOG_INTERVAL_MS, now)
    }
    const inboundLog = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#inbound = new InboundBudget(options.maxInboundBufferedBytes ?? DEFAULT_MAX_INBOUND_BUFFERED_BYTES, (_member, held) => {
      inboundLog.log(this.#warn, () => `closing a connection holding ${held} bytes of an incomplete frame: the inbound buffers of all connections passed their budget of ${this.#inbound.maxBytes} bytes`,
        () => ({ protocol: protocol.name, heldBytes: held, budgetBytes: this.#inbound.maxBytes }))
    })
    const outboundLog = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#outbound = new OutboundBudget(options.maxOutboundBufferedBytes ?? DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES, this.#clock, (member, total) => {
      outboundLog.log(this.#warn, () => `not reading from a connection holding ${member.outboundBytes} unsent bytes: unsent responses total ${total} bytes, over the budget of ${this.#outbound.maxBytes}`,
        () => ({ protocol: protocol.name, unsentBytes: member.outboundBytes, totalUnsentBytes: total, budgetBytes: this.#outbound.maxBytes }))
    })
    this.metrics.limitCounters = () => this.#limitCounters()
    const stats = this.#stats
    const host: DispatchHost = {
      clock: this.#clock,
      log: this.#log,
      metrics: this.metrics,
      stats,
      pooled: options.scheduler !== 'direct',
      defaults: {
        workers: options.workers ?? DEFAULT_WORKERS,
        queueLength: options.queueLength ?? DEFAULT_QUEUE_LENGTH,
        queue: options.queue ?? 'edf' as QueueDiscipline,
        abandonAfterMs: options.abandonAfterMs ?? DEFAULT_ABANDON_AFTER_MS,
        maxAbandonedHandlers: options.maxAbandonedHandlers ?? DEFAULT_MAX_ABANDONED,
        burstLimit: options.burstLimit,
        requestTimeoutMs: options.requestTimeoutMs ?? 0
      },
      isReady: () => this.#ready,
      connections: this.#connections,
      answered: () => this.#maybeDrained(),
      badData: (remote, why, code) => {
        this.#logBadData.log(this.#warn, () => `received bad data from ${remote}: ${why}`, () => ({ protocol: protocol.name, remote, code }))
      }
    }
    this.#dispatch = new CallDispatch(this.#protocol, host)
    // Paused on accept: nothing is read before #onAccept moves the socket to
    // a SocketReader (see readThrough).
    this.#net = createServer({ noDelay: true, pauseOnConnect: true }, (socket) => this.#onAccept(socket))
    this.#net.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EMFILE' || err.code === 'ENFILE') {
        // Out of descriptors: libuv dropped the connection; accepting goes on once some are free.
        this.#stats.acceptErrors++
        this.#logAcceptError.log(this.#error, () => `accept failed: ${err.code} (out of file descriptors; ${this.#connections.size} connections open, limit ${this.#maxConnections})`,
          () => ({ protocol: protocol.name, code: err.code, connectionsOpen: this.#connections.size, maxConnections: this.#maxConnections }))
        return
      }
      // Before listening, #listen reports the error to its caller instead.
      if (!this.#net.listening) return
      this.#log.error(`listener error: ${err.message}`, { protocol: protocol.name, code: err.code, address: this.#addressText() })
    })
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
    if (this.#net.listening) this.#armIdleScan()
  }

  /** Marks the routes as registered: unknown groups are now refused `no-service` rather than `unavailable`. */
  markReady (): void {
    this.#ready = true
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
    return new Promise((resolve, reject) => {
      const where = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`
      this.#listenAddress = where
      const onListening = (): void => {
        this.#net.off('error', onError)
        this.#armIdleScan()
        resolve(this.#net.address() as AddressInfo)
      }
      const onError = (err: NodeJS.ErrnoException): void => {
        // The failed listen's callback goes too (a later listen would run it).
        this.#net.off('listening', onListening)
        // Not logged: the caller gets it, and decides.
        reject(new ListenError(err, host, port))
      }
      this.#net.once('error', onError)
      // `reusePort` is not in Node 20's types; `exclusive` keeps a cluster worker from sharing the primary's handle.
      const listenOptions = reusePort ? { port, host, backlog: 512, reusePort: true, exclusive: true } : { port, host, backlog: 512 }
      try {
        this.#net.listen(listenOptions, onListening)
      } catch (err) {
        // Thrown at once for options node:net refuses (a bad host type, a listen already under way).
        this.#net.off('error', onError)
        this.#net.off('listening', onListening)
        reject(err)
      }
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

  stats (): ServerStats {
    let inFlight = 0
    for (const sc of this.#connections) inFlight += sc.inFlight.size
    return {
      ...this.#stats,
      connectionsOpen: this.#connections.size,
      callsInFlight: inFlight,
      inboundBudgetClosed: this.#inbound.closedConnections,
      outboundPauses: this.#outbound.pauses,
      abandonedRunning: this.#dispatch.abandonedRunning
    }
  }

  // Pushed bytes for `sc`: queued (closed past its outbound bound), then judged by the push limits.
  #push (sc: ServerConnection, slices: Uint8Array[], bytes: number): boolean {
    const connection = sc.connection
    if (connection.isClosed) return false
    sc.pushed = true
    if (!connection.send({ slices: slices as Buffer[], bytes })) {
      this.#log.warn(`closing ${sc.remoteAddress}: it reads slower than it is sent to (outbound bound exceeded)`, { protocol: this.#protocol.name, remote: sc.remoteAddress })
      connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
      return false
    }
    this.#stats.pushesSent++
    return this.#judgePushed(sc, this.#clock.now())
  }

  // The push limits for a connection that received pushes; false: closed for them.
  #judgePushed (sc: ServerConnection, now: number): boolean {
    const unsent = sc.connection.outboundBytes + sc.heldBytes
    const verdict = this.#pushLimit.judge(sc, unsent, now)
    if (sc.softSince >= 0) this.#overSoft.add(sc)
    else if (this.#overSoft.size > 0) this.#overSoft.delete(sc)
    if (verdict === null) return true
    const limit = this.#pushLimit
    const why = verdict === 'hard'
      ? `${unsent} unsent bytes, over the hard push limit of ${limit.hardBytes}`
      : `over the soft push limit of ${limit.softBytes} bytes for ${Math.round(now - sc.softSince)} ms (${unsent} unsent bytes)`
    if (verdict === 'hard') this.#stats.pushHardLimitClosed++
    else this.#stats.pushSoftLimitClosed++
    this.#overSoft.delete(sc)
    this.#logPushLimit.log(this.#warn, () => `closing ${sc.remoteAddress}: it does not read what is pushed to it: ${why}`,
      () => ({ protocol: this.#protocol.name, remote: sc.remoteAddress, unsentBytes: unsent, limit: verdict }))
    sc.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, `closed as a slow consumer: ${why}`))
    return false
  }

  // ConnectionHandle.close(reason): what is queued goes out, then the connection ends.
  #closeByApplication (sc: ServerConnection, reason: string | undefined): void {
    const connection = sc.connection
    if (connection.isClosed) return
    if (reason !== undefined) this.#log.info(`closing ${sc.remoteAddress}: ${reason}`, { protocol: this.#protocol.name, remote: sc.remoteAddress })
    sc.requestClose(-1)
    connection.endAfterFlush(new RpcError(ErrorCode.CONNECTION_CLOSED, reason === undefined ? 'closed by the server' : `closed by the server: ${reason}`))
  }

  #limitCounters (): LimitCounters {
    const s = this.#stats
    return {
      idleClosed: s.idleClosed,
      frameTimeouts: s.frameTimeouts,
      inboundBudgetClosed: this.#inbound.closedConnections,
      outboundPauses: this.#outbound.pauses,
      connectionsRefused: s.connectionsRefused,
      connectionsEvicted: s.connectionsEvicted,
      negotiatingEvicted: s.negotiatingEvicted,
      acceptErrors: s.acceptErrors,
      descriptorsExhausted: s.descriptorsExhausted,
      pushesSent: s.pushesSent,
      pushHardLimitClosed: s.pushHardLimitClosed,
      pushSoftLimitClosed: s.pushSoftLimitClosed,
      slowFramesClosed: s.slowFramesClosed
    }
  }

  /** The limits in force (defaults resolved), as `nyala serve` reports them. */
  limits (): { maxConnections: number, maxNegotiatingConnections: number, maxInboundBufferedBytes: number, maxOutboundBufferedBytes: number } {
    return {
      maxConnections: this.#maxConnections,
      maxNegotiatingConnections: this.#maxNegotiating,
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
    const closed = new Promise<void>((resolve) => {
      const graceMs = options.graceMs ?? 30_000
      const startedAt = this.#clock.now()
      this.#net.close(() => resolve())
      if (this.#idleTimer !== null) this.#clock.clearTimer(this.#idleTimer)
      this.#idleTimer = null
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
        this.#drained = null
        for (const sc of [...this.#connections]) {
          if (flush) sc.connection.endAfterFlush()
          else sc.connection.flushAndDestroy()
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
        this.#drained = () => {
          this.#drained = null
          setImmediate(() => setImmediate(() => finish()))
        }
        this.#maybeDrained()
      })
    })
    const executors = this.#dispatch.executors.filter(e => e.close !== undefined)
    this.#closing = executors.length === 0
      ? closed
      : closed.then(() => Promise.all(executors.map(e => e.close!()))).then(() => undefined)
    return this.#closing
  }

  #maybeDrained (): void {
    if (this.#drained === null) return
    for (const sc of this.#connections) if (sc.inFlight.size > 0) return
    this.#drained()
  }

  #onAccept (accepted: Socket): void {
    if (this.#closing !== null) {
      accepted.destroy()
      return
    }
    if (!this.#admit(accepted)) return
    this.#stats.connectionsAccepted++
    const remoteAddress = `${accepted.remoteAddress ?? '?'}:${accepted.remotePort ?? 0}`
    let secure: TLSSocket | null
    try {
      // node:tls may throw: the connection goes, the server stays.
      // TLS sockets read through 'data' events (onread applies to raw TCP handles only).
      secure = this.#secureContext === null ? null : this.#tlsSocket(accepted, this.#secureContext)
    } catch (err) {
      accepted.destroy()
      this.#setUpFailed(remoteAddress, err)
      return
    }
    const reader = secure === null ? new SocketReader() : undefined
    const socket = secure ?? readThrough(accepted, reader!)
    const connection = new Connection(socket, {
      reader: socket === accepted || secure !== null ? undefined : reader,
      framing: this.#protocol.framing,
      maxFrameBytes: this.#options.maxMessageBytes,
      maxOutboundBytes: this.#options.maxOutboundBytes,
      busyPoller: this.#poller,
      inboundBudget: this.#inbound,
      onBackedUp: () => this.#outbound.watch(connection)
    })
    const sc = new ServerConnection(connection, remoteAddress, this.#clock.now(), this.#dispatch)
    const handle = new ServerConnectionHandle(this.#pushHost, sc)
    sc.handle = handle
    try {
      // The protocol's code may throw: the connection goes, the server stays.
      sc.state = this.#connectionState(remoteAddress, handle)
      sc.setPeer('', handle)
    } catch (err) {
      connection.destroy()
      this.#setUpFailed(remoteAddress, err)
      return
    }
    const maxAgeMs = this.#options.maxConnectionAgeMs ?? 0
    // Jitter keeps connections opened together from all reconnecting together.
    if (maxAgeMs > 0) sc.retireAt = sc.lastActiveAt + maxAgeMs * (0.9 + 0.2 * Math.random())
    this.#connections.add(sc)
    const dispatch = this.#dispatch
    connection.attach({
      onFrame: (buf, start, end) => dispatch.onFrame(sc, buf, start, end),
      onFramingError: (error) => dispatch.framingError(sc, error),
      onClose: (error) => this.#onClose(sc, error)
    })
    if (secure !== null) this.#tlsHandshake(sc, secure)
    else this.#setUp(sc, remoteAddress)
  }

  // The protocol's connectionState or node:tls threw for a new connection (already closed): counted and logged.
  #setUpFailed (remoteAddress: string, err: unknown): void {
    this.#stats.acceptErrors++
    this.#logAcceptError.log(this.#error, () => `cannot set up the connection from ${remoteAddress}: ${(err as Error).message}; closing it`,
      () => ({ protocol: this.#protocol.name, remote: remoteAddress }))
  }

  #tlsSocket (accepted: Socket, secureContext: SecureContext): TLSSocket {
    const tls = this.#options.tls!
    // The accepted socket is paused (pauseOnConnect): the TLS socket takes its handle before any byte is read.
    const socket = new TLSSocket(accepted, {
      isServer: true, secureContext, requestCert: tls.requestCert === true, rejectUnauthorized: tls.rejectUnauthorized !== false,
      ALPNProtocols: tls.ALPNProtocols, SNICallback: tls.SNICallback
    })
    // A client's renegotiation is a TLS error (closing the connection), not CPU spent on new handshakes.
    socket.disableRenegotiation()
    return socket
  }

  // The TLS handshake of an accepted connection, bounded by
  // tlsHandshakeTimeoutMs; the protocol's set-up follows it. The connection
  // counts as negotiating meanwhile (admission, eviction, close()).
  #tlsHandshake (sc: ServerConnection, socket: TLSSocket): void {
    this.#negotiating.add(sc)
    const remoteAddress = sc.remoteAddress
    const connection = sc.connection
    const tls = this.#options.tls!
    const timeoutMs = this.#options.tlsHandshakeTimeoutMs ?? DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS
    const failed = (why: string, code: string | undefined): void => {
      this.#stats.tlsHandshakeFailures++
      this.#logTlsFailed!.log(this.#warn, () => `TLS handshake with ${remoteAddress} failed: ${why}; closing the connection`,
        () => ({ protocol: this.#protocol.name, remote: remoteAddress, code }))
    }
    const onError = (err: NodeJS.ErrnoException): void => { failed(err.message.split('\n')[0]!, err.code) }
    const done = (): void => {
      this.#clock.clearTimer(timer)
      socket.off('error', onError)
      socket.off('close', done)
    }
    const timer = this.#clock.setTimer(() => {
      done()
      if (sc.closedAt >= 0) return
      this.#stats.tlsHandshakeTimeouts++
      this.#logTlsFailed!.log(this.#warn, () => `TLS handshake with ${remoteAddress} not done after ${timeoutMs} ms; closing the connection`,
        () => ({ protocol: this.#protocol.name, remote: remoteAddress, tlsHandshakeTimeoutMs: timeoutMs }))
      connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `TLS handshake with ${remoteAddress} timed out after ${timeoutMs} ms`))
    }, timeoutMs)
    socket.on('error', onError)
    socket.once('close', done)
    // A TLS socket made outside tls.Server reports TLS errors after the
    // handshake (bad records, alerts, renegotiation) only as '_tlsError'
    // until its control is released: each one closes the connection.
    socket.on('_tlsError', (err: Error) => {
      if (sc.closedAt >= 0 || connection.isClosed) return
      const why = err.message.split('\n')[0]!
      this.#stats.badFrames++
      this.#logBadData.log(this.#warn, () => `received bad data from ${remoteAddress}: TLS: ${why}; closing the connection`,
        () => ({ protocol: this.#protocol.name, remote: remoteAddress, code: (err as NodeJS.ErrnoException).code }))
      connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `TLS: ${why}`, { cause: err }))
    })
    socket.once('secure', () => {
      done()
      if (sc.closedAt >= 0) return
      let user = ''
      if (tls.requestCert === true) {
        // What tls.Server checks after the handshake: OpenSSL's verdict on the client's certificate.
        const verify = (socket as unknown as { _handle?: { verifyError?: () => Error | null } | null })._handle?.verifyError
        const verifyError = typeof verify === 'function' ? verify.call((socket as unknown as { _handle: unknown })._handle) : new Error('cannot check the client certificate')
        if (verifyError !== null && verifyError !== undefined) {
          if (tls.rejectUnauthorized !== false) {
            failed(`client certificate refused: ${verifyError.message}`, (verifyError as NodeJS.ErrnoException).code)
            connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `TLS client certificate of ${remoteAddress} refused: ${verifyError.message}`))
            return
          }
        } else {
          // Only a verified certificate names the user.
          const cn = socket.getPeerCertificate().subject?.CN as string | string[] | undefined
          user = (Array.isArray(cn) ? cn[0] : cn) ?? ''
        }
      }
      // As tls.Server does once the client is accepted: later TLS errors are 'error' events too.
      (socket as unknown as { _releaseControl?: () => void })._releaseControl?.()
      this.#negotiating.delete(sc)
      if (user !== '') sc.setPeer(user, sc.handle!)
      this.#setUp(sc, remoteAddress)
    })
  }

  // The protocol's set-up of a new connection (none: ready at once).
  #setUp (sc: ServerConnection, remoteAddress: string): void {
    const connection = sc.connection
    const setUp = this.#protocol.handshake
    if (setUp === undefined) {
      sc.ready = true
      return
    }
    this.#negotiating.add(sc)
    const protocolHandshake = setUp(remoteAddress, sc.handle!)
    const handshake: Handshake<{ user?: string }> = {
      ...protocolHandshake,
      maxFrameBytes: Math.min(protocolHandshake.maxFrameBytes ?? Infinity, this.#options.maxNegotiationBytes ?? DEFAULT_MAX_NEGOTIATION_BYTES),
      onFrame: (frame) => {
        const step = protocolHandshake.onFrame(frame)
        const record = (s: Awaited<typeof step>): typeof s => {
          if (s.done !== undefined) {
            sc.ready = true
            sc.setPeer(s.done.user ?? sc.peer.user, sc.handle!)
            this.#negotiating.delete(sc)
          }
          return s
        }
        return step instanceof Promise ? step.then(record) : record(step)
      }
    }
    const timer = this.#clock.setTimer(() => {
      connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `negotiation with ${remoteAddress} timed out after ${this.#options.negotiationTimeoutMs} ms`))
    }, this.#options.negotiationTimeoutMs)
    connection.handshake(handshake).then(() => {
      this.#clock.clearTimer(timer)
    }, (error: RpcError) => {
      this.#clock.clearTimer(timer)
      const fields = { protocol: this.#protocol.name, remote: remoteAddress, code: error.code }
      // A peer that hangs up before set-up (a port probe, a health check) is no fault of anyone's.
      if (error.code === ErrorCode.CONNECTION_CLOSED) this.#log.info(`negotiation with ${remoteAddress} failed: ${error.message}`, fields)
      else this.#logNegotiationFailed.log(this.#warn, () => `negotiation with ${remoteAddress} failed: ${error.message}`, () => fields)
    })
  }

  // Makes room for a new connection, or refuses it (false: destroyed).
  #admit (accepted: Socket): boolean {
    // The oldest negotiating connection has had the longest to finish.
    if (this.#negotiating.size >= this.#maxNegotiating) this.#evictNegotiating(`${this.#negotiating.size} connections negotiating (the limit)`)
    if (this.#connections.size < this.#maxConnections) return true
    const now = this.#clock.now()
    const victim = longestIdle(this.#connections, now)
    if (victim !== null) {
      this.#stats.connectionsEvicted++
      this.#logEvicted.log(this.#warn, () => `${this.#connections.size} connections open (the limit): closing ${victim.remoteAddress}, idle ${Math.round(now - victim.idleSince)} ms, for a new one`,
        () => ({ protocol: this.#protocol.name, remote: victim.remoteAddress, idleMs: Math.round(now - victim.idleSince), connectionsOpen: this.#connections.size, maxConnections: this.#maxConnections }))
      victim.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed: idle longest when the server was at its connection limit'))
      return true
    }
    // None idle: one trickling a frame (never idle, so slowloris) makes room, the slowest first.
    const slow = slowestFrame(this.#connections, (sc) => sc.inFlight.size === 0 ? this.#frameProgress(sc, now) : null, this.#minFrameRate)
    if (slow !== null) {
      const progress = this.#frameProgress(slow, now)!
      this.#stats.connectionsEvicted++
      this.#stats.slowFramesClosed++
      this.#logEvicted.log(this.#warn, () => `${this.#connections.size} connections open (the limit): closing ${slow.remoteAddress}, ${progress.bytes} bytes of a frame in ${Math.round(progress.arrivingMs)} ms (below ${this.#minFrameRate} bytes/s), for a new one`,
        () => ({ protocol: this.#protocol.name, remote: slow.remoteAddress, frameBytes: progress.bytes, arrivingMs: Math.round(progress.arrivingMs), connectionsOpen: this.#connections.size, maxConnections: this.#maxConnections }))
      slow.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed: its frame arrived slowest when the server was at its connection limit'))
      return true
    }
    // None idle: a connection still negotiating (silent ones are cheap to
    // open) makes room, the oldest first, rather than locking newcomers out.
    if (this.#negotiating.size > 0) {
      this.#evictNegotiating(`${this.#connections.size} connections open (the limit) and none idle`)
      return true
    }
    this.#stats.connectionsRefused++
    this.#logRefused.log(this.#warn, () => `refusing a connection from ${accepted.remoteAddress ?? '?'}: ${this.#connections.size} connections open (the limit) and none idle for ${MIN_EVICTABLE_IDLE_MS} ms nor trickling a frame`,
      () => ({ protocol: this.#protocol.name, remote: `${accepted.remoteAddress ?? '?'}:${accepted.remotePort ?? 0}`, connectionsOpen: this.#connections.size, maxConnections: this.#maxConnections }))
    accepted.destroy()
    return false
  }

  #evictNegotiating (why: string): void {
    const oldest = this.#negotiating.values().next().value!
    this.#stats.negotiatingEvicted++
    this.#logNegotiatingEvicted.log(this.#warn, () => `${why}: closing the oldest negotiating connection, from ${oldest.remoteAddress}, for a new one`,
      () => ({ protocol: this.#protocol.name, remote: oldest.remoteAddress, negotiating: this.#negotiating.size, maxNegotiating: this.#maxNegotiating }))
    oldest.connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, 'closed: too many connections negotiating'))
  }

  // The protocol's own state for a new connection (undefined without a connectionState hook).
  #connectionState (remoteAddress: string, handle: ServerConnectionHandle): unknown {
    const make = this.#protocol.connectionState
    return make === undefined ? undefined : make(remoteAddress, handle)
  }

  #onClose (sc: ServerConnection, error: RpcError | undefined): void {
    this.#connections.delete(sc)
    this.#negotiating.delete(sc)
    sc.closedAt = this.#clock.now()
    if (this.#connections.size === 0) this.#onLastClose?.()
    // A frame the decoder refused at its prefix is a bad frame too.
    if (error?.code === ErrorCode.MALFORMED_FRAME && !sc.badFrame) {
      this.#stats.badFrames++
      this.#logBadData.log(this.#warn, () => `received bad data from ${sc.remoteAddress}: ${error.message}; closing the connection`, () => ({ protocol: this.#protocol.name, remote: sc.remoteAddress, code: error.code }))
    }
    if (this.#overSoft.size > 0) this.#overSoft.delete(sc)
    this.#dispatch.connectionClosed(sc, error)
    sc.handle?.connectionClosed(error)
    this.#maybeDrained()
  }

  // One periodic scan closes idle connections and frames that take too
  // long, retires old connections, and abandons overdue handlers.
  #armIdleScan (): void {
    const idleMs = this.#options.idleTimeoutMs
    const maxAgeMs = this.#options.maxConnectionAgeMs ?? 0
    const frameMs = this.#options.frameTimeoutMs ?? DEFAULT_FRAME_TIMEOUT_MS
    const abandonMs = this.#dispatch.shortestAbandonMs
    this.#abandoning = abandonMs !== Infinity
    const positive = (ms: number): number => ms > 0 ? ms : Infinity
    const softMs = this.#pushLimit.softBytes > 0 ? Math.max(this.#pushLimit.softMs, 40) : Infinity
    // The frame rate needs the scan to see partial frames (for admission too): at most a second apart.
    const rateMs = this.#minFrameRate > 0 ? Math.max(this.#slowFrameGraceMs, 4 * MIN_EVICTABLE_IDLE_MS) : Infinity
    const shortest = Math.min(positive(idleMs), positive(maxAgeMs), positive(frameMs), abandonMs, softMs, rateMs)
    if (shortest === Infinity || this.#idleTimer !== null) return
    const periodMs = Math.max(10, Math.min(1000, shortest / 4))
    let lastScanAt = this.#clock.now()
    const scan = (): void => {
      this.#idleTimer = this.#clock.setTimer(scan, periodMs)
      const now = this.#clock.now()
      // A scan late by more than a period ran after an event-loop stall,
      // before the reads that waited meanwhile: it judges no frame's rate.
      const onTime = now - lastScanAt <= 2 * periodMs
      lastScanAt = now
      if (this.#abandoning) this.#dispatch.abandonOverdue(now)
      // Over the soft push limit: closed once there for softMs, forgotten once below (pushes may have stopped).
      if (this.#overSoft.size > 0) for (const sc of [...this.#overSoft]) this.#judgePushed(sc, now)
      this.#checkDescriptors()
      for (const sc of this.#connections) {
        const connection = sc.connection
        if (this.#partialFrameTimed(sc, now)) {
          if (frameMs > 0 && this.#frameOverdue(sc, now, frameMs)) continue
          if (onTime && this.#frameTooSlow(sc, now)) continue
        }
        const activity = connection.activity
        // Progress is a read, a send, a drain, or the kernel taking some of
        // what waits to go out. A peer stopped inside a frame makes none.
        const outbound = connection.outboundBytes + connection.writeQueueBytes
        if (activity !== sc.lastActivity || outbound !== sc.lastOutbound || sc.inFlight.size > 0) {
          sc.lastActivity = activity
          sc.lastOutbound = outbound
          sc.lastActiveAt = now
          if (sc.retiredAt >= 0 && sc.inFlight.size === 0 && !connection.isBusy && !connection.hasPartialFrame && now - sc.retiredAt >= RETIRED_BUSY_LIMIT_MS) this.#closeAged(sc)
          else if (sc.retiredAt < 0 && now >= sc.retireAt && sc.ready) sc.retiredAt = now
          continue
        }
        if (sc.retiredAt >= 0) {
          if (now - sc.lastActiveAt >= RETIRED_QUIET_MS) this.#closeAged(sc)
        } else if (now >= sc.retireAt && sc.ready) {
          sc.retiredAt = now
        } else if (idleMs > 0 && sc.ready && now - sc.lastActiveAt >= idleMs) {
          this.#stats.idleClosed++
          const inFrame = connection.hasPartialFrame ? ', stopped inside a frame' : ''
          this.#log.info(`closing idle connection from ${sc.remoteAddress} after ${idleMs} ms without progress${inFrame}`, { protocol: this.#protocol.name, remote: sc.remoteAddress, idleMs, inFrame: connection.hasPartialFrame })
          connection.destroy()
        }
      }
    }
    this.#idleTimer = this.#clock.setTimer(scan, periodMs)
  }

  // Counts open descriptors off the loop (once per scan, never two counts at
  // once): at the limit, libuv drops new connections without telling us.
  #checkDescriptors (): void {
    const limit = this.#fdLimit
    if (limit === undefined || this.#countingFds) return
    this.#countingFds = true
    countOpenDescriptors((open) => {
      this.#countingFds = false
      if (open === undefined || open < limit - DESCRIPTOR_SLACK) return
      this.#stats.descriptorsExhausted++
      this.#logAcceptError.log(this.#error, () => `out of file descriptors: ${open === Infinity ? limit : open} of ${limit} open (${this.#connections.size} connections, limit ${this.#maxConnections}); new connections are dropped until some close (lower --max-connections or raise ulimit -n)`,
        () => ({ protocol: this.#protocol.name, code: 'EMFILE', descriptorsOpen: open === Infinity ? limit : open, descriptorLimit: limit, connectionsOpen: this.#connections.size, maxConnections: this.#maxConnections }))
    })
  }

  // Follows the frame the connection is receiving (seen by the scan): true
  // when one has been seen arriving since an earlier scan, with the server
  // reading it; its clock starts when a scan first sees it.
  #partialFrameTimed (sc: ServerConnection, now: number): boolean {
    const connection = sc.connection
    if (!connection.hasPartialFrame) {
      sc.partialSince = -1
      return false
    }
    if (connection.isReadingPaused || connection.isReadingHeld) {
      // We stopped reading it (outbound budget): the rest of its frame cannot arrive; its clock restarts.
      sc.partialSince = now
      return false
    }
    const frame = connection.framesRead
    if (sc.partialSince < 0 || sc.partialFrame !== frame) {
      sc.partialFrame = frame
      sc.partialSince = now
      return false
    }
    return true
  }

  // The frame in progress as the scans saw it (null: none, or not being read).
  #frameProgress (sc: ServerConnection, now: number): FrameProgress | null {
    const connection = sc.connection
    if (sc.partialSince < 0 || !connection.hasPartialFrame || sc.partialFrame !== connection.framesRead) return null
    if (connection.isReadingPaused || connection.isReadingHeld) return null
    return { bytes: connection.partialFrameBytes, arrivingMs: now - sc.partialSince }
  }

  // Closes the connection when its frame in progress arrives below
  // minFrameBytesPerSecond past slowFrameGraceMs.
  #frameTooSlow (sc: ServerConnection, now: number): boolean {
    const rate = this.#minFrameRate
    if (rate <= 0) return false
    const bytes = sc.connection.partialFrameBytes
    const arrivingMs = now - sc.partialSince
    if (!isSlowFrame(bytes, arrivingMs, this.#slowFrameGraceMs, rate)) return false
    this.#stats.slowFramesClosed++
    const ms = Math.round(arrivingMs)
    this.#logSlowFrame.log(this.#warn, () => `closing ${sc.remoteAddress}: ${bytes} bytes of a frame in ${ms} ms, below ${rate} bytes/s past ${this.#slowFrameGraceMs} ms`,
      () => ({ protocol: this.#protocol.name, remote: sc.remoteAddress, frameBytes: bytes, arrivingMs: ms, minFrameBytesPerSecond: rate }))
    sc.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `frame arriving below ${rate} bytes/s`))
    return true
  }

  // Closes the connection when the frame it is receiving started arriving
  // `frameMs` ago (seen by the scan; at most a scan period late).
  #frameOverdue (sc: ServerConnection, now: number, frameMs: number): boolean {
    const connection = sc.connection
    if (now - sc.partialSince < frameMs) return false
    this.#stats.frameTimeouts++
    const arrivingMs = Math.round(now - sc.partialSince)
    this.#logFrameTimeout.log(this.#warn, () => `closing ${sc.remoteAddress}: a frame has been arriving for ${arrivingMs} ms (frame timeout ${frameMs} ms)`,
      () => ({ protocol: this.#protocol.name, remote: sc.remoteAddress, arrivingMs, frameTimeoutMs: frameMs }))
    connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `frame not complete within ${frameMs} ms`))
    return true
  }

  #closeAged (sc: ServerConnection): void {
    this.#stats.agedClosed++
    this.#log.info(`closing ${sc.remoteAddress}: it reached its maximum age of ${this.#options.maxConnectionAgeMs} ms`, { protocol: this.#protocol.name, remote: sc.remoteAddress, maxConnectionAgeMs: this.#options.maxConnectionAgeMs })
    sc.connection.destroy()
  }
}

/** Node's words for the errors a listen meets most. */
const LISTEN_ERRORS: Record<string, string> = {
  EADDRINUSE: 'address already in use',
  EACCES: 'permission denied',
  EADDRNOTAVAIL: 'address not available on this host',
  ENOTFOUND: 'host name not found',
  EAI_AGAIN: 'host name lookup failed for now',
  EINVAL: 'invalid address'
}

/**
 * `listen` could not bind its socket: `code` is the errno code
 * (EADDRINUSE, EACCES, ...), `host` and `port` what was asked for, `cause`
 * node's own error. The message is one line: `cannot listen on
 * 127.0.0.1:7050: address already in use (EADDRINUSE)`.
 */
export class ListenError extends Error {
  readonly code: string
  readonly host: string
  readonly port: number
  readonly syscall: string | undefined

  constructor (cause: NodeJS.ErrnoException, host: string, port: number) {
    const code = cause.code ?? 'UNKNOWN'
    const where = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`
    super(`cannot listen on ${where}: ${LISTEN_ERRORS[code] ?? cause.message} (${code})`, { cause })
    this.name = 'ListenError'
    this.code = code
    this.host = host
    this.port = port
    this.syscall = cause.syscall
  }
}

// The options each accepted connection's TLSSocket takes beyond the secure context, checked once.
function checkAcceptOptions (tls: TlsOptions): void {
  const alpn = tls.ALPNProtocols
  if (alpn !== undefined) {
    const names: unknown[] = Array.isArray(alpn) ? alpn : [alpn]
    // A single buffer is the wire format already; an array lists names of 1 to 255 bytes.
    const ok = Array.isArray(alpn)
      ? names.every(n => (typeof n === 'string' || ArrayBuffer.isView(n)) && Buffer.byteLength(n as string) >= 1 && Buffer.byteLength(n as string) <= 255)
      : ArrayBuffer.isView(alpn)
    if (!ok) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.ALPNProtocols must be an array of protocol names (strings or buffers of 1 to 255 bytes) or a buffer')
  }
  if (tls.SNICallback !== undefined && typeof tls.SNICallback !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.SNICallback must be a function')
}

function nonNegative (value: number, name: string): number {
  if (!(Number.isFinite(value) && value >= 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be a number of at least 0, got ${value}`)
  return value
}

function atLeastOne (value: number, name: string): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be an integer of at least 1, got ${value}`)
  return value
}

