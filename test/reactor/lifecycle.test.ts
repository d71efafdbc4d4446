// The generic server's life on a toy protocol: listen and close, a
// graceful close that answers what is in flight and refuses what comes
// after, close() called during a read, the end of the grace period (peers
// that do not read cannot hold it), and nothing left behind: no timer of
// the server's clock, no socket or listener. The client's side: close()
// with calls pending, the server going away or half-closing under them,
// connecting where nothing listens, and a call aborted before it is sent.
import t from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { ErrorCode, ListenError, ProtocolServer, type CallContext } from '../../reactor/index.js'
import { CLOSED_ENDPOINT, FakeClock, Gate, activeResources, outcomes, rawServer, serveCore, taggedClient, tally, turns, until } from '../helpers/core-harness.js'
import { Peer } from '../helpers/socket-peer.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

const echo = (req: Buffer): Buffer => req

t.test('listen: port 0 binds a real port; a busy port rejects with a ListenError, a bad one with INVALID_ARGUMENT; close resolves', async (t) => {
  const server = new ProtocolServer(taggedProtocol(), { logger: null })
  server.addRoutes('tagged', { echo })
  const { port } = await server.listen(0, '127.0.0.1')
  t.ok(port > 0)
  t.equal(server.address()?.port, port)
  const rival = new ProtocolServer(taggedProtocol(), { logger: null })
  const error = await rival.listen(port, '127.0.0.1').catch((e: unknown) => e)
  t.ok(error instanceof ListenError)
  t.match(error, { code: 'EADDRINUSE', port, message: /cannot listen on 127\.0\.0\.1:\d+: address already in use/ })
  t.match(await rival.listen(70_000).catch((e: unknown) => e), { code: ErrorCode.INVALID_ARGUMENT })
  await rival.close()
  await server.close()
  t.equal(server.address(), null, 'no longer listening')
  const refused = connect(port, '127.0.0.1')
  const [failure] = await once(refused, 'error') as [NodeJS.ErrnoException]
  t.equal(failure.code, 'ECONNREFUSED')
})

t.test('graceful close: calls in flight are answered, requests after close() are refused shutdown, then connections end', async (t) => {
  const gate = new Gate()
  const { server, open } = await serveCore(t, taggedProtocol(), { block: gate.handler, echo }, { workers: 2, queueLength: 5 })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('block', 1, 'a'), taggedRequest('block', 2, 'b'), taggedRequest('block', 3, 'queued')]))
  await until(() => gate.waiting === 2 && server.stats().callsReceived === 3, 'two running, one queued')
  let closed = false
  const closing = server.close({ graceMs: 10_000 }).then(() => { closed = true })
  peer.socket.write(taggedRequest('echo', 4, 'late'))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'the late one refused')
  t.same(taggedAnswers(peer.received)[0]!.slice(0, 2), ['shutdown', 4])
  t.notOk(closed, 'close() waits for the calls in flight')
  gate.releaseAll()
  await until(() => gate.waiting === 1, 'the queued one runs within the grace')
  gate.releaseAll()
  await closing
  await peer.until(() => peer.closed, 'the connection ended')
  t.same(tally(peer.received), { ok: 3, shutdown: 1 }, 'four requests, four answers')
  t.equal(server.stats().connectionsOpen, 0)
})

t.test('close() during a read: the rest of that read is answered as usual, none refused', async (t) => {
  let server: ProtocolServer | null = null
  let closing: Promise<void> | null = null
  const quit = (req: Buffer): Buffer => { closing ??= server!.close({ graceMs: 10_000 }); return req }
  const core = await serveCore(t, taggedProtocol(), { quit, echo }, { queueLength: 100 })
  server = core.server
  const peer = await core.open()
  const count = 30
  const frames = [taggedRequest('quit', 0, 'q'), ...Array.from({ length: count - 1 }, (_, i) => taggedRequest('echo', i + 1, `e${i}`))]
  peer.socket.write(Buffer.concat(frames))
  await peer.until(() => peer.closed, 'the connection ended')
  await closing
  const answers = taggedAnswers(peer.received)
  t.equal(new Set(answers.map(a => a[1])).size, count, 'every request answered, once')
  t.same(tally(peer.received), { ok: count }, 'normally: none refused')
})

