// KRPC's timeouts: timeout_millis on the wire, timeouts during and behind KRPC negotiation, the server's deadline from timeout_millis.
// The generic timeouts (idle, frame, slow frames, handler deadlines, client deadlines and a stalled loop) are tested in test/reactor/timeouts.test.ts.
import t from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CalculatorService, Probe, newClient, settle, startServer, track, turns, rejection } from '../helpers/reactor-harness.js'
import { FakeServer } from '../helpers/krpc-peers.js'

const AddResponse = CalculatorService.methods.Add.responseType

t.test('a call times out exactly at its deadline, not before; the late answer is ignored', async (t) => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const clock = new FakeClock()
  const client = newClient(t, { endpoint: fake.endpoint, clock })
  const calc = client.service(CalculatorService)
  let sent = 0
  for (const timeoutMs of [1, 50, 500, 2500]) {
    const call = track(calc.Add({ x: 1, y: 2 }, { timeoutMs }))
    const peer = await fake.peer()
    await peer.callsReceived(++sent)
    const frame = peer.calls[sent - 1]!
    t.equal(frame.header.timeout_millis, timeoutMs, `timeout_millis ${timeoutMs} on the wire`)
    clock.advance(timeoutMs - 1)
    await turns(2)
    t.notOk(call.settled(), `${timeoutMs} ms: still pending 1 ms before the deadline`)
    clock.advance(1)
    t.equal(await call.done, ErrorCode.DEADLINE_EXCEEDED, `${timeoutMs} ms: times out at the deadline`)
    // The server answers late: ignored, and the connection keeps working.
    peer.respond(frame.header.call_id, AddResponse, { result: 3 })
  }
  const error = await rejection((async () => {
    const p = calc.Add({ x: 1, y: 1 }, { timeoutMs: 10 })
    await fake.peers[0]!.callsReceived(++sent)
    clock.advance(10)
    return await p
  })())
  t.notMatch(error.message, /negotiation/, 'a timeout after negotiation does not blame negotiation')
  t.equal(error.code, ErrorCode.DEADLINE_EXCEEDED)

  const ok = calc.Add({ x: 5, y: 6 }, { timeoutMs: 1000 })
  const peer = fake.peers[0]!
  await peer.callsReceived(++sent)
  peer.respond(peer.calls[sent - 1]!.header.call_id, AddResponse, { result: 11 })
  t.same(await ok, { result: 11 })
  t.equal(fake.peers.length, 1, 'all on one connection')
  t.equal(client.pendingCalls, 0)
})

t.test('timeoutMs 0 means no deadline: no timer, no timeout_millis', async (t) => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const clock = new FakeClock()
  const client = newClient(t, { endpoint: fake.endpoint, clock, defaultTimeoutMs: 0 })
  const call = track(client.service(CalculatorService).Add({ x: 1, y: 2 }))
  const peer = await fake.peer()
  const frame = await peer.nextCall()
  t.equal(frame.header.timeout_millis ?? 0, 0)
  clock.advance(24 * 3600 * 1000)
  await turns(2)
  t.notOk(call.settled(), 'still waiting a day later')
  peer.respond(frame.header.call_id, AddResponse, { result: 3 })
  t.equal(await call.done, 'OK')
})

t.test('a server that accepts but never negotiates: the call times out blaming negotiation', async (t) => {
  const fake = await FakeServer.start({ negotiate: false })
  t.teardown(() => fake.close())
  const clock = new FakeClock()
  const client = newClient(t, { endpoint: fake.endpoint, clock })
  const call = track(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 200 }))
  const peer = await fake.peer()
  clock.advance(199)
  await turns(2)
  t.notOk(call.settled())
  clock.advance(1)
  t.equal(await call.done, ErrorCode.DEADLINE_EXCEEDED)
  t.equal(peer.calls.length, 0)
  const again = client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 50 })
  clock.advance(50)
  t.match((await rejection(again)).message, /negotiation/, 'the message says negotiation')
})

