/**
 * The memcached example against a real memcached, under memcaslap's default
 * binary workload (64-byte keys, 1 KiB values, 1:9 set:get, 16 connections
 * from one client thread):
 *
 *   npx tsc -p tsconfig.json && node dist/bench/memcached.js [--rounds 3] [--seconds 5] [--reactors 1,2] [--raw] [--native]
 *
 * It starts `memcached -t 1 -U 0 -l 127.0.0.1 -p <free port>` (with `-u
 * root` when run as root, which memcached requires) and, per reactors
 * value, `node dist/examples/memcached/main.js --port 0 --reactors N`. Each
 * round runs `memcaslap -s 127.0.0.1:P -T 1 -c 16 -t <seconds>s -B` once
 * against each server, one after the other, the order reversed every round:
 * the VM's speed drifts over tens of seconds, so only runs close in time
 * compare. It reads memcaslap's last line (`Ops: N TPS: T`) and prints, per
 * round, both TPS and their ratio (example / memcached), then the median
 * ratio per reactors value and how many rounds reached 0.8.
 *
 * With `--raw` each round also runs bench/raw-memcached.ts, a minimal
 * node:net GET/SET server with no framework (one process): the ceiling of
 * a Node server under this load, printed as its own TPS, µs/op and ratio to
 * memcached. With `--native` the same for bench/native-memcached.ts, the
 * same GET/SET on the native reactor prototype (a uv_poll_t per socket in
 * Node's loop, one JS call per loop turn). A round's order is raw, native,
 * memcached, example, reversed every other round (printed at the row's
 * end): memcached sits between the example and native, so each ratio
 * divides by the memcached run adjacent to it, and native goes first as
 * often as memcached does.
 *
 * It also reports each server's CPU time per operation (µs/op): utime +
 * stime from /proc/PID/stat of the server process and of its live children
 * (the reactor processes `--reactors 2` forks), sampled just before and
 * after each memcaslap run.
 *
 * Client and servers share the machine's cores: do not run it beside
 * another benchmark (or a test suite), whose load would skew both sides.
 * Every process it starts is killed by PID at the end, also on error.
 */