t.test('grace period over: queued calls are refused shutdown, running handlers see their signal abort, a peer that never reads cannot hold close() (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const signals: AbortSignal[] = []
  const stuck = (_req: Buffer, ctx: CallContext): Promise<Buffer> => { signals.push(ctx.signal); return new Promise(() => {}) }
  const { server, open } = await serveCore(t, taggedProtocol(), { block: stuck, sleep: (req: Buffer) => Buffer.alloc(Number(req.toString())) }, { clock, workers: 1, queueLength: 5, idleTimeoutMs: 0, abandonAfterMs: 0, maxMessageBytes: 65_537 })
  const waiter = await open()
  const deaf = await open()
  deaf.socket.pause()
  const bigAnswers = Array.from({ length: 200 }, (_, i) => taggedRequest('sleep', i, '60000'))
  deaf.socket.write(Buffer.concat(bigAnswers))
  waiter.socket.write(Buffer.concat([taggedRequest('block', 1, 'runs'), taggedRequest('block', 2, 'queued'), taggedRequest('block', 3, 'queued too')]))
  await until(() => signals.length === 1 && server.stats().callsReceived === 203, 'one running, two queued, the deaf one fed')
  clock.runDeferred()
  await until(() => server.connectionStats().some(c => c.queuedBytes + c.socketBufferedBytes > 0), 'answers the deaf one does not read')
  let closed = false
  const closing = server.close({ graceMs: 1000 }).then(() => { closed = true })
  await turns(5)
  clock.advance(999)
  await turns(5)
  t.notOk(closed, 'not before the grace is over')
  t.notOk(signals[0]!.aborted)
  clock.advance(1)
  await turns(5)
  await until(() => closed, 'close() resolved at the end of the grace')
  await closing
  t.ok(signals[0]!.aborted, 'the running handler\'s signal aborted')
  t.equal(server.stats().connectionsOpen, 0, 'every connection closed, the deaf one too')
  await waiter.until(() => waiter.closed, 'the waiter sees the end')
  t.same(tally(waiter.received), { shutdown: 2 }, 'the queued calls refused shutdown; the stuck one unanswered')
  t.equal(clock.pendingTimers, 0, 'no timer of the server\'s left on its clock')
})

t.test('nothing is left behind: sockets, listener and the server\'s timers are gone after close()', async (t) => {
  await turns(5)
  const before = activeResources()
  const clock = new FakeClock()
  const gate = new Gate()
  const server = new ProtocolServer(taggedProtocol(), { clock, logger: null, requestTimeoutMs: 5000 })
  server.addRoutes('tagged', { echo, block: gate.handler })
  const { port } = await server.listen(0, '127.0.0.1')
  const peers: Peer[] = []
  for (let i = 0; i < 5; i++) {
    const socket = connect(port, '127.0.0.1')
    await once(socket, 'connect')
    const peer = new Peer(socket)
    peers.push(peer)
    peer.socket.write(Buffer.concat([taggedRequest('echo', 1, 'x'), taggedRequest('block', 2, 'y')]))
  }
  await until(() => gate.waiting === 5, 'calls running')
  t.ok(clock.pendingTimers > 0, 'the server keeps timers while serving')
  const closing = server.close({ graceMs: 1000 })
  gate.releaseAll()
  await closing
  for (const peer of peers) await peer.until(() => peer.closed, 'closed by the server')
  for (const peer of peers) t.same(tally(peer.received), { ok: 2 })
  await turns(5)
  t.equal(clock.pendingTimers, 0, 'no timer left on the server\'s clock')
  const after = activeResources()
  for (const kind of ['TCPSocketWrap', 'TCPServerWrap', 'Timeout']) t.equal(after[kind] ?? 0, before[kind] ?? 0, `${kind}: as many as before`)
})

