/**
 * The redis example's RESP2 protocol: the scanner on its own (every split
 * of a stream, protocol errors at their earliest byte), then a live server
 * on 127.0.0.1 driven by a raw socket: pipelined answers in order, every
 * command's happy path and main errors in Redis 7's words, expiry on a
 * hand-moved clock, eviction under the memory limit.
 */
import t, { type Test } from 'tap'
import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { RpcError } from '../../reactor/index.js'
import { redisServer, type RedisServerOptions } from '../../examples/redis/main.js'
import { INLINE_MAX_BYTES, ProtocolErrors, RespProtocolError, RespScanner, encodeReply } from '../../examples/redis/resp.js'
import { formatScore, globMatch } from '../../examples/redis/handlers.js'
import { parseReply, type RespReply } from '../helpers/resp.js'

const cmd = (...args: string[]): string => `*${args.length}\r\n${args.map(a => `$${Buffer.byteLength(a, 'latin1')}\r\n${a}\r\n`).join('')}`

function scanner (maxBulk = 1024): RespScanner {
  return new RespScanner(maxBulk)
}

/** Frames found in `stream` fed in pieces cut at `cuts`, as ScanDecoder feeds a scanner: the current frame's bytes so far, from its start. */
function frames (stream: Buffer, cuts: number[], s = scanner()): number[] {
  const sizes: number[] = []
  let frameStart = 0
  let arrived = 0
  for (const cut of [...cuts, stream.length]) {
    arrived = cut
    for (;;) {
      if (frameStart >= arrived) break
      const size = s.scan(stream, frameStart, arrived)
      if (size instanceof RpcError) throw size
      if (size <= 0) break
      sizes.push(size)
      frameStart += size
      s.reset()
    }
  }
  return sizes
}

t.test('the scanner finds the same frames however the stream is split (arrays and inline)', async (t) => {
  const parts = [cmd('SET', 'key', 'va\r\nlue'), 'PING\r\n', cmd('GET', 'key'), 'SET a "b c"\n', '*0\r\n', '\r\n', cmd('ECHO', ''), "ECHO 'x y'\r\n"]
  const stream = Buffer.from(parts.join(''), 'latin1')
  const expected = parts.map(p => Buffer.byteLength(p, 'latin1'))
  t.same(frames(stream, []), expected, 'whole')
  for (let cut = 1; cut < stream.length; cut++) {
    const got = frames(stream, [cut])
    if (JSON.stringify(got) !== JSON.stringify(expected)) t.fail(`cut at ${cut}: ${JSON.stringify(got)}`)
  }
  // One byte at a time.
  t.same(frames(stream, Array.from({ length: stream.length }, (_, i) => i)), expected, 'byte by byte')
})

