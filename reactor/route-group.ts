// Builds one group of routes as `ProtocolServer.addRoutes` registers it:
// the handlers checked, the group's metrics, its deadline-ordered queue and
// LIFO-parked workers (when the group is pooled), its abandonment limits
// and its own filters. Registration is a cold path: the call dispatch only
// keeps the group it returns and composes its filters.
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { RefusalReason } from '../codec/protocol.js'
import type { Clock } from '../scheduling/clock.js'
import { ServicePool } from './service-pool.js'
import type { Filter } from './filters.js'
import type { InboundCall } from './inbound-call.js'
import type { ServerMetrics } from './metrics.js'
import type { CallExecutor, Route, RouteDefinition, RouteGroup, RouteGroupOptions, RouteHandlers } from './route-table.js'
import type { GroupDefaults } from './server-options.js'

/** The most workers a sequential group gets by default (each parked worker costs a slot and a callback). */
export const MAX_SESSION_WORKERS = 65_536

/** What a group is built with: the server's defaults, and how the call dispatch runs and refuses its calls. */
export interface RouteGroupParts {
  readonly defaults: GroupDefaults
  /** Every group queues on workers (the server's `scheduling: 'pooled'`); else only groups with an executor do. */
  readonly pooled: boolean
  readonly metrics: ServerMetrics
  /** The protocol's `execution`, for groups that do not say. */
  readonly execution: 'concurrent' | 'sequential'
  /** The workers of a sequential group by default: one per connection the server admits (`maxConnections`, at most MAX_SESSION_WORKERS). */
  readonly sessionWorkers: number
  readonly clock: Clock
  /** Runs a call on one of the group's workers, in this process. */
  readonly run: (call: InboundCall, worker: number) => Promise<void> | void
  /** Runs a call on `executor` (worker threads), the group's queue being `service`. */
  readonly runElsewhere: (call: InboundCall, worker: number, executor: CallExecutor, service: ServicePool) => Promise<void> | undefined
  /** Answers a call the queue refused (busy, expired, shutdown). */
  readonly reject: (call: InboundCall, reason: RefusalReason, message: string) => void
}

/** The group `name` of `handlers`, ready to route; throws RPC_ERR_INVALID_ARGUMENT for a route without a handler or a filter that is not a function. */
export function makeRouteGroup (name: string, handlers: RouteHandlers, options: RouteGroupOptions, parts: RouteGroupParts): RouteGroup {
  const defaults = parts.defaults
  const executor = options.executor ?? null
  const definitions = new Map<string, RouteDefinition>()
  for (const [method, entry] of Object.entries(handlers)) {
    const definition = typeof entry === 'function' ? { handler: entry } : entry
    if (typeof definition?.handler !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `no handler for ${name}.${method}`)
    definitions.set(method, definition as RouteDefinition)
  }
  const pooled = parts.pooled || executor !== null
  const execution = options.execution ?? parts.execution
  if (execution !== 'concurrent' && execution !== 'sequential') throw new RpcError(ErrorCode.INVALID_ARGUMENT, `group ${name}: execution must be 'concurrent' or 'sequential', got ${String(execution)}`)
  const sequential = execution === 'sequential'
  // A sequential group's pool holds at most one call per connection: by default every session has a slot, so none waits for another's slow call.
  const workers = executor !== null ? executor.workers : options.workers ?? (sequential ? parts.sessionWorkers : defaults.workers)
  let service: ServicePool | null = null
  const metrics = parts.metrics.addService(name, [...definitions.keys()], {
    workers: pooled ? workers : 0,
    queueLength: () => service?.pool.queueLength ?? 0,
    idleWorkers: () => service?.pool.idleWorkers ?? 0
  })
  if (pooled) {
    const run = executor === null ? parts.run : (call: InboundCall, worker: number) => parts.runElsewhere(call, worker, executor, service!)
    service = new ServicePool({
      workers,
      queueLength: options.queueLength ?? defaults.queueLength,
      discipline: options.queue ?? defaults.queue,
      clock: parts.clock,
      run,
      reject: parts.reject,
      metrics,
      burstLimit: defaults.burstLimit,
      holdWindowMs: executor?.holdWindowMs
    })
  }
  const group: RouteGroup = {
    name,
    routes: new Map(),
    metrics,
    service,
    executor,
    sequential,
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
  return group
}

/** `filters`, once each is known to be a function; throws RPC_ERR_INVALID_ARGUMENT otherwise. */
export function checkFilters (filters: readonly Filter[]): readonly Filter[] {
  for (const filter of filters) if (typeof filter !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a filter must be a function (request, ctx, next)')
  return filters
}
