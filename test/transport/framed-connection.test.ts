/**
 * The framed connection over a fake ByteStream (test/helpers/fake-stream.ts):
 * frames split at every byte, writes the kernel takes in part, would-block
 * then writable, the peer's end and reset, set-up with bytes behind its last
 * frame, the reasons reading stops, and a probe read that sees the peer go.
 */
import t from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { ScanFraming } from '../../codec/frame-decoder.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import type { HandshakeStep } from '../../codec/protocol.js'
import { DEFAULT_MAX_FRAMES_PER_READ, FramedConnection, PROBE_BYTES, type ConnectionOptions } from '../../transport/framed-connection.js'
import { FakeStream, settle } from '../helpers/fake-stream.js'

/** A KRPC-framed frame: 4-byte big-endian length, then `body`. */
function frame (body: string): Buffer {
  const out = Buffer.alloc(4 + body.length)
  out.writeUInt32BE(body.length, 0)
  out.write(body, 4, 'latin1')
  return out
}

/** Frames ended by '\n', found by scanning. */
const lineFraming: ScanFraming = {
  scanner: () => ({
    scan: (buf, start, end) => {
      const at = buf.indexOf(10, start)
      return at < 0 || at >= end ? 0 : at - start + 1
    },
    reset: () => {}
  })
}

interface Opened {
  stream: FakeStream
  connection: FramedConnection
  /** Each frame delivered, copied. */
  frames: string[]
  closes: Array<RpcError | undefined>
}

function open (options: Partial<ConnectionOptions> = {}, onFrame?: (body: string) => boolean | undefined): Opened {
  const stream = new FakeStream()
  const connection = new FramedConnection(stream, { framing: krpcFraming, coalesceMicrotasks: false, ...options })
  const frames: string[] = []
  const closes: Array<RpcError | undefined> = []
  const prefix = options.framing === lineFraming ? 0 : 4
  connection.attach({
    onFrame: (buf, start, end) => {
      const body = buf.toString('latin1', start + prefix, end)
      frames.push(body)
      return onFrame?.(body)
    },
    onClose: (error) => { closes.push(error) }
  })
  return { stream, connection, frames, closes }
}

const BODIES = ['a', 'hello', 'x'.repeat(300), '', 'end']

t.test('length-prefixed frames split at every byte, and at every pair of bytes, arrive whole and in order', async t => {
  const wire = Buffer.concat(BODIES.filter(b => b !== '').map(frame))
  const expected = BODIES.filter(b => b !== '')
  let runs = 0
  for (let cut = 0; cut <= wire.length; cut++) {
    const { stream, frames, closes } = open()
    stream.peerSends(wire, cut)
    stream.pump()
    if (frames.join('|') !== expected.join('|') || closes.length > 0) t.fail(`split at ${cut}: ${frames.join('|')}`)
    runs++
  }
  // Two cuts, around the frame boundaries (where a prefix splits).
  for (let a = 0; a < 20; a++) {
    for (let b = a; b <= wire.length; b += 7) {
      const { stream, frames } = open()
      stream.peerSends(wire, a, b)
      stream.pump()
      if (frames.join('|') !== expected.join('|')) t.fail(`split at ${a}, ${b}: ${frames.join('|')}`)
      runs++
    }
  }
  const { stream, frames, connection } = open()
  stream.peerSends(wire, ...Array.from({ length: wire.length }, (_, i) => i))
  stream.pump()
  t.same(frames, expected, 'one byte per read')
  t.equal(connection.reads, wire.length)
  t.equal(connection.framesRead, expected.length)
  t.equal(connection.stats().bytesRead, wire.length)
  t.ok(runs > wire.length, `${runs} splits`)
})

t.test('scanned frames split at every byte arrive whole and in order', async t => {
  const lines = ['GET a', 'SET b 1', 'x'.repeat(200), 'QUIT']
  const wire = Buffer.from(lines.map(l => l + '\n').join(''), 'latin1')
  for (let cut = 0; cut <= wire.length; cut++) {
    const { stream, frames } = open({ framing: lineFraming })
    stream.peerSends(wire, cut)
    stream.pump()
    if (frames.join('|') !== lines.map(l => l + '\n').join('|')) t.fail(`split at ${cut}`)
  }
  const { stream, frames, connection } = open({ framing: lineFraming })
  stream.peerSends(wire.subarray(0, 3))
  stream.pump()
  t.ok(connection.hasPartialFrame, 'a partial line is a partial frame')
  t.equal(connection.partialFrameBytes, 3)
  stream.peerSends(wire.subarray(3))
  stream.pump()
  t.equal(frames.length, lines.length)
  t.notOk(connection.hasPartialFrame)
})

