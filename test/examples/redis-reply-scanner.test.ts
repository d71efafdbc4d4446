/**
 * The RESP reply scanner of `RedisClient` (examples/redis/resp-client.ts)
 * and the other resumable scanners (codec/framings.ts `lines`, the redis
 * example's request scanner): a frame split over many reads is looked at
 * once in all, never again from its first byte, nor past the bytes that
 * arrived. Then a hostile server trickling a large reply: the call settles
 * at its deadline (FakeClock) and the next call works.
 */
import t from 'tap'
import { createServer, type Socket } from 'node:net'
import { once } from 'node:events'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { ScanDecoder } from '../../codec/scan-decoder.js'
import { lines } from '../../codec/framings.js'
import type { ScanFraming } from '../../codec/frame-decoder.js'
import { ReplyScanner, decodeValue, redisClientProtocol } from '../../examples/redis/resp-client.js'
import { RespScanner } from '../../examples/redis/resp.js'
import { RedisClient } from '../../examples/redis/client.js'
import { FakeClock } from '../../reactor/testing.js'

const replyFraming = redisClientProtocol().framing as ScanFraming

/** The frames `stream` holds, fed to a ScanDecoder in reads of `step` bytes. */
function decode (framing: ScanFraming, stream: Buffer, step: number, maxFrameBytes = 64 * 1024 * 1024): Buffer[] {
  const decoder = new ScanDecoder(framing, maxFrameBytes)
  const out: Buffer[] = []
  for (let at = 0; at < stream.length; at += step) {
    const error = decoder.pushRanges(stream.subarray(at, Math.min(stream.length, at + step)), (buf, start, end) => { out.push(Buffer.from(buf.subarray(start, end))) })
    if (error !== null) throw error
  }
  return out
}

/** Counts the calls to Buffer's searching and converting methods while `fn` runs, and the bytes each search could cover. */
function counting<T> (fn: () => T): { result: T, calls: number, searchable: number } {
  type Method = (this: Buffer, ...args: unknown[]) => unknown
  const proto = Buffer.prototype as unknown as { indexOf: Method, toString: Method }
  const saved = { indexOf: proto.indexOf, toString: proto.toString }
  let calls = 0
  let searchable = 0
  proto.indexOf = function (this: Buffer, ...args: unknown[]) {
    calls++
    const from = typeof args[1] === 'number' ? args[1] : 0
    searchable += Math.max(0, this.length - from)
    return saved.indexOf.apply(this, args)
  }
  proto.toString = function (this: Buffer, ...args: unknown[]) {
    calls++
    return saved.toString.apply(this, args)
  }
  try {
    return { result: fn(), calls, searchable }
  } finally {
    proto.indexOf = saved.indexOf
    proto.toString = saved.toString
  }
}

function lrangeReply (n: number): Buffer {
  const parts = [`*${n}\r\n`]
  for (let i = 0; i < n; i++) parts.push(`$${String(i).length}\r\n${i}\r\n`)
  return Buffer.from(parts.join(''), 'latin1')
}

t.test('replies of every kind, split at every byte, give the same frames and values', async (t) => {
  const replies = ['+OK\r\n', '-ERR no\r\n', ':42\r\n', ':-7\r\n', '$3\r\nabc\r\n', '$0\r\n\r\n', '$-1\r\n', '*-1\r\n', '*0\r\n',
    '*3\r\n$1\r\na\r\n*2\r\n:1\r\n*0\r\n+x\r\n', '*2\r\n*1\r\n*1\r\n$2\r\nhi\r\n-E\r\n', '$4\r\n\r\n\r\n\r\n']
  const stream = Buffer.from(replies.join(''), 'latin1')
  for (const step of [1, 2, 3, 7, stream.length]) {
    const frames = decode(replyFraming, stream, step)
    t.same(frames.map((f) => f.toString('latin1')), replies, `reads of ${step} bytes`)
  }
  const [value] = decodeValue(Buffer.from(replies[9]!, 'latin1'), 0)
  t.same(value, [Buffer.from('a'), [1, []], 'x'])
})

t.test('malformed replies are refused, whole or split', async (t) => {
  for (const bad of ['?x\r\n', '+no cr\n', '$3\r\nabcd\r\n', '$x\r\n', '$-2\r\n', '*1\r\r\n', '$1234567890123456\r\n', '*1\r\n'.repeat(65) + ':1\r\n']) {
    for (const step of [1, 1000]) {
      t.throws(() => decode(replyFraming, Buffer.from(bad, 'latin1'), step), { code: ErrorCode.MALFORMED_FRAME }, `${JSON.stringify(bad.slice(0, 20))} in reads of ${step}`)
    }
  }
  t.same(decode(replyFraming, Buffer.from('*1\r\n'.repeat(64) + ':1\r\n', 'latin1'), 3).length, 1, '64 levels of arrays are fine')
})

