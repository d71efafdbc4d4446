/**
 * Both decoders fed ranges of larger buffers (`pushRanges(chunk, sink,
 * from, to)`, what a connection reading a shared slab hands them): only the
 * range is read, frames that span ranges come out whole, and after a sink
 * stopped the decoding, `consumed` is an offset in the chunk.
 */
import t from 'tap'
import { lines } from '../../codec/framings.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { FrameDecoder, type Deframer } from '../../codec/frame-decoder.js'
import { ScanDecoder } from '../../codec/scan-decoder.js'

function prefixed (body: string): Buffer {
  const out = Buffer.alloc(4 + body.length)
  out.writeUInt32BE(body.length, 0)
  out.write(body, 4, 'latin1')
  return out
}

const kinds: Array<{ name: string, make: () => Deframer, frame: (body: string) => Buffer }> = [
  { name: 'length-prefixed', make: () => new FrameDecoder(krpcFraming), frame: prefixed },
  { name: 'scanned', make: () => new ScanDecoder(lines({ max: 4096 })), frame: (body) => Buffer.from(`${body}\n`, 'latin1') }
]

for (const { name, make, frame } of kinds) {
  t.test(`${name}: ranges of larger buffers, cut anywhere, give the frames whole`, async (t) => {
    const bodies = ['alpha', 'b', 'gamma-gamma', 'delta', 'e'.repeat(300), 'omega']
    const wire = Buffer.concat(bodies.map(frame))
    for (const step of [1, 2, 3, 7, 64, wire.length]) {
      const decoder = make()
      const got: string[] = []
      for (let at = 0; at < wire.length; at += step) {
        const piece = wire.subarray(at, at + step)
        // The range sits between bytes that are not the stream's.
        const chunk = Buffer.concat([Buffer.from('#####'), piece, Buffer.from('%%%')])
        const error = decoder.pushRanges(chunk, (buf, start, end) => { got.push(buf.toString('latin1', start, end)) }, 5, 5 + piece.length)
        t.equal(error, null)
      }
      t.same(got, bodies.map((b) => frame(b).toString('latin1')), `reads of ${step} bytes`)
    }
  })

  t.test(`${name}: a sink that stops the decoding: consumed is an offset in the chunk`, async (t) => {
    const decoder = make()
    const chunk = Buffer.concat([Buffer.from('~~~'), frame('one'), frame('two'), frame('three'), Buffer.from('~~')])
    const end = chunk.length - 2
    const got: string[] = []
    t.equal(decoder.pushRanges(chunk, (buf, s, e) => { got.push(buf.toString('latin1', s, e)); return got.length < 2 }, 3, end), null)
    t.same(got, [frame('one'), frame('two')].map((f) => f.toString('latin1')))
    t.equal(decoder.consumed, 3 + frame('one').length + frame('two').length)
    got.length = 0
    t.equal(decoder.pushRanges(chunk, (buf, s, e) => { got.push(buf.toString('latin1', s, e)) }, decoder.consumed, end), null)
    t.same(got, [frame('three').toString('latin1')], 'the rest, from there')
  })

  t.test(`${name}: a range that completes a frame begun in an earlier read, then stops`, async (t) => {
    const decoder = make()
    const whole = Buffer.concat([frame('first-frame'), frame('second')])
    const cut = 6
    t.equal(decoder.pushRanges(whole.subarray(0, cut), () => { t.fail('not yet whole') }), null)
    t.ok(decoder.hasPartialFrame)
    const chunk = Buffer.concat([Buffer.from('@@@@'), whole.subarray(cut), Buffer.from('@')])
    const got: string[] = []
    t.equal(decoder.pushRanges(chunk, (buf, s, e) => { got.push(buf.toString('latin1', s, e)); return false }, 4, chunk.length - 1), null)
    t.same(got, [frame('first-frame').toString('latin1')])
    t.equal(decoder.consumed, 4 + frame('first-frame').length - cut, 'where the second frame starts in the chunk')
  })
}
