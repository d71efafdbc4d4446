// OutboundBudget: while the unsent bytes of backed-up connections pass the
// budget, the heaviest stop being read until those left reading hold at most
// half of it; all read again once the sum is below the budget.
import t from 'tap'
import { FakeClock } from '../../scheduling/clock.js'
import { OUTBOUND_CHECK_MS, OutboundBudget } from '../../reactor/outbound-budget.js'

class Member {
  outboundBytes = 0
  isBackedUp = true
  isClosed = false
  isReadingPaused = false
  pauses = 0
  pauseReading (): void { this.isReadingPaused = true; this.pauses++ }
  resumeReading (): void { this.isReadingPaused = false }
}

t.test('pauses the heaviest, keeps checking while any is backed up, resumes below the budget', async (t) => {
  const clock = new FakeClock()
  const budget = new OutboundBudget(1000, clock)
  const [a, b, c] = [new Member(), new Member(), new Member()]
  a.outboundBytes = 600
  budget.watch(a)
  t.notOk(a.isReadingPaused, 'within the budget')
  b.outboundBytes = 300
  budget.watch(b)
  c.outboundBytes = 50
  budget.watch(c)
  t.notOk(a.isReadingPaused)
  // Growth between checks is seen by the timer.
  a.outboundBytes = 800
  clock.advance(OUTBOUND_CHECK_MS)
  t.ok(a.isReadingPaused, 'the heaviest is paused')
  t.notOk(b.isReadingPaused, 'those left reading hold 350, under half the budget')
  t.notOk(c.isReadingPaused)
  t.equal(budget.pauses, 1)
  b.outboundBytes = 700
  clock.advance(OUTBOUND_CHECK_MS)
  t.ok(b.isReadingPaused, 'the next heaviest too, once the reading ones hold more than half')
  t.notOk(c.isReadingPaused)
  // The peers read: below the budget, everyone reads again.
  a.outboundBytes = 100
  b.outboundBytes = 100
  clock.advance(OUTBOUND_CHECK_MS)
  t.notOk(a.isReadingPaused)
  t.notOk(b.isReadingPaused)
  // Drained and closed members are forgotten; the timer stops with the last one.
  for (const m of [a, b, c]) m.isBackedUp = false
  clock.advance(OUTBOUND_CHECK_MS)
  t.equal(clock.pendingTimers, 0, 'no timer once nothing is backed up')
  budget.stop()
})
