/**
 * FrameDecoder: frames come out whole and identical however the stream is
 * chunked; frames inside one chunk are views; limits and bad prefixes are
 * returned errors, reported as early as possible.
 */
import t from 'tap'
import fc from 'fast-check'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { DEFAULT_MAX_MESSAGE_BYTES, FrameDecoder, type Framing } from '../../codec/frame-decoder.js'
import { encodeRequestFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { parseRequestFrame, parseResponseFrame } from '../../codec/krpc/parsed-frame.js'
import { hex, joinSlices, toHex } from '../helpers/bytes.js'
import { CLIENT_FRAMES, S_ADD_RESPONSE, S_TWO_SIDECARS, SERVER_FRAMES } from '../helpers/golden.js'

/** Feeds `chunks` to a fresh decoder; returns the frames (copied, so later pushes cannot change them) and the first error. */
function decode (chunks: readonly Buffer[], maxFrameBytes?: number): { frames: Buffer[], error: RpcError | null } {
  const decoder = new FrameDecoder(krpcFraming, maxFrameBytes)
  const frames: Buffer[] = []
  let error: RpcError | null = null
  for (const chunk of chunks) {
    const result = decoder.push(chunk, frame => { frames.push(Buffer.from(frame)) })
    if (result !== null) { error = result; break }
  }
  return { frames, error }
}

function cutAt (stream: Buffer, cuts: readonly number[]): Buffer[] {
  const points = [...new Set(cuts)].filter(c => c > 0 && c < stream.length).sort((a, b) => a - b)
  const chunks: Buffer[] = []
  let from = 0
  for (const point of points) { chunks.push(stream.subarray(from, point)); from = point }
  chunks.push(stream.subarray(from))
  return chunks
}

const GOLDEN = [...CLIENT_FRAMES, ...SERVER_FRAMES]
const STREAM = Buffer.concat(GOLDEN)
const EXPECTED = GOLDEN.map(toHex)

t.test('the golden stream in one chunk', async t => {
  const { frames, error } = decode([STREAM])
  t.equal(error, null)
  t.same(frames.map(toHex), EXPECTED)
})

t.test('the golden stream split into two chunks at every byte', async t => {
  for (let cut = 0; cut <= STREAM.length; cut++) {
    const { frames, error } = decode([STREAM.subarray(0, cut), STREAM.subarray(cut)])
    t.equal(error, null, `no error, cut at ${cut}`)
    t.same(frames.map(toHex), EXPECTED, `cut at ${cut}`)
  }
})

t.test('the golden stream one byte at a time', async t => {
  const chunks: Buffer[] = []
  for (let i = 0; i < STREAM.length; i++) chunks.push(STREAM.subarray(i, i + 1))
  const { frames, error } = decode(chunks)
  t.equal(error, null)
  t.same(frames.map(toHex), EXPECTED)
})

t.test('empty chunks change nothing', async t => {
  const empty = Buffer.alloc(0)
  const { frames, error } = decode([empty, STREAM.subarray(0, 2), empty, STREAM.subarray(2, 30), empty, STREAM.subarray(30), empty])
  t.equal(error, null)
  t.same(frames.map(toHex), EXPECTED)
})

t.test('bufferedBytes and hasPartialFrame follow a frame that spans chunks', async t => {
  const decoder = new FrameDecoder(krpcFraming)
  const seen: Buffer[] = []
  const sink = (frame: Buffer): void => { seen.push(frame) }
  t.equal(decoder.hasPartialFrame, false)
  t.equal(decoder.push(S_TWO_SIDECARS.subarray(0, 2), sink), null)
  t.equal(decoder.hasPartialFrame, true, 'inside the prefix')
  t.equal(decoder.bufferedBytes, 2)
  t.equal(decoder.push(S_TWO_SIDECARS.subarray(2, 10), sink), null)
  t.equal(decoder.bufferedBytes, 10)
  t.equal(seen.length, 0)
  t.equal(decoder.push(S_TWO_SIDECARS.subarray(10), sink), null)
  t.equal(seen.length, 1)
  t.equal(toHex(seen[0]!), toHex(S_TWO_SIDECARS))
  t.equal(decoder.hasPartialFrame, false)
  t.equal(decoder.bufferedBytes, 0)
})

t.test('many frames in one chunk are views of it, not copies', async t => {
  const count = 1000
  // Buffer.alloc is never pooled, so the chunk owns its ArrayBuffer alone.
  const chunk = Buffer.alloc(S_ADD_RESPONSE.length * count)
  for (let i = 0; i < count; i++) S_ADD_RESPONSE.copy(chunk, i * S_ADD_RESPONSE.length)
  const decoder = new FrameDecoder(krpcFraming)
  const frames: Buffer[] = []
  t.equal(decoder.push(chunk, frame => { frames.push(frame) }), null)
  t.equal(frames.length, count)
  let views = 0
  let offsets = 0
  let equal = 0
  for (let i = 0; i < count; i++) {
    const frame = frames[i]!
    if (frame.buffer === chunk.buffer) views++
    if (frame.byteOffset === chunk.byteOffset + i * S_ADD_RESPONSE.length) offsets++
    if (frame.equals(S_ADD_RESPONSE)) equal++
  }
  t.equal(views, count, 'every frame shares the chunk\'s ArrayBuffer')
  t.equal(offsets, count, 'every frame sits at its place in the chunk')
  t.equal(equal, count, 'every frame has the right bytes')
  t.equal(decoder.hasPartialFrame, false)
})

t.test('a frame that spans chunks is assembled into its own buffer', async t => {
  const first = Buffer.alloc(10)
  const second = Buffer.alloc(STREAM.length - 10)
  STREAM.copy(first, 0, 0, 10)
  STREAM.copy(second, 0, 10)
  const decoder = new FrameDecoder(krpcFraming)
  const frames: Buffer[] = []
  decoder.push(first, f => { frames.push(f) })
  decoder.push(second, f => { frames.push(f) })
  t.same(frames.map(toHex), EXPECTED)
  t.not(frames[0]!.buffer, first.buffer, 'the spanning frame is not a view of the first chunk')
  t.not(frames[0]!.buffer, second.buffer, 'nor of the second')
  t.equal(frames[1]!.buffer, second.buffer, 'the next frame, wholly in the second chunk, is a view')
})

t.test('an oversize prefix is reported as soon as its 4 bytes arrive', async t => {
  t.test('in one chunk, before any body byte', async t => {
    const decoder = new FrameDecoder(krpcFraming, 1000)
    let sunk = 0
    const error = decoder.push(hex('00 00 03 e5'), () => { sunk++ }) // 997 + 4 = 1001 bytes
    t.ok(error instanceof RpcError)
    t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
    t.match(error?.message, /1001/, 'the message names the length')
    t.equal(error?.fatal, true)
    t.equal(sunk, 0)
    t.equal(decoder.bufferedBytes, 0, 'nothing buffered for it')
    t.equal(decoder.hasPartialFrame, false)
  })
  t.test('one byte at a time: on the fourth byte', async t => {
    const decoder = new FrameDecoder(krpcFraming, 1000)
    const prefix = hex('00 00 03 e5')
    for (let i = 0; i < 3; i++) t.equal(decoder.push(prefix.subarray(i, i + 1), () => {}), null, `byte ${i}`)
    t.equal(decoder.push(prefix.subarray(3, 4), () => {})?.code, ErrorCode.FRAME_TOO_LARGE)
  })
  t.test('after complete frames in the same chunk', async t => {
    const decoder = new FrameDecoder(krpcFraming, 1000)
    const frames: Buffer[] = []
    const error = decoder.push(Buffer.concat([S_ADD_RESPONSE, hex('7f ff ff ff')]), f => { frames.push(f) })
    t.equal(frames.length, 1, 'the good frame before it is delivered')
    t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
  })
  t.test('the limit is inclusive and counts the prefix', async t => {
    const atLimit = Buffer.alloc(1000)
    atLimit.writeUInt32BE(996, 0)
    const { frames, error } = decode([atLimit], 1000)
    t.equal(error, null)
    t.equal(frames.length, 1)
    t.equal(frames[0]!.length, 1000)
  })
  t.test('the default limit is 50 MiB', async t => {
    t.equal(DEFAULT_MAX_MESSAGE_BYTES, 50 * 1024 * 1024)
    const error = new FrameDecoder(krpcFraming).push(hex('ff ff ff ff'), () => {})
    t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
    t.match(error?.message, /4294967299/)
    const over = Buffer.alloc(4)
    over.writeUInt32BE(DEFAULT_MAX_MESSAGE_BYTES - 3, 0)
    t.equal(new FrameDecoder(krpcFraming).push(over, () => {})?.code, ErrorCode.FRAME_TOO_LARGE)
    const at = Buffer.alloc(4)
    at.writeUInt32BE(DEFAULT_MAX_MESSAGE_BYTES - 4, 0)
    const decoder = new FrameDecoder(krpcFraming)
    t.equal(decoder.push(at, () => {}), null, 'a 50 MiB frame is accepted')
    decoder.stop()
  })
})

t.test('a length-0 prefix is a malformed frame', async t => {
  // the frame is malformed, whichever layer notices.
  const { frames, error } = decode([hex('00 00 00 00')])
  if (error !== null) {
    t.equal(error.code, ErrorCode.MALFORMED_FRAME)
  } else {
    t.equal(frames.length, 1)
    const asRequest = parseRequestFrame(frames[0]!)
    const asResponse = parseResponseFrame(frames[0]!)
    t.ok(asRequest instanceof RpcError && asRequest.code === ErrorCode.MALFORMED_FRAME, 'rejected as a request')
    t.ok(asResponse instanceof RpcError && asResponse.code === ErrorCode.MALFORMED_FRAME, 'rejected as a response')
  }
})

t.test('the decoder itself rejects a length-0 prefix, as Kudu does (total_length <= 4)', async t => {
  const { frames, error } = decode([hex('00 00 00 00')])
  t.equal(error?.code, ErrorCode.MALFORMED_FRAME)
  t.equal(frames.length, 0)
})

t.test('after an error the decoder keeps returning it', async t => {
  const decoder = new FrameDecoder(krpcFraming, 1000)
  let sunk = 0
  const sink = (): void => { sunk++ }
  const error = decoder.push(hex('00 01 00 00'), sink)
  t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
  t.equal(decoder.push(S_ADD_RESPONSE, sink), error, 'the same error for a good frame')
  t.equal(decoder.push(Buffer.alloc(0), sink), error, 'and for an empty chunk')
  t.equal(sunk, 0, 'nothing more reaches the sink')
})

t.test('a framing error from frameBytes is returned and sticks', async t => {
  const bad = new RpcError(ErrorCode.MALFORMED_FRAME, 'bad magic')
  const framing: Framing = { prefixBytes: 2, frameBytes: (buf, offset) => buf[offset] === 0xaa ? 2 + buf[offset + 1]! : bad }
  const decoder = new FrameDecoder(framing)
  const frames: Buffer[] = []
  t.equal(decoder.push(hex('aa 01 05 aa 00'), f => { frames.push(Buffer.from(f)) }), null)
  t.same(frames.map(toHex), ['aa 01 05', 'aa 00'], 'a frame as short as its prefix is legal for a framing that allows it')
  t.equal(decoder.push(hex('bb 00'), () => {}), bad)
  t.equal(decoder.push(hex('aa 00'), () => {}), bad)
})

t.test('stop() releases the partial frame and ignores later input', async t => {
  const decoder = new FrameDecoder(krpcFraming)
  let sunk = 0
  decoder.push(S_TWO_SIDECARS.subarray(0, 9), () => { sunk++ })
  t.equal(decoder.hasPartialFrame, true)
  decoder.stop()
  t.equal(decoder.hasPartialFrame, false)
  t.equal(decoder.bufferedBytes, 0)
  t.equal(decoder.push(STREAM, () => { sunk++ }), null)
  t.equal(sunk, 0)
})

t.test('a sink that returns false stops decoding the chunk', async t => {
  const decoder = new FrameDecoder(krpcFraming)
  let sunk = 0
  t.equal(decoder.push(STREAM, () => { sunk++; return false }), null)
  t.equal(sunk, 1)
  const other = new FrameDecoder(krpcFraming)
  let afterStop = 0
  other.push(STREAM, () => { afterStop++; other.stop() })
  t.equal(afterStop, 1, 'stop() from inside the sink also ends the chunk')
})

t.test('a 6 MiB frame in 64 KiB chunks', async t => {
  const sidecar = Buffer.alloc(6 * 1024 * 1024)
  for (let i = 0; i < sidecar.length; i += 4096) sidecar[i] = (i / 4096) & 0xff
  const encoded = joinSlices(encodeResponseFrame(42, false, hex('08 01'), [sidecar]))
  t.ok(encoded.length > 6 * 1024 * 1024)
  const decoder = new FrameDecoder(krpcFraming)
  const frames: Buffer[] = []
  const chunkBytes = 64 * 1024
  let growing = true
  let last = 0
  for (let at = 0; at < encoded.length; at += chunkBytes) {
    const error = decoder.push(encoded.subarray(at, at + chunkBytes), f => { frames.push(f) })
    if (error !== null) { t.fail(error.message); break }
    if (frames.length === 0) {
      if (decoder.bufferedBytes <= last) growing = false
      last = decoder.bufferedBytes
    }
  }
  t.ok(growing, 'bufferedBytes grows chunk by chunk')
  t.equal(frames.length, 1)
  t.ok(frames[0]!.equals(encoded), 'the frame is byte-identical')
  const parsed = parseResponseFrame(frames[0]!)
  if (parsed instanceof RpcError) throw parsed
  t.equal(parsed.header.call_id, 42)
  t.equal(parsed.sidecars.length, 1)
  t.ok(parsed.sidecars[0]!.equals(sidecar), 'the sidecar is intact')
  t.equal(decoder.hasPartialFrame, false)
})

// ---------------------------------------------------------------------------
// Properties.

const int32 = fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 })
const frameArb = fc.oneof(
  fc.record({
    callId: int32,
    timeoutMs: fc.nat(),
    body: fc.uint8Array({ maxLength: 200 }),
    sidecars: fc.array(fc.uint8Array({ maxLength: 100 }), { maxLength: 4 })
  }).map(f => joinSlices(encodeRequestFrame({ callId: f.callId, timeoutMs: f.timeoutMs, sidecars: f.sidecars }, f.body))),
  fc.record({
    callId: int32,
    isError: fc.option(fc.boolean(), { nil: undefined }),
    body: fc.uint8Array({ maxLength: 200 }),
    sidecars: fc.array(fc.uint8Array({ maxLength: 100 }), { maxLength: 4 })
  }).map(f => joinSlices(encodeResponseFrame(f.callId, f.isError, f.body, f.sidecars))),
  fc.constantFrom(...GOLDEN)
)

