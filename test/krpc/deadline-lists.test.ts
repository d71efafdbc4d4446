/**
 * Client calls with the same timeout share one deadline timer: many calls
 * arm one timer, calls answered out of order leave the list, the rest time
 * out exactly at their deadlines, mixed timeouts expire in deadline order, a
 * stuck call at the front does not keep hundreds of finished ones, calls
 * made one after another share one timer that outlives them harmlessly,
 * and no timer is left behind. Calls made in one microtask checkpoint get
 * their deadline from one clock reading taken when it ends: never earlier
 * than the caller's clock, even when time moves during the checkpoint.
 */
import t, { type Test } from 'tap'
import { ErrorCode } from '../../codec/errors.js'
import { FakeClock, type Clock } from '../../scheduling/clock.js'
import { FakeServer } from '../helpers/krpc-peers.js'
import { CalculatorService, newClient, settle, tally, track, turns } from '../helpers/reactor-harness.js'

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

t.test('calls of one checkpoint share one clock reading, taken when it ends: time spent in it never shortens a deadline', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  // Timers from a fake clock; time that also moves while the program runs,
  // as a real clock's does (no beforeStep): each call below "takes" 1 ms.
  const timers = new FakeClock(0)
  let time = 0
  let reads = 0
  const clock: Clock = {
    now: () => { reads++; return time },
    setTimer: (callback, ms) => timers.setTimer(callback, ms),
    clearTimer: (handle) => timers.clearTimer(handle),
    defer: (callback) => timers.defer(callback)
  }
  const calc = calcOf(newClient(t, { endpoint: fake.endpoint, clock }))
  const warm = calc.Add({ x: 0, y: 0 }, { timeoutMs: 0 })
  const peer = await fake.peer()
  await peer.callsReceived(1)
  peer.respond(peer.calls[0]!.header.call_id, AddResponse, { result: 0 })
  await warm
  reads = 0
  const calls: Array<ReturnType<typeof track>> = []
  for (let i = 0; i < 10; i++) {
    calls.push(track(calc.Add({ x: i, y: 1 }, { timeoutMs: 100 })))
    time += 1
  }
  await turns(1)
  t.equal(reads, 1, 'one clock reading for the ten calls, at the end of their checkpoint (t = 10)')
  await peer.callsReceived(11)
  t.same(peer.calls.slice(1).map((c) => c.header.timeout_millis), Array(10).fill(100), 'each call sends its own timeout')
  // The first call was made at t = 0: its deadline runs from t = 10, not earlier.
  time = 109
  timers.advance(109)
  await turns(2)
  t.equal(calls.filter((c) => c.settled()).length, 0, 'none expired at t = 109')
  time = 110
  timers.advance(1)
  t.same(tally(await Promise.all(calls.map((c) => c.done))), { [ErrorCode.DEADLINE_EXCEEDED]: 10 })
})

t.test('a call made by a fake-clock timer gets its deadline before the clock moves on', async t => {
  const { fake, clock, calc } = await setup(t)
  const warm = calc.Add({ x: 0, y: 0 }, { timeoutMs: 0 })
  const peer = await fake.peer()
  await peer.callsReceived(1)
  peer.respond(peer.calls[0]!.header.call_id, AddResponse, { result: 0 })
  await warm
  let call: ReturnType<typeof track> | null = null
  clock.setTimer(() => { call = track(calc.Add({ x: 1, y: 1 }, { timeoutMs: 100 })) }, 10)
  // One step past both the call (t + 10) and its deadline (t + 110).
  clock.advance(150)
  t.equal(await call!.done, ErrorCode.DEADLINE_EXCEEDED, 'expired within the step, at its deadline')
})

t.test('batches answered in random order across checkpoints: every call settles once, the unanswered ones exactly in the step of their deadline', async t => {
  for (const seed of [1, 2, 3]) {
    const { fake, clock, calc } = await setup(t)
    let state = seed
    const random = (): number => { state = (state * 1103515245 + 12345) & 0x7fffffff; return state / 0x80000000 }
    const made: Array<{ at: number, outcome: Promise<{ code: string, at: number }> }> = []
    let peer: Awaited<ReturnType<typeof fake.peer>> | undefined
    // Ten checkpoints 10 ms apart, 50 calls each, all with a 1000 ms timeout.
    for (let batch = 0; batch < 10; batch++) {
      const at = clock.now()
      for (let i = 0; i < 50; i++) {
        const outcome = calc.Add({ x: i, y: 1 }, { timeoutMs: 1000 }).then(() => ({ code: 'OK', at: clock.now() }), (err: { code: string }) => ({ code: err.code, at: clock.now() }))
        made.push({ at, outcome })
      }
      peer ??= await fake.peer()
      await peer.callsReceived(made.length)
      clock.advance(10)
      await turns(2)
    }
    // Answer a random 80 %, in random order: stamps empty out of order and
    // the unanswered calls keep theirs until their deadline.
    const ids = peer!.calls.map((c) => c.header.call_id)
    const answered = new Set<number>()
    for (const i of ids.map((_, i) => i).sort(() => random() - 0.5)) {
      if (random() < 0.8) {
        answered.add(i)
        peer!.respond(ids[i]!, AddResponse, { result: 1 })
      }
    }
    // Every answer is in before time moves on.
    await Promise.all([...answered].map((i) => made[i]!.outcome))
    for (let step = 0; step < 110; step++) {
      clock.advance(10)
      await turns(2)
    }
    const outcomes = await Promise.all(made.map((m) => m.outcome))
    let late = 0
    let early = 0
    outcomes.forEach((o, i) => {
      if (o.code !== ErrorCode.DEADLINE_EXCEEDED) return
      const deadline = made[i]!.at + 1000
      if (o.at < deadline) early++
      if (o.at >= deadline + 10) late++
    })
    t.same(tally(outcomes.map((o) => o.code)), answered.size === made.length ? { OK: made.length } : { OK: answered.size, [ErrorCode.DEADLINE_EXCEEDED]: made.length - answered.size }, `seed ${seed}: 500 calls, 500 settlements`)
    t.equal(early + late, 0, `seed ${seed}: no timeout before its deadline or after its step`)
    t.equal(clock.pendingTimers, 0, `seed ${seed}: no timer left`)
  }
})
