// The generic server's limits, one test per limit, on the toy protocols
// (test/helpers/toy-protocols.ts) rather than KRPC: connections (refusal
// and eviction), connections negotiating, set-up frame size, frame size,
// bytes in incomplete frames of all connections, unsent answers of one
// connection and of all, push output limits, write watermarks, queue
// length (EDF and FIFO), burst absorption, request time budget, abandoned
// handlers and connection age (never closing a connection inside a frame
// or one with a call in flight). Each counts what every call and connection
// got. Time is a FakeClock wherever the server decides by time.
import t from 'tap'
import { ErrorCode, ProtocolServer, type CallContext, type ConnectionHandle } from '../../reactor/index.js'
import { FakeClock, Gate, helloTaggedProtocol, pushingTaggedProtocol, serveCore, tally, timedTaggedProtocol, turns, until } from '../helpers/core-harness.js'
import { linesProtocol, taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'
import { withCerts } from '../helpers/tls-certs.js'
import type { Peer } from '../helpers/socket-peer.js'

const echo = (req: Buffer): Buffer => req
/** Answers of `size` bytes (a tagged answer carries at most 65 530). */
const big = (req: Buffer): Buffer => Buffer.alloc(Number(req.toString()), 0x62)

function hello (): Buffer {
  return taggedRequest('echo', 0, 'hello')
}

t.test('maxConnections: a newcomer closes the connection idle longest (never one with a call in flight), else is refused at once', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: gate.handler }, { clock, maxConnections: 2, idleTimeoutMs: 0 })
  const busy = await open()
  const quiet = await open()
  await until(() => server.stats().connectionsOpen === 2, 'two connections')
  // Neither has been seen idle for a second: the newcomer is refused.
  const refused = await open()
  await refused.until(() => refused.closed, 'the refusal')
  t.equal(refused.received.length, 0, 'refused without a byte')
  t.equal(server.stats().connectionsRefused, 1)
  busy.socket.write(taggedRequest('block', 1, 'held'))
  await until(() => gate.waiting === 1, 'the held call')
  // The scans see both quiet for over a second; `busy` has a call in flight.
  clock.advance(1000)
  clock.advance(1000)
  const admitted = await open()
  await quiet.until(() => quiet.closed, 'the idle one closed for the newcomer')
  t.equal(server.stats().connectionsEvicted, 1)
  admitted.socket.write(taggedRequest('echo', 2, 'in'))
  await admitted.until(() => taggedAnswers(admitted.received).length === 1, 'its answer')
  gate.releaseAll()
  await busy.until(() => taggedAnswers(busy.received).length === 1, 'the held answer')
  t.same([tally(busy.received), tally(admitted.received), busy.closed], [{ ok: 1 }, { ok: 1 }, false], 'the busy one kept and answered')
  t.match(await server.metrics.text(), /^nyala_connections_refused_total 1$/m)
})

t.test('maxConnections with every connection trickling a frame: the slowest trickler makes room for a newcomer (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, maxConnections: 2, idleTimeoutMs: 65_000, frameTimeoutMs: 60_000, maxMessageBytes: 65_537 })
  const frame = taggedRequest('echo', 1, Buffer.alloc(1000))
  const tricklers = [await open(), await open()]
  let sent = 0
  // A byte each per 300 ms for 2.4 s: never idle for a second, far below 1000 bytes/s.
  for (let step = 0; step < 8; step++) {
    for (const peer of tricklers) peer.socket.write(frame.subarray(sent, sent + 1))
    sent++
    await until(() => server.connectionStats().every(c => c.bytesRead >= sent), 'the bytes read')
    clock.advance(300)
    await turns(2)
  }
  t.same([server.stats().connectionsOpen, server.stats().idleClosed], [2, 0], 'the tricklers hold every connection, none idle')
  const newcomer = await open()
  newcomer.socket.write(taggedRequest('echo', 9, 'in'))
  await newcomer.until(() => taggedAnswers(newcomer.received).length === 1, 'the newcomer served')
  await until(() => tricklers.some(p => p.closed), 'a trickler closed')
  const stats = server.stats()
  t.same([stats.connectionsRefused, stats.connectionsEvicted, stats.slowFramesClosed], [0, 1, 1], 'one trickler evicted for its slow frame, nobody refused')
})

