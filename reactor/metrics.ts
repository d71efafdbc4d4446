import { Registry } from 'prom-client'

/**
 * Per-service and per-method metrics of the server, after Kudu's
 * `rpc_incoming_queue_time`, handler latency histograms and the service
 * pool's overflow and timeout counters (docs/design.md, 'Metrics').
 *
 * The hot path touches only plain numbers here: a histogram is a fixed array
 * of bucket counts, a counter a field. prom-client reads them when scraped,
 * through collectors registered on a registry of this server's own (so two
 * servers in one process never share or collide), and its
 * `AggregatorRegistry` can sum them across reactor processes.
 */

/** Bucket upper bounds in milliseconds, from 50 µs to 30 s. */
export const LATENCY_BUCKETS_MS: readonly number[] = [
  0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000
]

/** A latency histogram with fixed buckets; observe is a few comparisons and two additions. */
export class LatencyHistogram {
  /** Observations per bucket (upper bounds 0.05 ms to 30 s, as `snapshot().buckets` lists them), the last one past 30 s. */
  readonly counts = new Float64Array(LATENCY_BUCKETS_MS.length + 1)
  /** Observations so far. */
  count = 0
  /** Their sum, in milliseconds. */
  sum = 0

  /** Counts one latency of `ms` milliseconds (a negative or NaN one as 0). */
  observe (ms: number): void {
    if (!(ms >= 0)) ms = 0
    let i = 0
    const bounds = LATENCY_BUCKETS_MS
    while (i < bounds.length && ms > bounds[i]!) i++
    this.counts[i]!++
    this.count++
    this.sum += ms
  }

  /** An upper estimate of quantile `q` (0..1): the bound of the bucket holding it; Infinity past the last bound. */
  quantile (q: number): number {
    if (this.count === 0) return Number.NaN
    const rank = Math.ceil(q * this.count)
    let seen = 0
    for (let i = 0; i < this.counts.length; i++) {
      seen += this.counts[i]!
      if (seen >= rank) return LATENCY_BUCKETS_MS[i] ?? Number.POSITIVE_INFINITY
    }
    return Number.POSITIVE_INFINITY
  }

  /** The histogram now, as plain numbers. */
  snapshot (): HistogramSnapshot {
    return {
      count: this.count,
      sumMs: this.sum,
      p50Ms: this.quantile(0.5),
      p99Ms: this.quantile(0.99),
      buckets: LATENCY_BUCKETS_MS.map((le, i) => ({ le, count: this.counts[i]! }))
    }
  }
}

/** A latency histogram at one moment, in milliseconds. */
export interface HistogramSnapshot {
  /** Observations so far. */
  count: number
  /** Their sum. */
  sumMs: number
  /** Upper bound of the bucket holding the median (NaN with no observation). */
  p50Ms: number
  /** Upper bound of the bucket holding the 99th percentile (NaN with no observation). */
  p99Ms: number
  /** Per-bucket (not cumulative) counts; the overflow bucket is `count` minus their sum. */
  buckets: Array<{
    /** The bucket's upper bound (inclusive). */
    le: number
    /** Observations in this bucket alone. */
    count: number
  }>
}

/** What happened to the calls of one method. */
export class MethodMetrics {
  /** Time from the frame's arrival to its handler's start. */
  readonly queueTime = new LatencyHistogram()
  /** Time the handler took, start to settled. */
  readonly handlerLatency = new LatencyHistogram()
  /** Calls a handler ran for. */
  handled = 0
  /** Refused because the service queue was full. */
  queueOverflows = 0
  /** Evicted from a full queue by a call with an earlier deadline. */
  evictions = 0
  /** Expired while waiting in the queue (never ran). */
  timedOutInQueue = 0
  /** Handler finished after the call's deadline (the client had given up). */
  timedOutOnResponse = 0
  /** Refused because the server was shutting down. */
  shutdownRejected = 0
  /** Handlers abandoned after running `abandonAfterMs` past their deadline (their workers given back). */
  abandoned = 0
}

