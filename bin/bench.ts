import { availableParallelism, cpus, platform } from 'node:os'
import { parseArgs } from 'node:util'
import { RpcError } from '../codec/errors.js'
import { SYSTEMS, type System } from '../bench/bench-ipc.js'
import { chainsPerConnection, makeBenchCertificate, runBench, type BenchCertificate, warmupSeconds, type BenchConfig, type BenchHooks, type BenchRow, type BenchRun } from '../bench/rpc-bench.js'
import { median, welchTest, type WelchResult } from '../bench/welch.js'

export const BENCH_USAGE = `  nyala bench [--mode sync|async] [--client-threads 16]
              [--async-call-concurrency 60] [--worker-threads W]
              [--server-reactors 1] [--run-seconds 1] [--warmup-seconds W]
              [--payload-bytes 0] [--against SYSTEMS]
              [--load-processes P] [--busy-poll-us U] [--json]
              [--repeat K [--compare 'FLAGS A' 'FLAGS B']]
              [--server-cpu-prof DIR] [--load-cpu-prof DIR]
      Kudu's rpc-bench for nyala, side by side with a raw node:net echo and
      grpc-js (a devDependency), one system after the other in one run
      (--against: comma-separated, of nyala, nyala-promise, nyala-tls, raw,
      grpc; default nyala,raw, in async mode nyala,nyala-promise,raw).
      Sync: N client connections with one call outstanding each. Async: C
      calls outstanding over N connections.
      nyala calls as rpc-bench does: sync awaits each call's promise, async
      re-issues each chain from the last call's callback (the stub's
      callback form, as the raw and grpc loads do); nyala-promise awaits
      promises in both modes. nyala-tls is nyala with every call encrypted
      (KRPC's TLS inside negotiation, encryptLoopback on both ends, a
      self-signed certificate made with openssl for the run).
      Server and load run in separate processes (one load process per
      connection, at most one per core). One row per system: Reqs/sec,
      server user/sys CPU us and context switches per request (all server
      processes), client CPU us per request, p50/p99/p99.9 latency us.
      Each window follows a warm-up (default: half the window, 0.1 to 3
      s). --payload-bytes B calls Echo with B bytes instead of Add. --json
      prints the rows as a JSON array. --repeat K runs K times and reports
      medians; with --compare it runs configurations A and B alternately,
      K times each, and prints Welch's t-test on Reqs/sec with the 95 %
      confidence interval of A - B. --server-cpu-prof DIR writes the
      servers' V8 CPU profiles (.cpuprofile) to DIR, --load-cpu-prof DIR
      the load processes' (the clients'). --busy-poll-us U turns on
      nyala's busy polling (U µs) on its server and its clients.
`

/** Flags that make up a configuration (also the ones `--compare` takes). */
const CONFIG_OPTIONS = {
  mode: { type: 'string' },
  'client-threads': { type: 'string' },
  'async-call-concurrency': { type: 'string' },
  'worker-threads': { type: 'string' },
  'busy-poll-us': { type: 'string' },
  'server-reactors': { type: 'string' },
  'run-seconds': { type: 'string' },
  'warmup-seconds': { type: 'string' },
  'payload-bytes': { type: 'string' },
  against: { type: 'string' },
  'load-processes': { type: 'string' }
} as const

type ConfigValues = { [K in keyof typeof CONFIG_OPTIONS]?: string | undefined }

/** rpc-bench's defaults where they fit this machine (docs/design.md, 'rpc-bench'); worker threads: nyala's default. */
export const DEFAULT_CONFIG: BenchConfig = {
  mode: 'sync',
  clientThreads: 16,
  asyncCallConcurrency: 60,
  workerThreads: undefined,
  serverReactors: 1,
  runSeconds: 1,
  payloadBytes: 0,
  against: ['nyala', 'raw']
}

function invalid (message: string): RpcError {
  return new RpcError('RPC_ERR_INVALID_ARGUMENT', message)
}

function positiveInt (value: string, name: string, min = 1): number {
  const n = Number(value)
  if (!Number.isInteger(n) || n < min) throw invalid(`--${name} must be an integer >= ${min}, got '${value}'`)
  return n
}

