/**
 * TransferQueue against a fake socket: immediate lone writes, end-of-turn
 * batching, drain waits, cancellation before the first byte, holds, the
 * outbound bound, close, and the stats.
 */
import t from 'tap'
import fc from 'fast-check'
import type { FrameSink } from '../../codec/frame-sink.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { MAX_CHUNK_RESERVE_BYTES as MAX_IN_PLACE_FRAME_BYTES } from '../../codec/frame-sink.js'
import { writeFrame } from '../../transport/frame-writer.js'
import { TransferQueue, type OutboundTransfer } from '../../transport/transfer-queue.js'
import { FakeSink, nextTick } from '../helpers/fake-sink.js'

interface Tracked extends OutboundTransfer {
  id: number
  /** Every onSent call, in order (must end up with exactly one). */
  sent: Array<RpcError | undefined>
  beforeWriteCalls: number
}

/** A transfer of `bytes` bytes, every byte equal to `id`, split into `slices` slices. */
function transfer (id: number, bytes = 8, options: { slices?: number, cancelled?: () => boolean } = {}): Tracked {
  const sliceCount = options.slices ?? 1
  const slices: Buffer[] = []
  let left = bytes
  for (let i = 0; i < sliceCount; i++) {
    const size = i === sliceCount - 1 ? left : Math.floor(bytes / sliceCount)
    slices.push(Buffer.alloc(size, id))
    left -= size
  }
  const tracked: Tracked = {
    id,
    slices,
    bytes,
    sent: [],
    beforeWriteCalls: 0,
    onSent: (error) => { tracked.sent.push(error) }
  }
  const cancelled = options.cancelled
  if (cancelled !== undefined) tracked.beforeWrite = () => { tracked.beforeWriteCalls++; return !cancelled() }
  return tracked
}

function ids (buf: Buffer): number[] {
  const out: number[] = []
  for (const byte of buf) if (out[out.length - 1] !== byte) out.push(byte)
  return out
}

t.test('a lone frame is written synchronously, inside enqueue', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  let inside = false
  let writtenInside = false
  sink.onWrite = () => { writtenInside = inside }
  const a = transfer(1)
  inside = true
  t.equal(queue.enqueue(a), true)
  inside = false
  t.ok(writtenInside, 'written before enqueue returned')
  t.equal(sink.writes.length, 1)
  t.same(sink.writes[0]!.chunk, a.slices[0])
  t.same(a.sent, [undefined], 'onSent at once: a single slice is the codec\'s own buffer')
  t.equal(queue.stats().immediateWrites, 1)
  await nextTick()
  t.equal(sink.writes.length, 1, 'nothing more at the end of the turn')

  // A later turn's lone frame is immediate again.
  const b = transfer(2)
  queue.enqueue(b)
  t.equal(sink.writes.length, 2)
  t.equal(queue.stats().immediateWrites, 2)
  t.equal(queue.stats().batchedWrites, 0)
})

t.test('frames enqueued in the same turn after the first go out together in one write at nextTick', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const [a, b, c, d] = [transfer(1), transfer(2), transfer(3), transfer(4)]
  queue.enqueue(a)
  queue.enqueue(b)
  queue.enqueue(c)
  queue.enqueue(d)
  t.equal(sink.writes.length, 1, 'only the first is written synchronously')
  t.same(b.sent, [], 'queued frames are not reported sent yet')
  t.equal(queue.stats().queuedTransfers, 3)
  t.equal(queue.stats().queuedBytes, 24)
  t.equal(queue.isIdle, false)
  await nextTick()
  t.equal(sink.writes.length, 2, 'one more write for the three queued frames')
  t.same(ids(sink.writes[1]!.chunk), [2, 3, 4], 'in order')
  t.equal(sink.writes[1]!.chunk.length, 24)
  t.same([b.sent, c.sent, d.sent], [[undefined], [undefined], [undefined]], 'small frames are copied, so sent at once')
  const stats = queue.stats()
  t.equal(stats.immediateWrites, 1)
  t.equal(stats.batchedWrites, 1)
  t.equal(stats.batchedFrames, 3)
  t.equal(stats.queuedTransfers, 0)
  t.equal(stats.queuedBytes, 0)
  t.equal(queue.isIdle, true)
})

t.test('a large batch goes out as one corked writev, sent when the kernel takes it', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const first = transfer(1)
  const big = [transfer(2, 40 * 1024), transfer(3, 40 * 1024, { slices: 3 }), transfer(4, 16)]
  queue.enqueue(first)
  for (const x of big) queue.enqueue(x)
  await nextTick()
  const groups = sink.groups()
  t.equal(groups.length, 2, 'the lone first frame, then one writev')
  t.same(ids(groups[1]!), [2, 3, 4])
  t.equal(groups[1]!.length, 80 * 1024 + 16)
  t.notOk(sink.corked, 'uncorked after the batch')
  t.same(big.map(x => x.sent), [[], [], []], 'slices still refer to the callers\' buffers')
  sink.completeWrites()
  t.same(big.map(x => x.sent), [[undefined], [undefined], [undefined]])
  t.equal(queue.stats().batchedWrites, 1)
  t.equal(queue.stats().batchedFrames, 3)
})