t.test('long arrays (bulk string headers read a word at a time): every length, split anywhere, and malformed elements refused', async (t) => {
  // Lengths of one, two and three digits, data holding CR, LF and `$`.
  const data = (n: number): string => Array.from({ length: n }, (_, i) => '\r\n$ab'[i % 5]).join('')
  const elements = [0, 1, 2, 9, 10, 11, 42, 99, 100, 123, 5, 1, 0, 77, 3, 2, 1, 64, 8, 300].map((n) => `$${n}\r\n${data(n)}\r\n`)
  const good = `*${elements.length}\r\n${elements.join('')}`
  const stream = Buffer.from(good + '+after\r\n', 'latin1')
  for (const step of [1, 2, 3, 5, 7, 64, stream.length]) {
    const frames = decode(replyFraming, stream, step)
    t.same(frames.map((f) => f.toString('latin1')), [good, '+after\r\n'], `reads of ${step} bytes`)
  }
  const [value] = decodeValue(Buffer.from(good, 'latin1'), 0)
  t.same((value as Buffer[]).map((b) => b.toString('latin1')), elements.map((e) => e.slice(e.indexOf('\n') + 1, -2)), 'each element\'s data')
  // A malformed element first, in the middle or last of 20 good ones.
  for (const bad of ['$1\r\nab\r\n', '$12\r\nabcdefghijkl\rX', '$1\rXa\r\n', '$12\rXabcdefghijkl\r\n', '$1x\r\na\r\n', '$:1\r\n', '$5\r\nabcde\n\r', '$123\r\n' + 'a'.repeat(123) + 'XY']) {
    for (const at of [0, 10, 20]) {
      const list = Array.from({ length: 20 }, (_, i) => elements[i]!)
      list.splice(at, 0, bad)
      const reply = Buffer.from(`*${list.length}\r\n${list.join('')}`, 'latin1')
      for (const step of [1, 5, reply.length]) {
        t.throws(() => decode(replyFraming, reply, step), { code: ErrorCode.MALFORMED_FRAME }, `${JSON.stringify(bad.slice(0, 16))} at ${at}, reads of ${step}`)
      }
    }
  }
})

t.test('a reply of many elements split into many reads is scanned in linear work', async (t) => {
  const n = 4000
  const reply = lrangeReply(n)
  const scanner = new ReplyScanner()
  const { result: frames, calls } = counting(() => decode({ scanner: () => scanner }, reply, 16))
  t.equal(frames.length, 1)
  t.equal(frames[0]!.length, reply.length)
  // Each byte once (bulk data skipped), however many reads.
  t.ok(scanner.examined <= reply.length, `${scanner.examined} bytes examined for ${reply.length}`)
  // No search or conversion per element, let alone per element per read (the quadratic scanner made ~n²/2).
  t.ok(calls <= 10, `${calls} searches and conversions`)
  const [value] = decodeValue(frames[0]!, 0)
  t.equal((value as Buffer[]).length, n)
  t.equal((value as Buffer[])[n - 1]!.toString(), String(n - 1))
})

t.test('an array header claiming more than the largest reply is refused before its elements arrive; a large reply is copied once', async (t) => {
  // Each element is at least 3 bytes: 2^31 of them cannot fit in 64 MiB.
  const decoder = new ScanDecoder(replyFraming, 64 * 1024 * 1024)
  const error = decoder.pushRanges(Buffer.from('*2147483648\r\n$6\r\n', 'latin1'), () => { t.fail('no frame') })
  t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
  t.equal(decoder.heldBytes, 0)
  // A claim within the limit holds only what arrived.
  const liar = new ScanDecoder(replyFraming, 64 * 1024 * 1024)
  t.equal(liar.pushRanges(Buffer.from('*20000000\r\n$6\r\nabcdef\r\n$6\r\nab', 'latin1'), () => { t.fail('no frame') }), null)
  t.ok(liar.heldBytes <= 4096, `held ${liar.heldBytes} bytes for a 60 MB claim`)
  // A real one in reads of 64 KiB (each its own memory, as a socket's): one frame, in a buffer of exactly its size.
  const reply = lrangeReply(200_000)
  const whole = new ScanDecoder(replyFraming, 64 * 1024 * 1024)
  const frames: Array<{ buf: Buffer, start: number, end: number }> = []
  for (let at = 0; at < reply.length; at += 65536) {
    t.equal(whole.pushRanges(Buffer.from(reply.subarray(at, at + 65536)), (buf, start, end) => { frames.push({ buf, start, end }) }), null)
  }
  t.equal(frames.length, 1)
  t.equal(frames[0]!.buf.length, reply.length, 'a buffer of the reply\'s size')
  t.ok(frames[0]!.buf.equals(reply), 'the reply\'s bytes')
})