t.test('property: random frames round-trip through arbitrary chunking', async t => {
  fc.assert(fc.property(
    fc.array(frameArb, { minLength: 1, maxLength: 12 }),
    fc.array(fc.nat(), { maxLength: 30 }),
    (frames, rawCuts) => {
      const stream = Buffer.concat(frames)
      const cuts = rawCuts.map(c => c % (stream.length + 1))
      const { frames: out, error } = decode(cutAt(stream, cuts))
      return error === null && out.length === frames.length && out.every((f, i) => f.equals(frames[i]!))
    }
  ), { numRuns: 500 })
  t.pass('500 random streams')
})

function neverThrows (chunks: readonly Buffer[], maxFrameBytes: number): boolean {
  const decoder = new FrameDecoder(krpcFraming, maxFrameBytes)
  for (const chunk of chunks) {
    const error = decoder.push(chunk, frame => {
      const request = parseRequestFrame(frame)
      const response = parseResponseFrame(frame)
      for (const result of [request, response]) {
        if (result instanceof RpcError) {
          if (result.code !== ErrorCode.MALFORMED_FRAME) throw new Error(`unexpected code ${result.code}`)
        } else if (!Array.isArray(result.sidecars) || !Buffer.isBuffer(result.message)) {
          throw new Error('bad parse result')
        }
      }
    })
    if (error !== null) {
      if (error.code !== ErrorCode.FRAME_TOO_LARGE && error.code !== ErrorCode.MALFORMED_FRAME) throw new Error(`unexpected code ${error.code}`)
      return true
    }
  }
  return true
}

