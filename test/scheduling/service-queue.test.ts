/**
 * DeadlineQueue: EDF order with arrival-order ties, Infinity deadlines,
 * eviction of the true latest deadline when full (checked against a sorted
 * array model over random operation sequences), FIFO refusal, expiry and
 * drain, maxLength 0.
 */
import t from 'tap'
import fc from 'fast-check'
import { DeadlineQueue, type QueueDiscipline } from '../../scheduling/service-queue.js'

interface Item { id: number, deadline: number }

let nextId = 0
function item (deadline: number): Item {
  return { id: nextId++, deadline }
}

function ids (items: Array<Item | undefined>): Array<number | undefined> {
  return items.map(i => i?.id)
}

function fill (queue: DeadlineQueue<Item>, deadlines: number[]): Item[] {
  return deadlines.map(d => {
    const it = item(d)
    const dropped = queue.put(it)
    if (dropped !== undefined) throw new Error('fill overflowed')
    return it
  })
}

t.test('edf: take returns the earliest deadline; ties and Infinity leave in arrival order', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 16, discipline: 'edf' })
  const [a, b, c, d, e, f, g] = fill(queue, [30, Infinity, 10, 30, Infinity, 20, 10])
  t.equal(queue.length, 7)
  t.equal(queue.earliestDeadline(), 10)
  t.equal(queue.peek(), c, 'peek is the next take')
  t.same(ids(queue.drain()), ids([c, g, f, a, d, b, e]))
  t.equal(queue.length, 0)
  t.equal(queue.take(), undefined)
  t.equal(queue.peek(), undefined)
  t.equal(queue.earliestDeadline(), Infinity, 'empty')
})

t.test('edf: items without deadlines are first come, first served', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 100, discipline: 'edf' })
  const items = fill(queue, Array.from({ length: 50 }, () => Infinity))
  t.equal(queue.earliestDeadline(), Infinity)
  const out: Item[] = []
  for (let it = queue.take(); it !== undefined; it = queue.take()) out.push(it)
  t.same(ids(out), ids(items))
})

t.test('edf: NaN counts as no deadline', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 4, discipline: 'edf' })
  const [nan, inf, five] = fill(queue, [NaN, Infinity, 5])
  t.same(ids(queue.drain()), ids([five, nan, inf]))
})

t.test('edf full: a strictly earlier newcomer evicts the latest deadline', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 3, discipline: 'edf' })
  const [, late] = fill(queue, [10, 50, 20])
  const early = item(15)
  t.equal(queue.put(early), late, 'the evicted item is returned')
  t.equal(queue.length, 3)
  const later = item(60)
  t.equal(queue.put(later), later, 'a later newcomer is refused')
  const same = item(20)
  t.equal(queue.put(same), same, 'a newcomer tied with the latest is refused (it arrived last)')
  t.same(queue.drain().map(i => i.deadline), [10, 15, 20])
})

t.test('edf full: among tied latest deadlines the latest-arrived is evicted', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 4, discipline: 'edf' })
  const [first, second, third, fourth] = fill(queue, [Infinity, 5, Infinity, Infinity])
  t.equal(queue.put(item(100)), fourth)
  t.equal(queue.put(item(100)), third)
  t.equal(queue.put(item(100)), first)
  const last = item(100)
  t.equal(queue.put(last), last, 'now a tie with the latest: refused')
  t.equal(queue.peek(), second)
})

