/**
 * The one client engine under `ProtocolClient` and KRPC's `Client`: each
 * call's attempt (a connection, a deadline, the write), its settlement, and
 * the client's connections until they close.
 */
import { randomInt } from 'node:crypto'
import type { AnswerKind, ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { encodeToSlices, returnedValue, type FrameSink } from '../../codec/frame-sink.js'
import { realClock, type Clock } from '../../scheduling/clock.js'
import { DeadlineLists } from '../../scheduling/deadline-lists.js'
import { BusyPoller } from '../../transport/busy-poll.js'
import { RateLimitedLog, resolveLogger, type Logger } from '../logger.js'
import {
  DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_STREAM_PARTS, DEFAULT_TIMEOUT_MS, LOG_INTERVAL_MS, connectionOptionsOf,
  type ClientEngineOptions, type ClientHealthStats, type EngineConnectionStats
} from './client-engine-options.js'
import { expireCall } from './expire-call.js'
import { openConnection, type ConnectionSetup } from './open-connection.js'
import { FINISHED, QUEUED, SENDING, SENT, deliver, failEarly, invalid, newPendingCall, type CallConnection, type Callback, type PendingCall, type Reject } from './pending-call.js'
import { PushHub } from './pushes.js'
import { answerOf, checkRequest } from './request-checks.js'
import { Targets, dnsLookup, type Target } from './targets.js'

// What the protocol may send as the request's timeout: the attempt's (at least 1 ms), 0 for none.
function wireTimeoutOf (timeoutMs: number): number {
  return timeoutMs > 0 && Number.isFinite(timeoutMs) ? Math.max(1, timeoutMs) : 0
}

// Runs the protocol's encode into a sink of its own (a method, not a closure per call).
function encodeRequest (this: ClientProtocol<unknown, unknown>, call: PendingCall<unknown, unknown>, timeoutMs: number, out: FrameSink): void {
  this.encode(call.request, call.id, out, call.data, timeoutMs)
}

/**
 * The one client engine under `ProtocolClient` and KRPC's `Client`: targets
 * and their connections, each call's attempt (a connection, a deadline,
 * the write), the matching of answers (answers.ts) and every call's
 * settlement, exactly once. Retries are the retry loop's (retry-loop.ts),
 * around `attempt`.
 */
export class ClientEngine<Req, Res> {
  readonly protocol: ClientProtocol<Req, Res>
  readonly clock: Clock
  readonly log: Required<Logger>
  readonly targets: Targets
  /** Open connections by slot key; retired ones are in `#retired` until their last call settles. */
  readonly connections = new Map<string, CallConnection<Req, Res>>()
  readonly #retired = new Set<CallConnection<Req, Res>>()
  /** The connection the last call took: most calls take it again, without a lookup. */
  #last: CallConnection<Req, Res> | null = null
  readonly pushes: PushHub
  readonly inOrder: boolean
  readonly maxStreamParts: number
  /** The protocol has `answerOf`, so calls may have `maybe` answers (quiet requests). */
  readonly quietAnswers: boolean
  readonly defaultTimeoutMs: number
  /** The protocol's `isPush`: undefined for protocols without pushes, so that their answers pay one check. */
  readonly isPush: ((buf: Buffer, start: number, end: number) => boolean) | undefined
  readonly #deadlines: DeadlineLists<PendingCall<Req, Res>>
  readonly #maxInFlight: number
  readonly #setup: ConnectionSetup
  readonly #poller: BusyPoller | undefined
  readonly #logBroken: RateLimitedLog
  closed = false
  /** The protocol's `beforeSend`, as a connection's calls ask it. */
  readonly beforeSend: ((call: PendingCall<Req, Res>, session: unknown) => RpcError | undefined) | undefined
  /**
   * The callback-form call being started, while it is: one that fails then
   * is settled from setImmediate, its caller not having control back yet.
   */
  #startedCall: PendingCall<Req, Res> | null = null

  constructor (protocol: ClientProtocol<Req, Res>, options: ClientEngineOptions) {
    if (protocol.matching === 'id' && protocol.answerId === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `protocol ${protocol.name}: 'id' matching needs answerId`)
    this.protocol = protocol
    this.clock = options.clock ?? realClock
    this.inOrder = protocol.matching === 'in-order'
    this.#maxInFlight = options.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_TIMEOUT_MS
    this.isPush = protocol.isPush
    this.quietAnswers = protocol.answerOf !== undefined
    const beforeSend = protocol.beforeSend
    this.beforeSend = beforeSend === undefined ? undefined : (call, session) => beforeSend.call(protocol, call.request, call.data, session)
    this.maxStreamParts = options.maxStreamParts ?? DEFAULT_MAX_STREAM_PARTS
    if (!(this.maxStreamParts >= 1)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `maxStreamParts must be at least 1, got ${options.maxStreamParts}`)
    this.log = resolveLogger(options.logger)
    const now = (): number => this.clock.now()
    this.#logBroken = new RateLimitedLog(LOG_INTERVAL_MS, now)
    const log = this.log
    this.pushes = new PushHub(new RateLimitedLog(LOG_INTERVAL_MS, now), (m, f) => log.warn(m, f))
    this.#poller = (options.busyPollUs ?? 0) > 0 ? new BusyPoller(options.busyPollUs!) : undefined
    const { settings, maxResolvedAddresses } = connectionOptionsOf(protocol as ClientProtocol<unknown, unknown>, options, this.#poller)
    this.#setup = {
      settings,
      connectTimeoutMs: options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
      liveness: options.liveness === false || protocol.ping === undefined ? null : (options.liveness ?? {}),
      health: { pings: 0, unresponsive: 0 }
    }
    this.targets = new Targets({
      connectionsPerEndpoint: options.connectionsPerEndpoint ?? 1,
      policy: options.balance ?? 'p2c',
      resolveAll: options.resolveAll === true,
      maxResolvedAddresses,
      // Random per client: clients of the same name spread over all its addresses.
      subsetSeed: randomInt(0x100000000),
      lookup: options.lookup ?? dnsLookup,
      clock: this.clock,
      outstanding: (slot) => this.connections.get(slot.key)?.inFlight ?? 0,
      ejection: options.ejection === false ? null : (options.ejection ?? {})
    })
    this.#deadlines = new DeadlineLists<PendingCall<Req, Res>>(this.clock, (call, timeoutMs) => expireCall(this, call, timeoutMs), isFinished)
  }

  /** Calls waiting for an answer on any connection, retired ones included. */
  get pendingCalls (): number {
    let n = 0
    for (const cc of this.connections.values()) n += cc.inFlight
    for (const cc of this.#retired) n += cc.inFlight
    return n
  }

  /** Counters of each open connection. */
  connectionStats (): EngineConnectionStats[] {
    const out: EngineConnectionStats[] = []
    for (const cc of this.connections.values()) out.push({ endpoint: cc.endpoint, pendingCalls: cc.inFlight, ...cc.connection.stats() })
    return out
  }

  /** Outlier ejection and liveness counters. */
  health (): ClientHealthStats {
    const health = this.#setup.health
    return { ejection: this.targets.ejectionStats(), pings: health.pings, unresponsiveConnections: health.unresponsive }
  }

  /** The call in errors, without its endpoint. */
  describe (request: Req, data: unknown): string {
    return this.protocol.describe?.(request, data) ?? `${this.protocol.name} call`
  }

  /**
   * One attempt of a call at `target`: a connection, a deadline, the write.
   * It settles through `callback` when not null (never before this
   * returns), else through `resolve` or `reject`.
   */
  attempt (target: Target, request: Req, data: unknown, signal: AbortSignal | undefined, timeoutMs: number,
    resolve: (response: Res) => void, reject: Reject, callback: Callback<Res> | null): void {
    // What is rare stays out of line (this runs per call, and what the
    // compiler inlines into it has a budget): a closed client, a cancelled
    // call, names still resolving.
    if (this.closed || target.resolving !== null || signal?.aborted === true) return this.#notNow(target, request, data, signal, timeoutMs, resolve, reject, callback)
    const protocol = this.protocol
    let answer: AnswerKind = 'yes'
    if (protocol.answerOf !== undefined) {
      const asked = answerOf(protocol, this.inOrder, request)
      if (asked instanceof RpcError) return failEarly(asked, reject, callback)
      answer = asked
    }
    if (protocol.check !== undefined) {
      const problem = checkRequest(protocol, request, data)
      if (problem !== null) return failEarly(problem, reject, callback)
    }
    // The last call's connection, when its target has no other slot to give (most calls); else the balancer's pick.
    const last = this.#last
    const cc = last !== null && last.slot === target.soleSlot && !last.closed && !last.retired ? last : this.#connectionFor(target)
    if (cc instanceof RpcError) return failEarly(cc, reject, callback)
    if (cc.inFlight >= this.#maxInFlight) return failEarly(this.#tooManyInFlight(cc, request, data), reject, callback)
    const call = newPendingCall<Req, Res>(request, data, answer, cc, timeoutMs, resolve, reject, callback, signal)
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) this.#deadlines.arm(call, timeoutMs)
    if (signal !== undefined) {
      call.onAbort = () => this.#cancel(call)
      signal.addEventListener('abort', call.onAbort, { once: true })
    }
    if (callback === null) return this.#write(cc, call)
    // Calls can nest (a callback run while this one starts may start another): the outer one's comes back after.
    const outer = this.#startedCall
    this.#startedCall = call
    try {
      this.#write(cc, call)
    } finally {
      this.#startedCall = outer
    }
  }

  // `attempt` for a closed client, a cancelled call, or names still resolving.
  #notNow (target: Target, request: Req, data: unknown, signal: AbortSignal | undefined, timeoutMs: number,
    resolve: (response: Res) => void, reject: Reject, callback: Callback<Res> | null): void {
    if (this.closed) return failEarly(new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed'), reject, callback)
    if (signal?.aborted === true) return failEarly(new RpcError(ErrorCode.CANCELLED, `${this.describe(request, data)} was cancelled before it started`), reject, callback)
    // Names still resolving: this attempt starts once they are known.
    target.resolving!.then(() => this.attempt(target, request, data, signal, timeoutMs, resolve, reject, callback), (error: RpcError) => failEarly(error, reject, callback))
  }

  #tooManyInFlight (cc: CallConnection<Req, Res>, request: Req, data: unknown): RpcError {
    return new RpcError(ErrorCode.QUEUE_FULL, `${this.describe(request, data)} to ${cc.endpoint}: ${cc.inFlight} calls in flight on the connection (maxInFlight)`)
  }

  #write (cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    const id = cc.takeId()
    call.id = id
    call.seq = cc.nextSeq++
    // Registered before the write: the answer cannot come sooner, but the connection's failure can.
    if (call.answer === 'yes' && !this.inOrder && cc.liveness === null) cc.byId.set(id | 0, call)
    else this.#register(cc, call)
    // A call with an AbortSignal stays a transfer of its own, so that it can be dropped unsent when cancelled.
    const out = call.signal === undefined ? cc.connection.beginFrame() : null
    if (out === null) return this.#send(cc, call)
    // Written in place it is not asked again: the set-up is done, so its session is known now.
    const protocol = this.protocol
    const refusal = protocol.beforeSend === undefined ? undefined : protocol.beforeSend(call.request, call.data, cc.session)
    if (refusal !== undefined) {
      cc.connection.abortFrame()
      this.#unregister(cc, call)
      return this.fail(call, refusal)
    }
    // Encoded here, in this stack (TurboFan inlines the protocol's encoder), straight into the outbound slab.
    try {
      if (protocol.encode(call.request, id, out, call.data, wireTimeoutOf(call.timeoutMs)) !== undefined) throw returnedValue()
    } catch (err) {
      cc.connection.abortFrame()
      this.#unregister(cc, call)
      return this.fail(call, invalid(err))
    }
    if (!cc.connection.endFrame()) return this.#queueFull(cc, call)
    call.state = SENT
    if (call.answer === 'yes') cc.flushNeeded = false
    else this.#afterWrite(cc, call)
  }

  // The call's frame as a transfer of its own (droppable until its first
  // byte is written, and checked by `beforeSend` then), queued on its connection.
  #send (cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    try {
      const slices = encodeToSlices(encodeRequest, this.protocol as ClientProtocol<unknown, unknown>, call as PendingCall<unknown, unknown>, wireTimeoutOf(call.timeoutMs))
      let bytes = 0
      for (let i = 0; i < slices.length; i++) bytes += slices[i]!.length
      call.slices = slices
      call.bytes = bytes
    } catch (err) {
      this.#unregister(cc, call)
      return this.fail(call, invalid(err))
    }
    if (!cc.connection.send(call)) return this.#queueFull(cc, call)
    this.#afterWrite(cc, call)
  }

  #queueFull (cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    this.#unregister(cc, call)
    this.fail(call, new RpcError(ErrorCode.QUEUE_FULL, `${this.describe(call.request, call.data)} to ${cc.endpoint}: the connection's outbound queue is full`))
  }

  #register (cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    if (call.answer === 'no') return
    if (this.inOrder) cc.inOrder.push(call)
    else {
      cc.byId.set(call.id | 0, call)
      if (call.answer === 'maybe') cc.quiet.push(call)
    }
    cc.liveness?.waiting(cc.inFlight)
  }

  // Undoes #register of the call just registered (nothing was written).
  #unregister (cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    if (call.answer === 'no') return
    if (this.inOrder) {
      if (cc.inOrder.peekBack() === call) cc.inOrder.pop()
      return
    }
    if (cc.byId.get(call.id | 0) === call) cc.byId.delete(call.id | 0)
    if (call.answer === 'maybe' && cc.quiet.peekBack() === call) cc.quiet.pop()
  }

  #afterWrite (cc: CallConnection<Req, Res>, call: PendingCall<Req, Res>): void {
    if (call.answer === 'no') {
      this.succeed(call, this.protocol.silentResult!(call.request))
      return
    }
    if (call.answer !== 'maybe') {
      cc.flushNeeded = false
      return
    }
    // A quiet request: unless another request follows it this turn, send the protocol's flush request after it.
    cc.flushNeeded = true
    if (cc.flushScheduled || this.protocol.flushRequest === undefined) return
    cc.flushScheduled = true
    queueMicrotask(() => {
      cc.flushScheduled = false
      if (!cc.flushNeeded || cc.closed) return
      cc.flushNeeded = false
      // The flush request: an internal call, without a caller or a deadline.
      this.writeInternal(cc, this.protocol.flushRequest!())
    })
  }

  /** Settles `call` (unless it has settled) with its response; `taken`: it is out of its connection's id table already. */
  succeed (call: PendingCall<Req, Res>, response: Res, taken = false): void {
    if (call.state === FINISHED) return
    const cc = call.conn
    // Most answers: out of the table already, nothing else to undo (#finish does the rest, out of line).
    if (taken && call.signal === undefined && cc !== null && cc.liveness === null && !cc.retired) {
      call.state = FINISHED
      this.#deadlines.leave(call)
    } else {
      this.#finish(call, taken)
    }
    if (call.callback !== null) deliver(call.callback, null, response)
    else call.resolve(response)
  }

  /** Fails `call` unless it has settled. */
  readonly fail = (call: PendingCall<Req, Res>, error: RpcError): void => {
    if (call.state === FINISHED) return
    // Bytes handed to a socket that never connected did not reach the peer.
    const sent = call.state !== QUEUED && call.conn !== null && call.conn.connected
    this.#finish(call, false)
    const callback = call.callback
    if (callback === null) call.reject(error, sent, call.parts !== null)
    // Failed while it starts: its caller has not got control back yet.
    else if (call === this.#startedCall) setImmediate(deliver, callback, error, undefined)
    else deliver(callback, error, undefined)
  }

  #finish (call: PendingCall<Req, Res>, taken: boolean): void {
    call.state = FINISHED
    this.#deadlines.leave(call)
    if (call.signal !== undefined && call.onAbort !== undefined) call.signal.removeEventListener('abort', call.onAbort)
    const cc = call.conn
    if (cc === null) return
    // In-order calls keep their place until their answer comes.
    if (!taken && !this.inOrder && cc.byId.get(call.id | 0) === call) cc.byId.delete(call.id | 0)
    cc.liveness?.waiting(cc.inFlight)
    if (cc.retired && this.#drained(cc)) cc.connection.destroy()
  }

  // No call on `cc` waits for an answer (in order, settled calls keep their
  // place in the queue until theirs comes). Looked for from the newest: calls
  // settle mostly oldest first (answers come in order, equal deadlines pass in
  // order), so a call still waiting is found at once while there is one.
  #drained (cc: CallConnection<Req, Res>): boolean {
    if (!this.inOrder) return cc.byId.size === 0
    const queue = cc.inOrder
    for (let i = queue.length - 1; i >= 0; i--) if (queue.peekAt(i)!.state !== FINISHED) return false
    return true
  }

  #cancel (call: PendingCall<Req, Res>): void {
    if (call.state === FINISHED) return
    const error = new RpcError(ErrorCode.CANCELLED, `${this.describe(call.request, call.data)} to ${call.conn?.endpoint ?? '?'} was cancelled`)
    // Never truncate a frame nor release its buffers mid-write: wait.
    if (call.state === SENDING) call.pendingError = error
    else this.fail(call, error)
  }

  // The connection of the slot the target's balancer picks, opened if need be.
  #connectionFor (target: Target): CallConnection<Req, Res> | RpcError {
    const last = this.#last
    const slot = target.pick()
    if (slot === undefined) return new RpcError(ErrorCode.CONNECT_FAILED, `no address for ${target.name}`)
    if (last !== null && last.slot === slot && !last.closed && !last.retired) return last
    const existing = this.connections.get(slot.key)
    if (existing !== undefined) {
      this.#last = existing
      return existing
    }
    try {
      return openConnection(this, this.#setup, target, slot)
    } catch (err) {
      target.balancer.failed(slot)
      return err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${slot.address.host}:${slot.address.port}: ${(err as Error).message}`, { cause: err })
    }
  }

  /** Writes an internal call of `request` on `cc` (a flush request, a ping), without a caller or a deadline. */
  writeInternal (cc: CallConnection<Req, Res>, request: Req): void {
    this.#write(cc, newPendingCall<Req, Res>(request, undefined, 'yes', cc, 0, ignore, ignore, null, undefined))
  }

  /** `cc` must take no new calls (a fatal remote error, an in-order answer overdue): new calls open another; it closes once its last call settles. */
  retire (cc: CallConnection<Req, Res>, reason = 'a FATAL answer'): void {
    if (cc.retired || cc.closed) return
    if (this.connections.get(cc.key) === cc) this.connections.delete(cc.key)
    cc.retired = true
    if (this.#last === cc) this.#last = null
    this.#retired.add(cc)
    if (!this.closed) {
      this.log.info(`connection to ${cc.endpoint} retired after ${reason}; new calls open another`, { endpoint: cc.endpoint, pendingCalls: cc.inFlight, negotiated: cc.ready })
    }
  }

  /** The connection closed (or the client closes it): every call on it fails with `error`. */
  connectionClosed (cc: CallConnection<Req, Res>, error: RpcError): void {
    if (cc.closed) return
    cc.closed = true
    cc.liveness?.close()
    if (cc.connectTimer !== null) this.clock.clearTimer(cc.connectTimer)
    cc.connectTimer = null
    if (this.connections.get(cc.key) === cc) this.connections.delete(cc.key)
    if (this.#last === cc) this.#last = null
    this.#retired.delete(cc)
    const calls = this.inOrder ? cc.inOrder.toArray() : cc.byId.values()
    const pending = calls.length
    if (!cc.ready) cc.balancer.failed(cc.slot)
    // Calls lost with the connection count against its host (the client's own close does not).
    else if (pending > 0 && !this.closed) cc.balancer.callFailed(cc.slot)
    cc.inOrder.clear()
    cc.byId.clear()
    cc.quiet.clear()
    for (const call of calls) this.fail(call, error)
    cc.connection.destroy(error)
    if (!this.closed && !cc.retired) this.#logClose(cc, error, pending)
    if (cc.ready && this.pushes.hasCloseHandlers) this.pushes.connectionClosed({ endpoint: cc.endpoint, error })
  }

  // A lost connection: its calls' errors tell their callers; the log tells the rest.
  #logClose (cc: CallConnection<Req, Res>, error: RpcError, pendingCalls: number): void {
    const fields = { endpoint: cc.endpoint, pendingCalls, negotiated: cc.ready }
    const code = error.code
    if (cc.ready && error.remote === undefined && (code === ErrorCode.MALFORMED_FRAME || code === ErrorCode.FRAME_TOO_LARGE)) {
      // Not a peer going away: a server that broke the protocol after the
      // set-up. (Before it, the calls' own error names such a peer.)
      this.#logBroken.log((m, f) => this.log.warn(m, f), () => `closing the connection to ${cc.endpoint}: ${error.message}`, () => ({ ...fields, code }))
      return
    }
    this.log.info(`connection to ${cc.endpoint} closed: ${error.message}`, { ...fields, code })
  }

  /** Fails every pending call with `error` and closes every connection; later attempts fail at once. */
  close (error: RpcError): void {
    if (this.closed) return
    this.closed = true
    this.#poller?.stop()
    for (const cc of [...this.connections.values(), ...this.#retired]) this.connectionClosed(cc, error)
    // Every call has settled: the lists' timers have nothing left to wait for.
    this.#deadlines.close()
    this.pushes.end()
  }
}

function isFinished<Req, Res> (call: PendingCall<Req, Res>): boolean {
  return call.state === FINISHED
}

function ignore (): void {}

