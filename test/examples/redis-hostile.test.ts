/**
 * The redis example against hostile and heavy input: glob patterns built to
 * backtrack (Redis's CVE-2022-36021), sorted sets filled in the worst order,
 * SPOP of many members, pipelines far deeper than one read, oversized
 * arguments in error messages, frames of many empty arguments. Where Redis
 * has an answer, a real redis-server (when installed) is the judge: the same
 * commands go to both and the answers must be the same. Nothing here asserts
 * a duration: work that would take hours simply never returns, and the
 * test's timeout fails it.
 */
import t, { type Test } from 'tap'
import fc from 'fast-check'
import { spawn, spawnSync } from 'node:child_process'
import { connect, createServer, type Socket } from 'node:net'
import { redisServer, type RedisServerOptions } from '../../examples/redis/main.js'
import { globMatch } from '../../examples/redis/handlers.js'

const which = (tool: string): string => spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim()
const REDIS_SERVER = which('redis-server')
const REDIS_CLI = which('redis-cli')
const noRedis = REDIS_SERVER === '' ? 'redis-server is not installed (apt-get install redis-server)' : false

const encode = (args: (string | Buffer)[]): Buffer => Buffer.concat([
  Buffer.from(`*${args.length}\r\n`, 'latin1'),
  ...args.flatMap(a => {
    const b = typeof a === 'string' ? Buffer.from(a, 'latin1') : a
    return [Buffer.from(`$${b.length}\r\n`, 'latin1'), b, Buffer.from('\r\n', 'latin1')]
  })
])

type Parsed = string | number | null | Parsed[] | { error: string }

/** One RESP reply at `at` (bulks as latin1 strings), or null when cut short. */
function parseReply (buf: Buffer, at: number): [Parsed, number] | null {
  if (at >= buf.length) return null
  const cr = buf.indexOf('\r\n', at)
  if (cr < 0) return null
  const line = buf.toString('latin1', at + 1, cr)
  const next = cr + 2
  switch (buf[at]) {
    case 0x2b: return [line, next]
    case 0x2d: return [{ error: line }, next]
    case 0x3a: return [Number(line), next]
    case 0x24: {
      const n = Number(line)
      if (n < 0) return [null, next]
      if (buf.length < next + n + 2) return null
      return [buf.toString('latin1', next, next + n), next + n + 2]
    }
    case 0x2a: {
      const n = Number(line)
      if (n < 0) return [null, next]
      const items: Parsed[] = []
      let p = next
      for (let i = 0; i < n; i++) {
        const r = parseReply(buf, p)
        if (r === null) return null
        items.push(r[0])
        p = r[1]
      }
      return [items, p]
    }
    default: throw new Error(`not a RESP reply at ${at}: ${JSON.stringify(buf.toString('latin1', at, at + 20))}`)
  }
}

/** A pipelining client: `send` writes bytes and resolves with the next `n` replies. */
class Client {
  readonly socket: Socket
  #received: Buffer = Buffer.alloc(0)
  #closed = false
  #wanted: { n: number, resolve: (r: Parsed[]) => void, reject: (e: Error) => void } | null = null
  constructor (port: number) {
    this.socket = connect(port, '127.0.0.1')
    this.socket.setNoDelay(true)
    this.socket.on('error', () => {})
    this.socket.on('data', (d: Buffer) => { this.#received = this.#received.length === 0 ? d : Buffer.concat([this.#received, d]); this.#check() })
    this.socket.on('close', () => { this.#closed = true; this.#check() })
  }

  #check (): void {
    const w = this.#wanted
    if (w === null) return
    const out: Parsed[] = []
    let p = 0
    while (out.length < w.n) {
      const r = parseReply(this.#received, p)
      if (r === null) break
      out.push(r[0])
      p = r[1]
    }
    if (out.length === w.n) {
      this.#received = this.#received.subarray(p)
      this.#wanted = null
      w.resolve(out)
    } else if (this.#closed) {
      this.#wanted = null
      w.reject(new Error(`closed after ${out.length} of ${w.n} replies`))
    }
  }

  async send (bytes: Buffer, n: number): Promise<Parsed[]> {
    const replies = new Promise<Parsed[]>((resolve, reject) => { this.#wanted = { n, resolve, reject } })
    this.socket.write(bytes)
    this.#check()
    return await replies
  }

  async call (...args: (string | Buffer)[]): Promise<Parsed> {
    return (await this.send(encode(args), 1))[0]!
  }

  get closed (): boolean {
    return this.#closed
  }

  destroy (): void {
    this.socket.destroy()
  }
}

async function serve (t: Test, options: RedisServerOptions = {}): Promise<{ port: number, client: () => Client, server: ReturnType<typeof redisServer> }> {
  const server = redisServer({ sweepIntervalMs: 0, ...options })
  const { port } = await server.listen(0, '127.0.0.1')
  const clients: Client[] = []
  t.teardown(async () => {
    for (const c of clients) c.destroy()
    await server.close({ graceMs: 100 })
  })
  return { port, server, client: () => { const c = new Client(port); clients.push(c); return c } }
}

function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer()
    probe.once('error', reject)
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number }
      probe.close(() => resolve(port))
    })
  })
}

