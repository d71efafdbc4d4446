// The server-side generator: valid requests, then mutants of them.
import { MAX_SIDECARS } from '../../codec/krpc/frames.js'
import { Pb, type RequestSpec, encodeSpec, encodeSpecWithOffsets, fixPrefix, frameOf, layoutOf, remoteMethodOf, u32be, varintBuf, withPrefix } from './frames.js'
import { FUZZ_MAX_MESSAGE_BYTES, type FoundBug, M, SERVICE } from './options.js'
import { Rng, Weighted } from './rng.js'

const METHODS = ['Add', 'Echo', 'PushStrings', 'EchoSidecars', 'Sleep'] as const
const ODD_METHODS = ['', 'add', 'Add ', 'Nope', 'A'.repeat(300), '\u0000', 'é', 'Sleep\u0000', 'EchoSidecar', 'PushStrings2']
/** Object.prototype keys: a known bug (the server looks methods up in plain objects). */
const PROTOTYPE_NAMES = ['toString', '__proto__', 'constructor', 'hasOwnProperty', 'valueOf', 'isPrototypeOf']
const ODD_SERVICES = ['', 'nyala.demo.CalculatorServic', `${SERVICE} `, 'kudu.rpc.Nope', 'x'.repeat(300), 'nyala.demo']
/** int32 values at the edges of varint lengths and signs. */
export const INTERESTING_INT32 = [0, 1, -1, -3, -33, 0x7fffffff, -0x80000000, 127, 128, 16383, 16384]
/** uint32 values at the edges of varint lengths and of the server's frame limit. */
export const INTERESTING_U32 = [0, 1, 0x7f, 0x80, 0x3fff, 0x4000, 0x7fffffff, 0x80000000, 0xffffffff, FUZZ_MAX_MESSAGE_BYTES, FUZZ_MAX_MESSAGE_BYTES + 1]
/** Bytes that are protobuf tags, varint edges or lengths. */
export const INTERESTING_BYTES = [0x00, 0x01, 0x7f, 0x80, 0xff, 0x08, 0x10, 0x18, 0x32, 0x50, 0x80, 0x0a, 0x12]

type MutationOp = 'bitflip' | 'byte' | 'truncate' | 'truncateFixed' | 'insert' | 'delete' | 'lyingPrefix' | 'headerLen' | 'bodyLen' |
'overlong' | 'headerField' | 'sidecarOffsets' | 'randomHeader' | 'randomBody' | 'splice' | 'noise' | 'zeroPrefix' | 'duplicateField'

const REQUEST_OPS = new Weighted<MutationOp>([
  [14, 'bitflip'], [6, 'byte'], [6, 'truncate'], [6, 'truncateFixed'], [6, 'insert'], [5, 'delete'], [8, 'lyingPrefix'],
  [6, 'headerLen'], [6, 'bodyLen'], [3, 'overlong'], [10, 'headerField'], [8, 'sidecarOffsets'], [8, 'randomHeader'],
  [6, 'randomBody'], [4, 'splice'], [3, 'noise'], [1, 'zeroPrefix'], [3, 'duplicateField']
])

const BYTE_OPS = new Weighted<MutationOp>([
  [10, 'bitflip'], [5, 'byte'], [4, 'truncate'], [4, 'truncateFixed'], [4, 'insert'], [4, 'delete'], [5, 'lyingPrefix'], [3, 'headerLen'], [3, 'bodyLen']
])

const KINDS = new Weighted<string>([[40, 'Add'], [18, 'Echo'], [14, 'PushStrings'], [15, 'EchoSidecars'], [5, 'Sleep'], [8, 'odd']])

/** Makes the requests and mutants of one episode from its Rng (and a shared pool of random bytes). */
export class RequestGen {
  readonly rng: Rng
  readonly #pool: Buffer
  readonly #foundBugs: ReadonlySet<FoundBug>

  constructor (rng: Rng, pool: Buffer, foundBugs: ReadonlySet<FoundBug>) {
    this.rng = rng
    this.#pool = pool
    this.#foundBugs = foundBugs
  }

