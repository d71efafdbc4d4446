// Hostile peers against the server's limits: peers that stop inside a
// frame or trickle one, that together park more than the inbound budget,
// that open more connections than the server keeps, that never read their
// answers (alone and during shutdown), handlers that ignore their deadline,
// and oversized negotiation. Time is a FakeClock wherever the server
// decides by time; the scan runs when the test moves it.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CalculatorService, calculatorHandlers, newClient, settle, startServer, tally, turns, type Running } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, negotiatedRaw as negotiated, requestFrame, untilReady as until } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const AddRequest = CalculatorService.methods.Add.requestType
const EchoRequest = CalculatorService.methods.Echo.requestType

/** `count` pipelined Echo calls of `bytes` each, ids 0..count-1. */
function echoFrames (count: number, bytes: number): Buffer {
  const body = EchoRequest.encode({ data: 'e'.repeat(bytes) })
  const frames: Buffer[] = []
  for (let i = 0; i < count; i++) frames.push(requestFrame(i, SERVICE, 'Echo', body))
  return Buffer.concat(frames)
}

function addFrame (callId: number, timeoutMs?: number): Buffer {
  return requestFrame(callId, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 2 }), timeoutMs === undefined ? {} : { timeoutMs })
}

async function stillServes (t: Test, running: Running, clock?: FakeClock): Promise<void> {
  const client = newClient(t, { endpoint: running.endpoint, ...(clock === undefined ? {} : { clock }) })
  t.same(await client.service(CalculatorService).Add({ x: 40, y: 2 }), { result: 42 }, 'a normal client is served')
  client.close()
}

t.test('a peer that stops inside a frame is closed after the idle timeout (it used to count as busy forever)', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0 })
  const frame = addFrame(0)
  const big = Buffer.alloc(4)
  big.writeUInt32BE(50 * 1024 * 1024 - 4)
  const cases: Array<[string, Buffer]> = [
    ['10 bytes of an Add', frame.subarray(0, 10)],
    ['a whole frame but its last byte', frame.subarray(0, frame.length - 1)],
    ['2 bytes of a length prefix', frame.subarray(0, 2)],
    ['a 50 MiB prefix and 1 MiB', Buffer.concat([big, Buffer.alloc(1024 * 1024)])]
  ]
  const peers: RawClient[] = []
  for (const [, bytes] of cases) {
    const raw = await negotiated(running.port)
    raw.write(bytes)
    peers.push(raw)
  }
  t.ok(await until(() => running.server.stats().connectionsOpen === cases.length && running.server.connectionStats().reduce((n, c) => n + c.bytesRead, 0) >= 1024 * 1024), 'every partial frame arrived')
  // Scans see the partial frames and no progress after them.
  for (let i = 0; i < 8; i++) clock.advance(250)
  await Promise.all(peers.map(p => p.closed))
  t.equal(running.server.stats().idleClosed, cases.length, 'each closed as idle')
  t.equal(running.server.stats().connectionsOpen, 0)
  for (const [i, [name]] of cases.entries()) t.equal(peers[i]!.frames.filter(f => f.header.call_id >= 0).length, 0, `${name}: no answer`)
  await stillServes(t, running)
})

t.test('a peer that trickles a frame is closed at the frame timeout, though never idle', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 3000 })
  const frame = addFrame(0)
  const raw = await negotiated(running.port)
  const base = running.server.connectionStats()[0]!.bytesRead
  let sent = 0
  // One byte every 500 ms of server time: progress, but the frame never completes in time.
  while (!raw.isClosed && sent < frame.length - 1) {
    raw.write(frame.subarray(sent, sent + 1))
    sent++
    await until(() => raw.isClosed || running.server.connectionStats()[0]!.bytesRead >= base + sent)
    clock.advance(500)
    await turns(2)
  }
  await raw.closed
  const stats = running.server.stats()
  t.equal(stats.frameTimeouts, 1, 'closed by the frame timeout')
  t.equal(stats.idleClosed, 0, 'not as idle: bytes kept coming')
  t.ok(sent >= 3000 / 500 && sent <= 3000 / 500 + 2, `closed at the frame timeout, within a scan period (${sent} bytes sent)`)
  await stillServes(t, running)
})

