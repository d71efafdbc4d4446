/**
 * The scheduler shared by the reactors of a server (docs/scheduling.md,
 * 'Several reactors: one scheduler'), with real reactor processes over
 * loopback port 0: test/helpers/shared-scheduler-server.ts runs two
 * reactors of 1 worker and 1 queue slot each (2 and 2 shared). Outcomes are
 * counted; nothing asserts a duration (waits poll for a state).
 */
import t, { type Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { RpcError } from '../../codec/errors.js'
import { Client } from '../../reactor/krpc/client.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { ReactorService } from '../helpers/reactor-service.js'

// Three Node processes start per test through the TypeScript loader; slow on a busy machine.
t.setTimeout(300_000)

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const HELPER = fileURLToPath(new URL('../helpers/shared-scheduler-server.ts', import.meta.url))
const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))

interface Run { child: ChildProcess, stdout: () => string, stderr: () => string }

function start (t: Test): Run {
  const child = spawn(process.execPath, [...LOADER, HELPER], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stdout!.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { err += d.toString() })
  const pids = new Set<number>()
  t.teardown(async () => {
    for (const pid of await reactorPids()) pids.add(pid)
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    for (const pid of pids) { try { process.kill(pid, 'SIGKILL') } catch {} }
  })
  const reactorPids = async (): Promise<number[]> => [...pids]
  return { child, stdout: () => out, stderr: () => err }
}

