/**
 * The redis example on each transport beside redis-server, under one
 * redis-benchmark test, pipelined and not:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/native-redis.js [--rounds 5] [--test get]
 *     [--requests 400000] [--requests-unpipelined 100000] [--io epoll,io_uring,node] [--max-minutes 3] [--profile-dir DIR]
 *
 * It starts `redis-server --save '' --appendonly no` and, per `--io` value,
 * `node dist/examples/redis/main.js --port 0 --reactors 1 --io IO`, then
 * sets the test's key once on each (`redis-benchmark -t set -n 1000`, so
 * GET finds a 3-byte value). Each round runs, against every server, `redis-benchmark -t TEST
 * -c 16 -P 16 -n <requests> -q`, then the same without -P (one request at
 * a time per connection, `-n <requests-unpipelined>`); the servers' order
 * rotates every round, so each goes first as often as the others. It prints
 * each run's requests per second, each example's ratio to redis-server in
 * the same round, then per transport and pipelining the median ratio and
 * the rounds at or above the bar (0.8 pipelined, 1.0 unpipelined). With
 * `--profile-dir` each example runs with `--cpu-prof` and writes its
 * profile there when it exits.
 *
 * Client and servers share the machine's cores: hold the bench lock
 * (`flock /tmp/nyala-bench.lock`). Bounded: each redis-benchmark run is
 * killed after two minutes, the whole bench after `--max-minutes`; every
 * process it starts is killed by PID at the end, also on error.
 */
import type { ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { HOST, freePort, median, portProbe, runBounded, startNode, startProcess, stopAll, runAsProgram } from './processes.js'

const EXAMPLE = fileURLToPath(new URL('../examples/redis/main.js', import.meta.url))
const BARS: Record<number, number> = { 16: 0.8, 1: 1.0 }

async function startRedis (): Promise<{ child: ChildProcess, port: number }> {
  const port = await freePort()
  const child = await startProcess('redis-server', ['--save', '', '--appendonly', 'no', '--bind', HOST, '--port', String(port)], portProbe(port))
  return { child, port }
}

/** One redis-benchmark run: `args` against `port`, the requests per second of its one test. */
export async function redisBenchmarkRate (port: number, args: string[]): Promise<number> {
  const all = ['-h', HOST, '-p', String(port), ...args]
  const { code, out } = await runBounded('redis-benchmark', all, 120_000)
  const m = /: ([\d.]+) requests per second/.exec(out)
  if (code !== 0 || m === null || /ERR|error/i.test(out)) throw new Error(`redis-benchmark ${all.join(' ')} failed (exit ${code}): ${out.slice(-500)}`)
  return Number(m[1])
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '5' },
      test: { type: 'string', default: 'get' },
      requests: { type: 'string', default: '400000' },
      'requests-unpipelined': { type: 'string', default: '100000' },
      io: { type: 'string', default: 'epoll,io_uring,node' },
      'max-minutes': { type: 'string', default: '3' },
      'profile-dir': { type: 'string' }
    },
    strict: true
  })
  const rounds = Number(values.rounds)
  const requests: Record<number, number> = { 16: Number(values.requests), 1: Number(values['requests-unpipelined']) }
  const maxMinutes = Number(values['max-minutes'])
  const ios = values.io.split(',')
  // --profile-dir: each example writes a CPU profile there when it exits.
  const profile = values['profile-dir'] === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${values['profile-dir']}`]
  if (![rounds, requests[16]!, requests[1]!, maxMinutes].every((n) => Number.isInteger(n) && n >= 1)) throw new RangeError('--rounds, --requests, --requests-unpipelined and --max-minutes take positive integers')
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  try {
    const servers = new Map<string, { child: ChildProcess, port: number }>()
    servers.set('redis', await startRedis())
    for (const io of ios) servers.set(io, await startNode([...profile, EXAMPLE, '--port', '0', '--reactors', '1', '--io', io]))
    for (const [, server] of servers) await redisBenchmarkRate(server.port, ['-t', 'set', '-n', '1000', '-c', '1', '-q'])
    const names = [...servers.keys()]
    const command = (pipeline: number): string => `redis-benchmark -t ${values.test} -c 16 -n ${requests[pipeline]}${pipeline > 1 ? ` -P ${pipeline}` : ''} -q`
    console.log(`${command(16)}; ${command(1)}; ${rounds} rounds; servers ${names.join(', ')} (examples: --reactors 1 --io IO); ratio = example / redis-server in the same round`)
    const ratios = new Map<string, number[]>()
    for (let round = 0; round < rounds; round++) {
      const order = names.map((_, i) => names[(i + round) % names.length]!)
      for (const pipeline of [16, 1]) {
        const rates = new Map<string, number>()
        const args = ['-t', values.test, '-c', '16', '-n', String(requests[pipeline]), '-q']
        if (pipeline > 1) args.push('-P', String(pipeline))
        for (const name of order) rates.set(name, await redisBenchmarkRate(servers.get(name)!.port, args))
        const redis = rates.get('redis')!
        const cells = ios.map((io) => {
          const ratio = rates.get(io)! / redis
          const key = `${io} -P ${pipeline}`
          ratios.set(key, [...(ratios.get(key) ?? []), ratio])
          return `${io} ${rates.get(io)!.toFixed(0)} (${ratio.toFixed(3)})`
        })
        console.log(`round ${round + 1} -P ${String(pipeline).padStart(2)}: redis ${redis.toFixed(0)} | ${cells.join(' | ')}  order ${order.join(',')}`)
      }
    }
    for (const [key, list] of ratios) {
      const bar = BARS[Number(key.split(' ').pop())]!
      console.log(`${key}: ratios ${list.map((r) => r.toFixed(3)).join(' ')}; median ${median(list).toFixed(3)}; ${list.filter((r) => r >= bar).length} of ${list.length} rounds at or above ${bar}`)
    }
  } finally {
    clearTimeout(deadline)
    await stopAll()
  }
}

runAsProgram(import.meta.url, main)
