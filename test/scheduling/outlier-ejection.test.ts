/**
 * Outlier ejection on a FakeClock: consecutive failures eject, ejection
 * times double up to the cap, half-open hosts take one probe, the cap on
 * ejected hosts keeps one eligible, and the counters count each event.
 */
import t from 'tap'
import { FakeClock } from '../../scheduling/clock.js'
import { OutlierEjection } from '../../scheduling/outlier-ejection.js'

const HOSTS = ['a:1', 'b:1', 'c:1']

function tracker (options: ConstructorParameters<typeof OutlierEjection>[1] = {}, hosts = HOSTS): { e: OutlierEjection, clock: FakeClock } {
  const clock = new FakeClock(0)
  const e = new OutlierEjection(clock, options)
  e.setHosts(hosts)
  return { e, clock }
}

function fail (e: OutlierEjection, key: string, n: number): void {
  for (let i = 0; i < n; i++) e.failed(key)
}

t.test('consecutive failures eject; a success between resets the count', async t => {
  const { e } = tracker({ consecutiveFailures: 3 })
  fail(e, 'a:1', 2)
  e.succeeded('a:1')
  fail(e, 'a:1', 2)
  t.equal(e.status('a:1'), 'active', 'two in a row after a success: still in')
  e.failed('a:1')
  t.equal(e.status('a:1'), 'ejected')
  t.notOk(e.eligible('a:1'))
  t.ok(e.eligible('b:1'))
  t.same(e.stats(), { ejections: 1, readmissions: 0, ejectionsRefused: 0, probeFailures: 0, ejected: 1, ejectedHosts: ['a:1'] })
})

t.test('after the ejection time the host is due one probe; its success takes it back', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 1, baseEjectionMs: 500 })
  e.failed('a:1')
  clock.advance(499)
  t.equal(e.status('a:1'), 'ejected')
  clock.advance(1)
  t.equal(e.status('a:1'), 'probe-due')
  t.notOk(e.eligible('a:1'), 'a half-open host is not eligible for ordinary calls')
  e.probeStarted('a:1')
  t.equal(e.status('a:1'), 'probing', 'one probe at a time')
  e.succeeded('a:1')
  t.equal(e.status('a:1'), 'active')
  t.equal(e.stats().readmissions, 1)
  t.equal(e.stats().ejected, 0)
})

t.test('a failed probe ejects again for twice as long, up to maxEjectionMs; readmission resets it', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 1, baseEjectionMs: 500, maxEjectionMs: 1500 })
  e.failed('a:1')
  const times: number[] = []
  for (let round = 0; round < 4; round++) {
    let waited = 0
    while (e.status('a:1') !== 'probe-due') { clock.advance(100); waited += 100 }
    times.push(waited)
    e.probeStarted('a:1')
    e.failed('a:1')
  }
  t.same(times, [500, 1000, 1500, 1500], 'doubling, capped')
  t.equal(e.stats().probeFailures, 4)
  t.equal(e.stats().ejections, 5)
  while (e.status('a:1') !== 'probe-due') clock.advance(100)
  e.probeStarted('a:1')
  e.succeeded('a:1')
  e.failed('a:1')
  let waited = 0
  while (e.status('a:1') !== 'probe-due') { clock.advance(100); waited += 100 }
  t.equal(waited, 500, 'back to the base time after a readmission')
})

t.test('a probe with no outcome within probeTimeoutMs counts as failed (its attempt\'s time-out before that, not yet)', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 1, baseEjectionMs: 100, probeTimeoutMs: 300 })
  e.failed('a:1')
  clock.advance(100)
  e.probeStarted('a:1')
  clock.advance(100)
  e.timedOut('a:1')
  clock.advance(199)
  t.equal(e.status('a:1'), 'probing')
  clock.advance(1)
  t.equal(e.status('a:1'), 'ejected', 'the lost probe ejects again')
  t.equal(e.stats().probeFailures, 1)
  t.equal(e.stats().ejected, 1)
})

t.test('while ejected, late outcomes of calls sent before are ignored', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 1, baseEjectionMs: 100 })
  e.failed('a:1')
  e.succeeded('a:1')
  t.equal(e.status('a:1'), 'ejected', 'a late answer does not readmit without a probe')
  fail(e, 'a:1', 10)
  t.equal(e.stats().ejections, 1, 'late failures do not eject again')
  clock.advance(100)
  t.equal(e.status('a:1'), 'probe-due', 'nor lengthen the ejection')
})