t.test('in order: answers held behind a slow one count against maxOutboundBytes (64 bytes at least each, also for no answer)', async (t) => {
  const gate = new Gate()
  const block = (arg: string): Promise<string> => gate.handler(Buffer.from(arg)).then(String)
  const { server, open } = await serveCore(t, linesProtocol(), { block, quiet: () => undefined, echo: (arg: string) => arg }, { maxOutboundBytes: 4096, idleTimeoutMs: 0 })
  const fits = await open()
  fits.socket.write('block a\n' + 'quiet x\n'.repeat(40))
  await until(() => server.stats().callsReceived === 41, 'read')
  t.notOk(fits.closed, '40 held entries fit in 4 KiB')
  const over = await open()
  over.socket.write('block b\n' + 'quiet x\n'.repeat(200))
  await over.until(() => over.closed, 'closed: 200 held entries are over 4 KiB')
  gate.releaseAll()
  await fits.until(() => fits.text === 'a\n', 'the held answer goes out, the quiet ones are silent')
  t.equal(server.stats().connectionsOpen, 1)
})

t.test('maxNegotiatingConnections: past it the oldest connection still in set-up is closed for the newcomer', async (t) => {
  const { server, open } = await serveCore(t, helloTaggedProtocol(), { echo }, { maxNegotiatingConnections: 2, maxConnections: 10 })
  const silent = [await open(), await open()]
  await until(() => server.stats().connectionsOpen === 2, 'two negotiating')
  const third = await open()
  await silent[0]!.until(() => silent[0]!.closed, 'the oldest negotiating one closed')
  t.equal(server.stats().negotiatingEvicted, 1)
  third.socket.write(Buffer.concat([hello(), taggedRequest('echo', 5, 'after')]))
  await third.until(() => taggedAnswers(third.received).length === 2, 'the set-up answer and the call')
  t.same(taggedAnswers(third.received), [['ok', 0, ''], ['ok', 5, 'after']])
  t.notOk(silent[1]!.closed, 'the younger one is kept')
})

t.test('maxConnections with silent connections still in set-up: the oldest of them makes room for a newcomer', async (t) => {
  const { server, open } = await serveCore(t, helloTaggedProtocol(), { echo }, { maxConnections: 2, maxNegotiatingConnections: 3 })
  const silent = [await open(), await open()]
  await until(() => server.stats().connectionsOpen === 2, 'both accepted, negotiating')
  const newcomer = await open()
  newcomer.socket.write(Buffer.concat([hello(), taggedRequest('echo', 1, 'in')]))
  await newcomer.until(() => taggedAnswers(newcomer.received).length === 2, 'set up and served')
  await silent[0]!.until(() => silent[0]!.closed, 'the oldest silent one closed')
  t.same([server.stats().negotiatingEvicted, server.stats().connectionsRefused], [1, 0])
  t.notOk(silent[1]!.closed)
})

t.test('negotiationTimeoutMs: a connection that does not finish its set-up in time is closed (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, helloTaggedProtocol(), { echo }, { clock, negotiationTimeoutMs: 500, idleTimeoutMs: 0 })
  const silent = await open()
  const prompt = await open()
  prompt.socket.write(hello())
  await prompt.until(() => taggedAnswers(prompt.received).length === 1, 'set up')
  await until(() => server.stats().connectionsOpen === 2, 'both accepted')
  clock.advance(499)
  await turns(3)
  t.notOk(silent.closed, 'not before the deadline')
  clock.advance(1)
  await silent.until(() => silent.closed, 'closed at the negotiation deadline')
  t.equal(silent.received.length, 0)
  prompt.socket.write(taggedRequest('echo', 1, 'still'))
  await prompt.until(() => taggedAnswers(prompt.received).length === 2, 'served')
  t.notOk(prompt.closed, 'one that finished its set-up is not closed by the timer')
})

t.test('maxNegotiationBytes: a set-up frame over it is closed at its prefix; the limit lifts once set up', async (t) => {
  const { server, open } = await serveCore(t, helloTaggedProtocol(), { echo }, { maxNegotiationBytes: 32, maxMessageBytes: 1024 })
  const greedy = await open()
  greedy.socket.write(taggedRequest('echo', 0, 'h'.repeat(40)).subarray(0, 2))
  await greedy.until(() => greedy.closed, 'closed at the prefix')
  t.equal(greedy.received.length, 0, 'no reply')
  const fine = await open()
  fine.socket.write(Buffer.concat([hello(), taggedRequest('echo', 1, 'x'.repeat(100))]))
  await fine.until(() => taggedAnswers(fine.received).length === 2, 'a 100-byte call after set-up')
  t.same(tally(fine.received), { ok: 2 })
  t.equal(server.stats().connectionsOpen, 1)
})