t.test('the answers to one read go out in one write when the read is handled', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.beginRead()
  queue.enqueue(transfer(1))
  queue.enqueue(transfer(2))
  queue.enqueue(transfer(3))
  t.equal(sink.writes.length, 0, 'held while the read is handled')
  queue.endRead()
  t.equal(sink.writes.length, 1, 'one write, inside endRead')
  t.same(ids(sink.writes[0]!.chunk), [1, 2, 3])
  t.match(queue.stats(), { immediateWrites: 0, batchedWrites: 1, batchedFrames: 3 })
  queue.enqueue(transfer(4))
  queue.enqueue(transfer(5))
  t.equal(sink.writes.length, 1, 'later frames of the turn wait for its end')
  await nextTick()
  t.equal(sink.writes.length, 2)
  t.same(ids(sink.writes[1]!.chunk), [4, 5])
  t.match(queue.stats(), { immediateWrites: 0, batchedWrites: 2, batchedFrames: 5 })
})

t.test('a held batch goes out as soon as it has batchFrames frames, the rest at the end of the read or turn', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { batchFrames: 4 })
  queue.beginRead()
  for (let id = 1; id <= 10; id++) queue.enqueue(transfer(id))
  t.same(sink.writes.map(w => ids(w.chunk)), [[1, 2, 3, 4], [5, 6, 7, 8]], 'two full batches written during the read')
  queue.endRead()
  t.same(sink.writes.map(w => ids(w.chunk)), [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]], 'the rest when the read is handled')
  for (let id = 11; id <= 16; id++) queue.enqueue(transfer(id))
  t.same(sink.writes.slice(3).map(w => ids(w.chunk)), [[11, 12, 13, 14]], 'later in the turn, a full batch goes out at once')
  await nextTick()
  t.same(sink.writes.slice(3).map(w => ids(w.chunk)), [[11, 12, 13, 14], [15, 16]], 'the remainder at the end of the turn')
  t.match(queue.stats(), { batchedWrites: 5, batchedFrames: 16, queuedTransfers: 0 })

  // The default: 50 frames a batch.
  const sink2 = new FakeSink()
  const queue2 = new TransferQueue(sink2)
  queue2.beginRead()
  for (let id = 0; id < 100; id++) queue2.enqueue(transfer(id % 250))
  queue2.endRead()
  t.same(sink2.writes.map(w => w.chunk.length / 8), [50, 50])

  // While waiting for drain, full batches stay queued: the bound, not the batch size, limits them.
  const sink3 = new FakeSink()
  const queue3 = new TransferQueue(sink3, { batchFrames: 2 })
  sink3.writeReturns = false
  queue3.enqueue(transfer(1))
  sink3.writeReturns = true
  for (let id = 2; id <= 6; id++) queue3.enqueue(transfer(id))
  t.equal(sink3.writes.length, 1, 'nothing more until drain')
  t.equal(queue3.stats().queuedTransfers, 5)
  queue3.onSocketDrain()
  t.same(ids(sink3.bytes()), [1, 2, 3, 4, 5, 6], 'all of it after drain, in order')
  await nextTick()
})

t.test('a read answered by one frame writes it at once; a read answered by none writes nothing', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.beginRead()
  queue.endRead()
  t.equal(sink.writes.length, 0)
  queue.enqueue(transfer(1))
  t.equal(sink.writes.length, 1, 'nothing scheduled by the empty read: a lone frame is written at once')
  await nextTick()
  queue.beginRead()
  const cancelled = transfer(2, 8, { cancelled: () => true })
  queue.enqueue(cancelled)
  queue.endRead()
  t.same(cancelled.sent.map(e => e?.code), [ErrorCode.CANCELLED], 'a cancelled lone answer is dropped')
  queue.beginRead()
  queue.enqueue(transfer(3))
  queue.endRead()
  t.equal(sink.writes.length, 2)
  t.same(ids(sink.writes[1]!.chunk), [3])
  t.match(queue.stats(), { immediateWrites: 2, batchedWrites: 0, dropped: 1 })
})

t.test('answers to a read while waiting for drain stay queued until drain', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  sink.writeReturns = false
  queue.enqueue(transfer(1))
  sink.writeReturns = true
  queue.beginRead()
  queue.enqueue(transfer(2))
  queue.enqueue(transfer(3))
  queue.endRead()
  t.equal(sink.writes.length, 1)
  queue.onSocketDrain()
  t.same(ids(sink.bytes()), [1, 2, 3])
  queue.endRead()
  t.equal(sink.writes.length, 2, 'endRead without beginRead does nothing')
})

t.test('when write returns false the queue waits for drain, then resumes', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  sink.writeReturns = false
  const a = transfer(1)
  queue.enqueue(a)
  t.equal(sink.writes.length, 1, 'the first frame is handed over anyway')
  t.equal(queue.stats().drainWaits, 1)
  const [b, c] = [transfer(2), transfer(3)]
  queue.enqueue(b)
  queue.enqueue(c)
  await nextTick()
  await nextTick()
  t.equal(sink.writes.length, 1, 'nothing more until drain')
  t.equal(queue.stats().queuedTransfers, 2)
  queue.onSocketDrain()
  t.equal(sink.writes.length, 2, 'drain writes the queued frames at once')
  t.same(ids(sink.writes[1]!.chunk), [2, 3])
  t.equal(queue.stats().drainWaits, 2, 'write still returns false: waiting again')
  const d = transfer(4)
  queue.enqueue(d)
  t.equal(sink.writes.length, 2, 'queued behind the drain')
  sink.writeReturns = true
  queue.onSocketDrain()
  t.equal(sink.writes.length, 3)
  t.same(ids(sink.bytes()), [1, 2, 3, 4])
  t.equal(queue.stats().drainWaits, 2)
  queue.onSocketDrain()
  t.equal(sink.writes.length, 3, 'a drain nobody waits for does nothing')
  t.same([a, b, c, d].map(x => x.sent.length), [1, 1, 1, 1])
})

