/**
 * WorkerPool on a FakeClock: direct hand-off to the most recently parked
 * worker, exact overflow and eviction counts, expiry by timer and at
 * dequeue (expired items never run), one expiry timer, long synchronous
 * runs without recursion, swallowed handler failures, close with a grace
 * period, and that every submitted item settles exactly once.
 */
import t from 'tap'
import fc from 'fast-check'
import { FakeClock, type Clock } from '../../scheduling/clock.js'
import { DeadlineQueue, type QueueDiscipline } from '../../scheduling/service-queue.js'
import { WorkerPool, type RejectReason } from '../../scheduling/worker-pool.js'

interface Job {
  id: string
  deadline: number
  /** Run synchronously instead of waiting for `finish`. */
  sync?: boolean
}

interface Rejection { id: string, reason: RejectReason, message: string }

/** Lets settled promises run their callbacks; no time passes. */
async function flush (): Promise<void> {
  await new Promise<void>(resolve => { setImmediate(resolve) })
}

interface HarnessOptions {
  workers: number
  maxLength: number
  discipline?: QueueDiscipline
  clock?: Clock
  describe?: (job: Job) => string
  run?: (job: Job, worker: number) => Promise<void> | void
}

function harness (options: HarnessOptions) {
  const fake = new FakeClock(0)
  const clock = options.clock ?? fake
  const runs: Array<[string, number]> = []
  const rejections: Rejection[] = []
  const pending = new Map<string, () => void>()
  const pool = new WorkerPool<Job>({
    workers: options.workers,
    queue: new DeadlineQueue<Job>({ maxLength: options.maxLength, discipline: options.discipline ?? 'edf' }),
    clock,
    describe: options.describe,
    run: options.run ?? ((job, worker) => {
      runs.push([job.id, worker])
      if (job.sync === true) return
      return new Promise<void>(resolve => { pending.set(job.id, resolve) })
    }),
    reject: (job, reason, message) => { rejections.push({ id: job.id, reason, message }) }
  })
  let n = 0
  const submit = (id: string, deadline = Infinity, sync = false): Job => {
    const job: Job = { id, deadline, sync }
    pool.submit(job)
    n++
    return job
  }
  const finish = async (id: string): Promise<void> => {
    const resolve = pending.get(id)
    if (resolve === undefined) throw new Error(`${id} is not running`)
    pending.delete(id)
    resolve()
    await flush()
  }
  const rejected = (reason?: RejectReason): string[] =>
    rejections.filter(r => reason === undefined || r.reason === reason).map(r => r.id)
  return { pool, fake, runs, rejections, pending, submit, finish, rejected, submitted: () => n }
}

t.test('work goes straight to the most recently parked worker', async t => {
  // A queue of length 0 refuses everything: any item that runs was handed off.
  const h = harness({ workers: 3, maxLength: 0 })
  t.equal(h.pool.idleWorkers, 3)
  h.submit('a')
  h.submit('b')
  t.same(h.runs, [['a', 0], ['b', 1]], 'worker 0 starts on top, then 1')
  t.equal(h.pool.busyWorkers, 2)
  await h.finish('a')
  await h.finish('b')
  t.equal(h.pool.idleWorkers, 3)
  h.submit('c')
  h.submit('d')
  h.submit('e')
  t.same(h.runs.slice(2), [['c', 1], ['d', 0], ['e', 2]], 'LIFO: b\'s worker parked last, so it goes first')
  t.equal(h.pool.saturated(), true)
  h.submit('f')
  t.same(h.rejected('full'), ['f'])
  t.match(h.pool.stats, { submitted: 6, handedOff: 5, queued: 0, overflows: 1, completed: 2 })
  for (const id of ['c', 'd', 'e']) await h.finish(id)
  t.equal(h.pool.completed, 5)
  t.equal(h.fake.pendingTimers, 0)
})

