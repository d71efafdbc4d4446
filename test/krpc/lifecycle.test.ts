// The KRPC client's life: per-call endpoints, close() and cancellation of calls queued behind KRPC negotiation, 8 MiB sidecar calls cancelled mid-write.
// The generic server and client lifecycle (peers and servers going away, idle close, shutdown, connect failures) is tested in test/reactor/lifecycle.test.ts.
import t from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { Client } from '../../reactor/krpc/client.js'
import {
  CalculatorService, Probe, calculatorDef, calculatorHandlers, crc32, newClient, pattern, prng, settle, startServer, tally, track, turns
} from '../helpers/reactor-harness.js'

const MiB = 1024 * 1024

t.test('a malformed endpoint fails the call, it does not throw', async (t) => {
  const client = newClient(t)
  for (const endpoint of ['nohost', '127.0.0.1:0', '127.0.0.1:99999', ':80']) {
    t.equal(await settle(client.call(endpoint, calculatorDef, 'Add', { x: 1, y: 1 })), ErrorCode.INVALID_ARGUMENT, endpoint)
  }
})

t.test('client.close() with calls pending rejects each exactly once with RPC_ERR_CLIENT_CLOSED', async (t) => {
  const probe = new Probe()
  const { endpoint } = await startServer(t, { handlers: probe.handlers() })
  // A server whose negotiation never finishes: calls to it stay queued, unsent.
  const other = await startServer(t, { authenticate: () => new Promise<boolean>(() => {}) })
  const client = new Client({ endpoint })
  const calc = client.service(CalculatorService)
  await calc.Add({ x: 1, y: 1 })
  let callbacks = 0
  const count = <T>(p: Promise<T>): Promise<T> => { p.then(() => { callbacks++ }, () => { callbacks++ }); return p }
  const sent = Array.from({ length: 5 }, () => settle(count(calc.Sleep({ sleep_micros: 30_000_000 }))))
  // Calls queued, unwritten, behind a negotiation that never ends.
  const queued = Array.from({ length: 3 }, () => settle(count(client.call(other.endpoint, calculatorDef, 'Add', { x: 1, y: 1 }))))
  await probe.started('Sleep', 5)
  client.close()
  const outcomes = await Promise.all([...sent, ...queued])
  t.same(tally(outcomes), { [ErrorCode.CLIENT_CLOSED]: 8 })
  await turns(3)
  t.equal(callbacks, 8, 'each call settled once')
  t.equal(other.server.stats().callsReceived, 0)
  t.equal(client.pendingCalls, 0)
  t.equal(client.connectionCount, 0)
  t.equal(await settle(calc.Add({ x: 1, y: 1 })), ErrorCode.CLIENT_CLOSED, 'later calls fail at once')
  client.close()
  t.pass('close is idempotent')
})

t.test('cancellation before start, while queued, and after sending', async (t) => {
  const probe = new Probe()
  const { endpoint, server } = await startServer(t, { handlers: probe.handlers() })
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)

  const aborted = new AbortController()
  aborted.abort()
  t.equal(await settle(calc.Add({ x: 1, y: 1 }, { signal: aborted.signal })), ErrorCode.CANCELLED, 'already aborted: never starts')
  t.equal(client.connectionCount, 0, 'no connection opened for it')

  // Queued: the connection is still negotiating when the abort comes.
  const queued = new AbortController()
  const whileQueued = settle(calc.Add({ x: 1, y: 1 }, { signal: queued.signal }))
  queued.abort()
  const alongside = calc.Add({ x: 2, y: 3 })
  t.equal(await whileQueued, ErrorCode.CANCELLED)
  t.same(await alongside, { result: 5 })
  t.equal(server.stats().callsReceived, 1, 'the cancelled queued call was never sent')

  // Sent: the handler is running when the abort comes.
  const sent = new AbortController()
  const afterSend = track(calc.Sleep({ sleep_micros: 30_000_000 }, { signal: sent.signal }))
  await probe.started('Sleep')
  sent.abort()
  t.equal(await afterSend.done, ErrorCode.CANCELLED)
  t.equal(client.pendingCalls, 0)
  // Aborting after the call finished changes nothing.
  const late = new AbortController()
  t.same(await calc.Add({ x: 4, y: 4 }, { signal: late.signal }), { result: 8 })
  late.abort()
  t.same(await calc.Add({ x: 5, y: 5 }), { result: 10 }, 'the connection is unharmed')
})

t.test('8 MiB sidecar calls cancelled at random points never corrupt the stream', async (t) => {
  const expected = new Map<number, number>()
  const payloads = [0, 1, 2].map((seed) => {
    const p = pattern(8 * MiB, seed * 17)
    expected.set(crc32(p), seed)
    return p
  })
  let corrupted = 0
  let verified = 0
  const { endpoint, server } = await startServer(t, {
    handlers: {
      ...calculatorHandlers,
      PushStrings: (req, ctx) => {
        const result = calculatorHandlers.PushStrings(req, ctx) as { sizes: number[], crcs: number[] }
        for (const crc of result.crcs) {
          if (expected.has(crc)) verified++
          else corrupted++
        }
        return result
      }
    }
  })
  const client = newClient(t, { endpoint, defaultTimeoutMs: 30_000 })
  const random = prng(0xc0ffee)
  const N = 24
  const outcomes: Array<Promise<string>> = []
  for (let wave = 0; wave < N / 6; wave++) {
    const wavePromises: Array<Promise<string>> = []
    for (let i = 0; i < 6; i++) {
      const controller = new AbortController()
      const payload = payloads[(wave * 6 + i) % payloads.length]!
      const call = client.call<{ sizes: number[], crcs: number[] }>(endpoint, calculatorDef, 'PushStrings', { sidecar_indexes: [0] },
        { sidecars: [payload], signal: controller.signal })
        .then((r) => r.response.crcs[0] === crc32(payload) ? 'OK' : 'WRONG_ANSWER', (e: unknown) => e instanceof RpcError ? e.code : String(e))
      wavePromises.push(call)
      // Abort after 0..40 event-loop turns: queued, mid-write, sent or answered.
      const at = Math.floor(random() * 41)
      if (random() < 0.85) {
        void (async () => {
          if (at === 0) controller.abort()
          else { await turns(at); controller.abort() }
        })()
      }
    }
    await Promise.all(wavePromises)
    outcomes.push(...wavePromises)
  }
  const counts = tally(await Promise.all(outcomes))
  t.comment(`outcomes: ${JSON.stringify(counts)}; server verified ${verified}`)
  const total = Object.values(counts).reduce((a, b) => a + b, 0)
  t.equal(total, N, 'every call settled')
  for (const key of Object.keys(counts)) t.ok(key === 'OK' || key === ErrorCode.CANCELLED, `only OK or CANCELLED (${key})`)
  t.ok((counts[ErrorCode.CANCELLED] ?? 0) > 0, 'some were cancelled')
  t.equal(corrupted, 0, 'the server never saw a corrupted payload')
  t.equal(server.stats().badFrames, 0, 'no bad frame')
  t.equal(server.stats().connectionsAccepted, 1, 'the connection was never torn down')
  const check = pattern(MiB, 3)
  const final = await client.call<{ crcs: number[] }>(endpoint, calculatorDef, 'PushStrings', { sidecar_indexes: [0] }, { sidecars: [check] })
  t.equal(final.response.crcs[0], crc32(check), 'the connection still carries large frames intact')
})
