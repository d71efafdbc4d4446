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
 * Client and servers share the machine's cores: do not run it beside
 * another benchmark (or a test suite), whose load would skew both sides.
 * Bounded in time: each redis-benchmark run is killed after a minute per
 * 100,000 requests (and at least two), the whole bench after
 * `--max-minutes`. Every process it starts is killed by PID at the end,
 * also on error or interruption.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync, readdirSync } from 'node:fs'
import { connect, createServer } from 'node:net'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

const HOST = '127.0.0.1'
const EXAMPLE = fileURLToPath(new URL('../examples/redis/main.js', import.meta.url))
const TESTS = ['SET', 'GET'] as const
const PIPELINES = [1, 16] as const

const started: ChildProcess[] = []

function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, HOST, () => {
      const address = server.address()
      server.close(() => typeof address === 'object' && address !== null ? resolve(address.port) : reject(new Error('no port')))
    })
  })
}

// Starts a process and resolves once `ready` says so (given what it printed so far), rejecting if it exits or times out.
function startProcess (command: string, args: string[], ready: (text: string) => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<ChildProcess> {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  started.push(child)
  let text = ''
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command} not ready after ${timeoutMs} ms: ${text}`)), timeoutMs)
    let done = false
    const check = async (): Promise<void> => {
      if (!done && await ready(text)) {
        done = true
        clearTimeout(timer)
        resolve(child)
      }
    }
    const onData = (d: Buffer): void => {
      text += d.toString()
      void check()
    }
    child.stdout!.on('data', onData)
    child.stderr!.on('data', onData)
    child.once('error', (err) => { clearTimeout(timer); reject(err) })
    child.once('exit', (code, signal) => { clearTimeout(timer); if (!done) reject(new Error(`${command} exited (${code ?? signal}): ${text}`)) })
    void check()
  })
}

function portOpen (port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, HOST)
    socket.once('connect', () => { socket.destroy(); resolve(true) })
    socket.once('error', () => resolve(false))
  })
}

async function startRedis (): Promise<{ child: ChildProcess, port: number }> {
  const port = await freePort()
  const child = await startProcess('redis-server', ['--save', '', '--appendonly', 'no', '--bind', HOST, '--port', String(port)], async () => {
    for (let i = 0; i < 100; i++) {
      if (await portOpen(port)) return true
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    return false
  })
  return { child, port }
}

async function startExample (reactors: number): Promise<{ child: ChildProcess, port: number }> {
  let port = 0
  const child = await startProcess(process.execPath, [EXAMPLE, '--port', '0', '--reactors', String(reactors)], (text) => {
    const m = /listening on [\d.]+:(\d+)/.exec(text)
    if (m !== null) port = Number(m[1])
    return m !== null
  }, 30_000)
  return { child, port }
}

type Rates = Record<typeof TESTS[number], number>

// One redis-benchmark run, bounded in time: requests per second per test.
async function benchmark (port: number, requests: number, pipeline: number): Promise<Rates> {
  const args = ['-h', HOST, '-p', String(port), '-t', 'set,get', '-c', '16', '-n', String(requests), '-q']
  if (pipeline > 1) args.push('-P', String(pipeline))
  const child = spawn('redis-benchmark', args, { stdio: ['ignore', 'pipe', 'pipe'] })
  started.push(child)
  let out = ''
  child.stdout!.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { out += d.toString() })
  const limitMs = Math.max(2, requests / 100_000) * 60_000
  const killer = setTimeout(() => { if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL') }, limitMs)
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject)
    child.once('exit', (c) => resolve(c))
  })
  clearTimeout(killer)
  started.splice(started.indexOf(child), 1)
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

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

// The live children of a process (the reactor processes the example forks).
function childrenOf (pid: number): number[] {
  const children: number[] = []
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'latin1')
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid) children.push(Number(entry))
    } catch { /* gone meanwhile */ }
  }
  return children
}

// SIGTERM first (the example drains and exits, taking its reactors along),
// then SIGKILL to whatever of them (and of their children) is left after 2 s.
async function stopAll (): Promise<void> {
  const pids: number[] = []
  for (const child of started) {
    if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) continue
    pids.push(...childrenOf(child.pid), child.pid)
    try { process.kill(child.pid, 'SIGTERM') } catch { /* already gone */ }
  }
  started.length = 0
  const alive = (pid: number): boolean => {
    try { process.kill(pid, 0); return true } catch { return false }
  }
  for (let i = 0; i < 40 && pids.some(alive); i++) await new Promise((resolve) => setTimeout(resolve, 50))
  for (const pid of pids) {
    try { process.kill(pid, 'SIGKILL') } catch { /* already gone */ }
  }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      requests: { type: 'string', default: '200000' },
      reactors: { type: 'string', default: '1' },
      'max-minutes': { type: 'string', default: '30' }
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
    console.log(`redis-benchmark -t set,get -c 16 -n ${requests} -q, and with -P 16; ${rounds} rounds; redis-server pid ${redis.child.pid}; ratio = example / redis`)
    console.log('reactors round  -P  test     redis req/s   example req/s   ratio')
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
          for (const test of TESTS) {
            const r = runs.redis![test]
            const e = runs.example![test]
            const ratio = e / r
            const key = `-P ${String(pipeline).padStart(2)} ${test}`
            ratios.set(key, [...(ratios.get(key) ?? []), ratio])
            console.log(`${String(reactors).padStart(8)} ${String(round + 1).padStart(5)}  ${String(pipeline).padStart(2)}  ${test.padEnd(4)}  ${r.toFixed(0).padStart(12)}  ${e.toFixed(0).padStart(14)}   ${ratio.toFixed(3)}${exampleFirst ? '  (example first)' : ''}`)
          }
        }
      }
      for (const [key, values] of ratios) summary.push(`reactors ${reactors} ${key}: median ratio ${median(values).toFixed(3)} over ${values.length} rounds`)
    }
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
