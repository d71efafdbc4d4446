/**
 * Retry timing: exponential backoff (the Kudu Java client's truncated
 * randomized policy), linear backoff, the retry budget's sliding window,
 * nextRetryDelay's deadline and attempt limits, and abortable sleep. Every
 * random draw is injected and every clock is a FakeClock.
 */
import t from 'tap'
import fc from 'fast-check'
import { FakeClock } from '../../scheduling/clock.js'
import {
  DEFAULT_MAX_ATTEMPTS,
  ExponentialBackoff,
  LinearBackoff,
  RetryBudget,
  nextRetryDelay,
  sleep,
  type Backoff,
  type RetryPolicy
} from '../../scheduling/retry.js'

const ALMOST_ONE = 0.999

t.test('exponential defaults: random × 2^min(attempt, 12) ms, the Java client', async t => {
  const low = new ExponentialBackoff({ random: () => 0 })
  const high = new ExponentialBackoff({ random: () => ALMOST_ONE })
  t.equal(high.delayMs(0), 0, 'the first attempt does not wait')
  for (let attempt = 1; attempt <= 12; attempt++) {
    t.equal(low.delayMs(attempt), 0, `attempt ${attempt} may retry at once`)
    t.equal(high.delayMs(attempt), ALMOST_ONE * 2 ** attempt, `attempt ${attempt} stays under 2^${attempt} ms`)
  }
  t.equal(high.delayMs(1), 1.998, 'the first retry waits under 2 ms')
  t.equal(high.delayMs(1), ALMOST_ONE * 2)
  t.equal(high.baseMs, 1)
  t.equal(high.maxExponent, 12)
  t.equal(high.capMs, Infinity)
  t.equal(high.jitter, 'full')

  const draws = [0.5, 0.25]
  const scripted = new ExponentialBackoff({ random: () => draws.shift() ?? 0 })
  t.equal(scripted.delayMs(3), 4, 'one draw per delay: 0.5 × 8')
  t.equal(scripted.delayMs(3), 2, '0.25 × 8')
})

t.test('exponential truncation: the exponent stops at maxExponent', async t => {
  const high = new ExponentialBackoff({ random: () => ALMOST_ONE })
  for (const attempt of [12, 13, 20, 100, 1_000_000]) {
    t.equal(high.delayMs(attempt), ALMOST_ONE * 4096, `attempt ${attempt}`)
    t.ok(high.delayMs(attempt) < 4096, `attempt ${attempt} stays under 4096 ms`)
  }
  const none = new ExponentialBackoff({ jitter: 'none' })
  t.equal(none.delayMs(20), 4096, 'attempt 20 with the defaults is at most 4096 ms')
  const short = new ExponentialBackoff({ jitter: 'none', baseMs: 10, maxExponent: 3 })
  t.same([1, 2, 3, 4, 5].map(n => short.delayMs(n)), [20, 40, 80, 80, 80], 'baseMs scales, maxExponent truncates')
  const flat = new ExponentialBackoff({ jitter: 'none', baseMs: 7, maxExponent: 0 })
  t.same([1, 2, 9].map(n => flat.delayMs(n)), [7, 7, 7], 'maxExponent 0 is a constant delay')
})

t.test('exponential cap bounds the range the jitter is drawn from', async t => {
  const none = new ExponentialBackoff({ jitter: 'none', capMs: 100 })
  t.same([5, 6, 7, 8, 20].map(n => none.delayMs(n)), [32, 64, 100, 100, 100])
  const full = new ExponentialBackoff({ capMs: 100, random: () => ALMOST_ONE })
  t.equal(full.delayMs(6), ALMOST_ONE * 64, 'under the cap: unchanged')
  t.equal(full.delayMs(20), ALMOST_ONE * 100, 'over the cap: uniform in [0, cap)')
  const mid = new ExponentialBackoff({ capMs: 100, random: () => 0.5 })
  t.equal(mid.delayMs(20), 50, 'capped delays stay spread, not piled up at the cap')
  const equal = new ExponentialBackoff({ capMs: 100, jitter: 'equal', random: () => 0 })
  t.equal(equal.delayMs(20), 50)
  const zero = new ExponentialBackoff({ capMs: 0, jitter: 'none' })
  t.equal(zero.delayMs(20), 0, 'capMs 0 means retry at once')
  const big = new ExponentialBackoff({ jitter: 'none', maxExponent: 2000, capMs: 60_000 })
  t.equal(big.delayMs(1500), 60_000, '2^1500 overflows, but a finite cap bounds it')
})