t.test('maxMessageBytes: a frame over it is closed at its length prefix, the connection\'s close error naming the limit; a scanned one once that many bytes came', async (t) => {
  const closeErrors: Array<Error | undefined> = []
  const watch = (req: Buffer, ctx: CallContext): Buffer => { ctx.connection.once('close', (error) => { closeErrors.push(error) }); return req }
  const { server, open } = await serveCore(t, taggedProtocol(), { echo: watch }, { maxMessageBytes: 100 })
  const peer = await open()
  peer.socket.write(taggedRequest('echo', 1, 'before'))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the call before it')
  peer.socket.write(taggedRequest('echo', 2, 'x'.repeat(200)).subarray(0, 2))
  await peer.until(() => peer.closed, 'the close')
  t.same(taggedAnswers(peer.received), [['ok', 1, 'before']], 'the call before it answered, no reply to the oversize one')
  await until(() => closeErrors.length === 1, 'the close event')
  t.match(closeErrors[0], { code: ErrorCode.FRAME_TOO_LARGE, message: /100/ }, 'FRAME_TOO_LARGE, naming the limit')
  t.equal(server.stats().connectionsOpen, 0)

  const lines = await serveCore(t, linesProtocol(), { echo: (arg: string) => arg }, { maxMessageBytes: 64 })
  const scanned = await lines.open()
  scanned.socket.write('echo ' + 'x'.repeat(40))
  await turns(5)
  t.notOk(scanned.closed, 'within the limit it waits for the end')
  scanned.socket.write('y'.repeat(40))
  await scanned.until(() => scanned.closed, 'closed past the limit')
  t.equal(scanned.text, '')
})

t.test('a frame over maxMessageBytes is counted as a bad frame and logged, as a malformed one is', async (t) => {
  const warnings: string[] = []
  const logger = { error: (m: string) => { warnings.push(m) }, warn: (m: string) => { warnings.push(m) }, info: () => {}, debug: () => {} }
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { maxMessageBytes: 100, logger })
  const peer = await open()
  peer.socket.write(taggedRequest('echo', 2, 'x'.repeat(200)).subarray(0, 2))
  await peer.until(() => peer.closed, 'the close')
  t.equal(server.stats().badFrames, 1, 'counted as a bad frame')
  t.ok(warnings.some(w => /100/.test(w)), 'a warning names the limit')
})

t.test('maxInboundBufferedBytes: past the budget the connection that sent the most of its incomplete frame is closed', async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { maxInboundBufferedBytes: 110_000, maxMessageBytes: 65_537, idleTimeoutMs: 0, frameTimeoutMs: 0 })
  const partial = (bytes: number): Buffer => taggedRequest('echo', 1, Buffer.alloc(65_000)).subarray(0, bytes)
  const peers: Peer[] = []
  for (const bytes of [50_000, 5000, 30_000]) {
    const peer = await open()
    peer.socket.write(partial(bytes))
    peers.push(peer)
    await until(() => server.stats().inboundBudgetClosed > 0 || server.connectionStats().some(c => c.bytesRead >= bytes), `${bytes} bytes read`)
  }
  await peers[0]!.until(() => peers[0]!.closed, 'the largest closed')
  t.equal(server.stats().inboundBudgetClosed, 1, 'one connection closed by the budget')
  t.same(peers.map(p => p.closed), [true, false, false], 'not the newcomer that passed the budget')
  peers[2]!.socket.write(taggedRequest('echo', 1, Buffer.alloc(65_000)).subarray(30_000))
  await peers[2]!.until(() => taggedAnswers(peers[2]!.received).length === 1, 'its frame completed and answered')
  t.same(tally(peers[2]!.received), { ok: 1 })
})