t.test('property: random bytes never throw and terminate', async t => {
  fc.assert(fc.property(
    fc.uint8Array({ maxLength: 2048 }),
    fc.array(fc.nat(), { maxLength: 8 }),
    (bytes, rawCuts) => {
      const stream = Buffer.from(bytes)
      return neverThrows(cutAt(stream, rawCuts.map(c => c % (stream.length + 1))), 4096)
    }
  ), { numRuns: 1000 })
  t.pass('1000 random byte streams')
})

t.test('property: random frame contents behind a correct prefix never throw', async t => {
  // A correct prefix makes every random body reach the frame parsers.
  fc.assert(fc.property(fc.array(fc.uint8Array({ maxLength: 300 }), { minLength: 1, maxLength: 6 }), contents => {
    const stream = Buffer.concat(contents.map(c => {
      const frame = Buffer.alloc(4 + c.length)
      frame.writeUInt32BE(c.length, 0)
      frame.set(c, 4)
      return frame
    }))
    return neverThrows([stream], DEFAULT_MAX_MESSAGE_BYTES)
  }), { numRuns: 1000 })
  t.pass('1000 random frame bodies')
})

t.test('property: golden frames with corrupted bytes never throw', async t => {
  fc.assert(fc.property(
    fc.constantFrom(...GOLDEN),
    fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 4 }),
    (golden, edits) => {
      const frame = Buffer.from(golden)
      // Keep the prefix so the corruption lands in the header, varints and offsets.
      for (const [at, value] of edits) frame[4 + (at % (frame.length - 4))] = value
      return neverThrows([frame], 4096)
    }
  ), { numRuns: 2000 })
  t.pass('2000 corrupted golden frames')
})

