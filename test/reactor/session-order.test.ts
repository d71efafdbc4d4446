// Sequential execution (`execution: 'sequential'`): one connection's calls
// run one at a time, in arrival order, each after the previous one was
// answered; other sessions are never held up by a slow one (the pool's
// workers count sessions); a connection's waiting calls are bounded (its
// reading stops, then resumes); a closed connection's waiting calls never
// run and are reported closed; a group may say otherwise than its protocol.
import t from 'tap'
import { ProtocolServer, type CallContext, type CallOutcome } from '../../reactor/index.js'
import { Gate, serveCore, until } from '../helpers/core-harness.js'
import { linesProtocol, taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'
import { Peer } from '../helpers/socket-peer.js'
import { connect } from 'node:net'
import { once } from 'node:events'

/** Lines handlers: `block x` waits for the gate, `mark x` records that it ran. */
function linesHandlers (gate: Gate, ran: string[]): Record<string, (req: never, ctx: CallContext) => unknown> {
  return {
    block: async (arg: string) => { await gate.handler(Buffer.from(arg)); ran.push(`block ${arg}`); return `blocked ${arg}` },
    mark: (arg: string) => { ran.push(`mark ${arg}`); return `marked ${arg}` }
  }
}

t.test('sequential: a pipelined call runs only after the one before it was answered (concurrent: at once)', async (t) => {
  for (const execution of ['sequential', 'concurrent'] as const) {
    const gate = new Gate()
    const ran: string[] = []
    const { open } = await serveCore(t, { ...linesProtocol(), execution }, linesHandlers(gate, ran))
    const peer = await open()
    peer.socket.write('block a\nmark b\nmark c\n')
    await until(() => gate.waiting === 1, 'the first call running')
    await new Promise(resolve => setTimeout(resolve, 30))
    if (execution === 'sequential') t.same(ran, [], 'sequential: nothing after the slow call has run')
    else t.same(ran, ['mark b', 'mark c'], 'concurrent: the later calls ran at once')
    gate.releaseAll()
    await until(() => peer.received.toString().split('\n').length === 4, 'three answers')
    t.equal(peer.received.toString(), 'blocked a\nmarked b\nmarked c\n', `${execution}: answers in order`)
    if (execution === 'sequential') t.same(ran, ['block a', 'mark b', 'mark c'], 'sequential: ran in arrival order')
  }
})

t.test('sequential with answers by id: each call starts after the previous answer left', async (t) => {
  const gate = new Gate()
  const started: string[] = []
  const { open } = await serveCore(t, { ...taggedProtocol(), execution: 'sequential' }, {
    block: gate.handler,
    echo: (req: Buffer) => { started.push(req.toString()); return req }
  })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('block', 1, 'slow'), taggedRequest('echo', 2, 'fast'), taggedRequest('echo', 3, 'last')]))
  await until(() => gate.waiting === 1, 'the slow call running')
  await new Promise(resolve => setTimeout(resolve, 30))
  t.same(started, [], 'the fast ones wait for the slow one')
  gate.releaseAll()
  await until(() => taggedAnswers(peer.received).length === 3, 'three answers')
  t.same(taggedAnswers(peer.received).map(([, id]) => id), [1, 2, 3], 'answered in arrival order')
})

t.test('sequential: 12 sessions each waiting on a slow call do not delay a 13th (the default workers count sessions)', async (t) => {
  const gate = new Gate()
  const ran: string[] = []
  // The server's default workers per group is 10: a sequential group gets one per admitted connection.
  const server = new ProtocolServer({ ...linesProtocol(), execution: 'sequential' }, { logger: null })
  server.addRoutes('lines', linesHandlers(gate, ran) as never)
  const { port } = await server.listen(0)
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const peer of peers) peer.socket.destroy()
    await server.close({ graceMs: 0 })
  })
  for (let i = 0; i < 13; i++) {
    const socket = connect(port, '127.0.0.1')
    peers.push(new Peer(socket))
    await once(socket, 'connect')
  }
  for (let i = 0; i < 12; i++) peers[i]!.socket.write(`block s${i}\nmark after-s${i}\n`)
  await until(() => gate.waiting === 12, 'twelve sessions sleeping')
  peers[12]!.socket.write('mark quick\n')
  await until(() => peers[12]!.received.toString() === 'marked quick\n', 'the 13th answered while the others sleep')
  t.equal(gate.waiting, 12)
  t.same(ran, ['mark quick'], 'no sleeping session ran its next call')
  gate.releaseAll()
  await until(() => peers.slice(0, 12).every((p, i) => p.received.toString() === `blocked s${i}\nmarked after-s${i}\n`), 'every session answered in order')
})

