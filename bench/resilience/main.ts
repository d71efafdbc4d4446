/**
 * `npm run resilience`: the multi-host failure suite. Three server hosts,
 * each in a network namespace with its own address on a veth pair to a
 * client namespace; for KRPC and for the memcached example, a fixed
 * offered load of calls with 1 s deadlines runs through each scenario
 * (scenarios.ts) and the suite prints one row per scenario (table.ts),
 * exiting 1 when a scenario misses a target.
 *
 *   node dist/bench/resilience/main.js [--quick] [--protocol krpc|memcached] [--scenario NAME]
 *     [--rate 300] [--json FILE] [--client-options JSON]
 *
 * Where namespaces cannot be made (not root, no `ip netns`) it says so in
 * one line and exits 0 without claiming anything. Every namespace and
 * process it made is removed on the way out, on failure and on SIGINT too,
 * and the whole run is bounded (7 min in full, 2 min 55 s quick).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { countExecutions } from './execution-log.js'
import { killAllNow, startHost, startProxy, stop, stopAll, type HostProcs } from './hosts.js'
import type { LoadResult, LoadSpec } from './load.js'
import { Topology, netnsUnavailable, removeStale } from './netns.js'
import { SCENARIOS, type Scenario, type ScenarioContext } from './scenarios.js'
import { formatTable, rowOf, type Row } from './table.js'

const HERE = fileURLToPath(new URL('.', import.meta.url))
const PORT = 7000
const PROXY_PORT = 7001
const DEADLINE_MS = 1000

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    protocol: { type: 'string' },
    scenario: { type: 'string' },
    rate: { type: 'string' },
    json: { type: 'string' },
    'client-options': { type: 'string' }
  }
})
const quick = values.quick === true
const timing = quick ? { warmMs: 800, faultMs: 4000, recoverMs: 5100, budgetMs: 175_000 } : { warmMs: 3000, faultMs: 8000, recoverMs: 7000, budgetMs: 420_000 }
const rateHz = Number(values.rate ?? 300)
const protocols = (values.protocol === undefined ? ['krpc', 'memcached'] : [values.protocol]) as Array<'krpc' | 'memcached'>
const scenarios = SCENARIOS.filter((s) => values.scenario === undefined || s.name === values.scenario)
const clientOptions = values['client-options'] === undefined ? undefined : JSON.parse(values['client-options']) as Record<string, unknown>

const unavailable = netnsUnavailable()
if (unavailable !== null) {
  console.log(`resilience: skipped, ${unavailable}`)
  process.exit(0)
}

removeStale()
const topology = new Topology(3)
const logDir = mkdtempSync(join(tmpdir(), 'nyala-resilience-'))
let cleaned = false
function cleanUpNow (): void {
  if (cleaned) return
  cleaned = true
  killAllNow()
  for (const child of loads) child.kill('SIGKILL')
  topology.destroy()
  rmSync(logDir, { recursive: true, force: true })
}
process.on('exit', cleanUpNow)
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.once(sig, () => {
    console.error(`resilience: ${sig}, cleaning up`)
    cleanUpNow()
    process.exit(130)
  })
}
const budget = setTimeout(() => {
  console.error(`resilience: over its ${timing.budgetMs / 1000} s budget, stopping`)
  cleanUpNow()
  process.exit(2)
}, timing.budgetMs)
budget.unref()

// One load run in the client's namespace: resolves with its result once it has exited.
// RESILIENCE_TRACE=1: when each phase of a scenario ended, on stderr.
const trace = process.env.RESILIENCE_TRACE === '1'
  ? (what: string) => { console.error(`  [${new Date().toISOString().slice(11, 23)}] ${what}`) }
  : (_what: string) => {}

// Load processes not yet exited, for the exit path.
const loads = new Set<ChildProcess>()

// A load process, started ahead of its run in the client's namespace; `run` sends its spec and resolves with its result once it has exited.
class LoadProcess {
  readonly #child = spawn('ip', ['netns', 'exec', topology.clientNs, process.execPath, `${HERE}load.js`], { stdio: ['pipe', 'pipe', 'pipe'] })
  readonly #exit: Promise<number | string>
  #stderr = ''

  constructor () {
    this.#child.stderr.on('data', (d: Buffer) => { if (this.#stderr.length < 4096) this.#stderr += d.toString() })
    loads.add(this.#child)
    this.#exit = new Promise((resolve) => this.#child.once('exit', (c, s) => { loads.delete(this.#child); resolve(c ?? s ?? 'unknown') }))
  }

  async run (spec: LoadSpec, onStart: (epochMs: number) => void, problems: string[]): Promise<LoadResult> {
    const child = this.#child
    let buffered = ''
    let result: LoadResult | null = null
    child.stdout.on('data', (d: Buffer) => {
      buffered += d.toString()
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const line = buffered.slice(0, nl)
        buffered = buffered.slice(nl + 1)
        if (line === '') continue
        const message = JSON.parse(line) as { type: string, at?: number }
        if (message.type === 'start') { trace('load started'); onStart(message.at!) } else if (message.type === 'result') result = message as LoadResult
      }
    })
    child.stdin.end(JSON.stringify(spec) + '\n')
    const limitMs = spec.durationMs + spec.deadlineMs + 12_000
    const timer = setTimeout(() => {
      problems.push(`the load did not exit by itself within ${limitMs / 1000} s`)
      child.kill('SIGKILL')
    }, limitMs)
    const code = await this.#exit
    clearTimeout(timer)
    if (code !== 0) problems.push(`the load exited with ${code}: ${this.#stderr.trim().split('\n').slice(-3).join(' / ')}`)
    if (result === null) throw new Error(`the load gave no result (exit ${code}): ${this.#stderr}`)
    return result
  }

  kill (): void {
    this.#child.kill('SIGKILL')
  }
}

// The hosts of one protocol, started once and kept through its scenarios (a crashed one is started again by its scenario).
interface Cluster {
  readonly protocol: 'krpc' | 'memcached'
  readonly hosts: HostProcs[]
  readonly logs: string[]
}

async function startCluster (protocol: 'krpc' | 'memcached'): Promise<Cluster> {
  const dir = mkdtempSync(join(logDir, `${protocol}-`))
  const logs = topology.hosts.map((h) => join(dir, `h${h.index}.log`))
  const hosts = await Promise.all(topology.hosts.map(async (net, i) => await startHost(protocol, net, PORT, logs[i]!)))
  trace(`${protocol} hosts listening`)
  return { protocol, hosts, logs }
}

async function stopCluster (cluster: Cluster, problems: string[]): Promise<void> {
  await Promise.all(cluster.hosts.map(async (h) => {
    if (!h.server.exited && !(await stop(h.server))) problems.push(`h${h.net.index} did not stop on SIGTERM`)
  }))
  await stopAll()
}

let runs = 0

async function runScenario (cluster: Cluster, scenario: Scenario, load: LoadProcess): Promise<Row> {
  const { protocol, hosts } = cluster
  trace(`${protocol} ${scenario.name}: start`)
  for (const h of topology.hosts) { topology.setHostLink(h, true); topology.setClientLink(h, true) }
  const problems: string[] = []
  // Ids of this run's non-idempotent calls carry its tag: the hosts' logs span every run.
  const tag = `r${++runs}`
  const killed = new Set<number>()
  const before = hosts.map((h) => h.server)
  for (const [i, p] of before.entries()) if (p.exited) problems.push(`h${i + 1} was down before the scenario`)
  // The slow host is reached through the delaying proxy, on a port of its own.
  const proxy = scenario.proxy === true ? startProxy(topology.hosts[0]!, PROXY_PORT, PORT) : null
  const endpoints = topology.hosts.map((h, i) => `${h.address}:${i === 0 && proxy !== null ? PROXY_PORT : PORT}`)
  const durationMs = timing.warmMs + timing.faultMs + timing.recoverMs
  const events = scenario.events(timing.warmMs, timing.faultMs)
  const ctx: ScenarioContext = {
    topology,
    hosts,
    proxy: null,
    restart: async (i: number) => {
      killed.add(hosts[i]!.server.pid)
      hosts[i] = await startHost(protocol, topology.hosts[i]!, PORT, cluster.logs[i]!)
    }
  }
  const timers: NodeJS.Timeout[] = []
  const spec: LoadSpec = { protocol, endpoints, rateHz, durationMs, deadlineMs: DEADLINE_MS, onceEvery: 10, tag, clientOptions }
  let eventsRun = Promise.resolve()
  // When (ms from the load's start) the last heal had taken effect: a restarted host listens only a while after its restart began.
  let healedAt = 0
  if (proxy !== null) ctx.proxy = await proxy
  const result = await load.run(spec, (startEpoch) => {
    const offset = Date.now() - startEpoch
    for (const e of events) {
      timers.push(setTimeout(() => {
        eventsRun = eventsRun.then(async () => {
          await e.run(ctx)
          if (e.kind === 'heal') healedAt = Date.now() - startEpoch
        }).catch((err: unknown) => { problems.push(`event at ${e.at} ms failed: ${(err as Error).message}`) })
      }, e.at - offset))
    }
  }, problems)
  trace(`load exited; stats ${JSON.stringify(result.stats)}; first errors ${JSON.stringify(result.messages)}`)
  for (const t of timers) clearTimeout(t)
  await eventsRun
  for (const [i, h] of hosts.entries()) {
    if (h.server.exited) problems.push(`h${i + 1} server died (${h.server.exitCode ?? h.server.signal})`)
  }
  for (const p of before) if (p.exited && !killed.has(p.pid)) problems.push(`pid ${p.pid} died unasked`)
  if (ctx.proxy !== null) await stop(ctx.proxy)
  const faults = events.filter((e) => e.kind === 'fault').map((e) => e.at)
  return rowOf(result, {
    protocol,
    scenario: scenario.name,
    deadlineMs: DEADLINE_MS,
    faults,
    lastHeal: healedAt,
    badNames: scenario.bad.map((i) => `h${i + 1}`),
    badKeys: scenario.bad.map((i) => endpoints[i]!),
    executions: countExecutions(cluster.logs, `${tag}-`),
    problems
  })
}

async function main (): Promise<number> {
  topology.create()
  const started = Date.now()
  console.log(`resilience: ${protocols.join(', ')} x ${scenarios.length} scenarios, ${rateHz} calls/s, deadline ${DEADLINE_MS} ms, fault ${timing.faultMs / 1000} s after ${timing.warmMs / 1000} s, ${timing.recoverMs / 1000} s to recover${quick ? ' (quick)' : ''}`)
  const rows: Row[] = []
  let nextLoad: LoadProcess | null = new LoadProcess()
  for (const protocol of protocols) {
    const cluster = await startCluster(protocol)
    for (const scenario of scenarios) {
      const load = nextLoad ?? new LoadProcess()
      // The next run's process starts meanwhile.
      nextLoad = new LoadProcess()
      const row = await runScenario(cluster, scenario, load)
      rows.push(row)
      console.log(`  ${protocol} ${scenario.name}: ${row.missed.length === 0 ? 'pass' : `MISS (${row.missed.join('; ')})`}`)
    }
    const problems: string[] = []
    await stopCluster(cluster, problems)
    if (problems.length > 0 && rows.length > 0) rows[rows.length - 1]!.missed.push(...problems)
  }
  nextLoad?.kill()
  console.log(formatTable(rows))
  console.log(`resilience: ${rows.filter((r) => r.missed.length === 0).length}/${rows.length} scenarios met their targets in ${((Date.now() - started) / 1000).toFixed(0)} s`)
  if (values.json !== undefined) writeFileSync(values.json, JSON.stringify(rows, null, 2))
  return rows.every((r) => r.missed.length === 0) ? 0 : 1
}

main().then((code) => {
  cleanUpNow()
  process.exit(code)
}, (err: unknown) => {
  console.error(`resilience: ${(err as Error)?.stack ?? String(err)}`)
  cleanUpNow()
  process.exit(2)
})
