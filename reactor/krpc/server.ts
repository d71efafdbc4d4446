import type { AddressInfo } from 'node:net'
import type { TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { krpcError } from '../../codec/krpc/codes.js'
import type { Authenticator } from '../../codec/krpc/server-negotiation.js'
import type { Message, MethodDef, MethodMap, ServiceDef } from '../../codec/protobuf/schema.js'
import { realClock } from '../../scheduling/clock.js'
import type { QueueDiscipline } from '../../scheduling/service-queue.js'
import type { CallExecutor, RouteDefinition } from '../call-dispatch.js'
import type { CallEndObserver, Filter } from '../filters.js'
import type { InboundCall } from '../inbound-call.js'
import { resolveLogger } from '../logger.js'
import type { ServerMetrics } from '../metrics.js'
import { ProtocolServer } from '../server.js'
import type { ServerConnectionStats, ServerLimits, ServerOptions, ServerStats } from '../server-options.js'
import type { KrpcCallContext, KrpcCallData } from './call.js'
import { EncodedBody, KrpcServerProtocol, type KrpcRouteSpec } from './protocol.js'
import { ThreadPool, type HandlerModule, type ThreadPoolStats } from './thread-pool.js'

export { SERVER_FEATURES } from './protocol.js'
export type { ServerOptions, ServerStats, ServerConnectionStats } from '../server-options.js'
export type { HandlerModule, ThreadPoolStats }

/** A method's implementation. It may return the response or a promise of it; a throw becomes ERROR_APPLICATION. */
export type Handler<Req, Res> = (request: Req, ctx: KrpcCallContext) => Res | Promise<Res>

/** One handler per method of the service. */
export type ServiceHandlers<M extends MethodMap> = { [K in keyof M & string]: Handler<M[K]['request'], M[K]['response']> }

/** The KRPC server's options: the generic server's, plus TLS inside negotiation and authentication. */
export interface KrpcServerOptions extends ServerOptions {
  /** SASL PLAIN verification; by default any user is accepted. */
  authenticate?: Authenticator
  /**
   * TLS the way Kudu does it: the server offers TLS in negotiation, and the
   * TLS handshake travels inside NegotiatePB TLS_HANDSHAKE steps; every
   * later byte (SASL, the connection context, calls) is encrypted. Needs
   * `cert` and `key`; `ca` is the CA that signs client certificates (for
   * certificate authentication). Unlike the generic server's `tls`, this is
   * not TLS from the first byte: a Kudu client speaks to it.
   */
  tls?: TlsOptions
  /** Refuse clients that do not offer TLS (FATAL_UNAUTHORIZED, as Kudu's `--rpc_encryption=required`); needs `tls`. */
  requireTls?: boolean
  /**
   * Every client must authenticate with a certificate signed by `tls.ca`
   * (Kudu's CERTIFICATE authentication); its subject's CN becomes
   * `ctx.user`. Others are refused FATAL_UNAUTHORIZED. Implies `requireTls`.
   */
  requireClientCert?: boolean
  /**
   * Encrypt loopback connections too. By default, when both sides are on
   * loopback and offer TLS_AUTHENTICATION_ONLY, the TLS handshake only
   * authenticates and the connection then stays in plain text (as Kudu's
   * `--rpc_encrypt_loopback_connections=false`).
   */
  encryptLoopback?: boolean
}

/** Options of one service (`addService`); unset ones come from the server's options. */
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
   * Worker-thread mode: the handlers run in this many
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
export type ThreadServiceOptions = AddServiceOptions & {
  /** The `worker_threads` threads the handlers run in (see `AddServiceOptions.threads`). */
  threads: number
}

/** Thread mode: a burst is held while some thread finishes a call at least this often (see ServicePool). */
const THREAD_HOLD_WINDOW_MS = 10

/**
 * A KRPC server: a generic `ProtocolServer` speaking KRPC, wrapped, with
 * services (protobuf `ServiceDef`s) as its route groups and their methods
 * as routes. Each call is answered exactly once, in KRPC's words when the
 * server answers it itself (ERROR_SERVER_TOO_BUSY,
 * FATAL_SERVER_SHUTTING_DOWN, ...). It is not a `ProtocolServer`: routes
 * come only through `addService`, which gives each one the method
 * definition KRPC decodes and encodes it with.
 */
export class KrpcServer {
  readonly #server: ProtocolServer<unknown, Message | EncodedBody, unknown, KrpcCallData>
  readonly #threads = new Map<string, ThreadPool>()
  readonly #defaults: ServerOptions
  /** Per-service and per-method metrics; `metrics.text()` is the Prometheus exposition. */
  readonly metrics: ServerMetrics

  constructor (options: KrpcServerOptions = {}) {
    const { authenticate, tls, requireTls, requireClientCert, encryptLoopback } = options
    // KRPC's TLS starts inside negotiation, not at the first byte: the generic server gets no `tls`.
    this.#server = new ProtocolServer(new KrpcServerProtocol({ authenticate, tls, requireTls, requireClientCert, encryptLoopback }), { ...options, tls: undefined })
    this.#defaults = options
    this.metrics = this.#server.metrics
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
    const threaded = options.threads !== undefined
    const isModule = typeof (handlers as Partial<HandlerModule>).module === 'string' || (handlers as Partial<HandlerModule>).module instanceof URL
    if (threaded !== isModule) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, threaded
        ? `${def.fullName}: thread mode takes { module, export? } in place of the handler object`
        : `${def.fullName}: a handler module needs the threads option`)
    }
    const methods = def.methods as Record<string, MethodDef<Message, Message>>
    if (!threaded) {
      for (const name of Object.keys(methods)) {
        if (typeof (handlers as Record<string, unknown>)[name] !== 'function') {
          throw new RpcError(ErrorCode.INVALID_ARGUMENT, `no handler for ${def.fullName}.${name}`)
        }
      }
    }
    const featureFlags = new Set(options.supportedFeatureFlags ?? [])
    const routes: Record<string, RouteDefinition<unknown, Message | EncodedBody>> = {}
    for (const [name, methodDef] of Object.entries(methods)) {
      const spec: KrpcRouteSpec = { methodDef, featureFlags, threaded }
      // In thread mode the handlers live in the threads; every method is known here.
      routes[name] = { handler: threaded ? inThread : krpcRoute((handlers as Record<string, Handler<Message, Message>>)[name]!), spec }
    }
    let executor: CallExecutor<KrpcCallData> | undefined
    if (threaded) {
      if (this.#threads.has(def.fullName)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `service ${def.fullName} is already registered`)
      const pool = new ThreadPool({
        threads: options.threads!, callsPerThread: options.callsPerThread, handlers: handlers as HandlerModule,
        service: def.fullName, methods: Object.keys(methods), clock: this.#defaults.clock ?? realClock, logger: resolveLogger(this.#defaults.logger)
      })
      executor = threadExecutor(pool)
      this.#threads.set(def.fullName, pool)
    }
    this.#server.addRoutes(def.fullName, routes, {
      workers: options.workers,
      queueLength: options.queueLength,
      queue: options.queue,
      abandonAfterMs: options.abandonAfterMs,
      maxAbandonedHandlers: options.maxAbandonedHandlers,
      executor
    })
    return this
  }

  /** Counters of a thread-mode service's threads (per-thread handled calls, restarts); undefined for other services. */
  threadStats (service: string): ThreadPoolStats | undefined {
    return this.#threads.get(service)?.stats()
  }

  /** Adds a filter around the handlers of every service, those added later too; see `ProtocolServer.use`. */
  use (filter: Filter): this {
    this.#server.use(filter)
    return this
  }

  /** Calls `observer(call, outcome)` once for every call's end; see `ProtocolServer.onCallEnd`. Returns a function that removes it. */
  onCallEnd (observer: CallEndObserver): () => void {
    return this.#server.onCallEnd(observer)
  }

  /** Sets `maxConnectionAgeMs` (0 or less: no limit) for connections accepted from now on. */
  setMaxConnectionAgeMs (ms: number): void {
    this.#server.setMaxConnectionAgeMs(ms)
  }

  /** Marks the services as registered: unknown services are now refused ERROR_NO_SUCH_SERVICE rather than ERROR_UNAVAILABLE. */
  markReady (): void {
    this.#server.markReady()
  }

  /**
   * Starts listening (loopback by default); resolves with the bound
   * address. Thread-mode services' threads are waited for first. See
   * `ProtocolServer.listen`.
   */
  listen (port = 0, host = '127.0.0.1', options: { reusePort?: boolean } = {}): Promise<AddressInfo> {
    return this.#server.listen(port, host, options)
  }

  /** The bound address, once listening. */
  address (): AddressInfo | null {
    return this.#server.address()
  }

  /** The server's counters. */
  stats (): ServerStats {
    return this.#server.stats()
  }

  /** The limits in force (defaults resolved), as `nyala serve` reports them. */
  limits (): ServerLimits {
    return this.#server.limits()
  }

  /** Counters of each open connection (Kudu's `DumpConnections`); see `ProtocolServer.connectionStats`. */
  connectionStats (): ServerConnectionStats[] {
    return this.#server.connectionStats()
  }

  /**
   * Stops accepting, answers later calls FATAL_SERVER_SHUTTING_DOWN, lets
   * calls in flight finish within `graceMs` (default 30 s), and resolves
   * once every connection is closed and the worker threads have stopped.
   * See `ProtocolServer.close`.
   */
  close (options: { graceMs?: number } = {}): Promise<void> {
    return this.#server.close(options)
  }
}

