import { ErrorCode, RpcError } from '../codec/errors.js'
import { CallHead, InvalidRequest, type AnsweredCall, type AnswerSlices, type RefusalReason, type ServerProtocol } from '../codec/protocol.js'
import type { Clock } from '../scheduling/clock.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { ServiceDispatcher } from './dispatcher.js'
import { InboundCall, type CallConstructor, type CallRoute } from './inbound-call.js'
import { composeFilters, type CallEndObserver, type CallOutcome, type EndedCall, type Filter, type Handler } from './filters.js'
import type { Logger } from './logger.js'
import type { MethodMetrics, ServerMetrics } from './metrics.js'
import type { ServerConnection } from './server-connection.js'

export type { Handler } from './filters.js'

/** A route with something the protocol needs to know about it (KRPC: the method's message types). */
export interface RouteDefinition<Req = unknown, Res = unknown, State = unknown> {
  handler: Handler<Req, Res, State>
  /** Handed to the protocol's `decodeRequest` and kept on the route (`RouteInfo.spec`). */
  spec?: unknown
}

/** The routes of one group, by name: a handler, or a handler with its spec. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type RouteHandlers<Req = any, Res = any, State = any> = Record<string, Handler<Req, Res, State> | RouteDefinition<Req, Res, State>>

/**
 * Runs a group's calls somewhere other than the event loop (KRPC's worker
 * threads). Its `workers` are the group's workers (same queue, LIFO
 * parking and hand-off); `run` resolves with the answer or rejects as a
 * handler would.
 */
export interface CallExecutor {
  readonly workers: number
  /** Settles when the executor can take calls; `listen()` waits for it. */
  readonly ready?: Promise<void>
  /** How long held calls wait without a completion before the queue judges them (see ServiceDispatcher); default one turn. */
  readonly holdWindowMs?: number
  run: (call: InboundCall, worker: number) => Promise<unknown>
  close?: () => Promise<void>
}

/** Options of a group of routes (`addRoutes`); unset ones come from the server's options. */
export interface RouteGroupOptions<Req = any, Res = any, State = any> {
  /** Workers (concurrent handlers) of the group; default 10. */
  workers?: number
  /** Bound of the group's queue; default 50. */
  queueLength?: number
  /** `edf` (default): earliest deadline first, a full queue evicts the latest deadline. `fifo`: arrival order, a full queue refuses the newcomer. */
  queue?: QueueDiscipline
  /** A handler still running this long past its deadline (or its connection's close) gives its worker back; default 5000 ms, 0 disables. */
  abandonAfterMs?: number
  /** Abandoned handlers still running past which no more are abandoned; default 100. */
  maxAbandonedHandlers?: number
  /** Runs the group's calls elsewhere (worker threads); always pooled. */
  executor?: CallExecutor
  /** The call objects' constructor (a protocol's subclass of InboundCall). */
  callType?: CallConstructor
  /** Filters around this group's handlers, inside the server's own (`ProtocolServer.use`); the first is outermost. */
  filters?: Array<Filter<Req, Res, State>>
}

/**
 * What the call dispatch needs of the server around it. Plain data fields
 * and functions, no accessors: an object literal with a getter is a
 * dictionary-mode object in V8, and every load from it in optimized code
 * is then a generic inline-cache call (~300 instructions per call, found
 * with bench/server-instructions.ts).
 */
export interface DispatchHost {
  readonly clock: Clock
  readonly log: Logger
  readonly metrics: ServerMetrics
  readonly stats: { callsReceived: number, callsSucceeded: number, callsFailed: number, badFrames: number, handlersAbandoned: number }
  /** Every pool, or none (`scheduler: 'direct'`). */
  readonly pooled: boolean
  readonly defaults: { workers: number, queueLength: number, queue: QueueDiscipline, abandonAfterMs: number, maxAbandonedHandlers: number, burstLimit: number | undefined, requestTimeoutMs: number }
  /** Until ready, calls to unknown groups are refused `unavailable` rather than `no-service`. */
  isReady: () => boolean
  /** The open connections (abandonment scans their calls). */
  readonly connections: Iterable<ServerConnection>
  /** A call was answered; the server may be drained. */
  answered: () => void
  /** A peer sent bytes the protocol refused: logged as a warning, at most one line per interval (peers choose how often). */
  badData: (remoteAddress: string, why: string, code: string) => void
}

