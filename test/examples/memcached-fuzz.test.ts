// Hostile input against the memcached example: random packets (a valid
// header around random opcodes, lengths, extras, keys and values, and raw
// random bytes) through a live server over loopback. The server never
// crashes, closes a connection only for what breaks the framing, keeps
// answering in order, and a fresh connection is served afterwards.
import t from 'tap'
import fc from 'fast-check'
import { memcachedServer } from '../../examples/memcached/main.js'
import { exchange as exchangeWith } from '../helpers/socket-peer.js'

function packet (opcode: number, key: Buffer, extras: Buffer, value: Buffer, opaque: number, cas: bigint, magic = 0x80, bodyDelta = 0): Buffer {
  const out = Buffer.alloc(24 + extras.length + key.length + value.length)
  out[0] = magic
  out[1] = opcode
  out.writeUInt16BE(key.length, 2)
  out[4] = extras.length
  out.writeUInt32BE(Math.max(0, extras.length + key.length + value.length + bodyDelta), 8)
  out.writeUInt32BE(opaque, 12)
  out.writeBigUInt64BE(cas, 16)
  extras.copy(out, 24)
  key.copy(out, 24 + extras.length)
  value.copy(out, 24 + extras.length + key.length)
  return out
}

const NOOP = packet(0x0a, Buffer.alloc(0), Buffer.alloc(0), Buffer.alloc(0), 0x4e4f4f50, 0n)

// Until the NOOP's answer (its opaque), the close, or 300 ms.
const exchange = (port: number, bytes: Buffer): Promise<{ received: Buffer, closed: boolean }> => exchangeWith(port, bytes, NOOP, Buffer.from('4e4f4f50', 'hex'))

t.test('random packets: the server survives, answers or closes, and serves a fresh connection after', async (t) => {
  const server = memcachedServer({ memoryBytes: 8 * 1024 * 1024 })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const bytes = (max: number): fc.Arbitrary<Buffer> => fc.uint8Array({ maxLength: max }).map((a) => Buffer.from(a))
  const arbPacket = fc.record({
    opcode: fc.oneof(fc.integer({ min: 0, max: 0x26 }), fc.integer({ min: 0, max: 255 })),
    key: bytes(300), extras: bytes(24), value: bytes(2000), opaque: fc.integer({ min: 0, max: 0xffffffff }),
    cas: fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
    magic: fc.constantFrom(0x80, 0x80, 0x80, 0x80, 0x81, 0x00),
    bodyDelta: fc.constantFrom(0, 0, 0, -1, 1, -30)
  }).map((p) => packet(p.opcode, p.key, p.extras, p.value, p.opaque, p.cas, p.magic, p.bodyDelta))
  const stream = fc.oneof(fc.array(arbPacket, { minLength: 1, maxLength: 8 }).map((ps) => Buffer.concat(ps)), bytes(200))
  let answered = 0
  let closed = 0
  let waiting = 0
  let runs = 0
  await fc.assert(fc.asyncProperty(stream, async (input) => {
    const r = await exchange(port, input)
    if (r.closed) closed++
    else if (r.received.indexOf(Buffer.from('4e4f4f50', 'hex')) >= 0) answered++
    else waiting++
    // Every answer is a well-formed response packet (magic 0x81, whole).
    for (let at = 0; at + 24 <= r.received.length; at += 24 + r.received.readUInt32BE(at + 8)) {
      if (r.received[at] !== 0x81) return false
    }
    // Now and then, and whatever happened, a fresh connection is served.
    if (++runs % 25 === 0) {
      const ping = await exchange(port, Buffer.alloc(0))
      if (ping.closed || ping.received.length === 0) return false
    }
    return true
  }), { numRuns: 150 })
  t.ok(answered > 0 && closed > 0, `${answered} streams answered through their NOOP, ${closed} closed (bad magic, bad lengths), ${waiting} waiting for a body their header announced`)
  const fresh = await exchange(port, packet(0x01, Buffer.from('k'), Buffer.alloc(8), Buffer.from('v'), 1, 0n))
  t.notOk(fresh.closed, 'a fresh connection is served')
  t.equal(fresh.received[0], 0x81, 'answered')
  t.equal(server.stats().connectionsOpen <= 1, true)
})