// A KRPC handler as the generic server's route: its context is the call's
// KRPC data, which reads the rest through from the call.
function krpcRoute (handler: Handler<Message, Message>): (request: unknown, call: InboundCall<KrpcCallData>) => Message | Promise<Message> {
  return (request, call) => {
    const ctx = call.data
    ctx.call = call
    return handler(request as Message, ctx)
  }
}

// A thread pool as a group's executor: the thread answers with the encoded
// response (or a KRPC error), which the protocol frames as usual.
function threadExecutor (pool: ThreadPool): CallExecutor<KrpcCallData> {
  return {
    workers: pool.workers,
    ready: pool.ready,
    holdWindowMs: THREAD_HOLD_WINDOW_MS,
    run: (call, worker) => pool.run(call, worker).then((result) => {
      if (result.error === undefined) return new EncodedBody(result.body, result.sidecars)
      throw krpcError(result.error.krpcCode, result.error.message)
    }),
    close: () => pool.close()
  }
}

// Stands for a thread-mode service's handlers on the main thread; never called.
function inThread (): never {
  throw new Error('thread-mode handlers run in worker threads')
}

/** @deprecated The KRPC server's former name: use `KrpcServer` (from `nyala/krpc`); this name goes in the next release. */
export { KrpcServer as Server }
