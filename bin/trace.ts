/**
 * `nyala trace`: the server's syscalls per RPC, counted by strace (or perf
 * trace), as Kudu's "avoid an extra epoll cycle" change was measured with
 * `perf trace` (docs/tracing.md).
 *
 * One server process (bin/trace-server.ts) runs under `strace -f -c` (every
 * thread); this process, untraced, connects, negotiates, makes one warm-up
 * call, then N calls at depth D, then sends the server SIGTERM so that the
 * tracer writes its summary. A second traced run does the same with zero
 * calls and stays idle as long as the first run's calls took, so startup,
 * connection set-up, teardown and the periodic timers (the idle-connection
 * scan wakes the loop every second) cancel out in the difference. An
 * untraced run before both times the calls (calls/s, MiB/s).
 *
 * Each transport the server can use is traced in turn (`--io`; by default
 * every one that starts here: node, epoll, io_uring), the server child
 * told which by the environment variable NYALA_IO. On io_uring the work of
 * reads and sends is done inside `io_uring_enter`: it is counted as one
 * syscall like any other, in its own column.
 */
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { RpcError } from '../codec/errors.js'
import type { ServiceDef } from '../codec/protobuf/schema.js'
import { Client, type ClientConnectionStats } from '../reactor/krpc/client.js'
import type { ServerConnectionStats, ServerStats } from '../reactor/krpc/server.js'
import { CalculatorService } from '../examples/calculator/index.js'
import { RawEchoClient } from '../bench/raw-echo.js'
import { resolveIo, type IoBackend } from '../transport/io.js'

export const TRACE_USAGE = `  nyala trace [--mode sync|async|transfer] [--calls N] [--depth D]
              [--payload-bytes B] [--sidecar-bytes B]
              [--system nyala|nyala-direct|raw] [--tracer strace|perf]
              [--io all|node|epoll|io_uring] [--no-timing] [--json]
      The server's syscalls per RPC: runs one server process under
      strace -f -c, drives N calls at depth D (sync: 1; async: 64) from this
      process, subtracts a run with zero calls, and prints epoll_ctl,
      epoll_wait, io_uring_enter, read, write, futex, other and total per
      RPC, for each transport --io names (default all: every one that
      starts here; then a line per transport with its total), the raw
      counts, bytes per write and the connections' transfer-queue counters.
      --mode transfer: synchronous EchoSidecars with one 8 MiB sidecar
      (--sidecar-bytes), reported in MiB/s. An untraced run first times the
      calls (--no-timing skips it). Needs strace (apt-get install strace)
      or, with --tracer perf, perf trace. --system nyala-direct: the
      server runs each handler at once, without its queue and workers;
      raw: a raw node:net echo. See docs/tracing.md.
`

export type TraceMode = 'sync' | 'async' | 'transfer'
export type TraceSystem = 'nyala' | 'nyala-direct' | 'raw'
export type Tracer = 'strace' | 'perf'

/** The syscall groups reported per RPC, in report order. */
export const CATEGORIES = ['epoll_ctl', 'epoll_wait', 'io_uring_enter', 'read', 'write', 'futex', 'other', 'total'] as const
export type Category = typeof CATEGORIES[number]

const CATEGORY_OF: Readonly<Record<string, Category>> = {
  epoll_ctl: 'epoll_ctl',
  epoll_wait: 'epoll_wait',
  epoll_pwait: 'epoll_wait',
  epoll_pwait2: 'epoll_wait',
  // io_uring: the ring's submissions and completions, one syscall however many sends and reads it carries.
  io_uring_enter: 'io_uring_enter',
  read: 'read',
  readv: 'read',
  recvfrom: 'read',
  recvmsg: 'read',
  recvmmsg: 'read',
  write: 'write',
  writev: 'write',
  sendto: 'write',
  sendmsg: 'write',
  sendmmsg: 'write',
  futex: 'futex'
}

export const DEFAULT_SIDECAR_BYTES = 8 * 1024 * 1024
const DEFAULT_CALLS: Readonly<Record<TraceMode, number>> = { sync: 20_000, async: 50_000, transfer: 50 }
const DEFAULT_ASYNC_DEPTH = 64
const MIB = 1024 * 1024
const START_TIMEOUT_MS = 60_000

