// The redis example's glob matcher (examples/redis/glob.ts) against
// redis-server's own stringmatchlen: the same patterns PSUBSCRIBEd on a
// real redis-server and on the example, the same channels PUBLISHed, and
// which patterns each channel reached compared with each other and with
// globMatch. The patterns are the edge cases (`?`, sets, negated sets,
// ranges, escapes, a trailing backslash, unclosed sets, stars in a row,
// Redis's 1000-star limit, bytes above 0x7f) and random ones over the
// characters that mean something.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { GlobPattern, globMatch } from '../../examples/redis/glob.js'
import { redisServer } from '../../examples/redis/main.js'
import { realRedis } from '../helpers/real-servers.js'
import { encodeCommand, parseReply, type RespReply } from '../helpers/resp.js'

const REDIS = '/usr/bin/redis-server'
const noRedis = existsSync(REDIS) ? false : `no ${REDIS} (apt-get install redis-server)`

/** A raw RESP connection: commands out, parsed replies in (bulks as latin1). */
class Raw {
  readonly socket: Socket
  #received = Buffer.alloc(0)
  #at = 0
  readonly replies: RespReply<string>[] = []
  #wake: (() => void) | null = null

  constructor (socket: Socket) {
    this.socket = socket
    socket.on('data', (chunk: Buffer) => {
      this.#received = Buffer.concat([this.#received.subarray(this.#at), chunk])
      this.#at = 0
      for (let r = parseReply(this.#received, 0, 'latin1'); r !== null; r = parseReply(this.#received, this.#at, 'latin1')) {
        this.replies.push(r[0])
        this.#at = r[1]
      }
      const wake = this.#wake
      this.#wake = null
      wake?.()
    })
    socket.on('error', () => {})
  }

  static async open (t: Test, port: number): Promise<Raw> {
    const socket = connect(port, '127.0.0.1')
    t.teardown(() => { socket.destroy() })
    await once(socket, 'connect')
    return new Raw(socket)
  }

  /** Waits until `n` replies have come (in all). */
  async until (n: number): Promise<RespReply<string>[]> {
    while (this.replies.length < n) await new Promise<void>((resolve) => { this.#wake = resolve })
    return this.replies
  }
}

const EDGE_PATTERNS = [
  '', '*', '**', '?', '??', '*?', '?*', '*?*', 'a', 'a*', '*a', '*a*', 'a*b', 'a*b*c', '*a*b', 'a**b', 'a*?b', '*[ab]*',
  '[a-c]', '[c-a]', '[^a]', '[^a-b]', '[]a]', '[\\]]', '[\\-]', '[a\\-c]', '[a-]', '[a-', '[', '[^', '[abc', '[a*b', 'x[', '[-a]',
  '\\*', '\\?', '\\[', 'a\\', '\\', '\\\\', '*\\', 'a\\*b', '[\\', '[a-\xff]', '[\xe9]', '\xe9*', '[^\x80-\xff]', '?\xe9',
  '*a*a*a*a*a*a*a*a*b', '*a*a*a*a*a*a*a*a*', 'a?c', '?b?', '*-*', '*]', ']*',
  '*a'.repeat(1000) + '*', '*a'.repeat(1001) + '*', '*a'.repeat(1000) + '*b', 'a' + '*'.repeat(2000) + 'a'
]
const EDGE_CHANNELS = [
  'a', 'b', 'ab', 'abc', 'aXbYc', 'ba', 'aab', 'a*', 'a?', 'a[', '*', '?', '[', ']', '-', '\\', 'a\\', 'a\\b', 'a*b', '^', '\xe9',
  '\xe9\xe9', 'x\xe9', '\x7f', '\x00', 'c', 'abb', 'acb', 'a-b', 'a'.repeat(100), 'a'.repeat(100) + 'b', 'a'.repeat(1001), 'a'.repeat(1000), 'aa'
]

/** A seeded generator (xorshift32): the same random patterns every run. */
function random (seed: number): () => number {
  let x = seed
  return () => {
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5
    return (x >>> 0) / 0x100000000
  }
}

function randomStrings (next: () => number, alphabet: string, count: number, maxLength: number, minLength: number): string[] {
  return Array.from({ length: count }, () => {
    let s = ''
    const length = minLength + Math.floor(next() * (maxLength - minLength + 1))
    for (let i = 0; i < length; i++) s += alphabet[Math.floor(next() * alphabet.length)]
    return s
  })
}

const next = random(0x9e3779b9)
const PATTERNS = [...new Set([...EDGE_PATTERNS, ...randomStrings(next, 'ab*?[]^-\\', 400, 8, 1)])]
const CHANNELS = [...new Set([...EDGE_CHANNELS, ...randomStrings(next, 'ab-]\\^[*', 200, 7, 1)])]

/** For each channel, the patterns whose PSUBSCRIBE received its PUBLISH, sorted. */
async function reached (t: Test, port: number): Promise<Map<string, string[]>> {
  const subscriber = await Raw.open(t, port)
  const publisher = await Raw.open(t, port)
  subscriber.socket.write(Buffer.concat(PATTERNS.map((pattern) => encodeCommand(['PSUBSCRIBE', pattern]))))
  await subscriber.until(PATTERNS.length)
  publisher.socket.write(Buffer.concat(CHANNELS.map((channel) => encodeCommand(['PUBLISH', channel, 'm']))))
  const counts = (await publisher.until(CHANNELS.length)) as number[]
  const total = counts.reduce((a, b) => a + b, 0)
  const messages = (await subscriber.until(PATTERNS.length + total)).slice(PATTERNS.length) as string[][]
  const out = new Map<string, string[]>(CHANNELS.map((channel) => [channel, []]))
  for (const [kind, pattern, channel] of messages) {
    if (kind === 'pmessage') out.get(channel!)!.push(pattern!)
  }
  for (const patterns of out.values()) patterns.sort()
  return out
}

function expected (): Map<string, string[]> {
  return new Map(CHANNELS.map((channel) => [channel, PATTERNS.filter((pattern) => globMatch(pattern, channel)).sort()]))
}

t.test('PSUBSCRIBE patterns reach the channels redis-server\'s stringmatchlen matches', { skip: noRedis, timeout: 120_000 }, async (t) => {
  const { port: realPort } = await realRedis(t, REDIS)
  const server = redisServer({ sweepIntervalMs: 0 })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const fromRedis = await reached(t, realPort)
  let matches = 0
  for (const patterns of fromRedis.values()) matches += patterns.length
  t.ok(matches > 500, `redis-server matched ${matches} (pattern, channel) pairs of ${PATTERNS.length} × ${CHANNELS.length}`)
  const want = expected()
  let differ = 0
  for (const channel of CHANNELS) {
    if (JSON.stringify(want.get(channel)) === JSON.stringify(fromRedis.get(channel))) continue
    differ++
    t.same(want.get(channel), fromRedis.get(channel), `globMatch against redis-server for channel ${JSON.stringify(channel)}`)
  }
  t.equal(differ, 0, 'globMatch answers as redis-server for every channel')
  t.same(await reached(t, port), fromRedis, 'the example\'s PSUBSCRIBE and PUBLISH as redis-server\'s')
})

t.test('the compiled matcher takes the hostile patterns in one pass', async (t) => {
  // Redis's backtracking takes seconds on these; here each is a suffix compare or an indexOf per segment.
  const channel = 'a'.repeat(100_000)
  t.equal(new GlobPattern('*' + 'a'.repeat(50_000) + 'b').matches(channel), false)
  t.equal(new GlobPattern('*' + 'a'.repeat(50_000)).matches(channel), true)
  t.equal(new GlobPattern('*' + 'a'.repeat(20_000) + '*' + 'a'.repeat(20_000) + '*b').matches(channel), false)
  t.equal(new GlobPattern('*a'.repeat(1000) + '*').matches(channel), true, '1000 star groups before the last: matches')
  t.equal(new GlobPattern('*a'.repeat(1001) + '*').matches(channel), false, 'past Redis\'s nesting limit: matches nothing')
  t.equal(new GlobPattern('*?a?*').matches('xaxy'), true, 'a segment with ? tried place by place')
  t.equal(new GlobPattern('*?a?*').matches('xxax'), true)
  t.equal(new GlobPattern('*?a?*').matches('axxa'), false)
  t.equal(new GlobPattern('a*').matches(''), false, 'an empty text matches only the empty pattern')
  t.equal(new GlobPattern('').matches(''), true)
  t.equal(new GlobPattern('*').matches(''), false)
  t.equal(new GlobPattern('HeLLo*', true).matches('hello world'), true, 'nocase')
  t.equal(new GlobPattern('[^H]ello', true).matches('hello'), false)
})

t.test('PUBLISH of a small and a large message (sent as slices, not copied) reaches channel and pattern subscribers whole', async (t) => {
  const server = redisServer({ sweepIntervalMs: 0 })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const subscriber = await Raw.open(t, port)
  const publisher = await Raw.open(t, port)
  subscriber.socket.write(encodeCommand(['SUBSCRIBE', 'news.1']))
  subscriber.socket.write(encodeCommand(['PSUBSCRIBE', 'news.*', 'n?ws.[0-9]', 'other*']))
  await subscriber.until(4)
  const large = 'x'.repeat(200_000)
  publisher.socket.write(Buffer.concat([encodeCommand(['PUBLISH', 'news.1', 'small']), encodeCommand(['PUBLISH', 'news.1', large])]))
  t.same(await publisher.until(2), [3, 3], 'the channel and two patterns, each time')
  const messages = (await subscriber.until(10)).slice(4)
  t.same(messages, [
    ['message', 'news.1', 'small'], ['pmessage', 'news.*', 'news.1', 'small'], ['pmessage', 'n?ws.[0-9]', 'news.1', 'small'],
    ['message', 'news.1', large], ['pmessage', 'news.*', 'news.1', large], ['pmessage', 'n?ws.[0-9]', 'news.1', large]
  ])
})
