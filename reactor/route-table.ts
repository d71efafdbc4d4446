import type { CallHead } from '../codec/protocol.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import type { ServicePool } from './service-pool.js'
import type { Filter, Handler } from './filters.js'
import type { CallRoute, InboundCall } from './inbound-call.js'
import type { MethodMetrics } from './metrics.js'

/** A route with something the protocol needs to know about it (KRPC: the method's message types). */
export interface RouteDefinition<Req = unknown, Res = unknown, State = unknown> {
  /** Answers the route's calls. */
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
export interface CallExecutor<Data = unknown> {
  /** Workers (concurrent calls) it runs; the group's workers. */
  readonly workers: number
  /** Settles when the executor can take calls; `listen()` waits for it. */
  readonly ready?: Promise<void>
  /** How long held calls wait without a completion before the queue judges them (see ServicePool); default one turn. */
  readonly holdWindowMs?: number
  /** Runs `call` on worker `worker`; resolves with its answer, or rejects as a handler would. */
  run: (call: InboundCall<Data>, worker: number) => Promise<unknown>
  /** Stops the executor (`close()` waits for it). */
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
  executor?: CallExecutor<any>
  /** Filters around this group's handlers, inside the server's own (`ProtocolServer.use`); the first is outermost. */
  filters?: Array<Filter<Req, Res, State>>
  /**
   * `'sequential'`: one connection's calls of this group run one at a time,
   * in arrival order, each after the previous one was answered (a session:
   * PostgreSQL, Redis, MQTT); only a connection's head call enters the
   * group's queue, so `workers` counts sessions and defaults to
   * `maxConnections`. `'concurrent'`: every call enters the queue at once.
   * Default: the protocol's `execution`, else `'concurrent'`. See docs/scheduling.md.
   */
  execution?: 'concurrent' | 'sequential'
}

/** A registered group of routes: its queue and workers, its metrics, its filters. Internal. */
export interface RouteGroup {
  readonly name: string
  readonly routes: Map<string, Route>
  readonly metrics: ReadonlyMap<string, MethodMetrics>
  /** null in `direct` mode. */
  readonly service: ServicePool | null
  readonly executor: CallExecutor | null
  /** Its calls run one at a time per connection (`execution: 'sequential'`). */
  readonly sequential: boolean
  readonly abandonAfterMs: number
  readonly maxAbandoned: number
  /** Abandoned handlers that have not settled yet. */
  abandoned: number
  /** The group's own filters (inside the server's). */
  readonly filters: readonly Filter[]
  /** Executor groups: the server's and the group's filters, composed per call around the executor (empty: none). */
  chain: readonly Filter[]
}

/** One route of a group, as calls carry it. Internal. */
export interface Route extends CallRoute {
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
 * The server's groups of routes, and the lookup of a request's route: by
 * the identity of its head's `routeKey` when the protocol gives one (a
 * linear cache of a few, then a bounded map), else by its names.
 */
export class RouteTable {
  readonly #groups = new Map<string, RouteGroup>()
  readonly #routeKeys: object[] = []
  readonly #routes: Route[] = []
  readonly #routesByKey = new Map<object, Route>()

  /** A group of this name is registered. */
  has (name: string): boolean {
    return this.#groups.has(name)
  }

  /** Registers a group (its name is not taken yet); the route cache starts again. */
  add (group: RouteGroup): void {
    this.#groups.set(group.name, group)
    this.#routeKeys.length = 0
    this.#routes.length = 0
    this.#routesByKey.clear()
  }

  /** The registered groups, in registration order. */
  groups (): IterableIterator<RouteGroup> {
    return this.#groups.values()
  }

  /** The route the head names; undefined when none is registered. */
  find (head: CallHead): Route | undefined {
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
}
