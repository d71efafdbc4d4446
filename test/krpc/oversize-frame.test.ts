// KRPC, as the toy protocols (test/reactor/limits.test.ts): a frame over
// maxMessageBytes is refused at its length prefix, and that is a bad frame:
// counted in badFrames and logged (rate-limited), as a malformed one is.
import t from 'tap'
import { startServer } from '../helpers/reactor-harness.js'
import { negotiatedRaw } from '../helpers/krpc-peers.js'

t.test('KRPC: a frame over maxMessageBytes, refused at its prefix, is counted as a bad frame and logged', async (t) => {
  const warnings: string[] = []
  const logger = { error: (m: string) => { warnings.push(m) }, warn: (m: string) => { warnings.push(m) }, info: () => {}, debug: () => {} }
  const { server, port } = await startServer(t, { maxMessageBytes: 4096, logger })
  const raw = await negotiatedRaw(port)
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(1_000_000, 0)
  raw.write(prefix)
  await raw.closed
  t.equal(server.stats().badFrames, 1, 'one bad frame')
  t.equal(warnings.filter(w => /4096/.test(w)).length, 1, 'one warning, naming the limit')
})