t.test('partial frames of all connections stay within the inbound budget: the peer that sent the most is closed', async (t) => {
  const budget = 2 * 1024 * 1024
  const running = await startServer(t, { maxInboundBufferedBytes: budget, idleTimeoutMs: 0, frameTimeoutMs: 0 })
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(8 * 1024 * 1024)
  const peers: RawClient[] = []
  // Parts of 8 MiB frames: held memory grows with what arrived (at most
  // twice), not with the 8 MiB announced. 900 + 300 KiB fit; 600 more pass the budget.
  for (const kib of [900, 300, 600]) {
    const raw = await negotiated(running.port)
    raw.write(Buffer.concat([prefix, Buffer.alloc(kib * 1024)]))
    peers.push(raw)
    await until(() => raw.isClosed || running.server.stats().inboundBudgetClosed > 0 || running.server.connectionStats().some(c => c.bytesRead >= kib * 1024))
  }
  await until(() => running.server.stats().inboundBudgetClosed >= 1)
  const stats = running.server.stats()
  t.equal(stats.inboundBudgetClosed, 1, 'the budget closed one connection')
  await peers[0]!.closed
  t.pass('the one that had sent the most (900 KiB) is closed, not the newcomer that passed the budget')
  t.notOk(peers[1]!.isClosed)
  t.notOk(peers[2]!.isClosed)
  t.equal(stats.connectionsOpen, 2)
  for (const p of peers) p.close()
  await stillServes(t, running)
})

t.test('connection limit: a newcomer closes the connection idle longest, or is refused when none is idle', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, maxConnections: 3, idleTimeoutMs: 0, frameTimeoutMs: 60_000 })
  const first = [await negotiated(running.port), await negotiated(running.port), await negotiated(running.port)]
  // Fresh connections have activity the scan has not seen: none may be closed yet.
  const refused = await RawClient.connect(running.port)
  await refused.closed
  t.equal(running.server.stats().connectionsRefused, 1, 'refused at once with none idle')
  t.equal(refused.bytesReceived, 0)
  // Scans see them quiet for over a second: the oldest idle one makes room.
  clock.advance(1000)
  clock.advance(1000)
  const admitted = await negotiated(running.port)
  t.notOk(admitted.isClosed, 'admitted')
  await first[0]!.closed
  t.equal(running.server.stats().connectionsEvicted, 1, 'one idle connection closed for it')
  const text = await running.server.metrics.text()
  t.match(text, /^nyala_connections_refused_total 1$/m, 'refusals are in the metrics')
  t.match(text, /^nyala_connections_evicted_total 1$/m, 'evictions are in the metrics')
  t.notOk(first[1]!.isClosed)
  t.notOk(first[2]!.isClosed)
  // A connection with a call in flight is never closed for a newcomer.
  for (const raw of [first[1]!, first[2]!, admitted]) raw.close()
  await until(() => running.server.stats().connectionsOpen === 0)
  t.equal(running.server.stats().connectionsOpen, 0)
})

t.test('a connection with a call in flight is not closed for a newcomer', async (t) => {
  const clock = new FakeClock()
  let release: () => void = () => {}
  const blocked = new Promise<void>((resolve) => { release = resolve })
  const running = await startServer(t, {
    clock, maxConnections: 1, idleTimeoutMs: 0, abandonAfterMs: 0,
    handlers: { ...calculatorHandlers, Sleep: async () => { await blocked; return {} } }
  })
  const busy = await negotiated(running.port)
  busy.write(requestFrame(0, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 1 })))
  await until(() => running.server.stats().callsInFlight === 1)
  clock.advance(1000)
  clock.advance(1000)
  const refused = await RawClient.connect(running.port)
  await refused.closed
  t.equal(running.server.stats().connectionsRefused, 1)
  t.equal(running.server.stats().connectionsEvicted, 0)
  t.notOk(busy.isClosed)
  release()
  await busy.nextResponse()
  busy.close()
})