t.test('a queued transfer whose beforeWrite returns false is dropped with RPC_ERR_CANCELLED', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  let cancelB = false
  const a = transfer(1)
  const b = transfer(2, 8, { cancelled: () => cancelB })
  const c = transfer(3, 8, { cancelled: () => false })
  queue.enqueue(a)
  queue.enqueue(b)
  queue.enqueue(c)
  cancelB = true // the call is cancelled while its frame waits
  await nextTick()
  t.same(ids(sink.bytes()), [1, 3], 'b never reaches the socket')
  t.equal(b.sent.length, 1)
  t.ok(b.sent[0] instanceof RpcError)
  t.equal(b.sent[0]?.code, ErrorCode.CANCELLED)
  t.equal(b.beforeWriteCalls, 1)
  t.same(c.sent, [undefined])
  t.equal(c.beforeWriteCalls, 1, 'beforeWrite is asked once, just before the first byte')
  t.equal(queue.stats().dropped, 1)

  // A lone transfer cancelled before enqueue is dropped synchronously.
  const lone = transfer(4, 8, { cancelled: () => true })
  t.equal(queue.enqueue(lone), true)
  t.equal(lone.sent[0]?.code, ErrorCode.CANCELLED)
  t.same(ids(sink.bytes()), [1, 3])
  t.equal(queue.stats().dropped, 2)
  await nextTick()
  t.equal(sink.writes.length, 2)
})

t.test('a started transfer is always written completely', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  let cancelled = false
  sink.writeReturns = false // the kernel is full from the first slice on
  const multi = transfer(7, 3 * 1024 * 1024, { slices: 3, cancelled: () => cancelled })
  queue.enqueue(multi)
  t.equal(multi.beforeWriteCalls, 1)
  cancelled = true // cancelled after its first byte went out
  t.equal(sink.writes.length, 3, 'every slice handed over despite write() returning false')
  t.equal(sink.groups().length, 1, 'as one corked writev')
  t.equal(sink.bytes().length, multi.bytes)
  t.equal(sink.writes.filter(w => w.hasCallback).length, 1, 'one completion callback, on the last slice')
  t.same(multi.sent, [], 'not sent until the kernel takes the caller\'s slices')

  queue.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closing'))
  t.same(multi.sent, [], 'close does not drop a started transfer')
  t.equal(multi.beforeWriteCalls, 1, 'beforeWrite is not asked again')
  sink.completeWrites()
  t.same(multi.sent, [undefined], 'finished normally')
  t.equal(queue.stats().dropped, 0)
})

t.test('a failed socket write reaches onSent as RPC_ERR_CONNECTION_CLOSED', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const multi = transfer(1, 64, { slices: 2 })
  queue.enqueue(multi)
  sink.completeWrites(new Error('EPIPE'))
  t.equal(multi.sent.length, 1)
  t.equal(multi.sent[0]?.code, ErrorCode.CONNECTION_CLOSED)
  t.match(multi.sent[0]?.message, /EPIPE/)
})

t.test('hold() queues and release() sends in one write', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.release()
  t.equal(sink.writes.length, 0, 'release without hold does nothing')
  queue.hold()
  let cancelB = false
  const [a, b, c] = [transfer(1), transfer(2, 8, { cancelled: () => cancelB }), transfer(3)]
  queue.enqueue(a)
  queue.enqueue(b)
  queue.enqueue(c)
  await nextTick()
  t.equal(sink.writes.length, 0, 'nothing written while held')
  t.equal(queue.stats().queuedTransfers, 3)
  cancelB = true
  queue.release()
  t.equal(sink.writes.length, 1, 'release writes synchronously, in one write')
  t.same(ids(sink.writes[0]!.chunk), [1, 3])
  t.equal(b.sent[0]?.code, ErrorCode.CANCELLED, 'cancelled meanwhile: dropped')
  t.same([a.sent, c.sent], [[undefined], [undefined]])
  t.equal(queue.stats().queuedTransfers, 0)

  queue.hold()
  const d = transfer(4)
  queue.enqueue(d)
  t.equal(sink.writes.length, 1)
  queue.release()
  t.same(ids(sink.bytes()), [1, 3, 4], 'a lone held frame is written on release')
})

t.test('the outbound byte bound', async t => {
  t.test('queued bytes count', async t => {
    const sink = new FakeSink()
    const queue = new TransferQueue(sink, { maxOutboundBytes: 100 })
    queue.hold()
    const over = transfer(3, 1)
    t.equal(queue.enqueue(transfer(1, 60)), true)
    t.equal(queue.enqueue(transfer(2, 40)), true, 'exactly at the bound is accepted')
    t.equal(queue.enqueue(over), false, 'one byte over is refused')
    t.same(over.sent, [], 'a refused transfer is not reported')
    t.equal(queue.stats().queuedTransfers, 2)
    t.equal(queue.stats().queuedBytes, 100)
    queue.release()
    t.equal(sink.bytes().length, 100)
  })
  t.test('socket-buffered bytes count', async t => {
    const sink = new FakeSink()
    const queue = new TransferQueue(sink, { maxOutboundBytes: 100 })
    sink.writableLength = 90
    t.equal(queue.enqueue(transfer(1, 11)), false)
    t.equal(queue.stats().socketBufferedBytes, 90)
    t.equal(queue.enqueue(transfer(2, 10)), true)
    t.equal(sink.writes.length, 1)
    t.equal(queue.isIdle, false, 'not idle while the socket buffers bytes')
    sink.writableLength = 0
    t.equal(queue.isIdle, true)
  })
  t.test('a lone frame larger than the bound is accepted when nothing is backed up', async t => {
    const sink = new FakeSink()
    const queue = new TransferQueue(sink, { maxOutboundBytes: 100 })
    t.equal(queue.enqueue(transfer(1, 1000)), true)
    t.equal(sink.bytes().length, 1000)
    sink.writableLength = 1000
    t.equal(queue.enqueue(transfer(2, 1)), false, 'but nothing may follow it while the socket holds it')
  })
  t.test('the default bound is 100 MiB', async t => {
    const sink = new FakeSink()
    const queue = new TransferQueue(sink)
    sink.writableLength = 100 * 1024 * 1024 - 10
    t.equal(queue.enqueue(transfer(1, 11)), false)
    t.equal(queue.enqueue(transfer(2, 10)), true)
  })
})