t.test('jitter modes', async t => {
  for (const [random, full, equal] of [[() => 0, 0, 512], [() => ALMOST_ONE, ALMOST_ONE * 1024, 512 + ALMOST_ONE * 512]] as const) {
    t.equal(new ExponentialBackoff({ jitter: 'full', random }).delayMs(10), full, `full, random ${random()}`)
    t.equal(new ExponentialBackoff({ jitter: 'equal', random }).delayMs(10), equal, `equal, random ${random()}`)
    t.equal(new ExponentialBackoff({ jitter: 'none', random }).delayMs(10), 1024, `none, random ${random()}`)
  }
  let draws = 0
  const none = new ExponentialBackoff({ jitter: 'none', random: () => { draws++; return 0.5 } })
  none.delayMs(3)
  t.equal(draws, 0, "'none' never draws")
})

t.test('a faulty random source cannot push a delay out of range', async t => {
  for (const value of [1, 2, -1, NaN, Infinity, -Infinity]) {
    for (const jitter of ['full', 'equal'] as const) {
      const delay = new ExponentialBackoff({ jitter, random: () => value }).delayMs(4)
      t.ok(delay >= 0 && delay < 16, `${jitter}, random ${value} → ${delay}`)
    }
  }
})

t.test('option and attempt validation', async t => {
  t.throws(() => new ExponentialBackoff({ baseMs: -1 }), RangeError)
  t.throws(() => new ExponentialBackoff({ baseMs: NaN }), RangeError)
  t.throws(() => new ExponentialBackoff({ baseMs: Infinity }), RangeError)
  t.throws(() => new ExponentialBackoff({ maxExponent: 1.5 }), RangeError)
  t.throws(() => new ExponentialBackoff({ maxExponent: -1 }), RangeError)
  t.throws(() => new ExponentialBackoff({ capMs: -1 }), RangeError)
  t.throws(() => new ExponentialBackoff({ maxExponent: 2000 }), RangeError, 'an uncapped overflow is refused')
  t.throws(() => new ExponentialBackoff({ jitter: 'some' as 'full' }), RangeError)
  t.throws(() => new LinearBackoff({ stepMs: -1 }), RangeError)
  t.throws(() => new LinearBackoff({ capMs: NaN }), RangeError)
  const exp = new ExponentialBackoff()
  const lin = new LinearBackoff()
  for (const attempt of [-1, 1.5, NaN, Infinity]) {
    t.throws(() => exp.delayMs(attempt), RangeError, `exponential attempt ${attempt}`)
    t.throws(() => lin.delayMs(attempt), RangeError, `linear attempt ${attempt}`)
  }
  t.throws(() => new RetryBudget(new FakeClock(), { ratio: -0.1 }), RangeError)
  t.throws(() => new RetryBudget(new FakeClock(), { minRetriesPerSecond: NaN }), RangeError)
  t.throws(() => new RetryBudget(new FakeClock(), { windowMs: 0 }), RangeError)
  t.throws(() => new RetryBudget(new FakeClock(), { windowMs: Infinity }), RangeError)
  t.throws(() => new RetryBudget(new FakeClock(), { buckets: 0 }), RangeError)
  t.throws(() => new RetryBudget(new FakeClock(), { buckets: 2.5 }), RangeError)
})

t.test('equal jitter never rounds above a subnormal cap (a fast-check counterexample)', async t => {
  const backoff = new ExponentialBackoff({ baseMs: 5e-324, maxExponent: 4, capMs: 7.4e-323, jitter: 'equal', random: () => 0.9375 })
  t.ok(backoff.delayMs(4) <= 7.4e-323)
})

t.test('property: exponential delays are finite and within [0, cap]', async t => {
  fc.assert(fc.property(
    fc.record({
      baseMs: fc.double({ min: 0, max: 1e6, noNaN: true }),
      maxExponent: fc.integer({ min: 0, max: 40 }),
      capMs: fc.oneof(fc.constant(Infinity), fc.double({ min: 0, max: 1e7, noNaN: true })),
      jitter: fc.constantFrom('full' as const, 'equal' as const, 'none' as const),
      draw: fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true })
    }),
    fc.integer({ min: 0, max: 10_000 }),
    ({ baseMs, maxExponent, capMs, jitter, draw }, attempt) => {
      const backoff = new ExponentialBackoff({ baseMs, maxExponent, capMs, jitter, random: () => draw })
      const delay = backoff.delayMs(attempt)
      const bound = Math.min(capMs, baseMs * 2 ** Math.min(attempt, maxExponent))
      return Number.isFinite(delay) && delay >= 0 && delay <= capMs && delay <= bound
    }
  ))
  fc.assert(fc.property(fc.integer({ min: 0, max: 1_000_000 }), fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }), (attempt, draw) => {
    const delay = new ExponentialBackoff({ random: () => draw }).delayMs(attempt)
    return delay >= 0 && delay < 4096
  }), { numRuns: 500 })
  t.pass('held')
})

