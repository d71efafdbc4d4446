import { ErrorCode, RpcError } from '../codec/errors.js'
import type { RefusalReason } from '../codec/protocol.js'
import type { InboundCall } from './inbound-call.js'
import type { Logger } from './logger.js'
import type { Route, RouteGroup } from './route-table.js'
import type { ServerConnection } from './server-connection.js'

/** What abandonment needs of the call dispatch around it. */
export interface AbandonmentHost {
  /** The open connections: their calls in flight are judged by their deadlines. */
  readonly connections: Iterable<ServerConnection>
  readonly stats: { handlersAbandoned: number }
  readonly log: Logger
  /** Answers the call in the protocol's words (`abandoned`). */
  refuse: (call: InboundCall, reason: RefusalReason, message: string) => void
}

/**
 * Handlers that run too long are abandoned: one still running
 * `abandonAfterMs` past its call's deadline, or past its connection's
 * close, gives its worker back (its call answered `abandoned`, its result
 * dropped when it settles), while its group has fewer than
 * `maxAbandonedHandlers` abandoned ones still running. In-loop handlers
 * only: a call on an executor holds its worker until done.
 */
export class Abandonment {
  readonly #host: AbandonmentHost
  /** Calls whose connection closed while their handler ran. */
  readonly #orphans = new Set<InboundCall>()

  constructor (host: AbandonmentHost) {
    this.#host = host
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

  /** The call's connection closed while its in-loop handler runs: it is watched. */
  orphaned (call: InboundCall): void {
    if (!Number.isNaN(call.handledAt) && call.owner !== null && call.worker >= 0) this.#orphans.add(call)
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
    this.#host.refuse(call, 'abandoned', `handler abandoned: still running ${group.abandonAfterMs} ms after its ${what}`)
    pool.abandon(worker)
  }
}