t.test('close() drops queued transfers with the error', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const [a, b, c] = [transfer(1), transfer(2), transfer(3)]
  queue.enqueue(a)
  queue.enqueue(b)
  queue.enqueue(c)
  const error = new RpcError(ErrorCode.CONNECTION_CLOSED, 'peer reset')
  queue.close(error)
  t.same(a.sent, [undefined], 'the written one was sent')
  t.equal(b.sent[0], error, 'queued ones get the close error itself')
  t.equal(c.sent[0], error)
  t.equal(queue.stats().dropped, 2)
  t.equal(queue.stats().queuedTransfers, 0)
  t.equal(queue.stats().queuedBytes, 0)
  await nextTick()
  t.equal(sink.writes.length, 1, 'the scheduled flush writes nothing')

  const late = transfer(4)
  t.equal(queue.enqueue(late), true)
  t.equal(late.sent[0], error, 'a later transfer is dropped at once')
  t.equal(queue.stats().dropped, 3)
  queue.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'again'))
  queue.release()
  queue.onSocketDrain()
  t.equal(sink.writes.length, 1, 'nothing is written after close')
  t.same([a, b, c, late].map(x => x.sent.length), [1, 1, 1, 1], 'every onSent exactly once')
})

t.test('close() while waiting for drain', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  sink.writeReturns = false
  const [a, b] = [transfer(1), transfer(2)]
  queue.enqueue(a)
  queue.enqueue(b)
  const error = new RpcError(ErrorCode.CONNECTION_CLOSED, 'gone')
  queue.close(error)
  t.equal(b.sent[0], error)
  sink.writeReturns = true
  queue.onSocketDrain()
  t.equal(sink.writes.length, 1)
})

t.test('stats counters', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  t.same(queue.stats(), {
    queuedTransfers: 0, queuedEntries: 0, queuedBytes: 0, socketBufferedBytes: 0, immediateWrites: 0, batchedWrites: 0, batchedFrames: 0, partialWrites: 0, drainWaits: 0, dropped: 0
  })
  queue.enqueue(transfer(1))
  queue.enqueue(transfer(2))
  queue.enqueue(transfer(3))
  t.equal(queue.stats().queuedTransfers, 2)
  t.equal(queue.stats().queuedBytes, 16)
  await nextTick()
  queue.enqueue(transfer(4))
  queue.enqueue(transfer(5, 8, { cancelled: () => true }))
  queue.enqueue(transfer(6))
  queue.enqueue(transfer(7))
  await nextTick()
  sink.writableLength = 16
  t.same(queue.stats(), {
    queuedTransfers: 0,
    queuedEntries: 0,
    queuedBytes: 0,
    socketBufferedBytes: 16,
    immediateWrites: 2,
    batchedWrites: 2,
    batchedFrames: 4,
    partialWrites: 0,
    drainWaits: 0,
    dropped: 1
  })
  t.same(ids(sink.bytes()), [1, 2, 3, 4, 6, 7])
  sink.writeReturns = false
  queue.enqueue(transfer(8))
  t.equal(queue.stats().drainWaits, 1)
  t.equal(queue.stats().immediateWrites, 3)
})

t.test('partialWrites counts writes the kernel did not take whole, drainWaits the ones over the high-water mark', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  // The kernel takes all but 10 bytes of the next write; the socket is still under its high-water mark.
  sink.onWrite = (chunk) => { sink.writableLength += Math.min(10, chunk.length) }
  queue.enqueue(transfer(1, 64))
  t.equal(queue.stats().partialWrites, 1)
  t.equal(queue.stats().drainWaits, 0, 'write() returned true: no wait')
  queue.enqueue(transfer(2))
  queue.enqueue(transfer(3))
  await nextTick()
  t.equal(queue.stats().partialWrites, 2, 'the batch left bytes behind too')
  // A big sidecar: the kernel takes part, write() says the buffer is full.
  sink.onWrite = null
  sink.writableLength = 0
  sink.writeReturns = false
  const big = transfer(4, 1024, { slices: 2 })
  sink.onWrite = (chunk) => { sink.writableLength += chunk.length }
  queue.enqueue(big)
  t.same(queue.stats(), {
    queuedTransfers: 0,
    queuedEntries: 0,
    queuedBytes: 0,
    socketBufferedBytes: 1024,
    immediateWrites: 2,
    batchedWrites: 1,
    batchedFrames: 2,
    partialWrites: 3,
    drainWaits: 1,
    dropped: 0
  })
  queue.enqueue(transfer(5))
  t.equal(queue.stats().queuedTransfers, 1, 'waits behind the drain')
  t.equal(queue.stats().queuedBytes, 8)
  sink.onWrite = null
  sink.writableLength = 0
  sink.writeReturns = true
  sink.completeWrites()
  queue.onSocketDrain()
  t.equal(queue.stats().queuedTransfers, 0)
  t.equal(queue.stats().partialWrites, 3, 'a write the kernel took whole is not partial')
  t.same(ids(sink.bytes()), [1, 2, 3, 4, 5])
})

