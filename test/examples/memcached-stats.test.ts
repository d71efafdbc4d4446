// MemcachedClient.stats (a streamed answer: one STAT packet per statistic,
// then an empty one) against a real memcached, which is the judge, and
// against the nyala example, whose STAT handler writes each statistic as a
// part (ctx.write, the protocol's encodePart). The same script runs on
// both; counters are compared as differences, never as absolute numbers.
import t, { type Test } from 'tap'
import { existsSync } from 'node:fs'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { MemcachedClient } from '../../examples/memcached/client.js'
import { memcachedHandlers } from '../../examples/memcached/handlers.js'
import { memcachedServer } from '../../examples/memcached/main.js'
import { MemcachedRequest, Opcode, memcachedProtocol, type StatEntry } from '../../examples/memcached/protocol.js'
import { MemcachedStore } from '../../examples/memcached/store.js'
import { ProtocolServer } from '../../reactor/server.js'
import { realMemcached } from '../helpers/real-servers.js'
import { encoded } from '../helpers/encode.js'

const MEMCACHED = '/usr/bin/memcached'

// The statistics both servers give.
const COMMON = ['pid', 'uptime', 'time', 'version', 'cmd_get', 'cmd_set', 'get_hits', 'get_misses', 'curr_items', 'total_items']

const COUNTERS = ['cmd_get', 'cmd_set', 'get_hits', 'get_misses', 'total_items']

function numbers (stats: Map<string, string>, names: string[]): Record<string, number> {
  return Object.fromEntries(names.map((name) => [name, Number(stats.get(name))]))
}

async function code (promise: Promise<unknown>): Promise<string> {
  try {
    await promise
    return 'ok'
  } catch (err) {
    return (err as RpcError).remote?.name ?? (err as RpcError).code
  }
}

// What the script saw, in terms both servers must agree on.
async function script (mc: MemcachedClient): Promise<Record<string, unknown>> {
  const r: Record<string, unknown> = {}
  await mc.flush()
  const before = await mc.stats()
  r['has the common names'] = COMMON.filter((name) => !before.has(name))
  r['every value is text'] = [...before].every(([name, value]) => name.length > 0 && typeof value === 'string')
  r['version as VERSION says'] = before.get('version') === await mc.version()
  r['numbers are numbers'] = COMMON.filter((name) => name !== 'version').filter((name) => !/^\d+(\.\d+)?$/.test(before.get(name)!))
  await mc.set('stat-k', 'v')
  await mc.get('stat-k')
  await mc.get('stat-missing')
  const after = await mc.stats()
  const b = numbers(before, COUNTERS)
  const a = numbers(after, COUNTERS)
  r['counter differences'] = Object.fromEntries(COUNTERS.map((name) => [name, a[name]! - b[name]!]))
  r['settings'] = (await mc.stats('settings')).has('maxbytes')
  r['reset'] = (await mc.stats('reset')).size
  r['get_hits after reset'] = (await mc.stats()).get('get_hits')
  r['unknown group'] = await code(mc.stats('no-such-group'))
  // Pipelined: stats between gets and sets, all in one turn (the gets read
  // keys set before it: over several connections a turn's order is per connection).
  await Promise.all(Array.from({ length: 20 }, (_, i) => mc.set(`g${i}`, `v${i}`)))
  const calls: Array<Promise<unknown>> = []
  for (let i = 0; i < 20; i++) {
    calls.push(mc.stats().then((s) => s.has('pid') ? 'stats' : 'stats without pid'))
    calls.push(mc.set(`p${i}`, `v${i}`).then(() => 'set'))
    calls.push(mc.get(`g${i}`).then((item) => item?.value.toString() === `v${i}` ? 'get' : 'get wrong'))
  }
  const results = await Promise.all(calls)
  r['pipelined'] = results.reduce<Record<string, number>>((counts, what) => { counts[what as string] = (counts[what as string] ?? 0) + 1; return counts }, {})
  r['after the pipeline'] = await code(mc.get('p1'))
  return r
}

const EXPECTED = {
  'has the common names': [],
  'every value is text': true,
  'version as VERSION says': true,
  'numbers are numbers': [],
  'counter differences': { cmd_get: 2, cmd_set: 1, get_hits: 1, get_misses: 1, total_items: 1 },
  settings: true,
  reset: 0,
  'get_hits after reset': '0',
  'unknown group': 'KEY_ENOENT',
  pipelined: { stats: 20, set: 20, get: 20 },
  'after the pipeline': 'ok'
}

function client (t: Test, port: number, connectionsPerEndpoint = 1): MemcachedClient {
  const mc = new MemcachedClient({ endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint })
  t.teardown(() => mc.close())
  return mc
}

