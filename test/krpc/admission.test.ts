// Connection admission: the default limit comes from the descriptor limit,
// and the connection idle longest (at least a second, quiet) makes room.
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { createInterface } from 'node:readline'
import { connect, type Socket } from 'node:net'
import { Client } from '../../reactor/krpc/client.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { MIN_EVICTABLE_IDLE_MS, defaultMaxConnections, longestIdle, parseOpenFilesLimit } from '../../reactor/admission.js'
import { RateLimitedLog } from '../../reactor/logger.js'

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 1048576              files
Max locked memory         8388608              8388608              bytes
`

t.test('the default limit is the soft descriptor limit less a reserve', async (t) => {
  t.equal(parseOpenFilesLimit(LIMITS), 1024)
  t.equal(defaultMaxConnections(LIMITS), 960, '1024 - 64')
  t.equal(defaultMaxConnections(LIMITS.replace('1024  ', '65536 ')), 65536 - 4096, 'a 1/16 reserve for large limits')
  t.equal(parseOpenFilesLimit(LIMITS.replace('1024  ', 'unlimited ')), undefined)
  t.equal(defaultMaxConnections(''), 10_000, 'no readable limit: the fallback')
})

t.test('a process under ulimit -n 256 derives 192', { skip: process.platform !== 'linux' }, async (t) => {
  const script = "import('./reactor/admission.ts').then(m => console.log(m.defaultMaxConnections()))"
  const result = spawnSync('bash', ['-c', `ulimit -n 256 && exec "${process.execPath}" ${process.execArgv.map(a => `'${a}'`).join(' ')} --input-type=module -e "${script}"`], { encoding: 'utf8', cwd: new URL('../..', import.meta.url).pathname })
  t.equal(result.stdout.trim(), '192', result.stderr)
})

t.test('longestIdle picks the quiet candidate idle longest, at least MIN_EVICTABLE_IDLE_MS', async (t) => {
  const now = 10_000
  const a = { quiet: true, idleSince: now - 5000 }
  const b = { quiet: true, idleSince: now - 8000 }
  const busy = { quiet: false, idleSince: now - 9000 }
  const fresh = { quiet: true, idleSince: now - MIN_EVICTABLE_IDLE_MS + 1 }
  t.equal(longestIdle([a, b, busy, fresh], now), b)
  t.equal(longestIdle([busy, fresh], now), null)
})

t.test('RateLimitedLog writes one line per interval and counts the rest', async (t) => {
  let now = 0
  const lines: string[] = []
  const log = new RateLimitedLog(1000, () => now)
  for (let i = 0; i < 5; i++) log.log((m) => lines.push(m), () => 'refused')
  now = 1000
  log.log((m) => lines.push(m), () => 'refused')
  t.same(lines, ['refused', 'refused (and 4 more like it since the last such line)'])
})

t.test('out of descriptors: counted and logged though libuv drops the connections unseen; served again once some close', { skip: process.platform !== 'linux' }, async (t) => {
  const root = new URL('../..', import.meta.url).pathname
  const loader = process.execArgv.map(a => `'${a}'`).join(' ')
  const child = spawn('bash', ['-c', `ulimit -n 64 && exec "${process.execPath}" ${loader} test/helpers/fd-limit-server.ts`], { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] })
  t.teardown(() => { child.kill('SIGKILL') })
  let stderr = ''
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
  const lines = createInterface({ input: child.stdout })
  const next = (): Promise<string> => new Promise((resolve) => lines.once('line', resolve))
  const port = Number(await next())
  const stats = async (): Promise<{ descriptorsExhausted: number, connectionsOpen: number }> => {
    const line = next()
    child.stdin.write('stats\n')
    return JSON.parse(await line)
  }
  const sockets: Socket[] = []
  for (let i = 0; i < 100; i++) {
    const s = connect({ host: '127.0.0.1', port })
    s.on('error', () => {})
    sockets.push(s)
  }
  let seen = 0
  for (let i = 0; i < 200 && seen === 0; i++) {
    seen = (await stats()).descriptorsExhausted
    if (seen === 0) await new Promise((resolve) => setTimeout(resolve, 10))
  }
  t.ok(seen >= 1, 'the scan saw the process at its descriptor limit')
  t.match(stderr, /out of file descriptors: \d+ of 64 open/, 'and logged it')
  for (const s of sockets) s.destroy()
  let open = -1
  for (let i = 0; i < 200 && open !== 0; i++) {
    open = (await stats()).connectionsOpen
    if (open !== 0) await new Promise((resolve) => setTimeout(resolve, 10))
  }
  const client = new Client({ endpoint: `127.0.0.1:${port}` })
  t.same(await client.service(CalculatorService).Add({ x: 2, y: 3 }, { timeoutMs: 5000 }), { result: 5 }, 'accepting goes on once descriptors are free')
  client.close()
  child.stdin.end()
  await new Promise((resolve) => child.once('exit', resolve))
})