t.test('protocol errors are refused at their first bad byte, in Redis\'s words', async (t) => {
  // The bytes the scanner had seen when it refused, and its words; or the size of a good frame.
  const consumed = (text: string, maxBulk = 1024): number | [number, string] => {
    const bytes = Buffer.from(text, 'latin1')
    // Byte by byte: the first call that refuses (or returns a size) is where the scanner could tell.
    const s = scanner(maxBulk)
    for (let end = 1; end <= bytes.length; end++) {
      const size = s.scan(bytes, 0, end)
      if (size instanceof RpcError) return [end, size instanceof RespProtocolError ? size.message : `not a protocol error: ${size.message}`]
      if (size > 0) return size
    }
    return -1
  }
  t.same(consumed('*abc\r\n'), [2, ProtocolErrors.multibulkLength], '*a: the first non-digit of the count')
  t.same(consumed('*1\r\n*1\r\n'), [5, ProtocolErrors.expectedDollar(0x2a)], 'a nested array: its *')
  t.same(consumed('*1\r\n$x\r\n'), [6, ProtocolErrors.bulkLength], 'a bulk length not a number')
  t.same(consumed('*1\r\n$-1\r\n'), [6, ProtocolErrors.bulkLength], 'a negative bulk length')
  t.same(consumed('*1\r\n$2000\r\nxx'), [9, ProtocolErrors.bulkLength], 'a bulk length over the limit (1024): at its 4th digit')
  t.same(consumed('*1\r\n$600000000\r\n', 512 * 1024 * 1024), [14, ProtocolErrors.bulkLength], 'over 512 MiB: at the 9th digit')
  t.same(consumed('*1\r\n$01\r\n'), [7, ProtocolErrors.bulkLength], 'a leading zero')
  t.same(consumed('*1\r\n$\r\n'), [7, ProtocolErrors.bulkLength], 'an empty bulk length, at its CR once the next byte is in')
  const inline = 'x'.repeat(INLINE_MAX_BYTES + 10)
  t.same(consumed(inline), [INLINE_MAX_BYTES + 1, ProtocolErrors.inlineTooBig], 'an inline line: at the byte past 64 KiB')
  t.equal(consumed('x'.repeat(INLINE_MAX_BYTES) + '\n'), INLINE_MAX_BYTES + 1, 'a 64 KiB inline line with its LF is fine')
  // An oversized bulk within the limit is known to be large before it arrives.
  const s = scanner(1024)
  t.equal(s.scan(Buffer.from('*1\r\n$1000\r\nab', 'latin1'), 0, 13), -(11 + 1002), 'a bulk being read: at least its end')
})

t.test('score and glob helpers', async (t) => {
  t.equal(formatScore(1), '1')
  t.equal(formatScore(2.5), '2.5')
  t.equal(formatScore(0.1), '0.10000000000000001')
  t.equal(formatScore(1e20), '1e+20')
  t.equal(formatScore(1.5e-7), '1.4999999999999999e-07')
  t.equal(formatScore(-Infinity), '-inf')
  t.ok(globMatch('h?llo', 'hello'))
  t.ok(globMatch('h*llo', 'heeeello'))
  t.ok(globMatch('h[ae]llo', 'hallo'))
  t.notOk(globMatch('h[^e]llo', 'hello'))
  t.ok(globMatch('h[a-b]llo', 'hbllo'))
  t.ok(globMatch('a\\*', 'a*'))
  t.notOk(globMatch('a\\*', 'ab'))
})

// ---------------------------------------------------------------------------
// A live server, a raw socket.

/** Replies as the tests' RESP parser gives them (independent of the example's encoder): bulks as Buffers. */
type Parsed = RespReply

/** Replies as plain JSON-able values: bulk strings as latin1 strings. */
function plain (reply: Parsed): unknown {
  if (Buffer.isBuffer(reply)) return reply.toString('latin1')
  if (Array.isArray(reply)) return reply.map(plain)
  return reply
}

