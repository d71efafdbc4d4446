// DeadlineLists on a FakeClock: items sharing a timeout expire together, in
// arrival order, when their checkpoint's stamp passes; finished items do
// not; odd timeouts get a timer of their own; close() stops the lists.
import t from 'tap'
import { FakeClock } from '../../scheduling/clock.js'
import { DeadlineLists, NO_DEADLINE, type Expiring, type Stamp } from '../../scheduling/deadline-lists.js'
import type { TimerHandle } from '../../scheduling/clock.js'

class Item implements Expiring<Item> {
  stamp: Stamp<Item> = NO_DEADLINE as Stamp<Item>
  timer: TimerHandle | null = null
  done = false
  readonly name: string
  constructor (name: string) {
    this.name = name
  }
}

function setup (): { clock: FakeClock, lists: DeadlineLists<Item>, expired: string[] } {
  const clock = new FakeClock()
  const expired: string[] = []
  const lists = new DeadlineLists<Item>(clock, (item, timeoutMs) => expired.push(`${item.name}@${timeoutMs}`), (item) => item.done)
  return { clock, lists, expired }
}

t.test('items with one timeout expire together at their deadline, in arrival order; left and finished ones do not', async (t) => {
  const { clock, lists, expired } = setup()
  const items = ['a', 'b', 'c', 'd'].map((name) => new Item(name))
  for (const item of items) lists.arm(item, 100)
  await Promise.resolve()
  // A finished item leaves its list (it is no longer counted there); one finished without leaving is skipped too.
  items[1]!.done = true
  lists.leave(items[1]!)
  items[2]!.done = true
  clock.advance(99)
  t.same(expired, [], 'not before the deadline')
  clock.advance(1)
  t.same(expired, ['a@100', 'd@100'])
})

t.test('a later checkpoint\'s items expire at their own, later deadline', async (t) => {
  const { clock, lists, expired } = setup()
  lists.arm(new Item('early'), 50)
  await Promise.resolve()
  clock.advance(20)
  lists.arm(new Item('late'), 50)
  await Promise.resolve()
  clock.advance(30)
  t.same(expired, ['early@50'])
  clock.advance(20)
  t.same(expired, ['early@50', 'late@50'])
})

t.test('a fractional timeout gets a timer of its own; close() stops the lists\' timers', async (t) => {
  const { clock, lists, expired } = setup()
  const odd = new Item('odd')
  lists.arm(odd, 12.5)
  t.not(odd.timer, null, 'its own timer')
  clock.advance(13)
  t.same(expired, ['odd@12.5'])
  lists.arm(new Item('x'), 10)
  await Promise.resolve()
  lists.close()
  clock.advance(1000)
  t.same(expired, ['odd@12.5'], 'nothing fires after close')
})
