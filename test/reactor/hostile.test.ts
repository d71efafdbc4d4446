// Hostile peers against the generic server, on the toy protocols: garbage,
// oversize length prefixes, partial frames that never finish, duplicate
// ids (policy 'close' and 'allow'), a peer that half-closes, and a flood of
// tiny requests from a peer that does not read; and a handler rejecting
// with a value that refuses String(). Each time the server keeps serving
// others, and every call it read ends exactly once.
import t, { type Test } from 'tap'
import { type CallOutcome, type ServerProtocol } from '../../reactor/index.js'
import { FakeClock, Gate, helloTaggedProtocol, serveCore, tally, turns, until } from '../helpers/core-harness.js'
import type { Peer } from '../helpers/socket-peer.js'
import { linesProtocol, taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

const echo = (req: Buffer): Buffer => req

/** A deterministic byte stream (xorshift32). */
function noise (seed: number, bytes: number): Buffer {
  const out = Buffer.alloc(bytes)
  let x = seed
  for (let i = 0; i < bytes; i++) {
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5
    out[i] = x & 0xff
  }
  return out
}

async function stillServes (t: Test, open: () => Promise<Peer>): Promise<void> {
  const peer = await open()
  peer.socket.write(taggedRequest('echo', 42, 'still here'))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'a good peer served')
  t.same(taggedAnswers(peer.received), [['ok', 42, 'still here']], 'a good peer is served')
  peer.socket.destroy()
}

t.test('garbage: a head the protocol refuses closes the connection after the answers before it; random bytes never crash the server', async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { idleTimeoutMs: 0 })
  const short = await open()
  // Two bytes of length 2: shorter than the tagged header.
  short.socket.write(Buffer.concat([taggedRequest('echo', 1, 'first'), Buffer.from([0, 2, 0, 0]), taggedRequest('echo', 2, 'never')]))
  await short.until(() => short.closed, 'closed')
  t.same(taggedAnswers(short.received), [['ok', 1, 'first']], 'the answer before the garbage, nothing after')
  t.equal(server.stats().badFrames, 1)
  for (let seed = 1; seed <= 20; seed++) {
    const peer = await open()
    peer.socket.write(noise(seed, 3000))
    // Random length prefixes may announce more than came: the peer ends it.
    await turns(3)
    peer.socket.destroy()
  }
  await until(() => server.stats().connectionsOpen === 0, 'every noisy connection gone')
  t.equal(server.stats().callsInFlight, 0)
  await stillServes(t, open)

  const lines = await serveCore(t, linesProtocol(), { echo: (arg: string) => arg })
  const nul = await lines.open()
  nul.socket.write('echo fine\n\u0000bad\necho never\n')
  await nul.until(() => nul.closed, 'closed')
  t.equal(nul.text, 'fine\n', 'the line before the garbage answered, in order')
  t.equal(lines.server.stats().badFrames, 1)
})

t.test('oversize length prefixes are refused at the prefix, before a body byte arrives', async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { idleTimeoutMs: 0 })
  for (const announced of [0xffff, 1025, 5000]) {
    const peer = await open()
    const prefix = Buffer.alloc(2)
    prefix.writeUInt16BE(announced)
    peer.socket.write(prefix)
    await peer.until(() => peer.closed, `closed at a prefix of ${announced}`)
    t.equal(peer.received.length, 0, 'no reply')
  }
  t.equal(server.stats().callsReceived, 0)
  const fits = await open()
  fits.socket.write(taggedRequest('echo', 1, 'x'.repeat(1024 - 9)))
  await fits.until(() => taggedAnswers(fits.received).length === 1, 'a frame of the protocol\'s maximum answered')
  await stillServes(t, open)
})

