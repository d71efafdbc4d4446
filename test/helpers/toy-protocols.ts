/**
 * Two toy protocols on the protocol API, for the generic server's tests:
 *
 * - `lines`: text lines (`route argument\n`), found by scanning, answered
 *   in order (`argument\n`, or `-ERR reason message\n`);
 * - `tagged`: length-prefixed frames `[u16 length][u8 route][u32 id][payload]`
 *   (length counts what follows it), answered by id as handlers finish:
 *   `[u16 length][u8 status][u32 id][payload]`, status 0 for success and a
 *   refusal's index in REASONS + 1 otherwise.
 */
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameScanner } from '../../codec/frame-decoder.js'
import { CallHead, type AnswerSlices, type CallInfo, type RefusalReason, type RouteInfo, type ServerProtocol } from '../../codec/protocol.js'

const NEWLINE = 0x0a

/** A line scanner that resumes where it stopped, as a RESP scanner would. */
class LineScanner implements FrameScanner {
  scanned = 0
  /** Bytes looked at over all scans (a resumed scan does not look at a byte twice). */
  looked = 0
  scan (buf: Buffer, start: number, end: number): number {
    const from = start + this.scanned
    const at = buf.indexOf(NEWLINE, from)
    if (at < 0 || at >= end) {
      this.looked += end - from
      this.scanned = end - start
      return 0
    }
    this.looked += at + 1 - from
    return at + 1 - start
  }

  reset (): void {
    this.scanned = 0
  }
}

export const scanners: LineScanner[] = []

/** `closeOnUnknown`: an unknown route closes the connection (refusal null) instead of an -ERR line. */
export function linesProtocol (options: { closeOnUnknown?: boolean } = {}): ServerProtocol<string, string | undefined> {
  return {
    name: 'lines',
    framing: { scanner: () => { const s = new LineScanner(); scanners.push(s); return s } },
    ordering: 'in-order',
    decodeHead (buf: Buffer, start: number, end: number, head: CallHead): RpcError | null {
      if (buf[start] === 0x00) return new RpcError(ErrorCode.MALFORMED_FRAME, 'a line may not start with NUL')
      const line = buf.toString('latin1', start, end - 1)
      const space = line.indexOf(' ')
      head.service = 'lines'
      head.method = space < 0 ? line : line.slice(0, space)
      head.data = space < 0 ? '' : line.slice(space + 1)
      return null
    },
    decodeRequest (_route: RouteInfo, _buf: Buffer, head: CallHead): string {
      return head.data as string
    },
    // undefined: no answer.
    encode (_call, response, out): void {
      if (response === undefined) return
      const at = out.reserve(Buffer.byteLength(response) + 1)
      out.buffer.write(`${response}\n`, at, 'latin1')
    },
    refusal: (_call: CallInfo, reason: RefusalReason, message: string): AnswerSlices =>
      options.closeOnUnknown === true && reason === 'no-method' ? null : [Buffer.from(`-ERR ${reason} ${message.split('\n')[0]}\n`)]
  }
}

export const REASONS: RefusalReason[] = ['busy', 'expired', 'shutdown', 'unavailable', 'no-service', 'no-method', 'invalid', 'failed', 'abandoned']
export const ROUTES = ['echo', 'sleep', 'fail', 'block', 'quit']

export function taggedProtocol (): ServerProtocol<Buffer, Buffer> {
  return {
    name: 'tagged',
    framing: { prefixBytes: 2, frameBytes: (buf, offset) => 2 + buf.readUInt16BE(offset) },
    ordering: 'id',
    maxFrameBytes: 1024,
    decodeHead (buf, start, end, head): RpcError | null {
      if (end - start < 7) return new RpcError(ErrorCode.MALFORMED_FRAME, 'frame shorter than its header')
      head.service = 'tagged'
      head.method = ROUTES[buf[start + 2]!] ?? `route-${buf[start + 2]!}`
      head.callId = buf.readUInt32BE(start + 3)
      head.bodyStart = start + 7
      return null
    },
    decodeRequest: (_route, buf, head) => buf.subarray(head.bodyStart, head.bodyEnd),
    encode (call, response, out): void {
      const at = out.reserve(7 + response.length)
      const buf = out.buffer
      buf.writeUInt16BE(5 + response.length, at)
      buf[at + 2] = 0
      buf.writeUInt32BE(call.callId, at + 3)
      buf.set(response, at + 7)
    },
    refusal (call, reason, message): AnswerSlices {
      const text = Buffer.from(message)
      const out = Buffer.alloc(7 + text.length)
      out.writeUInt16BE(5 + text.length, 0)
      out[2] = REASONS.indexOf(reason) + 1
      out.writeUInt32BE(call.callId, 3)
      text.copy(out, 7)
      return [out]
    }
  }
}

/** A `tagged` request frame. */
export function taggedRequest (route: string, id: number, payload: string | Buffer = ''): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload) : payload
  const out = Buffer.alloc(7 + body.length)
  out.writeUInt16BE(5 + body.length, 0)
  out[2] = ROUTES.indexOf(route) < 0 ? 200 : ROUTES.indexOf(route)
  out.writeUInt32BE(id, 3)
  body.copy(out, 7)
  return out
}

/** The `tagged` answers in `bytes`: [status name or 'ok', id, payload]. */
export function taggedAnswers (bytes: Buffer): Array<[string, number, string]> {
  const out: Array<[string, number, string]> = []
  let at = 0
  while (at + 2 <= bytes.length) {
    const size = 2 + bytes.readUInt16BE(at)
    if (at + size > bytes.length) break
    const status = bytes[at + 2]!
    out.push([status === 0 ? 'ok' : REASONS[status - 1]!, bytes.readUInt32BE(at + 3), bytes.toString('utf8', at + 7, at + size)])
    at += size
  }
  return out
}
