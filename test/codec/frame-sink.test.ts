/**
 * The FrameSink contract as nyala implements it: reserve and append in any
 * order make one frame, in that order; small appends are copied, large
 * ones sent as they are; a throw mid-encode leaves nothing queued and the
 * slab's room free; a scratch frame is copied out; a nested frame does not
 * share the slab's room.
 */
import t from 'tap'
import { APPEND_COPY_BYTES, FrameBuffer, MAX_CHUNK_RESERVE_BYTES, encodeToSlices, type FrameSink } from '../../codec/frame-sink.js'
import { writeFrame, type FrameEncoder } from '../../transport/frame-writer.js'
import { TransferQueue } from '../../transport/transfer-queue.js'
import { FakeSink, nextTick } from '../helpers/fake-sink.js'

// Writes `text` into reserved room.
function put (out: FrameSink, text: string): void {
  const at = out.reserve(Buffer.byteLength(text))
  out.buffer.write(text, at)
}

const big = (fill: string, bytes = APPEND_COPY_BYTES * 4): Buffer => Buffer.alloc(bytes, fill)

// An encoder of steps: strings are reserved and written, buffers appended, 'throw' throws.
const STEPS: FrameEncoder<Array<string | Buffer>, null> = {
  encode (steps, _b, out) {
    for (const step of steps) {
      if (step === 'throw') throw new Error('encoder gave up')
      if (typeof step === 'string') put(out, step)
      else out.append(step)
    }
  }
}

t.test('reserve and append interleave into one frame, in order; large appends are not copied', async (t) => {
  const value = big('v')
  const slices = encodeToSlices(STEPS.encode, STEPS, ['head:', value, ':tail', Buffer.from('!')], null)
  t.equal(Buffer.concat(slices).toString(), `head:${value.toString()}:tail!`)
  t.equal(slices.length, 3, 'head, the value, the tail with the small append copied into it')
  t.equal(slices[1], value, 'the large slice itself')
  t.same(encodeToSlices(STEPS.encode, STEPS, [], null), [], 'nothing encoded: no slices')
})

t.test('a length written into reserved room after the body is known', async (t) => {
  const frame = encodeToSlices((body: Buffer, _: null, out: FrameSink) => {
    const at = out.reserve(4)
    const head = out.buffer
    out.append(body)
    put(out, '\n')
    head.writeUInt32BE(body.length + 1, at)
  }, null, big('b'), null)
  const bytes = Buffer.concat(frame)
  t.equal(bytes.readUInt32BE(0), APPEND_COPY_BYTES * 4 + 1)
  t.equal(bytes.length, 4 + APPEND_COPY_BYTES * 4 + 1)
})

t.test('the sink refuses counts that are not byte counts, and use after its encode returned', async (t) => {
  let kept: FrameSink | null = null
  t.throws(() => encodeToSlices((_a: null, _b: null, out: FrameSink) => { out.reserve(-1) }, null, null, null), /not a byte count/)
  t.throws(() => encodeToSlices((_a: null, _b: null, out: FrameSink) => { out.reserve(1.5) }, null, null, null), /not a byte count/)
  encodeToSlices((_a: null, _b: null, out: FrameSink) => { kept = out; put(out, 'x') }, null, null, null)
  t.throws(() => kept!.reserve(1), /after its encode returned/)
  t.throws(() => kept!.append(big('z')), /after its encode returned/)
})

t.test('scratch frames: the bytes are copied out, so the next frame cannot change them; large frames grow past the scratch', async (t) => {
  const first = encodeToSlices(STEPS.encode, STEPS, ['aaaa'], null)
  const second = encodeToSlices(STEPS.encode, STEPS, ['bbbb'], null)
  t.equal(Buffer.concat(first).toString(), 'aaaa', 'the first frame is intact')
  t.equal(Buffer.concat(second).toString(), 'bbbb')
  // 200 rooms of 1000 bytes: past the scratch's 64 KiB, in order.
  const steps = Array.from({ length: 200 }, (_, i) => String.fromCharCode(97 + i % 26).repeat(1000))
  const many = Buffer.concat(encodeToSlices(STEPS.encode, STEPS, steps, null))
  t.equal(many.toString(), steps.join(''))
  // A room larger than twice the scratch buffer, in a fresh scratch frame.
  const fresh = new FrameBuffer()
  fresh.begin(null)
  put(fresh, 'a'.repeat(100))
  put(fresh, 'b'.repeat(MAX_CHUNK_RESERVE_BYTES))
  t.equal(Buffer.concat(fresh.take()).toString(), 'a'.repeat(100) + 'b'.repeat(MAX_CHUNK_RESERVE_BYTES), 'the scratch grows to the room it must give')
  const huge = Buffer.concat(encodeToSlices(STEPS.encode, STEPS, ['<', 'h'.repeat(MAX_CHUNK_RESERVE_BYTES + 1), '>'], null))
  t.equal(huge.toString(), `<${'h'.repeat(MAX_CHUNK_RESERVE_BYTES + 1)}>`, 'a room larger than a chunk is a piece of its own')
})

