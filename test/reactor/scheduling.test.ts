// The generic server's scheduling on a toy protocol whose requests carry a
// time budget (timedTaggedProtocol: payload `NNN:...`): earliest deadline
// first in the queue, the latest deadline evicted from a full queue (calls
// without one first), the most recently parked worker takes the next call,
// a call that finds a parked worker never waits in the queue, deadlines
// computed once per call when its frame completed, burst absorption (a
// call held past a full queue is served if a worker made progress before
// the check), and the direct scheduler. FakeClock throughout: the burst
// check runs when the test says.
import t from 'tap'
import { ProtocolServer, type CallContext } from '../../reactor/index.js'
import type { InboundCall } from '../../reactor/inbound-call.js'
import { FakeClock, Gate, serveCore, tally, timedTaggedProtocol, turns, until } from '../helpers/core-harness.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'
import { Peer } from '../helpers/socket-peer.js'
import { connect } from 'node:net'
import { once } from 'node:events'

const echo = (req: Buffer): Buffer => req

t.test('EDF: queued calls run earliest deadline first; calls without a deadline after every call with one', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: gate.handler }, { clock, workers: 1, queueLength: 10, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 0, 'first'))
  await until(() => gate.waiting === 1, 'the worker held')
  const queued = ['400:d', 'none-1', '100:a', '300:c', 'none-2', '200:b']
  peer.socket.write(Buffer.concat(queued.map((p, i) => taggedRequest('block', i + 1, p))))
  await until(() => server.stats().callsReceived === 7, 'all read')
  clock.runDeferred()
  clock.runDeferred()
  for (let i = 0; i < queued.length + 1; i++) {
    gate.releaseOne()
    await until(() => gate.started.length === Math.min(i + 2, queued.length + 1) && taggedAnswers(peer.received).length === i + 1, `call ${i + 1}`)
  }
  t.same(gate.started, ['first', '100:a', '200:b', '300:c', '400:d', 'none-1', 'none-2'], 'deadline order, then arrival order')
  t.same(tally(peer.received), { ok: 7 })
})

t.test('eviction: a full queue evicts its latest deadline, a call without one first; a newcomer later than all is refused', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: gate.handler }, { clock, workers: 1, queueLength: 2, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 0, 'first'))
  await until(() => gate.waiting === 1, 'the worker held')
  const send = async (id: number, payload: string): Promise<void> => {
    const before = server.stats().callsReceived
    peer.socket.write(taggedRequest('block', id, payload))
    await until(() => server.stats().callsReceived === before + 1, `call ${id}`)
    clock.runDeferred()
    clock.runDeferred()
  }
  await send(1, 'no deadline')
  await send(2, '500:late')
  await send(3, '100:early')
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the first eviction')
  await send(4, '300:middle')
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the second eviction')
  await send(5, '900:latest')
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'the refusal')
  t.same(taggedAnswers(peer.received).map(([status, id]) => [status, id]), [['busy', 1], ['busy', 2], ['busy', 5]],
    'no deadline evicted first, then the latest (500), and the 900 ms newcomer refused')
  gate.releaseAll()
  for (let i = 0; i < 2; i++) { await until(() => gate.waiting === 1, 'the next queued'); gate.releaseAll() }
  await peer.until(() => taggedAnswers(peer.received).length === 6, 'all settled')
  t.same(gate.started, ['first', '100:early', '300:middle'])
  t.same(tally(peer.received), { busy: 3, ok: 3 })
  const block = server.metrics.snapshot().tagged!.methods.block!
  t.same([block.evictions, block.queueOverflows], [2, 1], 'two evictions and one refusal in the metrics')
})