/** Counts per syscall name. */
export type SyscallCounts = Record<string, number>

/**
 * Parses the table `strace -c` writes (`% time  seconds  usecs/call  calls
 * errors syscall`, errors blank when none) into calls per syscall; failed
 * calls (EAGAIN mostly) go to `errors` when given. Several tables (one per
 * personality) are summed; the `total` row is left out.
 */
export function parseStraceSummary (text: string, errors?: SyscallCounts): SyscallCounts {
  const counts: SyscallCounts = {}
  const row = /^\s*\d+(?:\.\d+)?\s+\d+(?:\.\d+)?\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?([a-z_][a-z0-9_]*)\s*$/
  for (const line of text.split('\n')) {
    const match = row.exec(line)
    if (match === null) continue
    const name = match[3]!
    if (name === 'total') continue
    counts[name] = (counts[name] ?? 0) + Number(match[1])
    if (errors !== undefined && match[2] !== undefined) errors[name] = (errors[name] ?? 0) + Number(match[2])
  }
  return counts
}

/**
 * Parses `perf trace -s` output (a table per thread: `syscall  calls
 * errors  total  min  avg  max  stddev`) into calls per syscall, summed over
 * the threads.
 */
export function parsePerfTraceSummary (text: string, errors?: SyscallCounts): SyscallCounts {
  const counts: SyscallCounts = {}
  const row = /^\s+([a-z_][a-z0-9_]*)\s+(\d+)\s+(\d+)\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+%\s*$/
  for (const line of text.split('\n')) {
    const match = row.exec(line)
    if (match === null) continue
    const name = match[1]!
    counts[name] = (counts[name] ?? 0) + Number(match[2])
    if (errors !== undefined && match[3] !== '0') errors[name] = (errors[name] ?? 0) + Number(match[3])
  }
  return counts
}

/** Sums counts into the report's groups: epoll_ctl, epoll_wait (+ epoll_pwait), io_uring_enter, read (+ readv, recv*), write (+ writev, send*), futex, other, total. */
export function categorize (counts: SyscallCounts): Record<Category, number> {
  const out = { epoll_ctl: 0, epoll_wait: 0, io_uring_enter: 0, read: 0, write: 0, futex: 0, other: 0, total: 0 }
  for (const [name, n] of Object.entries(counts)) {
    out[CATEGORY_OF[name] ?? 'other'] += n
    out.total += n
  }
  return out
}

/** What one `nyala trace` measures. */
export interface TracePlan {
  system: TraceSystem
  mode: TraceMode
  calls: number
  depth: number
  /** Echo calls carrying a string of this many bytes (else Add). */
  payloadBytes: number | undefined
  /** EchoSidecars calls carrying one sidecar of this many bytes. */
  sidecarBytes: number | undefined
  tracer: Tracer
  /** Also time the calls in an untraced run (calls/s, MiB/s). */
  timing: boolean
  /** The server's transport (NYALA_IO in its environment; raw: node). */
  io: IoBackend
}

/** What `--io` asks for: one transport, or every one that starts here. */
export type TraceIo = IoBackend | 'all'

const IO_BACKENDS: readonly IoBackend[] = ['node', 'epoll', 'io_uring']

/** The counters the server prints on SIGTERM. */
interface ServerReport {
  system: TraceSystem
  /** The transport the server listened on. */
  io?: string
  server?: ServerStats
  connections?: ServerConnectionStats[]
}

interface RunResult {
  /** null when untraced. */
  counts: SyscallCounts | null
  /** Failed calls per syscall (EAGAIN mostly); null when untraced. */
  errors: SyscallCounts | null
  /** Wall time of the calls (or of the idle wait). */
  elapsedMs: number
  server: ServerReport | null
  client: ClientConnectionStats[] | null
  /** Bytes the client received: what the server wrote to the connection. */
  bytesFromServer: number
}