t.test('a frame that spans chunks holds memory for what arrived, not for what its prefix announced', async t => {
  const decoder = new FrameDecoder(krpcFraming)
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(50 * 1024 * 1024 - 4)
  t.equal(decoder.push(prefix, () => {}), null)
  t.equal(decoder.announcedBytes, 50 * 1024 * 1024)
  t.ok(decoder.heldBytes <= 16 * 1024, `a prefix alone holds little (${decoder.heldBytes})`)
  const piece = Buffer.alloc(64 * 1024)
  for (let i = 0; i < 16; i++) decoder.push(piece, () => {})
  t.equal(decoder.bufferedBytes, 4 + 1024 * 1024)
  t.ok(decoder.heldBytes <= 2 * decoder.bufferedBytes + 16 * 1024, `1 MiB of 50 holds at most about 2 MiB (${decoder.heldBytes})`)
  for (let i = 0; i < 48; i++) decoder.push(piece, () => {})
  t.equal(decoder.bufferedBytes, 4 + 4 * 1024 * 1024)
  t.ok(decoder.heldBytes <= decoder.bufferedBytes + 1024 * 1024, `past 1 MiB it takes 1 MiB blocks: 4 MiB of 50 holds at most 5 (${decoder.heldBytes})`)
  // The whole frame still comes out intact.
  const small = new FrameDecoder(krpcFraming)
  const body = Buffer.alloc(200_000)
  for (let i = 0; i < body.length; i++) body[i] = i % 251
  const len = Buffer.alloc(4)
  len.writeUInt32BE(body.length)
  const frames: Buffer[] = []
  const stream = Buffer.concat([len, body])
  for (let at = 0; at < stream.length; at += 1000) small.push(stream.subarray(at, at + 1000), f => { frames.push(Buffer.from(f)) })
  t.equal(frames.length, 1)
  t.ok(frames[0]!.equals(stream))
  t.equal(small.heldBytes, 0)
})