t.test('batchedWrites counts only writes that carried several frames', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.enqueue(transfer(1))
  queue.enqueue(transfer(2, 8, { cancelled: () => true }))
  queue.enqueue(transfer(3))
  await nextTick()
  t.same(ids(sink.bytes()), [1, 3])
  t.equal(queue.stats().batchedWrites, 0, 'frame 3 went out alone')
  t.equal(queue.stats().batchedFrames, 0)
})

t.test('an onSent that enqueues keeps order', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const follow = transfer(2)
  const first = transfer(1)
  first.onSent = (error) => { first.sent.push(error); queue.enqueue(follow) }
  queue.enqueue(first)
  queue.enqueue(transfer(3))
  await nextTick()
  await nextTick()
  t.same(ids(sink.bytes()), [1, 2, 3])
  t.same(follow.sent, [undefined])
})

// A model check: whatever mix of operations, bytes reach the socket in
// enqueue order, dropped ones never do, and every onSent fires exactly once.
type Op =
  | { kind: 'enqueue', bytes: number, slices: number, cancel: 'no' | 'before' | 'later' }
  | { kind: 'tick' } | { kind: 'full' } | { kind: 'drain' } | { kind: 'hold' } | { kind: 'release' }
  | { kind: 'inplace', bytes: number } | { kind: 'beginRead' } | { kind: 'endRead' } | { kind: 'microtask' }

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('enqueue' as const), bytes: fc.oneof(fc.integer({ min: 1, max: 64 }), fc.integer({ min: 20_000, max: 70_000 })), slices: fc.integer({ min: 1, max: 3 }), cancel: fc.constantFrom('no' as const, 'no' as const, 'before' as const, 'later' as const) }) },
  { weight: 2, arbitrary: fc.constant({ kind: 'tick' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'full' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'drain' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'hold' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'release' as const }) },
  { weight: 4, arbitrary: fc.record({ kind: fc.constant('inplace' as const), bytes: fc.oneof(fc.integer({ min: 1, max: 64 }), fc.constant(MAX_IN_PLACE_FRAME_BYTES), fc.constant(MAX_IN_PLACE_FRAME_BYTES + 1)) }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'beginRead' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'endRead' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'microtask' as const }) }
)

t.test('property: order, drops and onSent under any sequence of operations', async t => {
  await fc.assert(fc.asyncProperty(fc.array(opArb, { maxLength: 40 }), fc.boolean(), async (ops, coalesceMicrotasks) => {
    const sink = new FakeSink()
    const queue = new TransferQueue(sink, { coalesceMicrotasks })
    const all: Tracked[] = []
    const laterCancel = new Set<number>()
    let id = 0
    for (const op of ops) {
      switch (op.kind) {
        case 'enqueue': {
          const n = ++id
          const x = transfer(n % 250 + 1, Math.max(op.bytes, op.slices), {
            slices: op.slices,
            cancelled: () => op.cancel === 'before' || laterCancel.has(n)
          })
          all.push(x)
          queue.enqueue(x)
          if (op.cancel === 'later') laterCancel.add(n)
          break
        }
        case 'inplace': {
          // Encoded in place when the queue allows it, else enqueued: either way sent, in order, never dropped.
          const n = ++id
          const x = transfer(n % 250 + 1, op.bytes)
          all.push(x)
          if (queue.inPlaceChunk === null) {
            queue.enqueue(x)
          } else if (inPlace(queue, n % 250 + 1, op.bytes)) {
            x.onSent!(undefined)
            x.beforeWriteCalls = 1
          }
          break
        }
        case 'beginRead': queue.beginRead(); break
        case 'endRead': queue.endRead(); break
        case 'microtask': await Promise.resolve(); break
        case 'tick': await nextTick(); break
        case 'full': sink.writeReturns = false; break
        case 'drain': sink.writeReturns = true; queue.onSocketDrain(); break
        case 'hold': queue.hold(); break
        case 'release': queue.release(); break
      }
      sink.completeWrites()
    }
    // Let everything out.
    sink.writeReturns = true
    queue.endRead()
    queue.release()
    queue.onSocketDrain()
    await nextTick()
    sink.completeWrites()
    const written = all.filter(x => x.sent.length === 1 && x.sent[0] === undefined)
    const expected = Buffer.concat(written.flatMap(x => x.slices))
    if (!sink.bytes().equals(expected)) throw new Error('bytes out of order or a dropped transfer was written')
    for (const x of all) {
      if (x.sent.length !== 1) throw new Error(`transfer ${x.id} onSent ${x.sent.length} times`)
      if (x.sent[0] !== undefined && x.sent[0].code !== ErrorCode.CANCELLED) throw new Error(`unexpected ${x.sent[0].code}`)
      if (x.beforeWrite !== undefined && x.beforeWriteCalls !== 1) throw new Error(`beforeWrite asked ${x.beforeWriteCalls} times`)
    }
    if (!queue.isIdle) throw new Error('queue not idle at the end')
    if (sink.corked) throw new Error('left corked')
  }), { numRuns: 300 })
  t.pass('300 random operation sequences')
})