/** The result `--json` prints. */
export interface TraceReport {
  calls: number
  perRpc: Record<Category, number>
  system: TraceSystem
  /** The server's transport. */
  io: IoBackend
  mode: TraceMode
  depth: number
  method: string
  tracer: Tracer
  payloadBytes: number | null
  sidecarBytes: number | null
  /** Read and write syscalls per RPC that failed (EAGAIN: nothing to read, or the socket buffer full). */
  failedPerRpc: { read: number, write: number }
  /** Server bytes written per write-group syscall, calls run minus zero-call run. */
  bytesPerWrite: number | null
  /** Untraced run (null with --no-timing). */
  callsPerSec: number | null
  /** Untraced run; sidecar (or payload) bytes per second, each way (null without sidecars or payload, or with --no-timing). */
  mibPerSec: number | null
  /** The same under the tracer. */
  tracedCallsPerSec: number
  /** Counts by group and by syscall: the N-call run, the zero-call run. */
  raw: {
    calls: Record<Category, number>
    zeroCalls: Record<Category, number>
    bySyscall: { calls: SyscallCounts, zeroCalls: SyscallCounts }
    /** Failed calls (mostly EAGAIN: the kernel buffer was empty or full), by syscall. */
    errorsBySyscall: { calls: SyscallCounts, zeroCalls: SyscallCounts }
  }
  /** Per-connection counters at the end of the N-call run (server: taken at SIGTERM). */
  connections: { server: ServerConnectionStats[] | null, client: ClientConnectionStats[] | null }
}

class TraceError extends Error {}

/** The result `--json` prints when more than one transport was traced. */
export interface TraceReports {
  backends: TraceReport[]
  /** The transports --io asked for that cannot start here, with the reason. */
  unavailable: Record<string, string>
}

/** Runs `nyala trace ARGS`; resolves with the exit code. */
export async function trace (args: string[]): Promise<number> {
  let plan: TracePlan
  let json: boolean
  let io: TraceIo
  try {
    ({ plan, json, io } = parsePlan(args))
  } catch (err) {
    process.stderr.write(`nyala trace: ${(err as Error).message}\n`)
    return 2
  }
  const problem = tracerProblem(plan.tracer)
  if (problem !== null) {
    process.stderr.write(problem)
    return 1
  }
  const { backends, unavailable } = plan.system === 'raw' ? { backends: ['node' as IoBackend], unavailable: {} } : availableIo(io)
  if (backends.length === 0) {
    process.stderr.write(`nyala trace: io ${io} cannot start here: ${Object.values(unavailable).join('; ')}\n`)
    return 1
  }
  try {
    const reports: TraceReport[] = []
    for (const backend of backends) {
      const report = await runTrace({ ...plan, io: backend })
      reports.push(report)
      if (!json) process.stdout.write(formatReport(report) + (backends.length > 1 ? '\n' : ''))
    }
    if (json) process.stdout.write(`${JSON.stringify(io === 'all' ? { backends: reports, unavailable } satisfies TraceReports : reports[0])}\n`)
    else if (io === 'all') process.stdout.write(formatComparison(reports, unavailable))
    return 0
  } catch (err) {
    process.stderr.write(`nyala trace: ${err instanceof TraceError || err instanceof RpcError ? err.message : (err as Error).stack ?? String(err)}\n`)
    return 1
  }
}

/**
 * The transports to trace for `--io`: node always; epoll and io_uring when
 * they start in this process (the native addon built, io_uring allowed);
 * for one named transport, it alone or nothing (with the reason).
 */
export function availableIo (io: TraceIo): { backends: IoBackend[], unavailable: Record<string, string> } {
  const backends: IoBackend[] = []
  const unavailable: Record<string, string> = {}
  for (const backend of io === 'all' ? IO_BACKENDS : [io]) {
    try {
      resolveIo(backend, backend)
      backends.push(backend)
    } catch (err) {
      unavailable[backend] = (err as Error).message
    }
  }
  return { backends, unavailable }
}

