/**
 * How ScanDecoder holds a frame that spans reads: with a scanner that says
 * which bytes it still reads (`retainFrom`), large reads are kept as they
 * came and copied once into a buffer of the frame's exact size; what a
 * scanner claims the frame will need is checked against the limit, never
 * allocated; the scanner is handed each read itself, not the frame again.
 */
import t from 'tap'
import fc from 'fast-check'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameScanner, ScanFraming } from '../../codec/frame-decoder.js'
import { ScanDecoder } from '../../codec/scan-decoder.js'
import { lines } from '../../codec/framings.js'

const MiB = 1024 * 1024

/**
 * `<length>:<data>`: a frame that says its size in a decimal header, so its
 * scanner knows it exactly once the `:` is in, and skips the data.
 * Records the buffers it was handed (their lengths and the bytes it was
 * shown of the frame) for the tests to look at.
 */
class LengthScanner implements FrameScanner {
  #pos = 0
  #size = 0
  /** The largest `end - max(start, 0)` a scan was given: how much of the frame it was shown at once. */
  shown = 0
  scan (buf: Buffer, start: number, end: number): number | RpcError {
    this.shown = Math.max(this.shown, end - Math.max(start, 0))
    if (this.#size > 0) return end - start >= this.#size ? this.#size : -this.#size
    for (let p = start + this.#pos; p < end; p++) {
      const c = buf[p]!
      if (c === 0x3a) {
        const length = Number(buf.toString('latin1', start, p))
        this.#size = p + 1 - start + length
        return end - start >= this.#size ? this.#size : -this.#size
      }
      if (c < 0x30 || c > 0x39) return new RpcError(ErrorCode.MALFORMED_FRAME, 'bad length')
    }
    this.#pos = end - start
    return 0
  }

  // It rereads its header's digits from the frame's start; it never reads the data.
  retainFrom (): number {
    return this.#size > 0 ? this.#size : 0
  }

  reset (): void {
    this.#pos = 0
    this.#size = 0
  }
}

function lengthFraming (scanner: LengthScanner): ScanFraming {
  return { scanner: () => scanner }
}

/** `buf` cut into reads of `step` bytes, each in memory of its own (as a socket's reads are). */
function reads (buf: Buffer, step: number): Buffer[] {
  const out: Buffer[] = []
  for (let at = 0; at < buf.length; at += step) out.push(Buffer.from(buf.subarray(at, at + step)))
  return out
}

function lengthFrame (size: number, fill: number): Buffer {
  const head = Buffer.from(`${size}:`, 'latin1')
  return Buffer.concat([head, Buffer.alloc(size, fill)])
}

t.test('a large frame of many reads: kept as the reads, handed on in a buffer of its exact size', async (t) => {
  const scanner = new LengthScanner()
  const decoder = new ScanDecoder(lengthFraming(scanner), 8 * MiB)
  const frame = lengthFrame(3 * MiB, 7)
  const next = lengthFrame(10, 9)
  const chunks = reads(Buffer.concat([frame, next]), 64 * 1024)
  const got: Array<{ length: number, bufLength: number, start: number, sum: number }> = []
  let maxHeld = 0
  let heldMatched = 0
  for (const chunk of chunks) {
    const error = decoder.pushRanges(chunk, (buf, start, end) => {
      let sum = 0
      for (let i = start; i < end; i++) sum += buf[i]!
      got.push({ length: end - start, bufLength: buf.length, start, sum })
    })
    t.equal(error, null)
    maxHeld = Math.max(maxHeld, decoder.heldBytes)
    // The reads are kept as they came (views of their own memory), nothing more.
    if (decoder.hasPartialFrame && decoder.heldBytes === decoder.bufferedBytes) heldMatched++
  }
  t.equal(got.length, 2, 'both frames')
  t.same(got[0], { length: frame.length, bufLength: frame.length, start: 0, sum: 7 * 3 * MiB + sumOf(frame.subarray(0, frame.indexOf(0x3a) + 1)) }, 'the large frame whole, in a buffer of exactly its size')
  t.equal(got[1]!.length, next.length)
  t.equal(heldMatched, chunks.length - 1, 'while it arrived, what was held was what had arrived')
  t.ok(maxHeld <= frame.length, `held at most the frame (${maxHeld})`)
  t.ok(scanner.shown <= 64 * 1024 + 512, `the scanner was shown one read at a time (at most ${scanner.shown} bytes), not the frame so far`)
  t.equal(decoder.heldBytes, 0, 'nothing held after it')
})

function sumOf (buf: Buffer): number {
  let sum = 0
  for (const b of buf) sum += b
  return sum
}

t.test('a header claiming more than the limit is refused at once, nothing allocated for it', async (t) => {
  for (const claim of [2 ** 31, 8 * MiB + 1]) {
    const decoder = new ScanDecoder(lengthFraming(new LengthScanner()), 8 * MiB)
    const error = decoder.pushRanges(Buffer.from(`${claim}:abc`, 'latin1'), () => { t.fail('no frame') })
    t.ok(error instanceof RpcError, `${claim}: an error`)
    t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
    t.equal(decoder.heldBytes, 0, 'nothing held')
    t.equal(decoder.pushRanges(Buffer.from('more'), () => { t.fail('no frame') }), error, 'and the decoder refuses more input')
  }
})

t.test('a header claiming less than the limit, then little: what is held is what arrived', async (t) => {
  const decoder = new ScanDecoder(lengthFraming(new LengthScanner()), 64 * MiB)
  t.equal(decoder.pushRanges(Buffer.from(`${60 * MiB}:abc`, 'latin1'), () => { t.fail('no frame') }), null)
  t.ok(decoder.hasPartialFrame)
  t.ok(decoder.heldBytes <= 4096, `held ${decoder.heldBytes} bytes for a 60 MiB claim`)
  // A trickle of small reads: copied into blocks that grow with what arrived, not one view each.
  for (let i = 0; i < 1000; i++) t.equal(decoder.pushRanges(Buffer.from('xyz'), () => { t.fail('no frame') }), null)
  t.equal(decoder.bufferedBytes, `${60 * MiB}:abc`.length + 3000)
  t.ok(decoder.heldBytes <= 2 * decoder.bufferedBytes + 4096, `held ${decoder.heldBytes} for ${decoder.bufferedBytes} received`)
})

t.test('bytes past the limit without an end are refused when they arrive', async (t) => {
  const decoder = new ScanDecoder(lines({ max: 10_000_000 }), 100_000)
  let error: RpcError | null = null
  let reads = 0
  while (error === null && reads < 100) {
    error = decoder.pushRanges(Buffer.alloc(16 * 1024, 0x61), () => { t.fail('no frame') })
    reads++
  }
  t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
  t.equal(reads, 7, 'on the read that takes it past 100,000 bytes')
  t.equal(decoder.heldBytes, 0)
})

for (const delimiter of ['\n', '\r\n']) t.test(`lines (${JSON.stringify(delimiter)}) split anywhere, with and without retainFrom, give the frames of one read`, async (t) => {
  const framing = lines({ max: 1 << 20, delimiter })
  // The same line scanner, its retainFrom hidden: the decoder then assembles each frame whole.
  const whole: ScanFraming = {
    scanner: () => {
      const inner = framing.scanner()
      return { scan: (buf, start, end) => inner.scan(buf, start, end), reset: () => { inner.reset() } }
    }
  }
  const line = fc.oneof(fc.string({ maxLength: 40 }), fc.string({ minLength: 300, maxLength: 3000 })).map((s) => s.replace(/[\r\n]/g, ' '))
  fc.assert(fc.property(fc.array(line, { minLength: 1, maxLength: 12 }), fc.array(fc.integer({ min: 1, max: 700 }), { minLength: 1, maxLength: 20 }), (texts, steps) => {
    const stream = Buffer.from(texts.map((s) => s + delimiter).join(''), 'utf8')
    const expected = split(new ScanDecoder(framing, 1 << 20), [stream])
    const chunks: Buffer[] = []
    for (let at = 0, i = 0; at < stream.length; i++) {
      const step = steps[i % steps.length]!
      chunks.push(Buffer.from(stream.subarray(at, at + step)))
      at += step
    }
    const retained = split(new ScanDecoder(framing, 1 << 20), chunks)
    const assembled = split(new ScanDecoder(whole, 1 << 20), chunks)
    return expected.length === texts.length && same(retained, expected) && same(assembled, expected)
  }), { numRuns: 300 })
  t.pass('300 streams')
})

t.test('length-prefixed frames split anywhere give the frames of one read', async (t) => {
  fc.assert(fc.property(fc.array(fc.integer({ min: 0, max: 70_000 }), { minLength: 1, maxLength: 6 }), fc.array(fc.integer({ min: 1, max: 40_000 }), { minLength: 1, maxLength: 10 }), (sizes, steps) => {
    const stream = Buffer.concat(sizes.map((size, i) => lengthFrame(size, i + 1)))
    const chunks: Buffer[] = []
    for (let at = 0, i = 0; at < stream.length; i++) {
      const step = steps[i % steps.length]!
      chunks.push(Buffer.from(stream.subarray(at, at + step)))
      at += step
    }
    const got = split(new ScanDecoder(lengthFraming(new LengthScanner()), 1 << 20), chunks)
    return same(got, sizes.map((size, i) => lengthFrame(size, i + 1)))
  }), { numRuns: 200 })
  t.pass('200 streams')
})

function split (decoder: ScanDecoder, chunks: Buffer[]): Buffer[] {
  const out: Buffer[] = []
  for (const chunk of chunks) {
    const error = decoder.pushRanges(chunk, (buf, start, end) => { out.push(Buffer.from(buf.subarray(start, end))) })
    if (error !== null) throw error
  }
  return out
}

function same (a: Buffer[], b: Buffer[]): boolean {
  return a.length === b.length && a.every((x, i) => x.equals(b[i]!))
}