t.test('coalesceMicrotasks: a lone frame goes out at the end of the microtask checkpoint, as an immediate write', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  const a = transfer(1)
  t.equal(queue.enqueue(a), true)
  t.equal(sink.writes.length, 0, 'not in the caller\'s stack')
  t.same(a.sent, [])
  t.equal(queue.stats().queuedTransfers, 1)
  await Promise.resolve()
  t.equal(sink.writes.length, 1, 'written once the checkpoint ran, before any later tick')
  t.same(a.sent, [undefined])
  t.match(queue.stats(), { immediateWrites: 1, batchedWrites: 0, queuedTransfers: 0, queuedBytes: 0 })
  await nextTick()
  t.equal(sink.writes.length, 1, 'nothing more at the end of the turn')
})

t.test('coalesceMicrotasks: frames sent by the continuations of one checkpoint share one write', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  const sent: Tracked[] = []
  // Five awaiting callers resumed by one read: each sends its next frame.
  const resumed = Array.from({ length: 5 }, (_, i) => Promise.resolve().then(() => {
    const next = transfer(i + 1)
    sent.push(next)
    queue.enqueue(next)
  }))
  await Promise.all(resumed)
  await Promise.resolve()
  t.equal(sink.writes.length, 1, 'one write')
  t.same(ids(sink.writes[0]!.chunk), [1, 2, 3, 4, 5], 'in order')
  t.ok(sent.every((s) => s.sent.length === 1 && s.sent[0] === undefined), 'each reported sent once')
  t.match(queue.stats(), { immediateWrites: 0, batchedWrites: 1, batchedFrames: 5 })
})

t.test('coalesceMicrotasks: a frame cancelled before the checkpoint ends is dropped; hold and close are respected', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  let cancelled = false
  const a = transfer(1, 8, { cancelled: () => cancelled })
  queue.enqueue(a)
  cancelled = true
  await Promise.resolve()
  t.equal(sink.writes.length, 0)
  t.equal(a.sent.length, 1)
  t.equal(a.sent[0]?.code, ErrorCode.CANCELLED)
  t.equal(queue.stats().dropped, 1)

  const b = transfer(2)
  queue.enqueue(b)
  queue.hold()
  await Promise.resolve()
  t.equal(sink.writes.length, 0, 'held: nothing written')
  queue.release()
  t.equal(sink.writes.length, 1)
  t.same(b.sent, [undefined])

  const c = transfer(3)
  queue.enqueue(c)
  queue.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'gone'))
  await Promise.resolve()
  t.equal(sink.writes.length, 1, 'closed: nothing more written')
  t.equal(c.sent[0]?.code, ErrorCode.CONNECTION_CLOSED)
})

t.test('coalesceMicrotasks: a read answered by one frame writes it at once; answers that come later in the turn share a checkpoint write', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  queue.beginRead()
  queue.enqueue(transfer(1))
  t.equal(sink.writes.length, 0, 'held during the read')
  queue.endRead()
  t.equal(sink.writes.length, 1, 'the lone answer of the read at once')
  // Two async handlers settle after the read, in one checkpoint.
  await Promise.all([Promise.resolve().then(() => queue.enqueue(transfer(2))), Promise.resolve().then(() => queue.enqueue(transfer(3)))])
  await Promise.resolve()
  t.same(sink.writes.map(w => ids(w.chunk)), [[1], [2, 3]])
  await nextTick()
  t.equal(sink.writes.length, 2, 'no end-of-turn write left over')
  t.match(queue.stats(), { immediateWrites: 1, batchedWrites: 1, batchedFrames: 2, queuedTransfers: 0 })
})

t.test('coalesceMicrotasks: the outbound bound counts the same frames as writing at once would, and judges what the kernel left of them', async t => {
  for (const coalesceMicrotasks of [false, true]) {
    for (const kernel of ['keeps', 'takes'] as const) {
      const sink = new FakeSink()
      // 'keeps': the kernel takes nothing (a peer that does not read); 'takes': everything.
      if (kernel === 'keeps') sink.onWrite = (chunk) => { sink.writableLength += chunk.length }
      const queue = new TransferQueue(sink, { maxOutboundBytes: 1000, coalesceMicrotasks })
      // The first frame is (or would have been) written at once; the second
      // waits behind it this turn. The third passes the bound: what is queued
      // is written first, and the bound judges what the kernel left.
      // Without coalescing a kernel that keeps the first frame leaves no room for the second.
      const accepted = kernel === 'takes' ? [true, true, true] : coalesceMicrotasks ? [true, true, false] : [true, false, false]
      t.same([queue.enqueue(transfer(1, 600)), queue.enqueue(transfer(2, 600)), queue.enqueue(transfer(3, 600))], accepted,
        `coalesceMicrotasks ${String(coalesceMicrotasks)}, the kernel ${kernel} the bytes`)
      await nextTick()
      t.equal(sink.writes.reduce((n, w) => n + w.chunk.length, 0), 600 * accepted.filter(Boolean).length, 'the accepted frames written')
    }
  }
})

t.test('onOverBound: past the bound (after writing) the owner is told and frames are taken up to twice the bound, refused past it', async t => {
  const sink = new FakeSink()
  // A kernel that takes nothing: every byte written stays in the socket's buffer.
  sink.onWrite = (chunk) => { sink.writableLength += chunk.length }
  let told = 0
  const queue = new TransferQueue(sink, { maxOutboundBytes: 1000, onOverBound: () => { told++ } })
  const accepted = [1, 2, 3, 4].map((id) => queue.enqueue(transfer(id, 600)))
  t.same(accepted, [true, true, true, false], '600 and 1 200 and 1 800 are taken, 2 400 is past twice the bound')
  t.equal(told, 2, 'told for each frame taken past the bound')
  await nextTick()
  t.equal(sink.writes.reduce((n, w) => n + w.chunk.length, 0), 1800, 'the three taken frames written')
})

