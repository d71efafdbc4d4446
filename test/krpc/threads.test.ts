/**
 * The worker-thread handler mode (docs/threads.md): handlers loaded in N
 * worker_threads answer exactly as in-loop handlers do, errors and crashed
 * threads become ERROR_APPLICATION, calls go through the same queue and
 * LIFO-parked workers (one per thread), and close() drains and terminates
 * the threads. No durations are asserted: tests wait for states.
 */
import { RpcError } from '../../codec/errors.js'
import t, { type Test } from 'tap'
import { Server } from '../../reactor/krpc/server.js'
import type { ServiceDef } from '../../codec/protobuf/schema.js'
import {
  CalculatorService, calculatorDef, calculatorHandlers, crc32, newClient, pattern, settle, startServer, turns
} from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'

// Worker threads start through the TypeScript loader: about 30 s here, 45 s on a loaded machine.
t.setTimeout(300_000)

const SERVICE = CalculatorService.fullName
const EchoRequest = CalculatorService.methods.Echo.requestType
const AddRequest = CalculatorService.methods.Add.requestType
const DEMO_MODULE = { module: new URL('../../examples/calculator/index.ts', import.meta.url), export: 'calculatorHandlers' }
const TEST_MODULE = { module: new URL('../helpers/thread-handlers.ts', import.meta.url) }

/** Waits (event-loop turns and 1 ms timers, no fixed duration) until `condition` holds. */
async function until (condition: () => boolean): Promise<void> {
  while (!condition()) {
    await turns(1)
    await new Promise((resolve) => setTimeout(resolve, 1))
  }
}

async function threadServer (t: Test, handlers: typeof DEMO_MODULE | typeof TEST_MODULE, options: { threads: number, queueLength?: number }): Promise<{ server: Server, endpoint: string }> {
  const server = new Server({ queueLength: options.queueLength ?? 50 }).addService(CalculatorService, handlers, { threads: options.threads })
  const { port } = await server.listen(0)
  t.teardown(() => server.close({ graceMs: 0 }))
  return { server, endpoint: `127.0.0.1:${port}` }
}

t.test('Add, Echo, PushStrings and EchoSidecars answer through threads exactly as in-loop', async (t) => {
  const inLoop = await startServer(t)
  const threaded = await threadServer(t, DEMO_MODULE, { threads: 2 })
  t.same(threaded.server.threadStats(SERVICE)?.alive, 2, 'both threads loaded the module before listen resolved')
  const client = newClient(t)
  const big = pattern(3 * 1024 * 1024, 3) // a frame longer than a socket read: its buffer is transferred
  const calls: Array<[string, Record<string, unknown>, Uint8Array[]]> = [
    ['Add', { x: 40, y: 2 }, []],
    ['Add', { x: 0xffffffff, y: 2 }, []],
    ['Echo', { data: 'héllo' }, []],
    ['Echo', { data: 'x'.repeat(100_000) }, []],
    ['PushStrings', { sidecar_indexes: [1, 0] }, [pattern(10, 1), pattern(70_000, 2)]],
    ['PushStrings', { sidecar_indexes: [0] }, [big]],
    ['EchoSidecars', {}, [Buffer.alloc(0), pattern(123, 4), pattern(5000, 5)]],
    ['EchoSidecars', {}, [pattern(200_000, 6), big]]
  ]
  for (const [method, request, sidecars] of calls) {
    const a = await client.call(inLoop.endpoint, calculatorDef, method, request, { sidecars })
    const b = await client.call(threaded.endpoint, calculatorDef, method, request, { sidecars })
    t.same(b.response, a.response, `${method} response`)
    t.equal(b.sidecars.length, a.sidecars.length, `${method} sidecar count`)
    for (let i = 0; i < a.sidecars.length; i++) t.ok(b.sidecars[i]!.equals(a.sidecars[i]!), `${method} sidecar ${i} identical`)
  }
  const pushed = await client.call(threaded.endpoint, calculatorDef, 'PushStrings', { sidecar_indexes: [0] }, { sidecars: [big] })
  t.same(pushed.response, { sizes: [big.length], crcs: [crc32(big)] }, 'the sidecar reached the thread intact')
  const moves = threaded.server.threadStats(SERVICE)!
  t.equal(moves.requestsMoved, 5, 'the five frames longer than a socket read moved to their thread without a copy')
  t.ok(moves.requestBytesCopied > 0, 'the others were copied out of the read buffer')

  // A request the thread cannot decode is ERROR_INVALID_REQUEST with the in-loop message.
  const emptyAdd = {
    fullName: SERVICE,
    methods: { Add: { ...calculatorDef.methods.Add!, requestType: calculatorDef.methods.EchoSidecars!.requestType } }
  } as unknown as ServiceDef
  const bad = await Promise.all([inLoop.endpoint, threaded.endpoint].map((endpoint) =>
    client.call(endpoint, emptyAdd, 'Add', {}).then(() => null, (e: RpcError) => [e.remote?.code, e.message])))
  t.same(bad[1], bad[0], 'undecodable request: same code and message')
  t.equal(threaded.server.stats().callsFailed, 1)

  // Many calls pipelined on one connection still each get their own answer.
  const many = await Promise.all(Array.from({ length: 200 }, (_, i) =>
    client.call<{ result: number }>(threaded.endpoint, calculatorDef, 'Add', { x: i, y: 1 }).then(r => r.response.result)))
  t.same(many, Array.from({ length: 200 }, (_, i) => i + 1))
})