class Peer {
  readonly socket: Socket
  received = Buffer.alloc(0)
  closed = false
  #waiters: (() => void)[] = []
  constructor (port: number) {
    this.socket = connect(port, '127.0.0.1')
    this.socket.setNoDelay(true)
    this.socket.on('error', () => {})
    this.socket.on('data', (d: Buffer) => { this.received = Buffer.concat([this.received, d]); this.#wake() })
    this.socket.on('close', () => { this.closed = true; this.#wake() })
  }

  #wake (): void {
    for (const w of this.#waiters.splice(0)) w()
  }

  async #changed (): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 2000)
      this.#waiters.push(() => { clearTimeout(timer); resolve() })
    })
  }

  /** Sends `bytes` and waits for `n` whole replies (or the close); returns them and consumes them. */
  async send (bytes: string | Buffer, n = 1): Promise<unknown[]> {
    this.socket.write(typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes)
    return await this.replies(n)
  }

  async replies (n: number): Promise<unknown[]> {
    for (let round = 0; round < 50; round++) {
      const out: unknown[] = []
      let p = 0
      for (;;) {
        if (out.length === n) break
        const r = parseReply(this.received, p)
        if (r === null) break
        out.push(plain(r[0]))
        p = r[1]
      }
      if (out.length === n || this.closed) {
        this.received = this.received.subarray(p)
        return out
      }
      await this.#changed()
    }
    throw new Error(`only part of ${n} replies: ${JSON.stringify(this.received.toString('latin1'))}`)
  }

  async call (...args: string[]): Promise<unknown> {
    return (await this.send(cmd(...args)))[0]
  }

  async waitClose (): Promise<void> {
    while (!this.closed) await this.#changed()
  }

  destroy (): void {
    this.socket.destroy()
  }
}

async function serve (t: Test, options: RedisServerOptions = {}): Promise<{ port: number, peer: () => Peer, server: ReturnType<typeof redisServer> }> {
  const server = redisServer({ sweepIntervalMs: 0, ...options })
  const { port } = await server.listen(0, '127.0.0.1')
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const p of peers) p.destroy()
    await server.close({ graceMs: 100 })
  })
  return { port, server, peer: () => { const p = new Peer(port); peers.push(p); return p } }
}

const E = (error: string): { error: string } => ({ error })
const WRONGTYPE = E('WRONGTYPE Operation against a key holding the wrong kind of value')
const NOT_INT = E('ERR value is not an integer or out of range')

t.test('protocol errors: the answers before, Redis\'s words, then the close', async (t) => {
  const { peer } = await serve(t)
  const cases: [string, string][] = [
    ['*abc\r\n', 'ERR Protocol error: invalid multibulk length'],
    ['*1\r\n*1\r\n$4\r\nPING\r\n', "ERR Protocol error: expected '$', got '*'"],
    ['*1\r\n$abc\r\n', 'ERR Protocol error: invalid bulk length'],
    ['*1\r\n$-1\r\n', 'ERR Protocol error: invalid bulk length'],
    ['*1\r\n$600000000\r\n', 'ERR Protocol error: invalid bulk length'],
    ['SET a "b\r\n', 'ERR Protocol error: unbalanced quotes in request'],
    ['SET a "b"c\r\n', 'ERR Protocol error: unbalanced quotes in request'],
    ['x'.repeat(INLINE_MAX_BYTES + 100), 'ERR Protocol error: too big inline request']
  ]
  for (const [input, words] of cases) {
    const p = peer()
    const replies = await p.send(Buffer.concat([Buffer.from(cmd('PING') + 'PING\r\n', 'latin1'), Buffer.from(input, 'latin1'), Buffer.from(cmd('PING'))]), 3)
    await p.waitClose()
    t.same(replies, ['PONG', 'PONG', E(words)], `${JSON.stringify(input.slice(0, 24))}: ${words}, after the answers before it, and nothing after`)
    t.ok(p.closed, 'closed')
  }
  // Like Redis 7, the two bytes after a bulk's data are skipped unread.
  const p = peer()
  t.same(await p.send('*1\r\n$4\r\nPINGXY' + cmd('ECHO', 'ok'), 2), ['PONG', 'ok'], 'bulk data not followed by CRLF: skipped as Redis skips it')
  // A frame longer than the server's largest closes without a word (Redis's query buffer limit).
  const { peer: small } = await serve(t, { maxMessageBytes: 1024 * 1024, protoMaxBulkLen: 4 * 1024 * 1024 })
  const q = small()
  const big = await q.send('*2\r\n$3\r\nGET\r\n$2000000\r\n', 1)
  t.same(big, [E('ERR Protocol error: invalid bulk length')], 'the bulk limit is never above the frame limit')
})

