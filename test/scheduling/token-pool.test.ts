/**
 * TokenPool on a FakeClock: a reactor's workers as tokens of a shared
 * scheduler. Direct hand-off to an idle token sends the broker nothing;
 * what finds none is wanted and runs when granted; freed tokens park unless
 * the broker recalled them or items wait here; refusals, expiry at grant,
 * abandon, close and a lost broker. Then two pools and a broker wired
 * together: EDF order and eviction across reactors, and a reactor that dies.
 */
import t from 'tap'
import { FakeClock } from '../../scheduling/clock.js'
import { TokenBroker } from '../../scheduling/token-broker.js'
import { TokenPool, type TokenLink } from '../../scheduling/token-pool.js'
import type { RejectReason } from '../../scheduling/worker-pool.js'

interface Job { name: string, deadline: number, sync?: boolean }

async function flush (): Promise<void> {
  await new Promise<void>(resolve => { setImmediate(resolve) })
}

function harness (workers: number, clock = new FakeClock(0)) {
  const said: Array<['want', number, number] | ['give', number]> = []
  const runs: Array<[string, number]> = []
  const rejected: Array<[string, RejectReason]> = []
  const finish = new Map<string, () => void>()
  const pool = new TokenPool<Job>({
    workers,
    clock,
    run: (job, worker) => {
      runs.push([job.name, worker])
      if (job.sync === true) return
      return new Promise<void>(resolve => finish.set(job.name, resolve))
    },
    reject: (job, reason) => { rejected.push([job.name, reason]) },
    connect: (): TokenLink => ({ want: (id, deadline) => said.push(['want', id, deadline]), give: (n) => said.push(['give', n]) })
  })
  return { clock, pool, said, runs, rejected, finish }
}

t.test('an idle token takes a call at once, LIFO, and the broker hears nothing', async (t) => {
  const { pool, said, runs, finish } = harness(2)
  pool.submit({ name: 'a', deadline: 100 })
  pool.submit({ name: 'b', deadline: 100 })
  t.same(runs, [['a', 0], ['b', 1]])
  finish.get('a')!()
  await flush()
  pool.submit({ name: 'c', deadline: 100, sync: true })
  t.same(runs.at(-1), ['c', 0], 'the most recently parked token')
  t.same(said, [], 'no message on the uncontended path')
  t.equal(pool.stats.handedOff, 3)
  t.equal(pool.saturated(), false)
})

t.test('no idle token: the call is wanted and runs when granted; its token then parks', async (t) => {
  const { pool, said, runs, finish } = harness(1)
  pool.submit({ name: 'a', deadline: 100 })
  t.equal(pool.saturated(), true)
  pool.submit({ name: 'b', deadline: 50 })
  t.same(said, [['want', 0, 50]])
  t.equal(pool.queueLength, 1)
  finish.get('a')!()
  await flush()
  t.same(said.at(-1), ['give', 1], 'a token freed while a call waits here goes back to the broker')
  pool.grant(0)
  t.same(runs.at(-1)?.[0], 'b')
  finish.get('b')!()
  await flush()
  t.equal(pool.idleWorkers, 1, 'nothing waits and no recall: the token parks here')
  t.equal(said.length, 2)
})

t.test('recall gives idle tokens back, and freed ones until calm', async (t) => {
  const { pool, said, finish } = harness(3)
  pool.submit({ name: 'a', deadline: 100 })
  pool.recall()
  t.same(said, [['give', 2]])
  t.equal(pool.idleWorkers, 0)
  finish.get('a')!()
  await flush()
  t.same(said.at(-1), ['give', 1])
  pool.calm()
  pool.grant(99) // a token for a call no longer here: it parks
  t.equal(pool.idleWorkers, 1)
})