t.test('stats() against a real memcached: the judge', { skip: existsSync(MEMCACHED) ? false : `no ${MEMCACHED}` }, async (t) => {
  const { child, port } = await realMemcached(t, MEMCACHED)
  for (const connections of [1, 3]) {
    const mc = client(t, port, connections)
    t.same(await script(mc), EXPECTED, `over ${connections} connection(s)`)
  }
  const stats = await client(t, port).stats()
  t.equal(stats.get('pid'), String(child.pid), 'the pid is the server process\'s')
  t.ok(Number(stats.get('curr_connections')) >= 1, 'curr_connections counts ours')
})

t.test('stats() against the nyala example: the same script, the same results', async (t) => {
  const nyala = memcachedServer()
  const { port } = await nyala.listen(0, '127.0.0.1')
  t.teardown(() => nyala.close({ graceMs: 100 }))
  for (const connections of [1, 3]) t.same(await script(client(t, port, connections)), EXPECTED, `over ${connections} connection(s)`)
  t.equal((await client(t, port).stats()).get('pid'), String(process.pid))
})

t.test('the example\'s STAT with the server\'s connection counts: curr_connections and total_connections', async (t) => {
  const store = new MemcachedStore()
  const server = new ProtocolServer(memcachedProtocol(), { idleTimeoutMs: 0 })
  server.addRoutes('memcached', memcachedHandlers(store, {
    connections: () => ({ open: server.stats().connectionsOpen, accepted: server.stats().connectionsAccepted })
  }))
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const mc = new MemcachedClient({ endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint: 2, balance: 'round-robin' })
  t.teardown(() => mc.close())
  // Calls in one turn, taking the connections in turn: both open.
  const [first] = await Promise.all([mc.stats(), mc.noop(), mc.noop()])
  const stats = await mc.stats()
  t.ok(Number(first.get('curr_connections')) >= 1)
  t.equal(stats.get('curr_connections'), '2')
  t.equal(stats.get('total_connections'), '2')
})

t.test('a STAT whose stream breaks off: the call fails with the connection, and is not retried', async (t) => {
  const { createServer } = await import('node:net')
  // A server that answers STAT with one statistic, then closes.
  const server = createServer((socket) => {
    socket.on('error', () => {})
    socket.once('data', (request: Buffer) => {
      const packet = Buffer.alloc(24 + 7)
      packet[0] = 0x81
      packet[1] = 0x10
      packet.writeUInt16BE(3, 2)
      packet.writeUInt32BE(7, 8)
      request.copy(packet, 12, 12, 16) // the opaque
      packet.write('pid1234', 24, 'latin1')
      socket.end(packet)
    })
  })
  server.listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())))
  const mc = client(t, (server.address() as { port: number }).port)
  t.equal(await code(mc.stats()), ErrorCode.CONNECTION_CLOSED)
  t.equal(mc.client.stats().retries, 0, 'STAT is idempotent, but part of its answer had come')
})

t.test('the example\'s STAT handler writes one part per statistic and answers the end packet; encodePart\'s bytes', async (t) => {
  const store = new MemcachedStore()
  const handlers = memcachedHandlers(store, { version: '1.6.0-test' })
  const parts: StatEntry[] = []
  const ctx = { closeConnection () {}, write (part: StatEntry) { parts.push(part); return true } }
  const empty = Buffer.alloc(0)
  const stat = (key: string): ReturnType<typeof handlers.STAT> => handlers.STAT(new MemcachedRequest(Opcode.STAT, 0, Buffer.from(key), empty, 0, 0, 0n, 0n), ctx)
  const final = stat('')
  t.equal(final.status, 0)
  t.equal(final.stats, null, 'the final answer is the plain end packet')
  t.equal(final.key.length + final.value.length, 0)
  const names = parts.map(([name]) => name)
  for (const name of COMMON) t.ok(names.includes(name), `a part for ${name}`)
  t.equal(new Map(parts).get('version'), '1.6.0-test')
  parts.length = 0
  t.equal(stat('reset').stats, null)
  t.equal(parts.length, 0, 'reset: no part, the end packet alone')
  // A connection that closed: writing stops at the first refused part.
  let refused = 0
  const closed = { closeConnection () {}, write () { refused++; return false } }
  handlers.STAT(new MemcachedRequest(Opcode.STAT, 0, empty, empty, 0, 0, 0n, 0n), closed)
  t.equal(refused, 1)

  const protocol = memcachedProtocol()
  const call = { service: 'memcached', method: 'STAT', callId: 7, data: Opcode.STAT * 2 ** 32 + 0xdeadbeef, route: { service: 'memcached', method: 'STAT', spec: undefined } }
  const bytes = encoded((out) => protocol.encodePart!(call, ['pid', '42'], out))
  const expected = Buffer.alloc(24 + 5)
  expected[0] = 0x81
  expected[1] = 0x10
  expected.writeUInt16BE(3, 2)
  expected.writeUInt32BE(5, 8)
  expected.writeUInt32BE(0xdeadbeef, 12)
  expected.write('pid42', 24, 'latin1')
  t.equal(bytes.toString('hex'), expected.toString('hex'), 'key: the name, value: the value, the request\'s opaque, CAS 0')
})