/** Live sources of a service's gauges. */
export interface ServiceGauges {
  /** Calls waiting in the service's queue now. */
  queueLength: () => number
  /** Workers free now. */
  idleWorkers: () => number
  /** The service's workers (its concurrency). */
  workers: number
}

/** The counters and histograms of one method at one moment (see {@link MethodMetrics}). */
export interface MethodSnapshot {
  /** Calls a handler ran for. */
  handled: number
  /** Refused because the service queue was full. */
  queueOverflows: number
  /** Evicted from a full queue by a call with an earlier deadline. */
  evictions: number
  /** Expired while waiting in the queue (never ran). */
  timedOutInQueue: number
  /** Handler finished after the call's deadline. */
  timedOutOnResponse: number
  /** Refused because the server was shutting down. */
  shutdownRejected: number
  /** Handlers abandoned past their deadline (their workers given back). */
  abandoned: number
  /** Time from the frame's arrival to its handler's start. */
  queueTime: HistogramSnapshot
  /** Time the handler took, start to settled. */
  handlerLatency: HistogramSnapshot
}

/** One service (route group) at one moment: its queue, its workers and each method. */
export interface ServiceSnapshot {
  /** Calls waiting in its queue. */
  queueLength: number
  /** Workers free. */
  idleWorkers: number
  /** Its workers (its concurrency). */
  workers: number
  /** Each method's counters, by method name. */
  methods: Record<string, MethodSnapshot>
}

interface ServiceEntry {
  gauges: ServiceGauges
  methods: Map<string, MethodMetrics>
}

type Value = { labels: Record<string, string | number>, value: number, metricName?: string }

/** Server-wide counters of connections closed or refused by the limits, read when scraped. */
export interface LimitCounters {
  /** Connections closed after `idleTimeoutMs` without progress (also those stopped inside a frame). */
  idleClosed: number
  /** Connections closed because a frame took longer than `frameTimeoutMs` to arrive. */
  frameTimeouts: number
  /** Connections closed because the inbound buffer budget was exceeded. */
  inboundBudgetClosed: number
  /** Times reading from a connection was paused because the outbound budget was exceeded. */
  outboundPauses: number
  /** Connections refused at once: at `maxConnections` with none idle enough to close, and none negotiating. */
  connectionsRefused: number
  /** Idle connections closed to admit a newcomer at `maxConnections`. */
  connectionsEvicted: number
  /** Connections closed while negotiating to admit a newcomer (at either connection limit). */
  negotiatingEvicted: number
  /** accept() failures Node reported (EMFILE, ENFILE: out of descriptors), and accepted connections whose set-up threw (the protocol's `connectionState`, the TLS socket): closed. */
  acceptErrors: number
  /**
   * Scans that found the process at its descriptor limit. libuv then
   * accepts and closes new connections itself, unseen by the server
   * (Node reports no error), so this is how running out shows.
   */
  descriptorsExhausted: number
  /** Messages pushed (`ConnectionHandle.send`, one per member of a group send). */
  pushesSent: number
  /** Connections closed at once for unsent bytes over the hard push limit (`pushOutputLimit.hardBytes`). */
  pushHardLimitClosed: number
  /** Connections closed for unsent bytes over the soft push limit for `pushOutputLimit.softMs`. */
  pushSoftLimitClosed: number
  /** Connections closed because their frame in progress arrived below `minFrameBytesPerSecond`: by the scan past `slowFrameGraceMs`, or for a newcomer at `maxConnections` (those count in `connectionsEvicted` too). */
  slowFramesClosed: number
}

