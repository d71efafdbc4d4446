/**
 * The idle collection of reactor/idle-collection.ts: it collects once after work
 * when the process is idle and RSS grew, never while RSS did not grow or
 * before any work, not again until there was work, again after one that
 * left RSS grown (the memory was still held) until one frees or
 * FUTILE_TRIES did not, not at all with NYALA_IDLE_GC=0; each collection is
 * followed by a trim of the C heap; the real collection runs without --expose-gc. RSS and
 * the collection are stubs; the event-loop utilization is this process's
 * own (a bounded synchronous spin makes an interval busy; idle is below
 * half busy here, so the test runner's own work stays idle). Each stopper is
 * called, so no timer stays. A server runs one while it listens (its
 * `idleCollection` option), none with `idleCollection: false`.
 */
import t, { type Test } from 'tap'
import { FUTILE_TRIES, IDLE_COLLECTION_OPT_OUT, startIdleCollection } from '../../reactor/idle-collection.js'
import { ProtocolServer } from '../../reactor/index.js'
import { FakeClock } from '../../reactor/testing.js'
import { taggedProtocol } from '../helpers/toy-protocols.js'

const MiB = 1024 * 1024
const INTERVAL_MS = 100
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Keeps the event loop busy for `ms` (bounded: at most 10 M iterations). */
function spin (ms: number): void {
  const end = performance.now() + ms
  for (let i = 0; i < 10_000_000 && performance.now() < end; i++);
}

t.test('one collection after work, once idle and grown; none again until there is work', async (t) => {
  let rss = 100 * MiB
  let collections = 0
  const stop = startIdleCollection({ intervalMs: INTERVAL_MS, idleBelow: 0.5, growthBytes: 64 * MiB, rss: () => rss, collect: () => { collections++; rss = 110 * MiB } }, {})
  t.teardown(stop)
  await sleep(INTERVAL_MS * 4)
  t.equal(collections, 0, 'no work yet: nothing')
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 4)
  t.equal(collections, 0, 'work, but RSS did not grow by 64 MiB: nothing')
  rss = 200 * MiB
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections, 1, 'work, grown, then idle: one collection')
  rss = 300 * MiB
  await sleep(INTERVAL_MS * 5)
  t.equal(collections, 1, 'no work since: not again')
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections, 2, 'work again, still grown: once more')
})

t.test('a collection while the memory is still held does not set the level: tried again once idle, it frees what was let go since', async (t) => {
  let rss = 100 * MiB
  let held = true
  let collections = 0
  const stop = startIdleCollection({ intervalMs: INTERVAL_MS, idleBelow: 0.5, growthBytes: 64 * MiB, rss: () => rss, collect: () => { collections++; if (!held) rss = 110 * MiB } }, {})
  t.teardown(stop)
  // An attack: RSS at 600 MiB, the server busy, then idle while its non-reading peers hold the answers.
  rss = 600 * MiB
  spin(INTERVAL_MS * 3)
  for (let i = 0; i < 20 && collections === 0; i++) await sleep(INTERVAL_MS / 4)
  t.equal(collections, 1, 'idle during the attack: collected, freeing nothing')
  // The attack ends: its buffers are garbage now, with no work in between.
  held = false
  for (let i = 0; i < 40 && rss > 110 * MiB; i++) await sleep(INTERVAL_MS)
  t.equal(rss, 110 * MiB, 'tried again while idle: RSS back down')
  const done = collections
  t.ok(done >= 2, `collected again (${done} in all)`)
  await sleep(INTERVAL_MS * 6)
  t.equal(collections, done, 'freed: no more until there is work')
})

t.test('collections that never free stop after FUTILE_TRIES: that RSS is live data', async (t) => {
  let rss = 100 * MiB
  let collections = 0
  const stop = startIdleCollection({ intervalMs: INTERVAL_MS, idleBelow: 0.5, growthBytes: 64 * MiB, rss: () => rss, collect: () => { collections++ } }, {})
  t.teardown(stop)
  rss = 300 * MiB
  spin(INTERVAL_MS * 3)
  // The tries: 1, 2, then every 4 intervals.
  for (let i = 0; i < 60 && collections < FUTILE_TRIES; i++) await sleep(INTERVAL_MS)
  t.equal(collections, FUTILE_TRIES)
  await sleep(INTERVAL_MS * 10)
  t.equal(collections, FUTILE_TRIES, 'then none without work')
  rss = 330 * MiB
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections, FUTILE_TRIES, 'work, but RSS is not 64 MiB above the new level: none')
})

