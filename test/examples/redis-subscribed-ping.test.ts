// A subscribed connection's PING answers count against the pubsub output
// limit (the server's push output limit), as Redis counts all of a
// subscriber's output: one that pipelines PING and never reads is closed
// once its unsent bytes pass the limit, instead of merely not being read
// any more; one that reads gets every answer and stays open. The answers'
// bytes and order against redis-server are in redis-pubsub.test.ts.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { redisServer } from '../../examples/redis/main.js'
import { realRedis } from '../helpers/real-servers.js'
import { encodeCommand } from '../helpers/resp.js'

const REDIS = '/usr/bin/redis-server'
const noRedis = existsSync(REDIS) ? false : `no ${REDIS} (apt-get install redis-server)`

// Past what one read's answers take (a read takes at most a few hundred KiB), so only a peer that does not read passes it.
const LIMIT_BYTES = 2 * 1024 * 1024
const ARGUMENT = 'p'.repeat(1024)
const BATCH = 64
// The answers the loop may ask for at most: far past the limit plus what the two kernels' buffers take on loopback.
const MAX_BATCHES = 1000

/** A raw connection that keeps the first KiB it receives and counts the rest. */
async function open (t: Test, port: number): Promise<{ socket: Socket, head: () => Buffer, count: () => number, closed: () => boolean }> {
  const socket = connect(port, '127.0.0.1')
  t.teardown(() => { socket.destroy() })
  socket.on('error', () => {})
  let head = Buffer.alloc(0)
  let count = 0
  let closed = false
  socket.on('data', (chunk: Buffer) => {
    if (head.length < 4096) head = Buffer.concat([head, chunk.subarray(0, 4096 - head.length)])
    count += chunk.length
  })
  socket.on('close', () => { closed = true })
  await once(socket, 'connect')
  return { socket, head: () => head, count: () => count, closed: () => closed }
}

/** Writes `bytes` and waits until the socket takes more (or closes, or 100 ms pass: a server that stopped reading never drains it). */
async function write (socket: Socket, bytes: Buffer): Promise<void> {
  if (socket.write(bytes)) return
  await new Promise<void>((resolve) => {
    const done = (): void => { clearTimeout(timer); socket.off('drain', done); socket.off('close', done); resolve() }
    const timer = setTimeout(done, 100)
    socket.once('drain', done)
    socket.once('close', done)
  })
}

async function until (predicate: () => boolean): Promise<boolean> {
  for (let i = 0; i < 1000 && !predicate(); i++) await new Promise((resolve) => setTimeout(resolve, 5))
  return predicate()
}

const SUBSCRIBED = Buffer.from('*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n', 'latin1')
const PONG = Buffer.from(`*2\r\n$4\r\npong\r\n$${ARGUMENT.length}\r\n${ARGUMENT}\r\n`, 'latin1')
const PINGS = Buffer.concat(Array.from({ length: BATCH }, () => encodeCommand(['PING', ARGUMENT])))

t.test('a subscriber pipelining PING without reading is closed at the pubsub limit; a reading one is not', async (t) => {
  const server = redisServer({ sweepIntervalMs: 0, pubsubOutputLimit: { hardBytes: LIMIT_BYTES, softBytes: 0 } })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))

  const reader = await open(t, port)
  reader.socket.write(encodeCommand(['SUBSCRIBE', 'c']))
  t.ok(await until(() => reader.count() >= SUBSCRIBED.length), 'the reader subscribed')
  t.same(reader.head(), SUBSCRIBED)
  const batches = 200
  // A reader keeps a few batches in flight (256 KiB of answers), well under the limit, as a pipelining client that reads does.
  for (let i = 0; i < batches; i++) {
    await until(() => reader.count() >= SUBSCRIBED.length + (i - 4) * BATCH * PONG.length || reader.closed())
    await write(reader.socket, PINGS)
  }
  const wanted = SUBSCRIBED.length + batches * BATCH * PONG.length
  t.ok(await until(() => reader.count() >= wanted || reader.closed()), 'the reader got its answers')
  t.equal(reader.closed(), false, 'a subscriber that reads stays open')
  t.equal(reader.count(), wanted, `all ${batches * BATCH} answers`)
  t.same(reader.head().subarray(SUBSCRIBED.length, SUBSCRIBED.length + PONG.length), PONG, 'PING in subscribed mode answers [pong, argument]')
  t.equal(server.stats().pushHardLimitClosed, 0)

  const sleeper = await open(t, port)
  sleeper.socket.write(encodeCommand(['SUBSCRIBE', 'c']))
  t.ok(await until(() => sleeper.count() >= SUBSCRIBED.length), 'the non-reader subscribed')
  sleeper.socket.pause()
  let sent = 0
  while (sent < MAX_BATCHES && !sleeper.closed() && server.stats().pushHardLimitClosed === 0) {
    await write(sleeper.socket, PINGS)
    sent++
  }
  t.ok(await until(() => server.stats().pushHardLimitClosed === 1), `closed by the hard limit after ${sent} batches of ${BATCH} PINGs`)
  t.equal(await until(() => server.pubsub.subscribers('c') === 1), true, 'its subscription went with it; the reader\'s stays')
  sleeper.socket.resume()
  t.ok(await until(() => sleeper.closed()), 'the non-reader sees the close')
  t.equal(reader.closed(), false, 'the reader is still open')
})

// PING's answer goes out as a push: pipelined between other subscribed-mode commands it keeps its place, byte for byte as redis-server's.
t.test('pipelined PINGs in subscribed mode keep their order among the other answers, as redis-server sends them', { skip: noRedis }, async (t) => {
  const script = Buffer.concat([
    ['SUBSCRIBE', 'a', 'b'], ['PING'], ['PSUBSCRIBE', 'p*'], ['PING', 'x'], ['GET', 'k'], ['UNSUBSCRIBE', 'nope'], ['PING', 'y'],
    ['PUNSUBSCRIBE'], ['UNSUBSCRIBE', 'a', 'b'], ['PING']
  ].map(args => encodeCommand(args)))
  const transcript = async (port: number): Promise<string> => {
    const peer = await open(t, port)
    peer.socket.write(script)
    // Ten answers, the last (PING out of subscribed mode) +PONG.
    await until(() => peer.head().toString('latin1').endsWith('+PONG\r\n'))
    return peer.head().toString('latin1')
  }
  const { port: realPort } = await realRedis(t, REDIS)
  const server = redisServer({ sweepIntervalMs: 0 })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const fromRedis = await transcript(realPort)
  t.match(fromRedis, /^\*3\r\n\$9\r\nsubscribe/, 'redis-server answered')
  t.equal(await transcript(port), fromRedis, 'the same bytes in the same order')
})