t.test('a frame view stays valid after later reads (the stream never reuses a read\'s bytes)', async t => {
  const stream = new FakeStream()
  const connection = new FramedConnection(stream, { framing: krpcFraming })
  const kept: Buffer[] = []
  connection.attach({ onFrame: (buf, start, end) => { kept.push(buf.subarray(start, end)) }, onClose: () => {} })
  stream.peerSends(frame('first'))
  stream.pump()
  stream.peerSends(frame('second'))
  stream.pump()
  t.same(kept.map(b => b.toString('latin1', 4)), ['first', 'second'])
})

t.test('a write the kernel takes in part: the rest waits in the stream, later frames wait for writable, all go out in order', async t => {
  const { stream, connection } = open({ maxOutboundBytes: 1 << 20 })
  const drains: number[] = []
  connection.onDrain = () => drains.push(connection.drains)
  stream.kernelRoom = 6
  const sent: Array<RpcError | undefined> = []
  t.ok(connection.send({ slices: [frame('one')], bytes: 7, onSent: (e) => sent.push(e) }))
  t.equal(stream.writableLength, 1, 'the kernel took 6 of 7 bytes')
  t.ok(connection.isBackedUp, 'write() said wait for writable')
  t.equal(connection.outboundBytes, 1)
  connection.send({ slices: [frame('two')], bytes: 7 })
  connection.send({ slices: [frame('three'), Buffer.from('')], bytes: 9, onSent: (e) => sent.push(e) })
  t.equal(stream.writes.length, 1, 'nothing more written while waiting')
  t.equal(connection.outboundBytes, 1 + 7 + 9)
  t.ok(connection.isBusy)
  stream.makeRoom(1)
  t.equal(drains.length, 1, 'writable: the owner hears of it')
  t.equal(stream.writes.length, 2, 'the waiting frames go out in one write')
  t.equal(stream.writableLength, 16, 'and the kernel is full again')
  stream.makeRoom(100)
  t.same(stream.received(), Buffer.concat([frame('one'), frame('two'), frame('three')]))
  t.same(sent, [undefined, undefined])
  t.notOk(connection.isBusy)
  t.equal(connection.stats().bytesWritten, 23)
  t.equal(connection.stats().partialWrites, 2)
  t.equal(connection.stats().drainWaits, 2)
})

t.test('frames of one read are answered in one write; a large transfer goes out as one writev', async t => {
  const { stream, connection } = open({}, () => {
    connection.send({ slices: [frame('ok')], bytes: 6 })
    return true
  })
  stream.peerSends(Buffer.concat([frame('a'), frame('b'), frame('c')]))
  stream.pump()
  t.equal(stream.writes.length, 1, 'three answers, one write')
  t.equal(stream.writes[0]!.length, 18)
  const big = Buffer.alloc(70 * 1024, 1)
  let done: RpcError | undefined | null = null
  connection.send({ slices: [frame('head'), big], bytes: 8 + big.length, onSent: (e) => { done = e } })
  await settle()
  t.equal(stream.writes.length, 2)
  t.equal(done, undefined, 'sent once the kernel took the caller\'s slice')
})

t.test('the peer\'s end, error and reset close the connection once, with the reason', async t => {
  const ended = open()
  ended.stream.peerSends(frame('last'))
  ended.stream.peerEnds()
  ended.stream.pump()
  t.same(ended.frames, ['last'], 'what came before the end is read')
  t.equal(ended.closes.length, 1)
  t.equal(ended.closes[0]?.code, ErrorCode.CONNECTION_CLOSED)
  t.match(ended.closes[0]?.message, /closed by peer/)
  t.ok(ended.stream.closed, 'the stream is closed')
  let late: RpcError | undefined
  ended.connection.send({ slices: [frame('late')], bytes: 8, onSent: (e) => { late = e } })
  t.equal(late?.code, ErrorCode.CONNECTION_CLOSED, 'a send after the close is dropped')

  const reset = open()
  reset.stream.peerResets()
  reset.stream.pump()
  t.equal(reset.closes.length, 1)
  t.match(reset.closes[0]?.message, /socket error: read ECONNRESET/)

  const ours = open()
  ours.connection.reset(new RpcError(ErrorCode.CONNECTION_CLOSED, 'reset by us'))
  t.ok(ours.stream.wasReset, 'an RST, not a FIN')
  t.equal(ours.closes.length, 1)
  t.match(ours.closes[0]?.message, /reset by us/)
  ours.connection.destroy()
  t.equal(ours.closes.length, 1, 'onClose once')
})