t.test('negotiating connections have their own limit: the oldest makes room', async (t) => {
  const running = await startServer(t, { maxNegotiatingConnections: 2 })
  const silent = [await RawClient.connect(running.port), await RawClient.connect(running.port)]
  await until(() => running.server.stats().connectionsOpen === 2)
  const third = await RawClient.connect(running.port)
  await silent[0]!.closed
  t.equal(running.server.stats().negotiatingEvicted, 1)
  t.notOk(silent[1]!.isClosed)
  for (const raw of [silent[1]!, third]) raw.close()
  await stillServes(t, running)
})

t.test('a 40 MiB negotiation frame is refused at its prefix; a 300-byte user name gets FATAL_UNAUTHORIZED', async (t) => {
  const running = await startServer(t)
  const raw = await RawClient.connect(running.port)
  const handshake = clientHandshakeBytes()
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(40 * 1024 * 1024)
  // The preamble (7 bytes), then a SASL_INITIATE announcing 40 MiB and 64 KiB of it.
  raw.write(Buffer.concat([handshake.subarray(0, 7), prefix, Buffer.alloc(64 * 1024)]))
  await raw.closed
  t.equal(raw.bytesReceived, 0, 'closed without an answer')

  const long = newClient(t, { endpoint: running.endpoint, user: 'u'.repeat(300) })
  const error = await long.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }).then(() => null, (e: unknown) => e as RpcError)
  t.equal(error?.code, ErrorCode.NEGOTIATION_FAILED)
  t.equal(error?.remote?.code, KrpcCode.FATAL_UNAUTHORIZED)
  long.close()
  const ok = newClient(t, { endpoint: running.endpoint, user: 'u'.repeat(256) })
  t.same(await ok.service(CalculatorService).Add({ x: 1, y: 2 }), { result: 3 }, 'a 256-byte user name is accepted')
  ok.close()
})

t.test('negotiation frames over the limit close the connection; the limit lifts once negotiated', async (t) => {
  const running = await startServer(t, { maxNegotiationBytes: 200 })
  const raw = await RawClient.connect(running.port)
  const handshake = clientHandshakeBytes()
  const big = Buffer.alloc(4 + 300)
  big.writeUInt32BE(300)
  raw.write(Buffer.concat([handshake.subarray(0, 7), big]))
  await raw.closed
  t.equal(raw.bytesReceived, 0)
  // A call frame larger than the negotiation limit, right behind the handshake in one write.
  const after = await RawClient.connect(running.port)
  after.write(Buffer.concat([handshake, requestFrame(0, SERVICE, 'Echo', EchoRequest.encode({ data: 'x'.repeat(1000) }))]))
  const response = await after.nextResponse()
  t.equal(response.header.call_id, 0)
  t.notOk(response.header.is_error === true, 'answered')
  after.close()
})

t.test('close() resolves by the end of its grace period though a peer never reads its answers', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, idleTimeoutMs: 0 })
  const raw = await negotiated(running.port)
  raw.socket.pause()
  // Answers that fill the kernel buffers and then the socket's own.
  raw.write(echoFrames(200, 64 * 1024))
  await until(() => running.server.stats().callsSucceeded === 200 || running.server.connectionStats()[0]?.drainWaits! > 0)
  t.ok(running.server.connectionStats()[0]!.socketBufferedBytes + running.server.connectionStats()[0]!.queuedBytes > 0, 'answers wait to go out')
  let closed = false
  const closing = running.server.close({ graceMs: 1000 }).then(() => { closed = true })
  await turns(20)
  t.notOk(closed, 'still flushing within the grace period')
  clock.advance(1000)
  await until(() => closed)
  t.ok(closed, 'resolved at the end of the grace period')
  await closing
  raw.close()
})