export function parsePlan (args: string[]): { plan: TracePlan, json: boolean, io: TraceIo } {
  const { values } = parseArgs({
    args,
    options: {
      mode: { type: 'string' },
      calls: { type: 'string' },
      depth: { type: 'string' },
      'payload-bytes': { type: 'string' },
      'sidecar-bytes': { type: 'string' },
      system: { type: 'string', default: 'nyala' },
      tracer: { type: 'string', default: 'strace' },
      io: { type: 'string', default: 'all' },
      'no-timing': { type: 'boolean', default: false },
      json: { type: 'boolean', default: false }
    },
    strict: true
  })
  const depthGiven = values.depth === undefined ? undefined : count(values.depth, 'depth')
  const mode = (values.mode ?? (depthGiven !== undefined && depthGiven > 1 ? 'async' : 'sync')) as TraceMode
  if (!(mode in DEFAULT_CALLS)) throw new Error(`--mode must be sync, async or transfer, got '${mode}'`)
  const depth = depthGiven ?? (mode === 'async' ? DEFAULT_ASYNC_DEPTH : 1)
  if (mode !== 'async' && depth !== 1) throw new Error(`--mode ${mode} is synchronous (depth 1); use --mode async for --depth ${depth}`)
  const system = values.system as TraceSystem
  if (system !== 'nyala' && system !== 'nyala-direct' && system !== 'raw') throw new Error(`--system must be nyala, nyala-direct or raw, got '${system}'`)
  const tracer = values.tracer as Tracer
  if (tracer !== 'strace' && tracer !== 'perf') throw new Error(`--tracer must be strace or perf, got '${tracer}'`)
  const io = values.io as TraceIo
  if (io !== 'all' && !IO_BACKENDS.includes(io)) throw new Error(`--io must be all, node, epoll or io_uring, got '${io}'`)
  if (system === 'raw' && io !== 'all' && io !== 'node') throw new Error(`--system raw is a node:net echo: --io ${io} does not apply`)
  const payloadBytes = values['payload-bytes'] === undefined ? undefined : size(values['payload-bytes'], 'payload-bytes')
  let sidecarBytes = values['sidecar-bytes'] === undefined ? undefined : size(values['sidecar-bytes'], 'sidecar-bytes')
  if (mode === 'transfer') sidecarBytes ??= DEFAULT_SIDECAR_BYTES
  if (sidecarBytes !== undefined && payloadBytes !== undefined) throw new Error('--payload-bytes and --sidecar-bytes exclude each other')
  const calls = values.calls === undefined ? DEFAULT_CALLS[mode] : count(values.calls, 'calls')
  return { plan: { system, mode, calls, depth, payloadBytes, sidecarBytes, tracer, timing: !values['no-timing'], io: io === 'all' ? 'node' : io }, json: values.json, io }
}