t.test('edf full: the true latest is evicted, not the last heap slot', async t => {
  // As a binary min-heap these sit as [1, 100, 2]: the last slot (2) is a
  // leaf but not the latest. Comparing with it would refuse 50.
  const queue = new DeadlineQueue<Item>({ maxLength: 3, discipline: 'edf' })
  const [, hundred] = fill(queue, [1, 100, 2])
  const fifty = item(50)
  t.equal(queue.put(fifty), hundred)
  t.same(queue.drain().map(i => i.deadline), [1, 2, 50])

  // Deeper: many levels, the maximum buried away from the end of the array.
  const deep = new DeadlineQueue<Item>({ maxLength: 15, discipline: 'edf' })
  const items = fill(deep, [1, 1000, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
  const fiveHundred = item(500)
  t.equal(deep.put(fiveHundred), items[1])
  const fourNinetyNine = item(499)
  t.equal(deep.put(fourNinetyNine), fiveHundred, 'an earlier admitted newcomer can itself become the latest')
  t.equal(deep.put(item(15)), fourNinetyNine)
  t.same(deep.drain().map(i => i.deadline), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
})

t.test('edf: takeExpired removes exactly the deadlines <= now, in take order', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 10, discipline: 'edf' })
  const [a, b, c, d, e] = fill(queue, [30, 10, Infinity, 20, 10])
  t.same(queue.takeExpired(5), [])
  t.same(ids(queue.takeExpired(20)), ids([b, e, d]))
  t.equal(queue.earliestDeadline(), 30)
  t.same(ids(queue.takeExpired(29.5)), [])
  t.same(ids(queue.drain()), ids([a, c]))
})

t.test('fifo: arrival order regardless of deadline; a full queue refuses the newcomer', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 3, discipline: 'fifo' })
  t.equal(queue.discipline, 'fifo')
  const [a, b, c] = fill(queue, [30, Infinity, 10])
  t.equal(queue.earliestDeadline(), 10)
  t.equal(queue.peek(), a)
  const early = item(1)
  t.equal(queue.put(early), early, 'no eviction, even for an earlier deadline')
  t.equal(queue.take(), a)
  t.equal(queue.earliestDeadline(), 10)
  t.equal(queue.put(early), undefined, 'room again')
  t.equal(queue.earliestDeadline(), 1)
  t.same(ids(queue.drain()), ids([b, c, early]))
  t.equal(queue.earliestDeadline(), Infinity)
})

t.test('fifo: takeExpired removes expired items from anywhere, keeping the rest in order', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 10, discipline: 'fifo' })
  const [a, b, c, d, e] = fill(queue, [30, 10, Infinity, 20, 5])
  t.same(queue.takeExpired(4), [])
  t.same(ids(queue.takeExpired(20)), ids([b, d, e]), 'in arrival (take) order')
  t.equal(queue.length, 2)
  t.equal(queue.earliestDeadline(), 30)
  const f = item(25)
  queue.put(f)
  t.equal(queue.earliestDeadline(), 25)
  t.same(ids(queue.drain()), ids([a, c, f]))
})

t.test('maxLength 0 refuses every put', async t => {
  for (const discipline of ['edf', 'fifo'] as const) {
    const queue = new DeadlineQueue<Item>({ maxLength: 0, discipline })
    t.equal(queue.maxLength, 0)
    for (const deadline of [1, 100, Infinity]) {
      const it = item(deadline)
      t.equal(queue.put(it), it, `${discipline}: refused deadline ${deadline}`)
    }
    t.equal(queue.length, 0)
    t.equal(queue.take(), undefined)
    t.same(queue.drain(), [])
    t.same(queue.takeExpired(Infinity), [])
  }
})

t.test('options are validated', async t => {
  for (const maxLength of [-1, 1.5, NaN, Infinity]) {
    t.throws(() => new DeadlineQueue<Item>({ maxLength, discipline: 'edf' }), RangeError, `maxLength ${maxLength}`)
  }
  t.throws(() => new DeadlineQueue<Item>({ maxLength: 1, discipline: 'lifo' as QueueDiscipline }), RangeError)
})

/**
 * The reference model: a plain array kept sorted in take order; when full,
 * edf evicts the array's last item if the newcomer ranks before it.
 */
class ModelQueue {
  items: Array<{ item: Item, seq: number }> = []
  seq = 0
  readonly maxLength: number
  readonly discipline: QueueDiscipline

  constructor (maxLength: number, discipline: QueueDiscipline) {
    this.maxLength = maxLength
    this.discipline = discipline
  }