t.test('the demo Sleep ends at its deadline: stuck sleeps do not lock out a good Add', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, workers: 10, queueLength: 0 })
  const raw = await negotiated(running.port)
  const sleeps: Buffer[] = []
  for (let i = 0; i < 10; i++) sleeps.push(requestFrame(i, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 20_000_000 }), { timeoutMs: 100 }))
  raw.write(Buffer.concat(sleeps))
  await until(() => running.server.stats().callsInFlight === 10)
  raw.close()
  clock.advance(100)
  await until(() => running.server.stats().callsInFlight === 0)
  t.equal(running.server.stats().callsInFlight, 0, 'every Sleep ended with its deadline')
  await stillServes(t, running)
})

t.test('a handler that ignores its deadline is abandoned after abandonAfterMs: its worker serves others', async (t) => {
  const clock = new FakeClock()
  const stuck: Array<() => void> = []
  const running = await startServer(t, {
    clock, workers: 1, queueLength: 0, abandonAfterMs: 2000,
    handlers: { ...calculatorHandlers, Sleep: () => new Promise((resolve) => { stuck.push(() => resolve({})) }) }
  })
  const raw = await negotiated(running.port)
  raw.write(requestFrame(0, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 1 }), { timeoutMs: 100 }))
  await until(() => stuck.length === 1)
  raw.write(addFrame(1))
  // Burst absorption holds it for a turn of the (fake) clock's deferred work first.
  await until(() => { clock.runDeferred(); return raw.frames.some(f => f.header.call_id === 1) })
  const busy = await raw.nextResponse()
  t.equal(busy.header.call_id, 1)
  t.equal(busy.header.is_error, true, 'the one worker is held: TOO_BUSY')
  clock.advance(100 + 1000)
  t.equal(running.server.stats().handlersAbandoned, 0, 'not before abandonAfterMs past the deadline')
  clock.advance(1000 + 500)
  t.equal(running.server.stats().handlersAbandoned, 1, 'abandoned')
  t.equal(running.server.stats().abandonedRunning, 1)
  t.equal(running.server.metrics.snapshot()[SERVICE]!.methods.Sleep!.abandoned, 1, 'counted in metrics')
  const abandoned = await raw.nextResponse()
  t.equal(abandoned.header.call_id, 0, 'the abandoned call is answered (its client gave up long ago)')
  raw.write(addFrame(2))
  const served = await raw.nextResponse()
  t.equal(served.header.call_id, 2)
  t.notOk(served.header.is_error === true, 'the worker serves a good Add')
  stuck[0]!()
  await until(() => running.server.stats().abandonedRunning === 0)
  t.equal(running.server.stats().abandonedRunning, 0, 'its late result is dropped')
  t.equal(raw.frames.filter(f => f.header.call_id === 0).length, 1, 'no second answer for the call')
  raw.close()
})

