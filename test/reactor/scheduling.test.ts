// The server's scheduling end to end (what Kudu's RPC tests check, see
// docs/design.md, 'Kudu's RPC tests'): each service's calls go through a bounded EDF (or FIFO)
// service queue to LIFO-parked workers, behind burst absorption. A burst is
// not an overload; a saturated service refuses exactly the overflow with
// ERROR_SERVER_TOO_BUSY, evicting the latest deadline first; calls that
// expire in the queue never run; shutdown drains or refuses what is queued.
// The metrics these produce are checked in metrics.test.ts.
//
// Servers run on a FakeClock wherever timing matters: deadlines are then
// exact, queued calls expire only when the test moves time, and the
// dispatcher's one-turn burst check (`clock.defer`) runs only when the test
// calls `runDeferred()`. Clients get a FakeClock of their own, so their call
// timers never fire unless a test says so. No test measures a duration.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { ErrorStatusType, type ResponseFrame } from '../../codec/krpc/frames.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import type { Server, ServiceHandlers } from '../../reactor/krpc/server.js'
import { FakeClock } from '../../scheduling/clock.js'
import type { SleepResponse } from '../../examples/calculator/index.js'
import {
  CalculatorService, calculatorHandlers, newClient, settle, startServer, tally, track, turns, type CalculatorMethods, rejection } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const AddRequest = CalculatorService.methods.Add.requestType
const AddResponse = CalculatorService.methods.Add.responseType
const SleepRequest = CalculatorService.methods.Sleep.requestType
const EchoRequest = CalculatorService.methods.Echo.requestType

const TOO_BUSY = 'REMOTE:ERROR_SERVER_TOO_BUSY'
const SHUTTING_DOWN = 'REMOTE:FATAL_SERVER_SHUTTING_DOWN'
const QUEUE_FULL = /dropped due to backpressure: service queue is full with (\d+) items/
const EXPIRED_IN_QUEUE = /waited in the queue past client deadline/

/** Awaits I/O until `condition` holds (bounded, so a broken test fails instead of hanging). */
async function until (condition: () => boolean, what: string, maxTurns = 20_000): Promise<void> {
  for (let i = 0; !condition(); i++) {
    if (i >= maxTurns) throw new Error(`gave up waiting for ${what}`)
    await turns(1)
  }
}

/**
 * Calculator handlers the test drives: Sleep blocks until the test releases
 * it (or its signal aborts, when `abortable`), Echo and Add record the order
 * in which their handlers ran.
 */
class Controlled {
  /** Contexts of the Sleep calls that reached their handler, in order. */
  readonly sleeping: CallContext[] = []
  /** `Echo:<data>` and `Add:<x>` for each handler run, in order. */
  readonly ran: string[] = []
  #gates: Array<() => void> = []
  readonly #abortable: boolean

  constructor (options: { abortable?: boolean } = {}) {
    this.#abortable = options.abortable ?? false
  }

  /** Lets every blocked Sleep return (successfully), now. */
  release (): void {
    const gates = this.#gates
    this.#gates = []
    for (const open of gates) open()
  }

