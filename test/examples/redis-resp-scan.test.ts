/**
 * The redis example's RESP scanner and array decoder on streams of whole
 * and broken requests. Fed one byte at a time, the scanner reads every
 * frame with its general states; handed whole frames, it takes the one-pass
 * path for well-formed arrays. Every way of cutting a stream must find the
 * same frames, the same protocol error in the same words, and leave the
 * same pending state, whatever byte is put wherever, with lengths at and
 * just past their limits. The decoder must give each command and its
 * arguments as they were encoded.
 */
import t from 'tap'
import { CallHead, RpcError } from '../../reactor/index.js'
import { RespProtocolError, RespRequest, RespScanner, respProtocol, ProtocolErrors } from '../../examples/redis/resp.js'
import { UNKNOWN_COMMAND } from '../../examples/redis/commands.js'

const cmd = (...args: string[]): string => `*${args.length}\r\n${args.map(a => `$${Buffer.byteLength(a, 'latin1')}\r\n${a}\r\n`).join('')}`

// Small limits, so that lengths at and past them are a few bytes long.
const MAX_BULK = 12
const MAX_ARGUMENTS = 4
const scanner = (): RespScanner => new RespScanner(MAX_BULK, MAX_ARGUMENTS)

/** What a scanner made of a stream: the frames' sizes, then its error's words, or what it said of the unfinished rest. */
interface Outcome { frames: number[], error: string | null, pending: number | null, retainFrom: number | null }

/**
 * The stream fed in pieces ending at `cuts` (and its end), as ScanDecoder
 * feeds a scanner: the current frame's bytes so far from its start, in the
 * same buffer, with the rest of the stream after them (never to be read).
 */
function scanStream (stream: Buffer, cuts: number[]): Outcome {
  const s = scanner()
  const frames: number[] = []
  let frameStart = 0
  let pending: number | null = null
  for (const arrived of [...cuts, stream.length]) {
    while (frameStart < arrived) {
      const size = s.scan(stream, frameStart, arrived)
      if (size instanceof RpcError) {
        return { frames, error: size instanceof RespProtocolError ? size.message : `not a protocol error: ${size.message}`, pending: null, retainFrom: null }
      }
      if (size <= 0) {
        pending = size
        break
      }
      frames.push(size)
      frameStart += size
      pending = null
      s.reset()
    }
  }
  return { frames, error: null, pending: frameStart < stream.length ? pending : null, retainFrom: frameStart < stream.length ? s.retainFrom() : null }
}

const whole = (stream: Buffer): Outcome => scanStream(stream, [])
const byteByByte = (stream: Buffer): Outcome => scanStream(stream, Array.from({ length: stream.length }, (_, i) => i + 1))

const GOOD = [
  cmd('GET', 'key'),
  cmd('SET', 'k', 'v\r\nalue'),
  cmd('PING'),
  cmd('ECHO', ''),
  cmd('SET', 'twelve-bytes', '0123456789'), // a bulk at the limit, two digits
  cmd('DEL', 'a', 'b', 'c'), // the most arguments
  'PING\r\n',
  '*0\r\n',
  '*-1\r\n',
  cmd('NOSUCH', 'x')
]

t.test('well-formed frames: the same sizes whole, byte by byte and cut anywhere', async (t) => {
  const stream = Buffer.from(GOOD.join(''), 'latin1')
  const expected: Outcome = { frames: GOOD.map(p => Buffer.byteLength(p, 'latin1')), error: null, pending: null, retainFrom: null }
  t.same(whole(stream), expected, 'whole')
  t.same(byteByByte(stream), expected, 'byte by byte')
  let differing = 0
  for (let cut = 1; cut < stream.length; cut++) {
    for (const second of [cut + 1, cut + 7]) {
      const got = scanStream(stream, second < stream.length ? [cut, second] : [cut])
      if (JSON.stringify(got) !== JSON.stringify(expected)) {
        differing++
        t.fail(`cut at ${cut}, ${second}: ${JSON.stringify(got)}`)
      }
    }
  }
  t.equal(differing, 0, 'every cut')
})

t.test('an unfinished frame: the same pending answer and retained offset however it came', async (t) => {
  const stream = Buffer.from(GOOD.slice(0, 6).join(''), 'latin1')
  let checked = 0
  for (let end = 1; end < stream.length; end++) {
    const prefix = stream.subarray(0, end)
    const reference = byteByByte(prefix)
    const got = whole(prefix)
    if (JSON.stringify(got) !== JSON.stringify(reference)) t.fail(`prefix of ${end}: ${JSON.stringify(got)} vs ${JSON.stringify(reference)}`)
    else checked++
  }
  t.equal(checked, stream.length - 1, 'every prefix')
  // A bulk's data still to come: the frame's size is known before it arrives.
  t.same(whole(Buffer.from('*2\r\n$3\r\nGET\r\n$10\r\nab', 'latin1')), { frames: [], error: null, pending: -30, retainFrom: 30 })
})

