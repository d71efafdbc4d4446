import { createServer, type Server as NetServer, type Socket } from 'node:net'
import type { AddressInfo } from 'node:net'
import { ErrorCode, KrpcCode, RpcError } from '../codec/errors.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from '../codec/frame-decoder.js'
import { RequestParts, encodeErrorFrame, encodeResponseFrame, krpcFraming, parseRequestInto, responseFrameBytes, writeResponseFrame, writeResponseFrameHead, type RequestHeader } from '../codec/krpc.js'
import { PREAMBLE_BYTES, RpcFeature, ServerNegotiation, checkPreamble, type Authenticator, type Negotiated } from '../codec/negotiation.js'
import type { Message, MethodDef, MethodMap, ServiceDef } from '../codec/schema.js'
import { realClock, type Clock, type TimerHandle } from '../scheduling/clock.js'
import { SocketReader, readThrough } from '../transport/socket-reader.js'
import { BusyPoller } from '../transport/busy-poll.js'
import { Connection, type ConnectionStats, type Handshake } from '../transport/connection.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { ServiceDispatcher } from './dispatcher.js'
import { InboundCall, type CallContext, type CallPeer, type CallRoute } from './inbound-call.js'
import { ThreadCall, ThreadPool, type HandlerModule, type ThreadPoolStats, type ThreadResult } from './thread-pool.js'
import { ServerMetrics, type LimitCounters, type MethodMetrics } from './metrics.js'
import { RateLimitedLog, type Logger, silentLogger } from './logger.js'
import { CallTable } from './call-table.js'
import { InboundBudget, DEFAULT_MAX_INBOUND_BUFFERED_BYTES } from '../transport/inbound-budget.js'
import { OutboundBudget, DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES } from './outbound-budget.js'
import { DEFAULT_MAX_NEGOTIATING_CONNECTIONS, MIN_EVICTABLE_IDLE_MS, countOpenDescriptors, defaultMaxConnections, descriptorLimit, longestIdle, type AdmissionCandidate } from './admission.js'

/** A method's implementation. It may return the response or a promise of it; a throw becomes ERROR_APPLICATION. */
export type Handler<Req, Res> = (request: Req, ctx: CallContext) => Res | Promise<Res>

/** One handler per method of the service. */
export type ServiceHandlers<M extends MethodMap> = { [K in keyof M & string]: Handler<M[K]['request'], M[K]['response']> }

export interface ServerOptions {
  /** Largest inbound frame, checked at its length prefix; default 50 MiB. */
  maxMessageBytes?: number
  /** Deadline for a new connection's negotiation; default 3000 ms. */
  negotiationTimeoutMs?: number
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
   * Budget for bytes held in incomplete inbound frames over all connections
   * of this server (default 256 MiB): past it, the connection holding the
   * largest incomplete frame is closed (FRAME_TOO_LARGE).
   */
  maxInboundBufferedBytes?: number
  /** Bound on a connection's unsent response bytes (default 100 MiB); a client that reads slower than that is disconnected. */
  maxOutboundBytes?: number
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
  /** Largest negotiation frame (default 1 MiB), checked at its length prefix. */
  maxNegotiationBytes?: number
  /**
   * A handler still running this long after its call's deadline, or after
   * its connection closed, gives its worker back (default 5000 ms; 0
   * disables): its result is dropped and it is counted as abandoned. Per
   * service with `AddServiceOptions.abandonAfterMs`. In-loop handlers only
   * (a thread-mode call holds its thread until it returns).
   */
  abandonAfterMs?: number
  /** Abandoned handlers still running, per service, past which no more are abandoned (their workers stay held, so the service answers TOO_BUSY); default 100. */
  maxAbandonedHandlers?: number
  /**
   * Connections older than this (±10 % jitter) are retired, so long-lived
   * clients rebalance across reactors (gRPC's MAX_CONNECTION_AGE): calls in
   * flight are answered, calls arriving later get FATAL_SERVER_SHUTTING_DOWN
   * (clients retry them on a new connection), and the connection closes once
   * it is quiet. Default: no limit. See docs/cluster.md.
   */
  maxConnectionAgeMs?: number
  /** SASL PLAIN verification; by default any user is accepted. */
  authenticate?: Authenticator
  /** Until `markReady()`, calls get ERROR_UNAVAILABLE instead of ERROR_NO_SUCH_SERVICE; default true (ready at once). */
  ready?: boolean
  /**
   * `pool` (default): each service's calls go through its deadline-ordered
   * service queue to LIFO-parked workers (issue 3). `direct`: every handler
   * runs at once, unbounded (for comparison; no queue, no TOO_BUSY).
   */
  scheduler?: 'pool' | 'direct'
  /** Workers (concurrent handlers) per service; default 10. */
  workers?: number
  /** Bound of each service's queue; default 50. */
  queueLength?: number
  /** `edf` (default): earliest deadline first, a full queue evicts the latest deadline. `fifo`: arrival order, a full queue refuses the newcomer. */
  queue?: QueueDiscipline
  /**
   * Calls per service held back while a burst is absorbed (default 4096):
   * past it, newcomers are judged by the queue at once (TOO_BUSY or
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
  logger?: Logger
}

export interface AddServiceOptions {
  /** Application feature flags this service supports (`required_feature_flags` outside this set are refused). */
  supportedFeatureFlags?: readonly number[]
  /** Overrides the server's `workers` for this service. */
  workers?: number
  /** Overrides the server's `queueLength` for this service. */
  queueLength?: number
  /** Overrides the server's `queue` discipline for this service. */
  queue?: QueueDiscipline
  /** Overrides the server's `abandonAfterMs` for this service. */
  abandonAfterMs?: number
  /** Overrides the server's `maxAbandonedHandlers` for this service. */
  maxAbandonedHandlers?: number
  /**
   * Worker-thread mode (issue 3): the handlers run in this many
   * `worker_threads` threads, each loading the module given in place of the
   * handler object. The threads are the service's workers (`workers` is
   * ignored): same queue, LIFO parking and hand-off. Always pooled, also
   * under `scheduler: 'direct'`. See docs/threads.md.
   */
  threads?: number
  /**
   * Thread mode: calls a thread may hold at once, default 1. With k > 1 the
   * pool has threads x k workers, and a busy thread finds its next call
   * already waiting instead of sleeping between calls (much cheaper per call
   * for short handlers), at the price of that call waiting behind the
   * current one. See docs/threads.md.
   */
  callsPerThread?: number
}