  handlers (): ServiceHandlers<CalculatorMethods> {
    return {
      ...calculatorHandlers,
      Add: (req, ctx) => {
        this.ran.push(`Add:${req.x}`)
        return calculatorHandlers.Add(req, ctx)
      },
      Echo: (req) => {
        this.ran.push(`Echo:${req.data}`)
        return { data: req.data }
      },
      Sleep: (_req, ctx) => {
        this.sleeping.push(ctx)
        return new Promise<SleepResponse>((resolve, reject) => {
          this.#gates.push(() => resolve({}))
          if (this.#abortable) ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true })
        })
      }
    }
  }
}

function metricsOf (server: Server, method: keyof CalculatorMethods) {
  return server.metrics.snapshot()[SERVICE]!.methods[method]!
}

function serviceGauges (server: Server) {
  const { queueLength, idleWorkers, workers } = server.metrics.snapshot()[SERVICE]!
  return { queueLength, idleWorkers, workers }
}

/** Decodes an error response frame's code and message. */
function errorOf (frame: ResponseFrame): { code: number, message: string } {
  if (frame.header.is_error !== true) throw new Error(`call ${frame.header.call_id} succeeded`)
  const status = ErrorStatusType.decode(frame.message)
  if (status instanceof RpcError) throw status
  return { code: status.code ?? 0, message: status.message }
}

// ---------------------------------------------------------------------------
// 1. Bursts
// ---------------------------------------------------------------------------

t.test('burst: 1,000 pipelined Adds on one connection, default configuration → 1,000 answers, no TOO_BUSY', async (t) => {
  const { server, endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const N = 1000
  const outcomes = await Promise.all(Array.from({ length: N }, (_, i) =>
    settle(calc.Add({ x: i, y: 7 }).then((r) => { if (r.result !== i + 7) throw new Error(`wrong sum for ${i}`) }))))
  t.same(tally(outcomes), { OK: N })
  const add = metricsOf(server, 'Add')
  t.equal(add.handled, N)
  t.equal(add.queueOverflows, 0)
  t.equal(add.evictions, 0)
  t.equal(add.timedOutInQueue, 0)
  t.equal(server.stats().connectionsAccepted, 1)
})

t.test('burst: 1,000 pipelined calls with async handlers fill workers and queue, yet none is refused', async (t) => {
  // Sync handlers never occupy a worker past the read callback; handlers that
  // settle in a microtask, or on the next turn, do: 10 workers + 50 queue
  // slots are full after 60 calls of a read, and the rest is held back.
  for (const [label, settleOn] of [['a microtask', 'microtask'], ['the next turn', 'immediate']] as const) {
    t.test(`handlers settle on ${label}`, async (t) => {
      const handlers: ServiceHandlers<CalculatorMethods> = {
        ...calculatorHandlers,
        Add: async (req) => {
          if (settleOn === 'immediate') await new Promise<void>((resolve) => setImmediate(resolve))
          else await Promise.resolve()
          return { result: req.x + req.y }
        }
      }
      const { server, endpoint } = await startServer(t, { handlers })
      const client = newClient(t, { endpoint })
      const calc = client.service(CalculatorService)
      const N = 1000
      const outcomes = await Promise.all(Array.from({ length: N }, (_, i) =>
        settle(calc.Add({ x: i, y: 1 }).then((r) => { if (r.result !== i + 1) throw new Error(`wrong sum for ${i}`) }))))
      t.same(tally(outcomes), { OK: N })
      const add = metricsOf(server, 'Add')
      t.equal(add.handled, N)
      t.equal(add.queueOverflows + add.evictions + add.timedOutInQueue, 0, 'nothing refused, evicted or expired')
      t.same(serviceGauges(server), { queueLength: 0, idleWorkers: 10, workers: 10 }, 'all workers parked again, queue empty')
    })
  }
})

// ---------------------------------------------------------------------------
// 2. Exact overflow counts
// ---------------------------------------------------------------------------

t.test('overflow: queueLength 2, 0 workers, 3 calls → exactly 1 TOO_BUSY, judged one turn later', async (t) => {
  // With no worker the service is saturated as soon as 2 calls are queued.
  // The third is held back (it could be the start of a burst) until a turn
  // has passed without progress: here, until the test runs the deferred
  // check. Equal deadlines: the newcomer is the one refused.
  const serverClock = new FakeClock()
  const { server, endpoint } = await startServer(t, { clock: serverClock, workers: 0, queueLength: 2 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const promises = [0, 1, 2].map(i => calc.Add({ x: i, y: 0 }))
  const calls = promises.map(p => track(p))
  await until(() => server.stats().callsReceived === 3, '3 calls received')
  await turns(5)
  t.same(calls.map(c => c.settled()), [false, false, false], 'the third call is held, not yet judged')
  t.equal(serviceGauges(server).queueLength, 2)

  serverClock.runDeferred()
  const refused = await rejection(promises[2]!)
  t.equal(refused.remote?.code, KrpcCode.ERROR_SERVER_TOO_BUSY, 'the newcomer is refused with TOO_BUSY')
  t.match(refused.message, QUEUE_FULL)
  t.equal(QUEUE_FULL.exec(refused.message)?.[1], '2', 'the message gives the queue bound')
  t.notOk(refused.fatal, 'TOO_BUSY is not connection-fatal')
  await turns(5)
  t.same(calls.map(c => c.settled()), [false, false, true], 'the two queued calls wait')
  const add = metricsOf(server, 'Add')
  t.equal(add.queueOverflows, 1, 'queueOverflows counts it')
  t.equal(add.evictions, 0)
  t.equal(add.handled, 0, 'no handler ran')
})

t.test('overflow: 1 worker blocked, queueLength 2, 4 calls → exactly 1 TOO_BUSY; the others all run', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1, queueLength: 2 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const blocker = track(calc.Sleep({ sleep_micros: 0 }))
  const echoes = ['a', 'b', 'c'].map(data => calc.Echo({ data }))
  const tracked = echoes.map(p => track(p))
  await until(() => server.stats().callsReceived === 4, '4 calls received')
  t.equal(controlled.sleeping.length, 1, 'the blocker holds the only worker')
  t.same(serviceGauges(server), { queueLength: 2, idleWorkers: 0, workers: 1 })
  serverClock.runDeferred()
  const refused = await rejection(echoes[2]!)
  t.equal(refused.remote?.code, KrpcCode.ERROR_SERVER_TOO_BUSY)
  t.match(refused.message, QUEUE_FULL)
  t.match(refused.message, /Echo request from 127\.0\.0\.1:\d+/, 'the message names the method and the client')
  await turns(5)
  t.notOk(blocker.settled())
  t.same(tracked.slice(0, 2).map(c => c.settled()), [false, false])

  controlled.release()
  t.same(await Promise.all([blocker.done, ...tracked.map(c => c.done)]), ['OK', 'OK', 'OK', TOO_BUSY])
  t.same(controlled.ran, ['Echo:a', 'Echo:b'], 'the refused call never ran')
  t.equal(metricsOf(server, 'Echo').queueOverflows, 1)
  t.equal(metricsOf(server, 'Echo').handled, 2)
  t.equal(metricsOf(server, 'Sleep').queueOverflows, 0, 'counted on the refused call\'s own method')
})

t.test('overflow: per-service workers 3 and queueLength 10 override the server\'s; 20 blocked calls → exactly 7 TOO_BUSY', async (t) => {
  // TestBlowOutServiceQueue's shape: 3 workers busy, 10 queued, the rest refused.
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, {
    clock: serverClock, handlers: controlled.handlers(), workers: 10, queueLength: 50, serviceOptions: { workers: 3, queueLength: 10 }
  })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const N = 20
  const calls = Array.from({ length: N }, () => track(calc.Sleep({ sleep_micros: 0 })))
  await until(() => server.stats().callsReceived === N, `${N} calls received`)
  serverClock.runDeferred()
  await until(() => calls.filter(c => c.settled()).length === 7, '7 refusals')
  t.same(tally(calls.filter(c => c.settled()).map(c => c.outcome()!)), { [TOO_BUSY]: 7 })
  t.equal(controlled.sleeping.length, 3, 'only 3 handlers started')
  t.same(serviceGauges(server), { queueLength: 10, idleWorkers: 0, workers: 3 })
  t.equal(metricsOf(server, 'Sleep').queueOverflows, 7)

  // Releasing in rounds: 3 at a time run until all 13 are done.
  while (controlled.sleeping.length < 13) {
    controlled.release()
    const want = Math.min(13, controlled.sleeping.length + 3)
    await until(() => controlled.sleeping.length === want, `${want} handlers started`)
  }
  controlled.release()
  t.same(tally(await Promise.all(calls.map(c => c.done))), { OK: 13, [TOO_BUSY]: 7 })
  const sleep = metricsOf(server, 'Sleep')
  t.equal(sleep.handled, 13)
  t.equal(sleep.queueOverflows, 7)
  t.equal(sleep.evictions, 0)
})

t.test('burst absorption: a held call is served when a worker made progress before the one-turn check', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1, queueLength: 1 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const blocker = track(calc.Sleep({ sleep_micros: 0 }))
  const queued = track(calc.Echo({ data: 'queued' }))
  const held = track(calc.Echo({ data: 'held' }))
  await until(() => server.stats().callsReceived === 3, '3 calls received')
  await turns(5)
  t.notOk(held.settled(), 'the saturating call waits for the check')
  // The worker finishes (and drains the queue) before the check runs.
  controlled.release()
  await until(() => queued.settled(), 'the queued call answered')
  t.notOk(held.settled(), 'still held until the deferred check')
  serverClock.runDeferred()
  t.same(await Promise.all([blocker.done, queued.done, held.done]), ['OK', 'OK', 'OK'])
  t.same(controlled.ran, ['Echo:queued', 'Echo:held'])
  t.equal(metricsOf(server, 'Echo').queueOverflows, 0)
})

// ---------------------------------------------------------------------------
// 3. EDF order and latest-deadline eviction (docs/design.md, 'The service queue')
// ---------------------------------------------------------------------------

/**
 * One worker held by a Sleep, then Echo calls sent one by one with the given
 * timeouts (each judged before the next is sent). Returns the tracked calls.
 */
async function queueBehindBlocker (t: Test, options: { queue?: 'edf' | 'fifo', perService?: boolean, timeouts: Array<[string, number]> }) {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const scheduling = { workers: 1, queueLength: 3, ...(options.queue === undefined ? {} : { queue: options.queue }) }
  const { server, endpoint } = await startServer(t, {
    clock: serverClock,
    handlers: controlled.handlers(),
    ...(options.perService === true ? { serviceOptions: scheduling } : scheduling)
  })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const blocker = track(calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 60_000 }))
  await until(() => controlled.sleeping.length === 1, 'the blocker started')
  const calls = new Map<string, { promise: Promise<unknown>, tracked: ReturnType<typeof track> }>()
  let received = 1
  for (const [data, timeoutMs] of options.timeouts) {
    const promise = calc.Echo({ data }, { timeoutMs })
    calls.set(data, { promise, tracked: track(promise) })
    await until(() => server.stats().callsReceived === received + 1, `${data} received`)
    received++
    serverClock.runDeferred() // judge it now if it was held
  }
  return { server, serverClock, controlled, blocker, calls }
}

