// Requests memcached answers with an error and then closes the connection:
// lengths wrong for the command (Invalid arguments, 0x0004) and extras and
// key longer than the body (Unknown command, 0x0081). The example answers
// each byte for byte as the real memcached does (when it is installed,
// the same bytes are sent to both), and closes the same way; an unknown
// opcode is answered and the connection stays, as in memcached.
import t, { type Test } from 'tap'
import { spawnSync } from 'node:child_process'
import { connect } from 'node:net'
import { memcachedServer } from '../../examples/memcached/main.js'
import { realMemcached } from '../helpers/real-servers.js'
import { memcachedHeader } from '../helpers/bytes.js'

const header = (opcode: number, key: number, extras: number, body: number, opaque = 0x11223344): Buffer => memcachedHeader(opcode, key, extras, body, opaque)

const memcached = spawnSync('sh', ['-c', 'command -v memcached'], { encoding: 'utf8' }).stdout.trim()


const NOOP = header(0x0a, 0, 0, 0, 0x55)
const NOOP_ANSWER = '810a00000000000000000000000000550000000000000000'

/** An error answer as memcached writes it: the request's opcode and opaque, the status, its text as the value. */
function errorAnswer (opcode: number, status: number, text: string): string {
  const b = Buffer.alloc(24)
  b[0] = 0x81
  b[1] = opcode
  b.writeUInt16BE(status, 6)
  b.writeUInt32BE(text.length, 8)
  b.writeUInt32BE(0x11223344, 12)
  return b.toString('hex') + Buffer.from(text, 'latin1').toString('hex')
}

const EINVAL = (opcode: number): string => errorAnswer(opcode, 0x04, 'Invalid arguments')
const UNKNOWN = (opcode: number): string => errorAnswer(opcode, 0x81, 'Unknown command')

// What each gets: the answer's bytes, and whether the connection closes (the NOOP behind it is then unanswered).
const CASES: Array<{ name: string, bytes: Buffer, answer: string, closes: boolean }> = [
  { name: 'SET with 25 bytes of extras', bytes: Buffer.concat([header(0x01, 3, 25, 30), Buffer.alloc(25), Buffer.from('keyvv')]), answer: EINVAL(0x01), closes: true },
  { name: 'NOOP announcing a body', bytes: Buffer.concat([header(0x0a, 0, 0, 5), Buffer.from('hello')]), answer: EINVAL(0x0a), closes: true },
  { name: 'NOOP with extras', bytes: Buffer.concat([header(0x0a, 0, 4, 4), Buffer.alloc(4)]), answer: EINVAL(0x0a), closes: true },
  { name: 'GET with extras', bytes: Buffer.concat([header(0x00, 1, 4, 5), Buffer.alloc(4), Buffer.from('k')]), answer: EINVAL(0x00), closes: true },
  { name: 'GET of a 251-byte key', bytes: Buffer.concat([header(0x00, 251, 0, 251), Buffer.alloc(251, 0x6b)]), answer: EINVAL(0x00), closes: true },
  { name: 'SET without extras', bytes: Buffer.concat([header(0x01, 1, 0, 2), Buffer.from('kv')]), answer: EINVAL(0x01), closes: true },
  { name: 'SET whose extras and key pass its body', bytes: Buffer.concat([header(0x01, 3, 25, 10), Buffer.alloc(10)]), answer: UNKNOWN(0x01), closes: true },
  { name: 'GET whose key passes its body', bytes: Buffer.concat([header(0x00, 5, 0, 3), Buffer.from('abc')]), answer: UNKNOWN(0x00), closes: true },
  { name: 'an unknown opcode', bytes: header(0x50, 0, 0, 0), answer: UNKNOWN(0x50) + NOOP_ANSWER, closes: false }
]

/** Sends `bytes` and a NOOP; resolves once the connection closed or the NOOP was answered. */
function exchange (port: number, bytes: Buffer): Promise<{ received: string, closed: boolean }> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    const chunks: Buffer[] = []
    const received = (): string => Buffer.concat(chunks).toString('hex')
    socket.on('data', (d: Buffer) => {
      chunks.push(d)
      if (received().endsWith(NOOP_ANSWER)) {
        socket.destroy()
        resolve({ received: received(), closed: false })
      }
    })
    socket.on('error', () => {})
    socket.once('close', () => resolve({ received: received(), closed: true }))
    socket.once('connect', () => socket.write(Buffer.concat([bytes, NOOP])))
    socket.setTimeout(10_000, () => { socket.destroy(); reject(new Error('neither closed nor answered the NOOP')) })
  })
}

async function check (t: Test, port: number): Promise<void> {
  for (const c of CASES) {
    const got = await exchange(port, c.bytes)
    t.equal(got.received, c.answer, `${c.name}: answered`)
    t.equal(got.closed, c.closes, `${c.name}: ${c.closes ? 'then closed' : 'the connection stays'}`)
  }
}

t.test('the example answers each, then closes', async (t) => {
  const server = memcachedServer()
  const { port } = await server.listen(0)
  t.teardown(() => server.close({ graceMs: 0 }))
  await check(t, port)
})

t.test('the real memcached answers the same', { skip: memcached === '' ? 'memcached is not installed' : false }, async (t) => {
  const { port } = await realMemcached(t, memcached)
  await check(t, port)
})