t.test('endAfterFlush writes what is queued, ends the stream, then closes; later sends are dropped', async t => {
  const { stream, connection, closes } = open()
  stream.kernelRoom = 3
  connection.send({ slices: [frame('bye')], bytes: 7 })
  connection.endAfterFlush()
  let late: RpcError | undefined
  connection.send({ slices: [frame('late')], bytes: 8, onSent: (e) => { late = e } })
  t.equal(late?.code, ErrorCode.CONNECTION_CLOSED)
  t.ok(stream.ended)
  t.equal(closes.length, 0, 'open until the held bytes are out')
  stream.makeRoom(100)
  await settle()
  t.same(stream.received(), frame('bye'))
  t.equal(closes.length, 1)
})

t.test('set-up: the bytes behind the handshake\'s last frame are the first regular frames; sends made meanwhile follow its reply', async t => {
  for (const asynchronous of [false, true]) {
    const { stream, connection, frames } = open()
    const seen: string[] = []
    const step = (body: string): HandshakeStep<string> => body === 'hello'
      ? { send: [[frame('welcome')]], done: 'session' }
      : { send: [[frame('more?')]] }
    const result = connection.handshake<string>({
      preambleBytes: 3,
      checkPreamble: (bytes) => bytes.toString() === 'HRP' ? null : new RpcError(ErrorCode.NEGOTIATION_FAILED, 'bad preamble'),
      maxFrameBytes: 64,
      onFrame: (f) => {
        seen.push(f.toString('latin1', 4))
        const s = step(f.toString('latin1', 4))
        return asynchronous ? new Promise(resolve => setTimeout(() => resolve(s), 5)) : s
      }
    })
    connection.send({ slices: [frame('queued')], bytes: 10 })
    const wire = Buffer.concat([Buffer.from('HRP'), frame('hi'), frame('hello'), frame('call1'), frame('call2')])
    // The preamble split, the handshake's last frame and the first call in one read, the next call later.
    stream.peerSends(wire, 2, 10, wire.length - 9)
    stream.pump()
    t.equal(await result, 'session', `${asynchronous ? 'asynchronous' : 'synchronous'} steps`)
    await settle()
    stream.pump()
    t.same(seen, ['hi', 'hello'], 'the handshake saw its frames')
    t.same(frames, ['call1', 'call2'], 'the bytes behind them reached the handler')
    t.same(stream.received(), Buffer.concat([frame('more?'), frame('welcome'), frame('queued')]), 'the held send follows the reply')
    t.equal(connection.framesRead, 4, 'set-up frames counted')
    t.ok(stream.reading, 'reading again after the asynchronous step')
  }
})

t.test('set-up: a bad preamble closes without a reply; a refusing step replies, then ends; a frame over its limit fails it', async t => {
  const bad = open()
  const refused = bad.connection.handshake({ preambleBytes: 3, checkPreamble: () => new RpcError(ErrorCode.NEGOTIATION_FAILED, 'not ours'), onFrame: () => ({}) })
  bad.stream.peerSends(Buffer.from('GET / HTTP/1.1\r\n'))
  bad.stream.pump()
  await t.rejects(refused, { code: ErrorCode.NEGOTIATION_FAILED })
  t.equal(bad.stream.writes.length, 0)
  t.equal(bad.closes[0]?.message, 'not ours')

  const no = open()
  const failed = no.connection.handshake({ onFrame: () => ({ send: [[frame('no')]], error: new RpcError(ErrorCode.NEGOTIATION_FAILED, 'who?') }) })
  no.stream.peerSends(Buffer.concat([frame('me'), frame('call')]))
  no.stream.pump()
  await t.rejects(failed, { code: ErrorCode.NEGOTIATION_FAILED })
  await settle()
  t.same(no.stream.received(), frame('no'))
  t.ok(no.stream.ended)
  t.same(no.frames, [], 'nothing after the refused frame is a call')
  t.equal(no.closes[0]?.code, ErrorCode.NEGOTIATION_FAILED, 'the refusal is the reason, not the close that follows')

  const big = open()
  const tooBig = big.connection.handshake({ maxFrameBytes: 16, onFrame: () => ({}) })
  big.stream.peerSends(frame('x'.repeat(100)))
  big.stream.pump()
  await t.rejects(tooBig, { code: ErrorCode.FRAME_TOO_LARGE })

  const gone = open()
  let aborted = 0
  const closed = gone.connection.handshake({ onFrame: () => ({}), abort: () => { aborted++ } })
  gone.stream.peerEnds()
  gone.stream.pump()
  await t.rejects(closed, { code: ErrorCode.CONNECTION_CLOSED })
  t.equal(aborted, 1)
})