t.test('partial frames that never finish: they hold no call and are closed as idle; the others are served meanwhile (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0, minFrameBytesPerSecond: 0 })
  const frame = taggedRequest('echo', 1, 'z'.repeat(100))
  const cases = [frame.subarray(0, 1), frame.subarray(0, 2), frame.subarray(0, 7), frame.subarray(0, frame.length - 1)]
  const peers: Peer[] = []
  for (const part of cases) {
    const peer = await open()
    peer.socket.write(part)
    peers.push(peer)
  }
  const total = cases.reduce((n, c) => n + c.length, 0)
  await until(() => server.connectionStats().reduce((n, c) => n + c.bytesRead, 0) === total, 'every partial frame read')
  t.equal(server.stats().callsReceived, 0, 'no call from a partial frame')
  const good = await open()
  good.socket.write(taggedRequest('echo', 7, 'served'))
  await good.until(() => taggedAnswers(good.received).length === 1, 'served meanwhile')
  good.socket.destroy()
  for (let i = 0; i < 10; i++) { clock.advance(250); await turns(2) }
  for (const peer of peers) await peer.until(() => peer.closed, 'closed')
  t.equal(server.stats().idleClosed, cases.length, 'each closed as idle')
  t.same(peers.map(p => p.received.length), [0, 0, 0, 0], 'none answered')
})

t.test("duplicate ids, policy 'close': the connection closes after the answers already queued; every call read ends once", async (t) => {
  const gate = new Gate()
  const ends: CallOutcome[] = []
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: gate.handler }, { idleTimeoutMs: 0 })
  server.onCallEnd((_call, outcome) => { ends.push(outcome) })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('echo', 1, 'a'), taggedRequest('block', 7, 'x'), taggedRequest('block', 7, 'y'), taggedRequest('echo', 8, 'never')]))
  await peer.until(() => peer.closed, 'closed')
  t.same(taggedAnswers(peer.received), [['ok', 1, 'a']])
  t.equal(server.stats().badFrames, 1)
  gate.releaseAll()
  await until(() => server.stats().callsInFlight === 0, 'released')
  t.same(ends.map(e => e.reason).sort(), ['closed', 'ok'], 'the echo answered, the first id-7 call ended with its connection; the duplicate and the rest never became calls')
  await stillServes(t, open)
})

t.test("duplicate ids, policy 'allow': every call is answered with its id", async (t) => {
  const gate = new Gate()
  const protocol: ServerProtocol<Buffer, Buffer> = { ...taggedProtocol(), duplicateIds: 'allow' }
  const { server, open } = await serveCore(t, protocol, { echo, block: gate.handler }, { idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('block', 7, 'x'), taggedRequest('block', 7, 'y'), taggedRequest('echo', 7, 'z')]))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the echo')
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'all three')
  const answers = taggedAnswers(peer.received)
  t.same(answers.map(a => a[1]), [7, 7, 7])
  t.same(answers.map(a => a[2]).sort(), ['x', 'y', 'z'])
  t.notOk(peer.closed)
  t.equal(server.stats().callsInFlight, 0)
})

t.test("an id may be reused once its call is answered, under policy 'close' too", async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { idleTimeoutMs: 0 })
  const peer = await open()
  for (let round = 0; round < 5; round++) {
    peer.socket.write(taggedRequest('echo', 7, `round ${round}`))
    await peer.until(() => taggedAnswers(peer.received).length === round + 1, `round ${round}`)
  }
  t.same(tally(peer.received), { ok: 5 })
  t.notOk(peer.closed)
  t.equal(server.stats().badFrames, 0)
})

t.test('route names of Object.prototype are unknown routes, not a crash', async (t) => {
  const { server, open } = await serveCore(t, linesProtocol(), { echo: (arg: string) => arg })
  const peer = await open()
  const names = ['constructor', '__proto__', 'toString', 'hasOwnProperty', 'valueOf']
  peer.socket.write(names.map(n => `${n} x\n`).join('') + 'echo alive\n')
  await peer.until(() => peer.text.split('\n').length === names.length + 2, 'every line answered')
  const lines = peer.text.split('\n').slice(0, -1)
  t.ok(lines.slice(0, names.length).every(l => l.startsWith('-ERR no-method ')), 'each refused no-method')
  t.equal(lines[names.length], 'alive')
  t.equal(server.stats().callsInFlight, 0)
})