function count (value: string, name: string): number {
  const n = Number(value)
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be an integer >= 1, got '${value}'`)
  return n
}

/** Bytes, with an optional K/KiB or M/MiB suffix (powers of 1024). */
function size (value: string, name: string): number {
  const match = /^(\d+)\s*(k|kib|m|mib)?$/i.exec(value.trim())
  if (match === null) throw new Error(`--${name} must be a byte count such as 65536, 64K or 8M, got '${value}'`)
  const unit = (match[2] ?? '').toLowerCase()
  return Number(match[1]) * (unit.startsWith('k') ? 1024 : unit.startsWith('m') ? MIB : 1)
}

/** Why the tracer cannot run here (with what to do), or null. */
export function tracerProblem (tracer: Tracer, path = process.env.PATH): string | null {
  const env = { ...process.env, PATH: path }
  if (tracer === 'strace') {
    const probe = spawnSync('strace', ['-f', '-c', '-o', '/dev/null', '--', 'true'], { env, encoding: 'utf8' })
    if ((probe.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') {
      return 'nyala trace: strace is not installed (not found on PATH).\n' +
        'Install it, then run this again:\n' +
        '  apt-get install strace      # Debian, Ubuntu\n' +
        '  dnf install strace          # Fedora, RHEL\n' +
        '  apk add strace              # Alpine\n' +
        'or count with perf instead: nyala trace --tracer perf\n'
    }
    if (probe.error !== undefined || probe.status !== 0) {
      return `nyala trace: strace cannot trace here: ${(probe.stderr ?? '').trim() || String(probe.error ?? `exit ${probe.status}`)}\n` +
        'In a container it needs the SYS_PTRACE capability (docker run --cap-add=SYS_PTRACE).\n'
    }
    return null
  }
  const probe = spawnSync('perf', ['trace', '-s', '-o', '/dev/null', '--', 'true'], { env, encoding: 'utf8' })
  if ((probe.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') {
    return 'nyala trace: perf is not installed (not found on PATH).\n' +
      'Install it (apt-get install linux-perf, or linux-tools-$(uname -r) on Ubuntu; dnf install perf),\n' +
      'or count with strace, the default: nyala trace --tracer strace\n'
  }
  if (probe.error !== undefined || probe.status !== 0) {
    return `nyala trace: perf trace cannot run here: ${(probe.stderr ?? '').trim() || String(probe.error ?? `exit ${probe.status}`)}\n` +
      'perf trace needs root or a low /proc/sys/kernel/perf_event_paranoid, and the syscall tracepoints (tracefs).\n' +
      'strace needs neither: nyala trace --tracer strace\n'
  }
  return null
}

/** Runs the three runs (N calls untraced, N calls traced, zero calls traced) and builds the report. */
export async function runTrace (plan: TracePlan): Promise<TraceReport> {
  // Untraced first: it also warms the file cache for both traced runs.
  const untraced = plan.timing ? await oneRun(plan, null, plan.calls, 0) : null
  const measured = await oneRun(plan, plan.tracer, plan.calls, 0)
  const zero = await oneRun(plan, plan.tracer, 0, measured.elapsedMs)
  const calls = categorize(measured.counts!)
  const zeroCalls = categorize(zero.counts!)
  const perRpc = {} as Record<Category, number>
  for (const c of CATEGORIES) perRpc[c] = round((calls[c] - zeroCalls[c]) / plan.calls, 4)
  const writes = calls.write - zeroCalls.write
  const failed = categorize(measured.errors!)
  const zeroFailed = categorize(zero.errors!)
  const bytes = measured.bytesFromServer - zero.bytesFromServer
  const movedBytes = plan.sidecarBytes ?? plan.payloadBytes
  return {
    calls: plan.calls,
    perRpc,
    system: plan.system,
    io: plan.io,
    mode: plan.mode,
    depth: plan.depth,
    method: methodLabel(plan),
    tracer: plan.tracer,
    payloadBytes: plan.payloadBytes ?? null,
    sidecarBytes: plan.sidecarBytes ?? null,
    failedPerRpc: {
      read: round((failed.read - zeroFailed.read) / plan.calls, 4),
      write: round((failed.write - zeroFailed.write) / plan.calls, 4)
    },
    bytesPerWrite: writes > 0 ? Math.round(bytes / writes) : null,
    callsPerSec: untraced === null ? null : Math.round(plan.calls / (untraced.elapsedMs / 1000)),
    mibPerSec: untraced === null || movedBytes === undefined ? null : round(plan.calls * movedBytes / MIB / (untraced.elapsedMs / 1000), 1),
    tracedCallsPerSec: Math.round(plan.calls / (measured.elapsedMs / 1000)),
    raw: {
      calls,
      zeroCalls,
      bySyscall: { calls: measured.counts!, zeroCalls: zero.counts! },
      errorsBySyscall: { calls: measured.errors!, zeroCalls: zero.errors! }
    },
    connections: { server: measured.server?.connections ?? null, client: measured.client }
  }
}

function round (x: number, digits: number): number {
  const f = 10 ** digits
  return Math.round(x * f) / f
}

function methodLabel (plan: TracePlan): string {
  if (plan.system === 'raw') return `raw echo of ${plan.sidecarBytes ?? plan.payloadBytes ?? 8} bytes`
  if (plan.sidecarBytes !== undefined) return `EchoSidecars with one ${formatBytes(plan.sidecarBytes)} sidecar`
  if (plan.payloadBytes !== undefined) return `Echo of ${formatBytes(plan.payloadBytes)}`
  return 'Add'
}

// The server entry next to this file: .ts when running from sources, .js from dist.
function serverCommand (plan: TracePlan): string[] {
  const here = fileURLToPath(import.meta.url)
  const entry = join(dirname(here), `trace-server${here.endsWith('.ts') ? '.ts' : '.js'}`)
  // Keep a TypeScript loader (running from sources), nothing else.
  const loader = process.execArgv.filter((arg) => /^--(import|loader|experimental-loader|require)=/.test(arg) || arg === '--enable-source-maps')
  return [process.execPath, ...loader, entry, '--system', plan.system, '--max-message-bytes', String(maxMessageBytes(plan))]
}

// Room for the largest frame of the plan (KRPC's default limit is 50 MiB).
function maxMessageBytes (plan: TracePlan): number {
  return Math.max(50 * MIB, (plan.sidecarBytes ?? plan.payloadBytes ?? 0) + MIB)
}

// One server process, traced or not: connect, negotiate, one warm-up call,
// then `calls` calls (or `idleMs` of nothing), SIGTERM, the tracer's summary.
async function oneRun (plan: TracePlan, tracer: Tracer | null, calls: number, idleMs: number): Promise<RunResult> {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-trace-'))
  const summaryFile = join(dir, 'summary.txt')
  const server = serverCommand(plan)
  const argv = tracer === 'strace'
    ? ['strace', '-f', '-c', '-o', summaryFile, '--', ...server]
    : tracer === 'perf' ? ['perf', 'trace', '-s', '-o', summaryFile, '--', ...server] : server
  // The server's transport: NYALA_IO overrides whatever its options say.
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NYALA_IO: plan.io } })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)))
  let driver: Driver | null = null
  try {
    const { port, pid, io } = await waitListening(() => stdout, () => stderr, exited)
    if (io !== plan.io) throw new TraceError(`the server listened on io ${io}, not ${plan.io}`)
    driver = plan.system === 'raw' ? await RawDriver.connect(port, plan) : new NyalaDriver(port, plan)
    await driver.warmUp()
    const start = performance.now()
    if (calls > 0) await driver.run(calls, plan.depth)
    else await new Promise((resolve) => setTimeout(resolve, idleMs))
    const elapsedMs = performance.now() - start
    const client = driver.connectionStats()
    const bytesFromServer = driver.bytesRead()
    process.kill(pid, 'SIGTERM')
    const code = await withTimeout(exited, 60_000, 'the server did not exit after SIGTERM')
    if (code !== 0) throw new TraceError(`the server (under ${tracer ?? 'no tracer'}) exited with ${code}: ${stderr.trim()}`)
    const statsLine = /^server-stats (.*)$/m.exec(stdout)
    const serverReport = statsLine === null ? null : JSON.parse(statsLine[1]!) as ServerReport
    let counts: SyscallCounts | null = null
    let errors: SyscallCounts | null = null
    if (tracer !== null) {
      const text = readFileSync(summaryFile, 'utf8')
      errors = {}
      counts = tracer === 'strace' ? parseStraceSummary(text, errors) : parsePerfTraceSummary(text, errors)
      if (Object.keys(counts).length === 0) throw new TraceError(`no syscall summary from ${tracer} in ${summaryFile}:\n${text.slice(0, 2000)}`)
    }
    return { counts, errors, elapsedMs, server: serverReport, client, bytesFromServer }
  } finally {
    driver?.close()
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  }
}

async function waitListening (stdout: () => string, stderr: () => string, exited: Promise<number | null>): Promise<{ port: number, pid: number, io: string }> {
  let exit: { code: number | null } | null = null
  void exited.then((code) => { exit = { code } })
  const giveUp = performance.now() + START_TIMEOUT_MS
  for (;;) {
    const match = /listening on \S+:(\d+) pid (\d+) io (\S+)/.exec(stdout())
    if (match !== null) return { port: Number(match[1]), pid: Number(match[2]), io: match[3]! }
    if (exit !== null) throw new TraceError(`the server exited (${(exit as { code: number | null }).code}) before listening: ${stderr().trim()}`)
    if (performance.now() > giveUp) throw new TraceError(`the server did not listen within ${START_TIMEOUT_MS / 1000} s: ${stderr().trim()}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

async function withTimeout<T> (promise: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([promise, new Promise<never>((_resolve, reject) => { timer = setTimeout(() => reject(new TraceError(message)), ms) })])
  } finally {
    clearTimeout(timer)
  }
}