async function until<T> (what: string, run: Run, probe: () => T | undefined | Promise<T | undefined>): Promise<T> {
  for (;;) {
    const value = await probe()
    if (value !== undefined) return value
    if (run.child.exitCode !== null) throw new Error(`exited before ${what}: ${run.stderr()}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/** The sum over reactors of a gauge or counter of the calculator service (method too for counters). */
async function metric (url: string, name: string, method?: string): Promise<number> {
  const text = await (await fetch(url)).text()
  let sum = 0
  for (const row of text.split('\n')) {
    if (!row.startsWith(`${name}{`) || !row.includes('CalculatorService')) continue
    if (method !== undefined && !row.includes(`method="${method}"`)) continue
    sum += Number(row.slice(row.lastIndexOf(' ') + 1))
  }
  return sum
}

type Outcome = 'ok' | string

async function outcome (p: Promise<unknown>): Promise<Outcome> {
  try {
    await p
    return 'ok'
  } catch (err) {
    if (!(err instanceof RpcError)) return String(err)
    return err.remote !== undefined ? err.remote.name : err.code
  }
}

/** Clients, one connection each, until there is one on each of the two reactors: [first reactor's, second's], with their pids. */
async function onEachReactor (t: Test, endpoint: string): Promise<Array<{ client: Client, pid: number }>> {
  const byPid = new Map<number, Client>()
  for (let i = 0; i < 8 && byPid.size < 2; i++) {
    const client = new Client({ endpoint })
    t.teardown(() => client.close())
    const { pid } = await client.service(ReactorService).Pid({})
    if (!byPid.has(pid)) byPid.set(pid, client)
  }
  if (byPid.size < 2) throw new Error('connections did not reach both reactors')
  return [...byPid].map(([pid, client]) => ({ client, pid }))
}

async function serve (t: Test): Promise<{ run: Run, endpoint: string, metrics: string }> {
  const run = start(t)
  const endpoint = await until('listening', run, () => run.stdout().match(/listening on (\S+)/)?.[1])
  const metrics = await until('metrics', run, () => run.stdout().match(/metrics on (\S+)/)?.[1])
  return { run, endpoint, metrics }
}

t.test('a call on one reactor with an earlier deadline evicts the latest queued call of the other and runs first; a queued call expires', async (t) => {
  const { run, endpoint, metrics } = await serve(t)
  const [x, y] = await onEachReactor(t, endpoint)
  const sleepX = x!.client.service(CalculatorService)
  const sleepY = y!.client.service(CalculatorService)
  const ended: string[] = []
  const track = (name: string, p: Promise<unknown>): Promise<Outcome> => outcome(p.then((v) => { ended.push(name); return v }))
  // Both tokens busy: one call on each reactor; Y's frees first.
  const holdX = track('holdX', sleepX.Sleep({ sleep_micros: 3_000_000 }, { timeoutMs: 30_000 }))
  const holdY = track('holdY', sleepY.Sleep({ sleep_micros: 1_500_000 }, { timeoutMs: 30_000 }))
  await until('both tokens busy', run, async () => (await metric(metrics, 'nyala_service_idle_workers')) === 0 ? true : undefined)
  // The shared queue (2 slots) fills with two late calls of Y.
  const lateY = track('lateY', sleepY.Sleep({ sleep_micros: 1000 }, { timeoutMs: 29_000 }))
  const laterY = track('laterY', sleepY.Sleep({ sleep_micros: 1000 }, { timeoutMs: 30_000 }))
  await until('two calls queued', run, async () => (await metric(metrics, 'nyala_service_queue_length')) === 2 ? true : undefined)
  const earlyX = track('earlyX', sleepX.Sleep({ sleep_micros: 1000 }, { timeoutMs: 20_000 }))
  const results = { holdX: await holdX, holdY: await holdY, lateY: await lateY, laterY: await laterY, earlyX: await earlyX }
  t.same(results, { holdX: 'ok', holdY: 'ok', lateY: 'ok', laterY: 'ERROR_SERVER_TOO_BUSY', earlyX: 'ok' },
    "X's earlier call evicted Y's latest across reactors")
  t.ok(ended.indexOf('earlyX') < ended.indexOf('lateY'), `the earlier deadline ran first (${ended.join(', ')})`)
  t.equal(await metric(metrics, 'nyala_rpcs_evicted_total', 'Sleep'), 1)

  // Expiry in the shared queue: both tokens busy again, a call of X with a short deadline waits and expires there.
  const again = [sleepX.Sleep({ sleep_micros: 1_500_000 }, { timeoutMs: 30_000 }), sleepY.Sleep({ sleep_micros: 1_500_000 }, { timeoutMs: 30_000 })].map(outcome)
  await until('both tokens busy', run, async () => (await metric(metrics, 'nyala_service_idle_workers')) === 0 ? true : undefined)
  const short = await outcome(sleepX.Sleep({ sleep_micros: 1000 }, { timeoutMs: 300 }))
  t.not(short, 'ok', 'the short call did not run')
  t.same(await Promise.all(again), ['ok', 'ok'])
  t.equal(await metric(metrics, 'nyala_rpcs_timed_out_in_queue_total', 'Sleep'), 1, 'it expired in the shared queue')
})

t.test('a reactor killed while the other has calls queued: those calls are run or refused, never left waiting', async (t) => {
  const { run, endpoint, metrics } = await serve(t)
  const [x, y] = await onEachReactor(t, endpoint)
  const sleepX = x!.client.service(CalculatorService)
  const sleepY = y!.client.service(CalculatorService)
  // X holds a token for a long call; Y holds the other and queues two more.
  const holdX = outcome(sleepX.Sleep({ sleep_micros: 60_000_000 }, { timeoutMs: 90_000 }))
  const holdY = outcome(sleepY.Sleep({ sleep_micros: 500_000 }, { timeoutMs: 60_000 }))
  await until('both tokens busy', run, async () => (await metric(metrics, 'nyala_service_idle_workers')) === 0 ? true : undefined)
  const queued = [
    outcome(sleepY.Sleep({ sleep_micros: 1000 }, { timeoutMs: 50_000 })),
    outcome(sleepY.Sleep({ sleep_micros: 1000 }, { timeoutMs: 51_000 }))
  ]
  await until('two calls queued', run, async () => (await metric(metrics, 'nyala_service_queue_length')) === 2 ? true : undefined)
  process.kill(x!.pid, 'SIGKILL')
  const outcomes = await Promise.all(queued)
  t.equal(await holdY, 'ok')
  t.not(await holdX, 'ok', "X's own call died with it")
  t.equal(outcomes.filter((o) => o === 'ok').length + outcomes.filter((o) => o === 'ERROR_SERVER_TOO_BUSY').length, 2,
    `every queued call of Y was run or refused (${outcomes.join(', ')})`)
  t.ok(outcomes.includes('ok'), "Y's token ran what it could")
})
