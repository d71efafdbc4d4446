/**
 * The client sides of the toy protocols of toy-protocols.ts, for
 * ProtocolClient's tests: `tagged` (length-prefixed, matched by id) and
 * `lines` (scanned, in order).
 */
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { REASONS, ROUTES } from './toy-protocols.js'

export interface ToyRequest { route: string, payload?: string }

/** `[u16 length][u8 route][u32 id][payload]` out, `[u16 length][u8 status][u32 id][payload]` back. */
export function taggedClientProtocol (): ClientProtocol<ToyRequest, string> {
  return {
    name: 'tagged',
    framing: { prefixBytes: 2, frameBytes: (buf, offset) => 2 + buf.readUInt16BE(offset) },
    matching: 'id',
    encode (request, id, sink): void {
      const payload = request.payload ?? ''
      const bytes = Buffer.byteLength(payload)
      const at = sink.reserve(7 + bytes)
      const out = sink.buffer
      out.writeUInt16BE(5 + bytes, at)
      const route = ROUTES.indexOf(request.route)
      out[at + 2] = route < 0 ? 200 : route
      out.writeUInt32BE(id, at + 3)
      out.write(payload, at + 7)
    },
    answerId: (buf, start, end) => end - start < 7 ? new RpcError(ErrorCode.MALFORMED_FRAME, 'answer shorter than its header') : buf.readUInt32BE(start + 3),
    decodeAnswer (_request, buf, start, end): string | RpcError {
      const status = buf[start + 2]!
      const text = buf.toString('utf8', start + 7, end)
      if (status === 0) return text
      const name = REASONS[status - 1]
      if (name === undefined) return new RpcError(ErrorCode.MALFORMED_FRAME, `unknown status ${status}`)
      return new RpcError(ErrorCode.REMOTE, text, { remote: { protocol: 'tagged', code: status, name, fatal: false } })
    },
    retryable: (error) => error.remote?.name === 'busy'
  }
}

/** `route argument\n` out; `argument\n` or `-ERR reason message\n` back, in order. A line starting with NUL is garbage. */
export function linesClientProtocol (): ClientProtocol<ToyRequest, string> {
  return {
    name: 'lines',
    framing: {
      scanner: () => ({
        scan: (buf: Buffer, start: number, end: number) => {
          const at = buf.indexOf(0x0a, start)
          return at < 0 || at >= end ? 0 : at + 1 - start
        },
        reset: () => {}
      })
    },
    matching: 'in-order',
    encode (request, _id, out): void {
      const at = out.reserve(Buffer.byteLength(request.route) + 2 + Buffer.byteLength(request.payload ?? ''))
      out.buffer.write(`${request.route} ${request.payload ?? ''}\n`, at)
    },
    decodeAnswer (_request, buf, start, end): string | RpcError {
      if (buf[start] === 0) return new RpcError(ErrorCode.MALFORMED_FRAME, 'an answer line may not start with NUL')
      const line = buf.toString('utf8', start, end - 1)
      if (!line.startsWith('-ERR ')) return line
      const words = line.slice(5)
      const space = words.indexOf(' ')
      const name = space < 0 ? words : words.slice(0, space)
      return new RpcError(ErrorCode.REMOTE, line.slice(1), { remote: { protocol: 'lines', code: REASONS.indexOf(name as never) + 1, name, fatal: false } })
    }
  }
}
