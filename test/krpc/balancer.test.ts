/**
 * Client balancing: the Balancer's choices with a fake clock, then a client
 * spreading calls over several endpoints and connections, skipping a dead
 * endpoint, and resolving a name to its addresses.
 */
import t from 'tap'
import { Balancer, type BalancePolicy, type Slot } from '../../reactor/balancer.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CalculatorService, newClient, settle, startServer, tally } from '../helpers/reactor-harness.js'
import { CLOSED_ENDPOINT } from '../helpers/krpc-peers.js'

const ADDRESSES = [{ host: '10.0.0.1', port: 1 }, { host: '10.0.0.2', port: 2 }, { host: '10.0.0.3', port: 3 }]

function balancer (policy: BalancePolicy, load: Record<string, number> = {}, perEndpoint = 1, random?: () => number): { b: Balancer, clock: FakeClock } {
  const clock = new FakeClock(0)
  const b = new Balancer(ADDRESSES, {
    connectionsPerEndpoint: perEndpoint,
    policy,
    clock,
    outstanding: (slot: Slot) => load[slot.key] ?? 0,
    ...(random === undefined ? {} : { random })
  })
  return { b, clock }
}

t.test('slots: every address times connectionsPerEndpoint, keyed by address and index', async t => {
  const { b } = balancer('round-robin', {}, 2)
  t.same(b.slots.map((s) => s.key), ['10.0.0.1:1#0', '10.0.0.1:1#1', '10.0.0.2:2#0', '10.0.0.2:2#1', '10.0.0.3:3#0', '10.0.0.3:3#1'])
  t.throws(() => new Balancer(ADDRESSES, { connectionsPerEndpoint: 0, policy: 'p2c', clock: new FakeClock(), outstanding: () => 0 }), RangeError)
})

t.test('round-robin visits each slot in turn and skips a failing one until its backoff passes', async t => {
  const { b, clock } = balancer('round-robin')
  t.same([1, 2, 3, 4].map(() => b.pick()!.address.port), [1, 2, 3, 1])
  b.failed(b.slots[1]!)
  t.equal(b.slots[1]!.failures, 1)
  t.ok(b.slots[1]!.retryAt > clock.now(), 'backing off')
  t.same([1, 2, 3, 4].map(() => b.pick()!.address.port), [3, 1, 3, 1], 'port 2 skipped')
  clock.advance(b.slots[1]!.retryAt - clock.now())
  t.same([1, 2, 3].map(() => b.pick()!.address.port), [2, 3, 1], 'back after the backoff')
  b.succeeded(b.slots[1]!)
  t.equal(b.slots[1]!.failures, 0)
})

t.test('repeated failures back off longer, up to a cap', async t => {
  const { b, clock } = balancer('round-robin')
  const slot = b.slots[0]!
  const delays: number[] = []
  for (let i = 0; i < 20; i++) {
    b.failed(slot)
    delays.push(slot.retryAt - clock.now())
  }
  t.ok(delays.every((d) => d > 0 && d <= 5000), 'within (0, 5 s]')
  t.ok(delays[delays.length - 1]! > delays[0]!, 'grows')
})

t.test('when every slot is failing, the one due soonest is tried (a call is never failed untried)', async t => {
  for (const policy of ['round-robin', 'least-outstanding', 'p2c'] as const) {
    const { b, clock } = balancer(policy)
    b.slots[0]!.retryAt = clock.now() + 300
    b.slots[1]!.retryAt = clock.now() + 100
    b.slots[2]!.retryAt = clock.now() + 200
    t.equal(b.pick()!.address.port, 2, policy)
  }
})

t.test('least-outstanding picks the least loaded healthy slot', async t => {
  const load = { '10.0.0.1:1#0': 5, '10.0.0.2:2#0': 1, '10.0.0.3:3#0': 3 }
  const { b } = balancer('least-outstanding', load)
  t.equal(b.pick()!.address.port, 2)
  b.failed(b.slots[1]!)
  t.equal(b.pick()!.address.port, 3, 'the failing one is skipped')
})