// Encodes a frame of `bytes` bytes, all equal to `id`, with writeFrame (in place when the queue allows); false when it was refused.
function inPlace (queue: TransferQueue, id: number, bytes = 8): boolean {
  return writeFrame(queue, FILL, id, bytes)
}
const FILL = {
  encode (id: number, bytes: number, out: FrameSink): void {
    const at = out.reserve(bytes)
    out.buffer.fill(id, at, at + bytes)
  }
}

t.test('in-place frames: a lone one is an immediate write; a read\'s answers are one slice of the slab, written without a copy', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  t.equal(inPlace(queue, 1), true)
  t.equal(sink.writes.length, 1, 'written inside commit, as enqueue writes a lone frame')
  t.same(ids(sink.writes[0]!.chunk), [1])
  t.equal(queue.stats().immediateWrites, 1)
  await nextTick()

  queue.beginRead()
  for (let id = 2; id <= 6; id++) inPlace(queue, id)
  t.equal(sink.writes.length, 1, 'held until the read is handled')
  t.equal(queue.stats().queuedTransfers, 5, 'five frames queued')
  t.equal(queue.stats().queuedBytes, 40)
  queue.endRead()
  t.equal(sink.writes.length, 2, 'one write for the read')
  const chunk = sink.writes[1]!.chunk
  t.same(ids(chunk), [2, 3, 4, 5, 6])
  t.equal(chunk.buffer, sink.writes[0]!.chunk.buffer, 'a view of the same slab: no copy')
  t.match(queue.stats(), { immediateWrites: 1, batchedWrites: 1, batchedFrames: 5, queuedTransfers: 0, queuedBytes: 0 })
  t.ok(queue.isIdle)
})

t.test('in-place frames keep their order among enqueued transfers, and batchFrames counts each of them', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { batchFrames: 4 })
  queue.beginRead()
  inPlace(queue, 1)
  inPlace(queue, 2)
  const c = transfer(3)
  queue.enqueue(c)
  t.equal(sink.writes.length, 0)
  inPlace(queue, 4)
  t.equal(sink.writes.length, 1, 'four frames: the batch goes out during the read')
  t.same(ids(sink.writes[0]!.chunk), [1, 2, 3, 4])
  inPlace(queue, 5)
  queue.endRead()
  t.equal(sink.writes.length, 2)
  t.same(ids(sink.writes[1]!.chunk), [5])
  t.same(c.sent, [undefined])
  t.match(queue.stats(), { batchedWrites: 1, batchedFrames: 4, immediateWrites: 1 })
})

t.test('in place unless held or closed; a large room is a piece of its own; over the bound nothing is queued', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { maxOutboundBytes: 100 })
  t.not(queue.inPlaceChunk, null, 'in place')
  queue.hold()
  t.equal(queue.inPlaceChunk, null, 'held: frames must stay droppable')
  queue.release()
  sink.writeReturns = false
  const shared = queue.inPlaceChunk
  t.equal(inPlace(queue, 1), true)
  t.not(queue.inPlaceChunk, shared, 'waiting for drain: in place, in a chunk of its own')
  sink.writeReturns = true
  queue.onSocketDrain()
  t.equal(queue.inPlaceChunk, shared, 'drained: the shared slab again')
  sink.writableLength = 95
  t.equal(inPlace(queue, 2, 8), false, 'over the outbound bound: refused')
  t.equal(queue.stats().queuedTransfers, 0, 'nothing queued')
  t.equal(inPlace(queue, 3, 5), true, 'within it')
  sink.writableLength = 0
  const big = new TransferQueue(new FakeSink())
  big.beginRead()
  t.equal(inPlace(big, 4, MAX_IN_PLACE_FRAME_BYTES + 1), true)
  t.match(big.stats(), { queuedTransfers: 1, queuedBytes: MAX_IN_PLACE_FRAME_BYTES + 1 }, 'a large room: one frame of its own')
  queue.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed'))
  t.equal(queue.inPlaceChunk, null, 'closed')
})

t.test('in-place frames dropped by close are counted; frames over a slab\'s end start a new slab and stay intact', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { batchFrames: 1000 })
  queue.beginRead()
  // 40 frames of 3 KiB cross the 64 KiB slab.
  for (let id = 1; id <= 40; id++) t.equal(inPlace(queue, id, 3000), true)
  queue.endRead()
  await nextTick()
  const expected = Buffer.concat(Array.from({ length: 40 }, (_, i) => Buffer.alloc(3000, i + 1)))
  t.ok(sink.bytes().equals(expected), 'every byte in order, none overwritten by a later frame')
  t.equal(queue.stats().queuedTransfers, 0)

  const closing = new TransferQueue(new FakeSink(), { coalesceMicrotasks: true })
  closing.beginRead()
  inPlace(closing, 1)
  inPlace(closing, 2)
  closing.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed'))
  t.match(closing.stats(), { dropped: 2, queuedTransfers: 0, queuedBytes: 0 })
})

t.test('queues share the slab: interleaved in-place frames reach each socket intact and in order', async t => {
  const sinks = [new FakeSink(), new FakeSink(), new FakeSink()]
  const queues = sinks.map(sink => new TransferQueue(sink, { coalesceMicrotasks: true, batchFrames: 1000 }))
  const expected: Buffer[][] = sinks.map(() => [])
  let id = 0
  // Frames of varied size, round robin over the queues, across several 64 KiB slabs.
  for (let i = 0; i < 600; i++) {
    const q = i % 3
    const bytes = [5, 300, 1500, 4000][i % 4]!
    const value = (++id % 250) + 1
    t.equal(inPlace(queues[q]!, value, bytes), true)
    expected[q]!.push(Buffer.alloc(bytes, value))
    if (i % 50 === 49) await Promise.resolve()
  }
  await nextTick()
  for (let q = 0; q < 3; q++) t.ok(sinks[q]!.bytes().equals(Buffer.concat(expected[q]!)), `queue ${q}: its own frames, in order, unchanged`)
})

