// `resolveAll` with a name resolving to thousands of addresses: a client
// uses at most `maxResolvedAddresses` of them (default 32), a subset drawn
// by rendezvous hashing on its own seed (reactor/client/address-subset.ts),
// drawn again when the resolution changes. The lookup is a stub; the
// connections are counted as attempted (the addresses refuse, except
// 127.0.0.1).
import t from 'tap'
import { Socket } from 'node:net'
import { ErrorCode } from '../../codec/errors.js'
import { ProtocolClient } from '../../reactor/protocol-client.js'
import { subsetAddresses } from '../../reactor/client/address-subset.js'
import { Targets, type HostLookup } from '../../reactor/client/targets.js'
import type { Address } from '../../reactor/balancer.js'
import { FakeClock } from '../../reactor/testing.js'
import { linesClientProtocol } from '../helpers/toy-client-protocols.js'
import { lineServer, outcomes } from '../helpers/push-stream-protocols.js'

// 5,000 loopback addresses: 127.0.0.1 and 4,999 of 127.1.0.0/16 (nothing listens there: a connect is refused at once).
const MANY = ['127.0.0.1', ...Array.from({ length: 4999 }, (_, i) => `127.1.${i >> 8}.${i & 255}`)]
const stub = (addresses: readonly string[]): HostLookup => async () => addresses.map((address) => ({ address }))

t.test('subsetAddresses: at most max, the same for a seed whatever the order, other seeds other subsets, few changes when the list changes', async (t) => {
  const all: Address[] = MANY.map((host) => ({ host, port: 7000 }))
  const keys = (list: readonly Address[]): string[] => list.map((a) => a.host).sort()
  const subset = subsetAddresses(all, 32, 12345)
  t.equal(subset.length, 32)
  t.equal(new Set(keys(subset)).size, 32, 'distinct')
  t.same(keys(subsetAddresses([...all].reverse(), 32, 12345)), keys(subset), 'the order the addresses come in does not matter')
  const other = subsetAddresses(all, 32, 54321)
  t.ok(keys(other).filter((k) => keys(subset).includes(k)).length < 8, 'another seed draws another subset')
  t.same(keys(subsetAddresses(all.slice(0, 20), 32, 12345)), keys(all.slice(0, 20)), 'fewer than max: all of them')
  // 100 addresses not in the subset go away: the subset stays.
  const chosen = new Set(keys(subset))
  const unchosen = all.filter((a) => !chosen.has(a.host)).slice(0, 100).map((a) => a.host)
  t.same(keys(subsetAddresses(all.filter((a) => !unchosen.includes(a.host)), 32, 12345)), keys(subset), 'unchanged')
  // One of the subset goes away: the 31 others stay, one is drawn anew.
  const gone = subset[0]!.host
  const redrawn = keys(subsetAddresses(all.filter((a) => a.host !== gone), 32, 12345))
  t.equal(redrawn.length, 32)
  t.equal(redrawn.filter((k) => chosen.has(k)).length, 31)
})

t.test('a Target balances over at most maxResolvedAddresses addresses, drawn again when the name resolves to others', async (t) => {
  const clock = new FakeClock()
  let answer: readonly string[] = MANY
  const lookups: string[] = []
  const targets = new Targets({
    connectionsPerEndpoint: 2,
    policy: 'round-robin',
    resolveAll: true,
    maxResolvedAddresses: 32,
    subsetSeed: 7,
    lookup: async (host) => {
      lookups.push(host)
      return answer.map((address) => ({ address }))
    },
    clock,
    outstanding: () => 0,
    ejection: null
  })
  const target = targets.of('many.test:7000')
  await target.resolving
  const hosts = (): Set<string> => new Set(target.balancer.slots.map((s) => s.address.host))
  t.equal(hosts().size, 32, '32 addresses of 5,000')
  t.equal(target.balancer.slots.length, 64, 'each with its connectionsPerEndpoint slots')
  const first = hosts()
  // 30 s on, the name resolves to the 4,000 addresses not chosen: the next pick re-resolves and draws again.
  answer = MANY.filter((a) => !first.has(a)).slice(0, 4000)
  clock.advance(30_000)
  target.pick()
  await new Promise((resolve) => setImmediate(resolve))
  t.same(lookups, ['many.test', 'many.test'])
  t.equal(hosts().size, 32)
  t.equal([...hosts()].filter((h) => first.has(h)).length, 0, 'all drawn from the new addresses')
})

t.test('ProtocolClient with resolveAll and a name of 5,000 addresses: connections attempted to at most 32 of them', async (t) => {
  const { port } = await lineServer(t, (line) => `${line.slice(line.indexOf(' ') + 1)}\n`)
  // Every connect this process makes to the port, by address.
  const attempted = new Set<string>()
  const original = Socket.prototype.connect
  Socket.prototype.connect = function (this: Socket, ...args: unknown[]) {
    // net.connect hands its arguments on normalized: [options, callback].
    const first = Array.isArray(args[0]) ? args[0][0] : args[0]
    const options = first as { host?: string, port?: number } | undefined
    if (typeof options === 'object' && options !== null && options.port === port) attempted.add(options.host ?? '')
    return (original as (...a: unknown[]) => Socket).apply(this, args)
  } as typeof original
  t.teardown(() => { Socket.prototype.connect = original })

  const run = async (maxResolvedAddresses: number | undefined): Promise<Record<string, number>> => {
    attempted.clear()
    const client = new ProtocolClient(linesClientProtocol(), {
      endpoint: `many.test:${port}`, resolveAll: true, lookup: stub(MANY), maxResolvedAddresses, retry: false, balance: 'round-robin', logger: null, ejection: false
    })
    const counts: Record<string, number> = {}
    try {
      for (let wave = 0; wave < 10; wave++) {
        const calls = Array.from({ length: 50 }, (_, i) => client.call({ route: 'echo', payload: `${wave}.${i}` }, { timeoutMs: 2000 }))
        for (const [code, n] of Object.entries(await outcomes(calls))) counts[code] = (counts[code] ?? 0) + n
      }
    } finally {
      client.close()
    }
    return counts
  }

  const counts = await run(undefined)
  t.ok(attempted.size >= 2 && attempted.size <= 32, `default cap: ${attempted.size} addresses attempted`)
  t.equal((counts.ok ?? 0) + (counts[ErrorCode.CONNECT_FAILED] ?? 0) + (counts[ErrorCode.CONNECTION_CLOSED] ?? 0), 500, `every call settled: ${JSON.stringify(counts)}`)
  await run(4)
  t.ok(attempted.size >= 2 && attempted.size <= 4, `maxResolvedAddresses 4: ${attempted.size} attempted`)
  // Control: with the cap as large as the name, the same calls spread over far more addresses.
  await run(5000)
  t.ok(attempted.size > 32, `maxResolvedAddresses 5000: ${attempted.size} attempted`)
  t.throws(() => new ProtocolClient(linesClientProtocol(), { endpoint: `many.test:${port}`, resolveAll: true, maxResolvedAddresses: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
})