  #sort (): void {
    if (this.discipline === 'edf') this.items.sort((x, y) => (x.item.deadline - y.item.deadline) || (x.seq - y.seq))
  }

  put (it: Item): Item | undefined {
    const entry = { item: it, seq: this.seq++ }
    if (this.items.length < this.maxLength) {
      this.items.push(entry)
      this.#sort()
      return undefined
    }
    const last = this.items[this.items.length - 1]
    if (this.discipline === 'fifo' || last === undefined || !(it.deadline < last.item.deadline)) return it
    this.items.pop()
    this.items.push(entry)
    this.#sort()
    return last.item
  }

  take (): Item | undefined {
    return this.items.shift()?.item
  }

  takeExpired (now: number): Item[] {
    const out = this.items.filter(e => e.item.deadline <= now).map(e => e.item)
    this.items = this.items.filter(e => e.item.deadline > now)
    return out
  }

  earliest (): number {
    return Math.min(Infinity, ...this.items.map(e => e.item.deadline))
  }
}

type Op =
  | { op: 'put', deadline: number }
  | { op: 'take' }
  | { op: 'expire', now: number }

// Few distinct deadlines, so ties (and ties at the maximum) are common.
const deadlineArb = fc.oneof(
  { weight: 6, arbitrary: fc.integer({ min: 0, max: 12 }) },
  { weight: 1, arbitrary: fc.constant(Infinity) }
)
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 8, arbitrary: deadlineArb.map(deadline => ({ op: 'put' as const, deadline })) },
  { weight: 3, arbitrary: fc.constant({ op: 'take' as const }) },
  { weight: 1, arbitrary: fc.integer({ min: -1, max: 12 }).map(now => ({ op: 'expire' as const, now })) }
)

for (const discipline of ['edf', 'fifo'] as const) {
  t.test(`${discipline}: random operation sequences match the sorted-array model`, async t => {
    fc.assert(fc.property(fc.integer({ min: 0, max: 40 }), fc.array(opArb, { maxLength: 300, size: 'max' }), (maxLength, ops) => {
      const queue = new DeadlineQueue<Item>({ maxLength, discipline })
      const model = new ModelQueue(maxLength, discipline)
      for (const op of ops) {
        if (op.op === 'put') {
          const it = item(op.deadline)
          const got = queue.put(it)
          const want = model.put(it)
          if (got !== want) throw new Error(`put ${op.deadline}: got ${got?.id}, want ${want?.id}`)
        } else if (op.op === 'take') {
          const want = model.items[0]?.item
          if (queue.peek() !== want) throw new Error('peek differs from the model')
          if (queue.take() !== model.take()) throw new Error('take differs from the model')
        } else {
          const got = queue.takeExpired(op.now)
          const want = model.takeExpired(op.now)
          if (got.length !== want.length || got.some((it, i) => it !== want[i])) throw new Error(`takeExpired(${op.now}) differs from the model`)
        }
        if (queue.length !== model.items.length) throw new Error('length differs from the model')
        if (queue.earliestDeadline() !== model.earliest()) throw new Error('earliestDeadline differs from the model')
      }
      const rest = queue.drain()
      if (rest.length !== model.items.length || rest.some((it, i) => it !== model.items[i]!.item)) {
        throw new Error('drain differs from the model')
      }
    }), { numRuns: 500 })
    t.pass('500 random sequences agree with the model')
  })
}

t.test('edf: a large random load comes out sorted, ties in arrival order', async t => {
  const queue = new DeadlineQueue<Item>({ maxLength: 20000, discipline: 'edf' })
  const items: Item[] = []
  // A fixed linear congruential sequence: reproducible, no Math.random.
  let x = 12345
  for (let i = 0; i < 20000; i++) {
    x = (x * 1103515245 + 12345) % 2147483648
    items.push(item(x % 1000))
  }
  for (const it of items) queue.put(it)
  const want = items.map((it, seq) => ({ it, seq })).sort((a, b) => (a.it.deadline - b.it.deadline) || (a.seq - b.seq)).map(e => e.it)
  const got = queue.drain()
  t.equal(got.length, want.length)
  t.ok(got.every((it, i) => it === want[i]), 'same order as a stable sort by deadline')
})
