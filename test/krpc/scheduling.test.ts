// KRPC's side of scheduling: ERROR_SERVER_TOO_BUSY with Kudu's texts for a full or expired queue, addService's own queue options, FATAL_SERVER_SHUTTING_DOWN at close.
// The generic scheduling (EDF, eviction, bursts, hand-off, LIFO workers, the direct scheduler) is tested in test/reactor/scheduling.test.ts and test/reactor/limits.test.ts.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import type { ResponseFrame } from '../../codec/krpc/parsed-frame.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import type { AddServiceOptions, Server, ServiceHandlers } from '../../reactor/krpc/server.js'
import { FakeClock } from '../../scheduling/clock.js'
import type { SleepResponse } from '../../examples/calculator/index.js'
import {
  CalculatorService, calculatorHandlers, newClient, startServer, track, turns, type CalculatorMethods, rejection } from '../helpers/reactor-harness.js'
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

/**
 * One worker held by a Sleep on a service whose scheduling comes from
 * `serviceOptions` (addService's own options), then Echo calls sent one by
 * one with the given timeouts, each judged before the next is sent.
 */
async function queueBehindBlocker (t: Test, serviceOptions: AddServiceOptions, timeouts: Array<[string, number]>) {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), serviceOptions })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  const blocker = track(calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 60_000 }))
  await until(() => controlled.sleeping.length === 1, 'the blocker started')
  const calls = new Map<string, { promise: Promise<unknown>, tracked: ReturnType<typeof track> }>()
  let received = 1
  for (const [data, timeoutMs] of timeouts) {
    const promise = calc.Echo({ data }, { timeoutMs })
    calls.set(data, { promise, tracked: track(promise) })
    await until(() => server.stats().callsReceived === received + 1, `${data} received`)
    received++
    serverClock.runDeferred() // judge it now if it was held
  }
  return { server, serverClock, controlled, blocker, calls }
}

t.test('fifo as addService\'s own option: arrival order, and a full queue refuses the newcomer even with an earlier deadline', async (t) => {
  const { server, controlled, calls } = await queueBehindBlocker(t, { workers: 1, queueLength: 3, queue: 'fifo' },
    [['d5000', 5000], ['d3000', 3000], ['d4000', 4000], ['d1000', 1000]])
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