t.test('maxOutboundBytes: a peer that never reads is closed once its unsent answers pass the bound (QUEUE_FULL); others are served', async (t) => {
  const closes: string[] = []
  const closeErrors: Array<Error | undefined> = []
  const watch = (req: Buffer, ctx: CallContext): Buffer => { ctx.connection.once('close', (error) => { closeErrors.push(error) }); return req }
  const { server, open } = await serveCore(t, taggedProtocol(), { echo: watch, sleep: big }, { maxOutboundBytes: 512 * 1024, idleTimeoutMs: 0, maxMessageBytes: 65_537 })
  server.onCallEnd((_call, outcome) => { closes.push(outcome.reason) })
  const hog = await open()
  hog.socket.write(taggedRequest('echo', 999, 'watch'))
  await hog.until(() => taggedAnswers(hog.received).length === 1, 'watching its close')
  hog.received = Buffer.alloc(0)
  hog.socket.pause()
  const calls = 400
  const frames: Buffer[] = []
  for (let i = 0; i < calls; i++) frames.push(taggedRequest('sleep', i, '60000'))
  hog.socket.write(Buffer.concat(frames))
  await until(() => server.stats().connectionsOpen === 0, 'the hog closed')
  const other = await open()
  other.socket.write(taggedRequest('echo', 1, 'fine'))
  await other.until(() => taggedAnswers(other.received).length === 1, 'served')
  hog.socket.resume()
  await hog.until(() => hog.closed, 'its end')
  const answered = taggedAnswers(hog.received).length
  t.match(closeErrors[0], { code: ErrorCode.QUEUE_FULL }, 'closed with QUEUE_FULL')
  const received = server.stats().callsReceived - 2
  t.ok(received < calls, `closed in the middle of its read: ${received} of ${calls} requests became calls`)
  t.ok(answered < received, `it got ${answered} answers of ${received}, the rest dropped with the connection`)
  t.equal(closes.length, received + 2, 'every call that was read ended once')
})

t.test('maxOutboundBytes judges slow readers: a peer reading at once gets its answers though one read of its requests asks for more than the bound', async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { sleep: big }, { maxOutboundBytes: 512 * 1024, idleTimeoutMs: 0, maxMessageBytes: 65_537 })
  const reader = await open()
  // 20 requests in one write (one read): 1.2 MB of answers for a peer that reads everything.
  reader.socket.write(Buffer.concat(Array.from({ length: 20 }, (_, i) => taggedRequest('sleep', i, '60000'))))
  await reader.until(() => reader.closed || taggedAnswers(reader.received).length === 20, 'the answers or the close')
  t.equal(taggedAnswers(reader.received).length, 20, 'every answer')
  t.notOk(reader.closed, 'kept open')
  t.ok(server.stats().callsReceived > 0)
})

t.test('maxOutboundBufferedBytes: over the budget a non-reader stops being read, others are served, and it is read again once it reads', async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, sleep: big }, { maxOutboundBufferedBytes: 256 * 1024, idleTimeoutMs: 0, maxMessageBytes: 65_537 })
  const hog = await open()
  hog.socket.pause()
  const batch = (from: number, count: number): Buffer => Buffer.concat(Array.from({ length: count }, (_, i) => taggedRequest('sleep', from + i, '20000')))
  hog.socket.write(batch(0, 300))
  await until(() => server.stats().outboundPauses >= 1, 'the hog paused')
  const read = server.stats().callsReceived
  hog.socket.write(batch(300, 50))
  await turns(50)
  t.equal(server.stats().callsReceived, read, 'its later requests are not read while paused')
  const reader = await open()
  reader.socket.write(taggedRequest('echo', 9, 'me'))
  await reader.until(() => taggedAnswers(reader.received).length === 1, 'another peer served')
  hog.socket.resume()
  await hog.until(() => taggedAnswers(hog.received).length === 350, 'every call answered once it reads')
  t.same(tally(hog.received), { ok: 350 })
  t.notOk(hog.closed)
})

