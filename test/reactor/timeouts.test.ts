// The generic core's timeouts on the toy protocols, all on a fake clock:
// the server's idle timeout (never while a call is in flight or a slow
// reader takes an answer; 0 disables), its frame timeout and slow-frame
// (minimum rate) eviction, a handler's deadline (ctx.signal aborts exactly
// at it, and the handler's answer on abort is what the peer gets), and
// ProtocolClient's call deadlines (an answer already in the socket beats a
// timer that fires late) and retries against a ProtocolServer.
import t from 'tap'
import { ErrorCode, LinearBackoff, type CallContext, type CallOutcome } from '../../reactor/index.js'
import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { FakeClock, Gate, ManualClock, outcomes, rawServer, serveCore, taggedAnswer, taggedClient, tally, timedTaggedProtocol, turns, until } from '../helpers/core-harness.js'
import type { Peer } from '../helpers/socket-peer.js'
import { linesProtocol, taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

const echo = (req: Buffer): Buffer => req

/** Moves the clock `ms` in steps of `stepMs`, letting I/O run between steps. */
async function pass (clock: FakeClock, ms: number, stepMs = 250): Promise<void> {
  for (let at = 0; at < ms; at += stepMs) {
    clock.advance(Math.min(stepMs, ms - at))
    await turns(2)
  }
}

t.test('idleTimeoutMs: quiet connections and ones stopped inside a frame are closed; one with a call in flight never is', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: gate.handler }, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0, minFrameBytesPerSecond: 0 })
  const quiet = await open()
  const stopped = await open()
  const busy = await open()
  quiet.socket.write(taggedRequest('echo', 1, 'once'))
  stopped.socket.write(taggedRequest('echo', 1, 'half a frame').subarray(0, 6))
  busy.socket.write(taggedRequest('block', 1, 'long'))
  await until(() => gate.waiting === 1 && taggedAnswers(quiet.received).length === 1, 'set up')
  await until(() => server.connectionStats().reduce((n, c) => n + c.bytesRead, 0) === 7 + 4 + 6 + 7 + 4, 'every byte read')
  await pass(clock, 2000)
  await quiet.until(() => quiet.closed && stopped.closed, 'both idle ones closed')
  t.equal(server.stats().idleClosed, 2)
  t.notOk(busy.closed, 'the one with a call in flight is kept')
  gate.releaseAll()
  await busy.until(() => taggedAnswers(busy.received).length === 1, 'its answer')
  await pass(clock, 2000)
  await busy.until(() => busy.closed, 'idle once answered')
  t.equal(server.stats().idleClosed, 3)
  t.same([tally(quiet.received), tally(stopped.received), tally(busy.received)], [{ ok: 1 }, {}, { ok: 1 }])
})

t.test('idleTimeoutMs 0 disables the idle close', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, idleTimeoutMs: 0 })
  const peer = await open()
  await until(() => server.stats().connectionsOpen === 1, 'accepted')
  await pass(clock, 120_000, 10_000)
  t.notOk(peer.closed)
  t.equal(server.stats().idleClosed, 0)
})

t.test('idleTimeoutMs: a slow but steady reader of one large answer is not idle: the kernel taking its bytes is progress', async (t) => {
  const clock = new FakeClock()
  const size = 24 * 1024 * 1024
  const { server, port } = await serveCore(t, linesProtocol(), { big: (arg: string) => 'z'.repeat(Number(arg)) }, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0 })
  // A plain socket, not a Peer: it reads only when the test says.
  const socket: Socket = connect(port, '127.0.0.1')
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  socket.write(`big ${size}\n`)
  await until(() => server.stats().callsSucceeded === 1, 'the answer made')
  // The client takes 1 MiB per 250 ms of server time: one write request the whole while.
  let received = 0
  let closedWhileWriting = false
  for (let step = 0; step < 200 && received <= size; step++) {
    const c = server.connectionStats()[0]
    if (c !== undefined && c.socketBufferedBytes + c.queuedBytes > 0) closedWhileWriting ||= server.stats().idleClosed > 0
    const target = received + 1024 * 1024
    for (let k = 0; k < 500 && received < target && received <= size; k++) {
      for (let chunk = socket.read() as Buffer | null; chunk !== null; chunk = socket.read() as Buffer | null) received += chunk.length
      await turns(1)
    }
    clock.advance(250)
  }
  t.notOk(closedWhileWriting, 'not closed as idle while the answer was being written')
  t.equal(received, size + 1, 'the whole answer arrived')
})

/** Sends `frame` one byte per `everyMs` of the clock, until the server closes the peer or the frame is done. */
async function trickle (clock: FakeClock, peer: Peer, server: { connectionStats: () => Array<{ bytesRead: number }> }, frame: Buffer, everyMs: number): Promise<number> {
  let sent = 0
  while (!peer.closed && sent < frame.length) {
    peer.socket.write(frame.subarray(sent, sent + 1))
    sent++
    const want = sent
    await until(() => peer.closed || (server.connectionStats()[0]?.bytesRead ?? 0) >= want, 'the byte read')
    clock.advance(everyMs)
    await turns(2)
  }
  return sent
}

