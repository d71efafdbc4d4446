// RedisClient (examples/redis/client.ts) against a real redis-server and
// against the nyala redis example: the same commands, pipelined bursts of
// 1,000 calls and error replies give the same results on both.
import t, { type Test } from 'tap'
import { existsSync } from 'node:fs'
import { RpcError } from '../../codec/errors.js'
import { RedisClient, type RedisReply } from '../../examples/redis/client.js'
import { redisServer } from '../../examples/redis/main.js'
import { realRedis } from '../helpers/real-servers.js'

const REDIS = '/usr/bin/redis-server'

function show (reply: RedisReply): unknown {
  if (reply instanceof RpcError) return `error ${reply.remote?.name ?? reply.code}`
  if (Buffer.isBuffer(reply)) return `bulk ${reply.toString('latin1')}`
  if (Array.isArray(reply)) return reply.map(show)
  return reply
}

async function outcome (promise: Promise<RedisReply>): Promise<unknown> {
  try {
    return show(await promise)
  } catch (err) {
    const e = err as RpcError
    return `error ${e.remote?.name ?? e.code}`
  }
}

async function script (redis: RedisClient): Promise<Record<string, unknown>> {
  const r: Record<string, unknown> = {}
  const step = async (name: string, p: Promise<RedisReply>): Promise<void> => { r[name] = await outcome(p) }
  await step('flushall', redis.command('FLUSHALL'))
  await step('ping', redis.command('PING'))
  await step('echo', redis.command('ECHO', 'hello'))
  await step('get missing', redis.get('k'))
  await step('set', redis.set('k', 'v'))
  await step('get', redis.get('k'))
  await step('set nx existing', redis.set('k', 'w', { nx: true }))
  await step('set xx existing', redis.set('k', 'w', { xx: true }))
  await step('incr 1', redis.incr('n'))
  await step('incr 2', redis.incr('n'))
  await step('incr on text', redis.incr('k'))
  await step('lpush', redis.lpush('l', 'a', 'b', 'c'))
  await step('lrange', redis.lrange('l', 0, -1))
  await step('lrange empty', redis.lrange('none', 0, -1))
  await step('wrong type', redis.get('l'))
  await step('unknown command', redis.command('NOSUCHCOMMAND', 'x'))
  await step('wrong arity', redis.command('GET'))
  await step('mget', redis.command('MGET', 'k', 'missing', 'n'))
  await step('del', redis.del('k', 'missing', 'n'))
  await step('get deleted', redis.get('k'))
  await step('integer arg', redis.command('SET', 'num', 42))
  await step('incrby big', redis.command('INCRBY', 'num', 2n ** 60n))
  const big = Buffer.alloc(100_000, 0x62)
  await step('set large', redis.set('big', big))
  r['get large'] = (await redis.get('big'))?.equals(big)
  // Pipelined bursts of 1,000 calls, each made in one turn.
  const incrs = await Promise.all(Array.from({ length: 1000 }, () => redis.incr('counter')))
  r['burst incr in order'] = incrs.every((n, i) => n === i + 1)
  const mixed = await Promise.all(Array.from({ length: 1000 }, (_, i) =>
    outcome(i % 10 === 9 ? redis.command('NOSUCHCOMMAND') : i % 2 === 0 ? redis.set(`k${i}`, `v${i}`) : redis.get(`k${i - 1}`))))
  r['burst mixed'] = mixed.map((m, i) => i % 10 === 9 ? m === 'error ERR' : i % 2 === 0 ? m === 'OK' : m === `bulk v${i - 1}`).every(Boolean)
  r['burst mixed errors'] = mixed.filter((m) => m === 'error ERR').length
  const pushes = await Promise.all(Array.from({ length: 1000 }, (_, i) => redis.lpush('big-list', `e${i}`)))
  r['burst lpush'] = pushes.every((n, i) => n === i + 1)
  r['lrange after burst'] = (await redis.lrange('big-list', 0, 2)).map((b) => b.toString())
  return r
}

async function nyalaClient (t: Test, connectionsPerEndpoint: number): Promise<RedisClient> {
  const server = redisServer()
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint })
  t.teardown(() => redis.close())
  return redis
}

t.test('RedisClient against the nyala example', async (t) => {
  const redis = await nyalaClient(t, 1)
  const r = await script(redis)
  t.equal(r.ping, 'PONG')
  t.equal(r.get, 'bulk v')
  t.equal(r['set nx existing'], null)
  t.equal(r['incr 2'], 2)
  t.equal(r['incr on text'], 'error ERR')
  t.same(r.lrange, ['bulk c', 'bulk b', 'bulk a'])
  t.equal(r['wrong type'], 'error WRONGTYPE')
  t.same(r.mget, ['bulk w', null, 'bulk 2'], 'set xx replaced it')
  t.equal(r['incrby big'], 42n + 2n ** 60n)
  t.equal(r['get large'], true)
  t.equal(r['burst incr in order'], true)
  t.equal(r['burst mixed'], true)
  t.equal(r['burst mixed errors'], 100)
  t.equal(r['burst lpush'], true)
  // The error's text is Redis's.
  const error = await redis.incr('l').catch((e: unknown) => e as RpcError)
  t.ok(error instanceof RpcError && error.message.startsWith('WRONGTYPE '), (error as Error).message)
})

t.test('RedisClient: the same results from a real redis-server and from the nyala example', { skip: existsSync(REDIS) ? false : `no ${REDIS}` }, async (t) => {
  const { port } = await realRedis(t, REDIS)
  const real = new RedisClient({ endpoint: `127.0.0.1:${port}` })
  t.teardown(() => real.close())
  const fromRedis = await script(real)
  const fromNyala = await script(await nyalaClient(t, 1))
  t.same(fromNyala, fromRedis, 'every step alike')
  // The texts of the error replies alike too.
  const ours = await nyalaClient(t, 1)
  for (const args of [['INCR', 'x'], ['LPUSH', 'x', 'a']]) {
    await real.command('SET', 'x', 'text')
    await ours.command('SET', 'x', 'text')
    const a = await real.commandWith(args).catch((e: unknown) => e as RpcError)
    const b = await ours.commandWith(args).catch((e: unknown) => e as RpcError)
    t.equal((b as RpcError).message, (a as RpcError).message, args.join(' '))
  }
  // Over 4 connections: independent reads in one turn.
  const spread = new RedisClient({ endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint: 4 })
  t.teardown(() => spread.close())
  await spread.set('shared', 'x')
  const reads = await Promise.all(Array.from({ length: 1000 }, () => spread.get('shared')))
  t.ok(reads.every((b) => b?.toString() === 'x'), '1,000 reads over 4 connections')
  t.equal(spread.client.stats().connections.length, 4)
})
