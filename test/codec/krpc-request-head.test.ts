/**
 * reserveRequestFrame (the client's one-pass request head) against the
 * frame encoder of reference, byte for byte: call ids at every varint
 * length and negative, bodies short and long, with and without a timeout.
 */
import t from 'tap'
import { FrameBuffer, FrameChunk } from '../../codec/frame-sink.js'
import { encodeRemoteMethod, encodeRequestFrame } from '../../codec/krpc/encode-frame.js'
import { requestHeaderTail, reserveRequestFrame, writeRequestFrame } from '../../codec/krpc/write-frame.js'

t.test('reserveRequestFrame writes what encodeRequestFrame and writeRequestFrame encode', async t => {
  const remoteMethod = encodeRemoteMethod('demo.Calculator', 'Add')
  const ids = [0, 1, 127, 128, 16383, 16384, 0x1fffff, 0x200000, 0xfffffff, 0x10000000, 0x7fffffff, -1, -0x80000000]
  let checked = 0
  for (const timeoutMs of [0, 60_000]) {
    const tail = requestHeaderTail(remoteMethod, timeoutMs)
    for (const bodyBytes of [0, 5, 127, 128, 300]) {
      const body = Buffer.alloc(bodyBytes, 0x61)
      for (const id of ids) {
        const expected = Buffer.concat(encodeRequestFrame({ callId: id, remoteMethod, timeoutMs }, body))
        const frame = new FrameBuffer()
        frame.begin(new FrameChunk(4096))
        const at = reserveRequestFrame(frame, id, tail, bodyBytes)
        body.copy(frame.buffer, at)
        const got = Buffer.concat(frame.pieces())
        if (!got.equals(expected)) t.fail(`id ${id}, body ${bodyBytes}, timeout ${timeoutMs}: ${got.toString('hex')} != ${expected.toString('hex')}`)
        const written = Buffer.alloc(expected.length)
        writeRequestFrame(written, 0, id, tail, body)
        if (!written.equals(expected)) t.fail(`writeRequestFrame, id ${id}`)
        checked++
      }
    }
  }
  t.equal(checked, 2 * 5 * ids.length)
})