t.test('pushOutputLimit: past hardBytes unsent a push closes at once; over softBytes for softMs the scan closes it (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const handles: ConnectionHandle[] = []
  const subscribe = (_req: Buffer, ctx: CallContext): Buffer => { handles.push(ctx.connection); return Buffer.from('subscribed') }
  const { server, open } = await serveCore(t, pushingTaggedProtocol(), { echo: subscribe }, { clock, idleTimeoutMs: 0, pushOutputLimit: { hardBytes: 4 * 1024 * 1024, softBytes: 1024 * 1024, softMs: 1000 } })
  const hard = await open()
  const soft = await open()
  for (const peer of [hard, soft]) { peer.socket.pause(); peer.socket.write(taggedRequest('echo', 1)) }
  await until(() => handles.length === 2, 'both subscribed')
  const chunk = Buffer.alloc(60_000)
  // The kernel takes a few MiB first; then the hard limit is passed.
  let sent = 0
  while (handles[0]!.send(chunk) && sent < 2000) sent++
  t.equal(server.stats().pushHardLimitClosed, 1, `the hard limit closed it after ${sent} pushes`)
  t.ok(handles[0]!.isClosed)
  // Above the soft limit (under the hard one), for softMs.
  let softSent = 0
  while (handles[1]!.bufferedBytes < 1.5 * 1024 * 1024 && softSent < 2000) { handles[1]!.send(chunk); softSent++ }
  t.notOk(handles[1]!.isClosed, 'over soft, under hard: kept for now')
  for (let i = 0; i < 6; i++) clock.advance(250)
  await soft.until(() => handles[1]!.isClosed, 'closed by the soft limit')
  t.equal(server.stats().pushSoftLimitClosed, 1)
  t.equal(server.stats().pushesSent, sent + 1 + softSent, 'each push counted, the one that passed the hard limit too')
})

t.test('writeWatermarks: writable turns false past highBytes and a drain event comes at lowBytes', async (t) => {
  const handles: ConnectionHandle[] = []
  const subscribe = (_req: Buffer, ctx: CallContext): Buffer => { handles.push(ctx.connection); return Buffer.from('ok') }
  const { open } = await serveCore(t, pushingTaggedProtocol(), { echo: subscribe }, { idleTimeoutMs: 0, writeWatermarks: { highBytes: 256 * 1024, lowBytes: 1024 } })
  const peer = await open()
  peer.socket.pause()
  peer.socket.write(taggedRequest('echo', 1))
  await until(() => handles.length === 1, 'subscribed')
  const handle = handles[0]!
  let pushes = 0
  while (handle.writable && pushes < 1000) { handle.send(Buffer.alloc(60_000)); pushes++ }
  t.notOk(handle.writable, `not writable after ${pushes} pushes`)
  t.ok(handle.bufferedBytes > 256 * 1024)
  let drains = 0
  handle.on('drain', () => { drains++ })
  peer.socket.resume()
  await until(() => drains === 1, 'the drain event')
  t.ok(handle.writable)
  await peer.until(() => taggedAnswers(peer.received).length === pushes + 1, 'every push and the answer')
})

t.test('queueLength (EDF): a full queue evicts the latest deadline as busy; a newcomer later than all is refused busy', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: gate.handler }, { clock, workers: 1, queueLength: 2, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 0, 'running'))
  await until(() => gate.waiting === 1, 'the worker held')
  peer.socket.write(Buffer.concat([taggedRequest('block', 1, '500:a'), taggedRequest('block', 2, '300:b')]))
  await until(() => server.stats().callsReceived === 3, 'two queued')
  clock.runDeferred()
  peer.socket.write(taggedRequest('block', 3, '100:c'))
  await until(() => server.stats().callsReceived === 4, 'the earlier newcomer')
  clock.runDeferred()
  clock.runDeferred()
  peer.socket.write(taggedRequest('block', 4, '900:d'))
  await until(() => server.stats().callsReceived === 5, 'the later newcomer')
  clock.runDeferred()
  clock.runDeferred()
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'two refusals')
  t.same(taggedAnswers(peer.received).map(([status, id]) => [status, id]), [['busy', 1], ['busy', 4]], 'the latest deadline (500 ms) evicted, then the 900 ms newcomer refused')
  for (let i = 0; i < 3; i++) { gate.releaseOne(); await until(() => gate.waiting === (i < 2 ? 1 : 0), 'the next') }
  await peer.until(() => taggedAnswers(peer.received).length === 5, 'every call settled')
  t.same(gate.started, ['running', '100:c', '300:b'], 'the queued run earliest deadline first')
  t.same(tally(peer.received), { busy: 2, ok: 3 })
})