interface RouteGroup {
  readonly name: string
  readonly routes: Map<string, Route>
  readonly metrics: ReadonlyMap<string, MethodMetrics>
  /** null in `direct` mode. */
  readonly dispatcher: ServiceDispatcher | null
  readonly executor: CallExecutor | null
  /** Makes the group's call objects: `callType`'s constructor behind a function of its own (see callFactory). */
  readonly newCall: CallFactory
  readonly abandonAfterMs: number
  readonly maxAbandoned: number
  /** Abandoned handlers that have not settled yet. */
  abandoned: number
  /** The group's own filters (inside the server's). */
  readonly filters: readonly Filter[]
  /** Executor groups: the server's and the group's filters, composed per call around the executor (empty: none). */
  chain: readonly Filter[]
}

interface Route extends CallRoute {
  readonly group: RouteGroup
  /** The handler as registered; `handler` is it inside the filters. */
  readonly base: CallRoute['handler']
  handler: CallRoute['handler']
}

// Routes remembered by the identity of the protocol's route keys
// (`CallHead.routeKey`), so a request finds its handler and metrics
// without string lookups.
const ROUTE_CACHE_SIZE = 8
/** Route keys remembered past the linear cache. */
const MAX_ROUTE_KEYS = 4096

/**
 * The call side of the server: from a request frame to its answer. It
 * decodes the frame's head with the protocol, finds the route, makes the
 * call (deadline computed once), hands it to its group's deadline-ordered
 * queue and LIFO-parked workers (or runs it at once in `direct` mode),
 * and writes the answer in place into the connection's coalesced outbound
 * buffer: in request order for in-order protocols, as handlers finish for
 * the others. Every call is answered exactly once, in the protocol's words
 * when the server answers it itself (busy, expired, shutdown, ...), or its
 * connection is closed when the peer broke the protocol.
 */
