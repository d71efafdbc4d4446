// Slowloris at the connection limit: peers that each trickle a frame a
// byte every 300 ms are never idle, so the idle rule never makes room for
// a newcomer. The minimum frame rate does: at the limit, a frame arriving
// below `minFrameBytesPerSecond` for over a second makes room, and the
// scan closes one still below it past `slowFrameGraceMs`. Time is a
// FakeClock; the scan runs when the test moves it.
import t from 'tap'
import { FakeClock } from '../../scheduling/clock.js'
import { isSlowFrame, slowestFrame } from '../../reactor/admission.js'
import { CalculatorService, newClient, startServer, turns, type Running } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, negotiatedRaw as negotiated, requestFrame, untilReady as until } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const EchoRequest = CalculatorService.methods.Echo.requestType

function echoFrame (callId: number, bytes: number): Buffer {
  return requestFrame(callId, SERVICE, 'Echo', EchoRequest.encode({ data: 'e'.repeat(bytes) }))
}

const bytesRead = (running: Running): number => running.server.connectionStats().reduce((n, c) => n + c.bytesRead, 0)

/** Each open peer sends its next `step` bytes; waits until the server read them all, then moves the clock. */
async function trickle (running: Running, peers: Array<{ raw: RawClient, frame: Buffer, sent: number }>, step: number, ms: number, clock: FakeClock): Promise<void> {
  let expected = bytesRead(running)
  for (const p of peers) {
    if (p.raw.isClosed || p.sent >= p.frame.length - 1) continue
    const n = Math.min(step, p.frame.length - 1 - p.sent)
    p.raw.write(p.frame.subarray(p.sent, p.sent + n))
    p.sent += n
    expected += n
  }
  await until(() => bytesRead(running) >= expected || peers.some(p => p.raw.isClosed))
  clock.advance(ms)
  await turns(2)
}

t.test('the rule: the grace, then minFrameBytesPerSecond for every second past it', async (t) => {
  t.notOk(isSlowFrame(0, 1000, 1000, 1000), 'not within the grace')
  t.ok(isSlowFrame(3, 1100, 1000, 1000), '3 bytes 100 ms past the grace: slow')
  t.notOk(isSlowFrame(200, 1100, 1000, 1000), '200 bytes 100 ms past it: not')
  t.notOk(isSlowFrame(0, 60_000, 1000, 0), 'a rate of 0 disables it')
  const progress = new Map([['fast', { bytes: 100_000, arrivingMs: 5000 }], ['slow', { bytes: 10, arrivingMs: 3000 }], ['slower', { bytes: 5, arrivingMs: 3000 }], ['fresh', { bytes: 0, arrivingMs: 900 }]])
  t.equal(slowestFrame(progress.keys(), (k) => progress.get(k)!, 1000), 'slower')
  t.equal(slowestFrame(['fast', 'fresh'], (k) => progress.get(k)!, 1000), null)
})