t.test('queue fifo: a full queue refuses the newcomer, whatever its deadline', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: gate.handler }, { clock, workers: 1, queueLength: 1, queue: 'fifo', idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 0, 'running'))
  await until(() => gate.waiting === 1, 'the worker held')
  peer.socket.write(taggedRequest('block', 1, '900:late'))
  await until(() => server.stats().callsReceived === 2, 'queued')
  clock.runDeferred()
  peer.socket.write(taggedRequest('block', 2, '100:early'))
  await until(() => server.stats().callsReceived === 3, 'the newcomer')
  clock.runDeferred()
  clock.runDeferred()
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'a refusal')
  t.same(taggedAnswers(peer.received)[0]!.slice(0, 2), ['busy', 2], 'the newcomer refused')
  gate.releaseOne()
  await until(() => gate.waiting === 1, 'the queued one runs')
  gate.releaseOne()
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'all settled')
  t.same(tally(peer.received), { busy: 1, ok: 2 })
})

t.test('burstLimit: calls held in a burst are bounded; past it newcomers are judged by the queue at once', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { block: gate.handler }, { clock, workers: 1, queueLength: 1, burstLimit: 2, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(Buffer.concat(Array.from({ length: 6 }, (_, i) => taggedRequest('block', i, `c${i}`))))
  await until(() => server.stats().callsReceived === 6, 'six read')
  // Without a turn of the (fake) clock's deferred work, only calls past the burst bound are judged.
  await peer.until(() => taggedAnswers(peer.received).length > 0, 'refusals at once')
  // One runs, two are held (the bound), one fills the queue, the last two are refused at once.
  await turns(5)
  t.same(taggedAnswers(peer.received).map(a => a.slice(0, 2)), [['busy', 4], ['busy', 5]], 'past the burst bound, judged by the queue at once')
  clock.runDeferred()
  clock.runDeferred()
  await peer.until(() => taggedAnswers(peer.received).length === 4, 'the held ones judged a turn later')
  gate.releaseAll()
  await until(() => gate.waiting === 1, 'the queued one runs')
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 6, 'all settled')
  t.same(tally(peer.received), { busy: 4, ok: 2 })
})

t.test('requestTimeoutMs: a call without a time budget of its own expires in the queue at receipt + requestTimeoutMs (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { block: gate.handler }, { clock, workers: 1, queueLength: 5, requestTimeoutMs: 100, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 0, 'runs'))
  await until(() => gate.waiting === 1, 'running')
  peer.socket.write(Buffer.concat([taggedRequest('block', 1, 'waits'), taggedRequest('block', 2, 'waits too')]))
  await until(() => server.stats().callsReceived === 3, 'queued')
  clock.advance(99)
  await turns(3)
  t.equal(peer.received.length, 0, 'not before the deadline')
  clock.advance(2)
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the queued expired')
  t.same(taggedAnswers(peer.received).map(a => a.slice(0, 2)), [['expired', 1], ['expired', 2]])
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'the running one answered')
  t.same(tally(peer.received), { expired: 2, ok: 1 })
  t.same(gate.started, ['runs'], 'an expired call never runs')
})

t.test('abandonAfterMs: a handler still running past its deadline gives its worker back; maxAbandonedHandlers bounds them', async (t) => {
  const clock = new FakeClock()
  const stuck = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: stuck.handler, echo }, { clock, workers: 1, queueLength: 5, abandonAfterMs: 200, maxAbandonedHandlers: 1, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 1, '100:ignores its deadline'))
  await until(() => stuck.waiting === 1, 'running')
  for (let i = 0; i < 4; i++) clock.advance(100)
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the abandoned call answered')
  t.same(taggedAnswers(peer.received)[0]!.slice(0, 2), ['abandoned', 1])
  t.match(taggedAnswers(peer.received)[0]![2], /abandon/)
  t.equal(server.stats().handlersAbandoned, 1)
  t.equal(server.stats().abandonedRunning, 1)
  peer.socket.write(taggedRequest('echo', 2, 'next'))
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the worker serves the next call')
  // A second stuck handler: the bound of abandoned ones is reached, its worker stays held.
  peer.socket.write(taggedRequest('block', 3, '100:stuck too'))
  await until(() => stuck.waiting === 2, 'the second runs')
  for (let i = 0; i < 4; i++) clock.advance(100)
  await turns(3)
  t.equal(server.stats().handlersAbandoned, 1, 'not abandoned past maxAbandonedHandlers')
  // Its late result still answers it once it finishes; the first one's late result is dropped.
  stuck.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'the held one answered late')
  t.same(tally(peer.received), { abandoned: 1, ok: 2 })
  await until(() => server.stats().abandonedRunning === 0, 'the abandoned one settled')
})