/** `base` with the configuration flags of `values` applied. */
export function applyConfig (base: BenchConfig, values: ConfigValues): BenchConfig {
  const config: BenchConfig = { ...base, against: [...base.against] }
  if (values.mode !== undefined) {
    if (values.mode !== 'sync' && values.mode !== 'async') throw invalid(`--mode must be sync or async, got '${values.mode}'`)
    config.mode = values.mode
  }
  if (values['client-threads'] !== undefined) config.clientThreads = positiveInt(values['client-threads'], 'client-threads')
  if (values['async-call-concurrency'] !== undefined) config.asyncCallConcurrency = positiveInt(values['async-call-concurrency'], 'async-call-concurrency')
  if (values['worker-threads'] !== undefined) config.workerThreads = positiveInt(values['worker-threads'], 'worker-threads')
  if (values['busy-poll-us'] !== undefined) config.busyPollUs = positiveInt(values['busy-poll-us'], 'busy-poll-us', 0)
  if (values['server-reactors'] !== undefined) config.serverReactors = positiveInt(values['server-reactors'], 'server-reactors')
  if (values['payload-bytes'] !== undefined) config.payloadBytes = positiveInt(values['payload-bytes'], 'payload-bytes', 0)
  if (values['load-processes'] !== undefined) config.loadProcesses = positiveInt(values['load-processes'], 'load-processes')
  if (values['run-seconds'] !== undefined) {
    const s = Number(values['run-seconds'])
    if (!(s > 0) || !Number.isFinite(s)) throw invalid(`--run-seconds must be a number > 0, got '${values['run-seconds']}'`)
    config.runSeconds = s
  }
  if (values['warmup-seconds'] !== undefined) {
    const s = Number(values['warmup-seconds'])
    if (!(s >= 0) || !Number.isFinite(s)) throw invalid(`--warmup-seconds must be a number >= 0, got '${values['warmup-seconds']}'`)
    config.warmupSeconds = s
  }
  if (values.against !== undefined) {
    const against = values.against.split(',').map((s) => s.trim()).filter((s) => s !== '')
    for (const s of against) if (!(SYSTEMS as readonly string[]).includes(s)) throw invalid(`--against: unknown system '${s}'; known: ${SYSTEMS.join(', ')}`)
    if (against.length === 0 || new Set(against).size !== against.length) throw invalid(`--against must name systems once each, got '${values.against}'`)
    config.against = against as System[]
  } else if (config.mode === 'async' && base === DEFAULT_CONFIG) {
    // nyala's async chains use the callback form: the awaiting chains run beside them unless asked otherwise.
    config.against = ['nyala', 'nyala-promise', 'raw']
  }
  return config
}

/** Parses a `--compare` operand such as `'--worker-threads 1 --mode async'` over `base`. */
export function parseCompareFlags (base: BenchConfig, flags: string): BenchConfig {
  const args = flags.split(/\s+/).filter((s) => s !== '')
  const { values } = parseArgs({ args, options: CONFIG_OPTIONS, strict: true })
  return applyConfig(base, values)
}

