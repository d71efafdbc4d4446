// The judge of the memcached example is memcached's own conformance tool:
// `memccapable -b` (libmemcached-tools) against the example server, started
// as `npm run example:memcached` starts it (here from the sources). CI
// installs the tool; without it the test is skipped, saying so.
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'

const tool = spawnSync('sh', ['-c', 'command -v memccapable'], { encoding: 'utf8' }).stdout.trim()
const main = fileURLToPath(new URL('../../examples/memcached/main.ts', import.meta.url))

t.test('memccapable -b: All tests passed', { skip: tool === '' ? 'memccapable is not installed (apt-get install libmemcached-tools)' : false, timeout: 120_000 }, async (t) => {
  const loader = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))
  const server = spawn(process.execPath, [...loader, main, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] })
  t.teardown(() => { if (server.exitCode === null && server.signalCode === null) server.kill('SIGKILL') })
  let out = ''
  let err = ''
  server.stderr!.on('data', (d: Buffer) => { err += d.toString() })
  const port = await new Promise<number>((resolve, reject) => {
    server.stdout!.on('data', (d: Buffer) => {
      out += d.toString()
      const m = /listening on 127\.0\.0\.1:(\d+)/.exec(out)
      if (m !== null) resolve(Number(m[1]))
    })
    server.once('exit', (code) => reject(new Error(`the example exited (${code}): ${err}`)))
  })
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
