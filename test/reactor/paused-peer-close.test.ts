// A connection whose reading is paused (ConnectionHandle.pauseReading, the
// outbound budget) is not polled for reading, so its peer's FIN or RST went
// unseen: the connection and its partial frame stayed. The scan's probe
// read (FramedConnection.probeRead) sees the close within a scan period, and the
// bytes it reads from a peer that stays are set aside, counted in the
// inbound budget, and decoded first when reading resumes.
import t from 'tap'
import { once } from 'node:events'
import tls from 'node:tls'
import { ProtocolServer, type CallContext, type ConnectionHandle } from '../../reactor/index.js'
import { FakeClock, serveCore, turns, until } from '../helpers/core-harness.js'
import { Peer } from '../helpers/socket-peer.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'
import { withCerts } from '../helpers/tls-certs.js'

const echo = (req: Buffer): Buffer => req
/** A frame's payload whose bytes say where they are, so a lost or reordered byte shows. */
const pattern = (bytes: number): Buffer => Buffer.from(Array.from({ length: bytes }, (_, i) => i % 251))

t.test('held connections whose peers close (FIN, RST) are closed at the next scan and leave the inbound budget; one that stays gets its frame answered intact (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const handles = new Map<string, ConnectionHandle>()
  let release = (): void => {}
  const released = new Promise<void>((resolve) => { release = resolve })
  // Holds the connection once the test has seen its partial frame read.
  const hold = async (req: Buffer, ctx: CallContext): Promise<Buffer> => {
    await released
    ctx.connection.pauseReading()
    handles.set(ctx.connection.remoteAddress, ctx.connection)
    return req
  }
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: hold }, {
    clock, maxInboundBufferedBytes: 250_000, maxMessageBytes: 65_537, idleTimeoutMs: 0, frameTimeoutMs: 0
  })
  const payload = pattern(60_000)
  const frame = taggedRequest('echo', 7, payload)
  const peers: Peer[] = []
  for (let i = 0; i < 3; i++) {
    const peer = await open()
    // The hold and the first 30 000 bytes of a frame in one write: read together.
    peer.socket.write(Buffer.concat([taggedRequest('block', 1, 'held'), frame.subarray(0, 30_000)]))
    peers.push(peer)
  }
  await until(() => server.connectionStats().filter(c => c.bytesRead === 11 + 30_000).length === 3, '30 000 bytes of a frame on each')
  release()
  for (const peer of peers) await peer.until(() => taggedAnswers(peer.received).length === 1, 'the hold answered')
  t.equal(handles.size, 3, 'three held')
  // Sent while held: it waits in the kernel, in front of the close.
  for (const peer of peers) peer.socket.write(frame.subarray(30_000, 40_000))
  await turns(5)
  const [finPeer, rstPeer, stays] = peers as [Peer, Peer, Peer]
  finPeer.socket.end()
  rstPeer.socket.resetAndDestroy()
  await turns(5)
  t.equal(server.stats().connectionsOpen, 3, 'not seen before a scan: reading is paused')
  clock.advance(1000)
  await until(() => server.stats().connectionsOpen === 1, 'the two whose peers left closed')
  t.notOk(stays.closed, 'the one that stays is kept')
  // The budget counts what decoders hold (60 005 for each partial frame
  // here) and what probes set aside (10 000 each): 70 005 for the one that
  // stays. A newcomer's 65 007 fit in 250 000; they would not if the two
  // closed connections' 140 010 were still counted.
  const newcomer = await open()
  newcomer.socket.write(taggedRequest('echo', 9, pattern(65_000)).subarray(0, 60_000))
  await until(() => server.connectionStats().some(c => c.bytesRead >= 60_000), 'the newcomer\'s bytes read')
  await turns(5)
  t.equal(server.stats().inboundBudgetClosed, 0, 'nobody closed by the budget')
  t.notOk(newcomer.closed)
  const handle = handles.get(`127.0.0.1:${stays.socket.localPort}`)!
  handle.resumeReading()
  stays.socket.write(frame.subarray(40_000))
  await stays.until(() => taggedAnswers(stays.received).length === 2, 'the frame answered')
  const answer = taggedAnswers(stays.received)[1]!
  t.same([answer[0], answer[1]], ['ok', 7])
  t.ok(stays.received.subarray(stays.received.length - payload.length).equals(payload), 'every byte, in order')
})

t.test('a held peer that sent more than a probe sets aside is read no further until resumed; its bytes then arrive whole', async (t) => {
  const clock = new FakeClock()
  let handle: ConnectionHandle | null = null
  const hold = (req: Buffer, ctx: CallContext): Buffer => { handle = ctx.connection; ctx.connection.pauseReading(); return req }
  const { server, open } = await serveCore(t, taggedProtocol(), { echo, block: hold }, { clock, maxMessageBytes: 65_537, idleTimeoutMs: 0, frameTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write(taggedRequest('block', 1, 'held'))
  await peer.until(() => taggedAnswers(peer.received).length === 1, 'held')
  const frames: Buffer[] = []
  for (let i = 0; i < 40; i++) frames.push(taggedRequest('echo', 100 + i, pattern(10_000)))
  peer.socket.write(Buffer.concat(frames))
  for (let i = 0; i < 5; i++) {
    clock.advance(1000)
    await turns(5)
  }
  const read = server.connectionStats()[0]!.bytesRead
  t.equal(read, 7 + 4, 'the held connection read nothing into frames')
  t.equal(taggedAnswers(peer.received).length, 1, 'no frame decoded while held')
  handle!.resumeReading()
  await peer.until(() => taggedAnswers(peer.received).length === 41, 'every frame answered once resumed')
  t.same(taggedAnswers(peer.received).slice(1).map(a => a[1]), frames.map((_, i) => 100 + i), 'in order')
  // Each answer echoes its request: the answers after the first are the requests' bytes, status 0 in place of the route.
  const echoed = peer.received.subarray(11)
  t.equal(echoed.length, 40 * 10_007)
  t.ok(frames.every((frame, i) => echoed.subarray(i * 10_007 + 7, (i + 1) * 10_007).equals(frame.subarray(7))), 'payloads whole')
})

t.test('over TLS (the data-event path): a held connection whose peer closes is closed at the next scan (FakeClock)', async (t) => {
  withCerts(t, (certs) => { t.test('held, then its peer ends', async (t) => {
    const { serverKey: key, serverCert: cert, ca } = certs
    const clock = new FakeClock()
    const server = new ProtocolServer(taggedProtocol(), { logger: null, clock, tls: { key, cert }, idleTimeoutMs: 0, frameTimeoutMs: 0, maxMessageBytes: 65_537 })
    server.addRoutes('tagged', { echo, block: (req: Buffer, ctx: CallContext) => { ctx.connection.pauseReading(); return req } })
    const { port } = await server.listen(0, '127.0.0.1')
    t.teardown(() => server.close({ graceMs: 0 }))
    const socket = tls.connect({ port, host: '127.0.0.1', ca, servername: 'localhost' })
    const peer = new Peer(socket as never)
    await once(socket, 'secureConnect')
    socket.write(Buffer.concat([taggedRequest('block', 1, 'held'), taggedRequest('echo', 2, pattern(60_000)).subarray(0, 20_000)]))
    await peer.until(() => taggedAnswers(peer.received).length === 1, 'held')
    socket.write(taggedRequest('echo', 2, pattern(60_000)).subarray(20_000, 50_000))
    await turns(5)
    socket.end()
    await turns(5)
    clock.advance(1000)
    await until(() => server.stats().connectionsOpen === 0, 'closed once its peer left')
    t.pass('closed')
  }) })
})