t.test('edf: queued calls run in earliest-deadline order; an earlier newcomer evicts the latest, a later one is refused', async (t) => {
  const { server, controlled, blocker, calls } = await queueBehindBlocker(t, {
    timeouts: [['d5000', 5000], ['d3000', 3000], ['d4000', 4000], ['d1000', 1000], ['d9000', 9000]]
  })
  // d1000 found the queue full and strictly earlier than d5000: d5000 is out.
  const evicted = await rejection(calls.get('d5000')!.promise)
  t.equal(evicted.remote?.code, KrpcCode.ERROR_SERVER_TOO_BUSY, 'the latest deadline is evicted with TOO_BUSY')
  t.match(evicted.message, QUEUE_FULL)
  // d9000 is later than everything queued: refused itself.
  const refused = await rejection(calls.get('d9000')!.promise)
  t.equal(refused.remote?.code, KrpcCode.ERROR_SERVER_TOO_BUSY, 'a later newcomer is refused')
  t.match(refused.message, QUEUE_FULL)
  t.same(serviceGauges(server).queueLength, 3)
  const echo = metricsOf(server, 'Echo')
  t.equal(echo.evictions, 1, 'evictions = 1')
  t.equal(echo.queueOverflows, 1, 'queueOverflows = 1 (the refused newcomer)')
  t.same(controlled.ran, [], 'nothing ran yet')

  controlled.release()
  t.equal(await blocker.done, 'OK')
  for (const data of ['d1000', 'd3000', 'd4000']) t.equal(await calls.get(data)!.tracked.done, 'OK', `${data} answered`)
  t.same(controlled.ran, ['Echo:d1000', 'Echo:d3000', 'Echo:d4000'], 'earliest deadline first, not arrival order')
  t.equal(metricsOf(server, 'Echo').handled, 3)
})