  poolBytes (n: number): Buffer {
    const at = this.rng.int(this.#pool.length - n)
    return this.#pool.subarray(at, at + n)
  }

  text (): string {
    const rng = this.rng
    switch (rng.int(5)) {
      case 0: return ''
      case 1: return 'é€𝄞 ñ'.repeat(rng.range(1, 20))
      case 2: return 'x'.repeat(rng.range(200, 2000))
      default: return this.poolBytes(rng.range(1, 60)).toString('latin1')
    }
  }

  sidecars (max: number, maxBytes: number): Uint8Array[] {
    const n = this.rng.int(max + 1)
    const out: Uint8Array[] = []
    for (let i = 0; i < n; i++) out.push(this.poolBytes(this.rng.int(maxBytes + 1)))
    return out
  }

  spec (callId: number): RequestSpec {
    const rng = this.rng
    const kind = KINDS.pick(rng)
    let method = kind
    let service = SERVICE
    let body: Uint8Array
    let sidecars: Uint8Array[] = []
    switch (kind) {
      case 'Add':
        body = M.Add.requestType.encode({ x: rng.chance(0.2) ? rng.pick(INTERESTING_U32) : rng.u32(), y: rng.u32() })
        break
      case 'Echo':
        body = M.Echo.requestType.encode({ data: this.text() })
        break
      case 'PushStrings': {
        sidecars = this.sidecars(4, 3000)
        const indexes: number[] = []
        for (let i = rng.int(sidecars.length + 2); i > 0; i--) indexes.push(rng.chance(0.9) ? rng.int(sidecars.length + 1) : rng.u32())
        body = M.PushStrings.requestType.encode({ sidecar_indexes: indexes })
        break
      }
      case 'EchoSidecars':
        sidecars = this.sidecars(3, rng.chance(0.1) ? 40_000 : 2000)
        body = M.EchoSidecars.requestType.encode({})
        break
      case 'Sleep':
        body = M.Sleep.requestType.encode({ sleep_micros: rng.u32(), return_app_error: rng.chance(0.5) })
        break
      default:
        // A method or service the server does not have, with some body.
        method = rng.chance(0.7) ? rng.pick(ODD_METHODS) : rng.pick(METHODS)
        if (method === 'Add' || rng.chance(0.3)) service = rng.pick(ODD_SERVICES)
        body = this.poolBytes(rng.int(20))
    }
    const timeoutMs = rng.chance(0.5) ? 0 : rng.range(1000, 120_000)
    const flags = rng.chance(0.03) ? [rng.chance(0.5) ? 1 : rng.u32()] : []
    return { callId, service, method, timeoutMs, flags, body, sidecars }
  }

  clean (callId: number): Buffer {
    return encodeSpec(this.spec(callId))
  }

  /** One mutated request frame (or noise in its place). */
  mutant (callId: number): Buffer {
    const rng = this.rng
    const spec = this.spec(callId)
    let out = this.#apply(REQUEST_OPS.pick(rng), spec)
    if (rng.chance(0.2)) out = this.#apply(BYTE_OPS.pick(rng), spec, out)
    return out
  }

  #apply (op: MutationOp, spec: RequestSpec, frame?: Buffer): Buffer {
    const rng = this.rng
    const base = (): Buffer => frame ?? encodeSpec(spec)
    switch (op) {
      case 'bitflip': {
        const f = Buffer.from(base())
        for (let k = rng.range(1, 4); k > 0; k--) {
          // Half of the flips land in the prefix and header, where they matter most.
          const at = rng.chance(0.5) ? rng.int(Math.min(f.length, 24)) : rng.int(f.length)
          f[at]! ^= 1 << rng.int(8)
        }
        return f
      }
      case 'byte': {
        const f = Buffer.from(base())
        f[rng.int(Math.min(f.length, rng.chance(0.5) ? 24 : f.length))] = rng.chance(0.6) ? rng.pick(INTERESTING_BYTES) : rng.int(256)
        return f
      }
      case 'truncate': {
        const f = base()
        return Buffer.from(f.subarray(0, rng.int(f.length)))
      }
      case 'truncateFixed': {
        const f = base()
        return fixPrefix(Buffer.from(f.subarray(0, rng.range(Math.min(5, f.length), f.length - 1))))
      }
      case 'insert': {
        const f = base()
        const at = rng.int(f.length + 1)
        const out = Buffer.concat([f.subarray(0, at), rng.bytes(rng.range(1, 32)), f.subarray(at)])
        return rng.chance(0.5) ? fixPrefix(out) : out
      }
      case 'delete': {
        const f = base()
        const at = rng.int(f.length)
        const out = Buffer.concat([f.subarray(0, at), f.subarray(Math.min(f.length, at + rng.range(1, 16)))])
        return rng.chance(0.5) ? fixPrefix(out) : out
      }
      case 'lyingPrefix': {
        const f = Buffer.from(base())
        const actual = f.length - 4
        const choice = rng.int(4)
        const value = choice === 0
          ? actual + rng.pick([-8, -4, -3, -2, -1, 1, 2, 3, 4, 8, 100, 4096])
          : choice === 1 ? rng.pick(INTERESTING_U32) : choice === 2 ? rng.int(FUZZ_MAX_MESSAGE_BYTES * 2) : rng.u32()
        return withPrefix(f, value)
      }
      case 'headerLen':
      case 'bodyLen': {
        const f = base()
        const layout = layoutOf(f)
        if (layout === null) return this.#apply('bitflip', spec, f)
        const [at, end, actual] = op === 'headerLen'
          ? [4, layout.headerStart, layout.headerEnd - layout.headerStart]
          : [layout.headerEnd, layout.bodyStart, f.length - layout.bodyStart]
        const out = Buffer.concat([f.subarray(0, at), this.#lyingVarint(actual), f.subarray(end)])
        return rng.chance(0.7) ? fixPrefix(out) : out
      }
      case 'overlong': {
        // The same lengths in more bytes than needed (still valid varints up to 5 bytes).
        const f = base()
        const layout = layoutOf(f)
        if (layout === null) return this.#apply('bitflip', spec, f)
        const longer = (value: number): Buffer => {
          const bytes = [...varintBuf(value)]
          // Up to 5 bytes in all (a sixth makes it malformed, which is fine too).
          for (let extra = rng.range(1, Math.max(1, 5 - bytes.length)); extra > 0; extra--) {
            bytes[bytes.length - 1]! |= 0x80
            bytes.push(0)
          }
          return Buffer.from(bytes)
        }
        return fixPrefix(Buffer.concat([f.subarray(0, 4), longer(layout.headerEnd - layout.headerStart),
          f.subarray(layout.headerStart, layout.headerEnd), longer(f.length - layout.bodyStart), f.subarray(layout.bodyStart)]))
      }
      case 'headerField':
        return this.#headerField(spec)
      case 'sidecarOffsets':
        return this.#sidecarOffsets(spec)
      case 'randomHeader': {
        const body = rng.chance(0.6) ? spec.body : this.poolBytes(rng.int(64))
        return frameOf(this.#randomHeader(spec.callId), body, rng.chance(0.3) ? spec.sidecars : [])
      }
      case 'randomBody': {
        const body = rng.chance(0.2) ? new Uint8Array(0) : rng.chance(0.5) ? this.poolBytes(rng.int(80)) : this.spec(spec.callId).body
        return encodeSpec({ ...spec, body })
      }
      case 'splice': {
        const a = base()
        const b = encodeSpec(this.spec(spec.callId + 1))
        const out = Buffer.concat([a.subarray(0, rng.int(a.length)), b.subarray(rng.int(b.length))])
        return rng.chance(0.5) ? fixPrefix(out) : out
      }
      case 'noise': {
        const n = rng.range(1, 48)
        // Sometimes noise that starts like a small frame.
        return rng.chance(0.3) ? Buffer.concat([u32be(rng.int(n + 8)), rng.bytes(n)]) : rng.bytes(n)
      }
      case 'zeroPrefix':
        return Buffer.from([0, 0, 0, 0])
      case 'duplicateField': {
        // A header field given twice: singular fields take the last value.
        const w = new Pb().tag(3, 0).int32(spec.callId).raw(remoteMethodOf(spec.service, spec.method))
        const which = rng.int(3)
        if (which === 0) w.tag(3, 0).int32(rng.chance(0.5) ? rng.pick(INTERESTING_INT32) : spec.callId + 1)
        else if (which === 1) w.raw(remoteMethodOf(rng.chance(0.5) ? SERVICE : rng.pick(ODD_SERVICES), rng.pick(METHODS)))
        else w.tag(10, 0).varint(rng.u32()).tag(10, 0).varint(rng.chance(0.5) ? 0 : rng.u32())
        return frameOf(w.buffer(), spec.body, [])
      }
    }
  }

  /** A byte-level mutant of a handshake frame. */
  mutateFrameBytes (frame: Buffer): Buffer {
    const rng = this.rng
    const f = Buffer.from(frame)
    switch (rng.int(6)) {
      case 0:
        for (let k = rng.range(1, 3); k > 0; k--) f[rng.int(f.length)]! ^= 1 << rng.int(8)
        return f
      case 1:
        return Buffer.from(f.subarray(0, rng.int(f.length)))
      case 2:
        return withPrefix(f, f.length - 4 + rng.pick([-2, -1, 1, 2, 1000, FUZZ_MAX_MESSAGE_BYTES + 1]))
      case 3: {
        const at = rng.int(f.length)
        return fixPrefix(Buffer.concat([f.subarray(0, at), rng.bytes(rng.range(1, 8)), f.subarray(at)]))
      }
      case 4: {
        const layout = layoutOf(f)
        if (layout === null) return f
        f[layout.headerStart + rng.int(Math.max(1, layout.headerEnd - layout.headerStart))]! ^= 1 << rng.int(8)
        return f
      }
      default: {
        const layout = layoutOf(f)
        if (layout === null) return f
        return fixPrefix(Buffer.concat([f.subarray(0, layout.bodyStart), rng.bytes(rng.int(24))]))
      }
    }
  }

  // A varint standing for `actual`, that lies or is malformed.
  #lyingVarint (actual: number): Buffer {
    const rng = this.rng
    switch (rng.int(7)) {
      case 0: return varintBuf(Math.max(0, actual + rng.pick([-3, -2, -1, 1, 2, 3, 16])))
      case 1: return varintBuf(0)
      case 2: return varintBuf(rng.pick(INTERESTING_U32))
      case 3: return Buffer.from([0xff, 0xff, 0xff, 0xff, 0x1f]) // a fifth byte over 4 bits
      case 4: return Buffer.from([0x80, 0x80, 0x80, 0x80, 0x80, 0x01]) // six bytes
      case 5: return Buffer.from([0x80 | (actual & 0x7f)]) // continuation bit, then the header's first byte
      default: return varintBuf(rng.u32())
    }
  }

  // One header field given an odd value, written by hand in the usual order.
  #headerField (spec: RequestSpec): Buffer {
    const rng = this.rng
    let callId = spec.callId
    let remote: Buffer | null = remoteMethodOf(spec.service, spec.method)
    let timeout: number | null = spec.timeoutMs > 0 ? spec.timeoutMs : null
    let flags = spec.flags
    let extra: Buffer | null = null
    switch (rng.int(8)) {
      case 0: callId = rng.pick(INTERESTING_INT32); break
      case 1: remote = null; break
      case 2: remote = new Pb().tag(6, 2).len(this.#randomRemoteMethod()).buffer(); break
      case 3: timeout = rng.chance(0.5) ? rng.pick([0, 1, 2, 0xffffffff]) : rng.u32() * 2 ** 20 + rng.u32(); break
      case 4: flags = Array.from({ length: rng.range(1, 4) }, () => rng.chance(0.5) ? rng.int(4) : rng.u32()); break
      case 5: extra = this.#unknownField(); break
      case 6: extra = this.#requestId(); break
      default: callId = rng.u32() | 0
    }
    const w = new Pb().tag(3, 0).int32(callId)
    if (remote !== null) w.raw(remote)
    if (timeout !== null) w.tag(10, 0).varint(timeout)
    if (flags.length > 0 && rng.chance(0.5)) w.tag(11, 2).len(new Pb().raw(flags.flatMap(f => new Pb().varint(f).out)).buffer())
    else for (const f of flags) w.tag(11, 0).varint(f)
    if (extra !== null) w.raw(extra)
    const offsets = spec.sidecars.length > 0 ? sidecarOffsetsOf(spec) : []
    for (const o of offsets) w.tag(16, 0).varint(o)
    return frameOf(w.buffer(), spec.body, spec.sidecars)
  }

  #sidecarOffsets (spec: RequestSpec): Buffer {
    const rng = this.rng
    if (spec.sidecars.length === 0) {
      spec = { ...spec, method: rng.chance(0.5) ? 'PushStrings' : 'EchoSidecars', sidecars: this.sidecars(3, 500) }
      if (spec.sidecars.length === 0) spec.sidecars = [this.poolBytes(rng.int(100))]
      spec.body = spec.method === 'PushStrings' ? M.PushStrings.requestType.encode({ sidecar_indexes: [0] }) : M.EchoSidecars.requestType.encode({})
    }
    let offsets = sidecarOffsetsOf(spec)
    let bodyEnd = spec.body.length
    for (const s of spec.sidecars) bodyEnd += s.length
    const i = rng.int(offsets.length)
    switch (rng.int(10)) {
      case 0: offsets[i] = bodyEnd + rng.range(1, 1000); break
      case 1: if (i > 0) offsets[i] = offsets[i - 1]! - 1; else offsets[i] = bodyEnd + 1; break
      case 2: offsets[0] = rng.int(spec.body.length + 1); break // inside the message: valid, a shorter message
      case 3: offsets[i] = rng.pick([0xffffffff, 0x80000000, 0x7fffffff]); break
      case 4: offsets = Array.from({ length: MAX_SIDECARS + 1 }, () => bodyEnd); break
      case 5: offsets = Array.from({ length: rng.chance(0.5) ? MAX_SIDECARS : rng.range(2, 50) }, () => bodyEnd); break // empty sidecars at the end: valid
      case 6: offsets = [...offsets, ...offsets]; break
      case 7: offsets.reverse(); break
      case 8: return encodeSpecWithOffsets(spec, offsets, true) // packed: valid
      default: offsets = []; break // sidecar bytes, but no offsets: part of the message
    }
    return encodeSpecWithOffsets(spec, offsets, rng.chance(0.3))
  }

  #randomRemoteMethod (): Buffer {
    const rng = this.rng
    const w = new Pb()
    const methodNames = this.#foundBugs.has('prototype-names') && rng.chance(0.3) ? PROTOTYPE_NAMES : rng.chance(0.5) ? METHODS : ODD_METHODS
    const service = rng.chance(0.7) ? SERVICE : rng.pick(ODD_SERVICES)
    const fields: Array<() => void> = []
    if (rng.chance(0.9)) fields.push(() => w.tag(1, 2).len(Buffer.from(service)))
    if (rng.chance(0.9)) fields.push(() => w.tag(2, 2).len(rng.chance(0.1) ? Buffer.from([0xff, 0xfe, 0x41]) : Buffer.from(rng.pick(methodNames))))
    if (rng.chance(0.15)) fields.push(() => w.raw(this.#unknownField()))
    shuffle(rng, fields)
    for (const f of fields) f()
    return w.buffer()
  }

  #unknownField (): Buffer {
    const rng = this.rng
    const w = new Pb()
    const field = rng.pick([1, 2, 4, 5, 7, 8, 9, 12, 13, 14, 17, 100, 1000, 536_870_911])
    const wireType = rng.int(8)
    w.tag(field, wireType)
    switch (wireType) {
      case 0: w.varint(rng.u32() * 2 ** 20); break
      case 1: w.raw(rng.bytes(8)); break
      case 2: w.len(rng.bytes(rng.int(20))); break
      case 5: w.raw(rng.bytes(4)); break
      default: w.raw(rng.bytes(rng.int(4))) // groups and the two undefined wire types
    }
    return w.buffer()
  }

  #requestId (): Buffer {
    const rng = this.rng
    const inner = new Pb()
    if (rng.chance(0.8)) inner.tag(1, 2).len(Buffer.from('client-id'))
    for (let f = 2; f <= 4; f++) if (rng.chance(0.8)) inner.tag(f, 0).varint(rng.chance(0.5) ? rng.u32() : rng.u32() * 2 ** 21)
    return new Pb().tag(15, 2).len(rng.chance(0.2) ? rng.bytes(rng.int(16)) : inner.buffer()).buffer()
  }

