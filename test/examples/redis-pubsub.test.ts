// Redis Pub/Sub in the redis example (examples/redis/pubsub.ts, subscription.ts):
// the same script against a real redis-server and against the example, over
// raw sockets, byte for byte (confirmations, messages, pmessages, PUBLISH
// counts, PUBSUB, the subscribed-mode rules, RESET, QUIT, a subscriber's
// disconnect); RedisClient's subscriptions on both; and, on the example only,
// a subscriber that does not read closed by the output limit while the others
// go on receiving.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { RpcError } from '../../codec/errors.js'
import { RedisClient, type SubscriptionMessage } from '../../examples/redis/client.js'
import { parseMemory, redisServer, takePubsubLimit } from '../../examples/redis/main.js'
import { PubSub } from '../../examples/redis/pubsub.js'
import type { Subscriptions } from '../../examples/redis/subscriptions.js'
import { ConnectionState } from '../../examples/redis/resp.js'
import type { ConnectionHandle } from '../../reactor/index.js'
import { startListening } from '../helpers/listening-child.js'
import { freePort, realRedis } from '../helpers/real-servers.js'
import { encodeCommand, parseReply, type RespReply } from '../helpers/resp.js'

const REDIS = '/usr/bin/redis-server'
const noRedis = existsSync(REDIS) ? false : `no ${REDIS} (apt-get install redis-server)`
const MAIN = fileURLToPath(new URL('../../examples/redis/main.ts', import.meta.url))

/** A raw client socket: commands out, whole replies in, as their wire bytes (latin1). Waits on 'data', never on a timer. */
class RawPeer {
  readonly socket: Socket
  closed = false
  #received = Buffer.alloc(0)
  #at = 0
  #wake: (() => void) | null = null