t.test('edf: equal deadlines leave in arrival order, and a newcomer with the same deadline is refused', async (t) => {
  const { server, controlled, calls } = await queueBehindBlocker(t, {
    timeouts: [['x', 2000], ['y', 2000], ['z', 2000], ['late', 2000]]
  })
  t.equal(await calls.get('late')!.tracked.done, TOO_BUSY)
  t.equal(metricsOf(server, 'Echo').evictions, 0)
  controlled.release()
  for (const data of ['x', 'y', 'z']) t.equal(await calls.get(data)!.tracked.done, 'OK')
  t.same(controlled.ran, ['Echo:x', 'Echo:y', 'Echo:z'])
})

t.test('edf: calls without a deadline sort after every call with one and are evicted first', async (t) => {
  const { server, controlled, calls } = await queueBehindBlocker(t, {
    timeouts: [['none1', 0], ['d3000', 3000], ['none2', 0], ['d1000', 1000]]
  })
  // d1000 evicts the latest: among the two without deadline, the later arrival.
  t.equal(await calls.get('none2')!.tracked.done, TOO_BUSY)
  t.equal(metricsOf(server, 'Echo').evictions, 1)
  controlled.release()
  for (const data of ['none1', 'd3000', 'd1000']) t.equal(await calls.get(data)!.tracked.done, 'OK')
  t.same(controlled.ran, ['Echo:d1000', 'Echo:d3000', 'Echo:none1'])
})