const LIMIT_COUNTERS: ReadonlyArray<[keyof LimitCounters, string, string]> = [
  ['idleClosed', 'nyala_connections_idle_closed_total', 'Connections closed after the idle timeout without progress (also those stopped inside a frame).'],
  ['frameTimeouts', 'nyala_connections_frame_timeout_total', 'Connections closed because a frame did not complete within the frame timeout.'],
  ['inboundBudgetClosed', 'nyala_connections_inbound_budget_closed_total', 'Connections closed because incomplete inbound frames passed their budget.'],
  ['outboundPauses', 'nyala_connections_outbound_paused_total', 'Times reading from a connection was paused because unsent answers passed their budget.'],
  ['connectionsRefused', 'nyala_connections_refused_total', 'Connections refused at the connection limit (none idle enough to close).'],
  ['connectionsEvicted', 'nyala_connections_evicted_total', 'Idle connections closed to admit a newcomer at the connection limit.'],
  ['negotiatingEvicted', 'nyala_connections_negotiating_evicted_total', 'Negotiating connections closed to admit a newcomer at their limit.'],
  ['acceptErrors', 'nyala_accept_errors_total', 'accept() failures (EMFILE, ENFILE) and accepted connections whose set-up failed.'],
  ['descriptorsExhausted', 'nyala_descriptors_exhausted_total', 'Scans that found the process at its file descriptor limit (new connections are then dropped by libuv unseen).'],
  ['pushesSent', 'nyala_pushes_sent_total', 'Messages pushed to connections (one per member of a group send).'],
  ['pushHardLimitClosed', 'nyala_connections_push_hard_limit_closed_total', 'Connections closed at once for unsent pushed bytes over the hard limit.'],
  ['pushSoftLimitClosed', 'nyala_connections_push_soft_limit_closed_total', 'Connections closed for unsent pushed bytes over the soft limit for its whole period.'],
  ['slowFramesClosed', 'nyala_connections_slow_frame_closed_total', 'Connections closed because their frame in progress arrived below the minimum rate (by the scan, or for a newcomer at the connection limit).']
]

/** All metrics of one server. */
export class ServerMetrics {
  readonly #services = new Map<string, ServiceEntry>()
  #registry: Registry | null = null
  #limits: (() => LimitCounters) | null = null

  /** Where the server-wide limit counters are read from (the server sets it). */
  set limitCounters (read: () => LimitCounters) {
    this.#limits = read
  }

  /** Registers a service; `methods` are its method names. */
  addService (service: string, methods: readonly string[], gauges: ServiceGauges): Map<string, MethodMetrics> {
    const map = new Map<string, MethodMetrics>()
    for (const method of methods) map.set(method, new MethodMetrics())
    this.#services.set(service, { gauges, methods: map })
    return map
  }

  /** The live metrics of one method of a registered service, if both exist. */
  method (service: string, method: string): MethodMetrics | undefined {
    return this.#services.get(service)?.methods.get(method)
  }

  /** Everything, as plain numbers (readable from code and tests). */
  snapshot (): Record<string, ServiceSnapshot> {
    const out: Record<string, ServiceSnapshot> = {}
    for (const [name, entry] of this.#services) {
      const methods: Record<string, MethodSnapshot> = {}
      for (const [method, m] of entry.methods) {
        methods[method] = {
          handled: m.handled,
          queueOverflows: m.queueOverflows,
          evictions: m.evictions,
          timedOutInQueue: m.timedOutInQueue,
          timedOutOnResponse: m.timedOutOnResponse,
          shutdownRejected: m.shutdownRejected,
          abandoned: m.abandoned,
          queueTime: m.queueTime.snapshot(),
          handlerLatency: m.handlerLatency.snapshot()
        }
      }
      out[name] = { queueLength: entry.gauges.queueLength(), idleWorkers: entry.gauges.idleWorkers(), workers: entry.gauges.workers, methods }
    }
    return out
  }

