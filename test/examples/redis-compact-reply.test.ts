/**
 * `RedisClient.commandCompact` and `RedisArrayReply` (examples/redis/reply-array.ts):
 * an array reply kept as its bytes and one offset per element. Its elements
 * decode as the eager decoder's do (nested arrays, nils, errors inside
 * arrays), whatever the reads the reply came in; decoding makes no object
 * per element; a small reply does not keep its read buffer alive; and
 * against redis-server, compact and eager calls agree.
 */
import t from 'tap'
import { existsSync } from 'node:fs'
import { inspect, isDeepStrictEqual } from 'node:util'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ScanDecoder } from '../../codec/scan-decoder.js'
import type { ScanFraming } from '../../codec/frame-decoder.js'
import { RedisArrayReply, RedisClient, decodeCompact, type CompactReply, type RedisReply } from '../../examples/redis/client.js'
import { ArrayIndex, INDEXED_ARRAY_MIN } from '../../examples/redis/reply-array.js'
import { ReplyScanner, decodeValue, redisClientProtocol } from '../../examples/redis/resp-client.js'
import { realRedis } from '../helpers/real-servers.js'

const REDIS = '/usr/bin/redis-server'
const noRedis = existsSync(REDIS) ? false : `no ${REDIS} (apt-get install redis-server)`
const replyFraming = redisClientProtocol().framing as ScanFraming

/** A compact reply as the eager decoder gives it: every RedisArrayReply turned into an array. */
function plain (value: CompactReply | undefined): unknown {
  return value instanceof RedisArrayReply ? value.toArray().map(plain) : value
}

/** The eager decoding, errors as their text and name (RpcError objects differ by stack). */
function comparable (value: unknown): unknown {
  if (value instanceof RpcError) return { error: value.message, code: value.code, name: value.remote?.name }
  if (Array.isArray(value)) return value.map(comparable)
  return value
}

/** Feeds `stream` to a ScanDecoder cut at `cuts`; each frame decoded compact (from the decoder's own buffer) and eagerly. */
function decodeCut (stream: Buffer, cuts: number[]): Array<{ compact: CompactReply, eager: RedisReply }> {
  const decoder = new ScanDecoder(replyFraming, 1024 * 1024)
  const out: Array<{ compact: CompactReply, eager: RedisReply }> = []
  let at = 0
  for (const cut of [...cuts, stream.length]) {
    // A fresh buffer per read, as a socket gives them.
    const chunk = Buffer.from(stream.subarray(at, cut))
    at = cut
    const error = decoder.pushRanges(chunk, (buf, start, end) => {
      out.push({ compact: decodeCompact(buf, start, end), eager: decodeValue(buf, start)[0] })
    })
    if (error !== null) throw error
  }
  return out
}

const REPLIES = [
  '+OK\r\n', '-ERR no\r\n', ':42\r\n', ':-7\r\n', ':9223372036854775807\r\n', '$3\r\nabc\r\n', '$0\r\n\r\n', '$-1\r\n', '*-1\r\n', '*0\r\n',
  '*3\r\n$1\r\na\r\n*2\r\n:1\r\n*0\r\n+x\r\n',
  '*2\r\n*1\r\n*1\r\n$2\r\nhi\r\n-E\r\n',
  '*6\r\n$-1\r\n*-1\r\n-WRONGTYPE Operation against a key\r\n$4\r\n\r\n\r\n\r\n:5\r\n*2\r\n$-1\r\n-ERR inside\r\n',
  '*4\r\n$2\r\nab\r\n$-1\r\n$13\r\n\x00\xff\r\n\r\n$*:+-\x01x\r\n:0\r\n'
]

t.test('compact replies decode as the eager decoder does, the stream cut at every byte', async (t) => {
  const stream = Buffer.from(REPLIES.join(''), 'latin1')
  const expected = REPLIES.map((r) => comparable(decodeValue(Buffer.from(r, 'latin1'), 0)[0]))
  let cuts = 0
  for (let k = 1; k < stream.length; k++) {
    const frames = decodeCut(stream, [k])
    const got = frames.map((f) => comparable(plain(f.compact)))
    if (!isDeepStrictEqual(got, expected)) t.fail(`cut at ${k}: ${inspect(got)}`)
    cuts++
  }
  // And in reads of one byte each.
  const bytewise = decodeCut(stream, Array.from({ length: stream.length - 1 }, (_, i) => i + 1))
  t.same(bytewise.map((f) => comparable(plain(f.compact))), expected, 'reads of one byte')
  t.same(bytewise.map((f) => comparable(f.eager)), expected, 'the eager decoder agrees on the same frames')
  t.equal(cuts, stream.length - 1, `${cuts} cuts, each giving the same values`)
})

