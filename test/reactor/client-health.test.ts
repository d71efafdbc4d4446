/**
 * A ProtocolClient meeting a host that stops answering while its socket
 * stays open, over loopback with a FakeClock: the liveness ping finds it
 * (the connection is closed and the host ejected), idempotent calls are
 * retried on the live host within their deadline, an idempotent call's
 * attempt is abandoned at the attempt timeout without a ping, a
 * non-idempotent call is never sent twice, the ejected host is probed
 * and taken back (also when its probe's answer, or its handshake, comes
 * after the probe's attempt was given up), and stats() counts each step.
 */
import t, { type Test } from 'tap'
import { createServer, type Server, type Socket } from 'node:net'
import type { AddressInfo } from 'node:net'
import { ProtocolClient } from '../../reactor/protocol-client.js'
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { FakeClock } from '../../scheduling/clock.js'
import { taggedClientProtocol, type ToyRequest } from '../helpers/toy-client-protocols.js'
import { ROUTES } from '../helpers/toy-protocols.js'

// A tagged-protocol peer (`[u16 len][u8 route][u32 id][payload]`) that echoes while `answering`, and counts what it read;
// while not answering it keeps its answers, and `release()` sends them late.
interface TogglePeer { endpoint: string, answering: boolean, received: string[], sockets: Set<Socket>, server: Server, held: Array<{ socket: Socket, answer: Buffer }>, release: () => void }

async function peer (t: Test): Promise<TogglePeer> {
  const p: TogglePeer = {
    endpoint: '', answering: true, received: [], sockets: new Set(), server: createServer(), held: [],
    release () {
      for (const { socket, answer } of p.held.splice(0)) if (!socket.destroyed) socket.write(answer)
    }
  }
  p.server.on('connection', (socket) => {
    p.sockets.add(socket)
    socket.on('close', () => p.sockets.delete(socket))
    socket.on('error', () => {})
    let buffered = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk])
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        const frame = buffered.subarray(0, 2 + buffered.readUInt16BE(0))
        buffered = buffered.subarray(frame.length)
        p.received.push(frame.toString('utf8', 7))
        const answer = Buffer.from(frame)
        answer[2] = 0
        if (p.answering) socket.write(answer)
        else p.held.push({ socket, answer })
      }
    })
  })
  await new Promise<void>((resolve) => p.server.listen(0, '127.0.0.1', resolve))
  p.endpoint = `127.0.0.1:${(p.server.address() as AddressInfo).port}`
  t.teardown(async () => {
    for (const s of p.sockets) s.destroy()
    await new Promise((resolve) => p.server.close(resolve))
  })
  return p
}

const pingProtocol = (): ReturnType<typeof taggedClientProtocol> => ({ ...taggedClientProtocol(), ping: () => ({ route: 'echo', payload: 'ping' }) })

// Real sockets, fake time: lets the I/O of a few turns happen.
async function turns (n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve))
}

// Waits (in real time, at most 2 s) until `what`, firing the fake clock's due timers (a retry's zero backoff) meanwhile.
async function until (what: () => boolean, clock?: FakeClock): Promise<void> {
  for (let i = 0; i < 2000 && !what(); i++) {
    await new Promise((resolve) => setTimeout(resolve, 1))
    clock?.advance(0)
  }
}

// The promise's outcome, the fake clock's due timers fired while it is pending.
async function settled<T> (p: Promise<T>, clock: FakeClock): Promise<T> {
  let done = false
  p.finally(() => { done = true }).catch(() => {})
  await until(() => done, clock)
  return await p
}

