/**
 * `nyala bench`: Kudu's rpc-bench (docs/design.md, 'rpc-bench') for nyala, run side by
 * side with a raw node:net echo and grpc-js on the same machine.
 *
 * One run of one system:
 *
 * 1. A server process is forked (bench-server.ts) and says where it listens.
 * 2. Load processes are forked (bench-load.ts): one per client connection,
 *    up to `availableParallelism()`; connection i belongs to process
 *    i mod P. Sync mode: N connections with one outstanding call each.
 *    Async mode: C call chains, chain j on connection j mod N (as rpc-bench
 *    assigns chains to messengers), each with one outstanding call.
 * 3. Each load process connects and makes one call per connection; then all
 *    get the same window [startAt, endAt) after a warm-up, in epoch time.
 * 4. At the window's edges the bench process asks the server for the
 *    resource usage of all its processes; the load processes count the calls
 *    answered inside the window, record their latencies and their own CPU.
 * 5. Everything is stopped; the row is computed from the deltas.
 *
 * The bench process itself only orchestrates; it does no I/O on the
 * measured connections.
 */
import { availableParallelism, tmpdir } from 'node:os'
import { execFileSync, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { mergeLatencies, summarizeLatencies } from './latency.js'
import {
  epochNow, forkSibling, nextMessage, ofType,
  type ListeningMessage, type LoadDone, type LoadFailed, type LoadGo, type LoadPlan, type LoadReady, type System, type UsageAnswer, serverOf
} from './bench-ipc.js'

export type BenchMode = 'sync' | 'async'

/** One configuration of `nyala bench`, as its flags give it. */
export interface BenchConfig {
  mode: BenchMode
  /** Client connections (rpc-bench's client threads / messengers). */
  clientThreads: number
  /** Async mode: calls kept outstanding, over all connections. */
  asyncCallConcurrency: number
  /** nyala's service workers (`nyala serve --workers`); undefined: nyala's default. */
  workerThreads: number | undefined
  /** nyala's busy-polling window in µs, on its server and its load clients (`ServerOptions.busyPollUs`); 0 or undefined: off. */
  busyPollUs?: number
  /** Server reactor processes (nyala only). */
  serverReactors: number
  runSeconds: number
  /** 0: `Add`; else `Echo` of a string of this many bytes (raw: a frame of this many bytes). */
  payloadBytes: number
  against: System[]
  /** Load processes; default min(connections, availableParallelism()). */
  loadProcesses?: number
  /**
   * Warm-up before each window; default min(3 s, max(0.1 s, runSeconds / 2)).
   * grpc-js needs seconds of JIT warm-up: its calls/s still doubled between
   * the 2nd and the 6th second of a run on this machine.
   */
  warmupSeconds?: number
  /** Node options of the server processes (e.g. `--cpu-prof`). */
  serverExecArgv?: string[]
  /** Node options of the load processes (e.g. `--cpu-prof`). */
  loadExecArgv?: string[]
  /** nyala-tls's server certificate (`makeBenchCertificate`); nyala-tls runs need it. */
  tls?: BenchCertificate
}

/** A self-signed certificate for localhost and 127.0.0.1 in a temporary directory. */
export interface BenchCertificate {
  certFile: string
  keyFile: string
  /** The certificate's PEM: the clients' CA. */
  ca: string
  /** Removes the directory. */
  remove: () => void
}

/** Makes nyala-tls's certificate with the `openssl` command (RSA 2048, 2 days). */
export function makeBenchCertificate (): BenchCertificate {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-bench-tls-'))
  const remove = (): void => rmSync(dir, { recursive: true, force: true })
  const certFile = join(dir, 'cert.pem')
  const keyFile = join(dir, 'key.pem')
  try {
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', keyFile, '-out', certFile, '-days', '2',
      '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'], { stdio: ['ignore', 'ignore', 'pipe'] })
    return { certFile, keyFile, ca: readFileSync(certFile, 'utf8'), remove }
  } catch (err) {
    remove()
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer }
    throw new Error(e.code === 'ENOENT'
      ? 'nyala-tls needs the openssl command to make its certificate, and there is none on the PATH'
      : `nyala-tls: openssl could not make a certificate: ${e.stderr?.toString().trim().split('\n').pop() ?? e.message}`)
  }
}

/** One row of the report; the `--json` shape. CPU and context switches are per request, over all server processes. */
export interface BenchRow {
  system: System
  mode: BenchMode
  reqsPerSec: number
  userCpuUsPerReq: number
  sysCpuUsPerReq: number
  ctxSwPerReq: number
  clientCpuUsPerReq: number
  p50Us: number
  p99Us: number
  p999Us: number
}