t.test('a full queue with no workers: exactly the overflow is refused', async t => {
  const h = harness({ workers: 0, maxLength: 2, discipline: 'fifo' })
  t.equal(h.pool.saturated(), false)
  h.submit('a')
  h.submit('b')
  t.equal(h.pool.saturated(), true)
  h.submit('c')
  t.same(h.rejections, [{ id: 'c', reason: 'full', message: 'call dropped due to backpressure: service queue is full with 2 items' }])
  t.match(h.pool.stats, { submitted: 3, queued: 2, overflows: 1, evictions: 0 })
  t.equal(h.pool.queueLength, 2)
  const closed = h.pool.close(10)
  h.fake.advance(10)
  await closed
  t.same(h.rejected('shutdown'), ['a', 'b'], 'nothing ever ran them')
  t.equal(h.runs.length, 0)
  t.equal(h.fake.pendingTimers, 0)
})

t.test('edf: an earlier newcomer evicts the latest queued item instead', async t => {
  const h = harness({ workers: 0, maxLength: 2, describe: job => `Ping request ${job.id}` })
  h.submit('a', 500)
  h.submit('b')
  h.submit('c')
  t.same(h.rejections, [{ id: 'c', reason: 'full', message: 'Ping request c dropped due to backpressure: service queue is full with 2 items' }],
    'no deadline ties with no deadline: the newcomer is refused')
  h.submit('d', 100)
  t.same(h.rejections[1], { id: 'b', reason: 'evicted', message: 'Ping request b dropped due to backpressure: service queue is full with 2 items' })
  h.submit('e', 500)
  t.same(h.rejected('full'), ['c', 'e'], 'tied with the latest: refused')
  t.match(h.pool.stats, { submitted: 5, queued: 3, overflows: 2, evictions: 1 })
  const closed = h.pool.close(0)
  h.fake.advance(0)
  await closed
  t.same(h.rejected('shutdown'), ['d', 'a'])
  t.equal(h.fake.pendingTimers, 0)
})

t.test('queued items past their deadline are rejected by the timer and never run', async t => {
  const h = harness({ workers: 1, maxLength: 10 })
  h.submit('busy')
  h.submit('b', 50)
  h.submit('c', 30)
  h.submit('d')
  t.equal(h.fake.pendingTimers, 1, 'one timer for the earliest deadline')
  h.fake.advance(29)
  t.same(h.rejections, [])
  h.fake.advance(1)
  t.same(h.rejections, [{ id: 'c', reason: 'expired', message: 'call waited in the queue past client deadline' }])
  t.equal(h.fake.pendingTimers, 1, 're-armed for b')
  h.fake.advance(20)
  t.same(h.rejected('expired'), ['c', 'b'])
  t.equal(h.fake.pendingTimers, 0, 'd has no deadline: no timer')
  await h.finish('busy')
  t.same(h.runs.map(r => r[0]), ['busy', 'd'])
  await h.finish('d')
  t.match(h.pool.stats, { submitted: 4, expired: 2, completed: 2 })
  t.equal(h.pool.idleWorkers, 1)
})

t.test('expired items are rejected at dequeue even before the timer fires', async t => {
  // Time moves here without firing timers, as after an event-loop stall.
  const timers = new FakeClock(0)
  let now = 0
  const clock: Clock = {
    now: () => now,
    setTimer: (callback, ms) => timers.setTimer(callback, ms),
    clearTimer: handle => { timers.clearTimer(handle) },
    defer: callback => { timers.defer(callback) }
  }
  for (const discipline of ['edf', 'fifo'] as const) {
    const h = harness({ workers: 1, maxLength: 10, discipline, clock })
    h.submit('busy')
    h.submit('late', 100)
    h.submit('b', 10)
    h.submit('c', 20)
    now += 20
    await h.finish('busy')
    t.same(h.rejected('expired'), ['b', 'c'], `${discipline}: deadline <= now counts as passed`)
    t.ok(h.rejections.every(r => r.message.includes('waited in the queue past client deadline')))
    t.same(h.runs.map(r => r[0]), ['busy', 'late'], `${discipline}: the expired never run`)
    await h.finish('late')
    t.equal(timers.pendingTimers, 0, `${discipline}: the unfired timer is cleared with the queue empty`)
  }
})