t.test('frameTimeoutMs: a frame trickled too slowly to finish in time is closed, though never idle', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 3000, minFrameBytesPerSecond: 0 })
  const peer = await open()
  const sent = await trickle(clock, peer, server, taggedRequest('echo', 1, 'x'.repeat(40)), 500)
  await peer.until(() => peer.closed, 'closed')
  t.same([server.stats().frameTimeouts, server.stats().idleClosed], [1, 0], 'by the frame timeout, not as idle')
  t.ok(sent >= 6 && sent <= 9, `closed at 3000 ms within a scan period (${sent} bytes at 500 ms each)`)
  t.equal(peer.received.length, 0)
})

t.test('minFrameBytesPerSecond: past slowFrameGraceMs a frame arriving below the rate is closed; a faster one is not', async (t) => {
  const clock = new FakeClock()
  const { server, open } = await serveCore(t, taggedProtocol(), { echo }, { clock, idleTimeoutMs: 0, frameTimeoutMs: 0, minFrameBytesPerSecond: 4, slowFrameGraceMs: 2000 })
  const slow = await open()
  // One byte a second: below 4 bytes/s past the 2 s grace.
  const sent = await trickle(clock, slow, server, taggedRequest('echo', 1, 'y'.repeat(40)), 1000)
  await slow.until(() => slow.closed, 'the slow one closed')
  t.equal(server.stats().slowFramesClosed, 1)
  t.ok(sent < 47, `closed before its frame completed (${sent} of 47 bytes)`)
  const fast = await open()
  // Ten bytes a second: above the rate; it completes and is answered.
  const frame = taggedRequest('echo', 2, 'z'.repeat(40))
  for (let at = 0; at < frame.length; at += 10) {
    fast.socket.write(frame.subarray(at, at + 10))
    await until(() => server.connectionStats().some(c => c.bytesRead >= Math.min(at + 10, frame.length)), 'read')
    clock.advance(1000)
    await turns(2)
  }
  await fast.until(() => taggedAnswers(fast.received).length === 1, 'answered')
  t.same(tally(fast.received), { ok: 1 })
  t.equal(server.stats().slowFramesClosed, 1, 'the fast one was kept')
})

t.test('a handler\'s deadline: ctx.signal aborts at it, not before, and what the handler answers on abort is the answer', async (t) => {
  const clock = new FakeClock()
  const aborted: number[] = []
  const ends: CallOutcome[] = []
  const patient = (_req: Buffer, ctx: CallContext): Promise<Buffer> => new Promise((_resolve, reject) => {
    ctx.signal.addEventListener('abort', () => { aborted.push(clock.now()); reject(new Error('gave up at the deadline')) })
  })
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: patient }, { clock, idleTimeoutMs: 0 })
  server.onCallEnd((_call, outcome) => { ends.push(outcome) })
  const peer = await open()
  const start = clock.now()
  peer.socket.write(Buffer.concat([taggedRequest('block', 1, '200:a'), taggedRequest('block', 2, '300:b')]))
  await until(() => server.stats().callsInFlight === 2, 'both running')
  clock.advance(199)
  await turns(3)
  t.same(aborted, [], 'not before the deadline')
  clock.advance(1)
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the first answered')
  clock.advance(100)
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the second answered')
  t.same(aborted, [start + 200, start + 300], 'each at its own deadline')
  t.same(taggedAnswers(peer.received).map(a => a.slice(0, 2)), [['failed', 1], ['failed', 2]])
  t.match(taggedAnswers(peer.received)[0]![2], /gave up at the deadline/)
  t.same(ends.map(e => e.reason), ['failed', 'failed'], 'two calls, two ends')
  t.equal(server.metrics.snapshot().tagged!.methods.block!.timedOutOnResponse, 0, 'answering at (not after) the deadline is not late')
})

t.test('ProtocolClient deadline (FakeClock): calls the server holds time out at their deadline, each exactly once; the server sees them closed or answered', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, port } = await serveCore(t, taggedProtocol(), { block: gate.handler, echo }, { idleTimeoutMs: 0 })
  const client = taggedClient(t, port, { clock, retry: false })
  const held = Array.from({ length: 5 }, (_, i) => client.call({ route: 'block', payload: `h${i}` }, { timeoutMs: 100 }))
  let settled = 0
  for (const call of held) void call.then(() => { settled++ }, () => { settled++ })
  await until(() => gate.waiting === 5, 'all five running on the server')
  clock.advance(99)
  await turns(3)
  t.equal(settled, 0, 'none before the deadline')
  clock.advance(1)
  t.same(await outcomes(held), { [ErrorCode.DEADLINE_EXCEEDED]: 5 })
  // Their late answers are dropped; the connection goes on.
  gate.releaseAll()
  t.equal(await client.call({ route: 'echo', payload: 'after' }, { timeoutMs: 1000 }), 'after')
  await until(() => server.stats().callsInFlight === 0, 'the server finished them')
  t.equal(server.stats().callsReceived, 6)
})

