// MemcachedClient (examples/memcached/client.ts) against a real memcached
// and against the nyala memcached example: the same operations, quiet
// variants and pipelined bursts included, give the same results on both.
import t, { type Test } from 'tap'
import { existsSync } from 'node:fs'
import type { RpcError } from '../../codec/errors.js'
import { MemcachedClient, type MemcachedItem } from '../../examples/memcached/client.js'
import { memcachedServer } from '../../examples/memcached/main.js'
import { realMemcached } from '../helpers/real-servers.js'

const MEMCACHED = '/usr/bin/memcached'

type Outcome = unknown

function show (value: unknown): Outcome {
  if (typeof value === 'bigint') return 'bigint'
  if (value === null || value === undefined || typeof value === 'boolean' || typeof value === 'string') return value ?? null
  if (typeof value === 'object' && 'value' in (value as object)) {
    const item = value as MemcachedItem
    return { value: item.value.toString('latin1'), flags: item.flags, cas: typeof item.cas }
  }
  return value
}

async function outcome (promise: Promise<unknown>): Promise<Outcome> {
  try {
    return show(await promise)
  } catch (err) {
    const e = err as RpcError
    return `error ${e.remote?.name ?? e.code}`
  }
}

// The script run on both servers; each step's outcome, in order.
async function script (mc: MemcachedClient): Promise<Record<string, Outcome>> {
  const r: Record<string, Outcome> = {}
  const step = async (name: string, p: Promise<unknown>): Promise<void> => { r[name] = await outcome(p) }
  await step('flush', mc.flush())
  await step('get miss', mc.get('a'))
  await step('set', mc.set('a', '1', { flags: 5 }))
  await step('get hit', mc.get('a'))
  await step('add existing', mc.add('a', 'x'))
  await step('add new', mc.add('b', 'x'))
  await step('replace missing', mc.replace('c', 'y'))
  await step('replace present', mc.replace('b', 'y'))
  await step('append', mc.append('b', 'z'))
  await step('prepend', mc.prepend('b', 'w'))
  await step('get appended', mc.get('b'))
  await step('append missing', mc.append('nope', 'z'))
  const a = await mc.get('a')
  await step('set stale cas', mc.set('a', '2', { cas: a!.cas + 1000n }))
  await step('set right cas', mc.set('a', '2', { cas: a!.cas }))
  await step('get after cas', mc.get('a'))
  await step('delete', mc.delete('a'))
  await step('delete again', mc.delete('a'))
  await step('incr missing', mc.incr('n'))
  await step('incr create', mc.incr('n', 5, { initial: 10 }))
  await step('incr', mc.incr('n', 5))
  await step('decr below 0', mc.decr('n', 20))
  await step('set text', mc.set('s', 'abc'))
  await step('incr text', mc.incr('s'))
  await step('touch present', mc.touch('b', 100))
  await step('touch missing', mc.touch('zz', 1))
  await step('noop', mc.noop())
  await step('version is text', mc.version().then((v) => typeof v))
  const big = Buffer.alloc(100_000, 0x61)
  await step('set large', mc.set('big', big))
  await step('get large', mc.get('big').then((i) => i?.value.equals(big)))
  // Quiet commands in one turn each (keys distinct within a turn, so that the order across connections does not matter):
  // settled by the answers after them, or by the NOOP the client sends when nothing follows.
  r['quiet stores'] = await Promise.all([outcome(mc.setq('q1', 'v1')), outcome(mc.setq('q2', 'v2')), outcome(mc.deleteq('missing')), outcome(mc.incrq('q3', 1, { initial: 7 }))])
  r['quiet reads'] = await Promise.all([outcome(mc.getq('q1')), outcome(mc.getq('missing')), outcome(mc.addq('q1', 'x')), outcome(mc.appendq('q2', '!')), outcome(mc.replaceq('q4', 'x'))])
  await step('after quiet', mc.get('q2'))
  await step('after incrq', mc.get('q3'))
  // A quiet command followed by a command with an answer in the same turn.
  r['quiet then get'] = await Promise.all([outcome(mc.deleteq('q1')), outcome(mc.prependq('q2', '<')), outcome(mc.get('q3'))])
  await step('getq after deleteq', mc.getq('q1'))
  await step('after prependq', mc.get('q2'))
  // Pipelined bursts: 500 sets in one turn, then 500 gets.
  r['burst sets'] = (await Promise.all(Array.from({ length: 500 }, (_, i) => mc.set(`k${i}`, `v${i}`, { flags: i })))).every((cas) => typeof cas === 'bigint')
  const got = await Promise.all(Array.from({ length: 500 }, (_, i) => mc.get(`k${i}`)))
  r['burst gets'] = got.every((item, i) => item !== null && item.value.toString() === `v${i}` && item.flags === i)
  await step('flushq', mc.flushq())
  await step('get after flushq', mc.get('k1'))
  return r
}

async function nyalaClient (t: Test, connectionsPerEndpoint: number): Promise<MemcachedClient> {
  const nyala = memcachedServer()
  const { port } = await nyala.listen(0, '127.0.0.1')
  t.teardown(() => nyala.close({ graceMs: 100 }))
  const mc = new MemcachedClient({ endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint })
  t.teardown(() => mc.close())
  return mc
}

t.test('MemcachedClient against the nyala example', async (t) => {
  const r = await script(await nyalaClient(t, 1))
  t.equal(r['get miss'], null)
  t.same(r['get hit'], { value: '1', flags: 5, cas: 'bigint' })
  t.equal(r['add existing'], 'error KEY_EEXISTS')
  t.equal(r['delete again'], false)
  t.equal(r['incr'], 'bigint')
  t.same(r['quiet stores'], [null, null, 'error KEY_ENOENT', null])
  t.same(r['quiet reads'], [{ value: 'v1', flags: 0, cas: 'bigint' }, null, 'error KEY_EEXISTS', null, 'error KEY_ENOENT'])
  t.same(r['after quiet'], { value: 'v2!', flags: 0, cas: 'bigint' })
  t.same(r['after prependq'], { value: '<v2!', flags: 0, cas: 'bigint' })
  t.equal(r['getq after deleteq'], null)
  t.equal(r['burst gets'], true)
  t.equal(r['get after flushq'], null)
})

t.test('MemcachedClient: the same results from a real memcached and from the nyala example', { skip: existsSync(MEMCACHED) ? false : `no ${MEMCACHED}` }, async (t) => {
  const { port } = await realMemcached(t, MEMCACHED)
  for (const connections of [1, 4]) {
    const real = new MemcachedClient({ endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint: connections })
    t.teardown(() => real.close())
    const fromMemcached = await script(real)
    const fromNyala = await script(await nyalaClient(t, connections))
    t.same(fromNyala, fromMemcached, `every step alike over ${connections} connection(s)`)
    t.equal(fromMemcached['burst gets'], true)
  }
})