t.test('pipelined bursts are answered in order', async (t) => {
  const { peer } = await serve(t)
  const p = peer()
  let burst = ''
  const expected: unknown[] = []
  for (let i = 0; i < 500; i++) {
    burst += cmd('SET', `k${i}`, `v${i}`) + `GET k${i}\r\n` + cmd('INCR', 'counter')
    expected.push('OK', `v${i}`, i + 1)
  }
  // Sent in odd pieces, so frames span reads.
  const bytes = Buffer.from(burst, 'latin1')
  const replies = p.replies(expected.length)
  for (let at = 0; at < bytes.length; at += 777) p.socket.write(bytes.subarray(at, at + 777))
  t.same(await replies, expected)
})

t.test('strings, keys and expiry options', async (t) => {
  let now = 1_000_000
  const { peer } = await serve(t, { now: () => now })
  const p = peer()
  const script: [string[], unknown][] = [
    [['PING'], 'PONG'], [['PING', 'hi'], 'hi'], [['PING', 'a', 'b'], E("ERR wrong number of arguments for 'ping' command")],
    [['ECHO', 'x y'], 'x y'], [['ECHO'], E("ERR wrong number of arguments for 'echo' command")],
    [['SET', 'k', 'v'], 'OK'], [['GET', 'k'], 'v'], [['GET', 'nope'], null], [['GET'], E("ERR wrong number of arguments for 'get' command")],
    [['SET', 'k', 'w', 'NX'], null], [['SET', 'k', 'w', 'XX', 'GET'], 'v'], [['SET', 'new', 'w', 'XX'], null],
    [['SET', 'k', 'v', 'NX', 'XX'], E('ERR syntax error')], [['SET', 'k', 'v', 'FOO'], E('ERR syntax error')],
    [['SET', 'k', 'v', 'EX', 'x'], NOT_INT], [['SET', 'k', 'v', 'EX', '0'], E("ERR invalid expire time in 'set' command")],
    [['GETSET', 'k', 'z'], 'w'], [['GET', 'k'], 'z'],
    [['SET', 'n', '10'], 'OK'], [['INCR', 'n'], 11], [['INCRBY', 'n', '-20'], -9], [['DECR', 'n'], -10], [['DECRBY', 'n', '5'], -15],
    [['INCR', 'k'], NOT_INT], [['INCRBY', 'n', '1.5'], NOT_INT],
    [['SET', 'big', '9223372036854775807'], 'OK'], [['INCR', 'big'], E('ERR increment or decrement would overflow')],
    [['DECRBY', 'n', '-9223372036854775808'], E('ERR decrement would overflow')],
    [['APPEND', 'k', '12'], 3], [['APPEND', 'fresh', 'ab'], 2], [['STRLEN', 'k'], 3], [['STRLEN', 'nope'], 0],
    [['MSET', 'a', '1', 'b', '2'], 'OK'], [['MSET', 'a'], E("ERR wrong number of arguments for 'mset' command")],
    [['MSET', 'a', '1', 'b'], E("ERR wrong number of arguments for 'mset' command")],
    [['MGET', 'a', 'nope', 'b'], ['1', null, '2']],
    [['EXISTS', 'a', 'b', 'nope', 'a'], 3], [['DEL', 'a', 'nope'], 1], [['TYPE', 'b'], 'string'], [['TYPE', 'nope'], 'none'],
    [['SELECT', '0'], 'OK'], [['SELECT', '1'], E('ERR DB index is out of range')], [['SELECT', 'x'], NOT_INT],
    [['FOO', 'a', 'b'], E("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")],
    [['DBSIZE'], 5]
  ]
  for (const [args, expected] of script) t.same(await p.call(...args), expected, args.join(' '))
  t.same(((await p.call('KEYS', '*')) as string[]).sort(), ['b', 'big', 'fresh', 'k', 'n'], 'KEYS *')
  t.same(((await p.call('KEYS', 'b*')) as string[]).sort(), ['b', 'big'], 'KEYS b*')
  // Expiry on the store's clock, moved by hand.
  t.same(await p.call('SET', 'e', '1', 'EX', '10'), 'OK')
  t.same(await p.call('TTL', 'e'), 10)
  t.same(await p.call('PTTL', 'e'), 10000)
  now += 4_400
  t.same(await p.call('TTL', 'e'), 6, 'rounded as Redis rounds')
  t.same(await p.call('SET', 'p', '1', 'PX', '500'), 'OK')
  t.same(await p.call('EXPIRE', 'b', '100'), 1)
  t.same(await p.call('EXPIRE', 'b', '50', 'GT'), 0, 'GT: not later')
  t.same(await p.call('EXPIRE', 'b', '200', 'NX'), 0, 'NX: it has one')
  t.same(await p.call('PEXPIRE', 'b', '200000', 'XX'), 1)
  t.same(await p.call('EXPIRE', 'b', '1', 'NX', 'XX'), E('ERR NX and XX, GT or LT options at the same time are not compatible'))
  t.same(await p.call('EXPIRE', 'nope', '1'), 0)
  t.same(await p.call('TTL', 'nope'), -2)
  t.same(await p.call('TTL', 'k'), -1)
  t.same(await p.call('PERSIST', 'b'), 1)
  t.same(await p.call('PERSIST', 'b'), 0)
  t.same(await p.call('SET', 'g', 'v', 'EX', '100'), 'OK')
  t.same(await p.call('SET', 'g', 'w', 'KEEPTTL'), 'OK')
  t.same(await p.call('TTL', 'g'), 100, 'KEEPTTL keeps it')
  t.same(await p.call('SET', 'g', 'x'), 'OK')
  t.same(await p.call('TTL', 'g'), -1, 'a plain SET clears it')
  now += 600
  t.same(await p.call('GET', 'p'), null, 'PX 500 is gone 600 ms on')
  t.same(await p.call('EXISTS', 'e'), 1)
  now += 6_000
  t.same(await p.call('GET', 'e'), null, 'EX 10 is gone')
  t.same(await p.call('SET', 'x', '1'), 'OK')
  t.same(await p.call('EXPIRE', 'x', '-1'), 1, 'a time in the past deletes')
  t.same(await p.call('EXISTS', 'x'), 0)
})