t.test('an item past its deadline on arrival is rejected and keeps no worker', async t => {
  const h = harness({ workers: 1, maxLength: 1 })
  h.fake.advance(100)
  h.submit('dead', 100)
  t.same(h.rejected('expired'), ['dead'])
  t.equal(h.pool.idleWorkers, 1)
  h.submit('busy')
  h.submit('live', 200)
  h.submit('dead-too', 50)
  t.same(h.rejected(), ['dead', 'dead-too'], 'a dead newcomer does not evict a live item')
  t.equal(h.pool.queueLength, 1)
  t.match(h.pool.stats, { expired: 2, handedOff: 1, evictions: 0 })
  await h.finish('busy')
  await h.finish('live')
  t.equal(h.fake.pendingTimers, 0)
})

t.test('one expiry timer, replaced only when the earliest deadline moves earlier', async t => {
  const fake = new FakeClock(0)
  let set = 0
  let cleared = 0
  const clock: Clock = {
    now: () => fake.now(),
    setTimer: (callback, ms) => { set++; return fake.setTimer(callback, ms) },
    clearTimer: handle => { cleared++; fake.clearTimer(handle) },
    defer: callback => { fake.defer(callback) }
  }
  const h = harness({ workers: 1, maxLength: 10, clock })
  h.submit('busy')
  h.submit('d100', 100)
  t.equal(set, 1)
  h.submit('d200', 200)
  h.submit('d150', 150)
  t.equal(set, 1, 'later deadlines keep the timer')
  h.submit('d50', 50)
  t.same([set, cleared, fake.pendingTimers], [2, 1, 1], 'an earlier one replaces it')
  await h.finish('busy')
  t.same(h.runs.map(r => r[0]), ['busy', 'd50'])
  t.equal(set, 2, 'taking the earliest keeps the (now early) timer')
  fake.advance(50)
  t.same(h.rejections, [], 'it fires with nothing expired (d50 is running, not queued)')
  t.same([set, fake.pendingTimers], [3, 1], 'and re-arms at the new earliest')
  fake.advance(50)
  t.same(h.rejected('expired'), ['d100'])
  t.equal(set, 4)
  await h.finish('d50')
  t.same(h.runs.map(r => r[0]), ['busy', 'd50', 'd150'])
  await h.finish('d150')
  await h.finish('d200')
  t.equal(fake.pendingTimers, 0, 'no timer with the queue empty')
})

t.test('a long run of synchronous handlers loops instead of recursing', async t => {
  const count = 100_000
  let ran = 0
  let inOrder = true
  const h = harness({
    workers: 1,
    maxLength: count,
    run: (job, worker) => {
      if (job.id === 'first') return new Promise<void>(resolve => { h.pending.set(job.id, resolve) })
      if (job.id !== String(ran) || worker !== 0) inOrder = false
      ran++
    }
  })
  h.submit('first')
  for (let i = 0; i < count; i++) h.submit(String(i))
  t.equal(h.pool.queueLength, count)
  await h.finish('first')
  t.equal(ran, count, 'all ran in one synchronous stretch')
  t.ok(inOrder, 'in arrival order, on worker 0')
  t.equal(h.pool.completed, count + 1)
  t.equal(h.pool.idleWorkers, 1)
})

t.test('a handler that throws or rejects only ends its own run', async t => {
  const ran: string[] = []
  const h = harness({
    workers: 1,
    maxLength: 10,
    run: async job => {
      ran.push(job.id)
      if (job.id === 'gate') await new Promise<void>(resolve => { h.pending.set(job.id, resolve) })
      if (job.id === 'rejects') throw new Error('async failure')
    }
  })
  h.submit('gate')
  h.submit('rejects')
  h.submit('after')
  await h.finish('gate')
  t.same(ran, ['gate', 'rejects', 'after'])
  t.equal(h.pool.completed, 3)

  const sync: string[] = []
  const s = harness({
    workers: 1,
    maxLength: 10,
    run: job => {
      sync.push(job.id)
      if (job.id === 'throws') throw new Error('sync failure')
    }
  })
  s.submit('throws')
  s.submit('next')
  t.same(sync, ['throws', 'next'])
  t.equal(s.pool.completed, 2)
  t.equal(s.pool.idleWorkers, 1)
})