/** A real redis-server on a free loopback port, stopped (by its PID) at the test's end. */
async function realRedis (t: Test): Promise<{ port: number, client: () => Client }> {
  const port = await freePort()
  const child = spawn(REDIS_SERVER, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--databases', '1'], { stdio: 'ignore' })
  const clients: Client[] = []
  t.teardown(() => {
    for (const c of clients) c.destroy()
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
  for (let i = 0; ; i++) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect(port, '127.0.0.1')
      s.once('connect', () => { s.destroy(); resolve(true) })
      s.once('error', () => resolve(false))
    })
    if (ok) break
    if (i > 100) throw new Error(`redis-server never listened on ${port}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  return { port, client: () => { const c = new Client(port); clients.push(c); return c } }
}

const sorted = (reply: Parsed): Parsed => Array.isArray(reply) ? [...reply].sort() : reply

// ---------------------------------------------------------------------------
// 1. Glob patterns.

// [pattern, text, nocase, Redis's answer]: Redis's stringmatchlen, quirks included.
const GLOB_TABLE: [string, string, boolean, boolean][] = [
  ['', '', false, true], ['', 'a', false, false], ['*', 'anything', false, true], ['**', 'a', false, true],
  ['*', '', false, false], ['**', '', false, false], ['?', '', false, false], // an empty text matches only an empty pattern
  ['h?llo', 'hello', false, true], ['h?llo', 'hllo', false, false], ['h*llo', 'hllo', false, true], ['h*llo', 'heeeello', false, true],
  ['h[ae]llo', 'hallo', false, true], ['h[ae]llo', 'hillo', false, false], ['h[^e]llo', 'hello', false, false], ['h[^e]llo', 'hallo', false, true],
  ['h[a-b]llo', 'hbllo', false, true], ['h[b-a]llo', 'hallo', false, true], ['h[a-b]llo', 'hcllo', false, false],
  ['a\\*', 'a*', false, true], ['a\\*', 'ab', false, false], ['a\\', 'a\\', false, true], ['\\a', 'a', false, true],
  ['[\\]]', ']', false, true], ['[\\-]', '-', false, true], ['[a\\-z]', 'b', false, false], ['[]a]', 'a', false, false],
  ['[abc', 'b', false, true], ['[abc', 'bc', false, false], ['[', 'a', false, false], ['[^', 'x', false, true], ['[a-', '-', false, true],
  ['[a-]', ']', false, true], ['[a-]', '_', false, true], ['[a-]b', 'ab', false, false],
  ['*a', 'ba', false, true], ['*a', 'ab', false, false], ['a*', 'a', false, true], ['a*b*c', 'aXbYc', false, true], ['a*b*c', 'aXbY', false, false],
  ['*?*', 'x', false, true], ['*??', 'x', false, false], ['a*?', 'a', false, false], ['*[0-9]', 'key9', false, true],
  ['HELLO', 'hello', true, true], ['h[A-Z]llo', 'hello', true, true], ['h[^E]llo', 'hello', true, false], ['[\\E]', 'e', true, false],
  ['MAX*', 'maxmemory', true, true], ['\\M', 'm', true, true],
  ['*a*a*a*a*a*a*a*a*b', 'a'.repeat(100), false, false], ['*a*a*a*a*a*a*a*a*b', 'a'.repeat(100) + 'b', false, true]
]

t.test('globMatch answers as Redis\'s stringmatchlen does', async (t) => {
  for (const [pattern, text, nocase, expected] of GLOB_TABLE) {
    t.equal(globMatch(pattern, text, nocase), expected, `${JSON.stringify(pattern)} ${JSON.stringify(text)}${nocase ? ' nocase' : ''}`)
  }
})

t.test('KEYS with a backtracking pattern returns, with redis-server\'s answer', { timeout: 60_000 }, async (t) => {
  const { client } = await serve(t)
  const c = client()
  const long = 'a'.repeat(1000)
  t.equal(await c.call('SET', long, 'v'), 'OK')
  t.same(await c.call('KEYS', '*a*a*a*a*a*a*a*a*b'), [], 'the CVE-2022-36021 pattern finishes: no match')
  t.same(await c.call('KEYS', '*a*a*a*a*a*a*a*a*'), [long], 'and its matching cousin matches')
  // Direct calls, far beyond what a frame could carry in one KEYS.
  t.equal(globMatch('*a'.repeat(20_000) + '*b', 'a'.repeat(40_000)), false, 'a long starred pattern neither recurses nor backtracks exponentially')
  t.equal(globMatch('?'.repeat(100_000), 'x'.repeat(100_000)), true, 'a long pattern of ?')
})

t.test('KEYS answers as redis-server does', { skip: noRedis, timeout: 60_000 }, async (t) => {
  const { client } = await serve(t)
  const real = await realRedis(t)
  const mine = client()
  const theirs = real.client()
  const keys = ['', 'hello', 'hallo', 'hxllo', 'hllo', 'heeeello', 'a*', 'ab', 'a\\', '-', ']', '_', 'b', 'bc', 'key9', 'x', '^',
    'a'.repeat(100), 'a'.repeat(100) + 'b', 'a'.repeat(1000), 'A', 'Hello', '\xff', '\x80a', 'a\xe9b', 'a'.repeat(2000) + 'b']
  for (const key of keys) {
    t.equal(await mine.call('SET', key, 'v'), 'OK')
    t.equal(await theirs.call('SET', key, 'v'), 'OK')
  }
  const patterns = [...new Set(GLOB_TABLE.map(([p]) => p)), 'h[^a-e]llo', '*\\\\', '[\\\\]', '[^]', '[a-\xff]', '[\xff-a]', '\xff*', '*\xe9*',
    '[!-~]*', '*[', '[*]', '\\', '*a*a*a*a*a*a*a*a*b', '*a*a*a*a*a*a*a*a*', '*b',
    // Redis gives up past 1000 nested stars (its guard against abusive patterns): 1000 still match, 1001 do not.
    '*a'.repeat(1000), '*a'.repeat(1001), '*a'.repeat(1000) + '*', '*a'.repeat(1001) + '*', 'a*'.repeat(1001), '*a'.repeat(999) + '*b']
  for (const pattern of patterns) {
    const expected = sorted(await theirs.call('KEYS', pattern))
    t.same(sorted(await mine.call('KEYS', pattern)), expected, `KEYS ${JSON.stringify(pattern.length > 40 ? pattern.slice(0, 20) + `… (${pattern.length})` : pattern)}`)
  }
  // CONFIG GET's names match without case, as Redis's do (a name without glob characters comes back as it was asked).
  for (const pattern of ['APPENDONLY', 'appendONLY', 'SAV?', 'da[a-z]abases', 'DA[^x]ABASE?', 'TimeOut', '[t]imeout']) {
    t.same(sorted(await mine.call('CONFIG', 'GET', pattern)), sorted(await theirs.call('CONFIG', 'GET', pattern)), `CONFIG GET ${pattern}`)
  }
})