t.test('maxConnectionAgeMs: an old connection answers its calls in flight, refuses new ones shutdown, and closes once quiet (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { block: gate.handler, echo }, { clock, maxConnectionAgeMs: 1000, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 1, 'in flight'))
  await until(() => gate.waiting === 1, 'running')
  for (let i = 0; i < 6; i++) clock.advance(250)
  peer.socket.write(taggedRequest('echo', 2, 'late'))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the late call refused')
  t.same(taggedAnswers(peer.received)[0]!.slice(0, 2), ['shutdown', 2])
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the call in flight answered')
  for (let i = 0; i < 8; i++) clock.advance(250)
  await peer.until(() => peer.closed, 'closed once quiet')
  t.same(tally(peer.received), { shutdown: 1, ok: 1 })
  t.equal(server.stats().agedClosed, 1)
})

t.test('maxConnections: a connection with a call in flight is never closed for a newcomer, however long it has been quiet; once answered it may be (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: gate.handler }, { clock, maxConnections: 1, idleTimeoutMs: 0 })
  const busy = await open()
  busy.socket.write(taggedRequest('block', 1, 'held'))
  await until(() => gate.waiting === 1, 'the held call')
  // The scans see it quiet for over a second, but its call is in flight.
  clock.advance(1000)
  clock.advance(1000)
  const refused = await open()
  await refused.until(() => refused.closed, 'the refusal')
  t.same([server.stats().connectionsRefused, server.stats().connectionsEvicted, busy.closed], [1, 0, false], 'the newcomer refused, the busy one kept')
  gate.releaseAll()
  await busy.until(() => taggedAnswers(busy.received).length === 1, 'the held answer')
  clock.advance(1000)
  clock.advance(1000)
  const admitted = await open()
  await busy.until(() => busy.closed, 'answered and quiet: closed for the next newcomer')
  admitted.socket.write(taggedRequest('echo', 2, 'in'))
  await admitted.until(() => taggedAnswers(admitted.received).length === 1, 'the newcomer served')
  t.same([tally(busy.received), tally(admitted.received)], [{ ok: 1 }, { ok: 1 }])
  t.equal(server.stats().connectionsEvicted, 1)
  t.match(await server.metrics.text(), /^nyala_connections_evicted_total 1$/m, 'evictions are in the metrics')
})

t.test('maxNegotiatingConnections defaults to half of maxConnections: silent connections in set-up make room for a good newcomer', async (t) => {
  const { server, open } = await serveCore(t, helloTaggedProtocol(), { echo }, { maxConnections: 3, negotiationTimeoutMs: 60_000 })
  t.equal(server.limits().maxNegotiatingConnections, 2, 'half of 3, rounded up')
  const silent = [await open(), await open(), await open()]
  await silent[0]!.until(() => silent[0]!.closed, 'the oldest silent one closed for the third')
  const good = await open()
  good.socket.write(Buffer.concat([hello(), taggedRequest('echo', 1, 'in')]))
  await good.until(() => taggedAnswers(good.received).length === 2, 'set up and served')
  t.same(tally(good.received), { ok: 2 })
  t.ok(server.stats().negotiatingEvicted >= 2, `silent ones closed for the newcomers (${server.stats().negotiatingEvicted})`)
  t.equal(server.stats().connectionsRefused, 0, 'nobody refused')
})

t.test('abandonAfterMs counts from the deadline: not abandoned before deadline + abandonAfterMs; the abandoned call is in its method\'s metrics (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const stuck = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: stuck.handler }, { clock, workers: 1, abandonAfterMs: 2000, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 1, '100:ignores its deadline'))
  await until(() => stuck.waiting === 1, 'running')
  clock.advance(100 + 1000)
  await turns(3)
  t.equal(server.stats().handlersAbandoned, 0, 'not before abandonAfterMs past the deadline')
  clock.advance(1000 + 500)
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the abandoned call answered')
  t.same([server.stats().handlersAbandoned, server.stats().abandonedRunning], [1, 1])
  t.equal(server.metrics.snapshot().tagged!.methods.block!.abandoned, 1, 'counted in the metrics')
  stuck.releaseAll()
  await until(() => server.stats().abandonedRunning === 0, 'the late result dropped')
  await turns(3)
  t.same(tally(peer.received), { abandoned: 1 }, 'no second answer for the call')
})