t.test('ProtocolClient retries (FakeClock): a call refused busy goes again after its backoff and succeeds; maxAttempts ends the rest', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const ends: string[] = []
  const { server, port } = await serveCore(t, taggedProtocol(), { block: gate.handler }, { workers: 1, queueLength: 1, idleTimeoutMs: 0 })
  server.onCallEnd((_call, outcome) => { ends.push(outcome.reason) })
  const client = taggedClient(t, port, { clock, retry: { backoff: new LinearBackoff({ stepMs: 100 }), budget: null, maxAttempts: 3 } })
  const calls = ['a', 'b', 'c'].map(payload => client.call({ route: 'block', payload }, { timeoutMs: 10_000 }))
  await until(() => ends.includes('busy'), 'one refused busy')
  t.same([gate.started, ends], [['a'], ['busy']], 'one runs, one waits, one is refused')
  gate.releaseOne()
  await until(() => gate.waiting === 1 && gate.started.length === 2, 'the queued one runs')
  // The refused one goes again after 100 ms of the client's clock and waits in the queue.
  clock.advance(100)
  await until(() => server.stats().callsReceived === 4, 'the retry')
  gate.releaseOne()
  await until(() => gate.started.length === 3, 'the retry runs')
  gate.releaseOne()
  t.same(await outcomes(calls), { ok: 3 })
  t.equal(client.stats().retries, 1)

  // With the worker and queue held, each attempt is refused: the third is the last.
  const hold = [client.call({ route: 'block', payload: 'x' }), client.call({ route: 'block', payload: 'y' })]
  await until(() => gate.waiting === 1 && server.stats().callsReceived === 6, 'worker and queue held')
  const refused = client.call({ route: 'block', payload: 'z' }, { timeoutMs: 10_000 })
  for (const step of [100, 200]) {
    const before = server.stats().callsReceived
    await until(() => ends.filter(e => e === 'busy').length === 1 + (step / 100), 'refused')
    clock.advance(step)
    await until(() => server.stats().callsReceived === before + 1, 'attempt')
  }
  const error = await refused.catch((e: unknown) => e as { code: string, remote?: { name: string } })
  t.match(error, { code: ErrorCode.REMOTE, remote: { name: 'busy' } }, 'the last refusal is the call\'s error')
  t.equal(client.stats().exhausted, 1)
  t.equal(client.stats().retries, 3)
  gate.releaseAll()
  await until(() => gate.waiting === 1, 'the queued one runs')
  gate.releaseAll()
  t.same(await outcomes(hold), { ok: 2 })
  t.same(ends.filter(e => e === 'busy').length, 4, 'four refusals, each an attempt')
})

t.test('ProtocolClient (event-loop stall): a call timer that fires late loses to an answer already in the socket; with nothing to read it times the call out', async (t) => {
  const requests: Array<{ socket: Socket, id: number }> = []
  const { port } = await rawServer(t, (socket, chunk) => {
    for (let at = 0; at + 7 <= chunk.length; at += 2 + chunk.readUInt16BE(at)) requests.push({ socket, id: chunk.readUInt32BE(at + 3) })
  })
  const clock = new ManualClock()
  const client = taggedClient(t, port, { clock, retry: false })
  const first = client.call({ route: 'echo', payload: 'connect' }, { timeoutMs: 0 })
  await until(() => requests.length === 1, 'the first request')
  requests[0]!.socket.write(taggedAnswer(requests[0]!.id, 'connected'))
  t.equal(await first, 'connected')

  const call = client.call({ route: 'echo', payload: 'x' }, { timeoutMs: 100 })
  await until(() => requests.length === 2, 'the request')
  // From a timers-phase callback (as after a stall): the answer reaches the
  // client's kernel buffer, then the call's overdue timer fires before the
  // client has read it. The deferred check must see the answer first.
  await new Promise<void>((resolve) => setTimeout(() => {
    requests[1]!.socket.write(taggedAnswer(requests[1]!.id, 'in time'))
    clock.fire(100)
    resolve()
  }, 0))
  t.equal(await call, 'in time', 'no spurious timeout')

  // Control: with nothing to read, the same timer does time the call out.
  const lost = client.call({ route: 'echo', payload: 'y' }, { timeoutMs: 100 })
  await until(() => requests.length === 3, 'the third request')
  await new Promise<void>((resolve) => setTimeout(() => { clock.fire(100); resolve() }, 0))
  t.same(await outcomes([lost]), { [ErrorCode.DEADLINE_EXCEEDED]: 1 })
  t.equal(clock.pendingTimers, 0, 'no call timer left behind')
  // Its late answer is dropped; the connection goes on.
  const next = client.call({ route: 'echo', payload: 'z' }, { timeoutMs: 0 })
  await until(() => requests.length === 4, 'the fourth request')
  requests[2]!.socket.write(Buffer.concat([taggedAnswer(requests[2]!.id, 'too late'), taggedAnswer(requests[3]!.id, 'z!')]))
  t.equal(await next, 'z!')
})