import type { ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { CLOCK_TICKS, HOST, cpuTicks, median, runBounded, startMemcached, startNode, stopAll } from './processes.js'

const TARGET_RATIO = 0.8
const EXAMPLE = fileURLToPath(new URL('../examples/memcached/main.js', import.meta.url))
const RAW = fileURLToPath(new URL('./raw-memcached.js', import.meta.url))
const NATIVE = fileURLToPath(new URL('./native-memcached.js', import.meta.url))

async function startExample (reactors: number): Promise<{ child: ChildProcess, port: number }> {
  return startNode([EXAMPLE, '--port', '0', '--reactors', String(reactors)])
}

interface Run { tps: number, ops: number, cpuUsPerOp: number }

// One memcaslap run, bounded in time (its own -t, plus a kill after twice that and 10 s).
async function memcaslap (port: number, seconds: number, serverPid: number): Promise<Run> {
  const before = cpuTicks(serverPid)
  const { out } = await runBounded('memcaslap', ['-s', `${HOST}:${port}`, '-T', '1', '-c', '16', '-t', `${seconds}s`, '-B'], (2 * seconds + 10) * 1000)
  const after = cpuTicks(serverPid)
  const m = /Ops:\s*(\d+)\s+TPS:\s*(\d+)/.exec(out.trim().split('\n').at(-1) ?? '')
  if (m === null) throw new Error(`memcaslap printed no TPS line: ${out.slice(-500)}`)
  const ops = Number(m[1])
  return { tps: Number(m[2]), ops, cpuUsPerOp: ops === 0 ? NaN : ((after - before) / CLOCK_TICKS) * 1e6 / ops }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      seconds: { type: 'string', default: '5' },
      reactors: { type: 'string', default: '1' },
      raw: { type: 'boolean', default: false },
      native: { type: 'boolean', default: false }
    },
    strict: true
  })
  const rounds = Number(values.rounds)
  const seconds = Number(values.seconds)
  const reactorsList = values.reactors.split(',').map(Number)
  if (!Number.isInteger(rounds) || rounds < 1 || !Number.isInteger(seconds) || seconds < 1 || reactorsList.some((n) => !Number.isInteger(n) || n < 1)) {
    throw new RangeError('--rounds, --seconds and --reactors (a comma-separated list) take positive integers')
  }
  try {
    const memcached = await startMemcached()
    const examples = new Map<number, { child: ChildProcess, port: number }>()
    for (const reactors of reactorsList) examples.set(reactors, await startExample(reactors))
    // The servers beside the pair, on memcached's other side each round: the node:net ceiling and the native reactor prototype (pushed last: next to memcached).
    const extras: Array<{ name: string, server: { child: ChildProcess, port: number }, ratios: number[] }> = []
    if (values.raw) extras.push({ name: 'raw', server: await startNode([RAW, '--port', '0']), ratios: [] })
    if (values.native) extras.push({ name: 'native', server: await startNode([NATIVE, '--port', '0']), ratios: [] })
    console.log(`memcaslap -T 1 -c 16 -t ${seconds}s -B; ${rounds} rounds; memcached pid ${memcached.child.pid}; ratio = example / memcached`)
    console.log(`reactors round  memcached TPS  µs/op   example TPS  µs/op   ratio${extras.map((x) => `  ${(x.name + ' TPS').padStart(12)}  µs/op  ${(x.name + ' ratio').padStart(12)}`).join('')}`)
    const summary: string[] = []
    for (const reactors of reactorsList) {
      const example = examples.get(reactors)!
      const ratios: number[] = []
      for (let round = 0; round < rounds; round++) {
        // memcached runs between the example and the extras (native beside it, raw beyond), and the order
        // reverses every round: each ratio's two runs are adjacent in time, and each server goes first as
        // often as last, so neither side of a ratio always inherits the VM's phase from the other.
        const order = [...extras.map((x) => x.name), 'memcached', 'example']
        if (round % 2 === 1) order.reverse()
        const runs = new Map<string, Run>()
        for (const which of order) {
          const server = which === 'memcached' ? memcached : which === 'example' ? example : extras.find((x) => x.name === which)!.server
          runs.set(which, await memcaslap(server.port, seconds, server.child.pid!))
        }
        const m = runs.get('memcached')!
        const e = runs.get('example')!
        const ratio = e.tps / m.tps
        ratios.push(ratio)
        let extraColumns = ''
        for (const x of extras) {
          const r = runs.get(x.name)!
          x.ratios.push(r.tps / m.tps)
          extraColumns += `  ${String(r.tps).padStart(12)}  ${r.cpuUsPerOp.toFixed(2).padStart(5)}  ${(r.tps / m.tps).toFixed(3).padStart(12)}`
        }
        const exampleFirst = order.indexOf('example') < order.indexOf('memcached')
        console.log(`${String(reactors).padStart(8)} ${String(round + 1).padStart(5)}  ${String(m.tps).padStart(13)}  ${m.cpuUsPerOp.toFixed(2).padStart(5)}  ${String(e.tps).padStart(12)}  ${e.cpuUsPerOp.toFixed(2).padStart(5)}   ${ratio.toFixed(3)}${extraColumns}${exampleFirst ? '  (example first)' : ''}${extras.length > 0 ? `  order: ${order.join(', ')}` : ''}`)
      }
      summary.push(`reactors ${reactors}: median ratio ${median(ratios).toFixed(3)}, ${ratios.filter((r) => r >= TARGET_RATIO).length}/${rounds} rounds at ≥ ${TARGET_RATIO}`)
    }
    for (const x of extras) summary.push(`${x.name === 'raw' ? 'raw node:net server' : 'native reactor prototype'}: median ratio ${median(x.ratios).toFixed(3)} of memcached over ${x.ratios.length} runs, ${x.ratios.filter((r) => r >= 0.9).length} at ≥ 0.9`)
    for (const line of summary) console.log(line)
  } finally {
    await stopAll()
  }
}

// Interrupted: still take the servers down.
process.once('SIGINT', () => { void stopAll().then(() => process.exit(130)) })

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err)
  process.exitCode = 1
})
