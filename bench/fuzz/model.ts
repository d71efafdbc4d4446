// The model (the oracle): what the server must do with a byte stream.
import { RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcCodeName } from '../../codec/krpc/codes.js'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { ErrorStatusType, NEGOTIATE_CALL_ID, krpcFraming } from '../../codec/krpc/frames.js'
import { parseRequestFrame, type RequestFrame, type ResponseFrame } from '../../codec/krpc/parsed-frame.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { PREAMBLE_BYTES, ServerNegotiation, checkPreamble } from '../../codec/krpc/server-negotiation.js'
import { crc32 } from '../../examples/calculator/index.js'
import { join } from './frames.js'
import { REFUSED_USERS } from './handshake-mutator.js'
import { FUZZ_MAX_MESSAGE_BYTES, M, MAX_HEX_BYTES, SERVICE } from './options.js'

/** One frame the server must send: a negotiation answer (exact bytes) or the answer to a call. */
export interface Expect {
  callId: number
  what: string
  /** A call with a deadline may also be refused as ERROR_SERVER_TOO_BUSY (expired before it ran). */
  allowBusy: boolean
  check: (frame: ResponseFrame) => string | null
}

/** Whether the fuzzed server's authenticator accepts `user`, as the model predicts it. */
export function modelAuthenticate (user: string): boolean {
  return !REFUSED_USERS.includes(user)
}

/**
 * Reads a client's byte stream as nyala's server does, with the codec's own
 * pieces (preamble check, frame decoder, negotiation state machine, request
 * parser): what must come back, and whether the connection must close.
 */
export class ServerModel {
  phase: 'preamble' | 'negotiating' | 'ready' | 'closed' = 'preamble'
  closeReason = ''
  accepted = 0
  badFrames = 0
  #preamble: Buffer = Buffer.alloc(0)
  readonly #decoder = new FrameDecoder(krpcFraming, FUZZ_MAX_MESSAGE_BYTES)
  readonly #negotiation = new ServerNegotiation({ authenticate: (user) => { this.#authenticated = true; return modelAuthenticate(user) } })
  #authenticated = false
  #expected: Expect[] = []

  /** True while the server is legitimately waiting for bytes (so a limit or deadline may close it). */
  get waiting (): boolean {
    return this.phase === 'preamble' || this.phase === 'negotiating' || this.#decoder.hasPartialFrame
  }

  get closed (): boolean {
    return this.phase === 'closed'
  }

  /** The frames the server must send for the bytes fed since the last call. */
  takeExpected (): Expect[] {
    const out = this.#expected
    this.#expected = []
    return out
  }

  /**
   * Feeds a handshake up to the frame that asks the authenticator, and
   * answers how many bytes that took (-1: none asks it; all were fed). The
   * fuzzed server's authenticator is asynchronous: frames behind that step
   * in the same read wait for it, while a bad length prefix later in the
   * read closes the connection at once, before them. So the episode writes
   * the handshake up to there alone, and the rest once it is answered.
   */
  feedUntilAuthenticated (bytes: Buffer): number {
    for (let i = 0; i < bytes.length; i++) {
      this.feed(bytes.subarray(i, i + 1))
      if (this.#authenticated) return i + 1
    }
    return -1
  }

  feed (bytes: Buffer): void {
    if (this.phase === 'closed') return
    let chunk = bytes
    if (this.phase === 'preamble') {
      const take = Math.min(PREAMBLE_BYTES - this.#preamble.length, chunk.length)
      this.#preamble = Buffer.concat([this.#preamble, chunk.subarray(0, take)])
      chunk = chunk.subarray(take)
      if (this.#preamble.length < PREAMBLE_BYTES) return
      const verdict = checkPreamble(this.#preamble)
      if (verdict !== null) return this.#close(`bad preamble: ${verdict.message}`)
      this.phase = 'negotiating'
    }
    if (chunk.length === 0) return
    const error = this.#decoder.pushRanges(chunk, (buf, start, end) => this.#frame(buf.subarray(start, end)))
    // (#frame may have closed it meanwhile.)
    if (error !== null && !this.closed) {
      // Garbled, or (once negotiated) over maxMessageBytes at its prefix: bad frames to the server's
      // books. An oversize negotiation frame is the handshake's to refuse, not counted.
      if (error.code === 'RPC_ERR_MALFORMED_FRAME' || (error.code === 'RPC_ERR_FRAME_TOO_LARGE' && this.phase === 'ready')) this.badFrames++
      this.#close(`decoder: ${error.message}`)
    }
  }

  #close (reason: string): void {
    this.phase = 'closed'
    this.closeReason = reason
    this.#decoder.stop()
  }

  #frame (frame: Buffer): boolean {
    if (this.phase === 'negotiating') {
      const step = this.#negotiation.onFrame(frame) as NegotiationStep
      for (const s of step.send ?? []) {
        const bytes = join(s)
        this.#expected.push({
          callId: NEGOTIATE_CALL_ID,
          what: 'negotiation answer',
          allowBusy: false,
          check: (f) => f.frame.equals(bytes) ? null : `negotiation answer differs: got ${hex(f.frame, 64)}, expected ${hex(bytes, 64)}`
        })
      }
      if (step.error !== undefined) {
        // A negotiation frame whose lengths do not add up is a bad frame too, to the server's books.
        if (step.error.code === 'RPC_ERR_MALFORMED_FRAME') this.badFrames++
        this.#close(`negotiation refused: ${step.error.message}`)
        return false
      }
      if (step.done !== undefined) this.phase = 'ready'
      return true
    }
    const parsed = parseRequestFrame(frame)
    if (parsed instanceof RpcError) return this.#bad(parsed.message)
    const callId = parsed.header.call_id
    if (callId < 0) return this.#bad(`call id ${callId}`)
    if (parsed.header.remote_method === undefined) return this.#bad('no remote_method')
    this.accepted++
    this.#expected.push(predict(parsed))
    return true
  }