t.test('LIFO: the most recently parked worker takes the next call', async (t) => {
  const gate = new Gate()
  const workers: number[] = []
  const block = (req: Buffer, ctx: CallContext): Promise<Buffer> => {
    // The worker slot of an in-loop handler (InboundCall.worker, marked internal: no other window on it).
    workers.push((ctx as InboundCall).worker)
    return gate.handler(req)
  }
  const { open } = await serveCore(t, timedTaggedProtocol(), { block }, { workers: 3, queueLength: 3, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('block', 1, 'a'), taggedRequest('block', 2, 'b'), taggedRequest('block', 3, 'c')]))
  await until(() => gate.waiting === 3, 'three running')
  t.equal(new Set(workers).size, 3, 'three distinct workers')
  const [wa, wb, wc] = workers
  // They finish a, then c, then b: b's worker parked last.
  for (const answer of ['a', 'c', 'b']) {
    gate.release(answer)
    await peer.until(() => taggedAnswers(peer.received).some(([, , text]) => text === answer), `${answer} answered`)
  }
  peer.socket.write(taggedRequest('block', 4, 'd'))
  await until(() => gate.waiting === 1, 'd running')
  t.equal(workers[3], wb, 'd runs on the worker parked last (b\'s)')
  peer.socket.write(taggedRequest('block', 5, 'e'))
  await until(() => workers.length === 5, 'e running')
  t.equal(workers[4], wc, 'e on the one parked before it (c\'s)')
  t.not(workers[4], wa)
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 5, 'all answered')
  t.same(tally(peer.received), { ok: 5 })
})

t.test('hand-off: a call that finds a parked worker runs at once, without waiting a turn in the queue (FakeClock, nothing deferred run)', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: gate.handler, echo }, { clock, workers: 2, queueLength: 1, idleTimeoutMs: 0 })
  const peer = await open()
  for (let i = 0; i < 5; i++) {
    peer.socket.write(taggedRequest('echo', i, `sequential ${i}`))
    await peer.until(() => taggedAnswers(peer.received).length === i + 1, `answer ${i}`)
  }
  peer.socket.write(Buffer.concat([taggedRequest('block', 10, 'x'), taggedRequest('block', 11, 'y')]))
  await until(() => gate.waiting === 2, 'both workers taken at once')
  t.equal(server.stats().callsReceived, 7)
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 7, 'all answered')
  t.same(tally(peer.received), { ok: 7 })
})

t.test('deadlines are computed once per call, when its whole frame has arrived', async (t) => {
  const clock = new FakeClock()
  const seen: Array<{ deadline: number, remainingAtStart: number, deadlineLater: number, remainingLater: number }> = []
  const received: number[] = []
  let release: (() => void) | null = null
  const watch = async (req: Buffer, ctx: CallContext): Promise<Buffer> => {
    const deadline = ctx.deadline
    const remainingAtStart = ctx.remainingMs()
    await new Promise<void>(resolve => { release = resolve })
    seen.push({ deadline, remainingAtStart, deadlineLater: ctx.deadline, remainingLater: ctx.remainingMs() })
    return req
  }
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: watch }, { clock, idleTimeoutMs: 0, frameTimeoutMs: 0, minFrameBytesPerSecond: 0 })
  server.onCallEnd((call) => { received.push(call.receivedAt) })
  const peer = await open()
  const frame = taggedRequest('block', 1, '1000:split')
  const start = clock.now()
  peer.socket.write(frame.subarray(0, 5))
  await until(() => server.connectionStats()[0]?.bytesRead === 5, 'the first part')
  clock.advance(300)
  peer.socket.write(frame.subarray(5))
  await until(() => release !== null, 'the handler')
  clock.advance(400)
  release!()
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the answer')
  t.same(seen, [{ deadline: start + 300 + 1000, remainingAtStart: 1000, deadlineLater: start + 1300, remainingLater: 600 }],
    'from the completed frame (not its first byte); unchanged while time passes')
  t.same(received, [start + 300], 'the call was received when its frame completed')
})

t.test('burst absorption: a call held past a full queue is served when a worker made progress before the one-turn check', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { block: gate.handler, echo }, { clock, workers: 1, queueLength: 1, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 1, 'blocker'))
  await until(() => gate.waiting === 1, 'the worker held')
  peer.socket.write(Buffer.concat([taggedRequest('echo', 2, 'queued'), taggedRequest('echo', 3, 'held')]))
  await until(() => server.stats().callsReceived === 3, 'three read')
  await turns(5)
  t.equal(peer.received.length, 0, 'the saturating call waits for the check, not refused')
  // The worker finishes (and drains the queue) before the check runs.
  gate.releaseOne()
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'the blocker and the queued one answered')
  await turns(5)
  t.same(taggedAnswers(peer.received).map(a => a[1]), [1, 2], 'the held one still waits for the check')
  clock.runDeferred()
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'the held one served')
  t.same(tally(peer.received), { ok: 3 })
  t.equal(server.metrics.snapshot().tagged!.methods.echo!.queueOverflows, 0, 'nothing refused')
})