t.test('a RedisArrayReply: at, bytes, string, iteration, nesting, out of range', async (t) => {
  const compact = decodeCut(Buffer.from('*7\r\n$5\r\nhello\r\n$-1\r\n+fine\r\n:12\r\n-ERR bad thing\r\n*2\r\n$1\r\nx\r\n*-1\r\n$4\r\n\xc3\xa9t\xc3\r\n', 'latin1'), [])[0]!.compact
  t.ok(compact instanceof RedisArrayReply)
  const a = compact as RedisArrayReply
  t.equal(a.length, 7)
  t.same(a.at(0), Buffer.from('hello'))
  t.equal(a.at(1), null)
  t.equal(a.at(2), 'fine')
  t.equal(a.at(3), 12)
  const error = a.at(4)
  t.ok(error instanceof RpcError)
  t.equal((error as RpcError).code, ErrorCode.REMOTE)
  t.equal((error as RpcError).remote?.name, 'ERR')
  t.equal((error as RpcError).message, 'ERR bad thing')
  const nested = a.at(5)
  t.ok(nested instanceof RedisArrayReply, 'a nested array is compact too')
  t.equal((nested as RedisArrayReply).length, 2)
  t.equal((nested as RedisArrayReply).string(0), 'x')
  t.equal((nested as RedisArrayReply).at(1), null)
  t.same(a.bytes(0), Buffer.from('hello'))
  t.equal(a.bytes(1), null, 'a nil bulk')
  t.equal(a.bytes(2), undefined, 'not a bulk string')
  t.equal(a.string(0), 'hello')
  t.equal(a.string(1), null)
  t.equal(a.string(2), 'fine', 'a simple string')
  t.equal(a.string(3), undefined, 'an integer is not a string')
  t.equal(a.string(6, 'latin1'), '\xc3\xa9t\xc3')
  for (const i of [-1, 7, 1.5, Number.NaN]) {
    t.equal(a.at(i), undefined, `at(${i})`)
    t.equal(a.bytes(i), undefined, `bytes(${i})`)
    t.equal(a.string(i), undefined, `string(${i})`)
  }
  t.same([...a].map(plain), a.toArray().map(plain), 'iteration gives what toArray gives')
  // at() copies; bytes() is a view of the reply's bytes.
  const copy = a.at(0) as Buffer
  const view = a.bytes(0)!
  view[0] = 0x48
  t.equal(a.string(0), 'Hello', 'bytes(i) is a view')
  t.equal(copy.toString(), 'hello', 'at(i) is a copy')
})

t.test('a small reply is copied out of its read buffer; a reply that is most of its buffer is kept as a view', async (t) => {
  const read = Buffer.alloc(64 * 1024)
  const small = Buffer.from('*2\r\n$1\r\na\r\n$1\r\nb\r\n', 'latin1')
  small.copy(read, 100)
  const a = decodeCompact(read, 100, 100 + small.length) as RedisArrayReply
  t.not(a.bytes(0)!.buffer, read.buffer, 'copied: the 64 KiB read is not kept alive')
  t.equal(a.string(1), 'b')
  const own = Buffer.from(small)
  const b = decodeCompact(own, 0, own.length) as RedisArrayReply
  t.equal(b.bytes(0)!.buffer, own.buffer, 'not copied: the frame is its buffer')
})

function lrangeReply (n: number): Buffer {
  const parts = [`*${n}\r\n`]
  for (let i = 0; i < n; i++) parts.push(`$${String(i).length}\r\n${i}\r\n`)
  return Buffer.from(parts.join(''), 'latin1')
}

/** Counts Buffer allocations, views, copies, searches and conversions while `fn` runs. */
function counting<T> (fn: () => T): { result: T, calls: number } {
  type Fn = (...args: unknown[]) => unknown
  const statics = Buffer as unknown as Record<string, Fn>
  const proto = Buffer.prototype as unknown as Record<string, Fn>
  const names = { statics: ['allocUnsafe', 'allocUnsafeSlow', 'alloc', 'from'], proto: ['subarray', 'slice', 'toString', 'indexOf', 'copy'] }
  const saved = new Map<string, Fn>()
  let calls = 0
  for (const name of names.statics) {
    const original = statics[name]!
    saved.set(`s.${name}`, original)
    statics[name] = function (this: unknown, ...args: unknown[]) { calls++; return original.apply(this, args) }
  }
  for (const name of names.proto) {
    const original = proto[name]!
    saved.set(`p.${name}`, original)
    proto[name] = function (this: unknown, ...args: unknown[]) { calls++; return original.apply(this, args) }
  }
  try {
    return { result: fn(), calls }
  } finally {
    for (const name of names.statics) statics[name] = saved.get(`s.${name}`)!
    for (const name of names.proto) proto[name] = saved.get(`p.${name}`)!
  }
}

