/**
 * Frames encoded once for many connections (transport/shared-frame.ts): laid
 * out side by side in the push slab, queued on each connection as a range of
 * it (`commitRun`), so that one connection's consecutive pushes are one run
 * and leave in one write; a queue that waits for 'drain' (or is held, or
 * closed) takes no run of the shared slab.
 */
import t from 'tap'
import { RpcError, ErrorCode } from '../../codec/errors.js'
import type { FrameSink } from '../../codec/frame-sink.js'
import { encodeShared, sharedRange } from '../../transport/shared-frame.js'
import { TransferQueue } from '../../transport/transfer-queue.js'
import { FakeSink } from '../helpers/fake-sink.js'

const microtasks = (): Promise<void> => new Promise(resolve => setImmediate(resolve))

function text (message: string, out: FrameSink): void {
  out.append(Buffer.from(message, 'latin1'))
}

/** Encodes `message` into the push slab; its range (it must be one). */
function shared (message: string): { buffer: Buffer, start: number, bytes: number } {
  const slices = encodeShared(text, null, message)
  if (slices !== null) throw new Error('not in place')
  return { buffer: sharedRange.buffer, start: sharedRange.start, bytes: sharedRange.end - sharedRange.start }
}

t.test('consecutive pushes to two queues: one run each, written as one buffer holding every push in order', async t => {
  const sinks = [new FakeSink(), new FakeSink()]
  const queues = sinks.map(sink => new TransferQueue(sink, { coalesceMicrotasks: true }))
  const sent: string[] = []
  for (let i = 0; i < 16; i++) {
    const message = `>message ${i}\n`
    sent.push(message)
    const range = shared(message)
    t.equal(range.buffer.toString('latin1', range.start, range.start + range.bytes), message, 'the bytes laid out')
    for (const queue of queues) {
      t.equal(queue.takesRuns, true)
      t.equal(queue.commitRun(range.buffer, range.start, range.bytes), true)
    }
  }
  for (const queue of queues) t.equal(queue.stats().queuedEntries, 1, 'one run for 16 pushes')
  await microtasks()
  for (const sink of sinks) {
    t.equal(sink.writes.length, 1, 'one write')
    t.equal(sink.writes[0]!.chunk.toString('latin1'), sent.join(''))
  }
})

t.test('a queue waiting for drain, held or closed takes no run of the shared slab', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  t.equal(queue.takesRuns, true)
  sink.writeReturns = false
  queue.enqueue({ slices: [Buffer.from('x')], bytes: 1 })
  await microtasks()
  t.equal(queue.isWaitingDrain, true)
  t.equal(queue.takesRuns, false, 'waiting for drain')
  sink.writeReturns = true
  queue.onSocketDrain()
  t.equal(queue.takesRuns, true, 'drained')
  queue.hold()
  t.equal(queue.takesRuns, false, 'held')
  queue.release()
  t.equal(queue.takesRuns, true)
  queue.close(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed'))
  t.equal(queue.takesRuns, false, 'closed')
})

t.test('a stream still holding bytes of earlier writes takes no run: a write waiting there would pin the shared slab uncounted', async t => {
  const sink = new FakeSink()
  const queue = new TransferQueue(sink, { coalesceMicrotasks: true })
  // The stream took the last write (write returned true) but could not pass it all to the kernel yet.
  sink.writableLength = 4096
  t.equal(queue.isWaitingDrain, false)
  t.equal(queue.takesRuns, false, 'bytes wait in the stream')
  sink.writableLength = 0
  t.equal(queue.takesRuns, true, 'the stream passed them on')
})

t.test('a push with a large appended slice is slices (the slice as it is); nothing encoded is none; a throw keeps nothing', async t => {
  const large = Buffer.alloc(4096, 0x61)
  const slices = encodeShared((message: Buffer, out: FrameSink) => {
    out.append(Buffer.from('head'))
    out.append(message)
    out.append(Buffer.from('tail'))
  }, null, large)
  t.not(slices, null)
  t.equal(Buffer.concat(slices!).toString('latin1'), `head${large.toString('latin1')}tail`)
  t.ok(slices!.includes(large), 'the large slice is not copied')

  // The head and tail are copied out of the push slab: a view of it queued
  // on a connection that stops reading would keep the whole slab alive for
  // the few bytes its bounds count. The slab's room is free again.
  const ahead = shared('x')
  const pieces = encodeShared((message: Buffer, out: FrameSink) => {
    out.append(Buffer.from('head'))
    out.append(message)
  }, null, large)
  const next = shared('y')
  t.equal(Buffer.concat(pieces!).toString('latin1'), `head${large.toString('latin1')}`)
  t.ok(pieces!.every(piece => piece.buffer !== next.buffer.buffer), 'no piece is a view of the push slab')
  t.equal(next.start, ahead.start + ahead.bytes, 'the copied frame left no room taken in the slab')

  t.same(encodeShared(() => {}, null, 'nothing'), [], 'nothing encoded: no slices')

  const before = shared('a')
  t.throws(() => encodeShared((_m: string, out: FrameSink) => { out.append(Buffer.from('half')); throw new Error('boom') }, null, 'x'), /boom/)
  const after = shared('b')
  t.equal(after.start, before.start + before.bytes, 'the thrown frame took no room: the next one follows the last one kept')
  t.equal(before.buffer.toString('latin1', before.start, before.start + 1), 'a', 'the frame before is untouched')
})

t.test('an encoder that pushes while it encodes: the inner push gets bytes of its own, the outer stays whole', async t => {
  let inner: Buffer[] | null = null
  const outer = encodeShared((message: string, out: FrameSink) => {
    out.append(Buffer.from(`${message}-1 `))
    inner = encodeShared(text, null, 'inner')
    out.append(Buffer.from(`${message}-2`))
  }, null, 'outer')
  t.equal(outer, null, 'the outer push is in place')
  t.equal(sharedRange.buffer.toString('latin1', sharedRange.start, sharedRange.end), 'outer-1 outer-2')
  t.not(inner, null)
  t.equal(Buffer.concat(inner!).toString('latin1'), 'inner')
})
