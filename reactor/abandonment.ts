import { ErrorCode, RpcError } from '../codec/errors.js'
import type { RefusalReason } from '../codec/protocol.js'
import type { InboundCall } from './inbound-call.js'
import type { ConnectionGuard } from './connection-guard.js'
import type { Route, RouteGroup } from './route-table.js'
import type { ServerContext } from './server-context.js'
import type { ConnectionRecord } from './connection-record.js'

/**
 * Handlers that run too long are abandoned: one still running
 * `abandonAfterMs` past its call's deadline, or past its connection's
 * close, gives its worker back (its call answered `abandoned`, its result
 * dropped when it settles), while its group has fewer than
 * `maxAbandonedHandlers` abandoned ones still running. In-loop handlers
 * only: a call on an executor holds its worker until done. A guard of
 * the server: the scan looks for them.
 */
export class Abandonment implements ConnectionGuard<ConnectionRecord> {
  readonly #ctx: ServerContext<ConnectionRecord>
  readonly #groups: () => Iterable<RouteGroup>
  /** Answers the call in the protocol's words (`abandoned`). */
  readonly #refuse: (call: InboundCall, reason: RefusalReason, message: string) => void
  /** Calls whose connection closed while their handler ran, and when it closed. */
  readonly #orphans = new Map<InboundCall, number>()
  /** Some group abandons overdue handlers (as the scan was armed). */
  #abandoning = false

  constructor (ctx: ServerContext<ConnectionRecord>, groups: () => Iterable<RouteGroup>, refuse: (call: InboundCall, reason: RefusalReason, message: string) => void) {
    this.#ctx = ctx
    this.#groups = groups
    this.#refuse = refuse
  }

  /** The shortest `abandonAfterMs` of the groups: the scan looks at least this often. */
  scanEveryMs (): number {
    const ms = Abandonment.shortestMs(this.#groups())
    this.#abandoning = ms !== Infinity
    return ms
  }

  /** One scan tick: handlers that overran are abandoned. */
  tick (now: number): void {
    if (this.#abandoning) this.overdue(now)
  }

  /** The shortest `abandonAfterMs` of the groups (Infinity: none abandons). */
  static shortestMs (groups: Iterable<RouteGroup>): number {
    let ms = Infinity
    for (const group of groups) if (group.abandonAfterMs > 0) ms = Math.min(ms, group.abandonAfterMs)
    return ms
  }

  /** Abandoned handlers still running, over the groups. */
  static running (groups: Iterable<RouteGroup>): number {
    let n = 0
    for (const group of groups) n += group.abandoned
    return n
  }

  /** The call's connection closed (at `closedAt`) while its in-loop handler runs: it is watched. */
  orphaned (call: InboundCall, closedAt: number): void {
    if (!Number.isNaN(call.handledAt) && call.owner !== null && call.worker >= 0) this.#orphans.set(call, closedAt)
  }

  /** The call was answered: no longer watched. */
  forget (call: InboundCall): void {
    if (this.#orphans.size > 0) this.#orphans.delete(call)
  }

  /** An abandoned call's handler settled at last (true: its result is dropped). */
  settled (call: InboundCall): boolean {
    if (!call.abandoned) return false
    const group = (call.route as Route).group
    group.abandoned--
    return true
  }

  /**
   * Gives back the workers of handlers running `abandonAfterMs` past their
   * call's deadline or their connection's close (one pass of the server's
   * scan): the calls in flight on open connections, and the orphans of
   * closed ones.
   */
  overdue (now: number): void {
    for (const sc of this.#ctx.connections) {
      if (sc.inFlight.size === 0) continue
      for (const call of sc.inFlight.values()) {
        if (call.deadline < now) this.#maybeAbandon(call, call.deadline, 'deadline', now)
      }
    }
    for (const [call, closedAt] of this.#orphans) {
      if (call.owner === null) {
        this.#orphans.delete(call)
        continue
      }
      this.#maybeAbandon(call, Math.min(closedAt, call.deadline), 'connection closed', now)
    }
  }

  #maybeAbandon (call: InboundCall, since: number, what: string, now: number): void {
    const group = (call.route as Route).group
    const pool = group.service?.pool
    // Running in the loop (not queued, not elsewhere), long enough, and within the bound.
    if (pool === undefined || group.abandonAfterMs <= 0 || Number.isNaN(call.handledAt) || call.worker < 0 ||
      now - since < group.abandonAfterMs || group.abandoned >= group.maxAbandoned) return
    if (this.#orphans.size > 0) this.#orphans.delete(call)
    call.abandoned = true
    group.abandoned++
    this.#ctx.counters.handlerAbandoned()
    call.route.metrics.abandoned++
    this.#ctx.log.warn(`abandoning the handler of ${call.service}.${call.method} (call ${call.callId} from ${call.remoteAddress}): still running ${Math.round(now - since)} ms after its ${what}; its worker is given back and its result will be dropped`)
    call.abort(new RpcError(ErrorCode.DEADLINE_EXCEEDED, 'the handler was abandoned'))
    const worker = call.worker
    this.#refuse(call, 'abandoned', `handler abandoned: still running ${group.abandonAfterMs} ms after its ${what}`)
    pool.abandon(worker)
  }
}