t.test('p2c compares two random slots and takes the less loaded', async t => {
  const load = { '10.0.0.1:1#0': 5, '10.0.0.2:2#0': 1, '10.0.0.3:3#0': 3 }
  // random() picks a = slots[floor(r*3)], b = slots[floor(r*2)] (b moved to the last slot when equal to a).
  const seq = [0.0, 0.6] // a = slot 0 (load 5), b = slot 1 (load 1)
  const { b } = balancer('p2c', load, 1, () => seq.shift() ?? 0)
  t.equal(b.pick()!.address.port, 2)
  const seq2 = [0.5, 0.5] // a = slot 1, b = slot 1 → replaced by slot 2
  const { b: b2 } = balancer('p2c', load, 1, () => seq2.shift() ?? 0)
  t.equal(b2.pick()!.address.port, 2, 'slot 1 (load 1) beats slot 2 (load 3)')
})

t.test('setAddresses keeps the state of kept slots', async t => {
  const { b } = balancer('round-robin')
  b.failed(b.slots[0]!)
  b.setAddresses([ADDRESSES[0]!, { host: '10.0.0.9', port: 9 }])
  t.same(b.slots.map((s) => s.key), ['10.0.0.1:1#0', '10.0.0.9:9#0'])
  t.equal(b.slots[0]!.failures, 1)
})

t.test('a client spreads calls over several endpoints and connections', async t => {
  const one = await startServer(t)
  const two = await startServer(t)
  const client = newClient(t, { endpoint: [one.endpoint, two.endpoint], connectionsPerEndpoint: 2, balance: 'round-robin' })
  const calc = client.service(CalculatorService)
  const results = await Promise.all(Array.from({ length: 40 }, (_, i) => calc.Add({ x: i, y: 1 })))
  t.same(results.map((r) => r.result), Array.from({ length: 40 }, (_, i) => i + 1))
  t.equal(one.server.stats().callsReceived, 20)
  t.equal(two.server.stats().callsReceived, 20)
  t.equal(one.server.stats().connectionsAccepted, 2)
  t.equal(two.server.stats().connectionsAccepted, 2)
  t.equal(client.connectionCount, 4)
})

t.test('p2c over one endpoint with several connections uses them all', async t => {
  const { server, endpoint } = await startServer(t)
  const client = newClient(t, { endpoint, connectionsPerEndpoint: 4 })
  const calc = client.service(CalculatorService)
  await Promise.all(Array.from({ length: 200 }, (_, i) => calc.Add({ x: i, y: 1 })))
  t.equal(server.stats().callsReceived, 200)
  t.equal(server.stats().connectionsAccepted, 4)
})

t.test('a dead endpoint is skipped after its first failure; with retries no call fails', async t => {
  const live = await startServer(t)
  const dead = CLOSED_ENDPOINT
  // A fake clock: the dead slot's backoff never ends during the loop, however slow the machine.
  const plain = newClient(t, { endpoint: [dead, live.endpoint], balance: 'round-robin', clock: new FakeClock() })
  const calc = plain.service(CalculatorService)
  const outcomes: string[] = []
  for (let i = 0; i < 10; i++) outcomes.push(await settle(calc.Add({ x: 1, y: 2 })))
  t.same(tally(outcomes), { RPC_ERR_CONNECT_FAILED: 1, OK: 9 }, 'only the first call met the dead endpoint')

  const retrying = newClient(t, { endpoint: [dead, live.endpoint], balance: 'round-robin', retry: {} })
  const rcalc = retrying.service(CalculatorService)
  const all = await Promise.all(Array.from({ length: 10 }, () => settle(rcalc.Add({ x: 1, y: 2 }, { timeoutMs: 10_000 }))))
  t.same(tally(all), { OK: 10 })
})

t.test('resolveAll balances over the addresses a name resolves to', async t => {
  const { server, port } = await startServer(t)
  const client = newClient(t, { endpoint: `localhost:${port}`, resolveAll: true, connectionsPerEndpoint: 2 })
  const calc = client.service(CalculatorService)
  const outcomes = await Promise.all(Array.from({ length: 10 }, () => settle(calc.Add({ x: 1, y: 2 }))))
  // localhost may also resolve to ::1, where nothing listens: those slots fail and are skipped.
  t.ok((tally(outcomes).OK ?? 0) >= 1)
  t.ok(server.stats().connectionsAccepted >= 1)
  const unknown = newClient(t, { endpoint: 'no-such-host.invalid:7050', resolveAll: true })
  t.equal(await settle(unknown.service(CalculatorService).Add({ x: 1, y: 2 })), 'RPC_ERR_CONNECT_FAILED')
})