t.test('the sweep deletes expired keys nobody asks for', async (t) => {
  let now = 0
  const { peer, server } = await serve(t, { now: () => now })
  const p = peer()
  for (let i = 0; i < 300; i++) await p.call('SET', `t${i}`, 'v', 'PX', '100')
  await p.call('SET', 'forever', 'v')
  t.equal(server.store.size, 301)
  now += 200
  t.equal(server.store.sweep(), 200, 'one tick looks at a bounded number of keys')
  t.equal(server.store.sweep(), 100)
  t.equal(server.store.size, 1)
  t.same(await p.call('DBSIZE'), 1)
})

t.test('lists, sets, hashes, sorted sets', async (t) => {
  const { peer } = await serve(t)
  const p = peer()
  const script: [string[], unknown][] = [
    [['RPUSH', 'l', 'a', 'b', 'c'], 3], [['LPUSH', 'l', 'z'], 4], [['LRANGE', 'l', '0', '-1'], ['z', 'a', 'b', 'c']],
    [['LRANGE', 'l', '1', '2'], ['a', 'b']], [['LRANGE', 'l', '-2', '100'], ['b', 'c']], [['LRANGE', 'l', '5', '10'], []],
    [['LRANGE', 'l', 'x', '1'], NOT_INT], [['LLEN', 'l'], 4], [['LPOP', 'l'], 'z'], [['RPOP', 'l'], 'c'],
    [['LPOP', 'l', '5'], ['a', 'b']], [['LPOP', 'l'], null], [['LPOP', 'l', '2'], null], [['LPOP', 'l', '-1'], E('ERR value is out of range, must be positive')],
    [['EXISTS', 'l'], 0], [['SET', 's', 'x'], 'OK'], [['LPUSH', 's', 'a'], WRONGTYPE], [['LRANGE', 's', '0', '1'], WRONGTYPE],
    [['SADD', 'set', 'a', 'b', 'a'], 2], [['SADD', 'set', 'c'], 1], [['SCARD', 'set'], 3], [['SADD', 's', 'a'], WRONGTYPE],
    [['SPOP', 'nope'], null], [['SPOP', 'nope', '2'], []], [['SPOP', 'set', '-1'], E('ERR value is out of range, must be positive')],
    [['HSET', 'h', 'f1', 'v1', 'f2', 'v2'], 2], [['HSET', 'h', 'f1', 'w'], 0], [['HSET', 'h', 'f1'], E("ERR wrong number of arguments for 'hset' command")],
    [['HGET', 'h', 'f1'], 'w'], [['HGET', 'h', 'nope'], null], [['HGETALL', 'h'], ['f1', 'w', 'f2', 'v2']], [['HDEL', 'h', 'f1', 'nope'], 1],
    [['HGETALL', 'nope'], []], [['HGET', 's', 'f'], WRONGTYPE], [['TYPE', 'h'], 'hash'], [['TYPE', 'set'], 'set'],
    [['ZADD', 'z', '1', 'a', '2.5', 'b', '0.1', 'c'], 3], [['ZADD', 'z', 'x', 'a'], E('ERR value is not a valid float')],
    [['ZADD', 'z', '1'], E("ERR wrong number of arguments for 'zadd' command")], [['ZADD', 'z', 'NX', 'XX', '1', 'a'], E('ERR XX and NX options at the same time are not compatible')],
    [['ZADD', 'z', 'CH', '5', 'a', '9', 'n'], 2], [['ZADD', 'z', 'INCR', '1', 'a'], '6'], [['ZCARD', 'z'], 4],
    [['ZRANGE', 'z', '0', '-1'], ['c', 'b', 'a', 'n']], [['ZRANGE', 'z', '0', '1', 'WITHSCORES'], ['c', '0.10000000000000001', 'b', '2.5']],
    [['ZRANGE', 'z', '0', '0', 'REV'], ['n']], [['ZPOPMIN', 'z'], ['c', '0.10000000000000001']], [['ZPOPMIN', 'z', '2'], ['b', '2.5', 'a', '6']],
    [['ZPOPMIN', 'nope'], []], [['TYPE', 'z'], 'zset'], [['ZCARD', 's'], WRONGTYPE]
  ]
  for (const [args, expected] of script) t.same(await p.call(...args), expected, args.join(' '))
  const members = ((await p.call('SMEMBERS', 'set')) as string[]).sort()
  t.same(members, ['a', 'b', 'c'])
  const popped = await p.call('SPOP', 'set') as string
  t.ok(members.includes(popped), 'SPOP takes a member')
  t.same(await p.call('SCARD', 'set'), 2)
  // Values are binary-safe.
  const binary = Buffer.from([0, 1, 2, 255, 13, 10, 0x80])
  const frame = Buffer.concat([Buffer.from('*3\r\n$3\r\nSET\r\n$3\r\nbin\r\n$7\r\n'), binary, Buffer.from('\r\n')])
  t.same(await p.send(frame), ['OK'])
  const [bin] = await p.send(cmd('GET', 'bin'))
  t.equal(Buffer.from(bin as string, 'latin1').toString('hex'), binary.toString('hex'), 'binary value round trip')
})

