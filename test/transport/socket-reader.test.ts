/**
 * SocketReader over a loopback socket: every byte arrives in order, chunks
 * kept from earlier reads are never overwritten by later ones (across
 * slabs), reads before attach are handed on at attach, and end and close
 * still come as events.
 */
import t, { type Test } from 'tap'
import { connect, createServer, type Socket } from 'node:net'
import { SocketReader, readThrough } from '../../transport/socket-reader.js'

async function serverSending (t: Test, parts: Buffer[]): Promise<number> {
  const server = createServer((socket: Socket) => {
    let i = 0
    const next = (): void => {
      if (i === parts.length) { socket.end(); return }
      socket.write(parts[i++]!, () => setImmediate(next))
    }
    next()
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  return (server.address() as { port: number }).port
}

t.test('chunks arrive in order and stay intact while later reads fill new slabs', async t => {
  // 300 KiB in parts of varied size: more than two 128 KiB slabs.
  const parts: Buffer[] = []
  let total = 0
  for (let i = 0; total < 300 * 1024; i++) {
    const size = [1, 700, 5000, 64 * 1024, 20_000][i % 5]!
    parts.push(Buffer.alloc(size, i % 251))
    total += size
  }
  const port = await serverSending(t, parts)
  const reader = new SocketReader()
  const socket = connect({ port, host: '127.0.0.1', onread: reader.onread })
  const chunks: Buffer[] = []
  reader.attach((chunk) => { chunks.push(chunk) })
  let dataEvents = 0
  socket.on('data', () => { dataEvents++ })
  await new Promise<void>(resolve => socket.once('end', () => resolve()))
  await new Promise<void>(resolve => socket.once('close', () => resolve()))
  t.ok(Buffer.concat(chunks).equals(Buffer.concat(parts)), `${total} bytes in order, every earlier chunk unchanged`)
  t.ok(chunks.length >= parts.length / 2, `${chunks.length} reads`)
  t.ok(new Set(chunks.map(c => c.buffer)).size >= 3, 'reads spread over several slabs')
  t.equal(dataEvents, 0, 'no data events: reads go to the reader')
})

t.test('reads before attach are handed on at attach, in order', async t => {
  const port = await serverSending(t, [Buffer.from('early'), Buffer.from('-later')])
  const reader = new SocketReader()
  const socket = connect({ port, host: '127.0.0.1', onread: reader.onread })
  await new Promise<void>(resolve => socket.once('end', () => resolve()))
  const seen: string[] = []
  reader.attach((chunk) => { seen.push(chunk.toString()) })
  t.equal(seen.join(''), 'early-later')
  socket.destroy()
})

// Drives the reader as Node does: buffer() before each read, callback() after.
function read (reader: SocketReader, bytes: number, fill: number): Buffer {
  const buf = reader.onread.buffer()
  const n = Math.min(bytes, buf.length)
  buf.fill(fill, 0, n)
  reader.onread.callback(n, buf)
  return buf
}

t.test('slabs follow the reads: small for small calls, growing while reads fill them, small again after', t => {
  const reader = new SocketReader()
  const chunks: Buffer[] = []
  reader.attach((chunk) => { chunks.push(chunk) })
  // Synchronous small calls: 4 KiB slabs, one per ~70 reads of 57 bytes.
  for (let i = 0; i < 200; i++) read(reader, 57, i % 251)
  t.equal(reader.slabBytes, 4096, 'small reads use 4 KiB slabs')
  t.ok(new Set(chunks.map(c => c.buffer)).size <= 4, 'and share them')
  // Reads that fill their buffer (a megabyte waiting): room doubles up to 64 KiB.
  const sizes: number[] = []
  for (let i = 0; i < 6; i++) sizes.push(read(reader, 1 << 20, 1 + i).length)
  t.same(sizes.slice(-2), [64 * 1024, 64 * 1024], `room per read: ${sizes.join(', ')}`)
  t.equal(reader.slabBytes, 128 * 1024)
  // Back to small reads: the first one is copied out of the large slab, which
  // the next read leaves.
  read(reader, 100, 20)
  const small = chunks.at(-1)!
  t.equal(small.length, 100)
  t.ok(small.buffer.byteLength < 128 * 1024, 'the small read does not keep the large slab alive')
  read(reader, 100, 21)
  t.equal(reader.slabBytes, 4096, 'an idle connection holds 4 KiB again')
  // Earlier chunks were never overwritten.
  for (let i = 0; i < 200; i++) t.ok(chunks[i]!.every(b => b === i % 251), `chunk ${i} intact`)
  for (let i = 0; i < 6; i++) t.ok(chunks[200 + i]!.every(b => b === 1 + i), `large chunk ${i} intact`)
  t.ok(small.every(b => b === 20))
  t.end()
})

t.test('alternating large and small reads: kept small chunks never pin a large slab', t => {
  const reader = new SocketReader()
  const kept: Buffer[] = []
  reader.attach((chunk) => { if (chunk.length === 60) kept.push(chunk) })
  for (let round = 0; round < 300; round++) {
    // 5,000 bytes arrive in as many reads as their buffers take, then a 60-byte message.
    let left = 5000
    while (left > 0) left -= Math.min(left, read(reader, left, 1).length)
    read(reader, 60, 2)
  }
  const held = new Set(kept.map(c => c.buffer))
  let bytes = 0
  for (const b of held) bytes += b.byteLength
  t.equal(kept.length, 300)
  t.ok(bytes <= 300 * 4096, `300 kept 60-byte chunks hold ${bytes} bytes of buffers`)
  t.end()
})

t.test('readThrough moves an accepted socket to a reader: no data events, writes work, the server counts it once', async t => {
  let resolveAccepted!: (s: Socket) => void
  const accepted = new Promise<Socket>(resolve => { resolveAccepted = resolve })
  const server = createServer({ pauseOnConnect: true }, (socket) => resolveAccepted(socket))
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const closed = new Promise<void>(resolve => server.once('close', () => resolve()))
  const client = connect({ port: (server.address() as { port: number }).port, host: '127.0.0.1' })
  t.teardown(() => { client.destroy(); server.close() })
  const original = await accepted
  const reader = new SocketReader()
  const socket = readThrough(original, reader)
  t.not(socket, original, 'a new socket owns the handle')
  t.equal(socket.remotePort, client.localPort, 'the same connection')
  let dataEvents = 0
  socket.on('data', () => { dataEvents++ })
  const got: Buffer[] = []
  const ended = new Promise<void>(resolve => socket.once('end', () => resolve()))
  reader.attach((chunk) => {
    got.push(chunk)
    if (Buffer.concat(got).toString() === 'ping') socket.write('pong')
  })
  client.write('ping')
  const answer = await new Promise<string>(resolve => client.once('data', (b: Buffer) => resolve(b.toString())))
  t.equal(answer, 'pong')
  t.equal(dataEvents, 0, 'reads go to the reader')
  const count = await new Promise<number>(resolve => server.getConnections((_e, n) => resolve(n)))
  t.equal(count, 1, 'the server counts the connection once')
  client.end()
  await ended
  socket.destroy()
  server.close()
  await closed
  t.pass('the server closed once the moved socket closed')
})

t.test('readThrough falls back to data events when the handle cannot take a user buffer', async t => {
  let resolveAccepted!: (s: Socket) => void
  const accepted = new Promise<Socket>(resolve => { resolveAccepted = resolve })
  const server = createServer({ pauseOnConnect: true }, (socket) => resolveAccepted(socket))
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const client = connect({ port: (server.address() as { port: number }).port, host: '127.0.0.1' })
  const original = await accepted
  t.teardown(() => { client.destroy(); original.destroy(); server.close() })
  const handle = (original as unknown as { _handle: { useUserBuffer?: unknown } })._handle
  handle.useUserBuffer = undefined
  const socket = readThrough(original, new SocketReader())
  t.equal(socket, original, 'the socket is kept')
  const data = new Promise<string>(resolve => socket.once('data', (b: Buffer) => resolve(b.toString())))
  client.write('hello')
  t.equal(await data, 'hello', 'and resumed: data events flow')
})

t.test('readThrough keeps allowHalfOpen, and leaves a socket that is already reading as it is', async t => {
  let resolveAccepted!: (s: Socket) => void
  let accepted = new Promise<Socket>(resolve => { resolveAccepted = resolve })
  const halfOpen = createServer({ pauseOnConnect: true, allowHalfOpen: true }, (socket) => resolveAccepted(socket))
  await new Promise<void>(resolve => halfOpen.listen(0, '127.0.0.1', resolve))
  const client = connect({ port: (halfOpen.address() as { port: number }).port, host: '127.0.0.1', allowHalfOpen: true })
  t.teardown(() => { client.destroy(); halfOpen.close() })
  const moved = readThrough(await accepted, new SocketReader())
  t.teardown(() => moved.destroy())
  const ended = new Promise<void>(resolve => moved.once('end', () => resolve()))
  client.end()
  await ended
  t.equal(moved.writable, true, 'after the peer\'s FIN the moved socket can still write')
  const reply = new Promise<string>(resolve => client.once('data', (b: Buffer) => resolve(b.toString())))
  moved.end('late')
  t.equal(await reply, 'late')

  // Without pauseOnConnect the socket reads at once: moving it could lose bytes.
  accepted = new Promise<Socket>(resolve => { resolveAccepted = resolve })
  const reading = createServer((socket) => resolveAccepted(socket))
  await new Promise<void>(resolve => reading.listen(0, '127.0.0.1', resolve))
  const second = connect({ port: (reading.address() as { port: number }).port, host: '127.0.0.1' })
  const original = await accepted
  t.teardown(() => { second.destroy(); original.destroy(); reading.close() })
  t.equal(readThrough(original, new SocketReader()), original, 'kept: it was reading already')
})

t.test('the client\'s FirstBytesReader keeps the first chunk when several were read before attach', async t => {
  const { FirstBytesReader } = await import('../../reactor/client/peer-connection.js')
  const reader = new FirstBytesReader()
  const read = (text: string): void => {
    const buf = reader.onread.buffer()
    const n = buf.write(text)
    reader.onread.callback(n, buf)
  }
  read('HTTP/1.1 400')
  read(' Bad Request')
  read('\r\n\r\n')
  const seen: string[] = []
  reader.attach((chunk) => seen.push(chunk.toString()))
  t.equal(reader.firstBytes?.toString(), 'HTTP/1.1 400', 'the first chunk, not the last')
  t.same(seen, ['HTTP/1.1 400', ' Bad Request', '\r\n\r\n'], 'every chunk handed on, in order')
  read('later')
  t.equal(reader.firstBytes?.toString(), 'HTTP/1.1 400')
  t.same(seen.at(-1), 'later')
})
