// InboundBudget: the sum of bytes held in incomplete frames stays within the
// budget; past it the member that received the most of its frame is closed.
import t from 'tap'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { InboundBudget } from '../../transport/inbound-budget.js'

class Member {
  partialFrameBytes = 0
  closedWith: RpcError | undefined
  closed = false
  destroy (error?: RpcError): void {
    this.closed = true
    this.closedWith = error
  }
}

t.test('members within the budget are kept; past it the one that received most is closed, repeatedly until it fits', async (t) => {
  const closed: number[] = []
  const budget = new InboundBudget(1000, (_m, received) => closed.push(received))
  const a = new Member()
  const b = new Member()
  const c = new Member()
  a.partialFrameBytes = 300
  budget.update(a, 400)
  b.partialFrameBytes = 100
  budget.update(b, 400)
  t.equal(budget.totalBytes, 800)
  t.notOk(a.closed || b.closed)
  c.partialFrameBytes = 150
  budget.update(c, 300)
  t.ok(a.closed, 'a received the most (300) and is closed')
  t.equal(a.closedWith?.code, ErrorCode.FRAME_TOO_LARGE)
  t.notOk(b.closed)
  t.notOk(c.closed, 'the newcomer that passed the budget is kept')
  t.equal(budget.totalBytes, 700)
  t.same(closed, [300])
  t.equal(budget.closedConnections, 1)
  // One member growing past the budget on its own closes it.
  c.partialFrameBytes = 900
  budget.update(c, 1200)
  t.ok(c.closed)
  t.equal(budget.totalBytes, 400)
  // A member that completed its frame (0) or closed is no longer counted.
  budget.update(b, 0)
  t.equal(budget.totalBytes, 0)
})
