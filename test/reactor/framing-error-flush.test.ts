// A frame the framing refuses (an oversized length prefix) in the same read
// as a good request before it: the good request's answer still goes out,
// then the connection closes. Before, the read's queued answers were
// dropped with the connection.
import t from 'tap'
import { servePeers } from '../helpers/socket-peer.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

t.test('answers queued in the read of an oversized prefix are sent before the close', async t => {
  const { open } = await servePeers(t, taggedProtocol(), 'tagged', { echo: (req: Buffer) => req }, { logger: null })
  const peer = await open()
  const oversized = Buffer.from([0x07, 0xd0]) // announces 2000 bytes; the protocol takes 1024
  peer.socket.write(Buffer.concat([taggedRequest('echo', 1, 'a'), taggedRequest('echo', 2, 'b'), oversized]))
  await peer.until(() => peer.closed, 'the close')
  t.same(taggedAnswers(peer.received), [['ok', 1, 'a'], ['ok', 2, 'b']], 'both answers, then the close')
})