t.test('close: queued items drain within the grace period; the rest are rejected', async t => {
  const h = harness({ workers: 1, maxLength: 10 })
  h.submit('a')
  h.submit('b')
  h.submit('c')
  h.submit('d')
  let done = false
  const closing = h.pool.close(100)
  void closing.then(() => { done = true })
  t.equal(h.pool.closed, true)
  h.submit('late')
  t.same(h.rejections, [{ id: 'late', reason: 'shutdown', message: 'call rejected: server is shutting down' }])
  await h.finish('a')
  h.fake.advance(50)
  await h.finish('b')
  t.same(h.runs.map(r => r[0]), ['a', 'b', 'c'], 'queued items keep running')
  h.fake.advance(50)
  t.same(h.rejected('shutdown'), ['late', 'd'], 'what is still queued at the end of the grace is rejected')
  await flush()
  t.equal(done, false, 'c is still running')
  await h.finish('c')
  t.equal(done, true)
  t.equal(h.pool.close(5), closing, 'the same promise')
  t.equal(h.fake.pendingTimers, 0)
  t.match(h.pool.stats, { submitted: 5, completed: 3, shutdownRejected: 2 })
})

t.test('close: a pool that drains within the grace resolves early and drops its timer', async t => {
  const h = harness({ workers: 2, maxLength: 10 })
  h.submit('a')
  h.submit('b')
  h.submit('c', 500)
  const closing = h.pool.close(1000)
  t.equal(h.fake.pendingTimers, 2, 'grace and expiry')
  await h.finish('a')
  await h.finish('b')
  await h.finish('c')
  await closing
  t.equal(h.fake.pendingTimers, 0)
  t.same(h.rejections, [])

  const idle = harness({ workers: 3, maxLength: 1 })
  await idle.pool.close(1000)
  t.equal(idle.fake.pendingTimers, 0, 'an idle pool closes at once')
})

t.test('close: an infinite grace waits; a second close can shorten it', async t => {
  const h = harness({ workers: 1, maxLength: 10 })
  h.submit('a')
  h.submit('b')
  const closing = h.pool.close(Infinity)
  t.equal(h.fake.pendingTimers, 0, 'no grace timer')
  h.fake.advance(1e9)
  t.same(h.rejections, [])
  t.equal(h.pool.close(10), closing)
  h.fake.advance(10)
  t.same(h.rejected('shutdown'), ['b'])
  await h.finish('a')
  await closing
  t.equal(h.fake.pendingTimers, 0)
  t.throws(() => h.pool.close(-1), RangeError)
})

t.test('options are validated', async t => {
  const queue = new DeadlineQueue<Job>({ maxLength: 1, discipline: 'edf' })
  const base = { queue, clock: new FakeClock(), run: () => {}, reject: () => {} }
  t.throws(() => new WorkerPool({ ...base, workers: -1 }), RangeError)
  t.throws(() => new WorkerPool({ ...base, workers: 1.5 }), RangeError)
  queue.put({ id: 'x', deadline: Infinity })
  t.throws(() => new WorkerPool({ ...base, workers: 1 }), /must be empty/)
})

type Action =
  | { kind: 'submit', deadline: number, sync: boolean }
  | { kind: 'finish', pick: number }
  | { kind: 'advance', ms: number }

const actionArb: fc.Arbitrary<Action> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('submit' as const),
      // Offsets from now: 0 is dead on arrival, Infinity has no deadline.
      deadline: fc.oneof(fc.integer({ min: 0, max: 60 }), fc.constant(Infinity)),
      sync: fc.boolean()
    })
  },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('finish' as const), pick: fc.nat() }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('advance' as const), ms: fc.integer({ min: 0, max: 30 }) }) }
)