t.test('a silent host is pinged, closed, ejected; idempotent calls retried on the other host; then probed and taken back', async t => {
  const [a, b] = [await peer(t), await peer(t)]
  const clock = new FakeClock()
  const client = new ProtocolClient<ToyRequest, string>(pingProtocol(), {
    endpoint: [a.endpoint, b.endpoint], balance: 'round-robin', clock, logger: null,
    retry: { backoff: { delayMs: () => 0 }, attemptTimeoutMs: 0 }
  })
  t.teardown(() => client.close())
  // Both connections open and answer.
  const warm = await settled(Promise.all([1, 2, 3, 4].map(async (i) => await client.call({ route: 'echo', payload: `w${i}` }, { timeoutMs: 1000 }))), clock)
  t.same(warm, ['w1', 'w2', 'w3', 'w4'])
  a.answering = false
  const outcomes: Array<Promise<string>> = []
  for (let i = 0; i < 6; i++) outcomes.push(client.call({ route: 'echo', payload: `c${i}` }, { timeoutMs: 1000, idempotent: true }).catch((e: Error) => `error ${e.message}`))
  await until(() => a.received.filter((r) => r.startsWith('c')).length >= 3)
  clock.advance(200)
  await until(() => a.received.includes('ping'))
  t.ok(a.received.includes('ping'), 'the silent connection was pinged')
  clock.advance(300)
  const answers = await settled(Promise.all(outcomes), clock)
  t.same(answers, ['c0', 'c1', 'c2', 'c3', 'c4', 'c5'], 'every idempotent call answered within its deadline')
  const stats = client.stats()
  t.ok(stats.pings >= 1, `pinged (${stats.pings}, the live connection too when fake time jumps past its answers)`)
  t.equal(stats.unresponsiveConnections, 1)
  t.same(stats.ejection?.ejectedHosts, [a.endpoint], 'the silent host is out')
  t.equal(stats.ejection?.ejections, 1)
  // While it is out, calls go to b only.
  const before = a.received.length
  for (let i = 0; i < 4; i++) t.equal(await settled(client.call({ route: 'echo', payload: `o${i}` }, { timeoutMs: 1000 }), clock), `o${i}`)
  t.equal(a.received.length, before, 'no call reached the ejected host')
  // Healed; after the ejection time the next call is its probe.
  a.answering = true
  clock.advance(500)
  t.equal(await settled(client.call({ route: 'echo', payload: 'probe' }, { timeoutMs: 1000 }), clock), 'probe')
  await until(() => a.received.includes('probe'))
  t.ok(a.received.includes('probe'), 'the probe went to the healed host')
  t.equal(client.stats().ejection?.readmissions, 1)
  t.equal(client.stats().ejection?.ejected, 0)
})

t.test('without a ping, an idempotent attempt is abandoned at the attempt timeout and retried elsewhere; a non-idempotent call is not', async t => {
  const [a, b] = [await peer(t), await peer(t)]
  const clock = new FakeClock()
  const client = new ProtocolClient<ToyRequest, string>(taggedClientProtocol(), {
    endpoint: [a.endpoint, b.endpoint], balance: 'round-robin', clock, logger: null, retry: { backoff: { delayMs: () => 0 } }
  })
  t.teardown(() => client.close())
  await settled(Promise.all([1, 2].map(async (i) => await client.call({ route: 'echo', payload: `w${i}` }, { timeoutMs: 900 }))), clock)
  a.answering = false
  // Round-robin: the next call goes to a.
  const idem = client.call({ route: 'echo', payload: 'idem' }, { timeoutMs: 900, idempotent: true })
  await until(() => a.received.includes('idem'))
  clock.advance(299)
  await turns()
  clock.advance(1)
  await until(() => b.received.includes('idem'), clock)
  t.equal(await settled(idem, clock), 'idem', 'answered by b after a third of its deadline')
  t.equal(client.stats().attemptTimeouts, 1)
  // The next call goes to a again (round-robin), not idempotent: it waits its deadline and fails, sent once.
  const once = client.call({ route: 'echo', payload: 'once' }, { timeoutMs: 900 }).catch((e: { code: string }) => e.code)
  await until(() => a.received.includes('once'))
  clock.advance(900)
  t.equal(await settled(once, clock), 'RPC_ERR_DEADLINE_EXCEEDED')
  t.equal([...a.received, ...b.received].filter((r) => r === 'once').length, 1, 'sent once')
})

// Two hosts, round-robin, one failure ejects; both connections opened and answered once.
async function ejectingClient (t: Test, protocol: ClientProtocol<ToyRequest, string>, a: TogglePeer, b: TogglePeer, clock: FakeClock): Promise<ProtocolClient<ToyRequest, string>> {
  const client = new ProtocolClient<ToyRequest, string>(protocol, {
    endpoint: [a.endpoint, b.endpoint], balance: 'round-robin', clock, logger: null,
    ejection: { consecutiveFailures: 1 }, retry: { backoff: { delayMs: () => 0 } }
  })
  t.teardown(() => client.close())
  await settled(Promise.all([1, 2].map(async (i) => await client.call({ route: 'echo', payload: `w${i}` }, { timeoutMs: 900 }))), clock)
  return client
}