/** The untraced load: one connection, a warm-up call, then runs of calls. */
interface Driver {
  warmUp: () => Promise<void>
  run: (calls: number, depth: number) => Promise<void>
  bytesRead: () => number
  connectionStats: () => ClientConnectionStats[] | null
  close: () => void
}

class NyalaDriver implements Driver {
  readonly #client: Client
  readonly #endpoint: string
  readonly #one: (i: number) => Promise<void>

  constructor (port: number, plan: TracePlan) {
    this.#endpoint = `127.0.0.1:${port}`
    this.#client = new Client({ endpoint: this.#endpoint, maxMessageBytes: maxMessageBytes(plan) })
    const calc = this.#client.service(CalculatorService)
    if (plan.sidecarBytes !== undefined) {
      const sidecarBytes = plan.sidecarBytes
      const sidecar = Buffer.alloc(sidecarBytes, 0x61)
      const def = CalculatorService as unknown as ServiceDef
      this.#one = async () => {
        const result = await this.#client.call(this.#endpoint, def, 'EchoSidecars', {}, { sidecars: [sidecar] })
        if (result.sidecars[0]?.length !== sidecarBytes) throw new TraceError('EchoSidecars answered a wrong sidecar')
      }
    } else if (plan.payloadBytes !== undefined) {
      const data = 'x'.repeat(plan.payloadBytes)
      this.#one = async () => {
        if ((await calc.Echo({ data })).data.length !== data.length) throw new TraceError('Echo answered wrong data')
      }
    } else {
      this.#one = async (i) => {
        if ((await calc.Add({ x: i, y: 1 })).result !== i + 1) throw new TraceError('Add answered a wrong sum')
      }
    }
  }

  async warmUp (): Promise<void> {
    await this.#one(0)
  }

  async run (calls: number, depth: number): Promise<void> {
    let issued = 0
    const chain = async (): Promise<void> => {
      while (issued < calls) await this.#one(issued++)
    }
    const chains: Array<Promise<void>> = []
    for (let i = 0; i < Math.min(depth, calls); i++) chains.push(chain())
    await Promise.all(chains)
  }

  bytesRead (): number {
    let bytes = 0
    for (const c of this.#client.connectionStats()) bytes += c.bytesRead
    return bytes
  }

  connectionStats (): ClientConnectionStats[] {
    return this.#client.connectionStats()
  }

  close (): void {
    this.#client.close()
  }
}

