import { ErrorCode, RpcError } from '../codec/errors.js'
import { encodeToSlices, returnedValue } from '../codec/frame-sink.js'
import { CallHead, InvalidRequest, type AnswerSlices, type RefusalReason, type ServerProtocol } from '../codec/protocol.js'
import type { Clock } from '../scheduling/clock.js'
import { Abandonment } from './abandonment.js'
import { AnswerWriter, ByIdAnswers, ID_IN_FLIGHT, ID_OK, InOrderAnswers, type AnswerOrder, type ConnectionAnswers, type IdCheck } from './answer-order.js'
import type { ServicePool } from './service-pool.js'
import { InboundCall } from './inbound-call.js'
import { composeFilters, type CallEndObserver, type CallOutcome, type EndedCall, type Filter } from './filters.js'
import type { ServerMetrics } from './metrics.js'
import { MAX_SESSION_WORKERS, checkFilters, makeRouteGroup, type RouteGroupParts } from './route-group.js'
import { DEFAULT_SESSION_QUEUE_LENGTH, SessionOrder, SessionQueue } from './session-order.js'
import { RouteTable, type CallExecutor, type Route, type RouteGroup, type RouteGroupOptions, type RouteHandlers } from './route-table.js'
import type { ServerContext } from './server-context.js'
import type { ServerCounters } from './server-counters.js'
import { atLeastOne, groupDefaultsOf, type GroupDefaults } from './server-options.js'
import type { ConnectionRecord } from './connection-record.js'