t.test('each collection is followed by a trim of the C heap, and the RSS after both sets the level', async (t) => {
  let rss = 100 * MiB
  const calls: string[] = []
  // The collection frees the JS garbage but its buffers' heap stays mapped; only the trim returns it.
  const stop = startIdleCollection({ intervalMs: INTERVAL_MS, idleBelow: 0.5, growthBytes: 64 * MiB, rss: () => rss, collect: () => { calls.push('collect') }, trim: () => { calls.push('trim'); rss = 105 * MiB } }, {})
  t.teardown(stop)
  rss = 700 * MiB
  spin(INTERVAL_MS * 3)
  for (let i = 0; i < 20 && calls.length < 2; i++) await sleep(INTERVAL_MS / 4)
  t.same(calls, ['collect', 'trim'], 'collected, then trimmed')
  await sleep(INTERVAL_MS * 6)
  t.same(calls, ['collect', 'trim'], 'RSS after the trim is the level: not tried again')
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.same(calls, ['collect', 'trim'], 'work again, but RSS is not 64 MiB above 105 MiB: nothing')
})

t.test('NYALA_IDLE_GC=0 turns it off', async (t) => {
  let collections = 0
  let rss = 100 * MiB
  const stop = startIdleCollection({ intervalMs: INTERVAL_MS, idleBelow: 0.5, rss: () => rss, collect: () => { collections++ } }, { [IDLE_COLLECTION_OPT_OUT.name]: IDLE_COLLECTION_OPT_OUT.value })
  t.teardown(stop)
  rss = 500 * MiB
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections, 0)
})

t.test('the real collection runs without --expose-gc on the command line', async (t) => {
  t.equal(typeof (globalThis as { gc?: unknown }).gc, 'undefined', 'this process has no global gc')
  let rss = 0
  let calls = 0
  const stop = startIdleCollection({ intervalMs: INTERVAL_MS, idleBelow: 0.5, growthBytes: 1, rss: () => { calls++; return rss++ * MiB } }, {})
  t.teardown(stop)
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.ok(calls >= 2, 'it measured, collected (V8\'s full collection) and measured again without throwing')
  t.equal(typeof (globalThis as { gc?: unknown }).gc, 'undefined', 'and left no global gc behind')
})

/** A server on a FakeClock with the idle collection's RSS and collection stubbed; `env` set while it starts listening. */
async function stubbedServer (t: Test, env: Record<string, string>): Promise<{ server: ProtocolServer, grow: (bytes: number) => void, collections: () => number }> {
  let rss = 100 * MiB
  let collections = 0
  const server = new ProtocolServer(taggedProtocol(), {
    logger: null, clock: new FakeClock(), idleCollection: { intervalMs: INTERVAL_MS, idleBelow: 0.5, growthBytes: 64 * MiB, rss: () => rss, collect: () => { collections++; rss = 100 * MiB } }
  })
  server.addRoutes('tagged', {})
  const saved = { ...process.env }
  Object.assign(process.env, env)
  try {
    await server.listen(0, '127.0.0.1')
  } finally {
    for (const name of Object.keys(env)) if (saved[name] === undefined) delete process.env[name]; else process.env[name] = saved[name]
  }
  t.teardown(() => server.close({ graceMs: 0 }))
  return { server, grow: (bytes) => { rss += bytes }, collections: () => collections }
}

t.test('a server runs it while it listens, with its options, and stops it on close', async (t) => {
  const { server, grow, collections } = await stubbedServer(t, {})
  grow(100 * MiB)
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections(), 1, 'work, grown, idle: collected')
  await server.close({ graceMs: 0 })
  grow(300 * MiB)
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections(), 1, 'nothing after close: its timer is gone')
})

t.test('NYALA_IDLE_GC=0 turns a server\'s off too', async (t) => {
  const { grow, collections } = await stubbedServer(t, { [IDLE_COLLECTION_OPT_OUT.name]: IDLE_COLLECTION_OPT_OUT.value })
  grow(100 * MiB)
  spin(INTERVAL_MS * 3)
  await sleep(INTERVAL_MS * 5)
  t.equal(collections(), 0)
})
