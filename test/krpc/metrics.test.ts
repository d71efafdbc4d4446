// Per-service and per-method server metrics end to end (what Kudu's RPC
// tests check, docs/design.md, 'Metrics': queue time, handler latency, overflow / eviction / timeout /
// shutdown counters; service gauges): `server.metrics.snapshot()` and the
// Prometheus text of `server.metrics.text()`. Servers run on a FakeClock, so
// queue times and latencies are exact numbers of milliseconds the test
// moved, never measured durations. Scheduling itself is in scheduling.test.ts.
import t from 'tap'
import type { CallContext } from '../../reactor/inbound-call.js'
import type { Server, ServiceHandlers } from '../../reactor/krpc/server.js'
import { FakeClock } from '../../scheduling/clock.js'
import type { SleepResponse } from '../../examples/calculator/index.js'
import {
  CalculatorService, calculatorHandlers, newClient, startServer, tally, track, turns, type CalculatorMethods
} from '../helpers/reactor-harness.js'

const SERVICE = CalculatorService.fullName
const TOO_BUSY = 'REMOTE:ERROR_SERVER_TOO_BUSY'

/** Awaits I/O until `condition` holds (bounded, so a broken test fails instead of hanging). */
async function until (condition: () => boolean, what: string, maxTurns = 20_000): Promise<void> {
  for (let i = 0; !condition(); i++) {
    if (i >= maxTurns) throw new Error(`gave up waiting for ${what}`)
    await turns(1)
  }
}

/** The demo handlers, with a Sleep that blocks until the test releases it. */
class Controlled {
  readonly sleeping: CallContext[] = []
  #gates: Array<() => void> = []

  release (): void {
    const gates = this.#gates
    this.#gates = []
    for (const open of gates) open()
  }