t.test('sequential with explicit workers: sessions past them queue in the pool, each session counted once', async (t) => {
  const gate = new Gate()
  const ran: string[] = []
  const server = new ProtocolServer({ ...linesProtocol(), execution: 'sequential' }, { logger: null })
  server.addRoutes('lines', linesHandlers(gate, ran) as never, { workers: 2, queueLength: 1 })
  const { port } = await server.listen(0)
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const peer of peers) peer.socket.destroy()
    await server.close({ graceMs: 0 })
  })
  for (let i = 0; i < 4; i++) {
    const socket = connect(port, '127.0.0.1')
    peers.push(new Peer(socket))
    await once(socket, 'connect')
  }
  // Two sessions take the two workers, each with ten calls pipelined behind: those do not fill the pool's queue.
  peers[0]!.socket.write('block a\n' + 'mark a\n'.repeat(10))
  peers[1]!.socket.write('block b\n' + 'mark b\n'.repeat(10))
  await until(() => gate.waiting === 2, 'two sessions running')
  peers[2]!.socket.write('mark c\n')
  peers[3]!.socket.write('mark d\n')
  // c takes the queue's one place; d finds it full (a session, not a call, is the unit).
  await until(() => peers[3]!.received.length > 0, 'the fourth session refused')
  t.match(peers[3]!.received.toString(), /^-ERR busy/)
  t.equal(peers[2]!.received.length, 0, 'the third waits in the pool queue')
  gate.releaseAll()
  await until(() => peers[2]!.received.toString() === 'marked c\n', 'the third ran once a worker was free')
  await until(() => peers[0]!.received.toString().split('\n').length === 12 && peers[1]!.received.toString().split('\n').length === 12, 'the sessions finished')
})

t.test('sequentialQueueLength: past the bound the connection is not read, then it is read again', async (t) => {
  const gate = new Gate()
  const ran: string[] = []
  const { server, open } = await serveCore(t, { ...linesProtocol(), execution: 'sequential' }, linesHandlers(gate, ran), { sessionQueueLength: 4 })
  const peer = await open()
  peer.socket.write('block a\n')
  await until(() => gate.waiting === 1, 'the slow call running')
  // One line per write: each read carries a few at most, so the bound is met between reads.
  for (let i = 0; i < 40; i++) {
    peer.socket.write(`mark ${i}\n`)
    await new Promise(resolve => setImmediate(resolve))
  }
  await new Promise(resolve => setTimeout(resolve, 50))
  const framesBefore = server.connectionStats()[0]!.framesRead
  t.ok(framesBefore < 41, `reading stopped at the bound (${framesBefore} frames read of 41)`)
  gate.releaseAll()
  await until(() => peer.received.toString().split('\n').length === 42, 'every call answered')
  t.same(ran, ['block a', ...Array.from({ length: 40 }, (_, i) => `mark ${i}`)], 'all ran, in order')
})

t.test('sequential: a closed connection\'s waiting calls never run and end closed', async (t) => {
  const gate = new Gate()
  const ran: string[] = []
  const { server, open } = await serveCore(t, { ...linesProtocol(), execution: 'sequential' }, linesHandlers(gate, ran))
  const ends: CallOutcome['reason'][] = []
  server.onCallEnd((_call, outcome) => ends.push(outcome.reason))
  const peer = await open()
  peer.socket.write('block a\nmark b\nmark c\n')
  await until(() => gate.waiting === 1, 'the slow call running')
  peer.socket.destroy()
  await until(() => server.stats().connectionsOpen === 0, 'closed')
  gate.releaseAll()
  await until(() => ends.length === 3, 'three ends')
  t.same(ends.sort(), ['closed', 'closed', 'closed'])
  t.same(ran, ['block a'], 'the waiting calls never ran')
})

t.test('a group may run sequentially under a concurrent protocol, and a call that closes the connection stops the rest', async (t) => {
  const ran: string[] = []
  const server = new ProtocolServer(linesProtocol(), { logger: null })
  server.addRoutes('lines', {
    mark: (arg: string) => { ran.push(arg); return arg },
    quit: (_arg: string, ctx: CallContext) => { ctx.closeConnection(); return 'bye' }
  } as never, { execution: 'sequential' })
  t.throws(() => server.addRoutes('other', {}, { execution: 'serial' as never }), /execution must be/)
  const { port } = await server.listen(0)
  t.teardown(() => server.close({ graceMs: 0 }))
  const peer = new Peer(connect(port, '127.0.0.1'))
  t.teardown(() => peer.socket.destroy())
  peer.socket.write('mark 1\nquit\nmark 2\n')
  await until(() => peer.closed, 'closed after quit')
  t.equal(peer.received.toString(), '1\nbye\n')
  t.same(ran, ['1'])
})
