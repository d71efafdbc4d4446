// The real redis-benchmark (redis-tools) against the redis example, started
// as `npm run example:redis` starts it: every test it runs completes,
// prints its line, and reports no error reply. No rate is asserted.
// Bounded in time: the tool is killed by PID if it hangs. Skipped, saying
// so, when redis-benchmark is missing.
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import { startListening } from '../helpers/listening-child.js'

const tool = spawnSync('sh', ['-c', 'command -v redis-benchmark'], { encoding: 'utf8' }).stdout.trim()
const main = fileURLToPath(new URL('../../examples/redis/main.ts', import.meta.url))
const TESTS = ['ping', 'set', 'get', 'incr', 'lpush', 'rpush', 'lpop', 'rpop', 'sadd', 'hset', 'spop', 'zadd', 'zpopmin', 'lrange_100', 'mset']
// The names redis-benchmark prints for them (ping runs inline and multibulk; lrange_100 first fills the list).
const LINES = ['PING_INLINE', 'PING_MBULK', 'SET', 'GET', 'INCR', 'LPUSH', 'RPUSH', 'LPOP', 'RPOP', 'SADD', 'HSET', 'SPOP', 'ZADD', 'ZPOPMIN',
  'LPUSH (needed to benchmark LRANGE)', 'LRANGE_100 (first 100 elements)', 'MSET (10 keys)']

t.test('redis-benchmark runs every test without an error', { skip: tool === '' ? 'redis-benchmark is not installed (apt-get install redis-tools)' : false, timeout: 240_000 }, async (t) => {
  const { child: server, port } = await startListening(t, main, ['--port', '0'])
  const bench = spawn(tool, ['-p', String(port), '-t', TESTS.join(','), '-n', '20000', '-q'], { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  bench.stdout.on('data', (d: Buffer) => { out += d.toString('latin1') })
  bench.stderr.on('data', (d: Buffer) => { out += d.toString('latin1') })
  const killer = setTimeout(() => { if (bench.pid !== undefined) process.kill(bench.pid, 'SIGKILL') }, 180_000)
  t.teardown(() => { clearTimeout(killer); if (bench.exitCode === null && bench.signalCode === null) bench.kill('SIGKILL') })
  const [code] = await once(bench, 'exit') as [number | null]
  clearTimeout(killer)
  // -q prints progress with carriage returns; the results end with newlines.
  const lines = out.split(/[\r\n]+/).map(l => l.trim()).filter(l => /requests per second/.test(l))
  t.equal(code, 0, 'redis-benchmark exits 0')
  t.same(lines.map(l => l.slice(0, l.indexOf(':'))), LINES, 'one result line per test, in order')
  t.notMatch(out, /error|ERR|WRONGTYPE/i, 'no error replies reported')
  server.kill('SIGTERM')
  const [exit] = await once(server, 'exit') as [number | null]
  t.equal(exit, 0, 'the example drains and exits 0 on SIGTERM')
})
