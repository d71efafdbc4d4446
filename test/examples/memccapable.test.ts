// The judge of the memcached example is memcached's own conformance tool:
// `memccapable -b` (libmemcached-tools) against the example server, started
// as `npm run example:memcached` starts it (here from the sources). CI
// installs the tool; without it the test is skipped, saying so.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import { startListening } from '../helpers/listening-child.js'

const tool = spawnSync('sh', ['-c', 'command -v memccapable'], { encoding: 'utf8' }).stdout.trim()
const main = fileURLToPath(new URL('../../examples/memcached/main.ts', import.meta.url))

t.test('memccapable -b: All tests passed', { skip: tool === '' ? 'memccapable is not installed (apt-get install libmemcached-tools)' : false, timeout: 120_000 }, async (t) => {
  const { child: server, port } = await startListening(t, main, ['--port', '0'])
  const run = spawnSync(tool, ['-b', '-h', '127.0.0.1', '-p', String(port)], { encoding: 'utf8', timeout: 90_000 })
  const report = `${run.stdout}${run.stderr}`
  const results = [...report.matchAll(/^(binary \S+)\s+\[(\w+)\]/gm)].map(m => [m[1], m[2]])
  t.ok(results.length >= 25, `memccapable ran ${results.length} binary tests`)
  t.same(results.filter(([, verdict]) => verdict !== 'pass'), [], 'every test passes')
  t.match(report, /All tests passed/, report)
  t.equal(run.status, 0, 'memccapable exits 0')
  server.kill('SIGTERM')
  const [code] = await once(server, 'exit') as [number | null]
  t.equal(code, 0, 'the example drains and exits 0 on SIGTERM')
})