export type { Handler } from './filters.js'
export type { CallExecutor, RouteDefinition, RouteGroupOptions, RouteHandlers } from './route-table.js'

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
  readonly #ctx: ServerContext<ConnectionRecord>
  readonly #clock: Clock
  readonly #counters: ServerCounters
  readonly #defaults: GroupDefaults
  /** What `addRoutes` builds a group with. */
  readonly #groupParts: RouteGroupParts
  /** When answers may leave: in request order, or as they are ready (by id). */
  readonly #order: AnswerOrder
  readonly #writer: AnswerWriter
  readonly #head = new CallHead()
  readonly #routes = new RouteTable()
  readonly #abandonment: Abandonment
  /** Until ready, calls to unknown groups are refused `unavailable` rather than `no-service`. */
  #ready: boolean
  /** While closing: told once no call is in flight on any connection. */
  #drained: (() => void) | null = null
  /** The call `onFrame` is submitting, so a handler it starts at once takes its start time from #lastNow. */
  #submitting: InboundCall | null = null
  // One clock reading per read, not per frame: the frames of one read were
  // received together, at the read. #lastNow is the latest reading taken
  // while handling it (the read's, or the last call's settlement): the time
  // a call handed straight to a worker starts.
  #stampConnection: ConnectionRecord | null = null
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
  /** Sequential groups: each connection's calls one at a time (session-order.ts). */
  readonly #sessions: SessionOrder<InboundCall>

  constructor (ctx: ServerContext<ConnectionRecord>, metrics: ServerMetrics, maxSessions: number) {
    const protocol = ctx.protocol
    this.#protocol = protocol
    this.#ctx = ctx
    this.#clock = ctx.clock
    this.#counters = ctx.counters
    this.#defaults = groupDefaultsOf(ctx.options)
    this.#groupParts = {
      defaults: this.#defaults,
      pooled: ctx.options.scheduler !== 'direct',
      metrics,
      execution: protocol.execution ?? 'concurrent',
      sessionWorkers: Math.min(maxSessions, MAX_SESSION_WORKERS),
      clock: ctx.clock,
      run: this.#run,
      runElsewhere: (call, worker, executor, service) => this.#runElsewhere(call, worker, executor, service),
      reject: this.#reject
    }
    this.#ready = ctx.options.ready ?? true
    const duplicateIds = protocol.duplicateIds ?? 'close'
    if (duplicateIds !== 'close' && duplicateIds !== 'allow') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: duplicateIds must be 'close' or 'allow', got ${String(duplicateIds)}`)
    this.#writer = new AnswerWriter(protocol, ctx.log)
    this.#order = protocol.ordering === 'in-order' ? new InOrderAnswers(this.#writer) : new ByIdAnswers(this.#writer, duplicateIds === 'allow')
    this.#abandonment = new Abandonment(ctx, () => this.#routes.groups(), this.#reject)
    // A sequential call's turn: into its group's pool, or to its handler at once without one. `maxSessions`: a sequential group's default workers.
    this.#sessions = new SessionOrder(atLeastOne(ctx.options.sessionQueueLength ?? DEFAULT_SESSION_QUEUE_LENGTH, 'sessionQueueLength'),
      (call) => { const pool = (call.route as Route).group.service; if (pool === null) this.#runHandler(call); else pool.submit(call) }, this.#reject)
  }

  /** When answers may leave (in request order, or by id): each connection's `answers` are made with it. */
  get answerOrder (): AnswerOrder {
    return this.#order
  }

  /** Handlers that overran are abandoned: a guard the server's scan runs. */
  get abandonment (): Abandonment {
    return this.#abandonment
  }

  /** The routes are registered: unknown groups are now refused `no-service` rather than `unavailable`. */
  markReady (): void {
    this.#ready = true
  }

  /**
   * Calls `drained` once no call is in flight on any connection: now, or
   * after the answer or close that ends the last one (null: stop watching).
   */
  whenDrained (drained: (() => void) | null): void {
    this.#drained = drained
    this.checkDrained()
  }

  /** Tells `whenDrained`'s callback if no call is in flight any more (a connection closed). */
  checkDrained (): void {
    const drained = this.#drained
    if (drained === null) return
    for (const sc of this.#ctx.connections) if (sc.inFlight.size > 0) return
    drained()
  }

  /** Registers a group of routes; see `ProtocolServer.addRoutes`. */
  addRoutes (name: string, handlers: RouteHandlers, options: RouteGroupOptions = {}): void {
    if (this.#routes.has(name)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} is already registered`)
    const group = makeRouteGroup(name, handlers, options, this.#groupParts)
    this.#compose(group)
    this.#routes.add(group)
  }

  /** Adds a filter around every group's handlers, those registered later too (outside the groups' own filters; the first added is outermost). */
  use (filter: Filter): void {
    checkFilters([filter])
    this.#filters.push(filter)
    for (const group of this.#routes.groups()) this.#compose(group)
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
  #endedHead (sc: ConnectionRecord, reason: RefusalReason, message: string, detail: unknown): void {
    const head = this.#head
    this.#ended({ service: head.service, method: head.method, callId: head.callId, user: sc.peer.user, remoteAddress: sc.remoteAddress, receivedAt: this.#readAt }, reason, message, detail)
  }

  /** The executors of the groups that have one (their `ready` and `close`). */
  get executors (): CallExecutor[] {
    const out: CallExecutor[] = []
    for (const group of this.#routes.groups()) if (group.executor !== null) out.push(group.executor)
    return out
  }

  /** Abandoned handlers still running, over all groups. */
  get abandonedRunning (): number {
    return Abandonment.running(this.#routes.groups())
  }

  /** Stops taking calls: new ones are refused `shutdown`, queued ones drain within `graceMs`, then get `shutdown`. */
  close (graceMs: number): void {
    this.#closing = true
    for (const group of this.#routes.groups()) void group.service?.close(graceMs)
  }

  /** One request frame of a set-up connection; false: stop reading it. */
  onFrame (sc: ConnectionRecord, buf: Buffer, start: number, end: number): boolean {
    const answers = sc.answers
    if (answers.closing) return false
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
    const order = this.#order
    const seq = order.place(answers)
    const callId = head.callId
    const idCheck = order.checkId(answers, callId)
    if (idCheck !== ID_OK) return this.#badId(sc, callId, idCheck)
    const key = order.key(seq, callId)
    this.#counters.callReceived()

    if (this.#closing) return this.#refuseHead(sc, seq, 'shutdown', 'server is shutting down')
    if (sc.scan.retiredAt >= 0) return this.#refuseHead(sc, seq, 'shutdown', 'connection reached its maximum age; reconnect')
    const route = this.#routes.find(head)
    if (route === undefined) return this.#unrouted(sc, seq)
    let request: unknown
    try {
      request = protocol.decodeRequest(route, buf, head)
    } catch (err) {
      request = new InvalidRequest(`the request could not be decoded: ${describeFailure(err)}`, err)
    }
    if (request instanceof InvalidRequest) return this.#refuseHead(sc, seq, 'invalid', request.message, request.detail)
    const group = route.group
    const call = new InboundCall(route, sc.peer, head.callId, receivedAt, head.timeoutMs > 0 ? head.timeoutMs : this.#defaults.requestTimeoutMs, head.data, request, this.#clock)
    call.owner = answers
    call.seq = seq
    sc.inFlight.set(key, call)
    this.#submitting = call
    if (group.sequential) this.#sessions.enter(sc.sequence ??= new SessionQueue(sc.handle!), call)
    else if (group.service === null) this.#runHandler(call)
    else this.#handOff(group.service, call, group.executor === null)
    this.#submitting = null
    return !sc.connection.isClosed && !answers.closing
  }

  // A call into its group's pool: an in-loop handler runs here, on the worker the pool lends
  // (as its own hand-off would, without the trip through it: ~580 instructions a call).
  #handOff (service: ServicePool, call: InboundCall, inLoop: boolean): void {
    const worker = inLoop ? service.claim(call, this.#lastNow) : -1
    if (worker < 0) return service.submit(call, this.#lastNow)
    call.worker = worker
    let pending: Promise<void> | undefined
    try {
      pending = this.#runHandler(call)
    } catch (err) {
      service.ran(worker, undefined)
      throw err
    }
    service.ran(worker, pending)
  }

  /** The connection closed: its calls' signals abort; handlers still running are watched for abandonment. */
  connectionClosed (sc: ConnectionRecord, error: RpcError | undefined): void {
    if (sc.inFlight.size === 0) return
    if (sc.sequence !== null) this.#sessions.closed(sc.sequence)
    const reason = error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed')
    for (const call of sc.inFlight.values()) {
      call.abort(reason)
      // A handler still running after the abort (it ignores its signal) is watched.
      this.#abandonment.orphaned(call, sc.closedAt)
    }
  }

  // Answers a request whose group or route is not here.
  #unrouted (sc: ConnectionRecord, seq: number): boolean {
    const head = this.#head
    if (!this.#routes.has(head.service)) {
      return this.#ready
        ? this.#refuseHead(sc, seq, 'no-service', `service ${head.service} not registered on this server`)
        : this.#refuseHead(sc, seq, 'unavailable', `service unavailable: service ${head.service} not registered yet`)
    }
    return this.#refuseHead(sc, seq, 'no-method', `call on service ${head.service} received with an invalid method name: ${head.method}`)
  }

  // Answers a request refused before it became a call (a method, not a closure per frame).
  #refuseHead (sc: ConnectionRecord, seq: number, reason: RefusalReason, message: string, detail?: unknown): boolean {
    this.#counters.callFailed()
    if (this.#observers !== null) this.#endedHead(sc, reason, message, detail)
    const answers = sc.answers
    this.#order.emit(answers, seq, this.#protocol.refusal(this.#head, reason, message, detail, sc.state))
    return !sc.connection.isClosed && !answers.closing
  }

  /**
   * The connection's framing refused its stream (after set-up): answered
   * like a head `decodeHead` refused. True: this took the connection over
   * (it reads nothing more and ends after the answer). False: the protocol
   * has no answer for it (no protocolError; e.g. a frame over
   * maxMessageBytes refused at its prefix): a bad frame, counted and logged
   * here, and the connection closes with `error`.
   */
  framingError (sc: ConnectionRecord, error: RpcError): boolean {
    if (this.#protocol.protocolError === undefined || sc.answers.closing) {
      if (sc.badFrame) return false
      sc.badFrame = true
      this.#counters.badFrame(sc.remoteAddress, `${error.message}; closing the connection`, error.code)
      return false
    }
    this.#protocolError(sc, error)
    return true
  }

  // A stream the protocol cannot go on reading: its protocolError answer
  // (if any) goes out after the answers before it, then the connection ends.
  #protocolError (sc: ConnectionRecord, error: RpcError): false {
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
    sc.badFrame = true
    // The peer is told in its protocol's words: a client's mistake, not the server's trouble.
    this.#counters.badFrame(sc.remoteAddress, `${error.message}; answered, closing the connection`, error.code)
    return this.#order.lastWords(sc.answers, answer)
  }

  // A call id the connection cannot take: the peer is broken.
  #badId (sc: ConnectionRecord, callId: number, check: IdCheck): false {
    const why = check === ID_IN_FLIGHT ? `received duplicate call id ${callId}` : `call id ${callId} is not a 32-bit integer`
    return this.#badFrame(sc, new RpcError(ErrorCode.MALFORMED_FRAME, why))
  }

  #badFrame (sc: ConnectionRecord, error: RpcError): false {
    // The stream can no longer be trusted: close without a reply (the
    // answers to the frames before it, already queued, still go out).
    sc.badFrame = true
    this.#counters.badFrame(sc.remoteAddress, `${error.message}; closing the connection`, error.code)
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
      // Still running at a scan abandonAfterMs past its deadline, it is abandoned (Abandonment, a guard of the scan).
      return (result as Promise<unknown>).then((response) => this.#respond(call, response), (err: unknown) => this.#handlerFailed(call, err))
    }
    this.#respond(call, result)
    return undefined
  }

  // Runs the call on its group's executor (worker thread `worker`); the
  // promise settles once the call is answered, which releases that slot.
  #runElsewhere (call: InboundCall, worker: number, executor: CallExecutor, service: ServicePool): Promise<void> | undefined {
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
    return result.then((response) => this.#respond(call, response), (err: unknown) => this.#handlerFailed(call, err)).then(() => service.progressed())
  }

  #handlerFailed (call: InboundCall, err: unknown): void {
    if (call.abandoned && this.#abandonment.settled(call)) return
    // A handler that gave up at its deadline (the signal's own reason) is
    // not a failure of the handler: the protocol answers it as a timeout.
    if (err instanceof RpcError && err.code === ErrorCode.DEADLINE_EXCEEDED && (err === call.abortReason || call.isExpired)) {
      this.#refuse(call, 'timed-out', `${call.service}.${call.method} timed out: its handler gave up at the call's deadline`, err)
      return
    }
    this.#refuse(call, 'failed', describeFailure(err), err)
  }

  // Answers the call with its handler's result. The frame goes out first;
  // the bookkeeping (metrics, in-flight table) follows, off the path of a
  // synchronous caller waiting for the answer.
  #respond (call: InboundCall, response: unknown): void {
    // An abandoned handler settled at last: its result is dropped.
    if (call.abandoned && this.#abandonment.settled(call)) return
    const answers = call.owner
    if (answers === null || answers.connection.isClosed) {
      if (answers !== null && this.#observers !== null) this.#ended(call, 'closed', 'the connection closed before the answer was sent')
      this.#release(call)
      if (call.session !== null) this.#sessions.left(call)
      return
    }
    const order = this.#order
    const inTurn = order.inTurn(answers, call)
    try {
      // The answer order's writer encodes it: in its turn in place, else held for it.
      this.#writer.answer(answers, call, response, inTurn)
    } catch (err) {
      // Nothing the encoder added is queued.
      this.#refuse(call, 'failed', `handler of ${call.service}.${call.method} returned an invalid response: ${describeFailure(err)}`, err)
      return
    }
    this.#counters.callSucceeded()
    if (this.#observers !== null) this.#ended(call, 'ok', '')
    const settledAt = call.metrics === null ? 0 : (this.#lastNow = this.#clock.now())
    this.#release(call, settledAt)
    if (inTurn) order.answered(answers, call)
    if (call.closeAfter) order.closeAfter(answers)
    if (call.session !== null) this.#sessions.left(call) // sequential: the connection's next call
    if (this.#drained !== null) this.checkDrained()
  }

  // Answers the call in the protocol's words (the server answers it itself).
  #refuse (call: InboundCall, reason: RefusalReason, message: string, detail?: unknown): void {
    const owned = call.owner !== null
    const answers = this.#release(call)
    if (this.#observers !== null && owned) this.#ended(call, answers === undefined ? 'closed' : reason, answers === undefined ? 'the connection closed before the answer was sent' : message, detail)
    if (answers === undefined) { if (call.session !== null) this.#sessions.left(call); return }
    this.#counters.callFailed()
    this.#order.emit(answers, call.seq, this.#protocol.refusal(call, reason, message, detail, call.connectionState))
    if (call.closeAfter) this.#order.closeAfter(answers)
    if (call.session !== null) this.#sessions.left(call)
    if (this.#drained !== null) this.checkDrained()
  }

  // Ends the call's life on its connection; undefined when the connection is gone.
  #release (call: InboundCall, settledAt?: number): ConnectionAnswers | undefined {
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
    const answers = call.owner
    call.owner = null
    if (answers === null) return undefined
    this.#abandonment.forget(call)
    const order = this.#order
    answers.inFlight.delete(order.key(call.seq, call.callId))
    order.released(answers, call)
    return answers.connection.isClosed ? undefined : answers
  }
}

// What a handler threw, as a message; never throws itself (a thrown value may refuse String()).
function describeFailure (err: unknown): string {
  try {
    return err instanceof Error ? String(err.message) : String(err)
  } catch {
    return 'the handler failed with a value that has no string form'
  }
}