for (const perService of [false, true]) {
  t.test(`fifo (${perService ? 'per-service override' : 'server option'}): arrival order, and a full queue refuses the newcomer even with an earlier deadline`, async (t) => {
    const { server, controlled, calls } = await queueBehindBlocker(t, {
      queue: 'fifo',
      perService,
      timeouts: [['d5000', 5000], ['d3000', 3000], ['d4000', 4000], ['d1000', 1000]]
    })
    const refused = await rejection(calls.get('d1000')!.promise)
    t.equal(refused.remote?.code, KrpcCode.ERROR_SERVER_TOO_BUSY, 'the newcomer is refused, not the latest deadline evicted')
    t.match(refused.message, QUEUE_FULL)
    const echo = metricsOf(server, 'Echo')
    t.equal(echo.evictions, 0)
    t.equal(echo.queueOverflows, 1)
    controlled.release()
    for (const data of ['d5000', 'd3000', 'd4000']) t.equal(await calls.get(data)!.tracked.done, 'OK')
    t.same(controlled.ran, ['Echo:d5000', 'Echo:d3000', 'Echo:d4000'], 'arrival order')
  })
}

// ---------------------------------------------------------------------------
// 4. Calls that expire in the queue are never run
// ---------------------------------------------------------------------------

t.test('expired in queue: never run, answered TOO_BUSY "waited in the queue past client deadline" (raw peer)', async (t) => {
  // A raw peer has no call timer of its own, so the server's answer is what
  // it reads: the expiry timer fires at the deadline, with the worker still busy.
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, port } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1 })
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  raw.write(Buffer.concat([
    clientHandshakeBytes(),
    requestFrame(0, SERVICE, 'Sleep', SleepRequest.encode({ sleep_micros: 0 })),
    requestFrame(1, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 }), { timeoutMs: 100 }),
    requestFrame(2, SERVICE, 'Add', AddRequest.encode({ x: 2, y: 2 }), { timeoutMs: 10_000 }),
    requestFrame(3, SERVICE, 'Echo', EchoRequest.encode({ data: 'e' }), { timeoutMs: 150 })
  ]))
  await until(() => server.stats().callsReceived === 4, '4 calls received')
  t.equal(controlled.sleeping.length, 1)
  t.equal(serviceGauges(server).queueLength, 3)

  serverClock.advance(99)
  await turns(5)
  t.equal(raw.frames.filter(f => f.header.call_id >= 0).length, 0, 'nothing answered 1 ms before the first deadline')
  serverClock.advance(1)
  const first = await raw.nextResponse()
  t.equal(first.header.call_id, 1, 'the call whose deadline passed is answered at its deadline')
  const status = errorOf(first)
  t.equal(status.code, KrpcCode.ERROR_SERVER_TOO_BUSY)
  t.match(status.message, EXPIRED_IN_QUEUE)
  t.match(status.message, /Add request from 127\.0\.0\.1:\d+/)
  t.equal(serviceGauges(server).queueLength, 2, 'it no longer holds a queue slot')

  serverClock.advance(50)
  const second = await raw.nextResponse()
  t.equal(second.header.call_id, 3)
  t.equal(errorOf(second).code, KrpcCode.ERROR_SERVER_TOO_BUSY)
  t.match(errorOf(second).message, EXPIRED_IN_QUEUE)

  controlled.release()
  const answers = [await raw.nextResponse(), await raw.nextResponse()]
  t.same(answers.map(f => f.header.call_id).sort(), [0, 2])
  const add = answers.find(f => f.header.call_id === 2)!
  t.notOk(add.header.is_error)
  t.same(AddResponse.decode(add.message), { result: 4 })
  t.same(controlled.ran, ['Add:2'], 'the expired calls\' handlers never ran')
  t.equal(metricsOf(server, 'Add').timedOutInQueue, 1)
  t.equal(metricsOf(server, 'Echo').timedOutInQueue, 1)
  t.equal(metricsOf(server, 'Add').handled, 1)
  t.equal(metricsOf(server, 'Echo').handled, 0)
  t.equal(metricsOf(server, 'Add').queueTime.count, 1, 'queue time is recorded for handled calls only')
  t.notOk(raw.isClosed, 'the connection stays up')
})