t.test('a byte changed anywhere: the same frames and the same protocol error, whole, byte by byte and cut', async (t) => {
  const stream = Buffer.from(GOOD.slice(0, 6).join(''), 'latin1')
  const replacements = [0x00, 0x2a, 0x24, 0x2d, 0x2b, 0x30, 0x31, 0x32, 0x35, 0x39, 0x0d, 0x0a, 0x20, 0x61]
  const errors = new Map<string, number>()
  let cases = 0
  for (let i = 0; i < stream.length; i++) {
    for (const byte of replacements) {
      if (stream[i] === byte) continue
      const broken = Buffer.from(stream)
      broken[i] = byte
      const reference = byteByByte(broken)
      const variants: Array<[string, Outcome]> = [['whole', whole(broken)]]
      for (const cut of [i - 1, i, i + 1, i + 3, broken.length >> 1]) {
        if (cut > 0 && cut < broken.length) variants.push([`cut at ${cut}`, scanStream(broken, [cut])])
      }
      for (const [how, got] of variants) {
        if (JSON.stringify(got) !== JSON.stringify(reference)) t.fail(`byte ${i} set to ${byte}, ${how}: ${JSON.stringify(got)} vs ${JSON.stringify(reference)}`)
      }
      if (reference.error !== null) errors.set(reference.error, (errors.get(reference.error) ?? 0) + 1)
      cases++
    }
  }
  t.ok(cases > 1000, `${cases} streams`)
  // Every kind of refusal the scanner makes for an array was among them.
  for (const words of [ProtocolErrors.multibulkLength, ProtocolErrors.bulkLength, ProtocolErrors.expectedDollar(0x2a), ProtocolErrors.expectedDollar(0x61)]) {
    t.ok((errors.get(words) ?? 0) > 0, `${words}: ${errors.get(words) ?? 0}`)
  }
})

t.test('lengths at and past their limits, signs and leading zeros: the general scan\'s answer', async (t) => {
  const cases: Array<[string, Outcome]> = [
    [cmd('A', 'b', 'c', 'd'), { frames: [32], error: null, pending: null, retainFrom: null }],
    ['*5\r\n', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    [cmd('A', 'b', 'c', 'd', 'e'), { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    ['*10\r\n', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    ['*01\r\n$1\r\na\r\n', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    ['*-0\r\n', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    ['*-5\r\nPING\r\n', { frames: [5, 6], error: null, pending: null, retainFrom: null }],
    ['*+1\r\n', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    ['*\r\n\r\n', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    [`*1\r\n$12\r\n${'x'.repeat(12)}\r\n`, { frames: [23], error: null, pending: null, retainFrom: null }],
    [`*1\r\n$13\r\n${'x'.repeat(13)}\r\n`, { frames: [], error: ProtocolErrors.bulkLength, pending: null, retainFrom: null }],
    ['*1\r\n$0\r\n\r\n', { frames: [10], error: null, pending: null, retainFrom: null }],
    ['*1\r\n$00\r\n\r\n', { frames: [], error: ProtocolErrors.bulkLength, pending: null, retainFrom: null }],
    ['*1\r\n$01\r\na\r\n', { frames: [], error: ProtocolErrors.bulkLength, pending: null, retainFrom: null }],
    ['*1\r\n$-1\r\n', { frames: [], error: ProtocolErrors.bulkLength, pending: null, retainFrom: null }],
    ['*1\r\n$\r\n\r\n', { frames: [], error: ProtocolErrors.bulkLength, pending: null, retainFrom: null }],
    ['*1\r\n:1\r\n', { frames: [], error: ProtocolErrors.expectedDollar(0x3a), pending: null, retainFrom: null }],
    // The byte after a CR and the two after a bulk's data are not looked at.
    ['*1\nX$3\rXfooYZ', { frames: [], error: ProtocolErrors.multibulkLength, pending: null, retainFrom: null }],
    ['*1\rX$3\rXfooYZ', { frames: [13], error: null, pending: null, retainFrom: null }]
  ]
  for (const [text, expected] of cases) {
    const stream = Buffer.from(text, 'latin1')
    t.same(whole(stream), expected, `${JSON.stringify(text)} whole`)
    t.same(byteByByte(stream), expected, `${JSON.stringify(text)} byte by byte`)
  }
})

t.test('decodeHead gives each array\'s command and arguments as they were encoded', async (t) => {
  const protocol = respProtocol()
  const head = new CallHead()
  const requests: string[][] = [
    ['GET', 'key:__rand_int__'],
    ['set', 'k', 'v\r\nalue'],
    ['PING'],
    ['ECHO', ''],
    ['MSET', ...Array.from({ length: 24 }, (_, i) => i % 2 === 0 ? `key${i}` : 'v'.repeat(i * 9))],
    ['NOSUCH'],
    ['nosuch', 'a', '', 'c'],
    ['G']
  ]
  const stream = Buffer.from(requests.map(args => cmd(...args)).join(''), 'latin1')
  let start = 0
  for (const args of requests) {
    const end = start + Buffer.byteLength(cmd(...args), 'latin1')
    head.reset(start, end)
    t.equal(protocol.decodeHead(stream, start, end, head), null)
    const request = head.data as RespRequest
    const known = request.command !== UNKNOWN_COMMAND
    t.equal(head.method, known ? args[0]!.toUpperCase() : '#unknown', args[0]!)
    // An unknown command's name comes first, for the error that quotes it.
    const expected = known ? args.slice(1) : args
    t.equal(request.argc, expected.length)
    t.same(Array.from({ length: request.argc }, (_, i) => request.str(i)), expected)
    t.equal(request.ranges.length, 2 * expected.length, 'no room left over')
    start = end
  }
  for (const empty of ['*0\r\n', '*-1\r\n']) {
    const buf = Buffer.from(empty, 'latin1')
    head.reset(0, buf.length)
    t.equal(protocol.decodeHead(buf, 0, buf.length, head), null)
    t.equal(head.skip, true, `${JSON.stringify(empty)}: an empty command`)
  }
})