/** Runs `nyala bench ARGS`; resolves with the exit code. */
export async function bench (args: string[]): Promise<number> {
  // `--compare 'FLAGS A' 'FLAGS B'` is taken out first: its operands start
  // with dashes, which parseArgs would read as options.
  const { rest, compareFlags } = takeCompare(args)
  const { values, positionals } = parseArgs({
    args: rest,
    options: {
      ...CONFIG_OPTIONS,
      json: { type: 'boolean', default: false },
      repeat: { type: 'string' },
      'server-cpu-prof': { type: 'string' },
      'load-cpu-prof': { type: 'string' }
    },
    allowPositionals: true,
    strict: true
  })
  let base = applyConfig(DEFAULT_CONFIG, values)
  if (values['server-cpu-prof'] !== undefined) base = { ...base, serverExecArgv: ['--cpu-prof', '--cpu-prof-dir', values['server-cpu-prof']] }
  if (values['load-cpu-prof'] !== undefined) base = { ...base, loadExecArgv: ['--cpu-prof', '--cpu-prof-dir', values['load-cpu-prof']] }
  const repeat = values.repeat === undefined ? 1 : positiveInt(values.repeat, 'repeat')
  const progress = new ProgressBar()
  if (positionals.length > 0) throw invalid(`unexpected argument '${positionals[0]}'`)
  if (compareFlags !== null && repeat < 2) throw invalid('--compare needs --repeat K with K >= 2 (Welch\'s t-test needs two runs of each)')
  let configs = compareFlags === null ? [base] : compareFlags.map((flags) => parseCompareFlags(base, flags))
  // nyala-tls's certificate: one for the whole command, removed at its end.
  let certificate: BenchCertificate | undefined
  if (configs.some((c) => c.against.includes('nyala-tls'))) {
    try {
      certificate = makeBenchCertificate()
    } catch (err) {
      process.stderr.write(`nyala bench: ${(err as Error).message}\n`)
      return 1
    }
    configs = configs.map((c) => ({ ...c, tls: certificate }))
  }
  try {
    if (compareFlags !== null) return await compare(configs[0]!, configs[1]!, compareFlags[0], compareFlags[1], repeat, values.json, progress)
    base = configs[0]!
    progress.plan(repeat * base.against.length)
    const rounds: BenchRun[][] = []
    for (let round = 0; round < repeat; round++) {
      // Alternate the order so that no system always runs first.
      const order = round % 2 === 0 ? base.against : [...base.against].reverse()
      const runs = await runBench(base, progress.hooks, order)
      rounds.push(base.against.map((s) => runs.find((r) => r.row.system === s)!))
    }
    progress.done()
    const rows = base.against.map((_, i) => medianRow(rounds.map((runs) => runs[i]!.row)))
    if (values.json) process.stdout.write(`${JSON.stringify(rows)}\n`)
    else process.stdout.write(formatReport(base, rows, repeat, rounds.flat()))
    return reportErrors(rounds.flat())
  } finally {
    progress.done()
    certificate?.remove()
  }
}

/** `args` without `--compare A B`, and A and B (null without `--compare`). */
export function takeCompare (args: readonly string[]): { rest: string[], compareFlags: [string, string] | null } {
  const at = args.indexOf('--compare')
  if (at === -1) return { rest: [...args], compareFlags: null }
  if (at + 2 >= args.length) throw invalid(`--compare takes two quoted flag lists: --compare 'FLAGS A' 'FLAGS B'`)
  if (args.indexOf('--compare', at + 1) !== -1) throw invalid('--compare may be given once')
  return { rest: [...args.slice(0, at), ...args.slice(at + 3)], compareFlags: [args[at + 1]!, args[at + 2]!] }
}

function reportErrors (runs: readonly BenchRun[]): number {
  let failed = 0
  for (const run of runs) {
    if (run.errors === 0) continue
    failed++
    process.stderr.write(`nyala bench: ${run.row.system}: ${run.errors} call(s) failed; first: ${run.firstError}\n`)
  }
  return failed === 0 ? 0 : 1
}

/** Each column's median over rounds (the rows of one system). */
export function medianRow (rows: readonly BenchRow[]): BenchRow {
  const first = rows[0]!
  if (rows.length === 1) return first
  const m = (key: keyof Omit<BenchRow, 'system' | 'mode'>): number => median(rows.map((r) => r[key]))
  return {
    system: first.system,
    mode: first.mode,
    reqsPerSec: m('reqsPerSec'),
    userCpuUsPerReq: m('userCpuUsPerReq'),
    sysCpuUsPerReq: m('sysCpuUsPerReq'),
    ctxSwPerReq: m('ctxSwPerReq'),
    clientCpuUsPerReq: m('clientCpuUsPerReq'),
    p50Us: m('p50Us'),
    p99Us: m('p99Us'),
    p999Us: m('p999Us')
  }
}


/** One system's outcome of `--compare`. */
export interface CompareRow extends WelchResult {
  system: System
  reqsPerSecA: number[]
  reqsPerSecB: number[]
}

