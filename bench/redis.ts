/**
 * The redis example against a real redis-server, under redis-benchmark's
 * SET and GET tests (3-byte values, 16 connections, one request at a time
 * per connection, then 16 pipelined):
 *
 *   npx tsc -p tsconfig.json && node dist/bench/redis.js [--rounds 3] [--requests 200000] [--reactors 1,2] [--max-minutes 30]
 *
 * It starts `redis-server --save '' --appendonly no --bind 127.0.0.1 --port
 * <free port>` and, per reactors value, `node dist/examples/redis/main.js
 * --port 0 --reactors N`. Each round runs `redis-benchmark -p P -t set,get
 * -c 16 -n <requests> -q`, then the same with `-P 16`, once against each
 * server, one after the other, the order flipped every round: the VM's
 * speed drifts over tens of seconds, so only runs close in time compare.
 * It reads the requests per second of each test from redis-benchmark's
 * `SET: N requests per second` lines and prints, per round, both rates and
 * their ratio (example / redis) per test, then the median ratio per test,
 * pipelining and reactors value.
 *
 * With `--raw` each round also runs bench/raw-redis.ts (a minimal node:net
 * SET/GET server, no framework) after the other two: the ceiling of a Node
 * server under this load, printed with its ratio to redis.
 *
 * Client and servers share the machine's cores: do not run it beside
 * another benchmark (or a test suite), whose load would skew both sides.
 * Bounded in time: each redis-benchmark run is killed after a minute per
 * 100,000 requests (and at least two), the whole bench after
 * `--max-minutes`. Every process it starts is killed by PID at the end,
 * also on error or interruption.
 */
import type { ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { HOST, freePort, median, portProbe, runBounded, startNode, startProcess, stopAll } from './processes.js'

const EXAMPLE = fileURLToPath(new URL('../examples/redis/main.js', import.meta.url))
const RAW = fileURLToPath(new URL('./raw-redis.js', import.meta.url))
const TESTS = ['SET', 'GET'] as const
const PIPELINES = [1, 16] as const

async function startRedis (): Promise<{ child: ChildProcess, port: number }> {
  const port = await freePort()
  const child = await startProcess('redis-server', ['--save', '', '--appendonly', 'no', '--bind', HOST, '--port', String(port)], portProbe(port))
  return { child, port }
}

async function startExample (reactors: number): Promise<{ child: ChildProcess, port: number }> {
  return startNode([EXAMPLE, '--port', '0', '--reactors', String(reactors)])
}

type Rates = Record<typeof TESTS[number], number>

// One redis-benchmark run, bounded in time: requests per second per test.
async function benchmark (port: number, requests: number, pipeline: number): Promise<Rates> {
  const args = ['-h', HOST, '-p', String(port), '-t', 'set,get', '-c', '16', '-n', String(requests), '-q']
  if (pipeline > 1) args.push('-P', String(pipeline))
  const { code, out } = await runBounded('redis-benchmark', args, Math.max(2, requests / 100_000) * 60_000)
  const rates: Partial<Rates> = {}
  for (const line of out.split(/[\r\n]+/)) {
    const m = /^\s*(SET|GET): ([\d.]+) requests per second/.exec(line)
    if (m !== null) rates[m[1] as keyof Rates] = Number(m[2])
  }
  if (code !== 0 || TESTS.some((test) => rates[test] === undefined) || /ERR|error/i.test(out)) {
    throw new Error(`redis-benchmark ${args.join(' ')} failed (exit ${code}): ${out.slice(-500)}`)
  }
  return rates as Rates
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      requests: { type: 'string', default: '200000' },
      reactors: { type: 'string', default: '1' },
      'max-minutes': { type: 'string', default: '30' },
      raw: { type: 'boolean', default: false }
    },
    strict: true
  })
  const rounds = Number(values.rounds)
  const requests = Number(values.requests)
  const maxMinutes = Number(values['max-minutes'])
  const reactorsList = values.reactors.split(',').map(Number)
  if (![rounds, requests, maxMinutes].every((n) => Number.isInteger(n) && n >= 1) || reactorsList.some((n) => !Number.isInteger(n) || n < 1)) {
    throw new RangeError('--rounds, --requests, --max-minutes and --reactors (a comma-separated list) take positive integers')
  }
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  try {
    const redis = await startRedis()
    const examples = new Map<number, { child: ChildProcess, port: number }>()
    for (const reactors of reactorsList) examples.set(reactors, await startExample(reactors))
    const raw = values.raw ? await startNode([RAW, '--port', '0']) : null
    console.log(`redis-benchmark -t set,get -c 16 -n ${requests} -q, and with -P 16; ${rounds} rounds; redis-server pid ${redis.child.pid}; ratio = example / redis`)
    console.log(`reactors round  -P  test     redis req/s   example req/s   ratio${raw === null ? '' : '     raw req/s   raw ratio'}`)
    const rawRatios = new Map<string, number[]>()
    const summary: string[] = []
    for (const reactors of reactorsList) {
      const example = examples.get(reactors)!
      const ratios = new Map<string, number[]>()
      for (let round = 0; round < rounds; round++) {
        const exampleFirst = round % 2 === 1
        for (const pipeline of PIPELINES) {
          const runs: { redis?: Rates, example?: Rates } = {}
          for (const which of exampleFirst ? ['example', 'redis'] as const : ['redis', 'example'] as const) {
            runs[which] = await benchmark((which === 'redis' ? redis : example).port, requests, pipeline)
          }
          const rawRates = raw === null ? null : await benchmark(raw.port, requests, pipeline)
          for (const test of TESTS) {
            const r = runs.redis![test]
            const e = runs.example![test]
            const ratio = e / r
            const key = `-P ${String(pipeline).padStart(2)} ${test}`
            ratios.set(key, [...(ratios.get(key) ?? []), ratio])
            let rawColumns = ''
            if (rawRates !== null) {
              rawRatios.set(key, [...(rawRatios.get(key) ?? []), rawRates[test] / r])
              rawColumns = `  ${rawRates[test].toFixed(0).padStart(12)}   ${(rawRates[test] / r).toFixed(3).padStart(9)}`
            }
            console.log(`${String(reactors).padStart(8)} ${String(round + 1).padStart(5)}  ${String(pipeline).padStart(2)}  ${test.padEnd(4)}  ${r.toFixed(0).padStart(12)}  ${e.toFixed(0).padStart(14)}   ${ratio.toFixed(3)}${rawColumns}${exampleFirst ? '  (example first)' : ''}`)
          }
        }
      }
      for (const [key, values] of ratios) summary.push(`reactors ${reactors} ${key}: median ratio ${median(values).toFixed(3)} over ${values.length} rounds`)
    }
    for (const [key, values] of rawRatios) summary.push(`raw node:net server ${key}: median ratio ${median(values).toFixed(3)} of redis over ${values.length} runs`)
    for (const line of summary) console.log(line)
  } finally {
    clearTimeout(deadline)
    await stopAll()
  }
}

// Interrupted: still take the servers down.
process.once('SIGINT', () => { void stopAll().then(() => process.exit(130)) })

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err)
  process.exitCode = 1
})
