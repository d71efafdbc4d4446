/**
 * Pattern matching, fan-out and the cost of a subscription: the redis
 * example beside a real redis-server, in the same run, the order flipped
 * every round (the machine's speed drifts; only runs close in time
 * compare):
 *
 *   npx tsc -p tsconfig.json && node dist/bench/redis-patterns.js [--rounds 3] [--patterns 100000] [--channels 100000] [--hostile-rounds 1] [--hostile-length 100000] [--subscribers 2000] [--example dist/examples/redis/main.js]
 *
 * Scenarios, each timed from the bench's side of a raw socket:
 * - hostile: one connection PSUBSCRIBEs `*` + 50 000 `a` + `b`, another
 *   PUBLISHes to a channel of 100 000 `a`s (`--hostile-length`; the
 *   pattern has half as many): the time to PUBLISH's reply
 *   (stringmatchlen backtracks there; the server does nothing else meanwhile);
 * - fan-out: one connection PSUBSCRIBEs `--patterns` distinct patterns that
 *   all match the channel (each of its first 9 bytes written as itself,
 *   `?`, `[x]` or `\x`, then `*`), another PUBLISHes to it 5 times: the
 *   median time to PUBLISH's reply, the subscriber reading everything;
 * - channel fan-out: `--subscribers` connections SUBSCRIBE one channel,
 *   another PUBLISHes to it 5 times: the median time to PUBLISH's reply,
 *   every subscriber reading everything;
 * - the memory of a subscription: what `--patterns` PSUBSCRIBEs and
 *   `--channels` SUBSCRIBEs (distinct channels, one connection) add, per
 *   subscription: redis-server's `used_memory` (INFO), the example's V8
 *   heap and external memory after a full GC (also after the fan-out:
 *   nothing a PUBLISH made should stay), and
 *   both RSS (RSS is coarse: freed memory stays with the process, so the
 *   channels are measured first).
 *
 * The example runs in a child of this script (`--serve MODULE` imports
 * `MODULE`'s `redisServer`, with `--expose-gc`), so `--example` may name an
 * older build's main.js to measure before a change. It prints, per round,
 * both figures and their ratio (example / redis), then the medians.
 * Bounded in time by `--max-minutes`; every process it starts is killed by
 * PID at the end, also on error or interruption.
 */
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { HOST, freePort, median, portProbe, startNode, startProcess, stopAll } from './processes.js'

const SELF = fileURLToPath(import.meta.url)
const DEFAULT_EXAMPLE = fileURLToPath(new URL('../examples/redis/main.js', import.meta.url))
const CHANNEL = 'abcdefghijklmnop'
const PUBLISHES = 5
const BATCH = 1000

/** Each of the channel's first 9 bytes written as itself, `?`, `[x]` or `\x`, then `*`: 4^9 distinct patterns that all match it. */
function patternOf (i: number): string {
  let out = ''
  for (let k = 0; k < 9; k++) {
    const c = CHANNEL[k]!
    const variant = (i >> (2 * k)) & 3
    out += variant === 0 ? c : variant === 1 ? '?' : variant === 2 ? `[${c}]` : `\\${c}`
  }
  return out + '*'
}

function encode (args: string[]): Buffer {
  let out = `*${args.length}\r\n`
  for (const a of args) out += `$${Buffer.byteLength(a, 'latin1')}\r\n${a}\r\n`
  return Buffer.from(out, 'latin1')
}

/** Where the RESP reply at `at` ends, or -1 when it is not all there. */
function replyEnd (buf: Buffer, at: number): number {
  if (at >= buf.length) return -1
  const cr = buf.indexOf('\r\n', at)
  if (cr < 0) return -1
  const n = Number(buf.toString('latin1', at + 1, cr))
  switch (buf[at]) {
    case 0x24: return n < 0 ? cr + 2 : buf.length >= cr + 4 + n ? cr + 4 + n : -1
    case 0x2a: {
      let p = cr + 2
      for (let i = 0; i < n; i++) {
        p = replyEnd(buf, p)
        if (p < 0) return -1
      }
      return p
    }
    default: return cr + 2
  }
}

/** A raw RESP connection that counts whole replies, keeping the last one's bytes. */
class Conn {
  readonly socket: Socket
  replies = 0
  last: Buffer = Buffer.alloc(0)
  #pending: Buffer = Buffer.alloc(0)
  #wake: (() => void) | null = null

