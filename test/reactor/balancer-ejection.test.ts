/**
 * The balancer with outlier ejection on a FakeClock: an ejected host's
 * slots are skipped by every policy, a half-open host gets the next call
 * as its probe, and connection failures count against the host.
 */
import t from 'tap'
import { Balancer, type BalancePolicy, type Slot } from '../../reactor/balancer.js'
import { FakeClock } from '../../scheduling/clock.js'
import { OutlierEjection } from '../../scheduling/outlier-ejection.js'

const ADDRESSES = [{ host: '10.0.0.1', port: 1 }, { host: '10.0.0.2', port: 2 }, { host: '10.0.0.3', port: 3 }]

// Ports 1 and 3 busier than port 2, so that least-outstanding prefers port 2 when it may.
function balancer (policy: BalancePolicy, perEndpoint = 1): { b: Balancer, clock: FakeClock } {
  const clock = new FakeClock(0)
  const ejection = new OutlierEjection(clock, { consecutiveFailures: 2, baseEjectionMs: 500 })
  const outstanding = (slot: Slot): number => slot.address.port === 2 ? 0 : 1
  const b = new Balancer(ADDRESSES, { connectionsPerEndpoint: perEndpoint, policy, clock, outstanding, ejection })
  return { b, clock }
}

t.test('an ejected host takes no calls under any policy, then takes back its share after a probe', async t => {
  for (const policy of ['round-robin', 'least-outstanding', 'p2c'] as const) {
    const { b, clock } = balancer(policy, 2)
    const bad = b.slots.find((s) => s.address.port === 2)!
    b.callFailed(bad)
    b.callFailed(bad)
    t.same(b.ejectionStats()!.ejectedHosts, ['10.0.0.2:2'], `${policy}: ejected`)
    const ports = Array.from({ length: 60 }, () => b.pick()!.address.port)
    t.notOk(ports.includes(2), `${policy}: port 2 skipped`)
    clock.advance(500)
    const probe = b.pick()!
    t.equal(probe.address.port, 2, `${policy}: the next call is the probe`)
    t.notOk(Array.from({ length: 30 }, () => b.pick()!.address.port).includes(2), `${policy}: one probe at a time`)
    b.callSucceeded(probe)
    t.equal(b.ejectionStats()!.readmissions, 1)
    t.ok(Array.from({ length: 60 }, () => b.pick()!.address.port).includes(2), `${policy}: back in`)
  }
})

t.test('connection failures count against the host; connection success does not readmit', async t => {
  const { b, clock } = balancer('round-robin')
  const slot = b.slots[0]!
  b.failed(slot)
  b.failed(slot)
  t.equal(b.ejectionStats()!.ejected, 1)
  clock.advance(500)
  const probe = b.pick()!
  t.equal(probe, slot)
  b.succeeded(slot)
  t.equal(b.ejectionStats()!.ejected, 1, 'a TCP connect proves nothing')
  b.callSucceeded(slot)
  t.equal(b.ejectionStats()!.ejected, 0)
})

t.test('a probe does not wait for its slot\'s connect backoff: the ejection times alone decide', async t => {
  const { b, clock } = balancer('round-robin')
  const slot = b.slots[1]!
  for (let i = 0; i < 12; i++) b.failed(slot)
  t.ok(slot.retryAt - clock.now() > 500, 'the slot backs off longer than the ejection')
  t.equal(b.ejectionStats()!.ejected, 1)
  clock.advance(500)
  t.equal(b.pick(), slot, 'probed when the ejection ends')
})

t.test('when every eligible slot is backing off, an eligible host is still preferred to an ejected one', async t => {
  const { b, clock } = balancer('p2c')
  b.callFailed(b.slots[0]!)
  b.callFailed(b.slots[0]!)
  b.slots[1]!.retryAt = clock.now() + 300
  b.slots[2]!.retryAt = clock.now() + 200
  t.equal(b.pick()!.address.port, 3)
})

t.test('without ejection the balancer reports none', async t => {
  const b = new Balancer(ADDRESSES, { connectionsPerEndpoint: 1, policy: 'p2c', clock: new FakeClock(), outstanding: () => 0 })
  t.equal(b.ejectionStats(), null)
  b.callFailed(b.slots[0]!)
  b.callSucceeded(b.slots[0]!)
  t.equal(b.slots.length, 3)
})
