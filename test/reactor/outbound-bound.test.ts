// maxOutboundBytes judges what the kernel left of a connection's answers:
// past it the connection is not read until its peer takes enough (its
// requests wait in the kernel), so a peer that reads late but reads is
// served in full; one that takes nothing for SUSPENDED_GRACE_MS is closed
// (test/reactor/limits.test.ts and test/reactor/hostile.test.ts have those).
import t from 'tap'
import { serveCore, until } from '../helpers/core-harness.js'
import { taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

/** Answers of `size` bytes (a tagged answer carries at most 65 530). */
const big = (req: Buffer): Buffer => Buffer.alloc(Number(req.toString()), 0x62)
const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

t.test('past the bound a peer that does not read yet is not read either; once it reads, every answer arrives and it stays open', async (t) => {
  const { server, open } = await serveCore(t, taggedProtocol(), { sleep: big }, { maxOutboundBytes: 256 * 1024, idleTimeoutMs: 0, maxMessageBytes: 65_537 })
  const peer = await open()
  peer.socket.pause()
  let written = 0
  // Batches of 4 requests (240 KB of answers each), until the server stops reading them.
  for (let batch = 0; batch < 40 && server.stats().callsReceived === written; batch++) {
    peer.socket.write(Buffer.concat(Array.from({ length: 4 }, () => taggedRequest('sleep', written++, '60000'))))
    for (let i = 0; i < 10 && server.stats().callsReceived < written; i++) await sleep(5)
  }
  const read = server.stats().callsReceived
  t.ok(read < written, `the server stopped reading: ${read} of ${written} requests read`)
  t.notOk(peer.closed, 'not closed: it has not had the time to read')
  peer.socket.resume()
  await until(() => taggedAnswers(peer.received).length === written, 'every answer, once it reads')
  t.same(taggedAnswers(peer.received).map(a => a[1]), Array.from({ length: written }, (_, i) => i), 'in order')
  t.notOk(peer.closed, 'kept open')
  t.equal(server.stats().connectionsOpen, 1)
})
