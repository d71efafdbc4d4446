/**
 * The postgres example's framing of a started connection's messages
 * (examples/postgres/wire.ts): extended-query messages that have arrived
 * up to a Sync or Flush are one frame (a group); a group is never waited
 * for, and stays within the frame limit and MAX_GROUP_MESSAGES; bad input
 * is an error carrying the FATAL to send, or none. The reader's strings
 * and the writer's DataRow fields are the bytes PostgreSQL's are.
 */
import t from 'tap'
import { MAX_GROUP_MESSAGES, MessageReader, MessageWriter, messageFraming, StreamError, isGroup, startupFraming } from '../../examples/postgres/wire.js'
import { message, packet } from '../helpers/pg-raw.js'

const scan = (bytes: Buffer, max = 1 << 20): number | Error => messageFraming(max).scanner().scan(bytes, 0, bytes.length)
const B = message('B', Buffer.from('\0s\0\0\0\0\0\0\0'))
const E = message('E', Buffer.from('\0\0\0\0\0'))
const S = message('S')
const H = message('H')
const Q = message('Q', 'SELECT 1\0')

t.test('Bind, Execute, Sync that arrived together are one frame; a Flush ends a group too', async (t) => {
  const wire = Buffer.concat([B, E, S, Q])
  t.equal(scan(wire), B.length + E.length + S.length)
  t.ok(isGroup(wire, 0, B.length + E.length + S.length))
  t.equal(scan(Buffer.concat([B, E, H, S])), B.length + E.length + H.length)
  t.notOk(isGroup(Buffer.concat([B, E]), 0, B.length), 'one message is not a group')
})

t.test('a message is never held back for a group: without its Sync (or Flush), each is its own frame', async (t) => {
  t.equal(scan(Buffer.concat([B, E])), B.length, 'the Sync has not arrived')
  t.equal(scan(Buffer.concat([B, E, S.subarray(0, 3)])), B.length, 'part of the Sync has')
  t.equal(scan(Buffer.concat([B, Q, S])), B.length, 'a Query is not grouped')
  t.equal(scan(Buffer.concat([Q, B, S])), Q.length, 'nor does it start a group')
  t.equal(scan(S), S.length, 'a Sync alone')
})

t.test('a group stays within the frame limit and MAX_GROUP_MESSAGES', async (t) => {
  const wire = Buffer.concat([B, E, S])
  t.equal(scan(wire, wire.length), wire.length)
  t.equal(scan(wire, wire.length - 1), B.length, 'one byte over the limit: no group')
  const many = Buffer.concat([...Array.from({ length: MAX_GROUP_MESSAGES - 1 }, () => E), S])
  t.equal(scan(many), many.length, `${MAX_GROUP_MESSAGES} messages`)
  t.equal(scan(Buffer.concat([E, many])), E.length, 'one more: no group')
})

t.test('bad input: an unknown type carries its FATAL, a length below 4 none, a bad start-up length none', async (t) => {
  const unknown = scan(message('y', 'abc'))
  t.ok(unknown instanceof StreamError && unknown.words !== null && unknown.words.includes('invalid frontend message type 121'))
  const short = scan(Buffer.from([0x51, 0, 0, 0, 2]))
  t.ok(short instanceof StreamError && short.words === null)
  // A bad message inside what would be a group leaves the messages before it to be read one by one.
  t.equal(scan(Buffer.concat([B, Buffer.from([0x45, 0, 0, 0, 2]), S])), B.length)
  const startup = startupFraming.scanner()
  const low = startup.scan(Buffer.from([0, 0, 0, 4, 0, 0, 0, 0]), 0, 8)
  t.ok(low instanceof StreamError && low.words === null)
  const ok = packet(80877103)
  t.equal(startup.scan(ok, 0, ok.length), 8)
})

t.test('a reused reader reads each string as it is, a name read again included', async (t) => {
  const reader = new MessageReader(Buffer.alloc(0))
  const strings = ['P0_0', '', 'P0_0', 'P0_', 'P0_0X', 'P0_0', 'é…', 'x'.repeat(63), 'x'.repeat(64), 'x'.repeat(200), 'P0_0']
  const body = Buffer.concat(strings.map(text => Buffer.from(`${text}\0`)))
  reader.over(body, 0, body.length)
  t.same(strings.map(() => reader.cstr()), strings)
  t.equal(reader.remaining, 0)
  const cut = Buffer.from('P0_0')
  t.throws(() => reader.over(cut, 0, cut.length).cstr(), RangeError, 'no NUL before the end')
  const outside = Buffer.from('P0\0')
  t.throws(() => reader.over(outside, 0, 2).cstr(), RangeError, 'the NUL past the message end')
})

t.test('DataRow fields: a length, then the text in UTF-8, or the integer in decimal', async (t) => {
  const texts = ['', 'abc', 'é', '日本', 'a😀b', 'x'.repeat(300), 'ab\ud800']
  const numbers = [0, 7, -7, 10, 99, -100, 2147483647, -2147483648, Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER]
  const out = new MessageWriter(8)
  for (const text of texts) out.field(text)
  for (const n of numbers) out.decimalField(n)
  const want = Buffer.concat([...texts, ...numbers.map(String)].map(text => {
    const bytes = Buffer.from(text)
    const length = Buffer.alloc(4)
    length.writeInt32BE(bytes.length)
    return Buffer.concat([length, bytes])
  }))
  t.same(out.take(), want)
})
