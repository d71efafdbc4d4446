/**
 * FakeClock: timers fire in due order (then creation order) at their due
 * time, clearTimer cancels, deferred callbacks run when asked and after each
 * timer. realClock is checked only through events, never durations.
 */
import t from 'tap'
import { FakeClock, realClock, type TimerHandle } from '../../scheduling/clock.js'

t.test('now() starts where asked and moves only by advance()', async t => {
  t.equal(new FakeClock().now(), 1000, 'default start')
  const clock = new FakeClock(0)
  t.equal(clock.now(), 0)
  clock.advance(25)
  t.equal(clock.now(), 25)
  clock.advance(0.5)
  t.equal(clock.now(), 25.5, 'fractional milliseconds')
  clock.advance(0)
  t.equal(clock.now(), 25.5)
})

t.test('timers fire in due order, then creation order, each at its due time', async t => {
  const clock = new FakeClock(100)
  const fired: Array<[string, number]> = []
  const at = (name: string) => () => { fired.push([name, clock.now()]) }
  clock.setTimer(at('c30'), 30)
  clock.setTimer(at('a10'), 10)
  clock.setTimer(at('b20'), 20)
  clock.setTimer(at('a10-second'), 10)
  clock.setTimer(at('late'), 60)
  t.equal(clock.pendingTimers, 5)
  clock.advance(9)
  t.same(fired, [], 'nothing is due yet')
  clock.advance(41)
  t.same(fired, [['a10', 110], ['a10-second', 110], ['b20', 120], ['c30', 130]])
  t.equal(clock.now(), 150, 'advance ends at its target')
  t.equal(clock.pendingTimers, 1)
  clock.advance(10)
  t.same(fired[4], ['late', 160], 'a timer due exactly at the target fires')
  t.equal(clock.pendingTimers, 0)
})

t.test('timers set by a timer', async t => {
  const clock = new FakeClock(0)
  const fired: Array<[string, number]> = []
  clock.setTimer(() => {
    fired.push(['outer', clock.now()])
    clock.setTimer(() => { fired.push(['zero', clock.now()]) }, 0)
    clock.setTimer(() => { fired.push(['five', clock.now()]) }, 5)
    clock.setTimer(() => { fired.push(['beyond', clock.now()]) }, 100)
  }, 10)
  clock.setTimer(() => { fired.push(['twelve', clock.now()]) }, 12)
  clock.advance(20)
  t.same(fired, [['outer', 10], ['zero', 10], ['twelve', 12], ['five', 15]], 'new timers join the order by due time')
  t.equal(clock.pendingTimers, 1, 'the one due after the target waits')
  clock.advance(90)
  t.same(fired[4], ['beyond', 110])
})

t.test('a negative or zero delay fires on the next advance, even advance(0)', async t => {
  const clock = new FakeClock(0)
  const fired: string[] = []
  clock.setTimer(() => { fired.push('negative') }, -50)
  clock.setTimer(() => { fired.push('zero') }, 0)
  t.same(fired, [], 'never synchronously')
  clock.advance(0)
  t.same(fired, ['negative', 'zero'])
  t.equal(clock.now(), 0)
})

t.test('clearTimer', async t => {
  const clock = new FakeClock(0)
  const fired: string[] = []
  const a = clock.setTimer(() => { fired.push('a') }, 10)
  const b = clock.setTimer(() => { fired.push('b') }, 10)
  let c: TimerHandle | undefined
  clock.setTimer(() => { fired.push('first'); if (c !== undefined) clock.clearTimer(c) }, 5)
  c = clock.setTimer(() => { fired.push('c') }, 5)
  clock.clearTimer(a)
  t.equal(clock.pendingTimers, 3)
  clock.advance(20)
  t.same(fired, ['first', 'b'], 'a cleared before, c cleared by an earlier timer due at the same time')
  clock.clearTimer(a)
  clock.clearTimer(b)
  t.equal(clock.pendingTimers, 0, 'clearing again, or after firing, is harmless')
  const self: { handle?: TimerHandle } = {}
  self.handle = clock.setTimer(() => { fired.push('self'); clock.clearTimer(self.handle!) }, 1)
  clock.advance(1)
  t.same(fired, ['first', 'b', 'self'], 'a timer may clear itself while firing')
})