t.test('calls pipelined behind a failed set-up never reach a handler', async (t) => {
  let handled = 0
  const { server, open } = await serveCore(t, helloTaggedProtocol(), { echo: (req: Buffer) => { handled++; return req } }, { idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('echo', 0, 'not hello'), taggedRequest('echo', 1, 'sneaked'), taggedRequest('echo', 2, 'in')]))
  await peer.until(() => peer.closed, 'closed')
  t.equal(handled, 0)
  t.equal(server.stats().callsReceived, 0)
  t.same(taggedAnswers(peer.received), [], 'no answer')
})

t.test('a peer that half-closes (FIN after its requests): its connection closes; what the server does with the calls it read', async (t) => {
  const gate = new Gate()
  const ends: string[] = []
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: gate.handler }, { idleTimeoutMs: 0 })
  server.onCallEnd((_call, outcome) => { ends.push(outcome.reason) })
  const sync = await open()
  sync.socket.end(Buffer.concat([taggedRequest('echo', 1, 'a'), taggedRequest('echo', 2, 'b')]))
  await sync.until(() => sync.closed, 'closed')
  const pending = await open()
  pending.socket.end(taggedRequest('block', 3, 'c'))
  await pending.until(() => pending.closed, 'closed')
  t.same(ends, ['ok', 'ok'], 'the running call has not ended yet')
  gate.releaseAll()
  await until(() => ends.length === 3, 'every call ended')
  t.same(tally(sync.received), { ok: 2 }, 'answers computed in the read that carried the FIN are sent')
  t.same(tally(pending.received), {}, 'a call still running when the FIN arrives is dropped with its connection (not answered)')
  t.same(ends.sort(), ['closed', 'ok', 'ok'])
  t.equal(server.stats().connectionsOpen, 0)
})

t.test('a flood of tiny requests from a peer that never reads: its unsent answers stay within maxOutboundBytes, then it is closed', async (t) => {
  const ends = new Map<string, number>()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { idleTimeoutMs: 0, maxOutboundBytes: 256 * 1024 })
  server.onCallEnd((_call, outcome) => { ends.set(outcome.reason, (ends.get(outcome.reason) ?? 0) + 1) })
  const flood = await open()
  flood.socket.pause()
  const one = taggedRequest('echo', 0, 'x'.repeat(64))
  const count = 200_000
  const bytes = Buffer.alloc(one.length * count)
  for (let i = 0; i < count; i++) { one.copy(bytes, i * one.length); bytes.writeUInt32BE(i, i * one.length + 3) }
  flood.socket.write(bytes)
  let peak = 0
  for (let i = 0; i < 400 && server.stats().connectionsOpen > 0; i++) {
    for (const c of server.connectionStats()) peak = Math.max(peak, c.queuedBytes)
    await new Promise(resolve => setTimeout(resolve, 5))
  }
  t.equal(server.stats().connectionsOpen, 0, 'the flood\'s connection closed')
  t.ok(peak <= 256 * 1024 + 64 * 1024, `unsent answers held: at most ${peak} bytes`)
  const received = server.stats().callsReceived
  t.ok(received < count, `${received} of ${count} requests read before the close`)
  t.equal([...ends.values()].reduce((a, b) => a + b, 0), received, 'every call read ended once')
  await stillServes(t, open)
})

t.test('a handler rejecting with a value that refuses String() is answered failed, and its worker is freed', async (t) => {
  const noStringForm = async (): Promise<Buffer> => { throw Object.create(null) }
  const { server, open } = await serveCore(t, taggedProtocol(), { fail: noStringForm, echo }, { workers: 1, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('fail', 1, 'x'))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the failure answered')
  t.same(taggedAnswers(peer.received)[0]!.slice(0, 2), ['failed', 1])
  t.match(taggedAnswers(peer.received)[0]![2], /no string form/, 'the message says what it was')
  peer.socket.write(taggedRequest('echo', 2, 'next'))
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the one worker serves the next call')
  t.same(tally(peer.received), { failed: 1, ok: 1 })
  t.equal(server.stats().callsInFlight, 0)
})
