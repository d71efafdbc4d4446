/**
 * The answer-byte budget of a read (transport/read-turns.ts,
 * `maxAnswerBytesPerRead`), over a fake ByteStream
 * (test/helpers/fake-stream.ts): once the frames of one read have queued
 * that many bytes on their connection, the rest of the read waits for the
 * next turn, however few frames that was; frames with small answers are
 * still split by the frame budget alone. Counts frames per turn, never time.
 */
import t from 'tap'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { DEFAULT_MAX_ANSWER_BYTES_PER_READ, DEFAULT_MAX_FRAMES_PER_READ, FramedConnection, type ConnectionOptions } from '../../transport/framed-connection.js'
import { FakeStream } from '../helpers/fake-stream.js'

/** A KRPC-framed frame: 4-byte big-endian length, then `body`. */
function frame (body: string): Buffer {
  const out = Buffer.alloc(4 + body.length)
  out.writeUInt32BE(body.length, 0)
  out.write(body, 4, 'latin1')
  return out
}

const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve))

/**
 * A connection whose every frame `N` is answered with `parts(N)` sends of
 * `partBytes` each (as a SUBSCRIBE of many channels is answered: one reply
 * per channel); counts the frames each turn decoded.
 */
function answering (options: Partial<ConnectionOptions>, parts: (body: string) => number, partBytes: number): { stream: FakeStream, connection: FramedConnection, frames: string[], sentBytes: () => number } {
  const stream = new FakeStream()
  const connection = new FramedConnection(stream, { framing: krpcFraming, coalesceMicrotasks: false, ...options })
  const frames: string[] = []
  let sent = 0
  connection.attach({
    onFrame: (buf, start, end) => {
      const body = buf.toString('latin1', start + 4, end)
      frames.push(body)
      for (let i = parts(body); i > 0; i--) {
        connection.send({ slices: [Buffer.alloc(partBytes, 0x70)], bytes: partBytes })
        sent += partBytes
      }
      return undefined
    },
    onClose: () => {}
  })
  return { stream, connection, frames, sentBytes: () => sent }
}

/** Pumps turns until `frames` holds `total`; the most frames any one turn decoded, and the turns taken. */
async function perTurn (stream: FakeStream, frames: string[], total: number): Promise<{ first: number, most: number, turns: number }> {
  stream.pump()
  const first = frames.length
  let most = first
  let turns = 1
  while (frames.length < total && turns < 10_000) {
    const before = frames.length
    await nextTurn()
    turns++
    most = Math.max(most, frames.length - before)
  }
  return { first, most, turns }
}

t.test('frames answered with 100 parts of 30 bytes: a read stops once they queued maxAnswerBytesPerRead, the rest on later turns, nothing lost', async t => {
  const { stream, connection, frames, sentBytes } = answering({}, () => 100, 30)
  const bodies = Array.from({ length: 200 }, (_, i) => `s${i}`)
  stream.peerSends(Buffer.concat(bodies.map(frame)))
  // 3,000 bytes a frame: the frame that takes the read past 64 KiB is the 22nd, handled whole.
  const perFrame = 100 * 30
  const expected = Math.ceil(DEFAULT_MAX_ANSWER_BYTES_PER_READ / perFrame)
  const { first, most, turns } = await perTurn(stream, frames, bodies.length)
  t.equal(first, expected, `the first turn decodes ${expected} frames, not the frame budget's ${DEFAULT_MAX_FRAMES_PER_READ}`)
  t.equal(most, expected, 'and no turn more')
  t.ok(turns >= Math.ceil(bodies.length / expected), `${turns} turns`)
  t.same(frames, bodies, 'every frame, in order')
  t.equal(sentBytes(), bodies.length * perFrame, 'every answer queued')
  t.equal(connection.probedBytes, 0, 'nothing kept at the end')
  t.ok(stream.reading, 'reading again')
})

t.test('one frame whose answers pass the budget is handled whole; the next waits for the next turn', async t => {
  const { stream, frames } = answering({ maxAnswerBytesPerRead: 1000 }, (body) => body === 'big' ? 50 : 1, 100)
  stream.peerSends(Buffer.concat(['big', 'a', 'b'].map(frame)))
  stream.pump()
  t.same(frames, ['big'], 'the first turn: the frame whose 5,000 bytes passed 1,000')
  await nextTurn()
  t.same(frames, ['big', 'a', 'b'], 'the next: the rest, 100 bytes each')
})

t.test('small answers: the frame budget alone splits the read, as before', async t => {
  const { stream, frames } = answering({}, () => 1, 10)
  stream.peerSends(Buffer.concat(Array.from({ length: 500 }, (_, i) => frame(`t${i}`))))
  const { first, most } = await perTurn(stream, frames, 500)
  t.equal(first, DEFAULT_MAX_FRAMES_PER_READ)
  t.equal(most, DEFAULT_MAX_FRAMES_PER_READ)
})

t.test('two connections in one turn: the one with many answers a frame decodes a budget\'s worth, the other its one frame', async t => {
  const heavy = answering({ maxAnswerBytesPerRead: 8192 }, () => 100, 30)
  const light = answering({ maxAnswerBytesPerRead: 8192 }, () => 1, 6)
  heavy.stream.peerSends(Buffer.concat(Array.from({ length: 1000 }, (_, i) => frame(`s${i}`))))
  light.stream.peerSends(frame('ping'))
  // The event loop delivers both reads in one turn.
  heavy.stream.pump()
  light.stream.pump()
  t.equal(heavy.frames.length, 3, 'the heavy peer: 3 frames (9,000 answer bytes) of its 1,000')
  t.equal(heavy.sentBytes(), 9000)
  t.same(light.frames, ['ping'], 'the light peer is served in the same turn')
  t.throws(() => answering({ maxAnswerBytesPerRead: 0 }, () => 0, 0), /maxAnswerBytesPerRead must be at least 1/)
  heavy.connection.destroy()
  light.connection.destroy()
})

t.test('Infinity turns the answer budget off (a client\'s connections)', async t => {
  const { stream, frames } = answering({ maxAnswerBytesPerRead: Infinity }, () => 100, 30)
  stream.peerSends(Buffer.concat(Array.from({ length: 100 }, (_, i) => frame(`s${i}`))))
  stream.pump()
  t.equal(frames.length, DEFAULT_MAX_FRAMES_PER_READ, 'only the frame budget')
})