  #bad (reason: string): false {
    this.badFrames++
    this.#close(`bad frame: ${reason}`)
    return false
  }
}

function errorCodeOf (f: ResponseFrame): number | string {
  if (f.header.is_error !== true) return 'not an error'
  const status = ErrorStatusType.decode(f.message)
  if (status instanceof RpcError) return `unparseable ErrorStatusPB: ${status.message}`
  return status.code ?? 'no code'
}

function expectError (callId: number, code: number, allowBusy: boolean, what: string): Expect {
  return {
    callId,
    what,
    allowBusy,
    check: (f) => {
      const got = errorCodeOf(f)
      if (got === code || (allowBusy && got === KrpcCode.ERROR_SERVER_TOO_BUSY)) return null
      return `${what}: expected ${krpcCodeName(code)}, got ${typeof got === 'number' ? krpcCodeName(got) : got}`
    }
  }
}

function expectOk (callId: number, allowBusy: boolean, what: string, checkBody: (f: ResponseFrame) => string | null): Expect {
  return {
    callId,
    what,
    allowBusy,
    check: (f) => {
      if (f.header.is_error === true) {
        const got = errorCodeOf(f)
        if (allowBusy && got === KrpcCode.ERROR_SERVER_TOO_BUSY) return null
        return `${what}: expected success, got ${typeof got === 'number' ? krpcCodeName(got) : got}`
      }
      return checkBody(f)
    }
  }
}

/** The answer the fuzzed server must give to an accepted call (see `fuzzHandlers`). */
function predict (p: RequestFrame): Expect {
  const h = p.header
  const callId = h.call_id
  const allowBusy = (h.timeout_millis ?? 0) > 0
  const rm = h.remote_method!
  const what = `call ${callId} ${rm.service_name.slice(0, 40)}.${rm.method_name.slice(0, 40)}`
  if (rm.service_name !== SERVICE) return expectError(callId, KrpcCode.ERROR_NO_SUCH_SERVICE, allowBusy, what)
  const name = rm.method_name
  if (!Object.hasOwn(M, name)) return expectError(callId, KrpcCode.ERROR_NO_SUCH_METHOD, allowBusy, what)
  if ((h.required_feature_flags ?? []).length > 0) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
  const start = p.messageStart
  const end = p.messageEnd
  switch (name as keyof typeof M) {
    case 'Add': {
      const req = M.Add.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      const result = (req.x + req.y) >>> 0
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.Add.responseType.decode(f.message)
        return !(res instanceof RpcError) && res.result === result ? null : `${what}: wrong result ${JSON.stringify(res)}, expected ${result}`
      })
    }
    case 'Echo': {
      const req = M.Echo.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      const data = req.data
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.Echo.responseType.decode(f.message)
        return !(res instanceof RpcError) && res.data === data ? null : `${what}: wrong echo`
      })
    }
    case 'PushStrings': {
      const req = M.PushStrings.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      const sizes: number[] = []
      const crcs: number[] = []
      for (const i of req.sidecar_indexes ?? []) {
        const s = p.sidecars[i]
        if (s === undefined) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
        sizes.push(s.length)
        crcs.push(crc32(s))
      }
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.PushStrings.responseType.decode(f.message)
        if (res instanceof RpcError) return `${what}: ${res.message}`
        return sameNumbers(res.sizes, sizes) && sameNumbers(res.crcs, crcs) ? null : `${what}: wrong sizes or CRCs`
      })
    }
    case 'EchoSidecars': {
      const req = M.EchoSidecars.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      // Hashes, not views: a view would keep the whole read buffer.
      const sent = p.sidecars.map(s => `${s.length}:${crc32(s)}`)
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.EchoSidecars.responseType.decode(f.message)
        if (res instanceof RpcError) return `${what}: ${res.message}`
        const got = f.sidecars.map(s => `${s.length}:${crc32(s)}`)
        return got.length === sent.length && got.every((g, i) => g === sent[i]) && sameNumbers(res.sidecar_indexes, sent.map((_, i) => i))
          ? null
          : `${what}: sidecars not echoed (${got.length} of ${sent.length})`
      })
    }
    case 'Sleep': {
      const req = M.Sleep.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      if (req.return_app_error === true) return expectError(callId, KrpcCode.ERROR_APPLICATION, allowBusy, what)
      return expectOk(callId, allowBusy, what, () => null)
    }
  }
}

function sameNumbers (a: readonly number[] | undefined, b: readonly number[]): boolean {
  const x = a ?? []
  return x.length === b.length && x.every((v, i) => v === b[i])
}

/** The bytes as hex, cut at `max` bytes. */
export function hex (b: Uint8Array, max = MAX_HEX_BYTES): string {
  const s = Buffer.from(b.buffer, b.byteOffset, Math.min(b.length, max)).toString('hex')
  return b.length > max ? `${s}… (${b.length} bytes)` : s
}