t.test('expired in queue, seen from the client: its own timeout and the server\'s answer coincide; the handler never runs', async (t) => {
  // TestDontHandleTimedOutCalls / TimedOutOnResponseMetricServiceQueue: one
  // worker busy past a queued call's timeout. Client and server share the
  // clock; whichever answer wins, the call fails once and never runs.
  const clock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock, handlers: controlled.handlers(), workers: 1 })
  const client = newClient(t, { endpoint, clock })
  const calc = client.service(CalculatorService)
  const blocker = track(calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 0 }))
  await until(() => controlled.sleeping.length === 1, 'the blocker started')
  const queued = track(calc.Add({ x: 1, y: 2 }, { timeoutMs: 50 }))
  await until(() => server.stats().callsReceived === 2, 'the short call received')
  clock.advance(50)
  const outcome = await queued.done
  t.ok(outcome === ErrorCode.DEADLINE_EXCEEDED || outcome === TOO_BUSY, `timed out (${outcome})`)
  controlled.release()
  t.equal(await blocker.done, 'OK')
  const later = await calc.Add({ x: 3, y: 4 }, { timeoutMs: 1000 })
  t.equal(later.result, 7, 'the connection serves the next call')
  t.same(controlled.ran, ['Add:3'], 'the expired call never ran')
  t.equal(metricsOf(server, 'Add').timedOutInQueue, 1)
  t.equal(metricsOf(server, 'Add').timedOutOnResponse, 0, 'no handler finished late')
  t.equal(client.pendingCalls, 0)
})


// ---------------------------------------------------------------------------
// 5. Deadlines while a handler runs
// ---------------------------------------------------------------------------

t.test('a running handler sees ctx.signal abort at its deadline; finishing late counts timedOutOnResponse', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers() })
  // The client's clock does not move: it waits for the server's answer.
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const late = track(calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 200 }))
  const onTime = track(calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 10_000 }))
  await until(() => controlled.sleeping.length === 2, 'both handlers started')
  const [lateCtx, onTimeCtx] = controlled.sleeping as [CallContext, CallContext]
  const lateSignal = lateCtx.signal
  const onTimeSignal = onTimeCtx.signal
  serverClock.advance(199)
  t.notOk(lateSignal.aborted, 'not aborted 1 ms before the deadline')
  serverClock.advance(1)
  t.ok(lateSignal.aborted, 'aborted at the deadline')
  t.equal((lateSignal.reason as RpcError).code, ErrorCode.DEADLINE_EXCEEDED)
  t.equal(lateCtx.remainingMs(), 0)
  t.notOk(onTimeSignal.aborted, 'the other call\'s signal is untouched')

  serverClock.advance(1)
  controlled.release() // both handlers finish now: one past its deadline, one well within
  t.same(await Promise.all([late.done, onTime.done]), ['OK', 'OK'], 'a late answer is still sent (the client decides)')
  const sleep = metricsOf(server, 'Sleep')
  t.equal(sleep.handled, 2)
  t.equal(sleep.timedOutOnResponse, 1, 'only the late handler counts')
  t.equal(sleep.timedOutInQueue, 0)
  t.equal(sleep.handlerLatency.count, 2)
  t.equal(sleep.handlerLatency.sumMs, 402, 'handler latency measured on the server clock (201 ms each)')
})

t.test('a handler that gives up when its signal aborts is left to the client\'s own timeout; finishing at (not after) the deadline is not late', async (t) => {
  // The handler rejects with the signal's reason at the exact deadline: the
  // server sends nothing (deadline-answer.test.ts pins the wire), the client
  // reports its own timeout, and, as in Kudu's RecordHandlingCompleted, only
  // finishing strictly after the deadline counts as late.
  const clock = new FakeClock()
  const controlled = new Controlled({ abortable: true })
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock, handlers: controlled.handlers() })
  const client = newClient(t, { endpoint, clock })
  const call = track(client.service(CalculatorService).Sleep({ sleep_micros: 0 }, { timeoutMs: 300 }))
  await until(() => controlled.sleeping.length === 1, 'the handler started')
  clock.advance(300)
  t.equal(await call.done, ErrorCode.DEADLINE_EXCEEDED)
  const sleep = metricsOf(server, 'Sleep')
  t.equal(sleep.handled, 1)
  t.equal(sleep.timedOutOnResponse, 0)
})

// ---------------------------------------------------------------------------
// 6. Shutdown while serving
// ---------------------------------------------------------------------------

// BUG (reactor/server.ts, close(): `finish` → `sc.connection.destroy()`):
// once the last in-flight call is answered, #maybeDrained destroys every
// connection synchronously, in the same turn. Connection.destroy closes the
// TransferQueue, which drops the frames still queued for its end-of-turn
// flush (every frame after the first one written in a turn). So when several
// calls are answered in the turn that drains the server, all but the first
// answer are lost and their clients see RPC_ERR_CONNECTION_CLOSED. The
// assertions that depend on it are marked todo.