t.test('a time-out counts as a failure, except against a probe: the probe has until probeTimeoutMs, and a late answer takes the host back', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 2, baseEjectionMs: 500, probeTimeoutMs: 1000 })
  e.timedOut('a:1')
  e.timedOut('a:1')
  t.equal(e.status('a:1'), 'ejected', 'time-outs of a host taking calls eject it')
  clock.advance(500)
  t.equal(e.status('a:1'), 'probe-due')
  e.probeStarted('a:1')
  clock.advance(300)
  e.timedOut('a:1')
  t.equal(e.status('a:1'), 'probing', 'the probe\'s attempt timed out: the probe is still out')
  t.equal(e.stats().probeFailures, 0)
  clock.advance(400)
  e.heardFrom('a:1')
  t.equal(e.status('a:1'), 'active', 'its late answer took it back')
  t.same(e.stats(), { ejections: 1, readmissions: 1, ejectionsRefused: 0, probeFailures: 0, ejected: 0, ejectedHosts: [] })
})

t.test('heardFrom takes back only a host being probed: it neither readmits an ejected host nor resets a count', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 2, baseEjectionMs: 500 })
  e.failed('a:1')
  e.heardFrom('a:1')
  e.failed('a:1')
  t.equal(e.status('a:1'), 'ejected', 'a late answer does not undo the failure before it')
  e.heardFrom('a:1')
  t.equal(e.status('a:1'), 'ejected', 'not before its probe')
  clock.advance(500)
  e.heardFrom('a:1')
  t.equal(e.status('a:1'), 'probe-due', 'nor while its probe is only due')
  e.heardFrom('nobody:1')
  t.equal(e.stats().readmissions, 0)
})

t.test('never every host: at most maxEjectedShare (rounded up), always one eligible', async t => {
  {
    const { e } = tracker({ consecutiveFailures: 1 })
    t.equal(e.maxEjected, 2, '3 hosts, share 0.5: 2')
    for (const h of HOSTS) e.failed(h)
    t.same(e.stats().ejectedHosts, ['a:1', 'b:1'])
    t.ok(e.eligible('c:1'), 'the last host stays in')
    t.equal(e.stats().ejectionsRefused, 1)
  }
  {
    const { e } = tracker({ consecutiveFailures: 1, maxEjectedShare: 1 })
    t.equal(e.maxEjected, 2, 'share 1 still leaves one')
  }
  {
    const { e } = tracker({ consecutiveFailures: 1 }, ['only:1'])
    t.equal(e.maxEjected, 0, 'a single host is never ejected')
    e.failed('only:1')
    t.ok(e.eligible('only:1'))
  }
  {
    const hosts = Array.from({ length: 10 }, (_, i) => `h${i}:1`)
    const { e } = tracker({ consecutiveFailures: 1, maxEjectedShare: 0.1 }, hosts)
    for (const h of hosts) e.failed(h)
    t.equal(e.stats().ejected, 1, 'a tenth of ten')
    t.equal(e.stats().ejectionsRefused, 9)
  }
})

t.test('a refused ejection happens on the next failure once there is room', async t => {
  const { e, clock } = tracker({ consecutiveFailures: 2, baseEjectionMs: 100 })
  fail(e, 'a:1', 2)
  fail(e, 'b:1', 2)
  fail(e, 'c:1', 2)
  t.equal(e.status('c:1'), 'active')
  clock.advance(100)
  e.status('a:1')
  e.probeStarted('a:1')
  e.succeeded('a:1')
  e.failed('c:1')
  t.equal(e.status('c:1'), 'ejected', 'room made by the readmission')
})

t.test('setHosts keeps the state of hosts kept and forgets the others', async t => {
  const { e } = tracker({ consecutiveFailures: 1 })
  e.failed('a:1')
  e.failed('b:1')
  e.setHosts(['a:1', 'c:1', 'd:1'])
  t.same(e.stats().ejectedHosts, ['a:1'])
  t.equal(e.ejectedCount, 1)
  t.equal(e.status('b:1'), 'active', 'an unknown host is active')
  e.failed('b:1')
  t.equal(e.stats().ejections, 2, 'unknown hosts are not tracked')
})

t.test('an unresponsive host (a liveness ping unanswered) is ejected at once, within the cap', async t => {
  const { e } = tracker({ consecutiveFailures: 5 })
  e.unresponsive('a:1')
  t.equal(e.status('a:1'), 'ejected')
  e.unresponsive('b:1')
  e.unresponsive('c:1')
  t.same(e.stats().ejectedHosts, ['a:1', 'b:1'], 'the cap holds')
  t.equal(e.stats().ejectionsRefused, 1)
  e.unresponsive('nobody:1')
  t.equal(e.stats().ejections, 2)
})

t.test('options are checked', async t => {
  const clock = new FakeClock()
  t.throws(() => new OutlierEjection(clock, { consecutiveFailures: 0 }), RangeError)
  t.throws(() => new OutlierEjection(clock, { consecutiveFailures: 1.5 }), RangeError)
  t.throws(() => new OutlierEjection(clock, { baseEjectionMs: 1000, maxEjectionMs: 10 }), RangeError)
  t.throws(() => new OutlierEjection(clock, { maxEjectedShare: 1.5 }), RangeError)
  t.throws(() => new OutlierEjection(clock, { probeTimeoutMs: -1 }), RangeError)
})