t.test('a probe whose attempt times out is not failed at once: the host\'s late answer takes it back', async t => {
  const [a, b] = [await peer(t), await peer(t)]
  const clock = new FakeClock()
  const client = await ejectingClient(t, taggedClientProtocol(), a, b, clock)
  // One attempt timeout ejects a; after its ejection time the next call is its probe.
  a.answering = false
  const first = client.call({ route: 'echo', payload: 'first' }, { timeoutMs: 900, idempotent: true })
  await until(() => a.received.includes('first'))
  clock.advance(300)
  t.equal(await settled(first, clock), 'first', 'answered by b after the attempt timeout')
  t.same(client.stats().ejection?.ejectedHosts, [a.endpoint], 'a is out')
  clock.advance(500)
  const probe = client.call({ route: 'echo', payload: 'probe' }, { timeoutMs: 900, idempotent: true })
  await until(() => a.received.includes('probe'))
  t.ok(a.received.includes('probe'), 'the probe went to a')
  // a's answer is late: the probe's attempt is given up and the call answered by b.
  clock.advance(300)
  await until(() => b.received.includes('probe'), clock)
  t.equal(await settled(probe, clock), 'probe', 'the probe call answered by b within its deadline')
  t.equal(client.stats().ejection?.probeFailures, 0, 'the given-up attempt did not fail the probe')
  t.equal(client.stats().ejection?.ejections, 1, 'not ejected again')
  // The host is slow, not dead: its late answers come within the probe's time.
  a.answering = true
  a.release()
  await until(() => client.stats().ejection?.readmissions === 1)
  t.equal(client.stats().ejection?.readmissions, 1, 'taken back by the late answer')
  t.equal(client.stats().ejection?.ejected, 0)
  t.equal(client.stats().attemptTimeouts, 2)
})

t.test('a probe on a new connection: the finished handshake takes the host back, though the probe\'s attempt was given up', async t => {
  const [a, b] = [await peer(t), await peer(t)]
  const clock = new FakeClock()
  const base = taggedClientProtocol()
  // The set-up: one hello frame, echoed by the peer.
  const hello = Buffer.from([0, 10, ROUTES.indexOf('echo'), 0, 0, 0, 0, ...Buffer.from('hello')])
  const client = await ejectingClient(t, { ...base, handshake: () => ({ start: () => [[hello]], onFrame: () => ({ done: 'ok' }) }) }, a, b, clock)
  // a crashes and comes back: its connection is gone, and a new one must do the handshake again, slowly.
  a.answering = false
  const first = client.call({ route: 'echo', payload: 'first' }, { timeoutMs: 900, idempotent: true })
  await until(() => a.received.includes('first'))
  for (const socket of a.sockets) socket.destroy()
  t.equal(await settled(first, clock), 'first', 'retried on b')
  t.same(client.stats().ejection?.ejectedHosts, [a.endpoint], 'a is out')
  a.held.length = 0
  clock.advance(500)
  const hellos = a.received.filter((r) => r === 'hello').length
  const probe = client.call({ route: 'echo', payload: 'probe' }, { timeoutMs: 900, idempotent: true })
  await until(() => a.received.filter((r) => r === 'hello').length > hellos)
  t.ok(a.received.filter((r) => r === 'hello').length > hellos, 'the probe opened a new connection to a')
  clock.advance(300)
  t.equal(await settled(probe, clock), 'probe', 'the probe call answered by b within its deadline')
  t.notOk(a.received.includes('probe'), 'the given-up probe was never written to a')
  t.equal(client.stats().ejection?.readmissions, 0)
  a.answering = true
  a.release()
  await until(() => client.stats().ejection?.readmissions === 1)
  t.equal(client.stats().ejection?.readmissions, 1, 'the handshake\'s answer took a back')
  t.equal(client.stats().ejection?.probeFailures, 0)
  t.equal(await settled(client.call({ route: 'echo', payload: 'again' }, { timeoutMs: 900 }), clock), 'again')
})

t.test('ejection and liveness can be turned off; keepAliveMs is checked', async t => {
  const a = await peer(t)
  const client = new ProtocolClient<ToyRequest, string>(pingProtocol(), { endpoint: a.endpoint, ejection: false, liveness: false, logger: null })
  t.teardown(() => client.close())
  t.equal(await client.call({ route: 'echo', payload: 'x' }), 'x')
  t.equal(client.stats().ejection, null)
  t.equal(client.stats().pings, 0)
  t.throws(() => new ProtocolClient<ToyRequest, string>(pingProtocol(), { endpoint: a.endpoint, keepAliveMs: -1 }), /keepAliveMs/)
  t.throws(() => new ProtocolClient<ToyRequest, string>(pingProtocol(), { endpoint: a.endpoint, retry: { attemptTimeoutMs: -1 } }), /attemptTimeoutMs/)
})