function answeredOnce (t: Test, server: Server): void {
  const s = server.stats()
  t.equal(s.callsSucceeded + s.callsFailed, s.callsReceived, 'the server answered every call it received exactly once')
  t.equal(s.callsInFlight, 0)
}

t.test('close with a long grace: running and queued calls finish and are answered; new calls are refused', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const running = track(calc.Sleep({ sleep_micros: 0 }))
  const queued = ['q1', 'q2', 'q3'].map(data => track(calc.Echo({ data })))
  await until(() => server.stats().callsReceived === 4, '4 calls received')
  t.equal(serviceGauges(server).queueLength, 3)

  const closing = server.close({ graceMs: 1000 })
  // On the same (still open) connection: answered FATAL_SERVER_SHUTTING_DOWN.
  const after = track(calc.Add({ x: 1, y: 1 }))
  t.equal(await after.done, SHUTTING_DOWN, 'a call after close is refused with FATAL_SERVER_SHUTTING_DOWN')
  // That FATAL retired the connection: the next call opens a new one, which the closing server drops.
  const fresh = track(calc.Add({ x: 2, y: 2 }))
  const freshOutcome = await fresh.done
  t.ok(([ErrorCode.CONNECTION_CLOSED, ErrorCode.CONNECT_FAILED, ErrorCode.NEGOTIATION_FAILED] as string[]).includes(freshOutcome),
    `a new connection is refused (${freshOutcome})`)
  t.notOk(running.settled())
  t.same(queued.map(q => q.settled()), [false, false, false], 'queued calls wait for the worker, within the grace')

  controlled.release()
  t.equal(await running.done, 'OK', 'the running call is answered')
  const outcomes = await Promise.all(queued.map(q => q.done))
  t.same(controlled.ran, ['Echo:q1', 'Echo:q2', 'Echo:q3'], 'the queued calls ran within the grace')
  t.ok(outcomes.every(o => o === 'OK' || o === ErrorCode.CONNECTION_CLOSED), `each queued call settled once (${outcomes.join(', ')})`)
  t.same(outcomes, ['OK', 'OK', 'OK'], 'and their answers reached the client')
  await closing
  answeredOnce(t, server)
  t.equal(metricsOf(server, 'Echo').shutdownRejected, 0)
  t.equal(metricsOf(server, 'Echo').handled, 3)
  t.equal(client.pendingCalls, 0, 'no call left pending on the client')
})

t.test('close with a short grace: leftovers get FATAL_SERVER_SHUTTING_DOWN; every call settles exactly once', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled({ abortable: true })
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const running = track(calc.Sleep({ sleep_micros: 0 }))
  const queued = ['q1', 'q2', 'q3'].map(data => track(calc.Echo({ data })))
  await until(() => server.stats().callsReceived === 4, '4 calls received')
  const runningCtx = controlled.sleeping[0]!
  const runningSignal = runningCtx.signal

  const closing = server.close({ graceMs: 100 })
  serverClock.advance(99)
  await turns(5)
  t.notOk(running.settled())
  t.same(queued.map(q => q.settled()), [false, false, false], 'still queued within the grace')
  serverClock.advance(1)
  t.ok(runningSignal.aborted, 'the running handler\'s signal aborts when the grace is over')
  t.equal((runningSignal.reason as RpcError).code, ErrorCode.CONNECTION_CLOSED)
  const outcomes = await Promise.all(queued.map(q => q.done))
  t.ok(outcomes.every(o => o === SHUTTING_DOWN || o === ErrorCode.CONNECTION_CLOSED), `each leftover settled once, not run (${outcomes.join(', ')})`)
  // With a FakeClock the service's grace timer and the server's fire in one
  // advance(), so the connection also closes before the end-of-turn flush.
  t.same(outcomes, [SHUTTING_DOWN, SHUTTING_DOWN, SHUTTING_DOWN], 'the leftovers are answered FATAL_SERVER_SHUTTING_DOWN')
  const runningOutcome = await running.done
  t.not(runningOutcome, 'OK', `the running call's connection is closed under it (${runningOutcome})`)
  await closing
  t.same(controlled.ran, [], 'no queued handler ran')
  t.equal(metricsOf(server, 'Echo').shutdownRejected, 3, 'shutdownRejected counts the leftovers')
  t.equal(client.pendingCalls, 0)
})

