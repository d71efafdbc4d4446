/**
 * ByteKey recognises its bytes wherever they sit: at any offset of any
 * buffer (a view into a larger one too), for every length (whole words and
 * a partial last one), and a difference in any single byte is a mismatch.
 */
import t from 'tap'
import { ByteKey } from '../../codec/byte-key.js'

function bytesOf (length: number, seed: number): Uint8Array {
  const out = new Uint8Array(length)
  for (let i = 0; i < length; i++) out[i] = (seed + i * 37) & 0xff
  return out
}

t.test('every length from 0 to 13 matches its bytes at odd offsets and refuses any one changed byte', async t => {
  let checks = 0
  for (let length = 0; length <= 13; length++) {
    const bytes = bytesOf(length, length)
    const key = new ByteKey(bytes, 0, length)
    t.equal(key.length, length)
    t.same(Array.from(key.bytes), Array.from(bytes))
    for (const offset of [0, 1, 3, 7]) {
      const buf = Buffer.alloc(offset + length + 5, 0xee)
      buf.set(bytes, offset)
      t.ok(key.matches(buf, offset), `length ${length} at ${offset}`)
      for (let i = 0; i < length; i++) {
        buf[offset + i]! ^= 0x01
        t.notOk(key.matches(buf, offset), `length ${length} at ${offset}, byte ${i} changed`)
        buf[offset + i]! ^= 0x01
        checks++
      }
      t.ok(key.matches(buf, offset), 'matches again once restored')
    }
  }
  t.equal(checks, 4 * (13 * 14) / 2, 'every byte of every length was changed once per offset')
})

t.test('buffers that alternate, views into larger buffers and a buffer rewritten in place', async t => {
  const bytes = bytesOf(35, 9)
  const key = new ByteKey(bytes, 0, 35)
  const big = new ArrayBuffer(4096)
  const a = new Uint8Array(big, 1001, 100) // a view whose byteOffset is not 0
  a.set(bytes, 10)
  const b = Buffer.alloc(64)
  b.set(bytes, 2)
  const c = Buffer.alloc(64) // the same length and offset as b, other bytes
  for (let round = 0; round < 3; round++) {
    t.ok(key.matches(a, 10))
    t.ok(key.matches(b, 2))
    t.notOk(key.matches(c, 2))
    t.notOk(key.matches(a, 11))
  }
  // The same buffer object read again after it was rewritten: its current bytes count.
  b.fill(0)
  t.notOk(key.matches(b, 2))
  b.set(bytes, 2)
  t.ok(key.matches(b, 2))
})

t.test('a key taken from the middle of a buffer keeps a copy of its bytes', async t => {
  const source = Buffer.from('xxnyala.demo.CalculatorService/Addyy')
  const key = new ByteKey(source, 2, source.length - 2)
  source.fill(0)
  t.ok(key.matches(Buffer.from('nyala.demo.CalculatorService/Add'), 0))
})