/** `addService` options of a thread-mode service. */
export type ThreadServiceOptions = AddServiceOptions & { threads: number }

export type { HandlerModule, ThreadPoolStats }

interface RegisteredService {
  def: ServiceDef
  handlers: Record<string, Handler<Message, Message>>
  featureFlags: ReadonlySet<number>
  metrics: ReadonlyMap<string, MethodMetrics>
  /** null in `direct` mode. */
  dispatcher: ServiceDispatcher | null
  /** The service's threads in thread mode; else null. */
  threads: ThreadPool | null
  /** A handler running this long past its deadline (or its connection's close) is abandoned; 0: never. */
  abandonAfterMs: number
  maxAbandoned: number
  /** Abandoned handlers that have not settled yet. */
  abandoned: number
}

/** A method a request named, resolved to what runs it; cached per RemoteMethod object. */
interface Route extends CallRoute {
  readonly handler: Handler<Message, Message>
  readonly service: RegisteredService
  readonly methodDef: MethodDef<Message, Message>
}

// Routes remembered by the identity of the codec's shared RemoteMethod
// objects (one per distinct method on the wire), so a request finds its
// handler and metrics without string lookups.
const ROUTE_CACHE_SIZE = 8
// The body of a flat response, written into its frame from the message itself.
const NO_BODY = new Uint8Array(0)

type RemoteMethod = NonNullable<RequestHeader['remote_method']>

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
}

const DEFAULT_NEGOTIATION_TIMEOUT_MS = 3000
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
/** Thread mode: a burst is held while some thread finishes a call at least this often (see ServiceDispatcher). */
const THREAD_HOLD_WINDOW_MS = 10
/**
 * A retired connection closes once it has been quiet this long: its client
 * stopped using it (the nyala client does on the first FATAL answer), so a
 * call crossing the close on the wire is unlikely.
 */
const RETIRED_QUIET_MS = 1000
/** A retired connection whose client keeps sending (each call answered FATAL) closes this long after retirement, between calls. */
const RETIRED_BUSY_LIMIT_MS = 5000

/** Per-connection state of the server. */
class ServerConnection implements AdmissionCandidate {
  readonly connection: Connection
  readonly remoteAddress: string
  readonly inFlight = new CallTable<InboundCall>()
  negotiated: Negotiated | null = null
  /** Closed by #badFrame (already counted). */
  badFrame = false
  lastActivity = -1
  lastOutbound = 0
  lastActiveAt: number
  /** The incomplete frame the idle scan saw (by `framesRead`) and since when; -1: none. */
  partialFrame = -1
  partialSince = -1
  /** When the connection closed; -1 while open. */
  closedAt = -1
  /** When the connection reaches its maximum age; Infinity without one. */
  retireAt = Number.POSITIVE_INFINITY
  /** Since when new calls are refused (the connection is past its age); -1 before. */
  retiredAt = -1

  constructor (connection: Connection, remoteAddress: string, now: number) {
    this.connection = connection
    this.remoteAddress = remoteAddress
    this.lastActiveAt = now
    this.peer = Object.freeze({ user: '', remoteAddress })
  }

  /** Who its calls come from: a small object of its own, so a kept call context does not keep the connection. */
  peer: CallPeer

  /** Negotiated, nothing in flight or unsent, and no activity since the last idle scan. */
  get quiet (): boolean {
    return this.negotiated !== null && this.inFlight.size === 0 && !this.connection.isBusy && this.connection.activity === this.lastActivity
  }

  get idleSince (): number {
    return this.lastActiveAt
  }
}

/**
 * A KRPC server: accepts connections, negotiates them, decodes calls,
 * hands them to the scheduler and the handlers, and answers each call
 * exactly once (or closes its connection when the peer broke the protocol).
 */
