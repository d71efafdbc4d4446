// maxAnswerBytesPerRead on a real loopback server (the lines toy protocol
// with streamed parts): a peer pipelining requests that are each answered
// with 100 parts (as a SUBSCRIBE of 100 channels is) is decoded a budget's
// worth of answers a turn, not 64 requests' worth, and a peer beside it is
// served meanwhile. Counts the parts produced between two turns of the
// event loop (server and test share the process), never time.
import t from 'tap'
import type { ServerProtocol } from '../../codec/protocol.js'
import type { CallContext } from '../../reactor/index.js'
import { serveCore, until } from '../helpers/core-harness.js'
import { linesProtocol } from '../helpers/toy-protocols.js'

// The lines protocol with streamed parts (`+part\n`).
function partLines (): ServerProtocol<string, string | undefined> {
  return { ...linesProtocol(), encodePart: (_call, part, out) => { out.append(Buffer.from(`+${String(part)}\n`)) } }
}

const PARTS = 99
const PART = 'p'.repeat(26)

t.test('a pipelined flood of requests with 100 answers each is decoded a budget\'s worth a turn; a ping beside it is answered before the flood ends', async t => {
  let parts = 0
  let many = 0
  let manyAtPing = -1
  const { open } = await serveCore(t, partLines(), {
    many: (_arg: string, ctx: CallContext) => {
      many++
      for (let i = 0; i < PARTS; i++) { ctx.write(PART); parts++ }
      return 'done'
    },
    ping: () => { manyAtPing = many; return 'pong' }
  }, { maxAnswerBytesPerRead: 4096 })
  const flood = await open()
  const good = await open()
  // Parts produced between two turns of the event loop.
  const perTurn: number[] = []
  let last = 0
  let ticking = true
  const tick = (): void => {
    perTurn.push(parts - last)
    last = parts
    if (ticking) setImmediate(tick)
  }
  setImmediate(tick)
  const requests = 300
  flood.socket.write('many\n'.repeat(requests))
  good.socket.write('ping\n')
  try {
    await good.until(() => good.text === 'pong\n', 'the pong')
    await flood.until(() => flood.text.split('done\n').length - 1 === requests, 'every flood answer')
  } finally {
    ticking = false
  }
  const most = Math.max(...perTurn)
  // 28 bytes a part: the budget of 4,096 is passed by a read's 2nd request (5,600 bytes); a turn
  // decodes at most the rest kept from the last read, one more read if that ended it, and a new read.
  t.ok(most <= 3 * 2 * (PARTS + 1), `at most 3 reads of 2 requests a turn: ${most} parts (the frame budget alone: 64 requests, 6,336 parts)`)
  // Both peers' bytes are in the kernel before the server's first poll: the ping is read in its first or second turn.
  t.ok(manyAtPing >= 0 && manyAtPing <= 2 * 3 * 2, `the ping was answered after ${manyAtPing} of the ${requests} flood requests (the frame budget alone: 64)`)
  t.equal(flood.text.split('\n').filter(l => l === `+${PART}`).length, requests * PARTS, 'every part, once')
  t.equal(parts, requests * PARTS)
})

t.test('a read budget below 1 is refused when the server is made, not at its first connection', async t => {
  const { ProtocolServer } = await import('../../reactor/index.js')
  for (const options of [{ maxAnswerBytesPerRead: 0 }, { maxFramesPerRead: 0 }, { maxAnswerBytesPerRead: Number.NaN }]) {
    t.throws(() => new ProtocolServer(partLines(), { logger: null, ...options }), /must be at least 1/, JSON.stringify(options))
  }
  const server = new ProtocolServer(partLines(), { logger: null, maxAnswerBytesPerRead: Infinity, maxFramesPerRead: Infinity })
  t.ok(server, 'Infinity: no budget')
})