t.test('linear: stepMs × attempt, capped', async t => {
  const linear = new LinearBackoff()
  t.equal(linear.stepMs, 500, 'the Java client before 2016')
  t.same([0, 1, 2, 3, 10].map(n => linear.delayMs(n)), [0, 500, 1000, 1500, 5000])
  const capped = new LinearBackoff({ stepMs: 100, capMs: 250 })
  t.same([1, 2, 3, 50].map(n => capped.delayMs(n)), [100, 200, 250, 250])
  t.equal(new LinearBackoff({ stepMs: 1e308 }).delayMs(1e10), Number.MAX_VALUE, 'overflow saturates, stays finite')
})

const fixed = (ms: number): Backoff => ({ delayMs: () => ms })
const always = (): boolean => true

t.test('nextRetryDelay: the retry competes with the original deadline', async t => {
  const policy: RetryPolicy = { backoff: fixed(100), retryable: always }
  t.equal(nextRetryDelay(policy, 1, 1000), 100)
  t.equal(nextRetryDelay(policy, 1, 100.5), 100, 'room left after the sleep')
  t.equal(nextRetryDelay(policy, 1, 100), null, 'the sleep would end at the deadline')
  t.equal(nextRetryDelay(policy, 1, 99), null, 'the sleep would pass the deadline')
  t.equal(nextRetryDelay(policy, 1, 0), null, 'the deadline has passed')
  t.equal(nextRetryDelay(policy, 1, -5), null)
  t.equal(nextRetryDelay(policy, 1, NaN), null)
  t.equal(nextRetryDelay(policy, 1, Infinity), 100, 'no deadline')
  const immediate: RetryPolicy = { backoff: fixed(0), retryable: always }
  t.equal(nextRetryDelay(immediate, 1, 0.001), 0)
  t.equal(nextRetryDelay(immediate, 1, 0), null, 'not even an immediate retry after the deadline')

  const seen: number[] = []
  const recording: RetryPolicy = { backoff: { delayMs: n => { seen.push(n); return 2 ** n } }, retryable: always }
  t.same([1, 2, 3].map(n => nextRetryDelay(recording, n, 1e9)), [2, 4, 8])
  t.same(seen, [1, 2, 3], 'the backoff sees the attempt number as given')

  const exp: RetryPolicy = { backoff: new ExponentialBackoff({ random: () => ALMOST_ONE }), retryable: always }
  t.equal(nextRetryDelay(exp, 12, 4095), ALMOST_ONE * 4096, 'a 4091.9 ms sleep fits in 4095 ms')
  t.equal(nextRetryDelay(exp, 12, ALMOST_ONE * 4096), null, 'but not in exactly 4091.9 ms')
})

t.test('nextRetryDelay: maxAttempts counts every attempt, the first included', async t => {
  const policy: RetryPolicy = { maxAttempts: 3, backoff: fixed(1), retryable: always }
  t.equal(nextRetryDelay(policy, 1, 1e6), 1, 'after attempt 1: retry (attempt 2)')
  t.equal(nextRetryDelay(policy, 2, 1e6), 1, 'after attempt 2: retry (attempt 3)')
  t.equal(nextRetryDelay(policy, 3, 1e6), null, 'after attempt 3: none left')
  t.equal(nextRetryDelay(policy, 4, 1e6), null)
  const once: RetryPolicy = { maxAttempts: 1, backoff: fixed(1), retryable: always }
  t.equal(nextRetryDelay(once, 1, 1e6), null, 'maxAttempts 1: never retry')

  t.equal(DEFAULT_MAX_ATTEMPTS, 100, "the Java client's MAX_RPC_ATTEMPTS")
  const unset: RetryPolicy = { backoff: fixed(1), retryable: always }
  t.equal(nextRetryDelay(unset, 99, 1e6), 1)
  t.equal(nextRetryDelay(unset, 100, 1e6), null)

  t.throws(() => nextRetryDelay(unset, 0, 1e6), RangeError, 'attempt counts attempts made: at least 1')
  t.throws(() => nextRetryDelay(unset, 1.5, 1e6), RangeError)
  const broken: RetryPolicy = { backoff: { delayMs: () => NaN }, retryable: always }
  t.equal(nextRetryDelay(broken, 1, 1e6), null, 'a broken backoff does not retry')
})