t.test('the client\'s negotiation deadline fails every waiting call with NEGOTIATION_FAILED', async (t) => {
  const fake = await FakeServer.start({ negotiate: false })
  t.teardown(() => fake.close())
  const clock = new FakeClock()
  const client = newClient(t, { endpoint: fake.endpoint, clock, negotiationTimeoutMs: 100 })
  const calc = client.service(CalculatorService)
  const calls = [calc.Add({ x: 1, y: 2 }, { timeoutMs: 10_000 }), calc.Echo({ data: 'x' }, { timeoutMs: 0 })].map(p => rejection(p))
  const peer = await fake.peer()
  clock.advance(100)
  for (const error of await Promise.all(calls)) {
    t.equal(error.code, ErrorCode.NEGOTIATION_FAILED)
    t.match(error.message, /negotiation/)
  }
  await peer.closed
  t.pass('the stalled connection was dropped')
  t.equal(client.connectionCount, 0)
})

t.test('a call that times out while queued behind negotiation is never sent; negotiation carries on', async (t) => {
  let releaseAuth!: () => void
  const authGate = new Promise<void>((resolve) => { releaseAuth = resolve })
  let authStarted!: () => void
  const authCalled = new Promise<void>((resolve) => { authStarted = resolve })
  const probe = new Probe()
  const { endpoint, server } = await startServer(t, {
    handlers: probe.handlers(),
    authenticate: async () => {
      authStarted()
      await authGate
      return true
    }
  })
  const clock = new FakeClock()
  const client = newClient(t, { endpoint, clock })
  const calc = client.service(CalculatorService)

  const early = track(calc.Add({ x: 1, y: 1 }, { timeoutMs: 50 }))
  await authCalled
  clock.advance(50)
  t.equal(await early.done, ErrorCode.DEADLINE_EXCEEDED, 'the short call times out during negotiation')

  // The connection's negotiation was not bound to that call's timeout.
  const later = calc.Add({ x: 2, y: 2 }, { timeoutMs: 10_000 })
  releaseAuth()
  t.same(await later, { result: 4 })
  t.equal(server.stats().callsReceived, 1, 'only the live call reached the server')
  t.same(probe.calls.map(c => c.callId), [1], 'the timed-out call kept its id but was dropped unsent')
  t.equal(server.stats().connectionsAccepted, 1, 'the same connection was used')
  t.equal(client.connectionCount, 1)
})

t.test('deadline propagation: the server\'s deadline is receipt time + timeout_millis, cached on the call', async (t) => {
  const serverClock = new FakeClock(50_000)
  const clientClock = new FakeClock()
  const probe = new Probe()
  let sleeping: CallContext | undefined
  probe.hooks.Sleep = (ctx) => { sleeping = ctx }
  const { endpoint } = await startServer(t, { handlers: probe.handlers(), clock: serverClock })
  const client = newClient(t, { endpoint, clock: clientClock, defaultTimeoutMs: 777 })
  const calc = client.service(CalculatorService)

  await calc.Add({ x: 1, y: 1 }, { timeoutMs: 1234 })
  await calc.Add({ x: 1, y: 1 }, { timeoutMs: 0 })
  await calc.Add({ x: 1, y: 1 })
  const [withTimeout, without, byDefault] = probe.calls
  t.equal(withTimeout!.deadline, 50_000 + 1234, 'finite deadline: receipt + timeout_millis')
  t.equal(withTimeout!.remainingMs, 1234)
  t.equal(without!.deadline, Infinity, 'timeoutMs 0: no deadline')
  t.equal(without!.remainingMs, Infinity)
  t.equal(byDefault!.deadline, 50_000 + 777, 'the client default applies')

  // The deadline is computed once: time passing on the server shrinks what is left, not the deadline.
  const sleep = settle(calc.Sleep({ sleep_micros: 60_000_000 }, { timeoutMs: 1000 }))
  await probe.started('Sleep')
  const ctx = sleeping!
  const signal = ctx.signal
  serverClock.advance(300)
  t.equal(ctx.deadline, 50_000 + 1000)
  t.equal(ctx.remainingMs(), 700)
  t.notOk(signal.aborted)
  serverClock.advance(700)
  t.ok(signal.aborted, 'the handler\'s signal aborts at the deadline')
  t.equal((signal.reason as RpcError).code, ErrorCode.DEADLINE_EXCEEDED)
  t.equal(ctx.remainingMs(), 0)
  // The handler gave up at the deadline the client set: the server sends
  // nothing (deadline-answer.test.ts), and the client times out on its own clock.
  clientClock.advance(1000)
  t.equal(await sleep, ErrorCode.DEADLINE_EXCEEDED)
})
