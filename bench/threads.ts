/**
 * The worker-thread handler mode against the in-loop mode (docs/threads.md), side by
 * side in one run, alternating the modes.
 *
 *   node dist/bench/threads.js [--seconds 2] [--rounds 3] [--depths 16,64]
 *       [--workloads add,crc4k,crc64k] [--modes inloop,threads:2,threads:2x2] [--json]
 *
 * Workloads, all methods of the demo service:
 * - `add`: Add, the cheapest call there is;
 * - `crc4k` / `crc64k`: PushStrings with one 4 KiB / 64 KiB sidecar; the
 *   handler computes its CRC-32 in JavaScript (CPU-bound, ~8 / ~130 µs).
 *
 * The server runs in a child process (one at a time), with the demo handlers
 * in the loop or loaded from `examples/calculator/index.js` in N threads
 * (`threads:NxK`: K calls per thread, see docs/threads.md); the load
 * comes from this process over one connection with `depth` calls
 * outstanding. Each round runs every mode once per workload and depth (the
 * order alternates between rounds); the report is the median calls/s of the
 * rounds, and the server process's CPU time (all its threads) per call.
 */
import { fork } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import os from 'node:os'
import { RpcError } from '../codec/errors.js'
import { Client } from '../reactor/krpc/client.js'
import { Server } from '../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers, crc32 } from '../examples/calculator/index.js'
import { median } from './welch.js'

type Workload = 'add' | 'crc4k' | 'crc64k'
const WORKLOADS: readonly Workload[] = ['add', 'crc4k', 'crc64k']

/** `inloop`, `threads:N` or `threads:NxK` (K calls per thread). */
type Mode = string

function threadsOf (mode: Mode): { threads: number, callsPerThread: number } {
  if (mode === 'inloop') return { threads: 0, callsPerThread: 0 }
  const match = /^threads:(\d+)(?:x(\d+))?$/.exec(mode)
  if (match === null) throw new Error(`mode must be inloop, threads:N or threads:NxK, got ${mode}`)
  return { threads: Number(match[1]), callsPerThread: Number(match[2] ?? 1) }
}

async function serverChild (mode: Mode): Promise<void> {
  const { threads, callsPerThread } = threadsOf(mode)
  const server = new Server()
  if (threads === 0) server.addService(CalculatorService, calculatorHandlers)
  else server.addService(CalculatorService, { module: new URL('../examples/calculator/index.js', import.meta.url), export: 'calculatorHandlers' }, { threads, callsPerThread })
  const { port } = await server.listen(0)
  process.on('message', (m: { type?: string }) => {
    if (m.type === 'usage') process.send!({ type: 'usage', usage: process.cpuUsage(), threadStats: server.threadStats(CalculatorService.fullName) ?? null })
  })
  process.send!({ type: 'port', port })
  process.on('disconnect', () => process.exit(0))
}

function sidecarOf (workload: Workload): Buffer | null {
  if (workload === 'add') return null
  const size = workload === 'crc4k' ? 4 * 1024 : 64 * 1024
  const data = Buffer.allocUnsafe(size)
  for (let i = 0; i < size; i++) data[i] = (i * 31 + 7) & 0xff
  return data
}

interface LoadResult { completed: number, tooBusy: number }

async function load (port: number, workload: Workload, depth: number, endAt: number): Promise<LoadResult> {
  const client = new Client({ endpoint: `127.0.0.1:${port}`, defaultTimeoutMs: 0 })
  const calc = client.service(CalculatorService)
  const sidecar = sidecarOf(workload)
  const expected = sidecar === null ? 0 : crc32(sidecar)
  await calc.Add({ x: 1, y: 2 })
  const result: LoadResult = { completed: 0, tooBusy: 0 }
  const one = sidecar === null
    ? async (x: number): Promise<void> => {
      const response = await calc.Add({ x, y: 1 })
      if (response.result !== x + 1) throw new Error('wrong result')
    }
    : async (): Promise<void> => {
      const response = await calc.PushStrings({ sidecar_indexes: [0] }, { sidecars: [sidecar] })
      if (response.crcs[0] !== expected) throw new Error('wrong crc')
    }
  const chain = async (): Promise<void> => {
    let x = 0
    while (performance.now() < endAt) {
      try {
        await one(x++)
        result.completed++
      } catch (err) {
        if (err instanceof RpcError && err.codeName === 'ERROR_SERVER_TOO_BUSY') result.tooBusy++
        else throw err
      }
    }
  }
  await Promise.all(Array.from({ length: depth }, chain))
  client.close()
  return result
}

interface Sample { callsPerSec: number, serverCpuUsPerCall: number, tooBusy: number, handled: number[] | null }

async function usage (child: ReturnType<typeof fork>): Promise<{ usage: NodeJS.CpuUsage, threadStats: { handled: number[] } | null }> {
  child.send({ type: 'usage' })
  return await new Promise((resolve) => {
    const onMessage = (m: { type?: string }): void => {
      if (m.type !== 'usage') return
      child.off('message', onMessage)
      resolve(m as unknown as { usage: NodeJS.CpuUsage, threadStats: { handled: number[] } | null })
    }
    child.on('message', onMessage)
  })
}

