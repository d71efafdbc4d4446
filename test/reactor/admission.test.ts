// Connection admission: the default limit comes from the descriptor limit,
// and the connection idle longest (at least a second, quiet) makes room.
import t from 'tap'
import { spawnSync } from 'node:child_process'
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