t.test('every submitted item settles exactly once; the expired never run', async t => {
  await fc.assert(fc.asyncProperty(
    fc.integer({ min: 0, max: 3 }),
    fc.integer({ min: 0, max: 4 }),
    fc.constantFrom<QueueDiscipline>('edf', 'fifo'),
    fc.array(actionArb, { maxLength: 40, size: 'max' }),
    fc.integer({ min: 0, max: 50 }),
    async (workers, maxLength, discipline, actions, graceMs) => {
      const clock = new FakeClock(0)
      const settled = new Map<number, string[]>()
      const running = new Map<number, () => void>()
      const busy = new Set<number>()
      // The pool swallows what run throws, so violations are collected instead.
      const violations: string[] = []
      const note = (id: number, how: string): void => { settled.set(id, [...(settled.get(id) ?? []), how]) }
      let nextId = 0
      const pool = new WorkerPool<{ id: number, deadline: number, sync: boolean }>({
        workers,
        queue: new DeadlineQueue({ maxLength, discipline }),
        clock,
        run: (item, worker) => {
          if (clock.now() >= item.deadline) violations.push(`item ${item.id} ran past its deadline`)
          if (busy.has(worker)) violations.push(`worker ${worker} ran two items at once`)
          note(item.id, 'run')
          if (item.sync) return
          busy.add(worker)
          return new Promise<void>(resolve => {
            running.set(item.id, () => { busy.delete(worker); resolve() })
          })
        },
        reject: (item, reason) => { note(item.id, reason) }
      })
      const finishOne = (pick: number): void => {
        const ids = [...running.keys()]
        const id = ids[pick % Math.max(1, ids.length)]
        if (id === undefined) return
        running.get(id)!()
        running.delete(id)
      }
      for (const action of actions) {
        if (action.kind === 'submit') pool.submit({ id: nextId++, deadline: clock.now() + action.deadline, sync: action.sync })
        else if (action.kind === 'finish') finishOne(action.pick)
        else clock.advance(action.ms)
        await flush()
      }
      let closed = false
      void pool.close(graceMs).then(() => { closed = true })
      for (let round = 0; !closed && round < 1000; round++) {
        finishOne(0)
        clock.advance(10)
        await flush()
      }
      if (!closed) throw new Error('close never resolved')
      if (violations.length > 0) throw new Error(violations.join('; '))
      for (let id = 0; id < nextId; id++) {
        const outcomes = settled.get(id) ?? []
        if (outcomes.length !== 1) throw new Error(`item ${id} settled ${outcomes.length} times: ${outcomes.join(', ')}`)
      }
      const s = pool.stats
      if (s.submitted !== nextId) throw new Error('submitted count')
      if (s.completed + s.overflows + s.evictions + s.expired + s.shutdownRejected !== nextId) throw new Error(`counters do not add up: ${JSON.stringify(s)}`)
      if (clock.pendingTimers !== 0) throw new Error(`${clock.pendingTimers} timers left`)
      if (pool.idleWorkers !== workers || pool.queueLength !== 0) throw new Error('not idle after close')
    }
  ), { numRuns: 200 })
  t.pass('200 random schedules: each item ran or was rejected exactly once')
})


t.test('the clock is read only when a deadline needs it; a caller\'s reading is used at submit', async t => {
  const fake = new FakeClock(0)
  let reads = 0
  const counting: Clock = Object.create(fake, { now: { value: () => { reads++; return fake.now() } } })
  const h = harness({ workers: 1, maxLength: 4, clock: counting })
  for (let i = 0; i < 5; i++) h.submit(`sync${i}`, Infinity, true)
  t.equal(reads, 0, 'no deadline and an empty queue: no clock reading per item')
  t.equal(h.runs.length, 5)

  // With the caller's reading, an item whose deadline has passed is expired without reading the clock.
  const late = { id: 'late', deadline: 10, sync: true }
  h.pool.submit(late, 10)
  t.equal(reads, 0)
  t.same(h.rejected('expired'), ['late'])
  const fresh = { id: 'fresh', deadline: 10, sync: true }
  h.pool.submit(fresh, 9)
  t.equal(reads, 0)
  t.same(h.runs.at(-1), ['fresh', 0], 'a live item with the caller\'s reading runs')
  h.pool.submit({ id: 'own', deadline: 10, sync: true })
  t.equal(reads, 1, 'without one the pool reads the clock')
})