t.test('decoding a large array compact makes no object per element, and the scanner looks at each byte once', async (t) => {
  const n = 100_000
  const reply = lrangeReply(n)
  const scanner = new ReplyScanner()
  const decoder = new ScanDecoder({ scanner: () => scanner }, 16 * 1024 * 1024)
  let compact: CompactReply = null
  let eagerCalls = 0
  let compactCalls = 0
  // In reads of 1,000 bytes: the frame is assembled in the decoder's own buffer.
  for (let at = 0; at < reply.length; at += 1000) {
    const error = decoder.pushRanges(Buffer.from(reply.subarray(at, at + 1000)), (buf, start, end) => {
      compactCalls = counting(() => { compact = decodeCompact(buf, start, end) }).calls
      eagerCalls = counting(() => decodeValue(buf, start)).calls
    })
    if (error !== null) throw error
  }
  t.ok(scanner.examined <= reply.length, `${scanner.examined} bytes examined for ${reply.length}`)
  t.ok(eagerCalls >= n, `the eager decoder: ${eagerCalls} Buffer calls (one per element at least: the counter works)`)
  t.ok(compactCalls <= 2, `compact: ${compactCalls} Buffer calls for ${n} elements`)
  const a = compact as unknown as RedisArrayReply
  t.equal(a.length, n)
  t.equal(a.string(n - 1), String(n - 1))
  t.equal(a.string(12345), '12345')
})

/** A top-level array of `n` elements cycling through every kind of value, and where each element starts. */
function mixedArray (n: number): { reply: Buffer, starts: number[] } {
  const kinds = ['$5\r\nhello\r\n', '$-1\r\n', '+fine\r\n', ':12\r\n', '-ERR bad thing\r\n', '*2\r\n$1\r\nx\r\n*-1\r\n', '$0\r\n\r\n',
    '$12\r\n\r\n$3\r\n:1\r\n*0\r\n', '*-1\r\n', ':-9223372036854775808\r\n', '$1\r\n\r\r\n', '*0\r\n']
  const head = `*${n}\r\n`
  const parts = [head]
  const starts: number[] = []
  let at = head.length
  for (let i = 0; i < n; i++) {
    const part = kinds[i % kinds.length]!
    starts.push(at)
    parts.push(part)
    at += part.length
  }
  starts.push(at)
  return { reply: Buffer.from(parts.join(''), 'latin1'), starts }
}

t.test('a large array: the element starts the scanner records are where the elements start, however the reply is split, and the compact decoding takes them', async (t) => {
  const n = 3 * INDEXED_ARRAY_MIN
  const { reply, starts } = mixedArray(n)
  const expected = comparable(decodeValue(reply, 0)[0])
  for (const step of [1, 2, 7, 100, 4096, 65536, reply.length]) {
    const index = new ArrayIndex()
    const decoder = new ScanDecoder({ scanner: () => new ReplyScanner(index) }, 16 * 1024 * 1024)
    const frames: Array<{ recorded: number[] | null, value: unknown, left: Uint32Array | null }> = []
    for (let at = 0; at < reply.length; at += step) {
      const error = decoder.pushRanges(Buffer.from(reply.subarray(at, at + step)), (buf, start, end) => {
        const recorded = index.starts === null ? null : [...index.starts]
        const value = comparable(plain(decodeCompact(buf, start, end, index)))
        frames.push({ recorded, value, left: index.starts })
      })
      if (error !== null) throw error
    }
    t.equal(frames.length, 1, `reads of ${step}: one frame`)
    t.same(frames[0]!.recorded, starts, `reads of ${step}: ${n} starts and the end recorded, each where its element starts`)
    t.same(frames[0]!.value, expected, `reads of ${step}: decoded as the eager decoder does`)
    t.equal(frames[0]!.left, null, `reads of ${step}: the compact decoding took the index (nothing kept alive)`)
  }
})