export class Server {
  readonly #options: Required<Pick<ServerOptions, 'maxMessageBytes' | 'negotiationTimeoutMs' | 'idleTimeoutMs'>> & ServerOptions
  readonly #clock: Clock
  readonly #log: Logger
  readonly #direct: boolean
  /** Per-service and per-method metrics; `metrics.text()` is the Prometheus exposition. */
  readonly metrics = new ServerMetrics()
  readonly #services = new Map<string, RegisteredService>()
  readonly #connections = new Set<ServerConnection>()
  /** Connections still negotiating, oldest first. */
  readonly #negotiating = new Set<ServerConnection>()
  readonly #maxConnections: number
  readonly #maxNegotiating: number
  readonly #inbound: InboundBudget
  readonly #outbound: OutboundBudget
  /** Calls whose connection closed while their handler ran (abandonment watches them). */
  readonly #orphans = new Set<InboundCall>()
  /** Some service abandons overdue handlers. */
  #abandoning = false
  readonly #logRefused: RateLimitedLog
  readonly #logEvicted: RateLimitedLog
  readonly #logNegotiatingEvicted: RateLimitedLog
  readonly #logAcceptError: RateLimitedLog
  readonly #net: NetServer
  #ready: boolean
  #idleTimer: TimerHandle | null = null
  #closing: Promise<void> | null = null
  #drained: (() => void) | null = null
  /** While closing: called when the last connection has closed. */
  #onLastClose: (() => void) | null = null
  #stats = {
    connectionsAccepted: 0, callsReceived: 0, callsSucceeded: 0, callsFailed: 0, badFrames: 0, idleClosed: 0, agedClosed: 0,
    frameTimeouts: 0, connectionsRefused: 0, connectionsEvicted: 0, negotiatingEvicted: 0, acceptErrors: 0, descriptorsExhausted: 0, handlersAbandoned: 0
  }
  /** The process's descriptor limit (Linux), and whether a count of open descriptors is under way. */
  readonly #fdLimit = descriptorLimit()
  #countingFds = false
  readonly #run = (call: InboundCall, worker: number): Promise<void> | void => {
    call.worker = worker
    return this.#runHandler(call)
  }
  readonly #reject = (call: InboundCall, code: number, message: string): void => this.#respondError(call, code, message)
  readonly #threadPools: ThreadPool[] = []
  readonly #routeKeys: object[] = []
  readonly #routes: Route[] = []
  #routeNext = 0
  /** The call `#onFrame` is submitting, so a handler it starts at once takes its start time from #lastNow. */
  #submitting: InboundCall | null = null
  // One clock reading per read, not per frame: the frames of one read were
  // received together, at the read. #lastNow is the latest reading taken
  // while handling it (the read's, or the last call's settlement): the time
  // a call handed straight to a worker starts.
  readonly #poller: BusyPoller | undefined
  #stampConnection: ServerConnection | null = null
  #stampRead = -1
  #readAt = 0
  #lastNow = 0
  readonly #parts = new RequestParts()

  constructor (options: ServerOptions = {}) {
    this.#options = {
      ...options,
      maxMessageBytes: options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      negotiationTimeoutMs: options.negotiationTimeoutMs ?? DEFAULT_NEGOTIATION_TIMEOUT_MS,
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS
    }
    this.#clock = options.clock ?? realClock
    this.#log = options.logger ?? silentLogger
    this.#direct = options.scheduler === 'direct'
    this.#ready = options.ready ?? true
    this.#poller = (options.busyPollUs ?? 0) > 0 ? new BusyPoller(options.busyPollUs!) : undefined
    this.#maxConnections = atLeastOne(options.maxConnections ?? defaultMaxConnections(), 'maxConnections')
    // At most half the connections may be negotiating, so silent openers cannot take them all.
    this.#maxNegotiating = atLeastOne(options.maxNegotiatingConnections ?? Math.min(DEFAULT_MAX_NEGOTIATING_CONNECTIONS, Math.ceil(this.#maxConnections / 2)), 'maxNegotiatingConnections')
    const now = (): number => this.#clock.now()
    this.#logRefused = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logEvicted = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logNegotiatingEvicted = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#logAcceptError = new RateLimitedLog(LOG_INTERVAL_MS, now)
    const inboundLog = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#inbound = new InboundBudget(options.maxInboundBufferedBytes ?? DEFAULT_MAX_INBOUND_BUFFERED_BYTES, (_member, held) => {
      inboundLog.log(this.#log.warn, () => `closing a connection holding ${held} bytes of an incomplete frame: the inbound buffers of all connections passed their budget of ${this.#inbound.maxBytes} bytes`)
    })
    const outboundLog = new RateLimitedLog(LOG_INTERVAL_MS, now)
    this.#outbound = new OutboundBudget(options.maxOutboundBufferedBytes ?? DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES, this.#clock, (member, total) => {
      outboundLog.log(this.#log.warn, () => `not reading from a connection holding ${member.outboundBytes} unsent bytes: unsent responses total ${total} bytes, over the budget of ${this.#outbound.maxBytes}`)
    })
    this.metrics.limitCounters = () => this.#limitCounters()
    // Paused on accept: nothing is read before #onAccept moves the socket to
    // a SocketReader (see readThrough).
    this.#net = createServer({ noDelay: true, pauseOnConnect: true }, (socket) => this.#onAccept(socket))
    this.#net.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EMFILE' || err.code === 'ENFILE') {
        // Out of descriptors: libuv dropped the connection; accepting goes on once some are free.
        this.#stats.acceptErrors++
        this.#logAcceptError.log(this.#log.error, () => `accept failed: ${err.code} (out of file descriptors; ${this.#connections.size} connections open, limit ${this.#maxConnections})`)
        return
      }
      this.#log.error(`listener error: ${err.message}`)
    })
  }

  /**
   * Registers a service's handlers; the service is then served on every
   * connection. With `{ threads: N }` the second argument names a module
   * (`{ module, export?, serviceExport? }`) that each of N worker threads
   * loads; `listen()` then waits until every thread has loaded it.
   */
  addService<M extends MethodMap> (def: ServiceDef<M>, handlers: ServiceHandlers<M>, options?: AddServiceOptions): this
  addService<M extends MethodMap> (def: ServiceDef<M>, handlers: HandlerModule, options: ThreadServiceOptions): this
  addService<M extends MethodMap> (def: ServiceDef<M>, handlers: ServiceHandlers<M> | HandlerModule, options: AddServiceOptions = {}): this {
    if (this.#services.has(def.fullName)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `service ${def.fullName} is already registered`)
    const threaded = options.threads !== undefined
    const isModule = typeof (handlers as Partial<HandlerModule>).module === 'string' || (handlers as Partial<HandlerModule>).module instanceof URL
    if (threaded !== isModule) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, threaded
        ? `${def.fullName}: thread mode takes { module, export? } in place of the handler object`
        : `${def.fullName}: a handler module needs the threads option`)
    }
    if (!threaded) {
      for (const name of Object.keys(def.methods)) {
        if (typeof (handlers as Record<string, unknown>)[name] !== 'function') {
          throw new RpcError(ErrorCode.INVALID_ARGUMENT, `no handler for ${def.fullName}.${name}`)
        }
      }
    }
    const threads = threaded
      ? new ThreadPool({
        threads: options.threads!, callsPerThread: options.callsPerThread, handlers: handlers as HandlerModule,
        service: def.fullName, methods: Object.keys(def.methods), clock: this.#clock, logger: this.#log
      })
      : null
    const pooled = !this.#direct || threads !== null
    const workers = threads !== null ? threads.workers : options.workers ?? this.#options.workers ?? DEFAULT_WORKERS
    const queueLength = options.queueLength ?? this.#options.queueLength ?? DEFAULT_QUEUE_LENGTH
    const discipline = options.queue ?? this.#options.queue ?? 'edf'
    let dispatcher: ServiceDispatcher | null = null
    const metrics = this.metrics.addService(def.fullName, Object.keys(def.methods), {
      workers: pooled ? workers : 0,
      queueLength: () => dispatcher?.pool.queueLength ?? 0,
      idleWorkers: () => dispatcher?.pool.idleWorkers ?? 0
    })
    if (pooled) {
      const run = threads === null ? this.#run : (call: InboundCall, worker: number) => this.#runInThread(call as ThreadCall, worker, threads, dispatcher!)
      dispatcher = new ServiceDispatcher({
        workers, queueLength, discipline, clock: this.#clock, run, reject: this.#reject, metrics, burstLimit: this.#options.burstLimit,
        holdWindowMs: threads === null ? undefined : THREAD_HOLD_WINDOW_MS
      })
    }
    if (threads !== null) this.#threadPools.push(threads)
    this.#routeKeys.length = 0
    this.#routes.length = 0
    this.#services.set(def.fullName, {
      def: def as unknown as ServiceDef,
      // In thread mode the handlers live in the threads; every method is known here.
      handlers: threads === null
        ? handlers as unknown as Record<string, Handler<Message, Message>>
        : Object.fromEntries(Object.keys(def.methods).map(name => [name, inThread])),
      featureFlags: new Set(options.supportedFeatureFlags ?? []),
      metrics,
      dispatcher,
      threads,
      abandonAfterMs: threads !== null ? 0 : options.abandonAfterMs ?? this.#options.abandonAfterMs ?? DEFAULT_ABANDON_AFTER_MS,
      maxAbandoned: options.maxAbandonedHandlers ?? this.#options.maxAbandonedHandlers ?? DEFAULT_MAX_ABANDONED,
      abandoned: 0
    })
    return this
  }

  /** Counters of a thread-mode service's threads (per-thread handled calls, restarts); undefined for other services. */
  threadStats (service: string): ThreadPoolStats | undefined {
    return this.#services.get(service)?.threads?.stats()
  }

  /** Sets `maxConnectionAgeMs` (0 or less: no limit) for connections accepted from now on. */
  setMaxConnectionAgeMs (ms: number): void {
    this.#options.maxConnectionAgeMs = ms
    if (this.#net.listening) this.#armIdleScan()
  }

  /** Marks services as registered: unknown services now get ERROR_NO_SUCH_SERVICE rather than ERROR_UNAVAILABLE. */
  markReady (): void {
    this.#ready = true
  }

  /**
   * Starts listening; resolves with the bound address (the real port when
   * `port` is 0). Loopback by default. With thread-mode services, first waits
   * until their threads have loaded the handler module, and rejects if one
   * could not. `reusePort` (Node ≥ 22.12) binds this process's own socket
   * with SO_REUSEPORT, also in a cluster worker (see reactor/cluster.ts).
   */
  listen (port = 0, host = '127.0.0.1', options: { reusePort?: boolean } = {}): Promise<AddressInfo> {
    if (this.#threadPools.length > 0) {
      return Promise.all(this.#threadPools.map(pool => pool.ready)).then(() => this.#listen(port, host, options.reusePort === true))
    }
    return this.#listen(port, host, options.reusePort === true)
  }

  #listen (port: number, host: string, reusePort: boolean): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => reject(err)
      this.#net.once('error', onError)
      // `reusePort` is not in Node 20's types; `exclusive` keeps a cluster worker from sharing the primary's handle.
      const listenOptions = reusePort ? { port, host, backlog: 512, reusePort: true, exclusive: true } : { port, host, backlog: 512 }
      this.#net.listen(listenOptions, () => {
        this.#net.off('error', onError)
        this.#armIdleScan()
        resolve(this.#net.address() as AddressInfo)
      })
    })
  }

  /** The bound address, once listening. */
  address (): AddressInfo | null {
    return this.#net.address() as AddressInfo | null
  }

  stats (): ServerStats {
    let inFlight = 0
    for (const sc of this.#connections) inFlight += sc.inFlight.size
    let abandonedRunning = 0
    for (const service of this.#services.values()) abandonedRunning += service.abandoned
    return {
      ...this.#stats,
      connectionsOpen: this.#connections.size,
      callsInFlight: inFlight,
      inboundBudgetClosed: this.#inbound.closedConnections,
      outboundPauses: this.#outbound.pauses,
      abandonedRunning
    }
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
      descriptorsExhausted: s.descriptorsExhausted
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
   * Stops accepting, answers calls that arrive from now on with
   * FATAL_SERVER_SHUTTING_DOWN, lets calls in flight finish (up to `graceMs`,
   * default 30 s; then their signals abort and their connections close), and
   * resolves when every connection is closed (and worker threads, if any,
   * have been terminated). Once drained, each connection is ended after its
   * answers are flushed; a peer that does not read them cannot hold the
   * shutdown: when the grace period ends, every connection still open is
   * destroyed. So `close()` resolves by the end of the grace period,
   * whatever the peers do.
   */
  close (options: { graceMs?: number } = {}): Promise<void> {
    if (this.#closing !== null) return this.#closing
    this.#poller?.stop()
    const closed = new Promise<void>((resolve) => {
      const graceMs = options.graceMs ?? 30_000
      this.#net.close(() => resolve())
      if (this.#idleTimer !== null) this.#clock.clearTimer(this.#idleTimer)
      this.#idleTimer = null
      for (const sc of this.#connections) {
        if (sc.negotiated === null) sc.connection.destroy()
      }
      // Queued calls keep draining to workers within the grace period; those
      // left then get FATAL_SERVER_SHUTTING_DOWN (before connections close).
      for (const service of this.#services.values()) void service.dispatcher?.close(graceMs)
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
      this.#drained = finish
      this.#onLastClose = () => {
        if (graceTimer !== null) this.#clock.clearTimer(graceTimer)
        graceTimer = null
      }
      graceTimer = this.#clock.setTimer(() => {
        graceTimer = null
        const reason = new RpcError(ErrorCode.CONNECTION_CLOSED, 'server shutting down: grace period over')
        for (const sc of this.#connections) for (const call of sc.inFlight.values()) call.abort(reason)
        finish(false)
      }, graceMs)
      this.#outbound.stop()
      this.#maybeDrained()
    })
    this.#closing = this.#threadPools.length === 0
      ? closed
      : closed.then(() => Promise.all(this.#threadPools.map(pool => pool.close()))).then(() => undefined)
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
    const reader = new SocketReader()
    const socket = readThrough(accepted, reader)
    const remoteAddress = `${socket.remoteAddress ?? '?'}:${socket.remotePort ?? 0}`
    const connection = new Connection(socket, {
      reader: socket === accepted ? undefined : reader,
      framing: krpcFraming,
      maxFrameBytes: this.#options.maxMessageBytes,
      maxOutboundBytes: this.#options.maxOutboundBytes,
      busyPoller: this.#poller,
      inboundBudget: this.#inbound,
      onBackedUp: () => this.#outbound.watch(connection)
    })
    const sc = new ServerConnection(connection, remoteAddress, this.#clock.now())
    this.#negotiating.add(sc)
    const maxAgeMs = this.#options.maxConnectionAgeMs ?? 0
    // Jitter keeps connections opened together from all reconnecting together.
    if (maxAgeMs > 0) sc.retireAt = sc.lastActiveAt + maxAgeMs * (0.9 + 0.2 * Math.random())
    this.#connections.add(sc)
    connection.attach({
      onFrame: (buf, start, end) => this.#onFrame(sc, buf, start, end),
      onClose: (error) => this.#onClose(sc, error)
    })
    const negotiation = new ServerNegotiation({ authenticate: this.#options.authenticate })
    const handshake: Handshake<Negotiated> = {
      preambleBytes: PREAMBLE_BYTES,
      checkPreamble,
      maxFrameBytes: this.#options.maxNegotiationBytes ?? DEFAULT_MAX_NEGOTIATION_BYTES,
      onFrame: (frame) => {
        const step = negotiation.onFrame(frame)
        const record = (s: Awaited<typeof step>): typeof s => {
          if (s.done !== undefined) {
            sc.negotiated = s.done
            sc.peer = Object.freeze({ user: s.done.user ?? '', remoteAddress })
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
      this.#log.warn(`negotiation with ${remoteAddress} failed: ${error.message}`)
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
      this.#logEvicted.log(this.#log.warn, () => `${this.#connections.size} connections open (the limit): closing ${victim.remoteAddress}, idle ${Math.round(now - victim.idleSince)} ms, for a new one`)
      victim.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed: idle longest when the server was at its connection limit'))
      return true
    }
    // None idle: a connection still negotiating (silent ones are cheap to
    // open) makes room, the oldest first, rather than locking newcomers out.
    if (this.#negotiating.size > 0) {
      this.#evictNegotiating(`${this.#connections.size} connections open (the limit) and none idle`)
      return true
    }
    this.#stats.connectionsRefused++
    this.#logRefused.log(this.#log.warn, () => `refusing a connection from ${accepted.remoteAddress ?? '?'}: ${this.#connections.size} connections open (the limit) and none idle for ${MIN_EVICTABLE_IDLE_MS} ms`)
    accepted.destroy()
    return false
  }

  #evictNegotiating (why: string): void {
    const oldest = this.#negotiating.values().next().value!
    this.#stats.negotiatingEvicted++
    this.#logNegotiatingEvicted.log(this.#log.warn, () => `${why}: closing the oldest negotiating connection, from ${oldest.remoteAddress}, for a new one`)
    oldest.connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, 'closed: too many connections negotiating'))
  }

  #onClose (sc: ServerConnection, error: RpcError | undefined): void {
    this.#connections.delete(sc)
    this.#negotiating.delete(sc)
    sc.closedAt = this.#clock.now()
    if (this.#connections.size === 0) this.#onLastClose?.()
    // A frame the decoder refused at its prefix is a bad frame too.
    if (error?.code === ErrorCode.MALFORMED_FRAME && !sc.badFrame) {
      this.#stats.badFrames++
      this.#log.warn(`received bad data from ${sc.remoteAddress}: ${error.message}; closing the connection`)
    }
    if (sc.inFlight.size > 0) {
      const reason = error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed')
      for (const call of sc.inFlight.values()) {
        call.abort(reason)
        // A handler still running after the abort (it ignores its signal) is watched.
        if (!Number.isNaN(call.handledAt) && call.owner !== null && call.worker >= 0) this.#orphans.add(call)
      }
    }
    this.#maybeDrained()
  }

  #onFrame (sc: ServerConnection, buf: Buffer, start: number, end: number): boolean {
    const read = sc.connection.reads
    if (read !== this.#stampRead || sc !== this.#stampConnection) {
      this.#stampConnection = sc
      this.#stampRead = read
      this.#readAt = this.#lastNow = this.#clock.now()
    }
    const receivedAt = this.#readAt
    // Taken apart into one reused object: no header, frame or view objects per call.
    const parts = this.#parts
    const malformed = parseRequestInto(buf, start, end, parts)
    if (malformed !== null) return this.#badFrame(sc, malformed.message)
    const callId = parts.callId
    if (callId < 0) return this.#badFrame(sc, `unexpected call id ${callId} after negotiation`)
    const remote = parts.remoteMethod
    if (remote === undefined) return this.#badFrame(sc, 'request header has no remote_method')
    if (sc.inFlight.has(callId)) return this.#badFrame(sc, `received duplicate call id ${callId}`)
    this.#stats.callsReceived++

    if (this.#closing !== null) return this.#reply(sc, callId, KrpcCode.FATAL_SERVER_SHUTTING_DOWN, 'server is shutting down')
    if (sc.retiredAt >= 0) return this.#reply(sc, callId, KrpcCode.FATAL_SERVER_SHUTTING_DOWN, 'connection reached its maximum age; reconnect')
    const route = this.#route(remote)
    if (route === undefined) return this.#unrouted(sc, callId, remote)
    const service = route.service
    const required = parts.requiredFeatureFlags
    if (required !== undefined && required.length > 0) {
      const unsupported = required.filter(flag => !service.featureFlags.has(flag))
      if (unsupported.length > 0) return this.#reply(sc, callId, KrpcCode.ERROR_INVALID_REQUEST, 'unsupported feature flags', unsupported)
    }
    let call: InboundCall
    if (service.threads === null) {
      const request = route.methodDef.requestType.decodeRange(buf, parts.messageStart, parts.messageEnd)
      if (request instanceof RpcError) {
        return this.#reply(sc, callId, KrpcCode.ERROR_INVALID_REQUEST, `invalid parameter for call ${remote.service_name}.${remote.method_name}: ${request.message}`)
      }
      call = new InboundCall(route, sc.peer, callId, receivedAt, parts.timeoutMillis, parts.sidecars, request, this.#clock)
    } else {
      // Thread mode: the thread decodes the request from the frame's bytes.
      call = new ThreadCall(route, sc.peer, callId, receivedAt, parts.timeoutMillis, parts.sidecars, this.#clock,
        buf.subarray(start, end), buf.subarray(parts.messageStart, parts.messageEnd))
    }
    call.owner = sc
    sc.inFlight.set(callId, call)
    this.#submitting = call
    if (service.dispatcher === null) this.#runHandler(call)
    else service.dispatcher.submit(call, this.#lastNow)
    this.#submitting = null
    return !sc.connection.isClosed
  }

  #route (remote: RemoteMethod): Route | undefined {
    const keys = this.#routeKeys
    for (let i = 0; i < keys.length; i++) if (keys[i] === remote) return this.#routes[i]
    const service = this.#services.get(remote.service_name)
    if (service === undefined) return undefined
    // Own properties only: a peer naming `toString` or `constructor` must not reach Object.prototype.
    const methods = service.def.methods as Record<string, MethodDef<Message, Message> | undefined>
    if (!Object.hasOwn(methods, remote.method_name)) return undefined
    const methodDef = methods[remote.method_name]
    const handler = service.handlers[remote.method_name]
    if (methodDef === undefined || handler === undefined) return undefined
    const route: Route = {
      service, methodDef, handler, metrics: service.metrics.get(remote.method_name)!, serviceName: remote.service_name, methodName: remote.method_name
    }
    // The codec hands out one frozen object per method it has cached; others are new each time.
    if (Object.isFrozen(remote)) {
      keys[this.#routeNext] = remote
      this.#routes[this.#routeNext] = route
      this.#routeNext = (this.#routeNext + 1) % ROUTE_CACHE_SIZE
    }
    return route
  }

  // Answers a call whose service or method is not here.
  #unrouted (sc: ServerConnection, callId: number, remote: RemoteMethod): boolean {
    if (!this.#services.has(remote.service_name)) {
      return this.#ready
        ? this.#reply(sc, callId, KrpcCode.ERROR_NO_SUCH_SERVICE, `service ${remote.service_name} not registered on this server`)
        : this.#reply(sc, callId, KrpcCode.ERROR_UNAVAILABLE, `service unavailable: service ${remote.service_name} not registered yet`)
    }
    return this.#reply(sc, callId, KrpcCode.ERROR_NO_SUCH_METHOD, `call on service ${remote.service_name} received with an invalid method name: ${remote.method_name}`)
  }

  // Answers a call refused before it became an InboundCall (a method, not a closure per frame).
  #reply (sc: ServerConnection, callId: number, code: number, message: string, unsupported?: number[]): boolean {
    this.#stats.callsFailed++
    this.#send(sc, encodeErrorFrame(callId, code, message, unsupported))
    return true
  }

  #badFrame (sc: ServerConnection, reason: string): false {
    // The stream can no longer be trusted: close without a reply (wire-contract §6).
    this.#stats.badFrames++
    sc.badFrame = true
    this.#log.warn(`received bad data from ${sc.remoteAddress}: ${reason}; closing the connection`)
    sc.connection.destroy(new RpcError(ErrorCode.MALFORMED_FRAME, reason))
    return false
  }

  // Runs the call's handler; the returned promise (async handlers only)
  // settles when the call is answered, which releases its worker.
  #runHandler (call: InboundCall): Promise<void> | undefined {
    if (call.owner === null) return undefined
    const route = call.route as Route
    // Handed straight from its frame to a worker: it starts when the worker
    // became free, the latest clock reading of this read.
    const now = call === this.#submitting ? this.#lastNow : this.#clock.now()
    call.handledAt = now
    call.metrics = route.metrics
    route.metrics.queueTime.observe(now - call.receivedAt)
    const handler = route.handler
    let result: Message | Promise<Message>
    try {
      result = handler(call.request, call)
    } catch (err) {
      this.#handlerFailed(call, err)
      return undefined
    }
    if (result instanceof Promise || (result !== null && typeof (result as { then?: unknown }).then === 'function')) {
      // Still running at a scan abandonAfterMs past its deadline, it is abandoned (#abandonOverdue).
      return (result as Promise<Message>).then((response) => this.#respond(call, response), (err: unknown) => this.#handlerFailed(call, err))
    }
    this.#respond(call, result)
    return undefined
  }

  // Gives back the workers of handlers running `abandonAfterMs` past their
  // call's deadline or their connection's close (one pass of the idle scan):
  // the calls in flight on open connections, and the orphans of closed ones.
  #abandonOverdue (now: number): void {
    for (const sc of this.#connections) {
      if (sc.inFlight.size === 0) continue
      for (const call of sc.inFlight.values()) {
        if (call.deadline < now) this.#maybeAbandon(call, call.deadline, 'deadline', now)
      }
    }
    for (const call of this.#orphans) {
      const sc = call.owner as ServerConnection | null
      if (sc === null) {
        this.#orphans.delete(call)
        continue
      }
      this.#maybeAbandon(call, Math.min(sc.closedAt, call.deadline), 'connection closed', now)
    }
  }

  #maybeAbandon (call: InboundCall, since: number, what: string, now: number): void {
    const route = call.route as Route
    const service = route.service
    const pool = service.dispatcher?.pool
    // Running in the loop (not queued, not in a thread), long enough, and within the bound.
    if (pool === undefined || service.abandonAfterMs <= 0 || Number.isNaN(call.handledAt) || call.worker < 0 ||
      now - since < service.abandonAfterMs || service.abandoned >= service.maxAbandoned) return
    this.#orphans.delete(call)
    call.abandoned = true
    service.abandoned++
    this.#stats.handlersAbandoned++
    route.metrics.abandoned++
    this.#log.warn(`abandoning the handler of ${call.service}.${call.method} (call ${call.callId} from ${call.remoteAddress}): still running ${Math.round(now - since)} ms after its ${what}; its worker is given back and its result will be dropped`)
    call.abort(new RpcError(ErrorCode.DEADLINE_EXCEEDED, 'the handler was abandoned'))
    const worker = call.worker
    this.#respondError(call, KrpcCode.ERROR_APPLICATION, `handler abandoned: still running ${service.abandonAfterMs} ms after its ${what}`)
    pool.abandon(worker)
  }

  // Runs the call in thread `worker` of the service's pool; the promise
  // settles once the call is answered, which releases that thread's slot.
  #runInThread (call: ThreadCall, worker: number, pool: ThreadPool, dispatcher: ServiceDispatcher): Promise<void> | undefined {
    if (call.owner === null) return undefined
    const now = this.#clock.now()
    call.handledAt = now
    call.metrics = (call.route as Route).metrics
    call.metrics.queueTime.observe(now - call.receivedAt)
    return pool.run(call, worker).then((result: ThreadResult) => {
      if (result.error === undefined) this.#respondEncoded(call, result.body, result.sidecars)
      else this.#respondError(call, result.error.krpcCode, result.error.message)
      dispatcher.progressed()
    })
  }

  #handlerFailed (call: InboundCall, err: unknown): void {
    if (call.abandoned) {
      this.#abandonedSettled(call)
      return
    }
    if (err instanceof RpcError && err.krpcCode !== undefined) {
      this.#respondError(call, err.krpcCode, stripCodePrefix(err.message))
      return
    }
    this.#respondError(call, KrpcCode.ERROR_APPLICATION, describeFailure(err))
  }

  // An abandoned handler settled at last: its result is dropped.
  #abandonedSettled (call: InboundCall): void {
    (call.route as Route).service.abandoned--
  }

  #respond (call: InboundCall, response: Message): void {
    if (call.abandoned) {
      this.#abandonedSettled(call)
      return
    }
    const type = call.methodDef.responseType
    let body: Uint8Array
    let bodyBytes: number
    try {
      bodyBytes = type.flatLength(response)
      if (bodyBytes < 0) {
        // In the codec's scratch buffer: copied into the frame at once.
        const scratch = type.encodeToScratch(response)
        body = scratch.bytes
        bodyBytes = scratch.length
      } else {
        body = NO_BODY
      }
    } catch (err) {
      this.#respondError(call, KrpcCode.ERROR_APPLICATION, `handler of ${call.service}.${call.method} returned an invalid response: ${(err as Error).message}`)
      return
    }
    this.#respondEncoded(call, body, call.responseSidecars, bodyBytes)
  }

  // Answers with an encoded response (encoded here, or by a worker thread).
  // The frame goes out first; the bookkeeping (metrics, in-flight table)
  // follows, off the path of a synchronous caller waiting for the answer.
  // The body is body[0, bodyBytes), or NO_BODY: a flat response the
  // response type's writeFlat writes, as `flatLength` just measured it.
  #respondEncoded (call: InboundCall, body: Uint8Array, sidecars: Uint8Array[] | undefined, bodyBytes = body.length): void {
    const sc = call.owner as ServerConnection | null
    if (sc === null || sc.connection.isClosed) {
      this.#release(call)
      return
    }
    // The common case (no sidecars): encoded straight into the connection's outbound slab.
    const connection = sc.connection
    const inPlace = sidecars === undefined || sidecars.length === 0
    const bytes = inPlace ? responseFrameBytes(call.callId, bodyBytes) : 0
    const out = inPlace ? connection.reserve(bytes) : null
    let slices: Buffer[] | null = null
    if (out !== null) {
      if (body !== NO_BODY) writeResponseFrame(out, connection.reservedAt, call.callId, body, bodyBytes)
      else call.methodDef.responseType.writeFlat(out, writeResponseFrameHead(out, connection.reservedAt, call.callId, bodyBytes))
    } else {
      if (body === NO_BODY) {
        // Not in place (sidecars, a backed-up connection): the body's own bytes.
        body = Buffer.allocUnsafe(bodyBytes)
        call.methodDef.responseType.writeFlat(body, 0)
      }
      try {
        slices = encodeResponseFrame(call.callId, false, bodyBytes === body.length ? body : body.subarray(0, bodyBytes), sidecars)
      } catch (err) {
        this.#respondError(call, KrpcCode.ERROR_APPLICATION, `handler of ${call.service}.${call.method} returned an invalid response: ${(err as Error).message}`)
        return
      }
    }
    this.#stats.callsSucceeded++
    const settledAt = call.metrics === null ? 0 : (this.#lastNow = this.#clock.now())
    if (slices === null) connection.commit(bytes)
    else this.#send(sc, slices)
    this.#release(call, settledAt)
    this.#maybeDrained()
  }

  #respondError (call: InboundCall, code: number, message: string): void {
    const sc = this.#release(call)
    if (sc === undefined) return
    this.#stats.callsFailed++
    this.#send(sc, encodeErrorFrame(call.callId, code, message))
    this.#maybeDrained()
  }

  // Ends the call's life on its connection; undefined when the connection is gone.
  #release (call: InboundCall, settledAt?: number): ServerConnection | undefined {
    call.finish()
    const metrics = call.metrics
    if (metrics !== null) {
      // The handler ran: record its latency and whether it overran the deadline.
      call.metrics = null
      const now = settledAt ?? this.#clock.now()
      metrics.handled++
      metrics.handlerLatency.observe(now - call.handledAt)
      if (now > call.deadline) metrics.timedOutOnResponse++
    }
    const sc = call.owner as ServerConnection | null
    call.owner = null
    if (sc === null) return undefined
    sc.inFlight.delete(call.callId)
    return sc.connection.isClosed ? undefined : sc
  }

  #send (sc: ServerConnection, slices: Buffer[]): void {
    let bytes = 0
    for (const slice of slices) bytes += slice.length
    if (!sc.connection.send({ slices, bytes })) {
      this.#log.warn(`closing ${sc.remoteAddress}: it reads responses slower than they are produced (outbound bound exceeded)`)
      sc.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
    }
  }

  // One periodic scan closes idle connections and frames that take too
  // long, retires old connections, and abandons overdue handlers.
  #armIdleScan (): void {
    const idleMs = this.#options.idleTimeoutMs
    const maxAgeMs = this.#options.maxConnectionAgeMs ?? 0
    const frameMs = this.#options.frameTimeoutMs ?? DEFAULT_FRAME_TIMEOUT_MS
    let abandonMs = Infinity
    for (const service of this.#services.values()) if (service.abandonAfterMs > 0) abandonMs = Math.min(abandonMs, service.abandonAfterMs)
    this.#abandoning = abandonMs !== Infinity
    const positive = (ms: number): number => ms > 0 ? ms : Infinity
    const shortest = Math.min(positive(idleMs), positive(maxAgeMs), positive(frameMs), abandonMs)
    if (shortest === Infinity || this.#idleTimer !== null) return
    const periodMs = Math.max(10, Math.min(1000, shortest / 4))
    const scan = (): void => {
      this.#idleTimer = this.#clock.setTimer(scan, periodMs)
      const now = this.#clock.now()
      if (this.#abandoning) this.#abandonOverdue(now)
      this.#checkDescriptors()
      for (const sc of this.#connections) {
        const connection = sc.connection
        if (frameMs > 0 && this.#frameOverdue(sc, now, frameMs)) continue
        const activity = connection.activity
        // Progress is a read, a send, a drain, or the kernel taking some of
        // what waits to go out. A peer stopped inside a frame makes none.
        const outbound = connection.outboundBytes + connection.writeQueueBytes
        if (activity !== sc.lastActivity || outbound !== sc.lastOutbound || sc.inFlight.size > 0) {
          sc.lastActivity = activity
          sc.lastOutbound = outbound
          sc.lastActiveAt = now
          if (sc.retiredAt >= 0 && sc.inFlight.size === 0 && !connection.isBusy && !connection.hasPartialFrame && now - sc.retiredAt >= RETIRED_BUSY_LIMIT_MS) this.#closeAged(sc)
          else if (sc.retiredAt < 0 && now >= sc.retireAt && sc.negotiated !== null) sc.retiredAt = now
          continue
        }
        if (sc.retiredAt >= 0) {
          if (now - sc.lastActiveAt >= RETIRED_QUIET_MS) this.#closeAged(sc)
        } else if (now >= sc.retireAt && sc.negotiated !== null) {
          sc.retiredAt = now
        } else if (idleMs > 0 && sc.negotiated !== null && now - sc.lastActiveAt >= idleMs) {
          this.#stats.idleClosed++
          const inFrame = connection.hasPartialFrame ? ', stopped inside a frame' : ''
          this.#log.info(`closing idle connection from ${sc.remoteAddress} after ${idleMs} ms without progress${inFrame}`)
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
      this.#logAcceptError.log(this.#log.error, () => `out of file descriptors: ${open === Infinity ? limit : open} of ${limit} open (${this.#connections.size} connections, limit ${this.#maxConnections}); new connections are dropped until some close (lower --max-connections or raise ulimit -n)`)
    })
  }

  // Closes the connection when the frame it is receiving started arriving
  // `frameMs` ago (seen by the scan; at most a scan period late).
  #frameOverdue (sc: ServerConnection, now: number, frameMs: number): boolean {
    const connection = sc.connection
    if (!connection.hasPartialFrame) {
      sc.partialSince = -1
      return false
    }
    if (connection.isReadingPaused) {
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
    if (now - sc.partialSince < frameMs) return false
    this.#stats.frameTimeouts++
    this.#log.warn(`closing ${sc.remoteAddress}: a frame has been arriving for ${Math.round(now - sc.partialSince)} ms (frame timeout ${frameMs} ms)`)
    connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `frame not complete within ${frameMs} ms`))
    return true
  }

  #closeAged (sc: ServerConnection): void {
    this.#stats.agedClosed++
    this.#log.info(`closing ${sc.remoteAddress}: it reached its maximum age of ${this.#options.maxConnectionAgeMs} ms`)
    sc.connection.destroy()
  }
}

// Stands for a thread-mode service's handlers on the main thread; never called.
function inThread (): never {
  throw new Error('thread-mode handlers run in worker threads')
}

function atLeastOne (value: number, name: string): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be an integer of at least 1, got ${value}`)
  return value
}

// What a handler threw, as a message; never throws itself (a thrown value may refuse String()).
function describeFailure (err: unknown): string {
  try {
    return err instanceof Error ? String(err.message) : String(err)
  } catch {
    return 'the handler failed with a value that has no string form'
  }
}

function stripCodePrefix (message: string): string {
  return message.replace(/^[A-Z_]+: /, '')
}

/** Features the server offers in negotiation. */
export const SERVER_FEATURES = [RpcFeature.APPLICATION_FEATURE_FLAGS]