t.test('refusals are answered with their reason and counted; a grant past the deadline is refused expired', async (t) => {
  const { clock, pool, said, rejected, runs } = harness(0)
  pool.submit({ name: 'a', deadline: 100 })
  pool.submit({ name: 'b', deadline: 100 })
  pool.submit({ name: 'c', deadline: 100 })
  pool.submit({ name: 'd', deadline: 100 })
  pool.refuse(0, 'full')
  pool.refuse(1, 'evicted')
  pool.refuse(2, 'expired')
  pool.refuse(2, 'expired') // twice: ignored
  clock.advance(200)
  pool.grant(3)
  t.same(rejected, [['a', 'full'], ['b', 'evicted'], ['c', 'expired'], ['d', 'expired']])
  t.same(runs, [])
  t.equal(pool.idleWorkers, 1, 'the unused token parks: nothing waits and no recall')
  t.equal(said.filter(s => s[0] === 'give').length, 0)
  const s = pool.stats
  t.equal(s.overflows, 1)
  t.equal(s.evictions, 1)
  t.equal(s.expired, 2)
  t.equal(s.submitted, 4)
})

t.test('a call whose deadline passed is refused before it takes a token or asks', async (t) => {
  const { clock, pool, said, rejected } = harness(1)
  clock.advance(10)
  pool.submit({ name: 'a', deadline: 5 })
  t.same(rejected, [['a', 'expired']])
  t.same(said, [])
  t.equal(pool.idleWorkers, 1)
})

t.test('abandon frees the token at once; the abandoned run settling later changes nothing', async (t) => {
  const { pool, runs, finish } = harness(1)
  pool.submit({ name: 'a', deadline: 100 })
  pool.abandon(0)
  t.equal(pool.idleWorkers, 1)
  t.equal(pool.abandonedRuns, 1)
  pool.submit({ name: 'b', deadline: 100 })
  t.not(runs.at(-1)?.[1], 0, 'a fresh worker id')
  finish.get('a')!()
  await flush()
  t.equal(pool.abandonedRuns, 0)
  t.equal(pool.busyWorkers, 1)
})

t.test('close gives idle tokens back, drains what is granted, and answers the rest shutdown at the end of grace', async (t) => {
  const { clock, pool, said, rejected, finish } = harness(2)
  pool.submit({ name: 'a', deadline: 10_000 })
  pool.recall()
  pool.calm()
  said.length = 0
  pool.submit({ name: 'b', deadline: 10_000 }) // waits: no idle token
  let closed = false
  const closing = pool.close(1000).then(() => { closed = true })
  pool.submit({ name: 'c', deadline: 10_000 })
  t.same(rejected, [['c', 'shutdown']])
  finish.get('a')!()
  await flush()
  t.same(said, [['want', 0, 10_000], ['give', 1]], 'a closing reactor keeps no token')
  clock.advance(1000)
  t.same(rejected.at(-1), ['b', 'shutdown'])
  await closing
  t.ok(closed)
  t.equal(clock.pendingTimers, 0)
})

t.test('lent tokens park here; a closing pool gives them straight back', async (t) => {
  const { pool, said } = harness(0)
  pool.lend(2)
  t.equal(pool.idleWorkers, 2)
  t.same(said, [])
  void pool.close(0)
  t.same(said, [['give', 2]])
  pool.lend(1)
  t.same(said.at(-1), ['give', 1])
})

t.test('a lost broker: waiting calls are answered shutdown, new ones without a token are refused', async (t) => {
  const { pool, rejected } = harness(0)
  pool.submit({ name: 'a', deadline: 100 })
  pool.lost()
  pool.submit({ name: 'b', deadline: 100 })
  t.same(rejected, [['a', 'shutdown'], ['b', 'full']])
})