t.test('handler errors, crashed threads, LIFO reuse, queue overflow and cancellation', async (t) => {
  const { server, endpoint } = await threadServer(t, TEST_MODULE, { threads: 2, queueLength: 1 })
  const client = newClient(t, { endpoint })
  const echo = (data: string, timeoutMs = 30_000, c = client): Promise<string> =>
    c.call<{ data: string }>(endpoint, calculatorDef, 'Echo', { data }, { timeoutMs }).then(r => r.response.data)
  const failure = (p: Promise<unknown>): Promise<[string, string]> =>
    p.then(() => ['OK', ''], (e: Error) => [String((e as { codeName?: string }).codeName), e.message])

  t.test('a throwing handler is ERROR_APPLICATION with its message; an RpcError keeps its code', async (t) => {
    t.same(await failure(echo('throw')), ['ERROR_APPLICATION', 'boom in a thread'])
    t.same(await failure(echo('reject')), ['ERROR_APPLICATION', 'async boom in a thread'])
    t.same(await failure(echo('coded')), ['ERROR_INVALID_REQUEST', 'bad x'])
    t.same(await failure(client.call(endpoint, calculatorDef, 'Sleep', { sleep_micros: 1, return_app_error: true })), ['ERROR_APPLICATION', 'Got some error'])
    t.equal(await echo('still fine'), 'still fine')
  })

  t.test('the deadline reaches the thread', async (t) => {
    const left = Number(await echo('remaining', 10_000))
    t.ok(left > 0 && left <= 10_000, `remainingMs in the thread is within the timeout (${left})`)
    t.equal(await echo('remaining', 0), 'Infinity', 'no timeout: no deadline')
  })

  t.test('idle threads park LIFO: sequential calls all reuse the same thread', async (t) => {
    const before = server.threadStats(SERVICE)!.handled
    const ids = new Set<string>()
    for (let i = 0; i < 10; i++) ids.add(await echo('thread'))
    const after = server.threadStats(SERVICE)!.handled
    t.same(after.map((n, i) => n - before[i]!), [10, 0], 'all ten on thread 0')
    t.equal(ids.size, 1, 'one threadId answered')
  })

  t.test('concurrent calls spread over the threads; a full queue answers TOO_BUSY; a closed connection cancels in the thread', async (t) => {
    const before = server.threadStats(SERVICE)!.handled
    const blocker = newClient(t, { endpoint })
    // Both wait until their signal aborts: only the connection closing ends them.
    const blocked = [settle(echo('until-aborted', 0, blocker)), settle(echo('until-aborted', 0, blocker))]
    await until(() => server.threadStats(SERVICE)!.busy === 2)
    const queued = echo('queued', 10_000)
    await until(() => server.metrics.snapshot()[SERVICE]!.queueLength === 1)
    const [code, message] = await failure(echo('overflow', 20_000))
    t.equal(code, 'ERROR_SERVER_TOO_BUSY', 'both threads busy and the queue full')
    t.match(message, /service queue is full/)
    blocker.close()
    t.notOk((await Promise.all(blocked)).includes('OK'), 'the blocked calls end with their connection')
    t.equal(await queued, 'queued', 'the queued call runs once a thread is free')
    await until(() => server.threadStats(SERVICE)!.busy === 0)
    const after = server.threadStats(SERVICE)!.handled
    const delta = after.map((n, i) => n - before[i]!)
    t.equal(delta[0]! + delta[1]!, 3, 'two cancelled calls and the queued one')
    t.ok(delta[0]! >= 1 && delta[1]! >= 1, `both threads handled calls (${delta.join(', ')})`)
  })

  t.test('a crashed or exited thread answers its call ERROR_APPLICATION and is restarted', async (t) => {
    const restarts = server.threadStats(SERVICE)!.restarts
    const [code, message] = await failure(echo('crash'))
    t.equal(code, 'ERROR_APPLICATION')
    t.match(message, /^worker thread \d stopped while handling nyala\.demo\.CalculatorService\.Echo: thread crashed on purpose$/)
    t.equal(await echo('after the crash'), 'after the crash', 'the restarted thread serves')
    const [exitCode, exitMessage] = await failure(echo('exit'))
    t.equal(exitCode, 'ERROR_APPLICATION')
    t.match(exitMessage, /^worker thread \d stopped while handling nyala\.demo\.CalculatorService\.Echo: exit code 7$/)
    t.equal(await echo('after the exit'), 'after the exit')
    const stats = server.threadStats(SERVICE)!
    t.equal(stats.restarts, restarts + 2)
    t.equal(stats.alive, 2)
  })
})

