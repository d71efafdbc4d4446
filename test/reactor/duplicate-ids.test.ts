// A request whose id is already in flight: closed by default (a broken
// peer), answered too with `duplicateIds: 'allow'` (DNS over TCP lets a
// client repeat an id); and the warnings peers cause with bad data are
// rate-limited like the others.
import t from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import type { ServerProtocol } from '../../codec/protocol.js'
import type { Logger } from '../../reactor/logger.js'
import { ProtocolServer } from '../../reactor/server.js'
import { FakeClock } from '../../scheduling/clock.js'
import { Peer, servePeers } from '../helpers/socket-peer.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

const handlers = {
  // Answers once both calls with id 7 are in flight.
  sleep: (req: Buffer) => new Promise<Buffer>(resolve => setTimeout(() => resolve(req), 30)),
  echo: (req: Buffer) => req
}

t.test('by default a duplicate id in flight closes the connection, after the answers already queued', async t => {
  const { open, server } = await servePeers(t, taggedProtocol(), 'tagged', handlers, { logger: null })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('echo', 1, 'a'), taggedRequest('sleep', 7, 'x'), taggedRequest('sleep', 7, 'y')]))
  await peer.until(() => peer.closed, 'the close')
  t.same(taggedAnswers(peer.received), [['ok', 1, 'a']])
  t.equal(server.stats().badFrames, 1)
})

t.test("duplicateIds: 'allow' answers both calls, each with its id", async t => {
  const protocol: ServerProtocol<Buffer, Buffer> = { ...taggedProtocol(), duplicateIds: 'allow' }
  const { open, server } = await servePeers(t, protocol, 'tagged', handlers, { logger: null })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('sleep', 7, 'x'), taggedRequest('sleep', 7, 'y'), taggedRequest('echo', 7, 'z')]))
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'three answers')
  const answers = taggedAnswers(peer.received)
  t.same(answers.map(a => a[1]), [7, 7, 7])
  t.same(answers.map(a => a[2]).sort(), ['x', 'y', 'z'])
  t.equal(peer.closed, false)
  t.equal(server.stats().callsInFlight, 0, 'every call released')
  t.throws(() => new ProtocolServer({ ...taggedProtocol(), duplicateIds: 'maybe' as 'allow' }), /duplicateIds/)
})

t.test('bad-data warnings are rate-limited: many bad peers, one line per interval', async t => {
  const clock = new FakeClock()
  const warnings: string[] = []
  const logger: Logger = { error: () => {}, warn: (m) => { warnings.push(m) }, info: () => {}, debug: () => {} }
  const server = new ProtocolServer(taggedProtocol(), { clock, logger })
  server.addRoutes('tagged', handlers)
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 50 }))
  const peers: Peer[] = []
  for (let i = 0; i < 20; i++) {
    const socket = connect(port, '127.0.0.1')
    await once(socket, 'connect')
    const peer = new Peer(socket)
    peers.push(peer)
    // Shorter than the tagged header: decodeHead refuses it.
    peer.socket.write(Buffer.from([0, 2, 0, 0]))
  }
  for (const peer of peers) await peer.until(() => peer.closed, 'closed')
  t.equal(server.stats().badFrames, 20, 'twenty bad frames')
  t.equal(warnings.filter(w => w.includes('received bad data')).length, 1, 'one warning line in the interval')
  clock.advance(10_000)
  const late = new Peer(connect(port, '127.0.0.1'))
  await once(late.socket, 'connect')
  late.socket.write(Buffer.from([0, 2, 0, 0]))
  await late.until(() => late.closed, 'closed')
  const lines = warnings.filter(w => w.includes('received bad data'))
  t.equal(lines.length, 2, 'a new interval, a new line')
  t.match(lines[1], /and 19 more like it/)
})