// Two pools and a broker, messages delivered in order as the IPC channel would.
function cluster (workers: number, queueLength: number) {
  const clock = new FakeClock(0)
  const mail: Array<() => void> = []
  const runs: string[] = []
  const rejected: Array<[string, RejectReason]> = []
  const finish = new Map<string, () => void>()
  const pools = new Map<number, TokenPool<Job>>()
  const broker = new TokenBroker({
    discipline: 'edf',
    clock,
    output: {
      grant: (r, id) => mail.push(() => pools.get(r)?.grant(id)),
      refuse: (r, id, reason) => mail.push(() => pools.get(r)?.refuse(id, reason)),
      recall: (r) => mail.push(() => pools.get(r)?.recall()),
      calm: (r) => mail.push(() => pools.get(r)?.calm()),
      lend: (r, n) => mail.push(() => pools.get(r)?.lend(n))
    }
  })
  const make = (r: number): TokenPool<Job> => {
    const pool = new TokenPool<Job>({
      workers,
      clock,
      run: (job) => {
        runs.push(job.name)
        return new Promise<void>(resolve => finish.set(job.name, resolve))
      },
      reject: (job, reason) => { rejected.push([job.name, reason]) },
      connect: () => {
        mail.push(() => broker.join(r, workers, queueLength))
        return { want: (id, d) => mail.push(() => broker.want(r, id, d)), give: (n) => mail.push(() => broker.give(r, n)) }
      }
    })
    pools.set(r, pool)
    return pool
  }
  const deliver = async (): Promise<void> => {
    for (let i = 0; i < 100; i++) {
      await flush()
      if (mail.length === 0) return
      while (mail.length > 0) mail.shift()!()
    }
  }
  return { clock, broker, make, pools, runs, rejected, finish, deliver }
}

t.test('across reactors: the earliest deadline anywhere runs first, and the latest anywhere is evicted', async (t) => {
  const { make, runs, rejected, finish, deliver, broker } = cluster(1, 1)
  const a = make(1)
  const b = make(2)
  await deliver()
  a.submit({ name: 'a1', deadline: 9000 })
  b.submit({ name: 'b1', deadline: 9000 })
  b.submit({ name: 'b-late', deadline: 5000 })
  b.submit({ name: 'b-later', deadline: 6000 })
  await deliver()
  t.equal(broker.queueLength, 2)
  a.submit({ name: 'a-early', deadline: 1000 })
  await deliver()
  t.same(rejected, [['b-later', 'evicted']], "a call on A with an earlier deadline evicts B's latest")
  finish.get('b1')!() // B's token frees: it goes to A's earlier call
  await deliver()
  t.same(runs, ['a1', 'b1', 'a-early'])
  finish.get('a1')!()
  await deliver()
  t.same(runs.at(-1), 'b-late')
  t.equal(broker.queueLength, 0)
  t.equal(a.recalled || b.recalled, false, 'calm once the queue is empty')
})

t.test('a reactor that dies takes only its own calls: the others are run or refused, never left waiting', async (t) => {
  const { clock, make, pools, runs, rejected, finish, deliver, broker } = cluster(2, 4)
  const a = make(1)
  const b = make(2)
  await deliver()
  for (const name of ['a1', 'a2']) a.submit({ name, deadline: 5000 })
  for (const name of ['b1', 'b2']) b.submit({ name, deadline: 5000 })
  for (const name of ['a3', 'a4', 'a5']) a.submit({ name, deadline: 1000 + runs.length })
  b.submit({ name: 'b3', deadline: 900 })
  await deliver()
  t.equal(broker.queueLength, 4)
  // B dies holding two tokens with a call of its own queued.
  pools.delete(2)
  broker.leave(2)
  t.equal(broker.queueLength, 3, "B's entry is gone; A's stay")
  finish.get('a1')!()
  finish.get('a2')!()
  await deliver()
  t.same(runs.slice(-2), ['a3', 'a4'], "A's tokens run A's queued calls")
  clock.advance(2000)
  await deliver()
  t.same(rejected, [['a5', 'expired']], 'what cannot run in time is refused')
  t.equal(a.queueLength, 0, 'nothing of A left waiting')
  t.equal(broker.workers, 2)
  void b
})