t.test('server and connection commands', async (t) => {
  const { peer, port } = await serve(t)
  const p = peer()
  t.same(await p.call('CLIENT', 'GETNAME'), null)
  t.same(await p.call('CLIENT', 'SETNAME', 'me'), 'OK')
  t.same(await p.call('CLIENT', 'GETNAME'), 'me')
  t.same(await p.call('CLIENT', 'SETNAME', 'a b'), E('ERR Client names cannot contain spaces, newlines or special characters.'))
  t.same(await p.call('CLIENT', 'SETNAME'), E("ERR wrong number of arguments for 'client|setname' command"))
  t.same(await p.call('CLIENT', 'FOO'), E("ERR unknown subcommand 'FOO'. Try CLIENT HELP."))
  const other = peer()
  t.same(await other.call('CLIENT', 'GETNAME'), null, 'names are per connection')
  t.same(await p.call('CONFIG', 'GET', 'save'), ['save', ''])
  t.same(await p.call('CONFIG', 'GET', 'appendonly'), ['appendonly', 'no'])
  t.same(await p.call('CONFIG', 'GET', 'max*'), ['maxmemory', String(64 * 1024 * 1024), 'maxmemory-policy', 'allkeys-lru'])
  const hello = await p.call('HELLO', '2') as unknown[]
  t.same(hello.slice(0, 6), ['server', 'redis', 'version', '7.0.0', 'proto', 2])
  t.same(await p.call('HELLO', '3'), E('NOPROTO unsupported protocol version'))
  t.same(await p.call('HELLO', 'x'), E('ERR Protocol version is not an integer or out of range'))
  t.same(await p.call('COMMAND', 'DOCS'), [])
  t.same(await p.call('COMMAND', 'COUNT'), 57, 'the 50 commands and the 7 of Pub/Sub')
  t.same(((await p.call('COMMAND', 'INFO', 'get')) as unknown[][])[0]!.slice(0, 6), ['get', 2, [], 1, 1, 1])
  await p.call('SET', 'a', '1')
  const info = await p.call('INFO') as string
  t.match(info, /# Server\r\nredis_version:7\.0\.0\r\n/)
  t.match(info, new RegExp(`tcp_port:${port}\r\n`))
  t.match(info, /# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n/)
  t.notMatch(await p.call('INFO', 'keyspace') as string, /# Server/)
  t.same(await p.call('FLUSHDB'), 'OK')
  t.same(await p.call('DBSIZE'), 0)
  t.same(await p.send('*0\r\n\r\n   \r\n' + cmd('PING')), ['PONG'], 'empty commands get no answer')
  t.same(await p.send(cmd('QUIT') + cmd('PING'), 2), ['OK'], 'QUIT: OK, then nothing')
  await p.waitClose()
  t.ok(p.closed)
})

t.test('eviction under the memory limit: least recently used first', async (t) => {
  const { peer, server } = await serve(t, { maxMemoryBytes: 64 * 1024 })
  const p = peer()
  const value = 'x'.repeat(1000)
  await p.call('SET', 'hot', value)
  for (let i = 0; i < 200; i++) {
    await p.call('SET', `k${i}`, value)
    if (i % 10 === 0) await p.call('GET', 'hot') // kept recently used
  }
  t.ok(server.store.usedBytes <= 64 * 1024, `estimate ${server.store.usedBytes} within the limit`)
  t.ok(server.store.stats.evictedKeys > 100, `${server.store.stats.evictedKeys} evicted`)
  t.same(await p.call('GET', 'hot'), value, 'the key in use stays')
  t.same(await p.call('GET', 'k0'), null, 'the oldest went')
  t.same(await p.call('GET', 'k199'), value, 'the newest stays')
  t.match(await p.call('INFO', 'stats') as string, /evicted_keys:\d+/)
})

t.test('replies encode as RESP', async (t) => {
  t.equal(encodeReply([1, null, 'a', Buffer.from('bc'), [-5n]]).toString('latin1'), '*5\r\n:1\r\n$-1\r\n$1\r\na\r\n$2\r\nbc\r\n*1\r\n:-5\r\n')
  const big = Buffer.alloc(100_000, 0x61)
  const encoded = encodeReply(big)
  t.equal(encoded.length, 9 + 100_000 + 2)
  t.equal(encoded.toString('latin1', 0, 10), '$100000\r\na')
})