  constructor (socket: Socket) {
    this.socket = socket
    socket.on('data', (chunk: Buffer) => {
      const buf = this.#pending.length === 0 ? chunk : Buffer.concat([this.#pending, chunk])
      let at = 0
      for (let end = replyEnd(buf, 0); end >= 0; end = replyEnd(buf, at)) {
        this.replies++
        if (end - at < 4096) this.last = buf.subarray(at, end)
        at = end
      }
      this.#pending = buf.subarray(at)
      this.#notify()
    })
    socket.on('close', () => { this.#notify() })
    socket.on('error', () => {})
  }

  #notify (): void {
    const wake = this.#wake
    this.#wake = null
    wake?.()
  }

  static async open (port: number): Promise<Conn> {
    const socket = connect(port, HOST)
    socket.setNoDelay(true)
    await once(socket, 'connect')
    return new Conn(socket)
  }

  async until (replies: number): Promise<void> {
    while (this.replies < replies) {
      if (this.socket.destroyed || this.socket.readyState === 'closed') throw new Error(`the server closed the connection after ${this.replies} of ${replies} replies`)
      await new Promise<void>((resolve) => { this.#wake = resolve })
    }
  }

  async call (args: string[]): Promise<Buffer> {
    const want = this.replies + 1
    this.socket.write(encode(args))
    await this.until(want)
    return this.last
  }

  close (): void {
    this.socket.destroy()
  }
}

interface Server { name: 'redis' | 'example', port: number, child: ChildProcess, memory: () => Promise<{ bytes: number, rss: number }> }

function rssOf (pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'latin1'))
  return m === null ? 0 : Number(m[1]) * 1024
}

async function startRedis (): Promise<Server> {
  const port = await freePort()
  const child = await startProcess('redis-server', ['--save', '', '--appendonly', 'no', '--bind', HOST, '--port', String(port)], portProbe(port))
  const admin = await Conn.open(port)
  return {
    name: 'redis',
    port,
    child,
    memory: async () => {
      const info = (await admin.call(['INFO', 'memory'])).toString('latin1')
      return { bytes: Number(/used_memory:(\d+)/.exec(info)![1]), rss: rssOf(child.pid!) }
    }
  }
}

async function startExample (module: string): Promise<Server> {
  const { child, port } = await startNode(['--expose-gc', SELF, '--serve', module])
  let lines = ''
  child.stdout!.on('data', (d: Buffer) => { lines += d.toString() })
  return {
    name: 'example',
    port,
    child,
    memory: async () => {
      const before = lines.length
      child.kill('SIGUSR2')
      for (let i = 0; i < 500 && !lines.slice(before).includes('\n'); i++) await new Promise((resolve) => setTimeout(resolve, 10))
      const m = /memory (\d+) (\d+)/.exec(lines.slice(before))
      if (m === null) throw new Error('the example did not report its memory')
      return { bytes: Number(m[1]), rss: Number(m[2]) }
    }
  }
}

/** The time PUBLISH takes to answer, with one connection subscribed to the hostile pattern. */
async function hostile (server: Server, channelLength: number): Promise<number> {
  const sub = await Conn.open(server.port)
  const pub = await Conn.open(server.port)
  await sub.call(['PSUBSCRIBE', '*' + 'a'.repeat(channelLength / 2) + 'b'])
  const start = performance.now()
  const reply = await pub.call(['PUBLISH', 'a'.repeat(channelLength), 'm'])
  const ms = performance.now() - start
  if (reply.toString('latin1') !== ':0\r\n') throw new Error(`hostile PUBLISH answered ${reply.toString('latin1')}`)
  sub.close()
  pub.close()
  return ms
}

/** Subscribes `names` on `conn` with `command`, BATCH a command; resolves once every confirmation came. */
async function subscribeAll (conn: Conn, command: string, names: string[]): Promise<void> {
  const want = conn.replies + names.length
  for (let i = 0; i < names.length; i += BATCH) {
    if (!conn.socket.write(encode([command, ...names.slice(i, i + BATCH)]))) await once(conn.socket, 'drain')
  }
  await conn.until(want)
}

async function settledMemory (server: Server): Promise<{ bytes: number, rss: number }> {
  await new Promise((resolve) => setTimeout(resolve, 300))
  return server.memory()
}

interface RoundResult { hostileMs?: number, fanoutMs: number, channelFanoutMs: number, patternBytes: number, patternRss: number, patternBytesAfterFanout: number, channelBytes: number, channelRss: number }

/** Waits until the server has no pattern and no subscriber of `channel` left (the closed connections' subscriptions are gone). */
async function drained (server: Server, channel: string): Promise<void> {
  const admin = await Conn.open(server.port)
  for (let i = 0; i < 1000; i++) {
    const numpat = (await admin.call(['PUBSUB', 'NUMPAT'])).toString('latin1')
    const numsub = (await admin.call(['PUBSUB', 'NUMSUB', channel])).toString('latin1')
    if (numpat === ':0\r\n' && numsub.endsWith(':0\r\n')) break
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  admin.close()
}

/** The median time PUBLISH takes to answer with `subscribers` connections subscribed to its channel, each reading every message. */
async function channelFanout (server: Server, subscribers: number): Promise<number> {
  const subs: Conn[] = []
  try {
    for (let i = 0; i < subscribers; i++) subs.push(await Conn.open(server.port))
    for (const sub of subs) sub.socket.write(encode(['SUBSCRIBE', 'fan']))
    for (const sub of subs) await sub.until(1)
    const pub = await Conn.open(server.port)
    const times: number[] = []
    for (let i = 0; i < PUBLISHES; i++) {
      const start = performance.now()
      const reply = await pub.call(['PUBLISH', 'fan', 'hello'])
      times.push(performance.now() - start)
      if (reply.toString('latin1') !== `:${subscribers}\r\n`) throw new Error(`PUBLISH answered ${reply.toString('latin1')}`)
      for (const sub of subs) await sub.until(i + 2)
    }
    pub.close()
    return median(times)
  } finally {
    for (const sub of subs) sub.close()
  }
}

async function round (server: Server, patterns: string[], channels: string[], hostileLength: number, subscribers: number): Promise<RoundResult> {
  const result: Partial<RoundResult> = {}
  if (hostileLength > 0) result.hostileMs = await hostile(server, hostileLength)
  result.channelFanoutMs = await channelFanout(server, subscribers)
  // Channels, on a connection of their own.
  await drained(server, channels[0]!)
  const base = await settledMemory(server)
  const chan = await Conn.open(server.port)
  await subscribeAll(chan, 'SUBSCRIBE', channels)
  const withChannels = await settledMemory(server)
  result.channelBytes = (withChannels.bytes - base.bytes) / channels.length
  result.channelRss = (withChannels.rss - base.rss) / channels.length
  chan.close()
  // Patterns: memory, then fan-out.
  await drained(server, channels[0]!)
  const base2 = await settledMemory(server)
  const sub = await Conn.open(server.port)
  await subscribeAll(sub, 'PSUBSCRIBE', patterns)
  const withPatterns = await settledMemory(server)
  result.patternBytes = (withPatterns.bytes - base2.bytes) / patterns.length
  result.patternRss = (withPatterns.rss - base2.rss) / patterns.length
  const pub = await Conn.open(server.port)
  const times: number[] = []
  for (let i = 0; i < PUBLISHES; i++) {
    const want = sub.replies + patterns.length
    const start = performance.now()
    const reply = await pub.call(['PUBLISH', CHANNEL, 'hello'])
    times.push(performance.now() - start)
    if (reply.toString('latin1') !== `:${patterns.length}\r\n`) throw new Error(`PUBLISH answered ${reply.toString('latin1')}`)
    await sub.until(want)
  }
  result.fanoutMs = median(times)
  const afterFanout = await settledMemory(server)
  result.patternBytesAfterFanout = (afterFanout.bytes - base2.bytes) / patterns.length
  sub.close()
  pub.close()
  await drained(server, channels[0]!)
  return result as RoundResult
}

async function serve (module: string): Promise<void> {
  const { redisServer } = await import(pathToFileURL(module).href) as typeof import('../examples/redis/main.js')
  const server = redisServer()
  const address = await server.listen(0, HOST)
  // SIGUSR2: a full GC, then the V8 heap and external memory in use, and RSS.
  process.on('SIGUSR2', () => {
    (globalThis as { gc?: () => void }).gc?.()
    const m = process.memoryUsage()
    process.stdout.write(`memory ${m.heapUsed + m.external} ${m.rss}\n`)
  })
  console.log(`listening on ${address.address}:${address.port}`)
  process.once('SIGTERM', () => { void server.close({ graceMs: 100 }).then(() => process.exit(0)) })
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      patterns: { type: 'string', default: '100000' },
      channels: { type: 'string', default: '100000' },
      'hostile-rounds': { type: 'string', default: '1' },
      'hostile-length': { type: 'string', default: '100000' },
      example: { type: 'string', default: DEFAULT_EXAMPLE },
      'max-minutes': { type: 'string', default: '30' },
      subscribers: { type: 'string', default: '2000' },
      serve: { type: 'string' }
    },
    strict: true
  })
  if (values.serve !== undefined) return serve(values.serve)
  const rounds = Number(values.rounds)
  const patternCount = Number(values.patterns)
  const channelCount = Number(values.channels)
  const hostileRounds = Number(values['hostile-rounds'])
  const hostileLength = Number(values['hostile-length'])
  const maxMinutes = Number(values['max-minutes'])
  const subscribers = Number(values.subscribers)
  if (![rounds, patternCount, channelCount, maxMinutes, subscribers].every((n) => Number.isInteger(n) && n >= 1) || !Number.isInteger(hostileRounds) || hostileRounds < 0 || !Number.isInteger(hostileLength) || hostileLength < 2 || hostileLength % 2 !== 0 || patternCount > 4 ** 9) {
    throw new RangeError('--rounds, --patterns (at most 262144), --channels, --subscribers and --max-minutes take positive integers, --hostile-rounds a non-negative one, --hostile-length an even one')
  }
  process.once('SIGTERM', () => { void stopAll().then(() => process.exit(143)) })
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  try {
    const redis = await startRedis()
    const example = await startExample(values.example)
    const patterns = Array.from({ length: patternCount }, (_, i) => patternOf(i))
    const channels = Array.from({ length: channelCount }, (_, i) => `channel:${i}`)
    console.log(`example ${values.example}; ${patternCount} patterns, ${channelCount} channels, ${subscribers} subscribers of one channel, ${rounds} rounds (${hostileRounds} with the hostile pattern, channel of ${hostileLength} a); ratio = example / redis`)
    const ratios = new Map<string, number[]>()
    const add = (key: string, r: number, e: number): string => {
      ratios.set(key, [...(ratios.get(key) ?? []), e / r])
      return `${key} redis ${r.toFixed(1)} example ${e.toFixed(1)} ratio ${(e / r).toFixed(2)}`
    }
    for (let i = 0; i < rounds; i++) {
      const order = i % 2 === 0 ? [redis, example] : [example, redis]
      const results: Partial<Record<'redis' | 'example', RoundResult>> = {}
      for (const server of order) results[server.name] = await round(server, patterns, channels, i < hostileRounds ? hostileLength : 0, subscribers)
      const r = results.redis!
      const e = results.example!
      const lines = [
        add('fan-out ms', r.fanoutMs, e.fanoutMs),
        add(`channel fan-out to ${subscribers} subscribers ms`, r.channelFanoutMs, e.channelFanoutMs),
        add('pattern B (used_memory | heap)', r.patternBytes, e.patternBytes),
        add('pattern B RSS', r.patternRss, e.patternRss),
        add('pattern B after the fan-out (used_memory | heap)', r.patternBytesAfterFanout, e.patternBytesAfterFanout),
        add('channel B (used_memory | heap)', r.channelBytes, e.channelBytes),
        add('channel B RSS', r.channelRss, e.channelRss)
      ]
      if (r.hostileMs !== undefined) lines.unshift(add('hostile PUBLISH ms', r.hostileMs, e.hostileMs!))
      console.log(`round ${i + 1}${order[0] === example ? ' (example first)' : ''}:\n  ${lines.join('\n  ')}`)
    }
    for (const [key, values] of ratios) console.log(`${key}: median ratio ${median(values).toFixed(2)} over ${values.length} rounds`)
  } finally {
    clearTimeout(deadline)
    await stopAll()
  }
}

process.once('SIGINT', () => { void stopAll().then(() => process.exit(130)) })

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err)
  process.exitCode = 1
})