  /** A prom-client registry whose collectors read these metrics when scraped. */
  get registry (): Registry {
    if (this.#registry === null) this.#registry = this.#buildRegistry()
    return this.#registry
  }

  /** The Prometheus text exposition. */
  text (): Promise<string> {
    return this.registry.metrics()
  }

  #buildRegistry (): Registry {
    const registry = new Registry()
    const histogram = (name: string, help: string, pick: (m: MethodMetrics) => LatencyHistogram): void => {
      registry.registerMetric(collector(name, help, 'histogram', () => {
        const values: Value[] = []
        this.#eachMethod((labels, m) => {
          const h = pick(m)
          let cumulative = 0
          LATENCY_BUCKETS_MS.forEach((le, i) => {
            cumulative += h.counts[i]!
            values.push({ metricName: `${name}_bucket`, labels: { ...labels, le: le / 1000 }, value: cumulative })
          })
          values.push({ metricName: `${name}_bucket`, labels: { ...labels, le: '+Inf' }, value: h.count })
          values.push({ metricName: `${name}_sum`, labels, value: h.sum / 1000 })
          values.push({ metricName: `${name}_count`, labels, value: h.count })
        })
        return values
      }))
    }
    const counter = (name: string, help: string, pick: (m: MethodMetrics) => number): void => {
      registry.registerMetric(collector(name, help, 'counter', () => {
        const values: Value[] = []
        this.#eachMethod((labels, m) => values.push({ labels, value: pick(m) }))
        return values
      }))
    }
    const gauge = (name: string, help: string, pick: (g: ServiceGauges) => number): void => {
      registry.registerMetric(collector(name, help, 'gauge', () => {
        const values: Value[] = []
        for (const [service, entry] of this.#services) values.push({ labels: { service }, value: pick(entry.gauges) })
        return values
      }))
    }
    histogram('nyala_rpc_incoming_queue_time_seconds', 'Time an inbound call waited between its arrival and its handler\'s start.', m => m.queueTime)
    histogram('nyala_handler_latency_seconds', 'Time a handler took to settle.', m => m.handlerLatency)
    counter('nyala_calls_handled_total', 'Calls a handler ran for.', m => m.handled)
    counter('nyala_rpcs_queue_overflow_total', 'Calls refused with ERROR_SERVER_TOO_BUSY because the service queue was full.', m => m.queueOverflows)
    counter('nyala_rpcs_evicted_total', 'Queued calls evicted by a call with an earlier deadline.', m => m.evictions)
    counter('nyala_rpcs_timed_out_in_queue_total', 'Calls whose deadline passed while they waited in the queue (never run).', m => m.timedOutInQueue)
    counter('nyala_rpcs_timed_out_on_response_total', 'Calls whose handler finished after their deadline.', m => m.timedOutOnResponse)
    counter('nyala_rpcs_shutdown_rejected_total', 'Calls answered FATAL_SERVER_SHUTTING_DOWN by the service queue.', m => m.shutdownRejected)
    counter('nyala_handlers_abandoned_total', 'Handlers still running abandonAfterMs past their deadline whose workers were given back.', m => m.abandoned)
    for (const [key, name, help] of LIMIT_COUNTERS) {
      registry.registerMetric(collector(name, help, 'counter', () => this.#limits === null ? [] : [{ labels: {}, value: this.#limits()[key] }]))
    }
    gauge('nyala_service_queue_length', 'Calls waiting in the service queue now.', g => g.queueLength())
    gauge('nyala_service_idle_workers', 'Workers parked now.', g => g.idleWorkers())
    gauge('nyala_service_workers', 'Workers of the service.', g => g.workers)
    return registry
  }

  #eachMethod (fn: (labels: { service: string, method: string }, m: MethodMetrics) => void): void {
    for (const [service, entry] of this.#services) {
      for (const [method, m] of entry.methods) fn({ service, method }, m)
    }
  }
}

// A metric in the shape prom-client's registry reads (and its
// AggregatorRegistry sums across processes), computed at scrape time.
function collector (name: string, help: string, type: 'counter' | 'gauge' | 'histogram', values: () => Value[]): Parameters<Registry['registerMetric']>[0] {
  const metric = {
    name,
    help,
    type,
    aggregator: 'sum',
    get: () => ({ name, help, type, aggregator: 'sum', values: values() }),
    reset: () => {}
  }
  return metric as unknown as Parameters<Registry['registerMetric']>[0]
}
