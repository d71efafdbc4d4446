/**
 * TokenBroker on a FakeClock: the primary's half of the scheduler shared by
 * several reactors. Grants from free tokens, EDF order and latest-deadline
 * eviction across reactors, expiry in the queue, recall and calm, and what
 * a reactor that leaves takes with it: every other reactor's entry is still
 * granted or refused, and the tokens always add up.
 */
import t from 'tap'
import fc from 'fast-check'
import { FakeClock } from '../../scheduling/clock.js'
import { TokenBroker, type BrokerRefusal } from '../../scheduling/token-broker.js'

type Said = ['grant', number, number] | ['refuse', number, number, BrokerRefusal] | ['recall', number] | ['calm', number] | ['lend', number, number]

function harness (discipline: 'edf' | 'fifo' = 'edf') {
  const clock = new FakeClock(1000)
  const said: Said[] = []
  const broker = new TokenBroker({
    discipline,
    clock,
    output: {
      grant: (r, id) => said.push(['grant', r, id]),
      refuse: (r, id, reason) => said.push(['refuse', r, id, reason]),
      recall: (r) => said.push(['recall', r]),
      calm: (r) => said.push(['calm', r]),
      lend: (r, n) => said.push(['lend', r, n])
    }
  })
  const take = (): Said[] => said.splice(0)
  return { clock, broker, take }
}

const A = 1
const B = 2

t.test('members pool their workers and queue lengths; each holds its own workers at first', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 3, 10)
  broker.join(B, 3, 10)
  t.equal(broker.workers, 6)
  t.equal(broker.maxQueueLength, 20)
  t.equal(broker.free, 0)
  t.equal(broker.held(A), 3)
  t.same(take(), [], 'joining says nothing')
})

t.test('a want with a free token is granted at once, without recalling anyone', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 2, 5)
  broker.join(B, 2, 5)
  broker.give(B, 1)
  broker.want(A, 7, 5000)
  t.same(take(), [['grant', A, 7]])
  t.equal(broker.held(A), 3)
  t.equal(broker.held(B), 1)
  t.equal(broker.stats.grantedFree, 1)
})

t.test('a token given back goes to the earliest deadline queued, whichever reactor owns it', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 1, 5)
  broker.join(B, 1, 5)
  broker.want(B, 1, 1500)
  t.same(take(), [['recall', A], ['recall', B]], 'an entry waits: every reactor is recalled once')
  broker.want(B, 2, 1300)
  broker.want(A, 3, 1100)
  t.same(take(), [], 'recalled once only')
  broker.give(B, 1)
  t.same(take(), [['grant', A, 3]], "B's token runs A's earlier call")
  broker.give(A, 1)
  t.same(take(), [['grant', B, 2]])
  broker.give(A, 1)
  t.same(take(), [['grant', B, 1], ['calm', A], ['calm', B]], 'the queue empties: everyone keeps tokens again')
  t.equal(broker.free, 0)
  t.equal(broker.held(A) + broker.held(B), 2)
})

t.test('when the queue empties, free tokens are lent back to the reactors that hold fewer than they brought', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 2, 5)
  broker.join(B, 2, 5)
  broker.want(B, 1, 1500)
  take()
  broker.give(A, 2) // A's idle tokens, recalled
  t.same(take(), [['grant', B, 1], ['calm', A], ['calm', B], ['lend', A, 1]])
  t.equal(broker.free, 0)
  t.equal(broker.held(A), 1)
  t.equal(broker.held(B), 3)
  broker.give(B, 1) // no calm happened: nothing is lent, the token stays free
  t.same(take(), [])
  t.equal(broker.free, 1)
  t.equal(broker.stats.lent, 1)
})

t.test('full: the latest deadline anywhere is refused, evicting a queued entry of another reactor', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 1, 1)
  broker.join(B, 1, 1)
  broker.want(B, 1, 1500)
  broker.want(B, 2, 1400)
  take()
  broker.want(A, 3, 1100)
  t.same(take(), [['refuse', B, 1, 'evicted']], "A's earlier call evicts B's latest")
  broker.want(A, 4, 1900)
  t.same(take(), [['refuse', A, 4, 'full']], 'a newcomer later than all is refused')
  broker.want(A, 5, 1400)
  t.same(take(), [['refuse', A, 5, 'full']], 'a tie is refused: the queued entry came first')
  const s = broker.stats
  t.equal(s.evictions, 1)
  t.equal(s.overflows, 2)
})

t.test('fifo: a full queue refuses the newcomer whatever its deadline', async (t) => {
  const { broker, take } = harness('fifo')
  broker.join(A, 1, 1)
  broker.want(A, 1, 1500)
  take()
  broker.want(A, 2, 1100)
  t.same(take(), [['refuse', A, 2, 'full']])
})