  constructor (socket: Socket) {
    this.socket = socket
    socket.on('data', (chunk: Buffer) => { this.#received = Buffer.concat([this.#received, chunk]); this.#notify() })
    socket.on('close', () => { this.closed = true; this.#notify() })
    socket.on('error', () => {})
  }

  static async open (t: Test, port: number): Promise<RawPeer> {
    const socket = connect(port, '127.0.0.1')
    t.teardown(() => { socket.destroy() })
    await once(socket, 'connect')
    return new RawPeer(socket)
  }

  send (...args: string[]): void {
    this.socket.write(encodeCommand(args))
  }

  /** The next `n` replies, each as its bytes. */
  async frames (n: number): Promise<string[]> {
    const out: string[] = []
    while (out.length < n) {
      const parsed = this.#at < this.#received.length ? parseReply(this.#received, this.#at) : null
      if (parsed !== null) {
        out.push(this.#received.toString('latin1', this.#at, parsed[1]))
        this.#at = parsed[1]
        continue
      }
      if (this.closed) throw new Error(`closed after ${out.length} of ${n} replies`)
      await new Promise<void>((resolve) => { this.#wake = resolve })
    }
    return out
  }

  async call (...args: string[]): Promise<string> {
    this.send(...args)
    return (await this.frames(1))[0]!
  }

  /** Resolves once the server has closed the connection. */
  async whenClosed (): Promise<void> {
    while (!this.closed) await new Promise<void>((resolve) => { this.#wake = resolve })
  }

  #notify (): void {
    const wake = this.#wake
    this.#wake = null
    wake?.()
  }
}

/** A reply's expected bytes: strings as bulks, numbers as integers, null as the nil bulk, arrays of them. */
function resp (value: string | number | null | (string | number | null)[]): string {
  if (value === null) return '$-1\r\n'
  if (typeof value === 'number') return `:${value}\r\n`
  if (typeof value === 'string') return `$${Buffer.byteLength(value, 'latin1')}\r\n${value}\r\n`
  return `*${value.length}\r\n${value.map(resp).join('')}`
}

function parsed (frame: string): RespReply<string> {
  return parseReply(Buffer.from(frame, 'latin1'), 0, 'latin1')![0]
}

const refused = (name: string): string =>
  `-ERR Can't execute '${name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n`

/** Polls (request round trips, 2 ms apart, 1,000 at most) until `ask` answers `want`; the last answer. */
async function until (ask: () => Promise<string>, want: string): Promise<string> {
  let answer = await ask()
  for (let i = 0; i < 1000 && answer !== want; i++) {
    await new Promise((resolve) => setTimeout(resolve, 2))
    answer = await ask()
  }
  return answer
}

/**
 * The raw script: asserts Redis's bytes on the server at `port`, and
 * returns what it saw (frames whose order Redis leaves open sorted), to be
 * compared between the two servers.
 */
async function rawScript (t: Test, port: number): Promise<Record<string, unknown>> {
  const r: Record<string, unknown> = {}
  const [a, b, c, p] = await Promise.all([RawPeer.open(t, port), RawPeer.open(t, port), RawPeer.open(t, port), RawPeer.open(t, port)])

  // Confirmations: one per argument, with the connection's count (channels and patterns).
  a.send('SUBSCRIBE', 'news', 'x', 'news')
  r['a subscribe'] = await a.frames(3)
  t.same(r['a subscribe'], [resp(['subscribe', 'news', 1]), resp(['subscribe', 'x', 2]), resp(['subscribe', 'news', 2])], 'SUBSCRIBE news x news')
  r['b psubscribe'] = await b.call('PSUBSCRIBE', 'n*')
  t.equal(r['b psubscribe'], resp(['psubscribe', 'n*', 1]))
  c.send('SUBSCRIBE', 'news')
  c.send('PSUBSCRIBE', 'n*', '[nm]ews')
  r['c subscribe'] = await c.frames(3)
  t.same(r['c subscribe'], [resp(['subscribe', 'news', 1]), resp(['psubscribe', 'n*', 2]), resp(['psubscribe', '[nm]ews', 3])])

  // PUBLISH counts every receiver: a, b (n*), c three times (news, n*, [nm]ews).
  r['publish news'] = await p.call('PUBLISH', 'news', 'hello')
  t.equal(r['publish news'], ':5\r\n')
  r['publish none'] = await p.call('PUBLISH', 'none', 'z')
  t.equal(r['publish none'], ':2\r\n', 'none: n* of b and c')
  r['publish nobody'] = await p.call('PUBLISH', 'zzz', 'q')
  t.equal(r['publish nobody'], ':0\r\n')
  const binary = 'a\r\nb\x00\xff'
  r['publish binary'] = await p.call('PUBLISH', 'x', binary)
  r['publish empty'] = await p.call('PUBLISH', 'x', '')
  t.same([r['publish binary'], r['publish empty']], [':1\r\n', ':1\r\n'])

  r['a messages'] = await a.frames(3)
  t.same(r['a messages'], [resp(['message', 'news', 'hello']), resp(['message', 'x', binary]), resp(['message', 'x', ''])], 'messages byte for byte')
  r['b messages'] = await b.frames(2)
  t.same(r['b messages'], [resp(['pmessage', 'n*', 'news', 'hello']), resp(['pmessage', 'n*', 'none', 'z'])], 'pmessages byte for byte')
  // Redis sends a channel's message before its patterns' pmessages; the patterns' order is its hash table's.
  const cMessages = await c.frames(4)
  t.equal(cMessages[0], resp(['message', 'news', 'hello']), 'the channel\'s message first')
  t.equal(cMessages[3], resp(['pmessage', 'n*', 'none', 'z']))
  r['c messages'] = [...cMessages].sort()
  t.same(r['c messages'], [resp(['message', 'news', 'hello']), resp(['pmessage', 'n*', 'news', 'hello']), resp(['pmessage', 'n*', 'none', 'z']), resp(['pmessage', '[nm]ews', 'news', 'hello'])].sort())

  // PUBSUB.
  r.numpat = await p.call('PUBSUB', 'NUMPAT')
  t.equal(r.numpat, ':2\r\n', 'two patterns (n* counted once)')
  r.numsub = await p.call('PUBSUB', 'NUMSUB', 'news', 'x', 'nope')
  t.equal(r.numsub, resp(['news', 2, 'x', 1, 'nope', 0]))
  r['numsub none'] = await p.call('PUBSUB', 'NUMSUB')
  t.equal(r['numsub none'], '*0\r\n')
  r.channels = (parsed(await p.call('PUBSUB', 'CHANNELS')) as string[]).sort()
  t.same(r.channels, ['news', 'x'])
  r['channels n*'] = await p.call('PUBSUB', 'CHANNELS', 'n*')
  t.equal(r['channels n*'], resp(['news']))
  r['channels q*'] = await p.call('PUBSUB', 'CHANNELS', 'q*')
  t.equal(r['channels q*'], '*0\r\n')
  r['channels two patterns'] = await p.call('PUBSUB', 'CHANNELS', 'a', 'b')
  t.equal(r['channels two patterns'], "-ERR unknown subcommand or wrong number of arguments for 'CHANNELS'. Try PUBSUB HELP.\r\n")

  // Subscribed mode: only (P)(UN)SUBSCRIBE, PING, QUIT and RESET.
  r['get refused'] = await a.call('GET', 'x')
  t.equal(r['get refused'], refused('get'))
  a.socket.write('Get x\r\n')
  r['inline get refused'] = (await a.frames(1))[0]
  t.equal(r['inline get refused'], refused('get'), 'the name lower-cased')
  r['config get refused'] = await a.call('CONFIG', 'GET', 'maxmemory')
  t.equal(r['config get refused'], refused('config|get'))
  r['pubsub refused'] = await a.call('PUBSUB', 'NUMPAT')
  t.equal(r['pubsub refused'], refused('pubsub|numpat'))
  r['publish refused'] = await a.call('PUBLISH', 'news', 'x')
  t.equal(r['publish refused'], refused('publish'))
  r['arity before the mode'] = await a.call('GET')
  t.equal(r['arity before the mode'], "-ERR wrong number of arguments for 'get' command\r\n")
  r['unknown before the mode'] = await a.call('NOSUCH')
  t.match(r['unknown before the mode'], /^-ERR unknown command 'NOSUCH'/)
  r.ping = await a.call('PING')
  t.equal(r.ping, '*2\r\n$4\r\npong\r\n$0\r\n\r\n', 'PING: pong and an empty bulk')
  r['ping hi'] = await a.call('PING', 'hi')
  t.equal(r['ping hi'], resp(['pong', 'hi']))

  // UNSUBSCRIBE and PUNSUBSCRIBE.
  r['unsubscribe not subscribed'] = await a.call('UNSUBSCRIBE', 'nope')
  t.equal(r['unsubscribe not subscribed'], resp(['unsubscribe', 'nope', 2]))
  r['punsubscribe none'] = await a.call('PUNSUBSCRIBE')
  t.equal(r['punsubscribe none'], resp(['punsubscribe', null, 2]), 'no pattern: nil, and the count of channels')
  a.send('UNSUBSCRIBE')
  const all = (await a.frames(2)).map(parsed) as [string, string, number][]
  r['unsubscribe all'] = { names: all.map(f => f[1]).sort(), kinds: all.map(f => f[0]), counts: all.map(f => f[2]) }
  t.same(r['unsubscribe all'], { names: ['news', 'x'], kinds: ['unsubscribe', 'unsubscribe'], counts: [1, 0] }, 'one confirmation per channel')
  r['unsubscribe with none'] = await a.call('UNSUBSCRIBE')
  t.equal(r['unsubscribe with none'], '*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n')
  r['get after'] = await a.call('GET', 'x')
  t.equal(r['get after'], '$-1\r\n', 'out of subscribed mode')
  r['ping after'] = await a.call('PING')
  t.equal(r['ping after'], '+PONG\r\n')
  r['publish news after'] = await p.call('PUBLISH', 'news', 'again')
  t.equal(r['publish news after'], ':4\r\n', 'a is gone, b and c remain')
  r['b again'] = await b.frames(1)
  t.same(r['b again'], [resp(['pmessage', 'n*', 'news', 'again'])])
  r['c again'] = (await c.frames(3)).sort()

  // RESET: out of subscribed mode without confirmations; the name cleared.
  r['b reset'] = await b.call('RESET')
  t.equal(r['b reset'], '+RESET\r\n')
  r['b get after reset'] = await b.call('GET', 'x')
  t.equal(r['b get after reset'], '$-1\r\n')
  r['publish none after reset'] = await p.call('PUBLISH', 'none', 'z')
  t.equal(r['publish none after reset'], ':1\r\n')
  await p.call('CLIENT', 'SETNAME', 'publisher')
  r['reset name'] = [await p.call('RESET'), await p.call('CLIENT', 'GETNAME')]
  t.same(r['reset name'], ['+RESET\r\n', '$-1\r\n'])

  // QUIT in subscribed mode: +OK, then the close.
  const q = await RawPeer.open(t, port)
  r['q subscribe'] = await q.call('SUBSCRIBE', 'quitter')
  r['q quit'] = await q.call('QUIT')
  t.equal(r['q quit'], '+OK\r\n')
  await q.whenClosed()

  // A subscriber's disconnect takes its subscriptions with it.
  c.socket.destroy()
  r['numsub after close'] = await until(() => p.call('PUBSUB', 'NUMSUB', 'news', 'quitter'), resp(['news', 0, 'quitter', 0]))
  t.equal(r['numsub after close'], resp(['news', 0, 'quitter', 0]))
  r['numpat after close'] = await until(() => p.call('PUBSUB', 'NUMPAT'), ':0\r\n')
  t.equal(r['numpat after close'], ':0\r\n')
  r['channels after close'] = await p.call('PUBSUB', 'CHANNELS')
  t.equal(r['channels after close'], '*0\r\n')
  r['publish after close'] = await p.call('PUBLISH', 'news', 'nobody')
  t.equal(r['publish after close'], ':0\r\n')
  return r
}

async function example (t: Test, options: Parameters<typeof redisServer>[0] = {}): Promise<{ port: number, server: ReturnType<typeof redisServer> }> {
  const server = redisServer({ sweepIntervalMs: 0, ...options })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  return { port, server }
}

t.test('Pub/Sub over raw sockets: the example sends Redis\'s bytes', async (t) => {
  const { port } = await example(t)
  await rawScript(t, port)
})

t.test('Pub/Sub over raw sockets: redis-server and the example alike, step by step', { skip: noRedis }, async (t) => {
  const { port: realPort } = await realRedis(t, REDIS)
  const { port } = await example(t)
  let fromRedis: Record<string, unknown> = {}
  let fromNyala: Record<string, unknown> = {}
  await t.test('redis-server', async (t) => { fromRedis = await rawScript(t, realPort) })
  await t.test('the example', async (t) => { fromNyala = await rawScript(t, port) })
  t.same(fromNyala, fromRedis, 'every step alike')
})

// ---------------------------------------------------------------------------
// RedisClient's subscriptions.

const N = 200

/** Reads `sub` to its end: the messages, and the error it ended with, if any. */
async function drain (sub: AsyncIterable<SubscriptionMessage>): Promise<{ messages: SubscriptionMessage[], error: unknown }> {
  const messages: SubscriptionMessage[] = []
  try {
    for await (const m of sub) messages.push(m)
    return { messages, error: null }
  } catch (error) {
    return { messages, error }
  }
}

async function clientScript (t: Test, port: number): Promise<Record<string, unknown>> {
  const r: Record<string, unknown> = {}
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}` })
  t.teardown(() => redis.close())

  const sub = await redis.subscribe('c1', 'c2')
  const psub = await redis.psubscribe('p.*', 'p.a')
  r.subscribed = [[...sub.channels], [...psub.patterns]]
  const reading = drain(sub)
  const preading = drain(psub)
  const counts = await Promise.all(Array.from({ length: N }, (_, i) => redis.command('PUBLISH', i % 2 === 0 ? 'c1' : 'c2', `m${i}`)))
  const pcounts = await Promise.all(Array.from({ length: N }, (_, i) => redis.command('PUBLISH', i % 2 === 0 ? 'p.a' : 'p.b', `q${i}`)))
  r['publish counts'] = [counts.reduce((s: number, n) => s + (n as number), 0), pcounts.reduce((s: number, n) => s + (n as number), 0)]
  // Every message was sent before the unsubscribe's confirmation, on the same connection.
  await sub.unsubscribe()
  await psub.punsubscribe()
  const got = await reading
  const pgot = await preading
  r.received = [got.messages.length, pgot.messages.length]
  r['in order'] = got.messages.every((m, i) => m.message.toString() === `m${i}` && m.channel === (i % 2 === 0 ? 'c1' : 'c2') && m.pattern === undefined)
  // p.a matches both patterns: two messages each, p.* first (subscribed first; redis: its hash order, so sorted here).
  r['pattern messages'] = pgot.messages.map(m => `${m.pattern} ${m.channel} ${m.message.toString()}`).sort()
  r['ended'] = [got.error, pgot.error, sub.isClosed, psub.isClosed, sub.dropped, psub.dropped]

  // Unsubscribing from one channel goes on; from the last, ends.
  const two = await redis.subscribe('d1', 'd2')
  const twoReading = drain(two)
  await two.unsubscribe('d1')
  r['after partial'] = [[...two.channels], await redis.command('PUBLISH', 'd1', 'lost'), await redis.command('PUBLISH', 'd2', 'kept')]
  await two.unsubscribe('d2')
  const twoGot = await twoReading
  r['partial'] = twoGot.messages.map(m => `${m.channel} ${m.message.toString()}`)

  // Messages not read are bounded: the oldest dropped, counted.
  const bounded = new RedisClient({ endpoint: `127.0.0.1:${port}`, subscription: { maxBufferedMessages: 10 } })
  t.teardown(() => bounded.close())
  const slow = await bounded.subscribe('e')
  for (let i = 0; i < 50; i++) await redis.command('PUBLISH', 'e', `e${i}`)
  await slow.unsubscribe()
  const slowGot = await drain(slow)
  r.bounded = { read: slowGot.messages.map(m => m.message.toString()), dropped: slow.dropped, received: slow.received }

  // The client's close ends its subscriptions' iterations.
  const closing = new RedisClient({ endpoint: `127.0.0.1:${port}` })
  const last = await closing.subscribe('f')
  const lastReading = drain(last)
  await redis.command('PUBLISH', 'f', 'before close')
  await closing.close()
  const lastGot = await lastReading
  r['client close'] = { error: lastGot.error, closed: last.isClosed }
  r['subscribe after close'] = await closing.subscribe('g').then(() => 'subscribed', (e: RpcError) => e.code)

  const refusedSub = await redis.subscribe('h')
  r['numsub h'] = await redis.command('PUBSUB', 'NUMSUB', 'h')
  await refusedSub.close()
  return r
}

function checkClient (t: Test, r: Record<string, unknown>): void {
  t.same(r.subscribed, [['c1', 'c2'], ['p.*', 'p.a']])
  t.same(r['publish counts'], [N, N + N / 2], 'PUBLISH counts: one receiver each; p.a two')
  t.same(r.received, [N, N + N / 2], `${N} messages, ${N + N / 2} pattern messages, counted`)
  t.equal(r['in order'], true, 'in publishing order, with channel and payload')
  const expected: string[] = []
  for (let i = 0; i < N; i++) {
    if (i % 2 === 0) expected.push(`p.* p.a q${i}`, `p.a p.a q${i}`)
    else expected.push(`p.* p.b q${i}`)
  }
  t.same(r['pattern messages'], expected.sort())
  t.same(r.ended, [null, null, true, true, 0, 0], 'unsubscribing ended both iterations, nothing dropped')
  t.same(r['after partial'], [['d2'], 0, 1])
  t.same(r.partial, ['d2 kept'])
  t.same(r.bounded, { read: Array.from({ length: 10 }, (_, i) => `e${40 + i}`), dropped: 40, received: 50 }, 'the newest 10 kept, 40 dropped')
  t.same(r['client close'], { error: null, closed: true }, 'the client\'s close ends the iteration')
  t.equal(r['subscribe after close'], 'RPC_ERR_CLIENT_CLOSED')
  t.same(r['numsub h'], [Buffer.from('h'), 1])
}

t.test('RedisClient.subscribe and psubscribe against the example', async (t) => {
  const { port } = await example(t)
  checkClient(t, await clientScript(t, port))
})

t.test('RedisClient.subscribe and psubscribe against redis-server', { skip: noRedis }, async (t) => {
  const { port } = await realRedis(t, REDIS)
  checkClient(t, await clientScript(t, port))
})

t.test('a subscription ends with an error when its connection is lost', async (t) => {
  const { port, server } = await example(t)
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}` })
  t.teardown(() => redis.close())
  const subs = await Promise.all([redis.subscribe('a'), redis.psubscribe('*')])
  const readings = subs.map(drain)
  await redis.command('PUBLISH', 'a', 'one')
  await server.close({ graceMs: 0 })
  const outcomes = await Promise.all(readings)
  t.same(outcomes.map(o => o.messages.length), [1, 1], 'the messages before the loss are read')
  t.same(outcomes.map(o => o.error instanceof RpcError), [true, true], 'then each iteration rejects, with an RpcError')
  t.same(outcomes.map(o => (o.error as RpcError).fatal), [true, true], `a connection error: ${(outcomes[0]!.error as Error).message}`)
  t.same(subs.map(s => s.isClosed), [true, true])
  t.equal(await subs[0]!.subscribe('b').then(() => 'subscribed', (e: RpcError) => e.code), 'RPC_ERR_CLIENT_CLOSED')
})

t.test('a subscribe with nothing to subscribe to is refused before anything is sent', async (t) => {
  const { port, server } = await example(t)
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}` })
  t.teardown(() => redis.close())
  const errors = await Promise.all([redis.subscribe(), redis.psubscribe()].map(p => p.then(() => null, (e: unknown) => (e as RpcError).code)))
  t.same(errors, ['RPC_ERR_INVALID_ARGUMENT', 'RPC_ERR_INVALID_ARGUMENT'])
  t.equal(server.stats().connectionsOpen, 0, 'no connection opened for them')
})

t.test('a subscribe to an endpoint nobody listens on rejects RPC_ERR_CONNECT_FAILED, without retrying', async (t) => {
  const redis = new RedisClient({ endpoint: `127.0.0.1:${await freePort()}` })
  t.teardown(() => redis.close())
  const outcomes = await Promise.all([redis.subscribe('a'), redis.psubscribe('b*')].map(p => p.then(() => 'subscribed', (e: unknown) => (e as RpcError).code)))
  t.same(outcomes, ['RPC_ERR_CONNECT_FAILED', 'RPC_ERR_CONNECT_FAILED'])
})

// ---------------------------------------------------------------------------
// The slow-consumer limit (the example only).

const MESSAGE = 'm'.repeat(4096)

/**
 * A subscriber that stops reading and one that reads, on channel `big`:
 * publishes 4 KiB messages (8 per turn) until the slow one is closed (the
 * count falls to 1), then 20 more. Returns the counts.
 */
async function slowConsumer (t: Test, port: number): Promise<{ published: number, closedAfter: number, fastReceived: number, fastDropped: number, slowClosed: boolean, tailCounts: number[] }> {
  const slow = await RawPeer.open(t, port)
  t.equal(await slow.call('SUBSCRIBE', 'big'), resp(['subscribe', 'big', 1]))
  slow.socket.pause()
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}`, subscription: { maxBufferedMessages: 100_000, maxBufferedBytes: 1024 * 1024 * 1024 } })
  t.teardown(() => redis.close())
  const fast = await redis.subscribe('big')
  const reading = drain(fast)
  let published = 0
  let closedAfter = -1
  for (let round = 0; round < 1000 && closedAfter < 0; round++) {
    const counts = await Promise.all(Array.from({ length: 8 }, () => redis.command('PUBLISH', 'big', MESSAGE) as Promise<number>))
    published += counts.length
    if (counts.some(n => n < 2)) closedAfter = published
  }
  const tailCounts: number[] = []
  for (let i = 0; i < 20; i++) tailCounts.push(await redis.command('PUBLISH', 'big', `tail${i}`) as number)
  published += 20
  await fast.unsubscribe()
  const got = await reading
  slow.socket.resume()
  await slow.whenClosed()
  return { published, closedAfter, fastReceived: got.messages.length, fastDropped: fast.dropped, slowClosed: slow.closed, tailCounts }
}

t.test('--client-output-buffer-limit-pubsub 64kb 32kb 60: a subscriber that does not read is closed, the other goes on', { timeout: 120_000 }, async (t) => {
  const { port } = await startListening(t, MAIN, ['--port', '0', '--client-output-buffer-limit-pubsub', '64kb', '32kb', '60'])
  const r = await slowConsumer(t, port)
  t.ok(r.closedAfter > 0, `the slow subscriber was closed after ${r.closedAfter} messages of 4 KiB`)
  t.same(r.tailCounts, new Array(20).fill(1), 'then PUBLISH counts the reader alone')
  t.equal(r.fastReceived, r.published, `the reader received all ${r.published} messages`)
  t.equal(r.fastDropped, 0)
  t.equal(r.slowClosed, true)
})

t.test('pubsubOutputLimit: the hard limit closes the slow subscriber, counted', { timeout: 120_000 }, async (t) => {
  const { port, server } = await example(t, { pubsubOutputLimit: { hardBytes: 64 * 1024, softBytes: 0 } })
  const r = await slowConsumer(t, port)
  t.ok(r.closedAfter > 0, `closed after ${r.closedAfter} messages`)
  t.equal(r.fastReceived, r.published, 'the reader received every message')
  t.equal(server.stats().pushHardLimitClosed, 1, 'one connection closed by the hard limit')
  t.equal(server.stats().pushSoftLimitClosed, 0)
  t.equal(await until(async () => String(server.pubsub.subscribers('big')), '0'), '0', 'and its subscription is gone')
})

t.test('the flag reads sizes as Redis does', async (t) => {
  t.equal(parseMemory('32mb'), 32 * 1024 * 1024)
  t.equal(parseMemory('64KB'), 64 * 1024)
  t.equal(parseMemory('1k'), 1000)
  t.equal(parseMemory('2g'), 2e9)
  t.equal(parseMemory('100'), 100)
  t.equal(parseMemory('0'), 0)
  t.equal(parseMemory('1.5mb'), null)
  t.equal(parseMemory('-1'), null)
  t.equal(parseMemory('mb'), null)
  const limit = { hardBytes: 32 * 1024 * 1024, softBytes: 8 * 1024 * 1024, softMs: 60_000 }
  t.same(takePubsubLimit(['--port', '1', '--client-output-buffer-limit-pubsub', '32mb', '8mb', '60', '--host', 'h']), { rest: ['--port', '1', '--host', 'h'], limit })
  t.same(takePubsubLimit(['--client-output-buffer-limit-pubsub', '32mb 8mb 60']), { rest: [], limit })
  t.same(takePubsubLimit(['--client-output-buffer-limit-pubsub=32mb 8mb 60']), { rest: [], limit })
  t.same(takePubsubLimit(['--client-output-buffer-limit-pubsub', '0', '0', '0']), { rest: [], limit: { hardBytes: 0, softBytes: 0, softMs: 0 } })
  t.same(takePubsubLimit(['--port', '1']), { rest: ['--port', '1'], limit: undefined })
  t.throws(() => takePubsubLimit(['--client-output-buffer-limit-pubsub', '32mb', '8mb']), RangeError)
  t.throws(() => takePubsubLimit(['--client-output-buffer-limit-pubsub', '32xb', '8mb', '60']), RangeError)
  t.throws(() => takePubsubLimit(['--client-output-buffer-limit-pubsub', '32mb', '8mb', '1.5']), RangeError)
})

t.test('a subscribed connection is marked a session (kept at maxConnections) until it leaves subscribed mode', async (t) => {
  const pubsub = new PubSub()
  const state = new ConnectionState(1)
  // The handle's members the registry uses; markSession records what it is told.
  let session = false
  const handle = { isClosed: false, get isSession () { return session }, markSession: (on = true) => { session = on }, once: () => handle, off: () => handle } as unknown as ConnectionHandle
  const subscriptions = pubsub.subscriptionsOf(state, handle)!
  pubsub.subscribe(subscriptions, 'a')
  pubsub.psubscribe(subscriptions, 'b*')
  t.ok(handle.isSession, 'subscribed: a session')
  pubsub.unsubscribe(state, 'a')
  t.ok(handle.isSession, 'still subscribed to a pattern')
  pubsub.punsubscribe(state, 'b*')
  t.notOk(handle.isSession, 'out of subscribed mode: no longer a session')
  pubsub.subscribe(pubsub.subscriptionsOf(state, handle)!, 'c')
  pubsub.unsubscribeAll(state)
  t.notOk(handle.isSession, 'RESET (or its close) unmarks it')
})

t.test('a PUBLISH to many patterns of one subscriber sends few pushes, each pmessage whole and in order, counted', async (t) => {
  const pubsub = new PubSub()
  interface Push { slices: Uint8Array[] }
  const peer = (id: number): { subscriptions: Subscriptions, pushes: Push[], bytes: () => string, refuse: () => void } => {
    const pushes: Push[] = []
    let accept = true
    const h = { isClosed: false, markSession: () => {}, once: () => h, off: () => h, send: (push: Push) => { if (accept) pushes.push(push); return accept } }
    const subscriptions = pubsub.subscriptionsOf(new ConnectionState(id), h as unknown as ConnectionHandle)!
    return { subscriptions, pushes, bytes: () => Buffer.concat(pushes.flatMap((p) => p.slices)).toString('latin1'), refuse: () => { accept = false } }
  }
  const a = peer(1)
  const b = peer(2)
  // Distinct patterns that all match the channel: each of its first 6 bytes as itself, `?`, `[x]` or `\x`, then `*`.
  const channel = 'abcdefghijklmnop'
  const patterns = Array.from({ length: 4096 }, (_, i) => {
    let out = ''
    for (let k = 0; k < 6; k++) {
      const c = channel[k]!
      const variant = (i >> (2 * k)) & 3
      out += variant === 0 ? c : variant === 1 ? '?' : variant === 2 ? `[${c}]` : `\\${c}`
    }
    return out + '*'
  })
  t.equal(new Set(patterns).size, 4096)
  const aSubs = a.subscriptions
  const bSubs = b.subscriptions
  pubsub.subscribe(aSubs, channel)
  for (let i = 0; i < patterns.length; i++) {
    pubsub.psubscribe(aSubs, patterns[i]!)
    // One of b's patterns between a's: a's run is broken there.
    if (i === 999) pubsub.psubscribe(bSubs, 'abc*')
  }
  pubsub.psubscribe(bSubs, '*')
  const pmessage = (pattern: string, message: string): string =>
    `*4\r\n$8\r\npmessage\r\n$${pattern.length}\r\n${pattern}\r\n$${channel.length}\r\n${channel}\r\n$${message.length}\r\n${message}\r\n`
  const aExpected = `*3\r\n$7\r\nmessage\r\n$${channel.length}\r\n${channel}\r\n$2\r\nhi\r\n` + patterns.map((p) => pmessage(p, 'hi')).join('')
  const bExpected = pmessage('abc*', 'hi') + pmessage('*', 'hi')
  for (let round = 0; round < 2; round++) {
    // The second time, each pattern's match is the one remembered: the same answer.
    a.pushes.length = 0
    b.pushes.length = 0
    t.equal(pubsub.publish(channel, Buffer.from('hi')), 1 + patterns.length + 2, 'PUBLISH counts the channel and every matching pattern')
    t.equal(a.bytes(), aExpected, 'a: the message, then every pmessage whole, in subscription order')
    t.equal(b.bytes(), bExpected)
    // One push for the message, one per 64 KiB slab, one more where b's pattern broke the run: not one per pattern.
    const most = 1 + Math.ceil(aExpected.length / (64 * 1024)) + 2
    t.ok(a.pushes.length <= most, `${a.pushes.length} pushes for ${patterns.length + 1} messages (${aExpected.length} bytes), at most ${most}`)
  }
  // Another channel: the remembered matches are not its.
  a.pushes.length = 0
  b.pushes.length = 0
  t.equal(pubsub.publish('zzz', Buffer.from('x')), 1, 'only `*` matches zzz')
  t.equal(a.pushes.length, 0)
  // A large message is not copied per pattern; still whole and counted.
  const large = 'L'.repeat(2000)
  t.equal(pubsub.publish(channel, Buffer.from(large)), 1 + patterns.length + 2)
  t.equal(a.bytes(), `*3\r\n$7\r\nmessage\r\n$${channel.length}\r\n${channel}\r\n$2000\r\n${large}\r\n` + patterns.map((p) => pmessage(p, large)).join(''))
  // A subscriber that refuses its pushes (closed, or over its limit) is not counted.
  a.refuse()
  t.equal(pubsub.publish(channel, Buffer.from('hi')), 2, 'only b\'s two patterns counted')
})
