/**
 * Loopback ping-pong and pipelining of nyala's `Add` against a raw node:net
 * echo, measured side by side in one run, alternating the systems.
 *
 *   node dist/bench/pingpong.js [--seconds 3] [--rounds 3] [--depths 1,100]
 *       [--systems nyala,nyala-direct,raw] [--workers 10] [--json]
 *
 * Ratios are to the last system named (default raw).
 *
 * The servers run in child processes (one at a time); the load comes from
 * this process. Each round runs every system once per depth; the report is
 * the median calls/s per system and the ratio nyala/raw.
 */
import { fork } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import os from 'node:os'
import { Client } from '../reactor/krpc/client.js'
import { Server } from '../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'
import { runRawClient, startRawEchoServer } from './raw-echo.js'
import { median } from './welch.js'

/** `nyala-direct`: handlers dispatched directly, bypassing the service queue and workers (to price the scheduler). */
type System = 'nyala' | 'nyala-direct' | 'raw'
const SYSTEMS: readonly System[] = ['nyala', 'nyala-direct', 'raw']

async function serverChild (system: System, workers: number): Promise<void> {
  let port: number
  if (system === 'raw') {
    port = (await startRawEchoServer()).port
  } else {
    const server = new Server({ scheduler: system === 'nyala-direct' ? 'direct' : 'pool', workers }).addService(CalculatorService, calculatorHandlers)
    port = (await server.listen(0)).port
  }
  process.send!({ port })
  process.on('disconnect', () => process.exit(0))
}

async function runNyala (port: number, depth: number, endAt: number): Promise<number> {
  const client = new Client({ endpoint: `127.0.0.1:${port}`, defaultTimeoutMs: 0 })
  const calc = client.service(CalculatorService)
  await calc.Add({ x: 1, y: 2 })
  let completed = 0
  const chain = async (): Promise<void> => {
    let x = 0
    while (performance.now() < endAt) {
      const response = await calc.Add({ x, y: 1 })
      if (response.result !== x + 1) throw new Error('wrong result')
      x++
      completed++
    }
  }
  const chains: Array<Promise<void>> = []
  for (let i = 0; i < depth; i++) chains.push(chain())
  await Promise.all(chains)
  client.close()
  return completed
}

async function measure (system: System, depth: number, seconds: number, workers: number): Promise<{ callsPerSec: number, serverCpuUsPerCall: number }> {
  const child = fork(fileURLToPath(import.meta.url), ['--child', system, String(workers)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const port = await new Promise<number>((resolve) => child.once('message', (m) => resolve((m as { port: number }).port)))
  // Warm up, then measure.
  const warm = performance.now() + 300
  if (system === 'raw') await runRawClient(port, depth, 8, warm); else await runNyala(port, depth, warm)
  const start = performance.now()
  const endAt = start + seconds * 1000
  const calls = system === 'raw' ? await runRawClient(port, depth, 8, endAt) : await runNyala(port, depth, endAt)
  const elapsed = (performance.now() - start) / 1000
  child.disconnect()
  await new Promise((resolve) => child.once('exit', resolve))
  return { callsPerSec: calls / elapsed, serverCpuUsPerCall: Number.NaN }
}


async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      seconds: { type: 'string', default: process.env.BENCH_SMOKE === '1' ? '0.3' : '3' },
      rounds: { type: 'string', default: process.env.BENCH_SMOKE === '1' ? '1' : '3' },
      depths: { type: 'string', default: '1,100' },
      systems: { type: 'string', default: 'nyala,raw' },
      workers: { type: 'string', default: '10' },
      json: { type: 'boolean', default: false }
    }
  })
  const seconds = Number(values.seconds)
  const rounds = Number(values.rounds)
  const depths = values.depths.split(',').map(Number)
  const workers = Number(values.workers)
  const systems = values.systems.split(',') as System[]
  for (const s of systems) if (!SYSTEMS.includes(s)) throw new Error(`unknown system ${s}; known: ${SYSTEMS.join(', ')}`)
  const baseline = systems[systems.length - 1]!
  const results: Record<string, Record<string, number[]>> = {}
  for (let round = 0; round < rounds; round++) {
    for (const depth of depths) {
      const row = (results[depth] ??= Object.fromEntries(systems.map((s) => [s, []])))
      // Alternate the order so that neither system always runs first.
      const order = round % 2 === 0 ? [...systems].reverse() : systems
      for (const system of order) row[system]!.push((await measure(system, depth, seconds, workers)).callsPerSec)
    }
  }
  const report = depths.map((depth) => {
    const row = results[depth]!
    const base = median(row[baseline]!)
    return {
      depth,
      callsPerSec: Object.fromEntries(systems.map((s) => [s, Math.round(median(row[s]!))])),
      ratioTo: baseline,
      ratios: Object.fromEntries(systems.map((s) => [s, Number((median(row[s]!) / base).toFixed(3))])),
      samples: Object.fromEntries(systems.map((s) => [s, row[s]!.map(Math.round)]))
    }
  })
  if (values.json) {
    process.stdout.write(`${JSON.stringify({ node: process.version, cpus: os.cpus().length, seconds, rounds, workers, report })}\n`)
    return
  }
  process.stdout.write(`node ${process.version}, ${os.cpus()[0]?.model ?? '?'} x${os.cpus().length}, ${rounds} rounds x ${seconds} s, workers ${workers}, medians; ratios to ${baseline}\n`)
  process.stdout.write(`depth${systems.map((s) => `  ${`${s} calls/s`.padStart(20)}  ratio`).join('')}\n`)
  for (const r of report) {
    process.stdout.write(`${String(r.depth).padStart(5)}${systems.map((s) => `  ${String(r.callsPerSec[s]).padStart(20)}  ${r.ratios[s]!.toFixed(3)}`).join('')}\n`)
  }
}

if (process.argv[2] === '--child') await serverChild(process.argv[3] as System, Number(process.argv[4] ?? 10))
else await main()
