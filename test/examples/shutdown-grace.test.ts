// The example servers take --shutdown-grace-ms as `nyala serve` does: on
// SIGTERM what is in flight is answered, and a peer that never reads its
// answers cannot hold the shutdown past the grace: the process exits 0.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { startListening } from '../helpers/listening-child.js'
import { memcachedHeader as header } from '../helpers/bytes.js'

const memcachedMain = fileURLToPath(new URL('../../examples/memcached/main.ts', import.meta.url))
const redisMain = fileURLToPath(new URL('../../examples/redis/main.ts', import.meta.url))


async function open (port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  return socket
}

/** Reads from `socket` until `done(received)` holds. */
async function readUntil (socket: Socket, done: (received: Buffer) => boolean): Promise<Buffer> {
  let received = Buffer.alloc(0)
  while (!done(received)) {
    const [chunk] = await once(socket, 'data') as [Buffer]
    received = Buffer.concat([received, chunk])
  }
  return received
}

async function stopsWithin (t: Test, main: string, store: Buffer, stored: (b: Buffer) => boolean, reads: Buffer): Promise<void> {
  const { child, port } = await startListening(t, main, ['--port', '0', '--shutdown-grace-ms', '300'])
  const writer = await open(port)
  writer.write(store)
  await readUntil(writer, stored)
  t.pass('a large value stored')
  writer.destroy()
  // A peer that asks for it over and over and never reads an answer.
  const hog = await open(port)
  t.teardown(() => hog.destroy())
  hog.pause()
  let hogClosed = false
  hog.once('close', () => { hogClosed = true })
  for (let i = 0; i < 40; i++) hog.write(reads)
  const exited = once(child, 'exit') as Promise<[number | null, string | null]>
  child.kill('SIGTERM')
  const [code] = await exited
  t.equal(code, 0, 'exits 0 though a peer never reads its answers')
  hog.destroy()
  t.ok(hogClosed || hog.destroyed, 'the non-reader is closed')
}

t.test('memcached example: --shutdown-grace-ms', async (t) => {
  const value = Buffer.alloc(512 * 1024, 0x61)
  const set = Buffer.concat([header(0x01, 3, 8, 8 + 3 + value.length), Buffer.alloc(8), Buffer.from('big'), value])
  const get = Buffer.concat([header(0x00, 3, 0, 3), Buffer.from('big')])
  await stopsWithin(t, memcachedMain, set, (b) => b.length >= 24, Buffer.concat(Array.from({ length: 10 }, () => get)))
})

t.test('redis example: --shutdown-grace-ms', async (t) => {
  const value = 'a'.repeat(512 * 1024)
  const set = Buffer.from(`*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$${value.length}\r\n${value}\r\n`)
  const get = Buffer.from('*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n')
  await stopsWithin(t, redisMain, set, (b) => b.toString().includes('+OK\r\n'), Buffer.concat(Array.from({ length: 10 }, () => get)))
})
