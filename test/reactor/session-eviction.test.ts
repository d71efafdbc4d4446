// At maxConnections, sessions (members of a ConnectionGroup, or connections
// marked with ConnectionHandle.markSession) are never closed for a
// newcomer: a subscriber waits quietly by design. Silent openers (no
// request since their set-up) make room first, then other idle ones; with
// only sessions left the newcomer is refused. On the toy tagged protocol,
// with a FakeClock for the idle scans.
import t, { type Test } from 'tap'
import { ConnectionGroup, type CallContext, type ConnectionHandle } from '../../reactor/index.js'
import { FakeClock, serveCore, until, type Core } from '../helpers/core-harness.js'
import type { Peer } from '../helpers/socket-peer.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

const echo = (req: Buffer): Buffer => req
/** The toy protocol's routes are fixed: these two stand for subscribing and marking a session. */
const SUB = 'block'
const KEEP = 'sleep'

/** A server whose SUB joins a group, KEEP marks a session and `echo` answers, at `maxConnections`. */
async function sessionServer (t: Test, clock: FakeClock, maxConnections: number): Promise<Core & { group: ConnectionGroup, kept: ConnectionHandle[] }> {
  const group = new ConnectionGroup()
  const kept: ConnectionHandle[] = []
  const sub = (_req: Buffer, ctx: CallContext): Buffer => { group.add(ctx.connection); return Buffer.from('subscribed') }
  const keep = (_req: Buffer, ctx: CallContext): Buffer => { ctx.connection.markSession(); kept.push(ctx.connection); return Buffer.from('kept') }
  const core = await serveCore(t, taggedProtocol(), { echo, [SUB]: sub, [KEEP]: keep }, { clock, maxConnections, idleTimeoutMs: 0 })
  return { ...core, group, kept }
}

async function call (peer: Peer, method: string, id: number): Promise<void> {
  const before = taggedAnswers(peer.received).length
  peer.socket.write(taggedRequest(method, id, 'x'))
  await peer.until(() => taggedAnswers(peer.received).length === before + 1, `the answer to ${method}`)
}

t.test('maxConnections: a newcomer closes a never-spoken connection, then another idle one, never a subscriber; with only subscribers left it is refused (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open, group } = await sessionServer(t, clock, 4)
  const subscribers = [await open(), await open()]
  for (const [i, peer] of subscribers.entries()) await call(peer, SUB, i)
  t.equal(group.size, 2)
  // The subscribers have been idle longest: a second before the others arrive.
  clock.advance(1000)
  const spoke = await open()
  await call(spoke, 'echo', 5)
  const silent = await open()
  await until(() => server.stats().connectionsOpen === 4, 'four connections')
  clock.advance(1000)
  clock.advance(1000)
  const first = await open()
  await silent.until(() => silent.closed, 'the never-spoken one closed for the newcomer')
  t.same(subscribers.map(p => p.closed), [false, false], 'the subscribers kept')
  t.notOk(spoke.closed, 'the one that spoke kept while a silent one was left')
  t.equal(server.stats().connectionsEvicted, 1)
  await until(() => server.stats().connectionsOpen === 4, 'the newcomer in')
  // The newcomer is silent and too fresh to close: while such a one is left, newcomers are
  // refused (a flood of silent openers must not close a client that has used its connection).
  const early = await open()
  await early.until(() => early.closed, 'a newcomer refused while a fresh silent one is left')
  t.notOk(spoke.closed, 'the idle one that spoke kept while a fresh silent one is left')
  t.equal(server.stats().connectionsRefused, 1)
  // The newcomer speaks (it subscribes): the idle one that spoke makes room next.
  await call(first, SUB, 7)
  const second = await open()
  await spoke.until(() => spoke.closed, 'the idle one that spoke closed next')
  t.same(subscribers.map(p => p.closed), [false, false], 'the subscribers still kept')
  t.equal(server.stats().connectionsEvicted, 2)
  // The second newcomer becomes a subscriber too: only sessions are left.
  await until(() => server.stats().connectionsOpen === 4, 'the second newcomer in')
  await call(second, SUB, 8)
  clock.advance(1000)
  clock.advance(1000)
  const refused = await open()
  await refused.until(() => refused.closed, 'the newcomer refused')
  t.equal(refused.received.length, 0, 'refused without a byte')
  const stats = server.stats()
  t.same([stats.connectionsRefused, stats.connectionsEvicted, group.size], [2, 2, 4], 'refused; no subscriber evicted')
  t.same([...subscribers, first, second].map(p => p.closed), [false, false, false, false])
  t.match(await server.metrics.text(), /^nyala_connections_refused_total 2$/m)
})

t.test('maxConnections: with only subscribers, idle for long, a newcomer is refused; one that leaves its group may be closed again (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open, group } = await sessionServer(t, clock, 2)
  const subscribers = [await open(), await open()]
  for (const [i, peer] of subscribers.entries()) await call(peer, SUB, i)
  for (let i = 0; i < 10; i++) clock.advance(1000)
  const refused = await open()
  await refused.until(() => refused.closed, 'the newcomer refused')
  t.same([server.stats().connectionsRefused, server.stats().connectionsEvicted], [1, 0])
  t.same(subscribers.map(p => p.closed), [false, false])
  // Out of the group, the first one is an ordinary idle connection again.
  group.delete([...group][0]!)
  const admitted = await open()
  await subscribers[0]!.until(() => subscribers[0]!.closed, 'the one out of its group closed for the newcomer')
  t.same([server.stats().connectionsRefused, server.stats().connectionsEvicted, subscribers[1]!.closed], [1, 1, false])
  t.notOk(admitted.closed)
})

t.test('maxConnections: a connection its protocol marked as a session (markSession) is spared like a subscriber; unmarked it may be closed (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const { server, open, kept } = await sessionServer(t, clock, 2)
  const session = await open()
  await call(session, KEEP, 1)
  t.ok(kept[0]!.isSession, 'marked')
  clock.advance(1000)
  const silent = await open()
  await until(() => server.stats().connectionsOpen === 2, 'two connections')
  clock.advance(1000)
  clock.advance(1000)
  const newcomer = await open()
  await silent.until(() => silent.closed, 'the never-spoken one closed, not the session idle longer')
  t.notOk(session.closed)
  await call(newcomer, KEEP, 2)
  clock.advance(1000)
  clock.advance(1000)
  const refused = await open()
  await refused.until(() => refused.closed, 'only sessions left: refused')
  t.same([server.stats().connectionsRefused, server.stats().connectionsEvicted], [1, 1])
  kept[0]!.markSession(false)
  t.notOk(kept[0]!.isSession, 'unmarked')
  const admitted = await open()
  await session.until(() => session.closed, 'unmarked, it is an idle connection again')
  t.same([server.stats().connectionsEvicted, newcomer.closed, admitted.closed], [2, false, false])
})