async function compare (a: BenchConfig, b: BenchConfig, flagsA: string, flagsB: string, repeat: number, json: boolean, progress: ProgressBar): Promise<number> {
  const systems = a.against.filter((s) => b.against.includes(s))
  if (systems.length === 0) throw invalid('--compare: A and B run no system in common')
  progress.plan(repeat * (a.against.length + b.against.length))
  const samples = { a: new Map<System, number[]>(), b: new Map<System, number[]>() }
  const all: BenchRun[] = []
  for (let k = 0; k < repeat; k++) {
    // A then B, then B then A: neither configuration always runs first.
    const order = k % 2 === 0 ? (['a', 'b'] as const) : (['b', 'a'] as const)
    for (const side of order) {
      const runs = await runBench(side === 'a' ? a : b, progress.hooks)
      all.push(...runs)
      for (const run of runs) {
        const list = samples[side].get(run.row.system) ?? []
        list.push(run.row.reqsPerSec)
        samples[side].set(run.row.system, list)
      }
    }
  }
  progress.done()
  const rows: CompareRow[] = systems.map((system) => {
    const reqsPerSecA = samples.a.get(system)!
    const reqsPerSecB = samples.b.get(system)!
    return { system, reqsPerSecA, reqsPerSecB, ...welchTest(reqsPerSecA, reqsPerSecB, 0.95) }
  })
  if (json) process.stdout.write(`${JSON.stringify({ a: flagsA, b: flagsB, repeat, systems: rows })}\n`)
  else process.stdout.write(formatCompare(flagsA, flagsB, repeat, rows))
  return reportErrors(all)
}

const GROUP = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })

function fixed (value: number, digits: number): string {
  return Number.isFinite(value) ? value.toFixed(digits) : '-'
}

function table (header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)))
  const line = (cells: string[]): string => cells.map((c, i) => i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)).join('  ').trimEnd()
  return [line(header), ...rows.map(line)].join('\n') + '\n'
}

/** The one-line description of a configuration. */
export function describeConfig (config: BenchConfig): string {
  const connections = chainsPerConnection(config).length
  const processes = Math.max(1, Math.min(connections, config.loadProcesses ?? availableParallelism()))
  const calls = config.mode === 'sync' ? `${connections} connection(s) x 1 outstanding call` : `${config.asyncCallConcurrency} outstanding calls over ${connections} connection(s)`
  const method = config.payloadBytes > 0 ? `Echo of ${config.payloadBytes} B` : 'Add'
  const workers = config.workerThreads === undefined ? 'default workers (10)' : `${config.workerThreads} workers`
  const poll = (config.busyPollUs ?? 0) > 0 ? `, busy polling ${config.busyPollUs} µs on both ends` : ''
  return `${config.mode} mode, ${calls}, ${processes} load process(es); nyala: ${config.serverReactors} reactor(s), ${workers}${poll}; ${method}; ` +
    `${config.runSeconds} s window after ${warmupSeconds(config)} s warm-up`
}

function machine (): string {
  const list = cpus()
  return `Node ${process.version}, ${list[0]?.model.trim() ?? 'unknown CPU'} x${list.length}, ${platform()}, ${new Date().toISOString().slice(0, 10)}`
}

/** The systems the report gives ratios of, each to the systems after it here and to the others (raw, grpc). */
const RATIOS_OF: readonly System[] = ['nyala-tls', 'nyala', 'nyala-promise']

/** The text report: the rows, then nyala's ratios to the other systems. */
export function formatReport (config: BenchConfig, rows: readonly BenchRow[], repeat: number, runs: readonly BenchRun[] = []): string {
  let out = `nyala bench: ${describeConfig(config)}${repeat > 1 ? `; medians of ${repeat} runs` : ''}\n${machine()}\n\n`
  out += table(
    ['system', 'Reqs/sec', 'User CPU µs/req', 'Sys CPU µs/req', 'Ctx Sw./req', 'Client CPU µs/req', 'p50 µs', 'p99 µs', 'p99.9 µs'],
    rows.map((r) => [r.system, GROUP.format(r.reqsPerSec), fixed(r.userCpuUsPerReq, 2), fixed(r.sysCpuUsPerReq, 2), fixed(r.ctxSwPerReq, 3),
      fixed(r.clientCpuUsPerReq, 2), GROUP.format(r.p50Us), GROUP.format(r.p99Us), GROUP.format(r.p999Us)]))
  // Each of RATIOS_OF against every other system but the ones before it there (nyala-tls / nyala, nyala / nyala-promise, nyala / raw, ...).
  let ratios = ''
  for (const mine of rows) {
    const rank = RATIOS_OF.indexOf(mine.system)
    if (rank === -1) continue
    for (const other of rows) {
      if (other === mine || RATIOS_OF.slice(0, rank).includes(other.system)) continue
      const cpu = (mine.userCpuUsPerReq + mine.sysCpuUsPerReq) / (other.userCpuUsPerReq + other.sysCpuUsPerReq)
      ratios += `\n${mine.system} / ${other.system}: ${fixed(mine.reqsPerSec / other.reqsPerSec, 2)}x Reqs/sec, ${fixed(cpu, 2)}x server CPU per request`
      // Rounds run every system back to back: a round's ratio shares its phase of the machine.
      const a = runs.filter((run) => run.row.system === mine.system)
      const b = runs.filter((run) => run.row.system === other.system)
      if (a.length > 1 && a.length === b.length) {
        const perRound = a.map((run, i) => run.row.reqsPerSec / b[i]!.row.reqsPerSec).sort((x, y) => x - y)
        ratios += `; per round: median ${fixed(median(perRound), 2)}x (${fixed(perRound[0]!, 2)}–${fixed(perRound[perRound.length - 1]!, 2)})`
      }
    }
  }
  if (ratios !== '') out += `${ratios}\n`
  if (repeat > 1) {
    out += '\nReqs/sec per run:\n'
    for (const r of rows) out += `  ${r.system}: ${runs.filter((run) => run.row.system === r.system).map((run) => GROUP.format(run.row.reqsPerSec)).join(' ')}\n`
  }
  const failed = runs.filter((r) => r.errors > 0)
  for (const r of failed) out += `\n${r.row.system}: ${r.errors} call(s) failed`
  return out
}