t.test('maxFrameBytes can be changed between frames (set-up frames have a lower limit)', async t => {
  const decoder = new FrameDecoder(krpcFraming, 1000)
  decoder.maxFrameBytes = 100
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(200)
  const error = decoder.push(prefix, () => {})
  t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
})

t.test('frames of many blocks come out intact however they are cut', async t => {
  const rand = (() => { let x = 12345; return () => { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; return (x >>> 0) / 2 ** 32 } })()
  for (const size of [1024 * 1024 - 4, 1024 * 1024, 1024 * 1024 + 1, 3 * 1024 * 1024 + 12_345]) {
    const body = Buffer.allocUnsafe(size)
    for (let i = 0; i < size; i += 4096) body[i] = (i / 4096) & 0xff
    const len = Buffer.alloc(4)
    len.writeUInt32BE(size)
    const stream = Buffer.concat([len, body, len.subarray(0, 2)])
    const decoder = new FrameDecoder(krpcFraming)
    const frames: Buffer[] = []
    let at = 0
    while (at < stream.length) {
      const n = 1 + Math.floor(rand() * 200_000)
      decoder.push(stream.subarray(at, at + n), f => { frames.push(Buffer.from(f)) })
      at += n
    }
    t.equal(frames.length, 1, `${size}: one frame`)
    t.ok(frames[0]!.equals(stream.subarray(0, 4 + size)), `${size}: intact`)
    t.equal(decoder.bufferedBytes, 2, 'the next prefix is pending')
  }
})
