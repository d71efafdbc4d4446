/**
 * MemcachedClient (examples/memcached/client.ts, on ProtocolClient) against
 * a real memcached, beside memcaslap against the same server:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/memcached-client.js [--rounds 3] [--seconds 5] [--max-minutes 10]
 *
 * It starts `memcached -t 1 -U 0 -l 127.0.0.1 -p <free port>` (with `-u
 * root` when run as root) and fills it with the keys the client reads.
 * Each round runs, one after the other, the order flipped every round (the
 * VM's speed drifts over tens of seconds, so only runs close in time
 * compare):
 *
 * - `client 1/conn`: 16 MemcachedClients of one connection each, one
 *   request outstanding per connection (each awaits its answer before the
 *   next), for `--seconds`;
 * - `client 16/conn`: the same 16 connections with 16 requests
 *   outstanding on each (pipelined: a connection's requests of one turn
 *   leave in one write);
 * - `memcaslap`: `memcaslap -s 127.0.0.1:P -T 1 -c 16 -t <seconds>s -B`
 *   (binary protocol, 16 connections, one thread).
 *
 * The client's workload is memcaslap's default: 64-byte keys, 1024-byte
 * values, one set for nine gets. It prints ops/s per run and round, then
 * the median per run, and each client run's median ratio to memcaslap.
 * The client shares the machine's cores with memcached (as memcaslap
 * does): do not run it beside another benchmark or a test suite. Every
 * process it starts is killed by PID at the end, also on error or
 * interruption.
 */
import { parseArgs } from 'node:util'
import { MemcachedClient } from '../examples/memcached/client.js'
import { HOST, median, runBounded, startMemcached, stopAll } from './processes.js'

const CONNECTIONS = 16
const KEYS = 10_000
const KEY_BYTES = 64
const VALUE_BYTES = 1024

function keyOf (i: number): string {
  return `key:${String(i).padStart(KEY_BYTES - 4, '0')}`
}

const VALUE = Buffer.alloc(VALUE_BYTES, 0x78)

/** Ops/s of the client with `depth` requests outstanding on each of the 16 connections. */
async function runClient (port: number, depth: number, seconds: number): Promise<number> {
  const clients = Array.from({ length: CONNECTIONS }, () => new MemcachedClient({ endpoint: `${HOST}:${port}`, retry: false }))
  try {
    // Connections open before the clock starts.
    await Promise.all(clients.map((c) => c.noop()))
    let ops = 0
    let stop = false
    const timer = setTimeout(() => { stop = true }, seconds * 1000)
    const started = process.hrtime.bigint()
    const loop = async (client: MemcachedClient, seed: number): Promise<void> => {
      let n = seed
      while (!stop) {
        n = (n * 1103515245 + 12345) % 2147483648
        const key = keyOf(n % KEYS)
        if (n % 10 === 0) await client.set(key, VALUE)
        else await client.get(key)
        ops++
      }
    }
    const loops: Array<Promise<void>> = []
    for (let c = 0; c < CONNECTIONS; c++) for (let d = 0; d < depth; d++) loops.push(loop(clients[c]!, c * 1000 + d + 1))
    await Promise.all(loops)
    clearTimeout(timer)
    const elapsed = Number(process.hrtime.bigint() - started) / 1e9
    return ops / elapsed
  } finally {
    await Promise.all(clients.map((c) => c.close()))
  }
}

/** memcaslap's ops/s (its TPS), from its final `Run time: … TPS: N` line. */
async function runMemcaslap (port: number, seconds: number): Promise<number> {
  const { out } = await runBounded('memcaslap', ['-s', `${HOST}:${port}`, '-T', '1', '-c', String(CONNECTIONS), '-t', `${seconds}s`, '-B'], (seconds + 30) * 1000)
  const matches = [...out.matchAll(/TPS:\s*(\d+)/g)]
  const last = matches[matches.length - 1]
  if (last === undefined) throw new Error(`no TPS in memcaslap's output: ${out.slice(-500)}`)
  return Number(last[1])
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: { rounds: { type: 'string' }, seconds: { type: 'string' }, 'max-minutes': { type: 'string' } },
    strict: true
  })
  const rounds = Number(values.rounds ?? 3)
  const seconds = Number(values.seconds ?? 5)
  const maxMinutes = Number(values['max-minutes'] ?? 10)
  const guard = setTimeout(() => {
    console.error(`stopped after ${maxMinutes} minutes`)
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  guard.unref()

  const { port } = await startMemcached(500, 10)
  const filler = new MemcachedClient({ endpoint: `${HOST}:${port}`, connectionsPerEndpoint: 4 })
  for (let i = 0; i < KEYS; i += 500) await Promise.all(Array.from({ length: Math.min(500, KEYS - i) }, (_, j) => filler.set(keyOf(i + j), VALUE)))
  await filler.close()

  const runs: Record<string, () => Promise<number>> = {
    'client 1/conn': () => runClient(port, 1, seconds),
    'client 16/conn': () => runClient(port, 16, seconds),
    memcaslap: () => runMemcaslap(port, seconds)
  }
  const names = Object.keys(runs)
  const results: Record<string, number[]> = Object.fromEntries(names.map((n) => [n, []]))
  console.log(`memcached on ${HOST}:${port}; ${CONNECTIONS} connections, ${seconds} s per run, ${rounds} rounds`)
  for (let round = 1; round <= rounds; round++) {
    const order = round % 2 === 1 ? names : [...names].reverse()
    const line: string[] = []
    for (const name of order) {
      const rate = await runs[name]!()
      results[name]!.push(rate)
      line.push(`${name} ${Math.round(rate)} ops/s`)
    }
    console.log(`round ${round}: ${line.join(', ')}`)
  }
  const base = median(results.memcaslap!)
  for (const name of names) {
    const m = median(results[name]!)
    console.log(`median ${name}: ${Math.round(m)} ops/s${name === 'memcaslap' ? '' : ` (${(m / base).toFixed(2)} × memcaslap)`}`)
  }
  clearTimeout(guard)
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => { void stopAll().then(() => process.exit(130)) })
main().then(() => stopAll(), async (err: unknown) => {
  console.error(err instanceof Error ? err.stack : err)
  await stopAll()
  process.exit(1)
})
