/**
 * TransferQueue.flushNow: before a socket is ended, every queued frame is
 * handed to it at once, whether the queue was batching this turn, held, or
 * waiting for 'drain'; a closed queue writes nothing.
 */
import t from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { TransferQueue, type OutboundTransfer } from '../../transport/transfer-queue.js'
import { FakeSink, nextTick } from '../helpers/fake-sink.js'

function frame (id: number): OutboundTransfer & { sent: number } {
  const transfer = { slices: [Buffer.alloc(4, id)], bytes: 4, sent: 0, onSent: () => { transfer.sent++ } }
  return transfer
}

function bytesWritten (sink: FakeSink): number[] {
  return [...Buffer.concat(sink.writes.map((w) => w.chunk))]
}

t.test('frames batched for the end of the turn are written by flushNow, once', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  const frames = [frame(1), frame(2), frame(3)]
  for (const f of frames) queue.enqueue(f)
  t.equal(sink.writes.length, 1, 'the first at once, the rest wait for the turn to end')
  queue.flushNow()
  t.same(bytesWritten(sink), [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
  t.same(frames.map((f) => f.sent), [1, 1, 1])
  await nextTick()
  t.equal(sink.writes.length, 2, 'the end-of-turn flush finds nothing more')
})

t.test('flushNow writes even while waiting for drain, and while held', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  sink.writeReturns = false
  queue.enqueue(frame(1))
  sink.writeReturns = true
  queue.enqueue(frame(2))
  await nextTick()
  t.equal(sink.writes.length, 1, 'frame 2 waits for drain')
  queue.hold()
  queue.enqueue(frame(3))
  queue.flushNow()
  t.same(bytesWritten(sink), [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
  t.equal(queue.stats().queuedTransfers, 0)
})

t.test('a closed queue writes nothing on flushNow', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink)
  queue.hold()
  const f = frame(1)
  queue.enqueue(f)
  queue.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed'))
  queue.flushNow()
  t.equal(sink.writes.length, 0)
})
