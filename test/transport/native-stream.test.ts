/**
 * The framed connection over the native transport (epoll and io_uring,
 * transport/native/) on loopback, with a node:net peer: frames split at
 * every byte, a large write to a peer that does not read (the kernel takes
 * part, the rest waits for writability, and arrives whole and in order),
 * pause and resume, half-close after the flush, reset, and the peer's
 * close. Skipped, with the reason, where the addon is not built.
 */
import t from 'tap'
import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { FramedConnection } from '../../transport/framed-connection.js'
import { SLOT_MASK, type NativeReactor, type NativeListener } from '../../transport/native/reactor.js'
import type { NativeStream } from '../../transport/native/native-stream.js'
import { nativeBackends } from '../helpers/native.js'

function frame (body: string | Buffer): Buffer {
  const bytes = typeof body === 'string' ? Buffer.from(body, 'latin1') : body
  const out = Buffer.alloc(4 + bytes.length)
  out.writeUInt32BE(bytes.length, 0)
  bytes.copy(out, 4)
  return out
}

interface Pair {
  client: Socket
  connection: FramedConnection
  stream: NativeStream
  frames: string[]
  closes: Array<RpcError | undefined>
  listener: NativeListener
  /** Every stream the listener accepted (the first is `stream`). */
  accepted: NativeStream[]
}

/** A native listener, one node:net client, and the server side's framed connection. */
async function pair (reactor: NativeReactor, onFrame?: (body: string, connection: FramedConnection) => void): Promise<Pair> {
  let first!: (stream: NativeStream) => void
  const streamP = new Promise<NativeStream>((resolve) => { first = resolve })
  const accepted: NativeStream[] = []
  const listener = await reactor.listen(0, '127.0.0.1', {}, { onStream: (s) => { accepted.push(s); first(s) }, onAcceptError: () => {} })
  const client = connect(listener.address.port, '127.0.0.1')
  await once(client, 'connect')
  const stream = await streamP
  const connection = new FramedConnection(stream, { framing: krpcFraming, readPath: 'onread' })
  const frames: string[] = []
  const closes: Array<RpcError | undefined> = []
  connection.attach({
    onFrame: (buf, start, end) => {
      const body = buf.toString('latin1', start + 4, end)
      frames.push(body)
      onFrame?.(body, connection)
      return true
    },
    onClose: (error) => { closes.push(error) }
  })
  return { client, connection, stream, frames, closes, listener, accepted }
}

async function until (check: () => boolean, what: string, turns = 2000): Promise<void> {
  for (let i = 0; i < turns; i++) {
    if (check()) return
    await new Promise((resolve) => setTimeout(resolve, 2))
  }
  throw new Error(`timed out waiting for ${what}`)
}

function done (p: Pair): void {
  p.client.destroy()
  p.connection.destroy()
  for (const s of p.accepted) s.close()
  p.listener.close()
}