/** A row with what the JSON leaves out. */
export interface BenchRun {
  row: BenchRow
  calls: number
  errors: number
  firstError: string | null
  loadProcesses: number
  connections: number
  windowSeconds: number
}

/** Progress callbacks (the CLI's progress bar). */
export interface BenchHooks {
  /** A system's run starts; its window ends about `plannedMs` from now. */
  onRunStart?: (system: System, plannedMs: number) => void
  onRunEnd?: (run: BenchRun) => void
}

/** A call's timeout where the system has one: rpc-bench's 10 s. */
export const CALL_TIMEOUT_MS = 10_000
/** How long the end of a run may take beyond its window before the run fails. */
const DRAIN_TIMEOUT_MS = 30_000
const START_TIMEOUT_MS = 60_000

/** Outstanding calls on each connection (connections without any are left out). */
export function chainsPerConnection (config: Pick<BenchConfig, 'mode' | 'clientThreads' | 'asyncCallConcurrency'>): number[] {
  const n = config.clientThreads
  if (config.mode === 'sync') return new Array<number>(n).fill(1)
  const c = config.asyncCallConcurrency
  const chains: number[] = []
  for (let i = 0; i < n; i++) chains.push(Math.floor(c / n) + (i < c % n ? 1 : 0))
  return chains.filter((k) => k > 0)
}

/** The warm-up before the measured window, in seconds. */
export function warmupSeconds (config: Pick<BenchConfig, 'runSeconds' | 'warmupSeconds'>): number {
  return config.warmupSeconds ?? Math.min(3, Math.max(0.1, config.runSeconds / 2))
}

/** Runs every system of `config.against` once, in order; one row each. */
export async function runBench (config: BenchConfig, hooks: BenchHooks = {}, order: readonly System[] = config.against): Promise<BenchRun[]> {
  const runs: BenchRun[] = []
  for (const system of order) runs.push(await runSystem(system, config, hooks))
  return runs
}

/** Forks a server process for `system`; resolves once it listens. */
async function startServer (system: System, config: BenchConfig): Promise<{ child: ChildProcess, host: string, port: number }> {
  const args: string[] = [serverOf(system)]
  if (serverOf(system) === 'nyala') {
    if (config.workerThreads !== undefined) args.push('--workers', String(config.workerThreads))
    if ((config.busyPollUs ?? 0) > 0) args.push('--busy-poll-us', String(config.busyPollUs))
    args.push('--reactors', String(config.serverReactors))
  }
  if (system === 'nyala-tls') {
    if (config.tls === undefined) throw new Error('nyala-tls: no certificate (BenchConfig.tls)')
    args.push('--tls-cert', config.tls.certFile, '--tls-key', config.tls.keyFile)
  }
  const child = forkSibling('bench-server', args, config.serverExecArgv)
  try {
    const listening = await withTimeout(nextMessage(child, ofType<ListeningMessage>('nyala:listening'), `${system} server`), START_TIMEOUT_MS, `${system} server start`)
    return { child, host: listening.host, port: listening.port }
  } catch (err) {
    child.kill('SIGKILL')
    throw err
  }
}

let usageIds = 0

/** Resource usage of every process of the server, by pid. */
async function serverUsage (server: ChildProcess): Promise<Map<number, NodeJS.ResourceUsage>> {
  const id = ++usageIds
  const answer = nextMessage(server, (m): m is UsageAnswer => ofType<UsageAnswer>('nyala:usage')(m) && m.id === id, 'server usage')
  server.send({ type: 'nyala:usage', id })
  const { usage, pids } = await withTimeout(answer, 10_000, 'server usage')
  return new Map(pids.map((pid, i) => [pid, usage[i]!]))
}

async function stopProcess (child: ChildProcess, signal: NodeJS.Signals | 'disconnect'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  if (signal === 'disconnect') {
    if (child.connected) child.disconnect()
  } else {
    child.kill(signal)
  }
  const timer = setTimeout(() => child.kill('SIGKILL'), 5000)
  await exited
  clearTimeout(timer)
}

