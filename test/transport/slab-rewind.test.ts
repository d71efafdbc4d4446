/**
 * Runs of in-place frames written as ranges (`ByteStream.writeRange`) to a
 * stream that copies what it takes: no view per write, and the shared
 * slab's room is taken again once a run went whole with nothing laid out
 * after it, never while any byte of it may still be held (a stream that
 * kept part of it, a run of another queue still queued after it).
 */
import t from 'tap'
import type { FrameSink } from '../../codec/frame-sink.js'
import { writeFrame } from '../../transport/frame-writer.js'
import { TransferQueue } from '../../transport/transfer-queue.js'
import { FakeSink, nextTick } from '../helpers/fake-sink.js'

/** A FakeSink that takes ranges, as the native stream does: it copies what it takes; `keeps` bytes of each range it does not (held as a view). */
class RangeSink extends FakeSink {
  /** Bytes taken by `writeRange`, copied when taken. */
  readonly copies: Buffer[] = []
  /** Views kept of ranges not taken whole. */
  readonly held: Buffer[] = []
  ranges = 0
  /** Bytes of each range the sink holds instead of taking. */
  keeps = 0

  writeRange (buf: Buffer, start: number, end: number): boolean {
    this.ranges++
    const kept = Math.min(this.keeps, end - start)
    this.copies.push(Buffer.from(buf.subarray(start, end - kept)))
    if (kept > 0) {
      this.held.push(buf.subarray(end - kept, end))
      this.writableLength += kept
    }
    return this.writeReturns
  }

  // A write of a view (a batch copied into a buffer of its own): recorded as a copy too.
  override write (chunk: Buffer): boolean {
    this.copies.push(Buffer.from(chunk))
    return super.write(chunk)
  }

  /** Every byte taken, then every byte held. */
  taken (): Buffer {
    return Buffer.concat([...this.copies, ...this.held])
  }
}

const FILL = {
  encode (id: number, bytes: number, out: FrameSink): void {
    const at = out.reserve(bytes)
    out.buffer.fill(id, at, at + bytes)
  }
}

function frame (queue: TransferQueue, id: number, bytes: number): boolean {
  return writeFrame(queue, FILL, id, bytes)
}

t.test('a lone frame goes as a range; its room is the next frame\'s: 300 KiB of answers in one slab', async t => {
  const sink = new RangeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  const slab = queue.inPlaceChunk!
  const at = slab.at
  frame(queue, 1, 100)
  t.equal(slab.at, at + 100, 'queued: its room is taken')
  await nextTick()
  const buffer = slab.buffer
  t.equal(slab.at, at, 'written whole: its room is free again')
  t.equal(sink.ranges, 1, 'written as a range')
  t.equal(sink.writes.length, 0, 'no view written')
  const expected: Buffer[] = [Buffer.alloc(100, 1)]
  for (let i = 0; i < 300; i++) {
    const id = (i % 250) + 2
    t.equal(frame(queue, id, 1024), true)
    expected.push(Buffer.alloc(1024, id))
    await nextTick()
  }
  t.equal(slab.buffer, buffer, 'the same slab')
  t.equal(slab.at, at, 'its room taken again after every write')
  t.ok(sink.taken().equals(Buffer.concat(expected)), 'every answer arrived as it was encoded')
  t.match(queue.stats(), { immediateWrites: 301, batchedWrites: 0 })
})

t.test('a read\'s answers go as one range; a stream that kept part of it keeps the room taken', async t => {
  const sink = new RangeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  const slab = queue.inPlaceChunk!
  const start = slab.at
  queue.beginRead()
  for (let id = 1; id <= 4; id++) frame(queue, id, 10)
  queue.endRead()
  t.equal(sink.ranges, 1, 'one range for the read')
  t.match(queue.stats(), { batchedWrites: 1, batchedFrames: 4 })
  t.equal(slab.at, start, 'taken whole: the room is free again')
  sink.keeps = 6
  frame(queue, 5, 10)
  await nextTick()
  t.equal(slab.at, start + 10, 'held in part: the room stays taken')
  sink.keeps = 0
  sink.writableLength = 0
  for (let id = 6; id <= 40; id++) {
    frame(queue, id, 1000)
    await nextTick()
    t.equal(slab.at, start + 10, 'later frames take the room after it, again and again')
  }
  t.ok(sink.held[0]!.equals(Buffer.alloc(6, 5)), 'the bytes the stream holds were not written over')
})

t.test('queues share the slab: a run goes back only when nothing was laid out after it', async t => {
  const a = new RangeSink()
  const b = new RangeSink()
  const qa = new TransferQueue(a)
  const qb = new TransferQueue(b)
  const slab = qa.inPlaceChunk!
  qa.beginRead()
  qb.beginRead()
  frame(qa, 1, 50)
  frame(qb, 2, 50)
  frame(qa, 3, 50)
  const end = slab.at
  qb.endRead()
  t.equal(slab.at, end, 'b\'s run has a frame of a after it: its room stays taken')
  frame(qb, 4, 50)
  qa.endRead()
  t.equal(slab.at, end + 50, 'a\'s runs went, b\'s frame lies after them')
  await nextTick()
  t.ok(a.taken().equals(Buffer.concat([Buffer.alloc(50, 1), Buffer.alloc(50, 3)])), 'a: its frames intact')
  t.ok(b.taken().equals(Buffer.concat([Buffer.alloc(50, 2), Buffer.alloc(50, 4)])), 'b: its frames intact')
  t.equal(slab.at, end, 'b\'s last run went whole: its room is free again')
})

t.test('a frame queued behind a backed-up stream is not written over by the next frames', async t => {
  const sink = new RangeSink()
  const other = new RangeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  const next = new TransferQueue(other, { coalesceMicrotasks: true })
  sink.writeReturns = false
  sink.keeps = 100
  frame(queue, 1, 100)
  await nextTick()
  t.ok(queue.isWaitingDrain, 'waiting for drain')
  for (let id = 2; id <= 30; id++) {
    frame(next, id, 3000)
    await nextTick()
  }
  t.ok(sink.held[0]!.equals(Buffer.alloc(100, 1)), 'the frame the stream holds is intact')
  t.equal(other.ranges, 29)
  t.ok(other.taken().equals(Buffer.concat(Array.from({ length: 29 }, (_, i) => Buffer.alloc(3000, i + 2)))), 'the later frames too')
})