t.test('abandoned handlers are bounded: past maxAbandonedHandlers the worker stays held and the service answers TOO_BUSY', async (t) => {
  const clock = new FakeClock()
  const stuck: Array<() => void> = []
  const running = await startServer(t, {
    clock, workers: 2, queueLength: 0, abandonAfterMs: 1000, maxAbandonedHandlers: 1,
    handlers: { ...calculatorHandlers, Sleep: () => new Promise((resolve) => { stuck.push(() => resolve({})) }) }
  })
  const raw = await negotiated(running.port)
  for (const id of [0, 1]) raw.write(requestFrame(id, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 1 }), { timeoutMs: 100 }))
  await until(() => stuck.length === 2)
  raw.close()
  await until(() => running.server.stats().connectionsOpen === 0)
  clock.advance(5000)
  t.equal(running.server.stats().handlersAbandoned, 1, 'only one abandoned')
  const client = newClient(t, { endpoint: running.endpoint })
  const calc = client.service(CalculatorService)
  // Two more Sleeps: the worker given back takes one, the held worker cannot take the other.
  const first = settle(calc.Sleep({ sleep_micros: 1 }))
  await until(() => stuck.length === 3)
  const second = settle(calc.Sleep({ sleep_micros: 1 }))
  let refused: string | undefined
  void second.then((o) => { refused = o })
  await until(() => { clock.runDeferred(); return refused !== undefined })
  t.equal(refused, 'REMOTE:ERROR_SERVER_TOO_BUSY', 'the service is saturated: TOO_BUSY')
  for (const resolve of stuck) resolve()
  t.equal(await first, 'OK')
  await until(() => running.server.stats().abandonedRunning === 0)
  client.close()
})

t.test('the outbound budget pauses reading from the heaviest non-reader and resumes below it', async (t) => {
  const running = await startServer(t, { maxOutboundBufferedBytes: 2 * 1024 * 1024, idleTimeoutMs: 0 })
  const reader = await negotiated(running.port)
  const hog = await negotiated(running.port)
  hog.socket.pause()
  hog.write(echoFrames(64, 256 * 1024))
  t.ok(await until(() => running.server.stats().outboundPauses >= 1, 20_000), 'the non-reader is paused')
  const answered = running.server.stats().callsSucceeded
  await turns(50)
  t.equal(running.server.stats().callsSucceeded, answered, 'no more of its requests are read')
  // Another client is still read and served.
  reader.write(addFrame(0))
  const response = await reader.nextResponse()
  t.notOk(response.header.is_error === true)
  // Reading the answers brings the total below the budget: the hog's requests are read again.
  hog.socket.resume()
  t.ok(await until(() => hog.frames.filter(f => f.header.call_id >= 0).length === 64, 20_000), 'every call answered once it reads')
  for (const raw of [reader, hog]) raw.close()
})

t.test('the error status of an abandoned call names the abandonment', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, {
    clock, workers: 1, abandonAfterMs: 500,
    handlers: { ...calculatorHandlers, Sleep: () => new Promise(() => {}) }
  })
  const raw = await negotiated(running.port)
  raw.write(requestFrame(0, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 1 }), { timeoutMs: 100 }))
  await until(() => running.server.stats().callsInFlight === 1)
  clock.advance(1000)
  const answer = await raw.nextResponse()
  const status = ErrorStatusType.decode(answer.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, KrpcCode.ERROR_APPLICATION)
  t.match(status.message, /abandoned/)
  raw.close()
})

t.test('a slow but steady reader of one large answer is not idle: the kernel taking its bytes is progress', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0 })
  const raw = await negotiated(running.port)
  raw.socket.pause()
  raw.write(requestFrame(0, SERVICE, 'Echo', EchoRequest.encode({ data: 'z'.repeat(24 * 1024 * 1024) })))
  await until(() => running.server.stats().callsSucceeded === 1, 20_000)
  // The client takes 1 MiB per 250 ms of server time: one write request the whole while.
  let received = 0
  let closedWhileWriting = false
  for (let step = 0; step < 200 && received < 24 * 1024 * 1024; step++) {
    const c = running.server.connectionStats()[0]
    if (c !== undefined && c.socketBufferedBytes + c.queuedBytes > 0) closedWhileWriting ||= running.server.stats().idleClosed > 0
    const target = received + 1024 * 1024
    for (let k = 0; k < 500 && received < target; k++) {
      for (let chunk = raw.socket.read(); chunk !== null; chunk = raw.socket.read()) received += (chunk as Buffer).length
      await turns(1)
    }
    clock.advance(250)
  }
  t.notOk(closedWhileWriting, 'not closed as idle while the answer was being written')
  t.ok(received >= 24 * 1024 * 1024, `the whole answer arrived (${received} bytes)`)
  raw.close()
})