t.test('defer and runDeferred', async t => {
  const clock = new FakeClock(0)
  const ran: string[] = []
  clock.defer(() => {
    ran.push('one')
    clock.defer(() => { ran.push('nested') })
  })
  clock.defer(() => { ran.push('two') })
  t.same(ran, [], 'deferred callbacks wait')
  clock.runDeferred()
  t.same(ran, ['one', 'two', 'nested'], 'in order, including callbacks they queue')
  clock.runDeferred()
  t.same(ran, ['one', 'two', 'nested'], 'each runs once')
})

t.test('advance runs deferred callbacks after each timer, before the next', async t => {
  const clock = new FakeClock(0)
  const log: string[] = []
  clock.setTimer(() => {
    log.push(`timer A at ${clock.now()}`)
    clock.defer(() => { log.push(`deferred by A at ${clock.now()}`) })
  }, 10)
  clock.setTimer(() => { log.push(`timer B at ${clock.now()}`) }, 10)
  clock.defer(() => { log.push(`deferred before at ${clock.now()}`) })
  clock.advance(10)
  t.same(log, ['timer A at 10', 'deferred before at 10', 'deferred by A at 10', 'timer B at 10'],
    'every deferred callback, oldest first, runs after timer A and before timer B')

  // The late-timer pattern: a response deferred before a timeout is processed first.
  const order: string[] = []
  clock.setTimer(() => { clock.defer(() => { order.push('timeout handler') }) }, 5)
  clock.defer(() => { order.push('arrived response') })
  clock.advance(5)
  t.same(order, ['arrived response', 'timeout handler'])
})

t.test('advance with no timers still runs deferred callbacks', async t => {
  const clock = new FakeClock(0)
  let ran = false
  clock.defer(() => { ran = true })
  clock.advance(1)
  t.equal(ran, true)
})

t.test('realClock', async t => {
  const a = realClock.now()
  const b = realClock.now()
  t.ok(b >= a, 'monotonic')

  await new Promise<void>(resolve => { realClock.defer(resolve) })
  t.pass('defer runs its callback')

  // realClock timers are unref'd: hold the loop open while awaiting them (this interval never fires).
  const keepAlive = setInterval(() => {}, 2 ** 30)
  t.teardown(() => { clearInterval(keepAlive) })

  const fired = await new Promise<string>(resolve => {
    const handle = realClock.setTimer(() => { resolve('fired') }, 0)
    t.equal((handle as unknown as NodeJS.Timeout).hasRef(), false, 'a timer does not keep the process alive')
  })
  t.equal(fired, 'fired')

  let cleared = false
  const handle = realClock.setTimer(() => { cleared = true }, 0)
  realClock.clearTimer(handle)
  // A 0 ms timer set after this one would fire after it; when it fires, the cleared one would have.
  await new Promise<void>(resolve => { realClock.setTimer(resolve, 1) })
  t.equal(cleared, false, 'a cleared timer does not fire')
  clearInterval(keepAlive)
})

t.test('realClock: a delay beyond 2^31-1 ms is not cut to 1 ms', async t => {
  const warnings: string[] = []
  const onWarning = (warning: Error): void => { warnings.push(warning.name) }
  process.on('warning', onWarning)
  let fired = false
  const handle = realClock.setTimer(() => { fired = true }, 2 ** 31)
  await new Promise<void>(resolve => { realClock.defer(resolve) })
  realClock.clearTimer(handle)
  process.off('warning', onWarning)
  t.notOk(warnings.includes('TimeoutOverflowWarning'), 'no TimeoutOverflowWarning')
  t.equal(fired, false)
})