t.test('while waiting for drain, small frames are encoded in place in a chunk of the queue\'s own: one entry for many frames, bytes intact', async t => {
  const sink = new FakeSink()
  const other = new TransferQueue(new FakeSink(), { coalesceMicrotasks: true })
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true, batchFrames: 1000 })
  sink.writeReturns = false
  t.equal(inPlace(queue, 1, 10), true)
  await nextTick()
  t.equal(queue.isWaitingDrain, true, 'backed up')
  const expected: Buffer[] = []
  // 5000 answers of 7 bytes, with another queue taking the shared slab between them.
  for (let i = 0; i < 5000; i++) {
    const value = (i % 250) + 1
    t.equal(inPlace(queue, value, 7), true)
    expected.push(Buffer.alloc(7, value))
    if (i % 100 === 0) {
      t.not(other.inPlaceChunk, queue.inPlaceChunk, 'not the shared slab')
      t.equal(inPlace(other, value, 8), true)
    }
  }
  const stats = queue.stats()
  t.equal(stats.queuedTransfers, 5000)
  t.ok(stats.queuedEntries <= Math.ceil(5000 * 7 / (16 * 1024)) + 1, `${stats.queuedEntries} entries for 5000 frames (a buffer and a transfer each before)`)
  sink.writeReturns = true
  queue.onSocketDrain()
  t.ok(sink.bytes().subarray(10).equals(Buffer.concat(expected)), 'every byte in order')
  t.equal(queue.stats().queuedEntries, 0)
})

t.test('while waiting for drain, small frames without hooks are copied into runs: they cost their bytes, not a transfer each', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  sink.writeReturns = false
  queue.enqueue({ slices: [Buffer.from('first')], bytes: 5 })
  t.ok(queue.isWaitingDrain, 'the kernel refused: the queue waits for drain')
  sink.writeReturns = true
  const parts: Buffer[] = []
  for (let i = 0; i < 1000; i++) {
    // A part of two slices, as a protocol's encoder may make one (a plain Uint8Array among them).
    const part = [Buffer.from(`part ${i}:`), new Uint8Array([0x30 + (i % 10), 0x0a])]
    parts.push(Buffer.concat(part))
    queue.enqueue({ slices: part as Buffer[], bytes: part[0]!.length + 2 })
  }
  const stats = queue.stats()
  t.equal(stats.queuedTransfers, 1000, 'every frame is queued')
  t.ok(stats.queuedEntries <= 2, `1,000 small frames in ${stats.queuedEntries} queue entries (one per 16 KiB chunk), not 1,000`)
  const hooked: Array<RpcError | undefined> = []
  queue.enqueue({ slices: [Buffer.from('hooked\n')], bytes: 7, onSent: (error) => hooked.push(error) })
  t.equal(queue.stats().queuedEntries, stats.queuedEntries + 1, 'a frame with hooks stays a transfer of its own (it may still be dropped)')
  queue.onSocketDrain()
  t.equal(sink.bytes().toString(), `first${Buffer.concat(parts).toString()}hooked\n`, 'the frames leave whole and in order')
  await nextTick()
  t.ok(hooked.length <= 1, 'the hooked frame is reported once at most')
})

t.test('a batch copies plain Uint8Array slices as it copies Buffers (a protocol may answer with them)', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.beginRead()
  queue.enqueue({ slices: [Buffer.from('a:')], bytes: 2 })
  queue.enqueue({ slices: [new Uint8Array([0x62, 0x0a]) as Buffer], bytes: 2 })
  queue.endRead()
  t.equal(sink.bytes().toString(), 'a:b\n', 'both frames, in one write')
})

t.test('while waiting for drain, a small frame of pieces (a slice appended among runs) is copied whole, and the next frames do not overwrite it', async t => {
  // The io_uring transport refuses a write while its send is in flight, so an
  // answer of pieces lands here often: a KRPC answer with sidecars of a few
  // hundred bytes each came out with later answers' bytes in it.
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  sink.writeReturns = false
  t.equal(inPlace(queue, 1, 16), true)
  t.ok(queue.isWaitingDrain, 'backed up: frames go to the queue\'s own chunk')
  const sidecar = Buffer.alloc(2000, 0xee)
  const PIECES = {
    encode (id: number, _: number, out: FrameSink): void {
      const head = out.reserve(16)
      out.buffer.fill(id, head, head + 16)
      out.append(sidecar) // over APPEND_COPY_BYTES: a piece of its own, a view of `sidecar`
      const tail = out.reserve(10)
      out.buffer.fill(id, tail, tail + 10)
    }
  }
  t.equal(writeFrame(queue, PIECES, 2, 0), true)
  const expected = [Buffer.alloc(16, 1), Buffer.alloc(16, 2), sidecar, Buffer.alloc(10, 2)]
  for (let id = 3; id < 40; id++) {
    t.equal(inPlace(queue, id, 50), true)
    expected.push(Buffer.alloc(50, id))
  }
  sink.writeReturns = true
  queue.onSocketDrain()
  await nextTick()
  t.ok(sink.bytes().equals(Buffer.concat(expected)), 'every byte in order')
})