/** The text report of `--compare`: Welch's t-test per system, as R prints its essentials. */
export function formatCompare (flagsA: string, flagsB: string, repeat: number, rows: readonly CompareRow[]): string {
  let out = `nyala bench --compare: A = '${flagsA}', B = '${flagsB}', ${repeat} runs each, alternating\n${machine()}\n\n`
  out += table(
    ['system', 'mean A', 'mean B', 'A - B', '95 % CI of A - B', 't', 'df', 'p-value'],
    rows.map((r) => [r.system, GROUP.format(r.meanA), GROUP.format(r.meanB), GROUP.format(r.difference),
      `[${GROUP.format(r.low)}, ${GROUP.format(r.high)}]`, fixed(r.t, 3), fixed(r.df, 2), r.p < 1e-4 ? r.p.toExponential(2) : fixed(r.p, 4)]))
  out += '\nReqs/sec per run:\n'
  for (const r of rows) out += `  ${r.system} A: ${r.reqsPerSecA.map((v) => GROUP.format(v)).join(' ')}\n  ${r.system} B: ${r.reqsPerSecB.map((v) => GROUP.format(v)).join(' ')}\n`
  return out
}

/** A one-line progress bar on stderr, only when stderr is a terminal. */
class ProgressBar {
  readonly #enabled = process.stderr.isTTY === true
  #total = 0
  #finished = 0
  #current: { system: System, startedAt: number, plannedMs: number } | null = null
  #timer: NodeJS.Timeout | null = null
  readonly hooks: BenchHooks = {
    onRunStart: (system, plannedMs) => {
      this.#current = { system, startedAt: performance.now(), plannedMs }
      this.#draw()
    },
    onRunEnd: () => {
      this.#finished++
      this.#current = null
      this.#draw()
    }
  }

  plan (runs: number): void {
    if (!this.#enabled) return
    this.#total = runs
    this.#timer ??= setInterval(() => this.#draw(), 250)
    this.#timer.unref()
  }

  #draw (): void {
    if (!this.#enabled || this.#total === 0) return
    const current = this.#current
    const partial = current === null ? 0 : Math.min(0.99, (performance.now() - current.startedAt) / current.plannedMs)
    const fraction = Math.min(1, (this.#finished + partial) / this.#total)
    const width = 30
    const filled = Math.round(fraction * width)
    const label = current === null ? '' : ` ${current.system}`
    process.stderr.write(`\r\x1b[K[${'='.repeat(filled)}${' '.repeat(width - filled)}] ${String(Math.round(fraction * 100)).padStart(3)}% run ${Math.min(this.#total, this.#finished + 1)}/${this.#total}${label}`)
  }

  done (): void {
    if (this.#timer !== null) clearInterval(this.#timer)
    this.#timer = null
    if (this.#enabled && this.#total > 0) process.stderr.write('\r\x1b[K')
    this.#total = 0
  }
}