t.test('ProtocolClient: close() with calls pending rejects each exactly once; a server going away fails the calls in flight', async (t) => {
  const gate = new Gate()
  const { server, port } = await serveCore(t, taggedProtocol(), { block: gate.handler }, { idleTimeoutMs: 0 })
  const client = taggedClient(t, port, { retry: false })
  const pending = Array.from({ length: 10 }, (_, i) => client.call({ route: 'block', payload: `${i}` }))
  await until(() => gate.waiting === 10, 'ten in flight')
  void client.close()
  t.same(await outcomes(pending), { [ErrorCode.CLIENT_CLOSED]: 10 })
  t.same(await outcomes([client.call({ route: 'block' })]), { [ErrorCode.CLIENT_CLOSED]: 1 }, 'and calls after close()')
  gate.releaseAll()

  const other = taggedClient(t, port, { retry: false })
  const inFlight = Array.from({ length: 5 }, (_, i) => other.call({ route: 'block', payload: `${i}` }))
  await until(() => gate.waiting === 5, 'five in flight')
  const closing = server.close({ graceMs: 0 })
  t.same(await outcomes(inFlight), { [ErrorCode.CONNECTION_CLOSED]: 5 })
  await closing
  gate.releaseAll()
})

t.test('ProtocolClient: a server that half-closes (FIN) with calls pending fails every one of them, no deadline needed', async (t) => {
  let requests = 0
  const { port, sockets } = await rawServer(t, (_socket, chunk) => {
    for (let at = 0; at + 7 <= chunk.length; at += 2 + chunk.readUInt16BE(at)) requests++
  })
  const client = taggedClient(t, port, { retry: false, defaultTimeoutMs: 0 })
  const pending = Array.from({ length: 7 }, (_, i) => client.call({ route: 'echo', payload: `${i}` }))
  await until(() => requests === 7, 'all seven sent')
  sockets[0]!.end()
  t.same(await outcomes(pending), { [ErrorCode.CONNECTION_CLOSED]: 7 })
  await until(() => client.stats().connections.length === 0, 'the connection gone')
})

t.test('ProtocolClient: where nothing listens every call fails RPC_ERR_CONNECT_FAILED naming the endpoint, one after another and together', async (t) => {
  const client = taggedClient(t, 0, { endpoint: CLOSED_ENDPOINT, retry: false })
  for (let i = 0; i < 5; i++) {
    const error = await client.call({ route: 'echo' }, { timeoutMs: 10_000 }).catch((e: unknown) => e)
    t.match(error, { code: ErrorCode.CONNECT_FAILED, message: new RegExp(CLOSED_ENDPOINT) }, `attempt ${i + 1}`)
    t.equal(client.stats().connections.length, 0)
  }
  // Calls queued together on the failing connection all fail the same way.
  t.same(await outcomes(Array.from({ length: 5 }, () => client.call({ route: 'echo' }))), { [ErrorCode.CONNECT_FAILED]: 5 })
})

t.test('ProtocolClient: a call aborted in the turn it was made, on a ready connection, is dropped unsent', async (t) => {
  const { server, port } = await serveCore(t, taggedProtocol(), { echo }, { idleTimeoutMs: 0 })
  const client = taggedClient(t, port, { retry: false })
  t.equal(await client.call({ route: 'echo', payload: 'ready' }), 'ready', 'the connection is up')
  const controller = new AbortController()
  const aborted = client.call({ route: 'echo', payload: 'aborted' }, { signal: controller.signal })
  controller.abort()
  const plain = client.call({ route: 'echo', payload: 'plain' })
  t.same(await outcomes([aborted]), { [ErrorCode.CANCELLED]: 1 })
  t.equal(await plain, 'plain')
  t.equal(server.stats().callsReceived, 2, 'the server got the first and the last call, not the aborted one')
})