async function measure (mode: Mode, workload: Workload, depth: number, seconds: number): Promise<Sample> {
  const child = fork(fileURLToPath(import.meta.url), ['--child', mode], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const port = await new Promise<number>((resolve) => child.on('message', (m: { type?: string, port?: number }) => { if (m.type === 'port') resolve(m.port!) }))
  await load(port, workload, depth, performance.now() + 300) // warm up
  const before = await usage(child)
  const start = performance.now()
  const result = await load(port, workload, depth, start + seconds * 1000)
  const elapsed = (performance.now() - start) / 1000
  const after = await usage(child)
  child.disconnect()
  await new Promise((resolve) => child.once('exit', resolve))
  const cpuUs = (after.usage.user - before.usage.user) + (after.usage.system - before.usage.system)
  const handled = after.threadStats === null ? null : after.threadStats.handled.map((n, i) => n - (before.threadStats?.handled[i] ?? 0))
  return { callsPerSec: result.completed / elapsed, serverCpuUsPerCall: cpuUs / Math.max(1, result.completed), tooBusy: result.tooBusy, handled }
}


async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      seconds: { type: 'string', default: process.env.BENCH_SMOKE === '1' ? '0.3' : '2' },
      rounds: { type: 'string', default: process.env.BENCH_SMOKE === '1' ? '1' : '3' },
      depths: { type: 'string', default: '16,64' },
      workloads: { type: 'string', default: WORKLOADS.join(',') },
      modes: { type: 'string', default: 'inloop,threads:2,threads:2x2' },
      json: { type: 'boolean', default: false }
    }
  })
  const seconds = Number(values.seconds)
  const rounds = Number(values.rounds)
  const depths = values.depths.split(',').map(Number)
  const workloads = values.workloads.split(',') as Workload[]
  for (const w of workloads) if (!WORKLOADS.includes(w)) throw new Error(`unknown workload ${w}`)
  const modes = values.modes.split(',')
  for (const m of modes) threadsOf(m)
  const samples = new Map<string, Sample[]>()
  const key = (w: string, d: number, m: string): string => `${w}|${d}|${m}`
  for (let round = 0; round < rounds; round++) {
    for (const workload of workloads) {
      for (const depth of depths) {
        const order = round % 2 === 0 ? modes : [...modes].reverse()
        for (const mode of order) {
          const sample = await measure(mode, workload, depth, seconds)
          const list = samples.get(key(workload, depth, mode)) ?? []
          list.push(sample)
          samples.set(key(workload, depth, mode), list)
          if (!values.json) process.stderr.write(`round ${round + 1} ${workload} depth ${depth} ${mode}: ${Math.round(sample.callsPerSec)} calls/s\n`)
        }
      }
    }
  }
  const report = workloads.flatMap((workload) => depths.map((depth) => ({
    workload,
    depth,
    modes: Object.fromEntries(modes.map((mode) => {
      const list = samples.get(key(workload, depth, mode))!
      return [mode, {
        callsPerSec: Math.round(median(list.map(s => s.callsPerSec))),
        serverCpuUsPerCall: Number(median(list.map(s => s.serverCpuUsPerCall)).toFixed(1)),
        tooBusy: list.reduce((n, s) => n + s.tooBusy, 0),
        samples: list.map(s => Math.round(s.callsPerSec)),
        handledPerThread: list[list.length - 1]!.handled
      }]
    }))
  })))
  if (values.json) {
    process.stdout.write(`${JSON.stringify({ node: process.version, cpus: os.cpus().length, seconds, rounds, report })}\n`)
    return
  }
  process.stdout.write(`node ${process.version}, ${os.cpus()[0]?.model ?? '?'} x${os.cpus().length}, ${rounds} rounds x ${seconds} s, medians\n`)
  const base = modes[0]!
  process.stdout.write(`workload depth ${modes.map(m => `${m.padStart(10)} calls/s  cpu us/call`).join('  ')}  ratio to ${base}\n`)
  for (const row of report) {
    const cells = modes.map((m) => `${String(row.modes[m]!.callsPerSec).padStart(17)}  ${String(row.modes[m]!.serverCpuUsPerCall).padStart(11)}`).join('  ')
    const ratios = modes.slice(1).map((m) => (row.modes[m]!.callsPerSec / row.modes[base]!.callsPerSec).toFixed(2)).join(' ')
    process.stdout.write(`${row.workload.padEnd(8)} ${String(row.depth).padStart(5)} ${cells}  ${ratios}\n`)
    for (const m of modes) {
      const r = row.modes[m]!
      process.stdout.write(`    ${m}: samples [${r.samples.join(' ')}]${r.tooBusy > 0 ? `, ${r.tooBusy} TOO_BUSY` : ''}${r.handledPerThread === null ? '' : `, per thread (last sample) [${r.handledPerThread.join(' ')}]`}\n`)
    }
  }
}

if (process.argv[2] === '--child') await serverChild(process.argv[3]!)
else await main()