export class CallDispatch {
  readonly #protocol: ServerProtocol
  readonly #host: DispatchHost
  readonly #clock: Clock
  readonly #inOrder: boolean
  // Calls in flight are keyed by the connection's seq, not the call id: in
  // order, and by id when the protocol allows an id already in flight.
  readonly #bySeq: boolean
  readonly #head = new CallHead()
  readonly #groups = new Map<string, RouteGroup>()
  /** Calls whose connection closed while their handler ran (abandonment watches them). */
  readonly #orphans = new Set<InboundCall>()
  readonly #routeKeys: object[] = []
  readonly #routes: Route[] = []
  readonly #routesByKey = new Map<object, Route>()
  /** The call `onFrame` is submitting, so a handler it starts at once takes its start time from #lastNow. */
  #submitting: InboundCall | null = null
  // One clock reading per read, not per frame: the frames of one read were
  // received together, at the read. #lastNow is the latest reading taken
  // while handling it (the read's, or the last call's settlement): the time
  // a call handed straight to a worker starts.
  #stampConnection: ServerConnection | null = null
  #stampRead = -1
  #readAt = 0
  #lastNow = 0
  // The server is closing (a field, not a getter on the host: read per frame).
  #closing = false
  readonly #run = (call: InboundCall, worker: number): Promise<void> | void => {
    call.worker = worker
    return this.#runHandler(call)
  }

  readonly #reject = (call: InboundCall, reason: RefusalReason, message: string): void => this.#refuse(call, reason, message)
  /** The server's filters (`use`), outside every group's own. */
  readonly #filters: Filter[] = []
  /** `onCallEnd` observers; null while there is none (the common case costs one check per call). */
  #observers: CallEndObserver[] | null = null

  constructor (protocol: ServerProtocol, host: DispatchHost) {
    this.#protocol = protocol
    this.#host = host
    this.#clock = host.clock
    this.#inOrder = protocol.ordering === 'in-order'
    const duplicateIds = protocol.duplicateIds ?? 'close'
    if (duplicateIds !== 'close' && duplicateIds !== 'allow') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: duplicateIds must be 'close' or 'allow', got ${String(duplicateIds)}`)
    this.#bySeq = this.#inOrder || duplicateIds === 'allow'
  }

  /** Registers a group of routes; see `ProtocolServer.addRoutes`. */
  addRoutes (name: string, handlers: RouteHandlers, options: RouteGroupOptions = {}): void {
    if (this.#groups.has(name)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} is already registered`)
    const defaults = this.#host.defaults
    const executor = options.executor ?? null
    const definitions = new Map<string, RouteDefinition>()
    for (const [method, entry] of Object.entries(handlers)) {
      const definition = typeof entry === 'function' ? { handler: entry } : entry
      if (typeof definition?.handler !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `no handler for ${name}.${method}`)
      definitions.set(method, definition as RouteDefinition)
    }
    const pooled = this.#host.pooled || executor !== null
    const workers = executor !== null ? executor.workers : options.workers ?? defaults.workers
    let dispatcher: ServiceDispatcher | null = null
    const metrics = this.#host.metrics.addService(name, [...definitions.keys()], {
      workers: pooled ? workers : 0,
      queueLength: () => dispatcher?.pool.queueLength ?? 0,
      idleWorkers: () => dispatcher?.pool.idleWorkers ?? 0
    })
    if (pooled) {
      const run = executor === null ? this.#run : (call: InboundCall, worker: number) => this.#runElsewhere(call, worker, executor, dispatcher!)
      dispatcher = new ServiceDispatcher({
        workers,
        queueLength: options.queueLength ?? defaults.queueLength,
        discipline: options.queue ?? defaults.queue,
        clock: this.#clock,
        run,
        reject: this.#reject,
        metrics,
        burstLimit: defaults.burstLimit,
        holdWindowMs: executor?.holdWindowMs
      })
    }
    const group: RouteGroup = {
      name,
      routes: new Map(),
      metrics,
      dispatcher,
      executor,
      newCall: callFactory(options.callType ?? InboundCall),
      abandonAfterMs: executor !== null ? 0 : options.abandonAfterMs ?? defaults.abandonAfterMs,
      maxAbandoned: options.maxAbandonedHandlers ?? defaults.maxAbandonedHandlers,
      abandoned: 0,
      filters: checkFilters(options.filters ?? []),
      chain: []
    }
    for (const [method, definition] of definitions) {
      const handler = definition.handler as Route['handler']
      group.routes.set(method, { service: name, method, spec: definition.spec, base: handler, handler, metrics: metrics.get(method)!, group })
    }
    this.#compose(group)
    this.#groups.set(name, group)
    this.#routeKeys.length = 0
    this.#routes.length = 0
    this.#routesByKey.clear()
  }

  /** Adds a filter around every group's handlers, those registered later too (outside the groups' own filters; the first added is outermost). */
  use (filter: Filter): void {
    checkFilters([filter])
    this.#filters.push(filter)
    for (const group of this.#groups.values()) this.#compose(group)
  }

  // Composes the group's handlers inside their filters, once (not per call).
  #compose (group: RouteGroup): void {
    const chain = this.#filters.length === 0 ? group.filters : [...this.#filters, ...group.filters]
    group.chain = group.executor === null ? [] : chain
    for (const route of group.routes.values()) route.handler = group.executor !== null || chain.length === 0 ? route.base : composeFilters(chain, route.base)
  }

  /** Adds an observer of every call's end; returns a function that removes it. */
  onCallEnd (observer: CallEndObserver): () => void {
    (this.#observers ??= []).push(observer)
    return () => {
      const observers = this.#observers
      if (observers === null) return
      const at = observers.indexOf(observer)
      if (at >= 0) observers.splice(at, 1)
      if (observers.length === 0) this.#observers = null
    }
  }

  #ended (call: EndedCall, reason: CallOutcome['reason'], message: string, detail?: unknown): void {
    const outcome: CallOutcome = detail === undefined ? { reason, message } : { reason, message, detail }
    for (const observer of this.#observers!) {
      try {
        observer(call, outcome)
      } catch {
        // An observer's mistake must not change the call's answer.
      }
    }
  }

  // A request refused before it became a call, as observers see it (the head is reused: copied).
  #endedHead (sc: ServerConnection, reason: RefusalReason, message: string, detail: unknown): void {
    const head = this.#head
    this.#ended({ service: head.service, method: head.method, callId: head.callId, user: sc.peer.user, remoteAddress: sc.remoteAddress, receivedAt: this.#readAt }, reason, message, detail)
  }

  /** The executors of the groups that have one (their `ready` and `close`). */
  get executors (): CallExecutor[] {
    const out: CallExecutor[] = []
    for (const group of this.#groups.values()) if (group.executor !== null) out.push(group.executor)
    return out
  }

  /** The shortest `abandonAfterMs` of any group (Infinity: none abandons). */
  get shortestAbandonMs (): number {
    let ms = Infinity
    for (const group of this.#groups.values()) if (group.abandonAfterMs > 0) ms = Math.min(ms, group.abandonAfterMs)
    return ms
  }

  /** Abandoned handlers still running, over all groups. */
  get abandonedRunning (): number {
    let n = 0
    for (const group of this.#groups.values()) n += group.abandoned
    return n
  }

  /** Stops taking calls: new ones are refused `shutdown`, queued ones drain within `graceMs`, then get `shutdown`. */
  close (graceMs: number): void {
    this.#closing = true
    for (const group of this.#groups.values()) void group.dispatcher?.close(graceMs)
  }

  /** One request frame of a set-up connection; false: stop reading it. */
  onFrame (sc: ServerConnection, buf: Buffer, start: number, end: number): boolean {
    if (sc.closing) return false
    const read = sc.connection.reads
    if (read !== this.#stampRead || sc !== this.#stampConnection) {
      this.#stampConnection = sc
      this.#stampRead = read
      this.#readAt = this.#lastNow = this.#clock.now()
    }
    const receivedAt = this.#readAt
    const protocol = this.#protocol
    // Taken apart into one reused head: no header objects per call.
    const head = this.#head
    head.reset(start, end)
    let malformed: RpcError | null
    try {
      malformed = protocol.decodeHead(buf, start, end, head, sc.state)
    } catch (err) {
      // A protocol that breaks its contract must not take the process down: the frame is bad.
      malformed = new RpcError(ErrorCode.MALFORMED_FRAME, `the ${protocol.name} protocol could not decode a frame: ${describeFailure(err)}`)
    }
    if (malformed !== null) return this.#protocolError(sc, malformed)
    if (head.skip) return true
    const inOrder = this.#inOrder
    const bySeq = this.#bySeq
    const seq = bySeq ? sc.nextSeq++ : -1
    // The in-flight table takes 32-bit keys: an in-order seq wraps there
    // (2^32 requests would have to be in flight to collide), an id must be
    // an integer of 32 bits, signed or not (a u32 maps one to one).
    const callId = head.callId
    if (!inOrder && !(Number.isInteger(callId) && callId >= -0x80000000 && callId <= 0xffffffff)) {
      return this.#badFrame(sc, new RpcError(ErrorCode.MALFORMED_FRAME, `call id ${callId} is not a 32-bit integer`))
    }
    const key = bySeq ? seq | 0 : callId | 0
    if (!bySeq && sc.inFlight.has(key)) return this.#badFrame(sc, new RpcError(ErrorCode.MALFORMED_FRAME, `received duplicate call id ${callId}`))
    const host = this.#host
    host.stats.callsReceived++

    if (this.#closing) return this.#refuseHead(sc, seq, 'shutdown', 'server is shutting down')
    if (sc.retiredAt >= 0) return this.#refuseHead(sc, seq, 'shutdown', 'connection reached its maximum age; reconnect')
    const route = this.#route(head)
    if (route === undefined) return this.#unrouted(sc, seq)
    let request: unknown
    try {
      request = protocol.decodeRequest(route, buf, head)
    } catch (err) {
      request = new InvalidRequest(`the request could not be decoded: ${describeFailure(err)}`, err)
    }
    if (request instanceof InvalidRequest) return this.#refuseHead(sc, seq, 'invalid', request.message, request.detail)
    const group = route.group
    const call = group.newCall(route, sc.peer, head.callId, receivedAt, head.timeoutMs > 0 ? head.timeoutMs : host.defaults.requestTimeoutMs, head.data, request, this.#clock)
    call.owner = sc
    call.seq = seq
    sc.inFlight.set(key, call)
    this.#submitting = call
    if (group.dispatcher === null) this.#runHandler(call)
    else group.dispatcher.submit(call, this.#lastNow)
    this.#submitting = null
    return !sc.connection.isClosed && !sc.closing
  }

  /** The connection closed: its calls' signals abort; handlers still running are watched for abandonment. */
  connectionClosed (sc: ServerConnection, error: RpcError | undefined): void {
    if (sc.inFlight.size === 0) return
    const reason = error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed')
    for (const call of sc.inFlight.values()) {
      call.abort(reason)
      // A handler still running after the abort (it ignores its signal) is watched.
      if (!Number.isNaN(call.handledAt) && call.owner !== null && call.worker >= 0) this.#orphans.add(call)
    }
  }

  #route (head: CallHead): Route | undefined {
    const key = head.routeKey
    if (key !== undefined) {
      const keys = this.#routeKeys
      for (let i = 0; i < keys.length; i++) if (keys[i] === key) return this.#routes[i]
      // More routes than the linear cache holds (RESP's commands): by identity, one Map lookup.
      const known = this.#routesByKey.get(key)
      if (known !== undefined) return known
    }
    const route = this.#groups.get(head.service)?.routes.get(head.method)
    if (route !== undefined && key !== undefined) {
      if (this.#routeKeys.length < ROUTE_CACHE_SIZE) {
        this.#routeKeys.push(key)
        this.#routes.push(route)
      } else {
        // Bounded: a protocol that made a new key object per frame must not grow it.
        if (this.#routesByKey.size >= MAX_ROUTE_KEYS) this.#routesByKey.clear()
        this.#routesByKey.set(key, route)
      }
    }
    return route
  }

  // Answers a request whose group or route is not here.
  #unrouted (sc: ServerConnection, seq: number): boolean {
    const head = this.#head
    if (!this.#groups.has(head.service)) {
      return this.#host.isReady()
        ? this.#refuseHead(sc, seq, 'no-service', `service ${head.service} not registered on this server`)
        : this.#refuseHead(sc, seq, 'unavailable', `service unavailable: service ${head.service} not registered yet`)
    }
    return this.#refuseHead(sc, seq, 'no-method', `call on service ${head.service} received with an invalid method name: ${head.method}`)
  }

  // Answers a request refused before it became a call (a method, not a closure per frame).
  #refuseHead (sc: ServerConnection, seq: number, reason: RefusalReason, message: string, detail?: unknown): boolean {
    this.#host.stats.callsFailed++
    if (this.#observers !== null) this.#endedHead(sc, reason, message, detail)
    this.#emit(sc, seq, this.#protocol.refusal(this.#head, reason, message, detail))
    return !sc.connection.isClosed && !sc.closing
  }

  /**
   * The connection's framing refused its stream (after set-up): answered
   * like a head `decodeHead` refused. True: this took the connection over
   * (it reads nothing more and ends after the answer).
   */
  framingError (sc: ServerConnection, error: RpcError): boolean {
    if (this.#protocol.protocolError === undefined || sc.closing) return false
    this.#protocolError(sc, error)
    return true
  }

  // A stream the protocol cannot go on reading: its protocolError answer
  // (if any) goes out after the answers before it, then the connection ends.
  #protocolError (sc: ServerConnection, error: RpcError): false {
    const answerOf = this.#protocol.protocolError
    let answer: AnswerSlices = null
    if (answerOf !== undefined) {
      try {
        answer = answerOf(error, sc.state)
      } catch {
        answer = null // a protocol that breaks its contract: close without a reply
      }
    }
    if (answer === null) return this.#badFrame(sc, error)
    this.#host.stats.badFrames++
    sc.badFrame = true
    // The peer is told in its protocol's words: a client's mistake, not the server's trouble.
    this.#host.badData(sc.remoteAddress, `${error.message}; answered, closing the connection`, error.code)
    if (this.#inOrder) {
      const seq = sc.nextSeq++
      sc.requestClose(seq)
      this.#emit(sc, seq, answer)
      return false
    }
    // By id: the last words follow the answers of the calls still in flight (#release).
    sc.requestClose(-1)
    if (sc.inFlight.size > 0) {
      sc.lastWords = answer
      return false
    }
    if (answer.length > 0) this.#send(sc, answer)
    sc.connection.endAfterFlush()
    return false
  }

  #badFrame (sc: ServerConnection, error: RpcError): false {
    // The stream can no longer be trusted: close without a reply (the
    // answers to the frames before it, already queued, still go out).
    this.#host.stats.badFrames++
    sc.badFrame = true
    this.#host.badData(sc.remoteAddress, `${error.message}; closing the connection`, error.code)
    sc.connection.flushAndDestroy(error.code === ErrorCode.MALFORMED_FRAME || error.code === ErrorCode.FRAME_TOO_LARGE ? error : new RpcError(ErrorCode.MALFORMED_FRAME, error.message, { cause: error }))
    return false
  }

  // Runs the call's handler; the returned promise (async handlers only)
  // settles when the call is answered, which releases its worker.
  #runHandler (call: InboundCall): Promise<void> | undefined {
    if (call.owner === null) return undefined
    const route = call.route
    // Handed straight from its frame to a worker: it starts when the worker
    // became free, the latest clock reading of this read.
    const now = call === this.#submitting ? this.#lastNow : this.#clock.now()
    call.handledAt = now
    call.metrics = route.metrics
    route.metrics.queueTime.observe(now - call.receivedAt)
    let result: unknown
    try {
      result = route.handler(call.request, call)
    } catch (err) {
      this.#handlerFailed(call, err)
      return undefined
    }
    if (result instanceof Promise || (result !== null && typeof (result as { then?: unknown } | undefined)?.then === 'function')) {
      // Still running at a scan abandonAfterMs past its deadline, it is abandoned (abandonOverdue).
      return (result as Promise<unknown>).then((response) => this.#respond(call, response), (err: unknown) => this.#handlerFailed(call, err))
    }
    this.#respond(call, result)
    return undefined
  }

  // Runs the call on its group's executor (worker thread `worker`); the
  // promise settles once the call is answered, which releases that slot.
  #runElsewhere (call: InboundCall, worker: number, executor: CallExecutor, dispatcher: ServiceDispatcher): Promise<void> | undefined {
    if (call.owner === null) return undefined
    const now = this.#clock.now()
    call.handledAt = now
    call.metrics = call.route.metrics
    call.metrics.queueTime.observe(now - call.receivedAt)
    const chain = (call.route as Route).group.chain
    let result: Promise<unknown>
    if (chain.length === 0) {
      result = executor.run(call, worker)
    } else {
      // The filters run here, in the loop, around the executor (composed per call: executor groups only).
      try {
        result = Promise.resolve(composeFilters(chain, () => executor.run(call, worker))(call.request, call))
      } catch (err) {
        result = Promise.reject(err)
      }
    }
    return result.then((response) => this.#respond(call, response), (err: unknown) => this.#handlerFailed(call, err)).then(() => dispatcher.progressed())
  }

  /**
   * Gives back the workers of handlers running `abandonAfterMs` past their
   * call's deadline or their connection's close (one pass of the server's
   * scan): the calls in flight on open connections, and the orphans of
   * closed ones.
   */
  abandonOverdue (now: number): void {
    for (const sc of this.#host.connections) {
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
    const group = (call.route as Route).group
    const pool = group.dispatcher?.pool
    // Running in the loop (not queued, not elsewhere), long enough, and within the bound.
    if (pool === undefined || group.abandonAfterMs <= 0 || Number.isNaN(call.handledAt) || call.worker < 0 ||
      now - since < group.abandonAfterMs || group.abandoned >= group.maxAbandoned) return
    if (this.#orphans.size > 0) this.#orphans.delete(call)
    call.abandoned = true
    group.abandoned++
    this.#host.stats.handlersAbandoned++
    call.route.metrics.abandoned++
    this.#host.log.warn(`abandoning the handler of ${call.service}.${call.method} (call ${call.callId} from ${call.remoteAddress}): still running ${Math.round(now - since)} ms after its ${what}; its worker is given back and its result will be dropped`)
    call.abort(new RpcError(ErrorCode.DEADLINE_EXCEEDED, 'the handler was abandoned'))
    const worker = call.worker
    this.#refuse(call, 'abandoned', `handler abandoned: still running ${group.abandonAfterMs} ms after its ${what}`)
    pool.abandon(worker)
  }

  #handlerFailed (call: InboundCall, err: unknown): void {
    if (call.abandoned) {
      (call.route as Route).group.abandoned--
      return
    }
    this.#refuse(call, 'failed', describeFailure(err), err)
  }

  // Answers the call with its handler's result. The frame goes out first;
  // the bookkeeping (metrics, in-flight table) follows, off the path of a
  // synchronous caller waiting for the answer.
  #respond (call: InboundCall, response: unknown): void {
    if (call.abandoned) {
      // An abandoned handler settled at last: its result is dropped.
      (call.route as Route).group.abandoned--
      return
    }
    const sc = call.owner as ServerConnection | null
    if (sc === null || sc.connection.isClosed) {
      if (sc !== null && this.#observers !== null) this.#ended(call, 'closed', 'the connection closed before the answer was sent')
      this.#release(call)
      return
    }
    const protocol = this.#protocol
    const connection = sc.connection
    const inTurn = !this.#inOrder || call.seq === sc.sendSeq
    let bytes: number
    try {
      bytes = protocol.encodedLength(call, response)
      if (!inTurn) {
        // Not its turn: its answer waits, encoded, for the ones before it.
        sc.hold(call.seq, bytes === 0 ? null : bytes > 0 ? [encodeOwn(protocol, call, response, bytes)] : protocol.encodeSlices!(call, response))
        this.#afterHold(sc)
      } else if (bytes > 0) {
        if (!connection.writeFrame(bytes, protocol, call, response)) this.#overBound(sc)
      } else if (bytes < 0) {
        this.#send(sc, protocol.encodeSlices!(call, response))
      }
    } catch (err) {
      this.#refuse(call, 'failed', `handler of ${call.service}.${call.method} returned an invalid response: ${describeFailure(err)}`, err)
      return
    }
    this.#host.stats.callsSucceeded++
    if (this.#observers !== null) this.#ended(call, 'ok', '')
    const settledAt = call.metrics === null ? 0 : (this.#lastNow = this.#clock.now())
    this.#release(call, settledAt)
    if (inTurn && this.#inOrder) this.#advance(sc)
    if (call.closeAfter) this.#closeAfter(sc)
    this.#host.answered()
  }

  // Answers the call in the protocol's words (the server answers it itself).
  #refuse (call: InboundCall, reason: RefusalReason, message: string, detail?: unknown): void {
    const owned = call.owner !== null
    const sc = this.#release(call)
    if (this.#observers !== null && owned) this.#ended(call, sc === undefined ? 'closed' : reason, sc === undefined ? 'the connection closed before the answer was sent' : message, detail)
    if (sc === undefined) return
    this.#host.stats.callsFailed++
    this.#emit(sc, call.seq, this.#protocol.refusal(call, reason, message, detail))
    if (call.closeAfter) this.#closeAfter(sc)
    this.#host.answered()
  }

  // Sends an answer the server made (or holds it until its turn); null:
  // close the connection instead, once the answers before it have gone.
  #emit (sc: ServerConnection, seq: number, slices: AnswerSlices): void {
    if (slices === null) {
      if (this.#inOrder ? seq > sc.sendSeq : sc.inFlight.size > 0) {
        sc.requestClose(this.#inOrder ? seq - 1 : -1)
        return
      }
      sc.connection.endAfterFlush(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed by the protocol instead of an answer'))
      return
    }
    if (!this.#inOrder) {
      if (slices.length > 0) this.#send(sc, slices)
      return
    }
    if (seq !== sc.sendSeq) {
      sc.hold(seq, slices.length === 0 ? null : slices)
      this.#afterHold(sc)
      return
    }
    if (slices.length > 0) this.#send(sc, slices)
    this.#advance(sc)
  }

  // The answer of sc.sendSeq went out: the ones held behind it follow, in
  // order, each after the parts of its streamed answer written before its turn.
  #advance (sc: ServerConnection): void {
    for (;;) {
      sc.sendSeq++
      if (sc.closeAfterSeq >= 0 && sc.sendSeq > sc.closeAfterSeq) {
        sc.connection.endAfterFlush()
        return
      }
      if (sc.heldBytes === 0) return
      const parts = sc.takeParts()
      if (parts !== undefined) for (const part of parts) this.#send(sc, part)
      const slices = sc.takeNext()
      if (slices === undefined) return
      if (slices !== null && slices.length > 0) this.#send(sc, slices)
    }
  }

  /** One part of `call`'s streamed answer (`ctx.write`): sent now in its turn, else held until it comes. */
  writePart (sc: ServerConnection, call: InboundCall, part: unknown): boolean {
    const encode = this.#protocol.encodePart
    if (encode === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `the ${this.#protocol.name} protocol has no encodePart: it cannot stream answers`)
    if (sc.connection.isClosed || call.abandoned) return false
    const slices = encode(call, part)
    if (!this.#inOrder || call.seq === sc.sendSeq) {
      if (slices.length > 0) this.#send(sc, slices)
    } else {
      sc.holdPart(call.seq, slices)
      this.#afterHold(sc)
    }
    return !sc.connection.isClosed
  }

  // A call that asked to close its connection (requestClose: nothing more
  // is read) was answered: the connection ends once the requests before it
  // are answered too (in order: #advance ends it when its turn has passed;
  // by id: when no call is in flight).
  #closeAfter (sc: ServerConnection): void {
    if (this.#inOrder ? sc.sendSeq <= sc.closeAfterSeq : sc.inFlight.size > 0) return
    sc.connection.endAfterFlush()
  }

  // Held answers count against the connection's outbound bound.
  #afterHold (sc: ServerConnection): void {
    if (sc.connection.outboundBytes + sc.heldBytes > sc.connection.maxOutboundBytes) this.#overBound(sc)
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
    if (this.#orphans.size > 0) this.#orphans.delete(call)
    sc.inFlight.delete(this.#bySeq ? call.seq | 0 : call.callId | 0)
    // By id, a connection asked to close waits for its last call (answered just after this).
    if (sc.closing && !this.#inOrder && sc.inFlight.size === 0 && !call.closeAfter) queueMicrotask(() => this.#endWithLastWords(sc))
    return sc.connection.isClosed ? undefined : sc
  }

  // By id, a closing connection's last call was answered: its protocolError answer (if any), then the end.
  #endWithLastWords (sc: ServerConnection): void {
    const words = sc.lastWords
    sc.lastWords = null
    if (words !== null && words.length > 0 && !sc.connection.isClosed) this.#send(sc, words)
    sc.connection.endAfterFlush()
  }

  #send (sc: ServerConnection, slices: Uint8Array[]): void {
    let bytes = 0
    for (const slice of slices) bytes += slice.length
    if (!sc.connection.send({ slices: slices as Buffer[], bytes })) this.#overBound(sc)
  }

  #overBound (sc: ServerConnection): void {
    if (sc.connection.isClosed) return
    this.#host.log.warn(`closing ${sc.remoteAddress}: it reads responses slower than they are produced (outbound bound exceeded)`)
    sc.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
  }
}

type CallFactory = (...args: ConstructorParameters<CallConstructor>) => InboundCall

function checkFilters (filters: readonly Filter[]): readonly Filter[] {
  for (const filter of filters) if (typeof filter !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a filter must be a function (request, ctx, next)')
  return filters
}

// A call object's constructor behind a small function of its own, made once
// per group: `new group.callType(...)` in onFrame went through V8's generic
// construct stub for a protocol's subclass (~100 instructions a call more,
// counted with bench/server-instructions.ts).
function callFactory (type: CallConstructor): CallFactory {
  return (route, peer, callId, receivedAt, timeoutMs, data, request, clock) => new type(route, peer, callId, receivedAt, timeoutMs, data, request, clock)
}

// An answer encoded into a buffer of its own (it waits for its turn).
function encodeOwn (protocol: ServerProtocol, call: AnsweredCall, response: unknown, bytes: number): Buffer {
  const out = Buffer.allocUnsafe(bytes)
  protocol.encodeInto(call, response, out, 0)
  return out
}

// What a handler threw, as a message; never throws itself (a thrown value may refuse String()).
function describeFailure (err: unknown): string {
  try {
    return err instanceof Error ? String(err.message) : String(err)
  } catch {
    return 'the handler failed with a value that has no string form'
  }
}