t.test('an index that is not the reply\'s is not used; small arrays and other replies record none', async (t) => {
  const n = INDEXED_ARRAY_MIN + 5
  const { reply } = mixedArray(n)
  const expected = comparable(decodeValue(reply, 0)[0])
  // Of another reply: the same count, another size; the same size, another count.
  for (const [count, bytes] of [[n, reply.length + 1], [n + 1, reply.length]] as const) {
    const index = new ArrayIndex()
    index.starts = new Uint32Array(count + 1)
    index.count = count
    index.bytes = bytes
    t.same(comparable(plain(decodeCompact(reply, 0, reply.length, index))), expected, `count ${count}, ${bytes} bytes: not used`)
    t.equal(index.starts, null, 'and let go of')
  }
  const index = new ArrayIndex()
  const scanner = new ReplyScanner(index)
  const small = mixedArray(INDEXED_ARRAY_MIN - 1).reply
  for (const other of [small, Buffer.from('$5\r\nhello\r\n'), Buffer.from(':1\r\n'), Buffer.from('*-1\r\n')]) {
    t.equal(scanner.scan(other, 0, other.length), other.length)
    t.equal(index.starts, null, `${JSON.stringify(other.subarray(0, 8).toString('latin1'))}...: no index`)
  }
  t.equal(scanner.scan(reply, 0, reply.length), reply.length)
  t.equal(index.starts?.length, n + 1, `an array of ${n}: indexed`)
})

t.test('the index grows with the elements that arrived, not with the count a header claims', async (t) => {
  const scanner = new ReplyScanner(new ArrayIndex())
  const claimed = 10_000_000
  const element = '$5\r\nhello\r\n'
  const first = Buffer.from(`*${claimed}\r\n${element.repeat(100)}`, 'latin1')
  t.equal(scanner.scan(first, 0, first.length), -(first.indexOf('\n') + 1 + 3 * claimed), 'not whole: at least 3 bytes an element')
  t.ok(scanner.indexEntries <= 4096, `${scanner.indexEntries} entries for 100 elements (${claimed} claimed)`)
  // 50,000 more elements, the reply still open: the index follows them, within twice their count.
  const more = Buffer.from(element.repeat(50_000), 'latin1')
  const whole = Buffer.concat([first, more])
  t.equal(scanner.scan(whole, 0, whole.length), -(first.indexOf('\n') + 1 + 3 * claimed), 'still not whole')
  t.ok(scanner.indexEntries >= 50_100 && scanner.indexEntries <= 2 * 50_100 + 4096, `${scanner.indexEntries} entries for 50,100 elements`)
  scanner.reset()
  t.equal(scanner.indexEntries, 0, 'a reset lets it go')
})

t.test('RedisClient.commandCompact against redis-server: what command gives, arrays compact', { skip: noRedis }, async (t) => {
  const { port } = await realRedis(t, REDIS)
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}`, logger: null })
  t.teardown(() => redis.close())
  const values = Array.from({ length: 3000 }, (_, i) => i % 7 === 0 ? Buffer.from([i & 0xff, 0x0d, 0x0a, 0x24]) : `v${i}`)
  await redis.command('RPUSH', 'list', ...values)
  const eager = await redis.command('LRANGE', 'list', 0, -1) as Buffer[]
  const compact = await redis.commandCompact('LRANGE', 'list', 0, -1)
  t.ok(compact instanceof RedisArrayReply)
  t.same(plain(compact), eager, '3,000 elements, binary ones included, alike')
  t.same(await redis.commandCompact('LRANGE', 'none', 0, -1) instanceof RedisArrayReply, true)
  t.equal((await redis.commandCompact('LRANGE', 'none', 0, -1) as RedisArrayReply).length, 0, 'an empty array')
  t.equal(await redis.commandCompact('PING'), 'PONG', 'a simple string as it is')
  t.equal(await redis.commandCompact('GET', 'missing'), null, 'a nil bulk')
  t.equal(await redis.commandCompact('LLEN', 'list'), 3000, 'an integer')
  await redis.command('SET', 's', 'text')
  await redis.command('MULTI')
  await redis.command('INCR', 's')
  await redis.command('GET', 's')
  const exec = await redis.commandCompact('EXEC') as RedisArrayReply
  t.equal(exec.length, 2)
  t.ok(exec.at(0) instanceof RpcError, 'an error inside EXEC\'s array is an RpcError element')
  t.equal(exec.string(1), 'text')
  const refused = await redis.commandCompact('LRANGE', 's', 0, -1).then(() => 'answered', (err: RpcError) => err.remote?.name)
  t.equal(refused, 'WRONGTYPE', 'an error reply rejects, as command does')
})