  #randomHeader (callId: number): Buffer {
    const rng = this.rng
    const w = new Pb()
    const fields: Array<() => void> = []
    if (rng.chance(0.9)) fields.push(() => w.tag(3, 0).int32(rng.chance(0.7) ? callId : rng.pick(INTERESTING_INT32)))
    if (rng.chance(0.85)) fields.push(() => w.tag(6, 2).len(this.#randomRemoteMethod()))
    if (rng.chance(0.3)) fields.push(() => w.tag(10, 0).varint(rng.chance(0.5) ? rng.u32() : rng.u32() * 2 ** 21))
    if (rng.chance(0.1)) fields.push(() => w.tag(11, 0).varint(rng.int(4)))
    if (rng.chance(0.1)) fields.push(() => w.raw(this.#requestId()))
    if (rng.chance(0.15)) fields.push(() => w.tag(16, 0).varint(rng.int(100)))
    for (let k = rng.chance(0.25) ? rng.range(1, 3) : 0; k > 0; k--) fields.push(() => w.raw(this.#unknownField()))
    if (rng.chance(0.03)) fields.push(() => w.tag(0, rng.int(3)).varint(1))
    shuffle(rng, fields)
    for (const f of fields) f()
    return w.buffer()
  }
}

function sidecarOffsetsOf (spec: RequestSpec): number[] {
  const offsets: number[] = []
  let at = spec.body.length
  for (const s of spec.sidecars) {
    offsets.push(at)
    at += s.length
  }
  return offsets
}

/** Shuffles `items` in place (Fisher-Yates) with `rng`. */
export function shuffle<T> (rng: Rng, items: T[]): void {
  for (let i = items.length - 1; i > 0; i--) {
    const j = rng.int(i + 1)
    const t = items[i]!
    items[i] = items[j]!
    items[j] = t
  }
}
