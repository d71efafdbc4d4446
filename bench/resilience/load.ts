/**
 * The suite's load generator, run in the client's namespace: a fixed
 * offered load (open loop: calls start on schedule whether or not earlier
 * ones have ended) against the hosts through one client of the protocol
 * under test, each call with its own deadline. Most calls are idempotent
 * reads whose answer names the host that served it; every `onceEvery`-th
 * is a non-idempotent call with an id of its own, counted by the hosts.
 *
 * Starts when its spec (JSON, one line) arrives on stdin. Prints JSON lines: `{"type":"start","at":EPOCH_MS}` when the load
 * starts, then `{"type":"result",...}`: every call as
 * [startMs, latencyMs, code, host, idempotent 0|1, id], the client's
 * ejection state as it changed, and what the client left open after
 * `close()`. Then it exits by itself, which only happens when nothing of
 * the client is left.
 *
 *   echo '{"protocol":"krpc","endpoints":[...],...}' | node dist/bench/resilience/load.js
 */
import { performance } from 'node:perf_hooks'
import { Client } from '../../reactor/krpc/client.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { MemcachedClient } from '../../examples/memcached/client.js'
import type { RpcError } from '../../codec/errors.js'

/** What the runner asks of one load run. */
export interface LoadSpec {
  protocol: 'krpc' | 'memcached'
  endpoints: string[]
  rateHz: number
  durationMs: number
  deadlineMs: number
  onceEvery: number
  /** Prefix of the non-idempotent calls' ids (`TAG-N`), unique per run. */
  tag: string
  /** Merged into the client's options (ejection, keepalive, ping...). */
  clientOptions?: Record<string, unknown>
}

/** One call: start (ms from the load's start), latency, outcome code ('OK'), serving host ('' unknown), idempotent, id. */
export type CallRecord = [number, number, string, string, 0 | 1, number]

/** The result line. */
export interface LoadResult {
  type: 'result'
  /** Calls started; each should be in `calls` (settled). */
  issued: number
  calls: CallRecord[]
  /** [ms from start, the hosts ejected then], at each change. */
  ejections: Array<[number, string[]]>
  /** The client's counters at the end (stats() as the client has it). */
  stats: unknown
  /** The first error message seen of each code, to tell what a code meant. */
  messages: Record<string, string>
  /** Resources still active 200 ms after close() (sockets, timers), stdio excepted. */
  leftovers: string[]
}

interface Driver {
  idempotent: (id: number, timeoutMs: number) => Promise<string>
  once: (id: string, timeoutMs: number) => Promise<unknown>
  stats: () => unknown
  close: () => Promise<void>
}

function driver (spec: LoadSpec): Driver {
  if (spec.protocol === 'krpc') {
    const client = new Client({ endpoint: spec.endpoints, retry: {}, defaultTimeoutMs: spec.deadlineMs, logger: null, ...spec.clientOptions })
    const calc = client.service(CalculatorService)
    return {
      idempotent: async (id, timeoutMs) => (await calc.Echo({ data: `r:${id}` }, { timeoutMs, idempotent: true })).data,
      once: (id, timeoutMs) => calc.Echo({ data: `once:${id}` }, { timeoutMs }),
      // KRPC's client names its counters apart (healthStats where the client has outlier ejection).
      stats: () => {
        const c = client as unknown as { healthStats?: object, retryStats?: unknown }
        return { ...c.healthStats, retry: c.retryStats }
      },
      close: async () => { await client.close() }
    }
  }
  const client = new MemcachedClient({ endpoint: spec.endpoints, defaultTimeoutMs: spec.deadlineMs, logger: null, ...spec.clientOptions })
  return {
    idempotent: async (_id, timeoutMs) => (await client.get('whoami', { timeoutMs, idempotent: true }))?.value.toString() ?? 'miss',
    once: (id, timeoutMs) => client.incr(`once:${id}`, 1, { initial: 1, expiry: 0 }, { timeoutMs }),
    stats: () => client.client.stats(),
    close: async () => { await client.close() }
  }
}

function ejectedOf (stats: unknown): string[] {
  const hosts = (stats as { ejection?: { ejectedHosts?: string[] } | null } | undefined)?.ejection?.ejectedHosts
  return Array.isArray(hosts) ? [...hosts].sort() : []
}

// The runner starts this process ahead of its run (node's start-up is slow on a busy machine) and sends the spec, one line on stdin, when the run begins.
async function specFromStdin (): Promise<LoadSpec> {
  return await new Promise<LoadSpec>((resolve) => {
    let text = ''
    const onData = (d: Buffer): void => {
      text += d.toString()
      const nl = text.indexOf('\n')
      if (nl < 0) return
      process.stdin.off('data', onData)
      process.stdin.pause()
      resolve(JSON.parse(text.slice(0, nl)) as LoadSpec)
    }
    process.stdin.on('data', onData)
  })
}

async function run (): Promise<void> {
  const spec = await specFromStdin()
  const d = driver(spec)
  const calls: CallRecord[] = []
  const ejections: Array<[number, string[]]> = []
  const messages: Record<string, string> = {}
  let pending = 0
  let issued = 0
  const t0 = performance.now()
  console.log(JSON.stringify({ type: 'start', at: performance.timeOrigin + t0 }))
  const issue = (): void => {
    const id = issued++
    const start = performance.now()
    const idempotent = id % spec.onceEvery !== spec.onceEvery - 1
    pending++
    const p = idempotent ? d.idempotent(id, spec.deadlineMs) : d.once(`${spec.tag}-${id}`, spec.deadlineMs)
    p.then((host) => {
      calls.push([start - t0, performance.now() - start, 'OK', typeof host === 'string' ? host : '', idempotent ? 1 : 0, id])
    }, (err: RpcError) => {
      if (messages[err?.code] === undefined) messages[err?.code] = String(err?.message)
      calls.push([start - t0, performance.now() - start, err?.code ?? String(err), '', idempotent ? 1 : 0, id])
    }).finally(() => { pending-- })
  }
  await new Promise<void>((resolve) => {
    let last = ''
    const tick = setInterval(() => {
      const elapsed = performance.now() - t0
      const due = Math.min(Math.floor(elapsed * spec.rateHz / 1000), Math.floor(spec.durationMs * spec.rateHz / 1000))
      while (issued < due) issue()
      const ejected = ejectedOf(d.stats())
      const key = ejected.join(',')
      if (key !== last) { ejections.push([elapsed, ejected]); last = key }
      if (elapsed >= spec.durationMs) {
        clearInterval(tick)
        resolve()
      }
    }, 10)
  })
  // Every call ends by its deadline; a bounded wait past it.
  const until = performance.now() + spec.deadlineMs + 2000
  while (pending > 0 && performance.now() < until) await new Promise((resolve) => setTimeout(resolve, 20))
  const stats = d.stats()
  await d.close()
  await new Promise((resolve) => setTimeout(resolve, 200))
  const leftovers = process.getActiveResourcesInfo().filter((r) => r !== 'PipeWrap' && r !== 'TTYWrap')
  const result: LoadResult = { type: 'result', issued, calls, ejections, stats, messages, leftovers }
  process.stdout.write(JSON.stringify(result, (_k, v: unknown) => typeof v === 'bigint' ? Number(v) : v) + '\n')
}

run().catch((err: unknown) => {
  console.error(err)
  process.exitCode = 1
})