/** Runs one system with `config`; resolves with its row. */
export async function runSystem (system: System, config: BenchConfig, hooks: BenchHooks = {}): Promise<BenchRun> {
  const chains = chainsPerConnection(config)
  const processes = Math.max(1, Math.min(chains.length, config.loadProcesses ?? availableParallelism()))
  const warmupMs = warmupSeconds(config) * 1000
  const runMs = config.runSeconds * 1000
  hooks.onRunStart?.(system, warmupMs + runMs)
  // The load processes start while the server does (they wait for their plan).
  const loads: ChildProcess[] = []
  for (let p = 0; p < processes; p++) loads.push(forkSibling('bench-load', [], config.loadExecArgv))
  let server: { child: ChildProcess, host: string, port: number }
  try {
    server = await startServer(system, config)
  } catch (err) {
    await Promise.all(loads.map((child) => stopProcess(child, 'disconnect')))
    throw err
  }
  try {
    const failed = loads.map((child) => nextMessage(child, ofType<LoadFailed>('failed'), 'load process').then((m) => {
      throw new Error(`${system} load process failed: ${m.error}`)
    }))
    // Only the first failure matters; the others would be unhandled.
    for (const f of failed) f.catch(() => {})
    const ready = loads.map((child) => nextMessage(child, ofType<LoadReady>('ready'), `${system} load process`))
    loads.forEach((child, p) => {
      const plan: LoadPlan = {
        type: 'plan',
        system,
        host: server.host,
        port: server.port,
        chains: chains.filter((_, i) => i % processes === p),
        payloadBytes: config.payloadBytes,
        callTimeoutMs: CALL_TIMEOUT_MS,
        busyPollUs: config.busyPollUs ?? 0,
        api: (system === 'nyala' || system === 'nyala-tls') && config.mode === 'async' ? 'callback' : 'promise',
        tlsCa: system === 'nyala-tls' ? config.tls!.ca : null
      }
      child.send(plan)
    })
    await withTimeout(Promise.race([Promise.all(ready), ...failed]), START_TIMEOUT_MS, `${system} load processes connecting`)
    const done = loads.map((child) => nextMessage(child, ofType<LoadDone>('done'), `${system} load process`))
    const startAt = epochNow() + warmupMs
    const endAt = startAt + runMs
    const go: LoadGo = { type: 'go', startAt, endAt }
    for (const child of loads) child.send(go)
    const before = await at(startAt, () => serverUsage(server.child))
    const after = await at(endAt, () => serverUsage(server.child))
    const results = await withTimeout(Promise.race([Promise.all(done), ...failed]), DRAIN_TIMEOUT_MS, `${system} load processes finishing`)
    const run = computeRun(system, config, results, before, after, runMs / 1000)
    run.loadProcesses = processes
    run.connections = chains.length
    hooks.onRunEnd?.(run)
    return run
  } finally {
    await Promise.all(loads.map((child) => stopProcess(child, 'disconnect')))
    await stopProcess(server.child, 'SIGTERM')
  }
}

/** The row of one run from the load processes' results and the server's usage at the window's edges. */
export function computeRun (system: System, config: Pick<BenchConfig, 'mode'>, results: readonly LoadDone[],
  before: ReadonlyMap<number, NodeJS.ResourceUsage>, after: ReadonlyMap<number, NodeJS.ResourceUsage>, windowSeconds: number): BenchRun {
  let calls = 0
  let errors = 0
  let clientCpuUs = 0
  let firstError: string | null = null
  for (const r of results) {
    calls += r.calls
    errors += r.errors
    clientCpuUs += r.userCpuUs + r.systemCpuUs
    firstError ??= r.firstError
  }
  // Processes present at both edges (a reactor restarted in between is left out).
  let userUs = 0
  let systemUs = 0
  let contextSwitches = 0
  for (const [pid, end] of after) {
    const start = before.get(pid)
    if (start === undefined) continue
    userUs += end.userCPUTime - start.userCPUTime
    systemUs += end.systemCPUTime - start.systemCPUTime
    contextSwitches += end.voluntaryContextSwitches - start.voluntaryContextSwitches + end.involuntaryContextSwitches - start.involuntaryContextSwitches
  }
  const latency = summarizeLatencies(mergeLatencies(results.map((r) => r.latencies)))
  const perCall = (total: number): number => calls === 0 ? Number.NaN : total / calls
  return {
    row: {
      system,
      mode: config.mode,
      reqsPerSec: calls / windowSeconds,
      userCpuUsPerReq: perCall(userUs),
      sysCpuUsPerReq: perCall(systemUs),
      ctxSwPerReq: perCall(contextSwitches),
      clientCpuUsPerReq: perCall(clientCpuUs),
      p50Us: latency.p50Us,
      p99Us: latency.p99Us,
      p999Us: latency.p999Us
    },
    calls,
    errors,
    firstError,
    loadProcesses: results.length,
    connections: 0,
    windowSeconds
  }
}

/** Runs `task` at epoch time `time` (at once if it has passed). */
function at<T> (time: number, task: () => Promise<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    setTimeout(() => task().then(resolve, reject), Math.max(0, time - epochNow()))
  })
}

function withTimeout<T> (promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer after ${ms / 1000} s`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}
