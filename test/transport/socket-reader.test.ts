/**
 * SocketReader over a loopback socket: every byte arrives in order, chunks
 * kept from earlier reads are never overwritten by later ones (across
 * slabs), reads before attach are handed on at attach, and end and close
 * still come as events.
 */
import t, { type Test } from 'tap'
import { connect, createServer, type Socket } from 'node:net'
import { SocketReader } from '../../transport/socket-reader.js'

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