t.test('an entry whose deadline passes in the queue is refused expired by the timer; a dead want at once', async (t) => {
  const { clock, broker, take } = harness()
  broker.join(A, 1, 5)
  broker.join(B, 1, 5)
  broker.want(A, 1, 1200)
  broker.want(B, 2, 1500)
  take()
  clock.advance(250)
  t.same(take(), [['refuse', A, 1, 'expired']])
  clock.advance(300)
  t.same(take(), [['refuse', B, 2, 'expired'], ['calm', A], ['calm', B]])
  broker.want(A, 3, 1000)
  t.same(take(), [['refuse', A, 3, 'expired']])
  t.equal(broker.stats.expired, 3)
  t.equal(clock.pendingTimers, 0, 'no timer left behind')
})

t.test('a reactor that leaves takes its tokens and entries; the others are still granted', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 2, 5)
  broker.join(B, 2, 5)
  broker.want(A, 1, 1100)
  broker.want(B, 2, 1200)
  broker.want(A, 3, 1300)
  take()
  broker.give(B, 1) // B frees a token: A's earliest gets it
  t.same(take(), [['grant', A, 1]])
  t.equal(broker.held(B), 1)
  broker.leave(B)
  t.equal(broker.workers, 2)
  t.equal(broker.maxQueueLength, 5)
  t.equal(broker.queueLength, 1, "B's entry went with it")
  t.equal(broker.stats.orphaned, 1)
  // A holds 3 of 2 workers: the first token back pays the debt.
  t.equal(broker.free, -1)
  broker.give(A, 1)
  t.same(take(), [], 'not granted: A still holds every worker there is')
  broker.give(A, 1)
  t.same(take(), [['grant', A, 3], ['calm', A]])
  t.equal(broker.held(A), 2)
})

t.test('a member joining while entries wait is recalled; a bound that shrinks evicts the latest', async (t) => {
  const { broker, take } = harness()
  broker.join(A, 1, 2)
  broker.join(B, 0, 2)
  broker.want(A, 1, 1100)
  broker.want(A, 2, 1200)
  broker.want(A, 3, 1300)
  take()
  broker.join(3, 1, 0)
  t.same(take(), [['recall', 3]])
  broker.leave(B)
  t.same(take(), [['refuse', A, 3, 'evicted']], 'the bound fell to 2')
})

t.test('any sequence: tokens add up, and every want of a member still there is answered once', async (t) => {
  fc.assert(fc.property(fc.array(fc.tuple(fc.integer({ min: 0, max: 5 }), fc.integer({ min: 1, max: 3 }), fc.integer({ min: 0, max: 400 })), { maxLength: 80 }), (ops) => {
    const { clock, broker, take } = harness()
    const members = new Set<number>()
    const open = new Map<string, number>() // reactor:id -> reactor
    const holding = new Map<number, number>()
    let id = 0
    const absorb = (): void => {
      for (const s of take()) {
        if (s[0] === 'grant') {
          if (!open.delete(`${s[1]}:${s[2]}`)) throw new Error(`grant of an unknown entry ${s[1]}:${s[2]}`)
          holding.set(s[1], (holding.get(s[1]) ?? 0) + 1)
        } else if (s[0] === 'lend') {
          holding.set(s[1], (holding.get(s[1]) ?? 0) + s[2])
        } else if (s[0] === 'refuse') {
          if (!open.delete(`${s[1]}:${s[2]}`)) throw new Error(`refusal of an unknown entry ${s[1]}:${s[2]}`)
        }
      }
    }
    for (const [op, reactor, x] of ops) {
      if (op === 0 && !members.has(reactor)) { members.add(reactor); broker.join(reactor, 2, 2); holding.set(reactor, 2) }
      if (op === 1 && members.has(reactor)) { open.set(`${reactor}:${id}`, reactor); broker.want(reactor, id++, clock.now() + x) }
      if (op === 2 && members.has(reactor) && (holding.get(reactor) ?? 0) > 0) { holding.set(reactor, holding.get(reactor)! - 1); broker.give(reactor, 1) }
      if (op === 3 && members.has(reactor)) {
        members.delete(reactor)
        holding.delete(reactor)
        broker.leave(reactor)
        for (const [key, owner] of open) if (owner === reactor) open.delete(key)
      }
      if (op === 4) clock.advance(x)
      absorb()
      let held = 0
      for (const m of members) { if (broker.held(m) !== (holding.get(m) ?? 0)) throw new Error('held differs'); held += broker.held(m) }
      if (broker.free + held !== broker.workers) throw new Error(`tokens do not add up: ${broker.free} + ${held} != ${broker.workers}`)
      if (broker.free > 0 && broker.queueLength > 0) throw new Error('a free token beside a queued entry')
    }
    // Give every token back and let time pass: nothing is left waiting.
    for (const m of members) { const h = holding.get(m) ?? 0; if (h > 0) broker.give(m, h); holding.set(m, 0) }
    absorb()
    for (const m of members) { const h = holding.get(m) ?? 0; if (h > 0) broker.give(m, h); holding.set(m, 0) }
    clock.advance(1000)
    absorb()
    if (open.size !== 0) throw new Error(`${open.size} wants never answered`)
  }), { numRuns: 300 })
  t.pass('held for 300 random sequences')
})
