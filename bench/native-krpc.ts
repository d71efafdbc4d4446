/**
 * The KRPC server (`nyala bench`'s nyala system: the demo CalculatorService,
 * one reactor) on each transport, beside the raw node:net echo
 * (bench/raw-echo.ts, which batches a read's answers into one write), in
 * alternating rounds within one run:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/native-krpc.js [--rounds 3] [--run-seconds 2]
 *     [--modes async100,sync1,sync16] [--io epoll,io_uring,node] [--max-minutes 3] [--profile-dir DIR]
 *
 * Modes as rpc-bench's: async100 is one connection with 100 `Add`s
 * outstanding (the load's callback API), sync1 one connection with one call
 * outstanding, sync16 16 connections with one each. Each run is one
 * `runSystem` of bench/rpc-bench.ts: a fresh server process (its transport
 * chosen by NYALA_IO, set in its environment only; the load processes'
 * clients stay on node:net), fresh load processes, a warm-up, then a
 * window in which the server's user+sys CPU (getrusage, every thread) and
 * the calls answered are counted. Per round and mode every system runs
 * once, the order rotating every round. Printed per round: each system's
 * calls/s and server CPU µs per call, each nyala transport's server CPU per
 * call over raw's and its calls/s over nyala on node:net's; then per mode
 * and transport the medians and the rounds won. With `--profile-dir` each
 * server runs with `--cpu-prof` and writes its profile there when it exits.
 *
 * Hold the bench lock (`flock /tmp/nyala-bench.lock`). Bounded: each run is
 * bounded by rpc-bench's start and drain timeouts, the whole bench by
 * `--max-minutes`; the processes it forks are stopped at the end of each run.
 */
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { runSystem, type BenchConfig, type BenchRun } from './rpc-bench.js'
import { median } from './welch.js'

const MODES: Record<string, Pick<BenchConfig, 'mode' | 'clientThreads' | 'asyncCallConcurrency'>> = {
  async100: { mode: 'async', clientThreads: 1, asyncCallConcurrency: 100 },
  sync1: { mode: 'sync', clientThreads: 1, asyncCallConcurrency: 1 },
  sync16: { mode: 'sync', clientThreads: 16, asyncCallConcurrency: 16 }
}
/** Server CPU per call over raw's: the bar for async100. */
const CPU_BAR = 1.2

/** One run of `system` ('raw' or a nyala transport) in `mode`. */
async function runOne (system: string, mode: string, runSeconds: number, serverExecArgv: string[]): Promise<BenchRun> {
  const config: BenchConfig = {
    ...MODES[mode]!,
    workerThreads: undefined,
    serverReactors: 1,
    runSeconds,
    warmupSeconds: 1,
    payloadBytes: 0,
    against: [],
    serverExecArgv
  }
  const before = process.env.NYALA_IO
  if (system !== 'raw') process.env.NYALA_IO = system
  try {
    // The server is forked at once, with this environment; the loads ignore NYALA_IO (their clients ask for no io).
    return await runSystem(system === 'raw' ? 'raw' : 'nyala', config)
  } finally {
    if (before === undefined) delete process.env.NYALA_IO
    else process.env.NYALA_IO = before
  }
}

const cpuPerCall = (run: BenchRun): number => run.row.userCpuUsPerReq + run.row.sysCpuUsPerReq

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      'run-seconds': { type: 'string', default: '2' },
      modes: { type: 'string', default: 'async100,sync1,sync16' },
      io: { type: 'string', default: 'epoll,io_uring,node' },
      'max-minutes': { type: 'string', default: '3' },
      'profile-dir': { type: 'string' }
    },
    strict: true
  })
  const rounds = Number(values.rounds)
  const runSeconds = Number(values['run-seconds'])
  const maxMinutes = Number(values['max-minutes'])
  const modes = values.modes.split(',')
  const ios = values.io.split(',')
  if (![rounds, runSeconds, maxMinutes].every((n) => Number.isInteger(n) && n >= 1)) throw new RangeError('--rounds, --run-seconds and --max-minutes take positive integers')
  if (modes.some((m) => MODES[m] === undefined)) throw new RangeError(`--modes: a comma-separated list of ${Object.keys(MODES).join(', ')}`)
  // rpc-bench's runs stop their own processes; past the deadline the bench stops waiting for more runs.
  const deadline = Date.now() + maxMinutes * 60_000
  const systems = ['raw', ...ios]
  // --profile-dir: each server writes a CPU profile there when it exits.
  const serverExecArgv = values['profile-dir'] === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${values['profile-dir']}`]
  console.log(`nyala bench's runs, --run-seconds ${runSeconds} (warm-up 1 s), one server reactor, Add; modes ${modes.join(', ')}; systems ${systems.join(', ')} (nyala's server on NYALA_IO=IO); ${rounds} rounds`)
  console.log('cells: calls/s, server user+sys CPU µs per call [CPU per call / raw\'s; calls/s / nyala on node\'s]')
  const cpuRatios = new Map<string, number[]>()
  const rateRatios = new Map<string, number[]>()
  done: for (let round = 0; round < rounds; round++) {
    for (const mode of modes) {
      const order = systems.map((_, i) => systems[(i + round) % systems.length]!)
      const runs = new Map<string, BenchRun>()
      for (const system of order) {
        if (Date.now() > deadline) { console.log(`--max-minutes ${maxMinutes} passed: stopping`); break done }
        const run = await runOne(system, mode, runSeconds, serverExecArgv)
        if (run.errors > 0) throw new Error(`${system} ${mode}: ${run.errors} errors, first ${run.firstError}`)
        runs.set(system, run)
      }
      const raw = runs.get('raw')!
      const node = runs.get('node')
      const cells = systems.map((system) => {
        const run = runs.get(system)!
        let cell = `${system} ${run.row.reqsPerSec.toFixed(0)}, ${cpuPerCall(run).toFixed(3)} µs`
        if (system !== 'raw') {
          const cpu = cpuPerCall(run) / cpuPerCall(raw)
          cpuRatios.set(`${mode} ${system}`, [...(cpuRatios.get(`${mode} ${system}`) ?? []), cpu])
          let rate = ''
          if (node !== undefined && system !== 'node') {
            const r = run.row.reqsPerSec / node.row.reqsPerSec
            rateRatios.set(`${mode} ${system}`, [...(rateRatios.get(`${mode} ${system}`) ?? []), r])
            rate = `; ${r.toFixed(3)}`
          }
          cell += ` [${cpu.toFixed(3)}${rate}]`
        }
        return cell
      })
      console.log(`round ${round + 1} ${mode}: ${cells.join(' | ')}  order ${order.join(',')}`)
    }
  }
  for (const [key, list] of cpuRatios) {
    const within = key.startsWith('async100') ? `; ${list.filter((r) => r <= CPU_BAR).length} of ${list.length} at or below ${CPU_BAR}` : ''
    console.log(`${key}: server CPU per call / raw: ${list.map((r) => r.toFixed(3)).join(' ')}; median ${median(list).toFixed(3)}${within}`)
  }
  for (const [key, list] of rateRatios) {
    console.log(`${key}: calls/s / nyala on node:net: ${list.map((r) => r.toFixed(3)).join(' ')}; median ${median(list).toFixed(3)}; ${list.filter((r) => r >= 1).length} of ${list.length} at or above 1`)
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err)
    process.exitCode = 1
  })
}