class RawDriver implements Driver {
  readonly #client: RawEchoClient
  readonly #payloadBytes: number

  private constructor (client: RawEchoClient, payloadBytes: number) {
    this.#client = client
    this.#payloadBytes = payloadBytes
  }

  static async connect (port: number, plan: TracePlan): Promise<RawDriver> {
    return new RawDriver(await RawEchoClient.connect(port), plan.sidecarBytes ?? plan.payloadBytes ?? 8)
  }

  warmUp (): Promise<void> {
    return this.#client.run(1, 1, this.#payloadBytes)
  }

  run (calls: number, depth: number): Promise<void> {
    return this.#client.run(calls, depth, this.#payloadBytes)
  }

  bytesRead (): number {
    return this.#client.bytesRead
  }

  connectionStats (): null {
    return null
  }

  close (): void {
    this.#client.close()
  }
}

function formatBytes (bytes: number): string {
  if (bytes >= MIB && bytes % MIB === 0) return `${bytes / MIB} MiB`
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`
  return `${bytes} B`
}

function fixed (x: number, digits = 3): string {
  return x.toFixed(digits)
}

/** The human-readable report. */
export function formatReport (r: TraceReport): string {
  const lines: string[] = []
  const shape = r.depth === 1 ? 'synchronous (depth 1)' : `${r.depth} calls pipelined on one connection`
  const system = r.system === 'raw' ? 'raw node:net echo (bench/raw-echo.ts)' : r.system === 'nyala-direct' ? 'nyala, direct dispatch' : 'nyala'
  lines.push(`nyala trace: ${system} server on io ${r.io}, ${r.calls} calls of ${r.method}, ${shape}`)
  lines.push(`server syscalls per RPC (${r.tracer === 'strace' ? 'strace -f -c' : 'perf trace -s'}, all threads; ${r.calls}-call run minus 0-call run):`)
  lines.push(`  ${'syscall'.padEnd(15)}${'per RPC'.padStart(10)}${`${r.calls} calls`.padStart(14)}${'0 calls'.padStart(10)}`)
  for (const c of CATEGORIES) {
    lines.push(`  ${c.padEnd(15)}${fixed(r.perRpc[c]).padStart(10)}${String(r.raw.calls[c]).padStart(14)}${String(r.raw.zeroCalls[c]).padStart(10)}`)
  }
  lines.push('  (epoll_wait = epoll_wait + epoll_pwait; read = read, readv, recvfrom, recvmsg; write = write, writev, sendto, sendmsg;')
  lines.push('   io_uring_enter: the ring\'s submissions and completions, its reads and sends done inside it)')
  lines.push(`failed per RPC (EAGAIN): read ${fixed(r.failedPerRpc.read)}, write ${fixed(r.failedPerRpc.write)}`)
  lines.push('raw counts by syscall (N-call run / 0-call run; failed calls in brackets):')
  const names = new Set([...Object.keys(r.raw.bySyscall.calls), ...Object.keys(r.raw.bySyscall.zeroCalls)])
  const rows = [...names].map((n) => [n, r.raw.bySyscall.calls[n] ?? 0, r.raw.bySyscall.zeroCalls[n] ?? 0] as const)
    .sort((a, b) => (b[1] - b[2]) - (a[1] - a[2]) || b[1] - a[1] || a[0].localeCompare(b[0]))
  const errors = r.raw.errorsBySyscall
  for (const [n, a, b] of rows) {
    const failed = errors.calls[n] !== undefined || errors.zeroCalls[n] !== undefined ? `  [${errors.calls[n] ?? 0} / ${errors.zeroCalls[n] ?? 0}]` : ''
    lines.push(`  ${n.padEnd(20)}${String(a).padStart(10)}${String(b).padStart(10)}${failed}`)
  }
  if (r.bytesPerWrite !== null) lines.push(`bytes per write syscall (server): ${r.bytesPerWrite}`)
  const untraced = r.callsPerSec === null ? '' : `${r.callsPerSec} calls/s${r.mibPerSec === null ? '' : ` (${r.mibPerSec} MiB/s each way)`} untraced; `
  lines.push(`throughput: ${untraced}${r.tracedCallsPerSec} calls/s under ${r.tracer}`)
  for (const c of r.connections.server ?? []) lines.push(`server connection ${c.remoteAddress}: ${formatConnection(c)}`)
  for (const c of r.connections.client ?? []) lines.push(`client connection ${c.endpoint}: ${formatConnection(c)}`)
  return `${lines.join('\n')}\n`
}

/** The transports side by side: syscalls per RPC by group, one line each. */
export function formatComparison (reports: readonly TraceReport[], unavailable: Readonly<Record<string, string>>): string {
  const lines = [`server syscalls per RPC by transport (${reports[0]?.calls ?? 0} calls of ${reports[0]?.method ?? ''}):`]
  lines.push(`  ${'io'.padEnd(10)}${CATEGORIES.map((c) => c.padStart(c.length + 2)).join('')}`)
  for (const r of reports) lines.push(`  ${r.io.padEnd(10)}${CATEGORIES.map((c) => fixed(r.perRpc[c]).padStart(c.length + 2)).join('')}`)
  for (const [io, why] of Object.entries(unavailable)) lines.push(`  ${io.padEnd(10)}not traced: ${why}`)
  return `${lines.join('\n')}\n`
}

function formatConnection (c: ServerConnectionStats | ClientConnectionStats): string {
  return `immediate writes ${c.immediateWrites}, batched writes ${c.batchedWrites} (${c.batchedFrames} frames), ` +
    `partial writes ${c.partialWrites}, drain waits ${c.drainWaits}, dropped ${c.dropped}; ` +
    `queued now ${c.queuedTransfers} frames / ${c.queuedBytes} B, socket buffer ${c.socketBufferedBytes} B; ` +
    `read ${c.framesRead} frames / ${c.bytesRead} B, wrote ${c.bytesWritten} B`
}