t.test('reading stops for any reason and resumes only when none holds it', async t => {
  const { stream, connection, frames } = open({ maxOutboundBytes: 10, onReadingSuspended: () => {} })
  connection.pauseReading()
  t.notOk(stream.reading)
  connection.holdReading()
  // Suspended: the kernel leaves more than the bound.
  stream.kernelRoom = 0
  connection.send({ slices: [frame('x'.repeat(8))], bytes: 12 })
  t.notOk(connection.isReadingSuspended, 'one frame is always taken')
  connection.send({ slices: [frame('y')], bytes: 5 })
  t.ok(connection.isReadingSuspended, 'suspended past the bound')
  t.ok(connection.isReadingPaused && connection.isReadingHeld)
  stream.peerSends(frame('req'))
  await settle()
  t.same(frames, [], 'nothing read')
  connection.resumeReading()
  t.notOk(stream.reading, 'still held and suspended')
  stream.makeRoom(1000)
  t.notOk(connection.isReadingSuspended, 'the peer took enough')
  t.notOk(stream.reading, 'still held')
  connection.resumeReading()
  connection.releaseReading()
  t.ok(stream.reading, 'no reason left')
  await settle()
  t.same(frames, ['req'])
  // Either order of release: only the last starts reading.
  const releases = [() => connection.resumeReading(), () => connection.releaseReading()]
  for (const [first, last] of [[0, 1], [1, 0]] as const) {
    connection.pauseReading()
    connection.holdReading()
    releases[first]!()
    t.notOk(stream.reading)
    releases[last]!()
    t.ok(stream.reading)
  }
})

t.test('a probe read of a paused connection sees the peer\'s end; what it read is set aside and counted', async t => {
  const budget: number[] = []
  const inboundBudget = { update: (_c: unknown, held: number) => { budget.push(held) } }
  const { stream, connection, frames, closes } = open({ inboundBudget: inboundBudget as never })
  connection.holdReading()
  stream.peerSends(Buffer.concat([frame('a'), frame('partial').subarray(0, 6)]))
  stream.peerEnds()
  await settle()
  t.equal(closes.length, 0, 'a paused stream sees nothing')
  t.ok(connection.probeRead())
  t.ok(stream.reading, 'the probe reads')
  await settle()
  t.same(frames, [], 'what the probe read is not decoded')
  t.equal(closes.length, 1, 'the end seen')
  t.match(closes[0]?.message, /closed by peer/)
  t.ok(budget.includes(11), 'the set-aside bytes were counted')
  t.equal(budget[budget.length - 1], 0, 'and let go at the close')
})

t.test('a probe read sets aside what the peer sent; reading resumes with it, in order', async t => {
  const { stream, connection, frames } = open()
  connection.pauseReading()
  t.ok(connection.probeRead())
  stream.peerSends(frame('one'))
  await settle()
  t.same(frames, [])
  t.equal(connection.probedBytes, 7)
  t.ok(stream.reading, 'under PROBE_BYTES the probe stays armed')
  const filler = 'z'.repeat(PROBE_BYTES)
  stream.peerSends(frame(filler))
  await settle()
  t.notOk(stream.reading, 'enough set aside: reading stops again')
  t.notOk(connection.probeRead(), 'no second probe until reading resumes')
  const listens = stream.listens
  connection.resumeReading()
  t.equal(stream.listens, listens, 'the probe was disarmed already')
  t.same(frames, ['one', filler], 'set-aside frames decoded first')
  t.equal(connection.probedBytes, 0)
  t.ok(stream.reading)
  stream.peerSends(frame('two'))
  await settle()
  t.same(frames, ['one', filler, 'two'])
})

t.test('a probe is refused while reading, in set-up, or closed', async t => {
  const { connection } = open()
  t.notOk(connection.probeRead(), 'reading')
  void connection.handshake({ onFrame: () => ({}) }).catch(() => {})
  connection.pauseReading()
  t.notOk(connection.probeRead(), 'in set-up')
  connection.destroy()
  t.notOk(connection.probeRead(), 'closed')
})

const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve))

