// Client side, its fake server: answers real clients with mutants.
import type { Socket } from 'node:net'
import { RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { encodeErrorFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { CONNECTION_CONTEXT_CALL_ID, KRPC_PREAMBLE, MAX_SIDECARS, NEGOTIATE_CALL_ID, krpcFraming } from '../../codec/krpc/frames.js'
import { parseRequestFrame, type RequestFrame } from '../../codec/krpc/parsed-frame.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { PREAMBLE_BYTES, ServerNegotiation } from '../../codec/krpc/server-negotiation.js'
import { crc32 } from '../../examples/calculator/index.js'
import { Pb, fixPrefix, frameOf, join, layoutOf, varintBuf, withPrefix } from './frames.js'
import { hex } from './model.js'
import { CLIENT_MAX_MESSAGE_BYTES, CLIENT_TIMEOUT_MS, FUZZ_MAX_MESSAGE_BYTES, M, NegotiateType } from './options.js'
import { INTERESTING_BYTES, INTERESTING_INT32, INTERESTING_U32, shuffle } from './request-mutator.js'
import { Rng, Weighted, mix } from './rng.js'

type AnswerOp = 'clean' | 'bitflip' | 'byte' | 'truncate' | 'truncateFixed' | 'insert' | 'delete' | 'lyingPrefix' | 'headerLen' |
'bodyLen' | 'randomHeader' | 'sidecarOffsets' | 'wrongCallId' | 'duplicate' | 'errorStatus' | 'badBody' | 'noAnswer' | 'noise' |
'closeAfter' | 'closeInstead' | 'split' | 'delayed' | 'late' | 'pause'

const ANSWER_OPS = new Weighted<AnswerOp>([
  [22, 'clean'], [12, 'bitflip'], [4, 'byte'], [3, 'truncate'], [3, 'truncateFixed'], [3, 'insert'], [3, 'delete'], [5, 'lyingPrefix'],
  [3, 'headerLen'], [3, 'bodyLen'], [7, 'randomHeader'], [5, 'sidecarOffsets'], [6, 'wrongCallId'], [3, 'duplicate'],
  [7, 'errorStatus'], [4, 'badBody'], [1, 'noAnswer'], [2, 'noise'], [1, 'closeAfter'], [0.5, 'closeInstead'], [2, 'split'],
  [2, 'delayed'], [0.5, 'late'], [1, 'pause']
])

type NegotiationOp = 'stall' | 'close' | 'noiseFirst' | 'mutateNegotiate' | 'mutateSuccess' | 'errorFrame' | 'noPlain' | 'earlyAnswer' |
'successFirst' | 'tokenAuthn' | 'noFeatures'
const NEGOTIATION_OPS: readonly NegotiationOp[] = [
  'stall', 'close', 'noiseFirst', 'mutateNegotiate', 'mutateSuccess', 'errorFrame', 'noPlain', 'earlyAnswer', 'successFirst', 'tokenAuthn',
  'noFeatures'
]

/** A NEGOTIATE answer offering `mechanism` and `authn`. */
function negotiateAnswer (mechanism: string, authn: { sasl?: object, token?: object }, features?: number[]): Buffer {
  return join(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({
    step: 1, sasl_mechanisms: [{ mechanism }], authn_types: [authn], ...(features === undefined ? {} : { supported_features: features })
  })))
}

/** One connection of the fake server. */
/** What a fake connection tells the client side it belongs to (client-side.ts's `ClientSide`). */
export interface FakeServerSide {
  mutants: number
  stalledClosed: number
  fail (kind: string, detail: string, conn?: FakeConn): void
}

/** One connection of the fake server: negotiates (or a mutant of it) and answers each call with a mutated response. */
export class FakeConn {
  readonly index: number
  readonly socket: Socket
  readonly #rng: Rng
  readonly #side: FakeServerSide
  #preamble: Buffer | null = Buffer.alloc(0)
  readonly #decoder = new FrameDecoder(krpcFraming, FUZZ_MAX_MESSAGE_BYTES)
  readonly #negotiation = new ServerNegotiation()
  #negotiated = false
  readonly #negotiationOp: NegotiationOp | null
  #negotiationFrames = 0
  /** Our own output as the client reads it: when it stops inside a frame, the connection is closed after a while. */
  readonly #tracker = new FrameDecoder(krpcFraming, CLIENT_MAX_MESSAGE_BYTES)
  #trackerBroken = false
  #stallTimer: NodeJS.Timeout | null = null
  readonly #timers = new Set<NodeJS.Timeout>()
  readonly #recent: number[] = []
  /** The last writes, for a failure's report. */
  readonly #log: Buffer[] = []
  closed = false

  constructor (index: number, socket: Socket, seed: number, side: FakeServerSide) {
    this.index = index
    this.socket = socket
    this.#rng = new Rng(mix(seed, 0xc11e, index))
    this.#side = side
    this.#negotiationOp = this.#rng.chance(0.1) ? this.#rng.pick(NEGOTIATION_OPS) : null
    if (this.#negotiationOp !== null) side.mutants++
    socket.setNoDelay(true)
    socket.on('error', () => {})
    socket.on('data', (chunk: Buffer) => this.#onData(chunk))
    socket.on('close', () => {
      this.closed = true
      for (const t of this.#timers) clearTimeout(t)
      this.#timers.clear()
      if (this.#stallTimer !== null) clearTimeout(this.#stallTimer)
    })
  }

  recentHex (): string {
    return hex(Buffer.concat(this.#log))
  }

  // Closed, or destroyed here a moment ago ('close' comes later).
  get #gone (): boolean {
    return this.closed || this.socket.destroyed
  }

  #onData (chunk: Buffer): void {
    if (this.#gone) return
    if (this.#preamble !== null) {
      const take = Math.min(PREAMBLE_BYTES - this.#preamble.length, chunk.length)
      this.#preamble = Buffer.concat([this.#preamble, chunk.subarray(0, take)])
      chunk = chunk.subarray(take)
      if (this.#preamble.length < PREAMBLE_BYTES) return
      if (!this.#preamble.equals(KRPC_PREAMBLE)) this.#side.fail('client sent a bad preamble', hex(this.#preamble), this)
      this.#preamble = null
    }
    const error = this.#decoder.pushRanges(chunk, (buf, start, end) => {
      this.#frame(Buffer.from(buf.subarray(start, end)))
      return !this.#gone
    })
    if (error !== null) this.#side.fail('client sent an undecodable stream', error.message, this)
  }

  #frame (frame: Buffer): void {
    if (!this.#negotiated) {
      this.#negotiationFrame(frame)
      return
    }
    const parsed = parseRequestFrame(frame)
    if (parsed instanceof RpcError) {
      this.#side.fail('client sent a malformed request', `${parsed.message}: ${hex(frame, 128)}`, this)
      return
    }
    this.#answer(parsed)
  }

  #negotiationFrame (frame: Buffer): void {
    const rng = this.#rng
    const step = this.#negotiation.onFrame(frame) as NegotiationStep
    const first = this.#negotiationFrames++ === 0
    let send = (step.send ?? []).map(join)
    const op = this.#negotiationOp
    if (op !== null && (first || op === 'mutateSuccess')) {
      switch (op) {
        case 'stall': send = []; break
        case 'close': this.socket.destroy(); return
        case 'noiseFirst': if (first) send = [rng.bytes(rng.range(1, 16)), ...send]; break
        case 'mutateNegotiate': if (first) send = send.map(f => mutateAnswerBytes(rng, f)); break
        case 'mutateSuccess': if (!first && step.done === undefined) send = send.map(f => mutateAnswerBytes(rng, f)); break
        case 'errorFrame': send = [join(encodeErrorFrame(NEGOTIATE_CALL_ID, rng.pick([KrpcCode.FATAL_UNAUTHORIZED, KrpcCode.FATAL_VERSION_MISMATCH, 0, 99, 1]), 'no'))]; break
        case 'noPlain': send = [negotiateAnswer('GSSAPI', { sasl: {} })]; break
        case 'earlyAnswer': send = [join(encodeResponseFrame(0, false, M.Add.responseType.encode({ result: 1 }))), ...send]; break
        case 'successFirst': send = [join(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 0 })))]; break
        case 'tokenAuthn': send = [negotiateAnswer('PLAIN', { token: {} })]; break
        // An old server: no application feature flags (calls that need them fail without being sent).
        case 'noFeatures': send = [negotiateAnswer('PLAIN', { sasl: {} }, [])]; break
      }
    }
    for (const f of send) this.#send(f)
    if (step.done !== undefined) this.#negotiated = true
    if (step.error !== undefined) this.socket.destroy()
  }

  // The answer the demo service would give.
  #cleanAnswer (p: RequestFrame): Buffer {
    const name = p.header.remote_method?.method_name ?? ''
    const callId = p.header.call_id
    const bytes = p.frame
    switch (name) {
      case 'Add': {
        const req = M.Add.requestType.decodeRange(bytes, p.messageStart, p.messageEnd)
        if (req instanceof RpcError) break
        return join(encodeResponseFrame(callId, false, M.Add.responseType.encode({ result: (req.x + req.y) >>> 0 })))
      }
      case 'Echo': {
        const req = M.Echo.requestType.decodeRange(bytes, p.messageStart, p.messageEnd)
        if (req instanceof RpcError) break
        return join(encodeResponseFrame(callId, false, M.Echo.responseType.encode({ data: req.data })))
      }
      case 'PushStrings': {
        const req = M.PushStrings.requestType.decodeRange(bytes, p.messageStart, p.messageEnd)
        if (req instanceof RpcError) break
        const picked = (req.sidecar_indexes ?? []).map(i => p.sidecars[i])
        if (picked.some(s => s === undefined)) return join(encodeErrorFrame(callId, KrpcCode.ERROR_INVALID_REQUEST, 'no such sidecar'))
        return join(encodeResponseFrame(callId, false, M.PushStrings.responseType.encode({ sizes: picked.map(s => s!.length), crcs: picked.map(s => crc32(s!)) })))
      }
      case 'EchoSidecars':
        return join(encodeResponseFrame(callId, false, M.EchoSidecars.responseType.encode({ sidecar_indexes: p.sidecars.map((_, i) => i) }), p.sidecars))
    }
    return join(encodeErrorFrame(callId, KrpcCode.ERROR_NO_SUCH_METHOD, `no method ${name}`))
  }

  #answer (p: RequestFrame): void {
    const rng = this.#rng
    const side = this.#side
    const callId = p.header.call_id
    this.#recent.push(callId)
    if (this.#recent.length > 16) this.#recent.shift()
    const clean = this.#cleanAnswer(p)
    const op = ANSWER_OPS.pick(rng)
    if (op !== 'clean') side.mutants++
    const later = (ms: number, f: () => void): void => {
      if (this.#gone) return
      const t = setTimeout(() => { this.#timers.delete(t); if (!this.#gone) f() }, ms)
      this.#timers.add(t)
    }
    switch (op) {
      case 'clean': this.#send(clean); return
      case 'noAnswer': return
      case 'duplicate': this.#send(clean); this.#send(clean); return
      case 'closeAfter': this.#send(clean); if (rng.chance(0.5)) this.socket.end(); else this.socket.destroy(); return
      case 'closeInstead': this.socket.destroy(); return
      case 'noise': this.#send(rng.bytes(rng.range(1, 32))); if (rng.chance(0.5)) this.#send(clean); return
      case 'split': {
        const f = rng.chance(0.7) ? clean : mutateAnswerBytes(rng, clean)
        let at = 0
        const step = (): void => {
          const n = Math.min(f.length - at, rng.range(1, 8))
          this.#send(f.subarray(at, at + n))
          at += n
          if (at < f.length) later(0, step)
        }
        step()
        return
      }
      case 'delayed': later(rng.int(30), () => this.#send(clean)); return
      case 'late': later(CLIENT_TIMEOUT_MS + rng.int(100), () => this.#send(clean)); return
      case 'pause':
        // Stop reading a while: the client's writes back up (large sidecars wait mid-send, deadlines pass).
        this.socket.pause()
        later(rng.range(10, CLIENT_TIMEOUT_MS), () => { this.socket.resume(); this.#send(clean) })
        return
      case 'wrongCallId': {
        const other = rng.pick([callId + 1, callId - 1, rng.pick(this.#recent), rng.u32() | 0, -1, NEGOTIATE_CALL_ID, CONNECTION_CONTEXT_CALL_ID, 0x7fffffff])
        const layout = layoutOf(clean)
        const body = layout === null ? new Uint8Array(0) : clean.subarray(layout.bodyStart)
        this.#send(frameOf(new Pb().tag(1, 0).int32(other).tag(2, 0).varint(0).buffer(), body))
        if (rng.chance(0.5)) this.#send(clean)
        return
      }
      case 'randomHeader': {
        const layout = layoutOf(clean)
        const body = layout === null ? new Uint8Array(0) : clean.subarray(layout.bodyStart)
        this.#send(frameOf(randomResponseHeader(rng, callId, this.#recent), rng.chance(0.7) ? body : rng.bytes(rng.int(40))))
        return
      }
      case 'sidecarOffsets': {
        const layout = layoutOf(clean)
        const tail = layout === null ? rng.bytes(8) : clean.subarray(layout.bodyStart)
        const w = new Pb().tag(1, 0).int32(callId).tag(2, 0).varint(0)
        const n = rng.chance(0.05) ? MAX_SIDECARS + 1 : rng.range(1, 4)
        for (let i = 0; i < n; i++) w.tag(3, 0).varint(rng.chance(0.5) ? rng.int(tail.length + 3) : rng.pick(INTERESTING_U32))
        this.#send(frameOf(w.buffer(), tail))
        return
      }
      case 'errorStatus': {
        const code = rng.pick([...Object.values(KrpcCode), 0, 99, 0x7fffffff])
        if (rng.chance(0.8)) {
          this.#send(join(encodeErrorFrame(callId, code, rng.chance(0.5) ? 'fuzzed error' : 'x'.repeat(rng.int(3000)), rng.chance(0.2) ? [rng.u32()] : undefined)))
        } else {
          this.#send(join(encodeResponseFrame(callId, true, rng.bytes(rng.int(30)))))
        }
        return
      }
      case 'badBody':
        this.#send(join(encodeResponseFrame(callId, false, rng.chance(0.3) ? new Uint8Array(0) : rng.bytes(rng.int(40)))))
        return
      default:
        this.#send(mutateAnswerBytes(rng, clean, op))
    }
  }

  #send (bytes: Buffer): void {
    if (this.#gone) return
    this.#log.push(bytes)
    if (this.#log.length > 32) this.#log.shift()
    this.socket.write(bytes)
    if (this.#trackerBroken) return
    // After the handshake the client reads frames; the preamble is ours to skip (none from a server).
    const error = this.#tracker.pushRanges(bytes, () => {})
    if (error !== null) {
      this.#trackerBroken = true
      return
    }
    if (this.#tracker.hasPartialFrame && this.#stallTimer === null) {
      // A lying length leaves the client waiting inside a frame: close the connection if nothing completes it soon.
      this.#stallTimer = setTimeout(() => {
        this.#stallTimer = null
        if (this.#tracker.hasPartialFrame) {
          this.#side.stalledClosed++
          this.socket.destroy()
        }
      }, 60)
    }
  }
}

function randomResponseHeader (rng: Rng, callId: number, recent: readonly number[]): Buffer {
  const w = new Pb()
  const fields: Array<() => void> = []
  if (rng.chance(0.9)) fields.push(() => w.tag(1, 0).int32(rng.chance(0.7) ? callId : rng.chance(0.5) ? rng.pick(recent) : rng.pick(INTERESTING_INT32)))
  if (rng.chance(0.7)) fields.push(() => w.tag(2, 0).varint(rng.pick([0, 1, 2, 0xffffffff, 2 ** 40])))
  if (rng.chance(0.2)) fields.push(() => w.tag(3, 0).varint(rng.int(64)))
  if (rng.chance(0.2)) fields.push(() => w.tag(rng.pick([4, 5, 15, 100]), rng.int(8)).raw(rng.bytes(rng.int(6))))
  if (rng.chance(0.05)) fields.push(() => w.tag(0, 0).varint(0))
  shuffle(rng, fields)
  for (const f of fields) f()
  return w.buffer()
}

/** A byte-level mutant of an answer frame. */
function mutateAnswerBytes (rng: Rng, frame: Buffer, given?: AnswerOp): Buffer {
  const f = Buffer.from(frame)
  const op = given ?? rng.pick(['bitflip', 'byte', 'truncate', 'truncateFixed', 'insert', 'delete', 'lyingPrefix', 'headerLen', 'bodyLen'] as const)
  switch (op) {
    case 'bitflip':
      for (let k = rng.range(1, 4); k > 0; k--) f[rng.chance(0.6) ? rng.int(Math.min(f.length, 16)) : rng.int(f.length)]! ^= 1 << rng.int(8)
      return f
    case 'byte':
      f[rng.int(Math.min(f.length, 16))] = rng.pick(INTERESTING_BYTES)
      return f
    case 'truncate': return f.subarray(0, rng.int(f.length))
    case 'truncateFixed': return fixPrefix(Buffer.from(f.subarray(0, rng.range(Math.min(5, f.length), f.length - 1))))
    case 'insert': {
      const at = rng.int(f.length + 1)
      const out = Buffer.concat([f.subarray(0, at), rng.bytes(rng.range(1, 16)), f.subarray(at)])
      return rng.chance(0.5) ? fixPrefix(out) : out
    }
    case 'delete': {
      const at = rng.int(f.length)
      const out = Buffer.concat([f.subarray(0, at), f.subarray(Math.min(f.length, at + rng.range(1, 8)))])
      return rng.chance(0.5) ? fixPrefix(out) : out
    }
    case 'lyingPrefix':
      return withPrefix(f, rng.chance(0.6) ? f.length - 4 + rng.pick([-3, -2, -1, 1, 2, 3, 64]) : rng.pick([0, 1, CLIENT_MAX_MESSAGE_BYTES, CLIENT_MAX_MESSAGE_BYTES + 1, 0xffffffff, rng.u32()]))
    case 'headerLen':
    case 'bodyLen': {
      const layout = layoutOf(f)
      if (layout === null) return f
      const [at, end, actual] = op === 'headerLen'
        ? [4, layout.headerStart, layout.headerEnd - layout.headerStart]
        : [layout.headerEnd, layout.bodyStart, f.length - layout.bodyStart]
      const lie = rng.chance(0.7) ? varintBuf(Math.max(0, actual + rng.pick([-2, -1, 1, 2, 50]))) : Buffer.from([0xff, 0xff, 0xff, 0xff, 0x7f])
      const out = Buffer.concat([f.subarray(0, at), lie, f.subarray(end)])
      return rng.chance(0.7) ? fixPrefix(out) : out
    }
    default: return f
  }
}
