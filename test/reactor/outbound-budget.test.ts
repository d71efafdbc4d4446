// OutboundBudget: while the unsent bytes of backed-up connections pass the
// budget, none of them is read; a drained one reads again, and all do once
// the sum is below the budget.
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
  t.ok(a.isReadingPaused, 'over the budget: every backed-up connection stops being read')
  t.ok(b.isReadingPaused)
  t.ok(c.isReadingPaused)
  t.equal(budget.pauses, 3)
  // One drains (its peer read everything it was owed): it reads again though the rest stay over.
  c.isBackedUp = false
  clock.advance(OUTBOUND_CHECK_MS)
  t.notOk(c.isReadingPaused, 'a drained connection reads again')
  t.ok(a.isReadingPaused)
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

t.test('a connection resumed by a check that backs up again at once (it decodes what it read already) stays watched, and reads again once it drains', async (t) => {
  const clock = new FakeClock()
  const budget = new OutboundBudget(1000, clock)
  const a = new Member()
  // Reading again decodes the rest of a read at once: its answers back it up past the budget before resumeReading returns.
  let decodeOnResume = true
  a.resumeReading = () => {
    a.isReadingPaused = false
    if (!decodeOnResume) return
    decodeOnResume = false
    a.isBackedUp = true
    a.outboundBytes = 2000
    budget.watch(a)
  }
  a.outboundBytes = 2000
  budget.watch(a)
  t.ok(a.isReadingPaused, 'over the budget')
  // Its peer read everything: the check resumes it, and the rest it decodes backs it up again.
  a.isBackedUp = false
  a.outboundBytes = 0
  clock.advance(OUTBOUND_CHECK_MS)
  t.ok(a.isReadingPaused, 'paused again: over the budget once more')
  t.equal(a.pauses, 2)
  t.equal(clock.pendingTimers, 1, 'still checked')
  // It drains again: the next check resumes it.
  a.isBackedUp = false
  a.outboundBytes = 0
  clock.advance(OUTBOUND_CHECK_MS)
  t.notOk(a.isReadingPaused, 'read again once drained')
  t.equal(clock.pendingTimers, 0)
  budget.stop()
})