t.test('abandon: the slot goes to a fresh worker id at once, the abandoned run settling later is dropped, its id reused', async (t) => {
  const clock = new FakeClock(0)
  const finishers = new Map<string, () => void>()
  const ran: Array<[string, number]> = []
  const rejected: string[] = []
  const pool = new WorkerPool<Job>({
    workers: 1,
    queue: new DeadlineQueue<Job>({ maxLength: 5, discipline: 'edf' }),
    clock,
    run: (job, worker) => {
      ran.push([job.id, worker])
      return new Promise<void>(resolve => { finishers.set(job.id, resolve) })
    },
    reject: (job) => { rejected.push(job.id) }
  })
  pool.submit({ id: 'stuck', deadline: Infinity })
  pool.submit({ id: 'queued', deadline: Infinity })
  t.same(ran, [['stuck', 0]])
  pool.abandon(0)
  t.same(ran, [['stuck', 0], ['queued', 1]], 'the queued item runs at once on a new worker id')
  t.equal(pool.abandonedRuns, 1)
  t.equal(pool.busyWorkers, 1, 'still one worker: the abandoned run does not count')
  pool.abandon(0)
  t.equal(pool.abandonedRuns, 1, 'abandoning twice does nothing')
  finishers.get('stuck')!()
  await flush()
  t.equal(pool.abandonedRuns, 0)
  t.equal(pool.busyWorkers, 1, 'the late settlement does not free a worker')
  finishers.get('queued')!()
  await flush()
  t.equal(pool.idleWorkers, 1)
  // The next abandonment reuses id 0.
  pool.submit({ id: 'again', deadline: Infinity })
  const worker = ran[ran.length - 1]![1]
  pool.submit({ id: 'next', deadline: Infinity })
  pool.abandon(worker)
  t.equal(ran[ran.length - 1]![1], 0, 'the freed id is reused')
  for (const f of finishers.values()) f()
  await flush()
  t.equal(pool.idleWorkers, 1)
  t.same(rejected, [])
  await pool.close(0)
})

t.test('claim: the caller runs an item on the most recently parked worker, counted as a hand-off; ran gives it back', async t => {
  const h = harness({ workers: 2, maxLength: 10 })
  const a: Job = { id: 'a', deadline: 100 }
  t.equal(h.pool.claim(a, 0), 0, 'worker 0 is on top')
  t.equal(h.pool.busyWorkers, 1)
  h.pool.ran(0, undefined)
  t.equal(h.pool.idleWorkers, 2, 'a run that ended before ran() parks its worker at once')
  t.match(h.pool.stats, { submitted: 1, handedOff: 1, completed: 1 })

  // A run still going holds its worker until its promise settles; items queue behind it as behind any run.
  const b: Job = { id: 'b', deadline: 100 }
  t.equal(h.pool.claim(b, 0), 0, 'LIFO: worker 0 parked last')
  let settle!: () => void
  h.pool.ran(0, new Promise<void>(resolve => { settle = resolve }))
  h.submit('c')
  t.equal(h.pool.claim({ id: 'x', deadline: 100 }, 0), -1, 'no worker is parked: submit judges it')
  h.submit('d')
  t.same(h.runs, [['c', 1]], 'c took worker 1; d waits')
  t.equal(h.pool.queueLength, 1)
  settle()
  await flush()
  t.same(h.runs, [['c', 1], ['d', 0]], 'b\'s worker takes the queued d when its run settles')
  await h.finish('c')
  await h.finish('d')
  t.equal(h.pool.idleWorkers, 2)
  t.match(h.pool.stats, { submitted: 4, handedOff: 3, queued: 1, completed: 4 })

  // What submit would refuse is not claimed: an item past its deadline, and any item once closing.
  t.equal(h.pool.claim({ id: 'late', deadline: 5 }, 5), -1)
  const closing = h.pool.close(0)
  t.equal(h.pool.claim({ id: 'e', deadline: Infinity }, 0), -1)
  await closing
  t.match(h.pool.stats, { submitted: 4 }, 'refused claims count nothing')
  t.equal(h.fake.pendingTimers, 0)
})

t.test('close waits for a claimed worker to be given back', async t => {
  const h = harness({ workers: 1, maxLength: 10 })
  t.equal(h.pool.claim({ id: 'a', deadline: Infinity }, 0), 0)
  let done = false
  void h.pool.close(Infinity).then(() => { done = true })
  await flush()
  t.equal(done, false, 'worker 0 is still out')
  h.pool.ran(0, undefined)
  await flush()
  t.equal(done, true)
})