t.test('a handler rejecting with a value that has no string form is answered ERROR_APPLICATION and frees its worker', async (t) => {
  const running = await startServer(t, {
    workers: 1,
    handlers: { ...calculatorHandlers, Sleep: async () => { throw Object.create(null) } }
  })
  const client = newClient(t, { endpoint: running.endpoint })
  const calc = client.service(CalculatorService)
  t.equal(await settle(calc.Sleep({ sleep_micros: 1 })), 'REMOTE:ERROR_APPLICATION')
  t.same(await calc.Add({ x: 1, y: 2 }), { result: 3 }, 'the worker is free')
  client.close()
})

t.test('silent connections at the connection limit: the oldest negotiating one makes room', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, maxConnections: 3, negotiationTimeoutMs: 60_000 })
  const silent = [await RawClient.connect(running.port), await RawClient.connect(running.port), await RawClient.connect(running.port)]
  await until(() => running.server.stats().connectionsOpen === 3)
  t.equal(running.server.limits().maxNegotiatingConnections, 2, 'by default at most half the connections negotiate')
  await silent[0]!.closed
  const client = newClient(t, { endpoint: running.endpoint })
  t.same(await client.service(CalculatorService).Add({ x: 1, y: 2 }), { result: 3 }, 'a good client gets in')
  t.ok(running.server.stats().negotiatingEvicted >= 2)
  t.equal(running.server.stats().connectionsRefused, 0)
  for (const raw of silent) raw.close()
  client.close()
})

t.test('the frame timeout does not run while the server is not reading the connection (outbound budget)', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, maxOutboundBufferedBytes: 1024 * 1024, idleTimeoutMs: 0, frameTimeoutMs: 1000 })
  const hog = await negotiated(running.port)
  hog.socket.pause()
  // And half a frame behind them, which the pause keeps from being completed.
  const frames = Buffer.concat([echoFrames(64, 256 * 1024), addFrame(99).subarray(0, 10)])
  hog.write(frames)
  t.ok(await until(() => running.server.stats().outboundPauses >= 1, 20_000), 'paused')
  await until(() => running.server.connectionStats()[0]?.bytesRead === clientHandshakeBytes().length + frames.length, 200)
  for (let i = 0; i < 12; i++) {
    clock.advance(250)
    await turns(2)
  }
  t.equal(running.server.stats().frameTimeouts, 0, 'not timed out while paused')
  t.notOk(hog.isClosed)
  hog.close()
})

t.test('a retired connection is not closed in the middle of a request frame', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, idleTimeoutMs: 0, frameTimeoutMs: 0, maxConnectionAgeMs: 1000 })
  const raw = await negotiated(running.port)
  const base = running.server.connectionStats()[0]!.bytesRead
  const frame = addFrame(0)
  // 40 bytes of a frame over 10 s: it reaches its age after 1 s, and RETIRED_BUSY_LIMIT_MS (5 s) later is still inside the frame.
  for (let i = 0; i < 40 && !raw.isClosed; i++) {
    raw.write(frame.subarray(i, i + 1))
    await until(() => raw.isClosed || running.server.connectionStats()[0]!.bytesRead >= base + i + 1)
    clock.advance(250)
  }
  t.equal(running.server.stats().agedClosed, 0, 'kept while the frame arrives')
  t.notOk(raw.isClosed)
  raw.write(frame.subarray(40))
  const answer = await raw.nextResponse()
  const status = ErrorStatusType.decode(answer.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, KrpcCode.FATAL_SERVER_SHUTTING_DOWN, 'answered: reconnect')
  raw.close()
})

t.test('limits must be at least 1', async (t) => {
  const { Server } = await import('../../reactor/krpc/server.js')
  t.throws(() => new Server({ maxNegotiatingConnections: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => new Server({ maxConnections: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
})