t.test('nextRetryDelay: the budget is asked last', async t => {
  const clock = new FakeClock(0)
  const budget = new RetryBudget(clock, { minRetriesPerSecond: 0 })
  for (let i = 0; i < 10; i++) budget.recordCall()
  t.equal(budget.balance, 2)
  const policy: RetryPolicy<string> = { maxAttempts: 5, backoff: fixed(100), budget, retryable: code => code === 'SERVER_TOO_BUSY' }
  t.equal(policy.retryable('SERVER_TOO_BUSY'), true)
  t.equal(policy.retryable('INVALID_REQUEST'), false)

  t.equal(nextRetryDelay(policy, 5, 1e6), null, 'over maxAttempts')
  t.equal(nextRetryDelay(policy, 1, 50), null, 'past the deadline')
  t.same(budget.stats, { calls: 10, retries: 0, refused: 0 }, 'a retry ruled out otherwise does not touch the budget')

  t.equal(nextRetryDelay(policy, 1, 1e6), 100)
  t.equal(nextRetryDelay(policy, 2, 1e6), 100)
  t.equal(nextRetryDelay(policy, 1, 1e6), null, 'the budget refuses')
  t.same(budget.stats, { calls: 10, retries: 2, refused: 1 })

  t.equal(nextRetryDelay({ ...policy, budget: null }, 1, 1e6), 100, 'a null budget is unlimited')
})

t.test('budget: retries at most ratio × calls, plus the floor', async t => {
  const clock = new FakeClock(0)
  const ratioOnly = new RetryBudget(clock, { minRetriesPerSecond: 0 })
  t.equal(ratioOnly.balance, 0, 'no calls, no floor: no retries')
  t.equal(ratioOnly.tryWithdraw(), false)
  for (let i = 0; i < 100; i++) ratioOnly.recordCall()
  t.equal(ratioOnly.balance, 20, '20 % of 100 calls')
  let granted = 0
  while (ratioOnly.tryWithdraw()) granted++
  t.equal(granted, 20)
  t.equal(ratioOnly.balance, 0)
  t.equal(ratioOnly.tryWithdraw(), false)
  t.same(ratioOnly.stats, { calls: 100, retries: 20, refused: 3 }, 'every refusal is counted')
  ratioOnly.recordCall()
  t.equal(ratioOnly.balance, 0, 'one call earns a fifth of a retry')
  for (let i = 0; i < 4; i++) ratioOnly.recordCall()
  t.equal(ratioOnly.balance, 1, 'five calls earn one')

  const withFloor = new RetryBudget(clock)
  t.equal(withFloor.ratio, 0.2)
  t.equal(withFloor.minRetriesPerSecond, 10)
  t.equal(withFloor.windowMs, 10_000)
  t.equal(withFloor.balance, 100, 'the floor: 10 per second over a 10 s window, with no calls')
  for (let i = 0; i < 100; i++) withFloor.recordCall()
  t.equal(withFloor.balance, 120, '100 calls: 20 retries on top of the floor')
  granted = 0
  while (withFloor.tryWithdraw()) granted++
  t.equal(granted, 120)
  t.same(withFloor.stats, { calls: 100, retries: 120, refused: 1 })

  const tenth = new RetryBudget(clock, { ratio: 0.1, minRetriesPerSecond: 0 })
  for (let i = 0; i < 30; i++) tenth.recordCall()
  t.equal(tenth.balance, 3, '0.1 × 30 is 3 despite binary rounding')
  const noRetries = new RetryBudget(clock, { ratio: 0, minRetriesPerSecond: 0 })
  noRetries.recordCall()
  t.equal(noRetries.tryWithdraw(), false, 'ratio 0 and no floor: retries off')
})

t.test('budget: counts expire a bucket at a time and the budget recovers', async t => {
  const clock = new FakeClock(0)
  const budget = new RetryBudget(clock, { minRetriesPerSecond: 0 })
  for (let i = 0; i < 50; i++) budget.recordCall()
  clock.advance(5000)
  for (let i = 0; i < 50; i++) budget.recordCall()
  t.equal(budget.balance, 20, 'calls 5 s apart are both in the window')
  while (budget.tryWithdraw()) {}
  t.equal(budget.balance, 0, 'exhausted')
  clock.advance(4999)
  t.equal(budget.balance, 0, 'nothing has expired at 9.999 s')
  clock.advance(1)
  t.equal(budget.balance, 0, 'at 10 s the first 50 calls expire (their 10 earned retries with them), the 20 retries made at 5 s have not')
  t.equal(budget.tryWithdraw(), false)
  clock.advance(5000)
  t.equal(budget.balance, 0, 'at 15 s everything has expired: no calls, no floor')
  for (let i = 0; i < 10; i++) budget.recordCall()
  t.equal(budget.balance, 2, 'fresh calls earn fresh retries')

  const floored = new RetryBudget(clock)
  while (floored.tryWithdraw()) {}
  t.equal(floored.balance, 0)
  clock.advance(9_999)
  t.equal(floored.balance, 0, 'just under the window')
  clock.advance(1)
  t.equal(floored.balance, 100, 'the window has passed: the floor is back in full')
  t.equal(floored.stats.refused, 1)
})