t.test('a throw mid-encode leaves nothing queued, and the slab room it took is used by the next frame', async (t) => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.beginRead()
  t.equal(writeFrame(queue, STEPS, ['one;'], null), true)
  t.throws(() => writeFrame(queue, STEPS, ['two', big('2'), 'throw'], null), /encoder gave up/, 'the throw reaches the caller')
  t.throws(() => writeFrame(queue, STEPS, ['x'.repeat(MAX_CHUNK_RESERVE_BYTES + 5), 'throw'], null), /encoder gave up/)
  t.equal(queue.stats().queuedTransfers, 1, 'only the first frame is queued')
  t.equal(writeFrame(queue, STEPS, ['three;'], null), true)
  t.equal(writeFrame(queue, STEPS, [], null), true, 'nothing encoded: nothing queued')
  t.match(queue.stats(), { queuedTransfers: 2, queuedEntries: 1 }, 'the frames around the throw are one run of the slab')
  queue.endRead()
  await nextTick()
  t.equal(sink.bytes().toString(), 'one;three;')
  t.equal(sink.writes.length, 1, 'one write')
})

t.test('in place: interleaved frames of rooms and appends reach the socket in order across slabs', async (t) => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { batchFrames: 10_000 })
  queue.beginRead()
  let expected = ''
  for (let i = 0; i < 300; i++) {
    const steps: Array<string | Buffer> = [`<${i}:`]
    if (i % 3 === 0) steps.push(big(String.fromCharCode(97 + i % 26)))
    if (i % 5 === 0) steps.push('m'.repeat(3000))
    if (i % 7 === 0) steps.push(Buffer.from('small'))
    steps.push('>')
    expected += steps.map((s) => s.toString()).join('')
    t.equal(writeFrame(queue, STEPS, steps, null), true)
  }
  queue.endRead()
  await nextTick()
  t.equal(sink.bytes().toString(), expected, 'every byte in order, none overwritten by a later frame')
})

t.test('a frame encoded while another is open does not take the slab room under it', async (t) => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const other = new TransferQueue(new FakeSink())
  queue.beginRead()
  const nesting: FrameEncoder<null, null> = {
    encode (_a, _b, out) {
      put(out, 'outer-')
      // An encoder that writes another frame meanwhile (a push sent from an encoder).
      writeFrame(other, STEPS, ['inner'], null)
      put(out, 'end')
    }
  }
  t.equal(writeFrame(queue, nesting, null, null), true)
  queue.endRead()
  await nextTick()
  t.equal(sink.bytes().toString(), 'outer-end')
  t.equal(other.stats().queuedTransfers + other.stats().immediateWrites, 1, 'the inner frame went its own way')
})

t.test('FrameBuffer in a chunk: its run, then its pieces once it appends', async (t) => {
  const frame = new FrameBuffer()
  const chunk = { buffer: Buffer.alloc(64), at: 10, bytes: 64, renew: () => { throw new Error('no renew expected') } }
  frame.begin(chunk as never)
  put(frame, 'abc')
  t.equal(frame.isRun, true)
  t.equal(frame.runStart, 10)
  t.equal(frame.runEnd, 13)
  frame.append(big('q'))
  put(frame, 'z')
  t.equal(frame.isRun, false)
  t.equal(frame.bytes, 3 + APPEND_COPY_BYTES * 4 + 1)
  const pieces = frame.pieces()
  t.same(pieces.map((p) => p.length), [3, APPEND_COPY_BYTES * 4, 1])
  t.equal(frame.runEnd, 14, 'the chunk\'s next frame may start after the last run')
})

t.test('an encoder that returns a value (the former contract\'s slices) is refused, nothing queued', async (t) => {
  const queue = new TransferQueue(new FakeSink())
  queue.beginRead()
  const former = { encode: () => [Buffer.from('x')] } as unknown as FrameEncoder<null, null>
  t.throws(() => writeFrame(queue, former, null, null), /returned a value/)
  t.throws(() => encodeToSlices(former.encode, former, null, null), /returned a value/)
  t.equal(queue.stats().queuedTransfers, 0)
})