t.test('a thread handler that gives up at its deadline (rejects with its signal\'s reason) is refused timed-out: nothing is sent for its call id', async (t) => {
  const { server, endpoint } = await threadServer(t, TEST_MODULE, { threads: 1 })
  const outcomes: string[] = []
  server.onCallEnd((call, outcome) => { outcomes.push(`${call.method}:${outcome.reason}`) })
  const raw = await RawClient.connect(Number(endpoint.split(':')[1]))
  t.teardown(() => raw.close())
  raw.write(clientHandshakeBytes())
  raw.write(requestFrame(1, SERVICE, 'Echo', EchoRequest.encode({ data: 'gives-up' }), { timeoutMs: 200 }))
  await until(() => outcomes.length === 1)
  raw.write(requestFrame(2, SERVICE, 'Add', AddRequest.encode({ x: 2, y: 3 })))
  const next = await raw.nextResponse()
  t.equal(next.header.call_id, 2, 'the first answer on the connection is the Add\'s')
  t.same(raw.frames.filter(f => f.header.call_id === 1), [], 'nothing was sent for the Echo')
  await until(() => outcomes.length === 2)
  t.same(outcomes, ['Echo:timed-out', 'Add:ok'], 'the Echo refused timed-out, not failed')
  t.notOk(raw.isClosed)
})