t.test('budget: a long idle gap clears the whole window; buckets set the granularity', async t => {
  const clock = new FakeClock(0)
  const budget = new RetryBudget(clock, { minRetriesPerSecond: 0, windowMs: 1000, buckets: 4 })
  for (let i = 0; i < 40; i++) budget.recordCall()
  t.equal(budget.balance, 8)
  clock.advance(1e9)
  t.equal(budget.balance, 0, 'after any gap beyond the window, nothing is left')
  for (let i = 0; i < 20; i++) budget.recordCall()
  clock.advance(249)
  for (let i = 0; i < 20; i++) budget.recordCall()
  t.equal(budget.balance, 8, 'both batches in the 250 ms bucket starting at 1e9')
  clock.advance(1)
  for (let i = 0; i < 20; i++) budget.recordCall()
  t.equal(budget.balance, 12, 'a third batch in the next bucket')
  clock.advance(740)
  t.equal(budget.balance, 12, 'at 1e9 + 990 all are in the window')
  clock.advance(10)
  t.equal(budget.balance, 4, 'at 1e9 + 1000 the oldest bucket has left, even the batch made 249 ms into it')
  clock.advance(249)
  t.equal(budget.balance, 4)
  clock.advance(1)
  t.equal(budget.balance, 0)

  const single = new RetryBudget(new FakeClock(0), { minRetriesPerSecond: 0, windowMs: 100, buckets: 1 })
  for (let i = 0; i < 5; i++) single.recordCall()
  t.equal(single.balance, 1, 'one bucket works (a tumbling window)')
})

t.test('budget: memory stays bounded under heavy traffic', async t => {
  const clock = new FakeClock(0)
  const budget = new RetryBudget(clock, { minRetriesPerSecond: 0 })
  for (let second = 0; second < 100; second++) {
    for (let i = 0; i < 1000; i++) budget.recordCall()
    clock.advance(1000)
  }
  t.equal(budget.balance, 1800, '9 of the 10 one-second buckets hold calls: 9000 × 0.2')
  t.same(budget.stats, { calls: 100_000, retries: 0, refused: 0 })
})

t.test('sleep resolves when its timer fires', async t => {
  const clock = new FakeClock(0)
  let done = false
  const slept = sleep(clock, 250).then(() => { done = true })
  t.equal(clock.pendingTimers, 1)
  clock.advance(249)
  await Promise.resolve()
  t.equal(done, false, 'not before its time')
  clock.advance(1)
  await slept
  t.equal(done, true)
  t.equal(clock.now(), 250)
  t.equal(clock.pendingTimers, 0)

  const controller = new AbortController()
  const withSignal = sleep(clock, 10, controller.signal)
  clock.advance(10)
  await withSignal
  controller.abort(new Error('too late'))
  t.equal(clock.pendingTimers, 0, 'aborting after the timer fired is harmless')
})

t.test('sleep rejects with the abort reason and clears its timer', async t => {
  const clock = new FakeClock(0)
  const controller = new AbortController()
  const reason = new Error('caller gave up')
  const slept = sleep(clock, 1000, controller.signal)
  t.equal(clock.pendingTimers, 1)
  clock.advance(400)
  controller.abort(reason)
  await t.rejects(slept, reason)
  t.equal(clock.pendingTimers, 0, 'the timer is gone')

  const already = AbortSignal.abort('stopped')
  const early = sleep(clock, 1000, already)
  t.equal(clock.pendingTimers, 0, 'no timer was set')
  t.equal(await early.then(() => 'resolved', (error: unknown) => error), 'stopped', 'an aborted signal rejects at once, with its reason')

  const timeout = new AbortController()
  const plain = sleep(clock, 5, timeout.signal)
  timeout.abort()
  await t.rejects(plain, { name: 'AbortError' }, 'abort() without a reason rejects with an AbortError')
  t.equal(clock.pendingTimers, 0)
})