t.test('scheduler "direct": every handler runs at once, unbounded; no queue, no busy', async (t) => {
  const gate = new Gate()
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { block: gate.handler }, { scheduler: 'direct', workers: 1, queueLength: 1, idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(Buffer.concat(Array.from({ length: 20 }, (_, i) => taggedRequest('block', i, `c${i}`))))
  await until(() => gate.waiting === 20, 'all twenty running')
  t.equal(server.stats().callsInFlight, 20)
  gate.releaseAll()
  await peer.until(() => taggedAnswers(peer.received).length === 20, 'all answered')
  t.same(tally(peer.received), { ok: 20 })
})

t.test('a burst is not an overload: 1,000 pipelined calls with the default workers and queue are all answered, sync and async handlers alike', async (t) => {
  const later = async (req: Buffer): Promise<Buffer> => { await new Promise(resolve => setImmediate(resolve)); return req }
  const { server, open } = await serveCore(t, timedTaggedProtocol(), { echo, sleep: later }, { idleTimeoutMs: 0 })
  for (const route of ['echo', 'sleep']) {
    const peer = await open()
    peer.socket.write(Buffer.concat(Array.from({ length: 1000 }, (_, i) => taggedRequest(route, i, `${i}`))))
    await peer.until(() => taggedAnswers(peer.received).length === 1000, `1,000 ${route} answers`)
    t.same(tally(peer.received), { ok: 1000 }, `${route}: none refused busy`)
    t.equal(new Set(taggedAnswers(peer.received).map(a => a[1])).size, 1000, 'each id once')
  }
  t.equal(server.stats().callsSucceeded, 2000)
})

t.test('groups have their own queue and workers; a group\'s options override the server\'s', async (t) => {
  const clock = new FakeClock()
  const gate = new Gate()
  // Both groups speak `tagged`; the route byte picks the group here.
  const base = taggedProtocol()
  const protocol = { ...base, decodeHead (buf: Buffer, start: number, end: number, head: Parameters<typeof base.decodeHead>[3]) { const e = base.decodeHead(buf, start, end, head); if (e === null && buf.toString('latin1', start + 7, start + 9) === 'B:') head.service = 'other'; return e } }
  const server = new ProtocolServer(protocol, { clock, logger: null, workers: 1, queueLength: 1, idleTimeoutMs: 0 })
  server.addRoutes('tagged', { block: gate.handler })
  server.addRoutes('other', { block: gate.handler }, { workers: 3, queueLength: 10 })
  const { port } = await server.listen(0, '127.0.0.1')
  const socket = connect(port, '127.0.0.1')
  const peer = new Peer(socket)
  t.teardown(async () => { socket.destroy(); await server.close({ graceMs: 0 }) })
  await once(socket, 'connect')
  peer.socket.write(Buffer.concat([
    ...Array.from({ length: 4 }, (_, i) => taggedRequest('block', i, `A:${i}`)),
    ...Array.from({ length: 20 }, (_, i) => taggedRequest('block', 100 + i, `B:${i}`))
  ]))
  await until(() => server.stats().callsReceived === 24, 'all read')
  clock.runDeferred()
  clock.runDeferred()
  await peer.until(() => taggedAnswers(peer.received).length === 2 + 7, 'the refusals')
  const busy = taggedAnswers(peer.received).filter(a => a[0] === 'busy').map(a => a[1])
  t.equal(busy.filter(id => id < 100).length, 2, 'the server\'s group: 1 worker + 1 queued of 4, 2 busy')
  t.equal(busy.filter(id => id >= 100).length, 7, 'the other: 3 workers + 10 queued of 20, 7 busy')
  t.equal(gate.waiting, 4, 'one worker in one group, three in the other')
  while (gate.waiting > 0) { gate.releaseAll(); await turns(3) }
  await peer.until(() => taggedAnswers(peer.received).length === 24, 'all settled')
  t.same(tally(peer.received), { busy: 9, ok: 15 })
})