t.test('callsPerThread: a thread holds several calls; each is cancelled on its own', async (t) => {
  // Room in the queue for the whole burst below: this test is about slots, not the hold window (tested above).
  const server = new Server({ queueLength: 100 }).addService(CalculatorService, TEST_MODULE, { threads: 1, callsPerThread: 3 })
  const { port } = await server.listen(0)
  t.teardown(() => server.close({ graceMs: 0 }))
  const endpoint = `127.0.0.1:${port}`
  t.match(server.threadStats(SERVICE), { threads: 1, callsPerThread: 3 })
  t.equal(server.metrics.snapshot()[SERVICE]!.workers, 3, 'the pool has threads x callsPerThread workers')
  const blocker = newClient(t, { endpoint })
  const echo = (c: typeof blocker, data: string): Promise<string> =>
    c.call<{ data: string }>(endpoint, calculatorDef, 'Echo', { data }, { timeoutMs: 0 }).then(r => r.response.data)
  const blocked = [settle(echo(blocker, 'until-aborted')), settle(echo(blocker, 'until-aborted'))]
  await until(() => server.threadStats(SERVICE)!.busy === 2)
  const client = newClient(t, { endpoint })
  t.equal(await echo(client, 'beside two waiting calls'), 'beside two waiting calls', 'the third slot still serves')
  blocker.close()
  t.notOk((await Promise.all(blocked)).includes('OK'))
  await until(() => server.threadStats(SERVICE)!.busy === 0)
  const many = await Promise.all(Array.from({ length: 100 }, (_, i) =>
    client.call<{ result: number }>(endpoint, calculatorDef, 'Add', { x: i, y: 1 }).then(r => r.response.result)))
  t.same(many, Array.from({ length: 100 }, (_, i) => i + 1), 'a pipelined burst through one thread')
  t.same(server.threadStats(SERVICE)!.handled, [103])
})

t.test('close() lets a call in a thread finish, then terminates the threads', async (t) => {
  const server = new Server().addService(CalculatorService, DEMO_MODULE, { threads: 1 })
  const { port } = await server.listen(0)
  const endpoint = `127.0.0.1:${port}`
  const client = newClient(t, { endpoint })
  // Long enough to be seen busy on a loaded machine; close() waits for it.
  const sleeping = settle(client.call(endpoint, calculatorDef, 'Sleep', { sleep_micros: 1_000_000 }))
  await until(() => server.threadStats(SERVICE)!.busy === 1)
  const closing = server.close()
  t.equal(await sleeping, 'OK', 'the call in flight is answered')
  await closing
  t.match(server.threadStats(SERVICE), { threads: 1, alive: 0, busy: 0, handled: [1], restarts: 0 }, 'no thread left running')
})

t.test('a module that cannot serve the service makes listen() reject', async (t) => {
  const cases: Array<[Parameters<Server['addService']>[1], RegExp]> = [
    [{ module: new URL('../helpers/thread-bad-handlers.ts', import.meta.url) }, /no handler for nyala\.demo\.CalculatorService\.Echo/],
    [{ ...TEST_MODULE, export: 'nope' }, /has no export 'nope'/],
    [{ ...TEST_MODULE, serviceExport: 'handlers' }, /export 'handlers' is not a ServiceDef/],
    [{ module: new URL('../helpers/no-such-module.ts', import.meta.url) }, /no-such-module/]
  ]
  // Side by side: each thread takes a while to start under the TypeScript loader.
  await Promise.all(cases.map(async ([handlers, message]) => {
    const server = new Server().addService(CalculatorService, handlers as typeof TEST_MODULE, { threads: 1 })
    await t.rejects(server.listen(0), { message })
    await server.close()
    t.equal(server.threadStats(SERVICE)!.alive, 0, 'the thread is gone')
  }))
})

t.test('thread mode and handler objects do not mix', async (t) => {
  const server = new Server()
  t.throws(() => server.addService(CalculatorService, calculatorHandlers as never, { threads: 2 }), { message: /thread mode takes \{ module/ })
  t.throws(() => server.addService(CalculatorService, DEMO_MODULE as never), { message: /needs the threads option/ })
  t.throws(() => server.addService(CalculatorService, DEMO_MODULE, { threads: 0 }), { message: /threads must be a positive integer/ })
})