t.test('the streams\' table splits an id as the addon makes it: slot bits, then generation', async (t) => {
  const header = readFileSync(new URL('../../transport/native/nyala.h', import.meta.url), 'latin1')
  const bits = Number(/#define SLOT_BITS (\d+)/.exec(header)?.[1])
  t.equal(SLOT_MASK, (1 << bits) - 1, `SLOT_MASK covers nyala.h's ${bits} slot bits`)
})

for (const { backend, reactor, skip } of nativeBackends()) {
  t.test(`${backend}: the native transport`, { skip }, async (t) => {
    const r = reactor!

    t.test('frames written a byte at a time arrive whole and in order; answers go back', async (t) => {
      const p = await pair(r, (body, connection) => { connection.send({ slices: [frame(`re:${body}`)], bytes: body.length + 7 }) })
      const bodies = ['a', 'hello', 'x'.repeat(300), 'end']
      const wire = Buffer.concat(bodies.map(frame))
      const received: Buffer[] = []
      p.client.on('data', (chunk: Buffer) => received.push(chunk))
      for (let i = 0; i < wire.length; i++) {
        p.client.write(wire.subarray(i, i + 1))
        if (i % 16 === 0) await new Promise((resolve) => setImmediate(resolve))
      }
      await until(() => p.frames.length === bodies.length, 'the frames')
      t.same(p.frames, bodies)
      const answers = Buffer.concat(bodies.map((b) => frame(`re:${b}`)))
      await until(() => Buffer.concat(received).length >= answers.length, 'the answers')
      t.ok(Buffer.concat(received).equals(answers), 'every answer, in order')
      t.same(p.closes, [])
      done(p)
    })

    t.test('writeRange sends a range of a buffer, write and writev whole buffers, in order', async (t) => {
      const p = await pair(r)
      const received: Buffer[] = []
      p.client.on('data', (chunk: Buffer) => received.push(chunk))
      const buf = Buffer.from('0123456789abcdef')
      // io_uring has one send in flight a connection: what follows it waits in the stream (false) and goes after it.
      t.equal(p.stream.writeRange(buf, 3, 7), true)
      p.stream.write(Buffer.from('|whole|'))
      p.stream.writeRange(buf, 10, 16)
      p.stream.writev([Buffer.from('x'), Buffer.from('yz')])
      p.stream.writeRange(buf, 5, 5)
      const want = '3456|whole|abcdefxyz'
      await until(() => Buffer.concat(received).length >= want.length, 'the bytes')
      t.equal(Buffer.concat(received).toString('latin1'), want)
      await until(() => p.stream.writableLength === 0, 'the stream to hold nothing')
      t.equal(p.stream.bytesWritten, want.length)
      t.same(p.closes, [], 'no send was refused')
      // Sent alone, with nothing in flight: each goes at once.
      await new Promise((resolve) => setTimeout(resolve, 20))
      t.equal(p.stream.write(Buffer.from('!')), true, 'a whole buffer')
      await until(() => Buffer.concat(received).length > want.length, 'the last byte')
      t.equal(Buffer.concat(received).toString('latin1'), want + '!')
      done(p)
    })

    t.test('a large write to a peer that does not read: the rest waits for writability, then arrives whole', async (t) => {
      const p = await pair(r)
      p.client.pause()
      const big = Buffer.alloc(8 << 20)
      for (let i = 0; i < big.length; i++) big[i] = i % 251
      let drains = 0
      p.connection.onDrain = () => { drains++ }
      p.connection.send({ slices: [frame(big)], bytes: big.length + 4 })
      await until(() => p.connection.isBackedUp, 'the queue to back up')
      t.ok(p.stream.writableLength > 0, 'the stream holds what the kernel refused')
      t.ok(p.stream.writeQueueBytes > 0, 'and counts it as not taken')
      const received: Buffer[] = []
      p.client.on('data', (chunk: Buffer) => received.push(chunk))
      p.client.resume()
      await until(() => received.reduce((n, c) => n + c.length, 0) >= big.length + 4, 'the whole write', 5000)
      const all = Buffer.concat(received)
      t.equal(all.readUInt32BE(0), big.length)
      t.ok(all.subarray(4).equals(big), 'every byte, in order')
      t.ok(drains > 0, 'the connection heard the stream turn writable')
      t.equal(p.stream.writableLength, 0)
      done(p)
    })

    t.test('paused, nothing is delivered; resumed, everything is', async (t) => {
      const p = await pair(r)
      p.connection.pauseReading()
      p.client.write(Buffer.concat([frame('one'), frame('two')]))
      await new Promise((resolve) => setTimeout(resolve, 50))
      t.same(p.frames, [], 'no frame while paused')
      p.connection.resumeReading()
      await until(() => p.frames.length === 2, 'the frames')
      t.same(p.frames, ['one', 'two'])
      done(p)
    })

    t.test('half-close: the queued answer goes out, then FIN', async (t) => {
      const p = await pair(r)
      const received: Buffer[] = []
      p.client.on('data', (chunk: Buffer) => received.push(chunk))
      const ended = once(p.client, 'end')
      p.connection.send({ slices: [frame('bye')], bytes: 7 })
      p.connection.endAfterFlush()
      await ended
      t.ok(Buffer.concat(received).equals(frame('bye')))
      await until(() => p.closes.length === 1, 'the close')
      done(p)
    })

    t.test('reset: the peer sees ECONNRESET', async (t) => {
      const p = await pair(r)
      const error = once(p.client, 'error')
      p.connection.reset()
      const [err] = await error as [NodeJS.ErrnoException]
      t.equal(err.code, 'ECONNRESET')
      done(p)
    })

    t.test("the peer's close closes the connection, and the peer's reset too", async (t) => {
      const p = await pair(r)
      p.client.end()
      await until(() => p.closes.length === 1, 'the close')
      t.equal(p.closes[0]?.code, ErrorCode.CONNECTION_CLOSED)
      done(p)
      const q = await pair(r)
      q.client.resetAndDestroy()
      await until(() => q.closes.length === 1, 'the close after a reset')
      t.equal(q.closes[0]?.code, ErrorCode.CONNECTION_CLOSED)
      done(q)
    })

    t.test('reads of later turns into the same slab come in the same Buffer (one Buffer per slab, not per turn)', async (t) => {
      const p = await pair(r)
      // The raw stream's reads, each in a turn of its own (the client waits for each to arrive).
      const slabs: Buffer[] = []
      let bytes = 0
      p.stream.listen({ onRead: (buf, start, end) => { slabs.push(buf); bytes += end - start }, onWritable: () => {}, onEnd: () => {}, onError: () => {}, onClose: () => {} })
      for (let i = 1; i <= 8; i++) {
        p.client.write(Buffer.from('0123456789'))
        await until(() => bytes === 10 * i, `read ${i}`)
      }
      // A slab holds 256 KiB: eight 10-byte reads fill at most the end of one and the start of the next.
      t.ok(new Set(slabs).size <= 2, `8 reads came in ${new Set(slabs).size} Buffers`)
      done(p)
    })

    t.test('the addon\'s sendRange reads its numbers from sendArgs and leaves the result there, sends from the Buffer it holds when given none; a bad range, id or Buffer is refused', async (t) => {
      const p = await pair(r)
      const received: Buffer[] = []
      p.client.on('data', (chunk: Buffer) => received.push(chunk))
      const h = r.handle
      const args = h.sendArgs
      const buf = Buffer.from('..hello..')
      const send = (id: number, start: number, end: number): number => {
        args[0] = id
        args[1] = start
        args[2] = end
        args[3] = 12345
        t.equal(h.sendRange(buf), undefined)
        return args[3]!
      }
      t.equal(send(p.stream.id, 2, 7), 5, 'the bytes taken')
      await until(() => Buffer.concat(received).length >= 5, 'the range')
      t.equal(Buffer.concat(received).toString('latin1'), 'hello', 'exactly buf[2, 7)')
      t.equal(send(p.stream.id, -1, 3), -22, 'start -1 (send\'s whole-buffer mark) is EINVAL')
      t.equal(send(p.stream.id, 4, 3), -22, 'end before start is EINVAL')
      t.equal(send(p.stream.id, 0, buf.length + 1), -22, 'past the buffer\'s end is EINVAL')
      t.equal(send(-5, 0, 1), -9, 'an id of no connection is EBADF')
      t.equal(h.source, buf, 'the Buffer given is the source')
      // Without a Buffer: the source again (what native-stream sends from a slab it sent from before).
      // Each send waits for the one before to arrive: io_uring has one send in flight a connection.
      args[0] = p.stream.id
      args[1] = 0
      args[2] = 2
      h.sendRange()
      t.equal(args[3], 2, 'the source\'s range, no Buffer named')
      await until(() => Buffer.concat(received).length >= 7, 'the source\'s range')
      const other = Buffer.from('!?')
      args[2] = 1
      // Called without its object, it still names the source on the reactor's.
      const sendRange = h.sendRange
      sendRange(other)
      t.equal(args[3], 1, 'a new Buffer is sent from')
      t.equal(h.source, other, 'and becomes the source')
      await until(() => Buffer.concat(received).length >= 8, 'the new Buffer\'s range')
      t.equal(Buffer.concat(received).toString('latin1'), 'hello..!', 'the held source, then the new one')
      args[1] = 0
      args[2] = 1
      h.sendRange({} as Buffer)
      t.equal(args[3], -22, 'not a Buffer: EINVAL')
      t.equal(h.source, null, 'and no source')
      h.sendRange()
      t.equal(args[3], -22, 'so a send without a Buffer is refused too')
      await new Promise((resolve) => setTimeout(resolve, 20))
      t.equal(Buffer.concat(received).length, 8, 'nothing refused was sent')
      done(p)
    })

    t.test('a client connection through the reactor', async (t) => {
      const server = await pair(r, (body, connection) => { connection.send({ slices: [frame(`re:${body}`)], bytes: body.length + 7 }) })
      const stream = await r.connect(server.listener.address.port, '127.0.0.1')
      const frames: string[] = []
      const client = new FramedConnection(stream, { framing: krpcFraming })
      client.attach({ onFrame: (buf, start, end) => { frames.push(buf.toString('latin1', start + 4, end)); return true }, onClose: () => {} })
      // The pair's own node:net client stays idle; this one goes through the reactor to the same listener.
      await until(() => server.accepted.length === 2, 'the second accept')
      const far = new FramedConnection(server.accepted[1]!, { framing: krpcFraming })
      far.attach({ onFrame: (buf, start, end) => { far.send({ slices: [frame(`re:${buf.toString('latin1', start + 4, end)}`)], bytes: end - start + 3 }); return true }, onClose: () => {} })
      client.send({ slices: [frame('ping')], bytes: 8 })
      await until(() => frames.length === 1, 'the answer')
      t.same(frames, ['re:ping'])
      await t.rejects(r.connect(1, '127.0.0.1'), { code: 'ECONNREFUSED' }, 'a refused connect rejects with the errno')
      client.destroy()
      far.destroy()
      done(server)
    })
  })
}