t.test('a read of 10,000 frames is decoded at most maxFramesPerRead a turn, the rest on later turns: nothing lost, order kept', async t => {
  const budget: number[] = []
  const inboundBudget = { update: (_c: unknown, held: number) => { budget.push(held) } }
  const { stream, connection, frames, closes } = open({ maxFramesPerRead: 100, inboundBudget: inboundBudget as never })
  const bodies = Array.from({ length: 10_000 }, (_, i) => `f${i}`)
  const wire = Buffer.concat(bodies.map(frame))
  stream.peerSends(wire)
  stream.peerSends(frame('after'))
  stream.pump()
  t.equal(frames.length, 100, 'the first turn decodes 100 frames')
  t.notOk(stream.reading, 'reading stops while the rest waits')
  // The next read came before the turn: it waits behind the rest.
  t.equal(connection.probedBytes, wire.length - frames.join('').length - 4 * 100 + frame('after').length, 'the rest, and the read after it, are kept aside')
  t.ok(budget.includes(connection.probedBytes), 'and counted in the inbound budget')
  let turns = 1
  let most = 100
  // Frames of the large read (the one after it is a read of its own, with its own budget).
  const ofRead = (): number => Math.min(frames.length, 10_000)
  while (frames.length < 10_001 && turns < 1000) {
    const before = ofRead()
    await nextTurn()
    turns++
    most = Math.max(most, ofRead() - before)
  }
  t.equal(most, 100, 'never more than 100 frames of the read in a turn')
  t.ok(turns >= 100, `${turns} turns`)
  t.same(frames, [...bodies, 'after'], 'every frame, in order, the next read after the kept rest')
  t.equal(connection.probedBytes, 0)
  t.equal(budget[budget.length - 1], 0, 'nothing held at the end')
  t.ok(stream.reading)
  t.equal(closes.length, 0)
})

t.test('the default frame budget splits a flood of tiny frames; another reason to stop keeps the rest until it ends', async t => {
  const { stream, connection, frames } = open()
  const wire = Buffer.concat(Array.from({ length: 2_000 }, () => frame('s')))
  stream.peerSends(wire)
  stream.pump()
  t.equal(frames.length, DEFAULT_MAX_FRAMES_PER_READ)
  connection.pauseReading()
  await nextTurn()
  await nextTurn()
  t.equal(frames.length, DEFAULT_MAX_FRAMES_PER_READ, 'paused: the kept rest waits')
  connection.resumeReading()
  t.equal(frames.length, 2 * DEFAULT_MAX_FRAMES_PER_READ, 'resumed: the next turn\'s share at once')
  while (frames.length < 2_000) await nextTurn()
  t.equal(frames.length, 2_000)
  t.ok(stream.reading)
})

t.test('a read\'s rest waits for its turn without pausing the stream; a read or the peer\'s end that comes first waits behind it', async t => {
  // Alone: the next turn decodes the rest; the stream was never paused, nor resumed.
  {
    const { stream, frames } = open({ maxFramesPerRead: 10 })
    const bodies = Array.from({ length: 25 }, (_, i) => `a${i}`)
    stream.peerSends(Buffer.concat(bodies.map(frame)))
    stream.pump()
    t.equal(frames.length, 10)
    t.ok(stream.reading, 'the stream still reads')
    while (frames.length < 25) await nextTurn()
    t.same(frames, bodies)
    t.equal(stream.pauses, 0, 'never paused')
    t.equal(stream.resumes, 0, 'never resumed')
  }
  // A read comes before the turn: it is kept behind the rest, and the stream paused then.
  {
    const { stream, frames, connection } = open({ maxFramesPerRead: 10 })
    const bodies = Array.from({ length: 25 }, (_, i) => `b${i}`)
    stream.peerSends(Buffer.concat(bodies.map(frame)))
    stream.peerSends(frame('late'))
    stream.pump()
    t.equal(frames.length, 10, 'the late read is not decoded before the rest')
    t.notOk(stream.reading, 'paused by the late read')
    t.ok(connection.probedBytes > 0)
    while (frames.length < 26) await nextTurn()
    t.same(frames, [...bodies, 'late'], 'in order')
    t.ok(stream.reading)
    t.equal(connection.probedBytes, 0)
  }
  // The peer's end comes before the turn: every frame before it is decoded, then the connection closes.
  {
    const { stream, frames, closes } = open({ maxFramesPerRead: 10 })
    const bodies = Array.from({ length: 25 }, (_, i) => `c${i}`)
    stream.peerSends(Buffer.concat(bodies.map(frame)))
    stream.peerEnds()
    stream.pump()
    t.equal(frames.length, 10)
    t.equal(closes.length, 0, 'not closed while frames wait for their turn')
    for (let i = 0; i < 10 && closes.length === 0; i++) await nextTurn()
    t.same(frames, bodies, 'every frame sent before the end')
    t.equal(closes.length, 1)
    t.equal(closes[0]?.message, 'connection closed by peer')
  }
})
