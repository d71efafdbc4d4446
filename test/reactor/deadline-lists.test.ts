/**
 * Client calls with the same timeout share one deadline timer: many calls
 * arm one timer, calls answered out of order leave the list, the rest time
 * out exactly at their deadlines, mixed timeouts expire in deadline order, a
 * stuck call at the front does not keep hundreds of finished ones, calls
 * made one after another share one timer that outlives them harmlessly,
 * and no timer is left behind.
 */
import t, { type Test } from 'tap'
import { ErrorCode } from '../../codec/errors.js'
import { FakeClock } from '../../scheduling/clock.js'
import { FakeServer } from '../helpers/krpc-peers.js'
import { CalculatorService, newClient, settle, tally, turns } from '../helpers/reactor-harness.js'

const AddResponse = CalculatorService.methods.Add.responseType

async function setup (t: Test): Promise<{ fake: FakeServer, clock: FakeClock, calc: ReturnType<typeof calcOf>, client: ReturnType<typeof newClient> }> {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const clock = new FakeClock()
  const client = newClient(t, { endpoint: fake.endpoint, clock })
  return { fake, clock, calc: calcOf(client), client }
}

function calcOf (client: ReturnType<typeof newClient>) {
  return client.service(CalculatorService)
}

t.test('100 calls with one timeout arm one timer; answered ones leave, the rest expire at the deadline', async t => {
  const { fake, clock, calc } = await setup(t)
  const outcomes = Array.from({ length: 100 }, (_, i) => settle(calc.Add({ x: i, y: 0 }, { timeoutMs: 1000 })))
  const peer = await fake.peer()
  await peer.callsReceived(100)
  t.equal(clock.pendingTimers, 1, 'one shared timer, not 100')
  // Answer the second half, out of order.
  for (let i = 99; i >= 50; i--) peer.respond(peer.calls[i]!.header.call_id, AddResponse, { result: i })
  t.same(tally(await Promise.all(outcomes.slice(50))), { OK: 50 })
  t.equal(clock.pendingTimers, 1, 'the timer stays for the calls still waiting')
  clock.advance(999)
  await turns(2)
  clock.advance(1)
  t.same(tally(await Promise.all(outcomes)), { OK: 50, [ErrorCode.DEADLINE_EXCEEDED]: 50 })
  t.equal(clock.pendingTimers, 0, 'no timer left')
})

t.test('mixed timeouts expire in deadline order', async t => {
  const { fake, clock, calc } = await setup(t)
  const order: number[] = []
  const calls = [300, 100, 200, 100, 300].map((timeoutMs) => calc.Add({ x: 1, y: 1 }, { timeoutMs }).catch(() => { order.push(timeoutMs) }))
  const peer = await fake.peer()
  await peer.callsReceived(5)
  for (const step of [100, 100, 100]) {
    clock.advance(step)
    await turns(2)
  }
  await Promise.all(calls)
  t.same(order, [100, 100, 200, 300, 300])
  t.equal(clock.pendingTimers, 0)
})

t.test('a stuck call at the front: finished calls behind it are dropped, and it still times out', async t => {
  const { fake, clock, calc } = await setup(t)
  const stuck = settle(calc.Add({ x: 0, y: 0 }, { timeoutMs: 5000 }))
  const peer = await fake.peer()
  await peer.callsReceived(1)
  for (let round = 0; round < 3; round++) {
    const batch = Array.from({ length: 200 }, (_, i) => settle(calc.Add({ x: i, y: 1 }, { timeoutMs: 5000 })))
    const first = peer.calls.length
    await peer.callsReceived(first + 200)
    for (let i = first; i < first + 200; i++) peer.respond(peer.calls[i]!.header.call_id, AddResponse, { result: 1 })
    t.same(tally(await Promise.all(batch)), { OK: 200 })
    clock.advance(1000)
  }
  clock.advance(2000)
  t.equal(await stuck, ErrorCode.DEADLINE_EXCEEDED)
  t.equal(clock.pendingTimers, 0)
})

t.test('fractional timeouts (a retry\'s remaining time) get timers of their own and still expire', async t => {
  const { fake, clock, calc } = await setup(t)
  const a = settle(calc.Add({ x: 1, y: 1 }, { timeoutMs: 10.5 }))
  const b = settle(calc.Add({ x: 1, y: 1 }, { timeoutMs: 20.25 }))
  await (await fake.peer()).callsReceived(2)
  t.equal(clock.pendingTimers, 2)
  clock.advance(21)
  t.same([await a, await b], [ErrorCode.DEADLINE_EXCEEDED, ErrorCode.DEADLINE_EXCEEDED])
  t.equal(clock.pendingTimers, 0)
})

t.test('calls made one after another share one timer; it outlives them, fires once harmlessly, and close() clears it', async t => {
  const { fake, clock, calc, client } = await setup(t)
  const first = calc.Add({ x: 0, y: 1 }, { timeoutMs: 1000 })
  const peer = await fake.peer()
  await peer.callsReceived(1)
  peer.respond(peer.calls[0]!.header.call_id, AddResponse, { result: 1 })
  t.same(await first, { result: 1 })
  t.equal(clock.pendingTimers, 1, 'the emptied list keeps its timer')
  // A sync caller: each call waits for the previous one.
  for (let i = 1; i <= 20; i++) {
    clock.advance(10)
    const call = calc.Add({ x: i, y: 1 }, { timeoutMs: 1000 })
    await peer.callsReceived(i + 1)
    peer.respond(peer.calls[i]!.header.call_id, AddResponse, { result: i + 1 })
    t.same(await call, { result: i + 1 })
    t.equal(clock.pendingTimers, 1, `call ${i}: still the one timer`)
  }
  // One call still waiting when the first deadline passes: the timer re-arms for it alone.
  const last = settle(calc.Add({ x: 0, y: 0 }, { timeoutMs: 1000 }))
  await peer.callsReceived(22)
  clock.advance(800)
  await turns(2)
  t.equal(clock.pendingTimers, 1, 'fired once at the first deadline, re-armed for the waiting call')
  clock.advance(1000)
  t.equal(await last, ErrorCode.DEADLINE_EXCEEDED)
  t.equal(clock.pendingTimers, 0, 'nothing left to wait for: no timer')
  // After another call, close() takes the list's timer with it.
  const again = calc.Add({ x: 2, y: 2 }, { timeoutMs: 1000 })
  await peer.callsReceived(23)
  peer.respond(peer.calls[22]!.header.call_id, AddResponse, { result: 4 })
  t.same(await again, { result: 4 })
  t.equal(clock.pendingTimers, 1)
  client.close()
  t.equal(clock.pendingTimers, 0, 'close() clears the timer')
})
