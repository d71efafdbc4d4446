/**
 * The liveness check of a client connection on a FakeClock: silence while
 * calls wait sends one ping, any frame read clears it, silence past the
 * ping's timeout declares the connection dead, and an idle connection is
 * never pinged. No timer outlives the check.
 */
import t from 'tap'
import { FakeClock } from '../../scheduling/clock.js'
import { ConnectionLiveness } from '../../reactor/connection-liveness.js'

function check (options = { pingAfterMs: 200, pingTimeoutMs: 300 }): { l: ConnectionLiveness, clock: FakeClock, events: string[] } {
  const clock = new FakeClock(0)
  const events: string[] = []
  const l = new ConnectionLiveness(clock, options, {
    ping: () => events.push(`ping@${clock.now()}`),
    dead: (silent) => events.push(`dead@${clock.now()} silent ${silent}`)
  })
  return { l, clock, events }
}

t.test('an idle connection is never pinged', async t => {
  const { clock, events } = check()
  clock.advance(10_000)
  t.same(events, [])
  t.equal(clock.pendingTimers, 0)
})

t.test('silence while a call waits: a ping, then dead after the ping timeout', async t => {
  const { l, clock, events } = check()
  clock.advance(1000)
  l.waiting(1)
  clock.advance(199)
  t.same(events, [], 'silence is counted from when the call started waiting')
  clock.advance(1)
  t.same(events, ['ping@1200'])
  clock.advance(299)
  t.same(events, ['ping@1200'])
  clock.advance(1)
  t.same(events, ['ping@1200', 'dead@1500 silent 500'])
  t.equal(l.pings, 1)
  t.equal(clock.pendingTimers, 0)
  l.waiting(0)
  l.waiting(3)
  clock.advance(5000)
  t.equal(events.length, 2, 'dead once')
})

t.test('any frame read is a sign of life: the ping answered, or answers that keep coming', async t => {
  const { l, clock, events } = check()
  l.waiting(5)
  for (let i = 0; i < 20; i++) { clock.advance(150); l.heard() }
  t.same(events, [], 'answers every 150 ms: no ping')
  clock.advance(200)
  t.same(events, ['ping@3200'])
  clock.advance(100)
  l.heard()
  clock.advance(300)
  t.same(events, ['ping@3200', 'ping@3500'], 'the answer cleared it; a new silence pings again')
  l.heard()
  l.waiting(0)
  clock.advance(10_000)
  t.equal(events.length, 2, 'nothing waits: no more pings')
})

t.test('close() clears the timer', async t => {
  const { l, clock, events } = check()
  l.waiting(1)
  t.equal(clock.pendingTimers, 1)
  l.close()
  t.equal(clock.pendingTimers, 0)
  clock.advance(10_000)
  t.same(events, [])
})

t.test('options are checked', async t => {
  t.throws(() => new ConnectionLiveness(new FakeClock(), { pingAfterMs: 0 }, { ping: () => {}, dead: () => {} }), RangeError)
  t.throws(() => new ConnectionLiveness(new FakeClock(), { pingTimeoutMs: -5 }, { ping: () => {}, dead: () => {} }), RangeError)
})