t.test('maxOutboundBufferedBytes: the frame timeout does not run while the server is not reading the connection (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { sleep: big }, { clock, maxOutboundBufferedBytes: 256 * 1024, idleTimeoutMs: 0, frameTimeoutMs: 1000, minFrameBytesPerSecond: 0, maxMessageBytes: 65_537 })
  const hog = await open()
  hog.socket.pause()
  // Requests for 6 MB of answers it does not read, and half a frame behind them that the pause keeps from completing.
  const frames = Buffer.concat([...Array.from({ length: 300 }, (_, i) => taggedRequest('sleep', i, '20000')), taggedRequest('sleep', 999, '1').subarray(0, 4)])
  hog.socket.write(frames)
  await until(() => server.stats().outboundPauses >= 1, 'the hog paused')
  await until(() => server.connectionStats()[0]?.bytesRead === frames.length, 'the half frame read, its timer started')
  for (let i = 0; i < 12; i++) {
    clock.advance(250)
    await turns(2)
  }
  t.equal(server.stats().frameTimeouts, 0, 'not timed out while paused')
  t.notOk(hog.closed)
})

t.test('maxConnectionAgeMs: a retired connection is not closed in the middle of a request frame; the frame, once complete, is refused shutdown (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, maxConnectionAgeMs: 1000, idleTimeoutMs: 0, frameTimeoutMs: 0, minFrameBytesPerSecond: 0 })
  const peer = await open()
  const frame = taggedRequest('echo', 1, 'x'.repeat(60))
  // 40 bytes over 10 s: it reaches its age after 1 s, and the retired-busy limit (5 s) later is still inside the frame.
  for (let i = 0; i < 40 && !peer.closed; i++) {
    peer.socket.write(frame.subarray(i, i + 1))
    await until(() => peer.closed || (server.connectionStats()[0]?.bytesRead ?? 0) >= i + 1, 'the byte read')
    clock.advance(250)
  }
  t.equal(server.stats().agedClosed, 0, 'kept while the frame arrives')
  t.notOk(peer.closed)
  peer.socket.write(frame.subarray(40))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the completed frame answered')
  t.same(taggedAnswers(peer.received).map(a => a.slice(0, 2)), [['shutdown', 1]], 'answered: reconnect')
})

t.test('tlsHandshakeTimeoutMs: a peer that stalls in its TLS handshake is closed at the deadline (FakeClock)', async (t) => {
  withCerts(t, (certs) => {
    t.test('stalled', async (t) => {
      const clock = new FakeClock()
      const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, tls: { cert: certs.serverCert, key: certs.serverKey }, tlsHandshakeTimeoutMs: 2000, idleTimeoutMs: 0, frameTimeoutMs: 0 })
      const stalled = [await open(), await open()]
      // The start of a TLS record holding a ClientHello, and then nothing.
      for (const peer of stalled) peer.socket.write(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]))
      await until(() => server.stats().connectionsOpen === 2, 'both accepted')
      clock.advance(1999)
      t.equal(server.stats().tlsHandshakeTimeouts, 0, 'not before the deadline')
      clock.advance(1)
      t.equal(server.stats().tlsHandshakeTimeouts, 2, 'both closed at the deadline')
      for (const peer of stalled) await peer.until(() => peer.closed, 'closed')
      t.equal(server.stats().connectionsOpen, 0)
    })
  })
})

t.test('limits must be integers of at least 1, rates and graces numbers of at least 0', async (t) => {
  for (const options of [{ maxConnections: 0 }, { maxNegotiatingConnections: 0 }, { minFrameBytesPerSecond: -1 }, { slowFrameGraceMs: Number.NaN }, { writeWatermarks: { highBytes: 10, lowBytes: 20 } }, { tlsHandshakeTimeoutMs: 0 }]) {
    t.throws(() => new ProtocolServer(taggedProtocol(), options), { code: ErrorCode.INVALID_ARGUMENT }, JSON.stringify(options))
  }
})