t.test('tricklers holding every connection: each good newcomer gets in, a trickler makes room', async (t) => {
  const clock = new FakeClock()
  const max = 4
  // Frames that would take minutes at a byte per 300 ms: only the 60 s frame timeout would end them.
  const running = await startServer(t, { clock, maxConnections: max, idleTimeoutMs: 65_000, frameTimeoutMs: 60_000 })
  const peers: Array<{ raw: RawClient, frame: Buffer, sent: number }> = []
  for (let i = 0; i < max; i++) peers.push({ raw: await negotiated(running.port), frame: echoFrame(0, 1000), sent: 0 })
  t.teardown(() => { for (const p of peers) p.raw.close() })
  // 2.4 s of a byte per 300 ms: never idle for a second, far below the rate.
  for (let i = 0; i < 8; i++) await trickle(running, peers, 1, 300, clock)
  t.equal(running.server.stats().connectionsOpen, max, 'the tricklers hold every connection')
  t.equal(running.server.stats().idleClosed, 0, 'none idle')
  let served = 0
  for (let round = 0; round < 2; round++) {
    const client = newClient(t, { endpoint: running.endpoint })
    t.same(await client.service(CalculatorService).Add({ x: 40, y: 2 }, { timeoutMs: 10_000 }), { result: 42 }, `good client ${round} is served`)
    served++
    client.close()
    await until(() => peers.some(p => p.raw.isClosed))
    // The evicted trickler comes back and trickles again.
    const gone = peers.findIndex(p => p.raw.isClosed)
    if (gone >= 0) peers[gone] = { raw: await negotiated(running.port), frame: echoFrame(0, 1000), sent: 0 }
    for (let i = 0; i < 5; i++) await trickle(running, peers, 1, 300, clock)
  }
  const stats = running.server.stats()
  t.equal(served, 2)
  t.equal(stats.connectionsRefused, 0, 'no newcomer refused')
  t.ok(stats.connectionsEvicted >= 2, `tricklers evicted for them (${stats.connectionsEvicted})`)
  t.equal(stats.slowFramesClosed, stats.connectionsEvicted, 'each for its slow frame')
  t.match(await running.server.metrics.text(), new RegExp(`^nyala_connections_slow_frame_closed_total ${stats.slowFramesClosed}$`, 'm'), 'counted in the metrics')
})

t.test('the scan closes a frame still below the rate past slowFrameGraceMs; a fast large frame and a slow one under minFrameBytesPerSecond: 0 are kept', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, idleTimeoutMs: 65_000, frameTimeoutMs: 60_000, slowFrameGraceMs: 2000 })
  const slow = { raw: await negotiated(running.port), frame: echoFrame(0, 1000), sent: 0 }
  // 3 000 bytes per 300 ms of server time: 10 000 bytes/s, a large frame over a slow but real link.
  const fast = { raw: await negotiated(running.port), frame: echoFrame(1, 200_000), sent: 0 }
  t.teardown(() => { slow.raw.close(); fast.raw.close() })
  for (let i = 0; i < 30 && !slow.raw.isClosed; i++) {
    await trickle(running, [slow], 1, 0, clock)
    await trickle(running, [fast], 3000, 300, clock)
  }
  t.ok(await until(() => slow.raw.isClosed, 200), 'the trickler is closed')
  t.equal(running.server.stats().slowFramesClosed, 1, 'for its slow frame')
  t.equal(running.server.stats().frameTimeouts, 0, 'long before the frame timeout')
  t.notOk(fast.raw.isClosed, 'the fast frame is kept')
  fast.raw.write(fast.frame.subarray(fast.sent))
  const answer = await fast.raw.nextResponse()
  t.equal(answer.header.call_id, 1)
  t.notOk(answer.header.is_error === true, 'and answered')

  const off = await startServer(t, { clock, idleTimeoutMs: 65_000, frameTimeoutMs: 60_000, slowFrameGraceMs: 2000, minFrameBytesPerSecond: 0 })
  const kept = { raw: await negotiated(off.port), frame: echoFrame(0, 1000), sent: 0 }
  t.teardown(() => kept.raw.close())
  for (let i = 0; i < 12; i++) await trickle(off, [kept], 1, 300, clock)
  t.notOk(kept.raw.isClosed, 'minFrameBytesPerSecond: 0 turns it off')
  t.equal(off.server.stats().slowFramesClosed, 0)
})

t.test('minFrameBytesPerSecond and slowFrameGraceMs must be numbers of at least 0', async (t) => {
  const { Server } = await import('../../reactor/krpc/server.js')
  t.throws(() => new Server({ minFrameBytesPerSecond: -1 }), { code: 'RPC_ERR_INVALID_ARGUMENT' })
  t.throws(() => new Server({ slowFrameGraceMs: Number.NaN }), { code: 'RPC_ERR_INVALID_ARGUMENT' })
})