  handlers (): ServiceHandlers<CalculatorMethods> {
    return {
      ...calculatorHandlers,
      Sleep: (_req, ctx) => {
        this.sleeping.push(ctx)
        return new Promise<SleepResponse>((resolve) => { this.#gates.push(() => resolve({})) })
      }
    }
  }
}

function serviceGauges (server: Server) {
  const { queueLength, idleWorkers, workers } = server.metrics.snapshot()[SERVICE]!
  return { queueLength, idleWorkers, workers }
}

/** The value of the sample line `name{labels}` in Prometheus text, or undefined. */
function sample (text: string, name: string, labels: string): number | undefined {
  const prefix = `${name}{${labels}} `
  const line = text.split('\n').find(l => l.startsWith(prefix))
  return line === undefined ? undefined : Number(line.slice(prefix.length))
}

t.test('metrics: per-method snapshot counts after N calls', async (t) => {
  const serverClock = new FakeClock()
  const { server, endpoint } = await startServer(t, { clock: serverClock })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  for (let i = 0; i < 7; i++) await calc.Add({ x: i, y: i })
  for (let i = 0; i < 3; i++) await calc.Echo({ data: String(i) })
  const snapshot = server.metrics.snapshot()
  t.same(Object.keys(snapshot), [SERVICE])
  const service = snapshot[SERVICE]!
  t.same(Object.keys(service.methods).sort(), ['Add', 'Echo', 'EchoSidecars', 'PushStrings', 'Sleep'])
  t.same({ queueLength: service.queueLength, idleWorkers: service.idleWorkers, workers: service.workers }, { queueLength: 0, idleWorkers: 10, workers: 10 })
  const expect = { Add: 7, Echo: 3, Sleep: 0, PushStrings: 0, EchoSidecars: 0 }
  for (const [method, n] of Object.entries(expect)) {
    const m = service.methods[method]!
    t.equal(m.handled, n, `${method}: handled`)
    t.equal(m.queueTime.count, n, `${method}: queue-time samples`)
    t.equal(m.handlerLatency.count, n, `${method}: handler-latency samples`)
    t.same([m.queueOverflows, m.evictions, m.timedOutInQueue, m.timedOutOnResponse, m.shutdownRejected], [0, 0, 0, 0, 0], `${method}: no rejections`)
  }
  const add = service.methods.Add!
  t.equal(add.queueTime.sumMs, 0, 'on a FakeClock nothing waited')
  t.equal(add.queueTime.buckets[0]!.count, 7, 'all in the first bucket')
  t.equal(add.queueTime.p50Ms, add.queueTime.buckets[0]!.le)
  t.ok(Number.isNaN(service.methods.Sleep!.queueTime.p50Ms), 'no samples: no quantile')
  t.equal(server.metrics.method(SERVICE, 'Add')?.handled, 7, 'metrics.method() reads the live counters')
})

t.test('metrics: Prometheus text has the per-method histograms, counters and service gauges', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1, queueLength: 1 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)
  for (let i = 0; i < 4; i++) await calc.Add({ x: i, y: 0 })
  // One call waits 250 ms in the queue behind a blocked one; one more is refused.
  const blocker = track(calc.Sleep({ sleep_micros: 0 }))
  const waiting = track(calc.Add({ x: 100, y: 0 }))
  const refused = track(calc.Add({ x: 200, y: 0 }))
  await until(() => server.stats().callsReceived === 7, 'calls received')
  serverClock.runDeferred()
  t.equal(await refused.done, TOO_BUSY)
  serverClock.advance(250)
  controlled.release()
  t.same(await Promise.all([blocker.done, waiting.done]), ['OK', 'OK'])

  const text = await server.metrics.text()
  const labels = (method: string): string => `service="${SERVICE}",method="${method}"`
  const bucket = (method: string, le: string): number | undefined =>
    sample(text, 'nyala_rpc_incoming_queue_time_seconds_bucket', `${labels(method)},le="${le}"`)
  t.match(text, /# TYPE nyala_rpc_incoming_queue_time_seconds histogram/)
  t.match(text, /# TYPE nyala_calls_handled_total counter/)
  t.match(text, /# TYPE nyala_service_queue_length gauge/)
  // Add: 4 calls with no wait, 1 that waited 250 ms (0.25 s bucket, cumulative).
  t.equal(bucket('Add', '0.00005'), 4, 'le=0.00005: the four that did not wait')
  t.equal(bucket('Add', '0.1'), 4)
  t.equal(bucket('Add', '0.25'), 5, 'le=0.25: the one that waited 250 ms')
  t.equal(bucket('Add', '30'), 5)
  t.equal(bucket('Add', '+Inf'), 5)
  t.equal(sample(text, 'nyala_rpc_incoming_queue_time_seconds_count', labels('Add')), 5)
  t.equal(sample(text, 'nyala_rpc_incoming_queue_time_seconds_sum', labels('Add')), 0.25)
  t.equal(bucket('Echo', '+Inf'), 0, 'methods without calls are exported at zero')
  t.equal(sample(text, 'nyala_handler_latency_seconds_count', labels('Sleep')), 1)
  t.equal(sample(text, 'nyala_handler_latency_seconds_sum', labels('Sleep')), 0.25, 'the blocker ran for 250 ms')
  t.equal(sample(text, 'nyala_calls_handled_total', labels('Add')), 5)
  t.equal(sample(text, 'nyala_calls_handled_total', labels('Sleep')), 1)
  t.equal(sample(text, 'nyala_rpcs_queue_overflow_total', labels('Add')), 1)
  t.equal(sample(text, 'nyala_rpcs_queue_overflow_total', labels('Sleep')), 0)
  t.equal(sample(text, 'nyala_rpcs_evicted_total', labels('Add')), 0)
  t.equal(sample(text, 'nyala_rpcs_timed_out_in_queue_total', labels('Add')), 0)
  t.equal(sample(text, 'nyala_rpcs_timed_out_on_response_total', labels('Add')), 0)
  t.equal(sample(text, 'nyala_rpcs_shutdown_rejected_total', labels('Add')), 0)
  t.equal(sample(text, 'nyala_service_workers', `service="${SERVICE}"`), 1)
  t.equal(sample(text, 'nyala_service_idle_workers', `service="${SERVICE}"`), 1)
  t.equal(sample(text, 'nyala_service_queue_length', `service="${SERVICE}"`), 0)
  t.equal(server.metrics.registry, server.metrics.registry, 'one registry per server')
})

t.test('metrics: gauges are live at scrape time; two servers keep separate registries', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const a = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 2, queueLength: 5 })
  const b = await startServer(t, { clock: new FakeClock(), workers: 3 })
  const client = newClient(t, { clock: new FakeClock() })
  const calc = client.service(CalculatorService, a.endpoint)
  const calls = Array.from({ length: 5 }, () => track(calc.Sleep({ sleep_micros: 0 })))
  await until(() => controlled.sleeping.length === 2 && a.server.stats().callsReceived === 5, 'calls in place')
  const busy = await a.server.metrics.text()
  t.equal(sample(busy, 'nyala_service_idle_workers', `service="${SERVICE}"`), 0)
  t.equal(sample(busy, 'nyala_service_queue_length', `service="${SERVICE}"`), 3)
  const other = await b.server.metrics.text()
  t.equal(sample(other, 'nyala_service_workers', `service="${SERVICE}"`), 3)
  t.equal(sample(other, 'nyala_service_queue_length', `service="${SERVICE}"`), 0)
  t.equal(sample(other, 'nyala_calls_handled_total', `service="${SERVICE}",method="Sleep"`), 0)
  for (const started of [4, 5]) {
    controlled.release()
    await until(() => controlled.sleeping.length === started, `${started} handlers started`)
  }
  controlled.release()
  t.same(tally(await Promise.all(calls.map(c => c.done))), { OK: 5 })
  const idle = await a.server.metrics.text()
  t.equal(sample(idle, 'nyala_service_idle_workers', `service="${SERVICE}"`), 2)
  t.equal(sample(idle, 'nyala_service_queue_length', `service="${SERVICE}"`), 0)
  t.equal(sample(idle, 'nyala_calls_handled_total', `service="${SERVICE}",method="Sleep"`), 5)
})

