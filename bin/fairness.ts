/**
 * `nyala fairness`: a functional test of the scheduler (docs/scheduling.md). A server with few workers
 * and a short queue, and more clients than it can serve, each looping on
 * `Sleep` with no think time. Every logical request keeps its deadline
 * across retries. With a FIFO queue that refuses newcomers, some clients
 * starve; with EDF and eviction of the latest deadline, a request that has
 * retried for a while outranks fresh ones and gets in.
 */
import { setMaxListeners } from 'node:events'
import { RpcError } from '../codec/errors.js'
import { Client } from '../reactor/krpc/client.js'
import { Server } from '../reactor/krpc/server.js'
import { ExponentialBackoff, LinearBackoff } from '../scheduling/retry.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'
import { serveFairness, type FairnessServer } from './fairness-cluster.js'

export interface FairnessOptions {
  queue: QueueDiscipline
  clients: number
  workers: number
  queueLength: number
  sleepMs: number
  deadlineMs: number
  runSeconds: number
  backoff: 'exp' | 'linear'
  /** Reactor processes; 1 serves in this process. Each has `workers` and `queueLength`. */
  reactors: number
  /** With several reactors: one scheduler shared by all (default), or one each. */
  sharedScheduler: boolean
}

export interface FairnessResult {
  queue: QueueDiscipline
  backoff: 'exp' | 'linear'
  reactors: number
  sharedScheduler: boolean
  /** Successful logical requests per client. */
  successes: number[]
  /** TOO_BUSY answers received (attempts, not logical requests). */
  tooBusy: number
  /** Logical requests that failed (deadline passed while retrying, or another error). */
  otherErrors: number
  /** Jain's fairness index of `successes`: 1 = perfectly even, 1/n = one client got everything. */
  jain: number
  /** Latency of successful logical requests, first attempt to answer. */
  latencyMs: { p50: number, p99: number, p999: number, p9999: number }
}

export const DEFAULT_FAIRNESS: FairnessOptions = {
  queue: 'edf', clients: 18, workers: 3, queueLength: 10, sleepMs: 100, deadlineMs: 8000, runSeconds: 5, backoff: 'exp', reactors: 1, sharedScheduler: true
}

/** Jain's index: (Σx)² / (n·Σx²). */
export function jainIndex (values: readonly number[]): number {
  let sum = 0
  let squares = 0
  for (const v of values) { sum += v; squares += v * v }
  return squares === 0 ? 1 : (sum * sum) / (values.length * squares)
}

/** The value at quantile q (0..1) of sorted `values` (nearest rank); NaN when empty. */
export function quantile (sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length)))
  return sorted[rank - 1]!
}

/** The server of one run: in this process, or in `reactors` processes. */
async function startServer (options: FairnessOptions): Promise<FairnessServer> {
  if (options.reactors > 1) return await serveFairness(options)
  const server = new Server({ workers: options.workers, queueLength: options.queueLength, queue: options.queue })
    .addService(CalculatorService, calculatorHandlers)
  const { port } = await server.listen(0)
  return {
    port,
    tooBusy: async () => {
      // Every ERROR_SERVER_TOO_BUSY the server answered: refused, evicted, or expired in the queue.
      const sleep = server.metrics.snapshot()[CalculatorService.fullName]?.methods.Sleep
      return sleep === undefined ? 0 : sleep.queueOverflows + sleep.evictions + sleep.timedOutInQueue
    },
    close: () => server.close({ graceMs: 0 })
  }
}

export async function runFairness (options: FairnessOptions): Promise<FairnessResult> {
  const server = await startServer(options)
  const port = server.port
  const endpoint = `127.0.0.1:${port}`
  const stop = new AbortController()
  // Every client's calls listen on it.
  setMaxListeners(0, stop.signal)
  const successes = new Array<number>(options.clients).fill(0)
  const latencies: number[] = []
  let otherErrors = 0
  const clients: Client[] = []
  const endAt = performance.now() + options.runSeconds * 1000
  const loop = async (i: number): Promise<void> => {
    // One client, one connection, no think time; the seed's Java clients
    // retried without a budget, so none here either.
    const client = new Client({
      endpoint,
      retry: { budget: null, backoff: options.backoff === 'exp' ? new ExponentialBackoff() : new LinearBackoff({ stepMs: 500 }) }
    })
    clients.push(client)
    const calc = client.service(CalculatorService)
    while (performance.now() < endAt) {
      const start = performance.now()
      try {
        await calc.Sleep({ sleep_micros: options.sleepMs * 1000 }, { timeoutMs: options.deadlineMs, signal: stop.signal })
        if (performance.now() <= endAt) {
          successes[i]!++
          latencies.push(performance.now() - start)
        }
      } catch (err) {
        if (stop.signal.aborted) break
        otherErrors++
        if (!(err instanceof RpcError)) throw err
      }
    }
  }
  const stopper = setTimeout(() => stop.abort(), options.runSeconds * 1000)
  try {
    await Promise.all(Array.from({ length: options.clients }, (_, i) => loop(i)))
  } finally {
    clearTimeout(stopper)
  }
  for (const client of clients) client.close()
  const tooBusy = await server.tooBusy()
  await server.close()
  latencies.sort((a, b) => a - b)
  return {
    queue: options.queue,
    backoff: options.backoff,
    reactors: options.reactors,
    sharedScheduler: options.sharedScheduler,
    successes,
    tooBusy,
    otherErrors,
    jain: Number(jainIndex(successes).toFixed(4)),
    latencyMs: {
      p50: round(quantile(latencies, 0.5)),
      p99: round(quantile(latencies, 0.99)),
      p999: round(quantile(latencies, 0.999)),
      p9999: round(quantile(latencies, 0.9999))
    }
  }
}

function round (ms: number): number {
  return Math.round(ms * 10) / 10
}

/** The seed's one-line report plus summary figures. */
export function formatFairness (r: FairnessResult): string {
  const total = r.successes.reduce((a, b) => a + b, 0)
  const avg = total / r.successes.length
  const min = Math.min(...r.successes)
  return [
    `queue=${r.queue} backoff=${r.backoff}${r.reactors > 1 ? ` reactors=${r.reactors} scheduler=${r.sharedScheduler ? 'shared' : 'per-reactor'}` : ''}`,
    `  successes: ${r.successes.join(' ')}`,
    `  total ${total}, min ${min}, average ${avg.toFixed(2)}, min/average ${(avg === 0 ? 0 : min / avg).toFixed(2)}, Jain's index ${r.jain.toFixed(4)}`,
    `  TOO_BUSY answers ${r.tooBusy}, failed logical requests ${r.otherErrors}`,
    `  latency of logical requests (ms): p50 ${r.latencyMs.p50}  p99 ${r.latencyMs.p99}  p99.9 ${r.latencyMs.p999}  p99.99 ${r.latencyMs.p9999}`
  ].join('\n')
}
