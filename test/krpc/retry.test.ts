/**
 * Client retries: calls that did not run (TOO_BUSY, UNAVAILABLE, shutting
 * down, connect failures, unsent requests) are retried with backoff and the
 * original deadline; calls that may have run are retried only when marked
 * idempotent; the budget and attempts end retries; cancellation ends them.
 */
import t from 'tap'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { LinearBackoff, RetryBudget } from '../../scheduling/retry.js'
import { realClock } from '../../scheduling/clock.js'
import { CalculatorService, calculatorHandlers, newClient, settle, startServer } from '../helpers/reactor-harness.js'
import { CLOSED_ENDPOINT, FakeServer } from '../helpers/krpc-peers.js'

t.test('TOO_BUSY is retried until a worker is free, and the call succeeds once', async t => {
  let release!: () => void
  const blocked = new Promise<void>((resolve) => { release = resolve })
  let sleeps = 0
  const { endpoint } = await startServer(t, {
    workers: 1,
    queueLength: 0,
    handlers: { ...calculatorHandlers, Sleep: async () => { sleeps++; await blocked; return {} } }
  })
  const client = newClient(t, { endpoint, retry: {} })
  const calc = client.service(CalculatorService)
  const first = calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 10_000 })
  // Each retry meets the busy worker until it is released.
  const second = calc.Sleep({ sleep_micros: 0 }, { timeoutMs: 10_000 })
  while ((client.retryStats?.retries ?? 0) < 2) await new Promise((resolve) => setTimeout(resolve, 1))
  release()
  t.same(await Promise.all([settle(first), settle(second)]), ['OK', 'OK'])
  t.equal(sleeps, 2, 'each logical call ran exactly once')
  t.ok(client.retryStats!.retries >= 2)
  t.equal(client.retryStats!.exhausted, 0)
})

t.test('retries keep the original deadline: a call that stays busy ends DEADLINE_EXCEEDED naming the last error', async t => {
  const { endpoint } = await startServer(t, {
    workers: 0,
    queueLength: 0
  })
  const client = newClient(t, { endpoint, retry: { backoff: new LinearBackoff({ stepMs: 20 }) } })
  const error = await client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 300 }).then(() => null, (e: unknown) => e as Error & { code: string })
  t.equal(error?.code, 'RPC_ERR_DEADLINE_EXCEEDED')
  t.match(error?.message, /attempt\(s\); last error: .*service queue is full/)
  t.equal(client.retryStats!.exhausted, 1)
  t.ok(client.retryStats!.retries >= 1)
})

t.test('a retry that runs into the deadline ends DEADLINE_EXCEEDED naming the error that made it retry', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint, retry: { backoff: new LinearBackoff({ stepMs: 1 }) } })
  const pending = client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 300 }).then(() => null, (e: unknown) => e as Error & { code: string })
  const peer = await fake.peer(0)
  const first = await peer.nextCall()
  peer.respondError(first.header.call_id, KrpcCode.ERROR_SERVER_TOO_BUSY, 'busy now')
  await peer.nextCall() // the retry, never answered
  const error = await pending
  t.equal(error?.code, 'RPC_ERR_DEADLINE_EXCEEDED')
  t.match(error?.message, /timed out after 300 ms and 2 attempt\(s\); last error: .*busy now/)
  t.same(client.retryStats && [client.retryStats.retries, client.retryStats.exhausted], [1, 1])
})

t.test('without a retry policy, or with retry: false, TOO_BUSY surfaces at once', async t => {
  const { endpoint } = await startServer(t, { workers: 0, queueLength: 0 })
  const plain = newClient(t, { endpoint })
  t.equal(await settle(plain.service(CalculatorService).Add({ x: 1, y: 2 })), 'REMOTE:ERROR_SERVER_TOO_BUSY')
  t.equal(plain.retryStats, null)
  const retrying = newClient(t, { endpoint, retry: {} })
  t.equal(await settle(retrying.service(CalculatorService).Add({ x: 1, y: 2 }, { retry: false })), 'REMOTE:ERROR_SERVER_TOO_BUSY')
  t.equal(retrying.retryStats!.retries, 0)
})