t.test('close with no worker and grace 0: every queued call is refused FATAL_SERVER_SHUTTING_DOWN', async (t) => {
  // Real clock: the queued calls are refused by the grace timer, in one turn.
  const { server, endpoint } = await startServer(t, { workers: 0, queueLength: 5 })
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const calls = [1, 2, 3].map(x => track(calc.Add({ x, y: 0 })))
  await until(() => server.stats().callsReceived === 3, '3 calls received')
  const closing = server.close({ graceMs: 0 })
  const outcomes = await Promise.all(calls.map(c => c.done))
  t.ok(outcomes.every(o => o === SHUTTING_DOWN || o === ErrorCode.CONNECTION_CLOSED), `each settled once (${outcomes.join(', ')})`)
  t.same(outcomes, [SHUTTING_DOWN, SHUTTING_DOWN, SHUTTING_DOWN], 'all answered FATAL_SERVER_SHUTTING_DOWN')
  await closing
  answeredOnce(t, server)
  t.equal(metricsOf(server, 'Add').shutdownRejected, 3)
  t.equal(metricsOf(server, 'Add').handled, 0)
})

t.test('control: a single call answered in the draining turn does reach its client', async (t) => {
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { handlers: controlled.handlers(), workers: 1 })
  const client = newClient(t, { endpoint })
  const running = track(client.service(CalculatorService).Sleep({ sleep_micros: 0 }))
  await until(() => controlled.sleeping.length === 1, 'the handler started')
  const closing = server.close({ graceMs: 30_000 })
  controlled.release()
  t.equal(await running.done, 'OK')
  await closing
  answeredOnce(t, server)
})

// ---------------------------------------------------------------------------
// 7. Direct hand-off to parked workers; the direct scheduler
// ---------------------------------------------------------------------------

t.test('hand-off: a call that finds a parked worker goes straight to it, never through the queue', async (t) => {
  // Which worker slot ran a call (LIFO: the most recently parked) is not
  // exposed outside the pool (the handler's context has no worker id and the
  // dispatcher is private); test/scheduling/worker-pool.test.ts covers it.
  // What the server exposes are the gauges, read here from inside handlers.
  const seen: Array<{ queueLength: number, idleWorkers: number }> = []
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const base = controlled.handlers()
  let server: Server | undefined
  const handlers: ServiceHandlers<CalculatorMethods> = {
    ...base,
    Add: (req, ctx) => {
      const { queueLength, idleWorkers } = serviceGauges(server!)
      seen.push({ queueLength, idleWorkers })
      return base.Add(req, ctx)
    }
  }
  const serverClock = new FakeClock()
  const started = await startServer(t, { clock: serverClock, handlers, workers: 4, queueLength: 2 })
  server = started.server
  const client = newClient(t, { endpoint: started.endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  for (let i = 0; i < 5; i++) await calc.Add({ x: i, y: 0 })
  t.same(seen, Array(5).fill({ queueLength: 0, idleWorkers: 3 }), 'sequential calls: one worker busy, nothing queued')
  t.same(metricsOf(server, 'Add').queueTime.buckets[0]!.count, 5, 'no queue time (FakeClock: not a moment passed)')

  const sleeps = Array.from({ length: 6 }, () => track(calc.Sleep({ sleep_micros: 0 })))
  await until(() => server!.stats().callsReceived === 5 + 6, 'sleeps received')
  t.equal(controlled.sleeping.length, 4, '4 workers busy')
  t.same(serviceGauges(server), { queueLength: 2, idleWorkers: 0, workers: 4 }, 'the rest queued')
  controlled.release()
  await until(() => controlled.sleeping.length === 6, 'the queued ones started')
  t.same(serviceGauges(server), { queueLength: 0, idleWorkers: 2, workers: 4 })
  controlled.release()
  t.same(tally(await Promise.all(sleeps.map(s => s.done))), { OK: 6 })
  t.same(serviceGauges(server), { queueLength: 0, idleWorkers: 4, workers: 4 }, 'every worker parked again')
})

t.test('scheduler "direct": every handler runs at once, unbounded; no queue, no TOO_BUSY', async (t) => {
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { handlers: controlled.handlers(), scheduler: 'direct', workers: 1, queueLength: 1 })
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const calls = Array.from({ length: 20 }, () => track(calc.Sleep({ sleep_micros: 0 })))
  await until(() => controlled.sleeping.length === 20, 'all 20 handlers started')
  t.same(serviceGauges(server), { queueLength: 0, idleWorkers: 0, workers: 0 })
  controlled.release()
  t.same(tally(await Promise.all(calls.map(c => c.done))), { OK: 20 })
  const sleep = metricsOf(server, 'Sleep')
  t.equal(sleep.handled, 20, 'metrics are still kept per method')
  t.equal(sleep.queueOverflows, 0)
})