t.test('metrics: eviction, expiry in queue, late response and shutdown each counted once, on the right method', async (t) => {
  const serverClock = new FakeClock()
  const controlled = new Controlled()
  t.teardown(() => controlled.release())
  const { server, endpoint } = await startServer(t, { clock: serverClock, handlers: controlled.handlers(), workers: 1, queueLength: 1 })
  const client = newClient(t, { endpoint, clock: new FakeClock() })
  const calc = client.service(CalculatorService)

  const late = track(calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 100 }))
  await until(() => controlled.sleeping.length === 1, 'the Sleep started')
  const evicted = track(calc.Add({ x: 1, y: 0 }, { timeoutMs: 5000 }))
  await until(() => server.stats().callsReceived === 2, 'the Add queued')
  const expires = track(calc.Add({ x: 2, y: 0 }, { timeoutMs: 50 }))
  await until(() => server.stats().callsReceived === 3, 'the short Add received')
  serverClock.runDeferred() // the short Add evicts the long one
  t.equal(await evicted.done, TOO_BUSY)
  serverClock.advance(50) // and then expires in the queue
  t.equal(await expires.done, TOO_BUSY)
  serverClock.advance(51) // the Sleep is now past its deadline
  controlled.release()
  t.equal(await late.done, 'OK')

  // A call still queued when a zero grace ends.
  const stuck = track(calc.Sleep({ sleep_micros: 0 }))
  await until(() => controlled.sleeping.length === 2, 'the second Sleep started')
  const leftover = track(calc.Add({ x: 3, y: 0 }))
  await until(() => server.stats().callsReceived === 5, 'the leftover queued')
  const closing = server.close({ graceMs: 0 })
  serverClock.advance(0)
  await closing
  await Promise.all([stuck.done, leftover.done])

  const snapshot = server.metrics.snapshot()[SERVICE]!.methods
  const add = snapshot.Add!
  const sleep = snapshot.Sleep!
  t.same([add.evictions, add.timedOutInQueue, add.shutdownRejected, add.queueOverflows, add.timedOutOnResponse, add.handled],
    [1, 1, 1, 0, 0, 0], 'Add: 1 evicted, 1 expired in queue, 1 refused at shutdown, none ran')
  t.same([sleep.timedOutOnResponse, sleep.handled, sleep.evictions, sleep.timedOutInQueue], [1, 1, 0, 0], 'Sleep: one handler finished late')
  t.equal(sleep.handlerLatency.sumMs, 101, 'its latency on the server clock')
  t.equal(add.queueTime.count, 0, 'queue time counts only calls that reached a handler')

  const text = await server.metrics.text()
  const labels = (method: string): string => `service="${SERVICE}",method="${method}"`
  t.equal(sample(text, 'nyala_rpcs_evicted_total', labels('Add')), 1)
  t.equal(sample(text, 'nyala_rpcs_timed_out_in_queue_total', labels('Add')), 1)
  t.equal(sample(text, 'nyala_rpcs_shutdown_rejected_total', labels('Add')), 1)
  t.equal(sample(text, 'nyala_rpcs_timed_out_on_response_total', labels('Sleep')), 1)
  t.equal(sample(text, 'nyala_rpcs_timed_out_on_response_total', labels('Add')), 0)
  t.equal(sample(text, 'nyala_calls_handled_total', labels('Sleep')), 1)
})

t.test('requests of one read are received together: a call waiting behind the earlier ones counts that as queue time', async t => {
  const clock = new FakeClock()
  const { RawClient, clientHandshakeBytes, requestFrame } = await import('../helpers/krpc-peers.js')
  // A synchronous Add that takes 2 ms of (fake) time.
  const { server, port } = await startServer(t, {
    clock,
    handlers: { ...calculatorHandlers, Add: (req) => { clock.advance(2); return { result: (req.x + req.y) >>> 0 } } }
  })
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  const add = (id: number): Buffer => requestFrame(id, SERVICE, 'Add', Buffer.from([0x08, id, 0x10, 1]))
  raw.write(Buffer.concat([clientHandshakeBytes(), add(0)]))
  await raw.nextResponse()
  const before = server.metrics.snapshot()[SERVICE]!.methods.Add!
  // One write of 3 requests: one read.
  raw.write(Buffer.concat([add(1), add(2), add(3)]))
  for (let i = 0; i < 3; i++) await raw.nextResponse()
  const after = server.metrics.snapshot()[SERVICE]!.methods.Add!
  t.equal(after.handlerLatency.count - before.handlerLatency.count, 3)
  t.equal(after.handlerLatency.sumMs - before.handlerLatency.sumMs, 6, 'each handler took its own 2 ms')
  t.equal(after.queueTime.count - before.queueTime.count, 3)
  t.equal(after.queueTime.sumMs - before.queueTime.sumMs, 0 + 2 + 4, 'the 2nd and 3rd waited for the ones before them')
})