t.test('maxAttempts ends retries with the last error', async t => {
  const { endpoint } = await startServer(t, { workers: 0, queueLength: 0 })
  const client = newClient(t, { endpoint, retry: { maxAttempts: 3, backoff: new LinearBackoff({ stepMs: 1 }) } })
  t.equal(await settle(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 10_000 })), 'REMOTE:ERROR_SERVER_TOO_BUSY')
  t.equal(client.retryStats!.retries, 2, '3 attempts = 2 retries')
})

t.test('the retry budget stops retries from amplifying an overload', async t => {
  const { endpoint } = await startServer(t, { workers: 0, queueLength: 0 })
  const budget = new RetryBudget(realClock, { ratio: 0, minRetriesPerSecond: 0.1 }) // one retry per 10 s window
  const client = newClient(t, { endpoint, retry: { budget, backoff: new LinearBackoff({ stepMs: 1 }) } })
  const calc = client.service(CalculatorService)
  const outcomes = await Promise.all([1, 2, 3].map(() => settle(calc.Add({ x: 1, y: 2 }, { timeoutMs: 10_000 }))))
  t.same(outcomes, ['REMOTE:ERROR_SERVER_TOO_BUSY', 'REMOTE:ERROR_SERVER_TOO_BUSY', 'REMOTE:ERROR_SERVER_TOO_BUSY'])
  t.equal(budget.stats.retries, 1)
  t.ok(budget.stats.refused >= 2)
})

t.test('connect failures are retried until the deadline', async t => {
  const client = newClient(t, { endpoint: CLOSED_ENDPOINT, retry: { backoff: new LinearBackoff({ stepMs: 5 }) } })
  t.equal(await settle(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 500 })), 'RPC_ERR_DEADLINE_EXCEEDED')
  t.ok(client.retryStats!.retries >= 1)
})

t.test('a request lost with its connection after it was sent is retried only when idempotent', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint, retry: { backoff: new LinearBackoff({ stepMs: 1 }) } })
  const calc = client.service(CalculatorService)

  const plain = settle(calc.Add({ x: 1, y: 2 }, { timeoutMs: 10_000 }))
  const peer0 = await fake.peer(0)
  await peer0.nextCall()
  peer0.socket.destroy()
  t.equal(await plain, 'RPC_ERR_CONNECTION_CLOSED', 'may have run: not retried')

  const idempotent = settle(calc.Add({ x: 1, y: 2 }, { timeoutMs: 10_000, idempotent: true }))
  const peer1 = await fake.peer(1)
  await peer1.nextCall()
  peer1.socket.destroy()
  const peer2 = await fake.peer(2)
  const call = await peer2.nextCall()
  peer2.respond(call.header.call_id, CalculatorService.methods.Add.responseType, { result: 3 })
  t.equal(await idempotent, 'OK', 'idempotent: retried on a new connection')
})

t.test('FATAL_SERVER_SHUTTING_DOWN and ERROR_UNAVAILABLE are retried; application errors are not', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint, retry: { backoff: new LinearBackoff({ stepMs: 1 }) } })
  const calc = client.service(CalculatorService)
  const pending = settle(calc.Add({ x: 1, y: 2 }, { timeoutMs: 10_000 }))
  const peer0 = await fake.peer(0)
  const c0 = await peer0.nextCall()
  peer0.respondError(c0.header.call_id, KrpcCode.ERROR_UNAVAILABLE, 'not yet')
  const c1 = await peer0.nextCall()
  peer0.respondError(c1.header.call_id, KrpcCode.FATAL_SERVER_SHUTTING_DOWN, 'bye')
  // The FATAL answer retired that connection: the next attempt opens another.
  const peer1 = await fake.peer(1)
  const c2 = await peer1.nextCall()
  peer1.respondError(c2.header.call_id, KrpcCode.ERROR_APPLICATION, 'boom')
  t.equal(await pending, 'REMOTE:ERROR_APPLICATION')
  t.equal(client.retryStats!.retries, 2)
})

t.test('cancelling a call while it waits to retry ends it CANCELLED', async t => {
  const { endpoint } = await startServer(t, { workers: 0, queueLength: 0 })
  const client = newClient(t, { endpoint, retry: { backoff: new LinearBackoff({ stepMs: 60_000 }) } })
  const controller = new AbortController()
  const pending = settle(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 600_000, signal: controller.signal }))
  while ((client.retryStats?.retries ?? 0) < 1) await new Promise((resolve) => setTimeout(resolve, 1))
  controller.abort()
  t.equal(await pending, 'RPC_ERR_CANCELLED')
})