t.test('a long line trickled in small reads is searched only within the bytes that arrived', async (t) => {
  const length = 512 * 1024
  const simple = Buffer.concat([Buffer.from('+'), Buffer.alloc(length, 0x61), Buffer.from('\r\n')])
  const reply = counting(() => decode(replyFraming, simple, 1000))
  t.equal(reply.result.length, 1)
  t.ok(reply.searchable <= 2 * simple.length, `reply scanner: ${reply.searchable} bytes searchable for a ${simple.length}-byte line`)

  const line = Buffer.concat([Buffer.alloc(length, 0x61), Buffer.from('\n')])
  const framed = counting(() => decode(lines({ max: 1024 * 1024 }), line, 1000))
  t.equal(framed.result.length, 1)
  t.ok(framed.searchable <= 2 * line.length, `lines: ${framed.searchable} bytes searchable for a ${line.length}-byte line`)

  const crlf = Buffer.concat([Buffer.alloc(length, 0x61), Buffer.from('\r\n')])
  const framedCrlf = counting(() => decode(lines({ max: 1024 * 1024, delimiter: '\r\n' }), crlf, 1000))
  t.equal(framedCrlf.result.length, 1)
  t.ok(framedCrlf.searchable <= 2 * crlf.length, `lines (CRLF): ${framedCrlf.searchable} bytes searchable for a ${crlf.length}-byte line`)

  // The request scanner's inline commands (at most 64 KiB each).
  const inline = Buffer.concat([Buffer.from('PING '), Buffer.alloc(60 * 1024, 0x61), Buffer.from('\r\n')])
  const request = counting(() => decode({ scanner: () => new RespScanner(1024 * 1024) }, inline, 100))
  t.equal(request.result.length, 1)
  t.ok(request.searchable <= 2 * inline.length, `request scanner: ${request.searchable} bytes searchable for a ${inline.length}-byte inline command`)
})

t.test('a hostile server trickling a large reply: the call settles at its deadline, the connection closes, the next call works', async (t) => {
  const sockets: Socket[] = []
  const closed: number[] = []
  const timers = new Set<NodeJS.Timeout>()
  const server = createServer((socket) => {
    const index = sockets.length
    sockets.push(socket)
    socket.on('close', () => {
      closed.push(index)
      for (const timer of timers) clearInterval(timer)
    })
    socket.on('error', () => {})
    socket.on('data', (chunk) => {
      const text = chunk.toString('latin1')
      if (text.includes('PING')) socket.write('+PONG\r\n')
      if (text.includes('LRANGE')) {
        // A reply of 10^7 elements, one element per millisecond.
        socket.write('*10000000\r\n')
        let i = 0
        const timer = setInterval(() => { socket.write(`$1\r\n${i++ % 10}\r\n`) }, 1)
        timers.add(timer)
      }
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const port = (server.address() as { port: number }).port
  const clock = new FakeClock()
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}`, clock, retry: false, logger: null })
  t.teardown(async () => {
    for (const timer of timers) clearInterval(timer)
    await redis.close()
    for (const socket of sockets) socket.destroy()
    server.close()
  })

  const call = redis.commandWith(['LRANGE', 'l', 0, -1], { timeoutMs: 1000 })
  const failed = call.then(() => 'answered', (err: RpcError) => err.code)
  // Let part of the reply arrive: the client holds a partial frame.
  await new Promise((resolve) => setTimeout(resolve, 50))
  clock.advance(1000)
  t.equal(await failed, ErrorCode.DEADLINE_EXCEEDED, 'settled at its deadline')
  const ping = redis.commandWith(['PING'], { timeoutMs: 0 })
  const answered = await Promise.race([ping, new Promise((resolve) => setTimeout(resolve, 15_000, 'no answer in 15 s'))])
  t.equal(answered, 'PONG', 'the next call is answered')
  t.equal(sockets.length, 2, 'on a new connection')
  const deadline = Date.now() + 15_000
  while (!closed.includes(0) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10))
  t.same(closed, [0], 'the connection receiving the overdue reply was closed')
})
