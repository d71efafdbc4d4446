/**
 * RESP2, client side: commands as arrays of bulk strings out, replies in
 * (`redisClientProtocol`, the `ClientProtocol` that `RedisClient` and
 * `Subscription` run on). Replies decode as `RedisReply` (see client.ts).
 */
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { FrameScanner } from '../../codec/frame-decoder.js'
import type { FrameSink } from '../../codec/frame-sink.js'
import { CR, LF } from './resp.js'

/** A reply, decoded. */
export type RedisReply = string | number | bigint | Buffer | null | RpcError | readonly RedisReply[]

/** A command argument: strings are sent as UTF-8, numbers in decimal. */
export type RedisArg = string | Buffer | Uint8Array | number | bigint

/** Arguments above this size go out as their own slice (writev, no copy). */
const SLICE_ARG_BYTES = 16 * 1024
/** Arrays nest at most this deep in a reply. */
const MAX_DEPTH = 64

/** One command, its arguments as bytes (converted once, when made). */
export class RedisCommand {
  readonly args: readonly Buffer[]
  /** The frame's size: `*N\r\n` and `$len\r\n…\r\n` per argument. */
  readonly bytes: number
  readonly large: boolean

  constructor (args: readonly RedisArg[]) {
    if (args.length === 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a Redis command needs at least its name')
    const buffers = args.map(toBuffer)
    let bytes = headerBytes(buffers.length)
    let large = false
    for (const b of buffers) {
      bytes += headerBytes(b.length) + b.length + 2
      if (b.length > SLICE_ARG_BYTES) large = true
    }
    this.args = buffers
    this.bytes = bytes
    this.large = large
  }
}

function toBuffer (arg: RedisArg): Buffer {
  if (Buffer.isBuffer(arg)) return arg
  if (arg instanceof Uint8Array) return Buffer.from(arg.buffer, arg.byteOffset, arg.byteLength)
  return Buffer.from(String(arg))
}

// `*N\r\n` or `$N\r\n`.
function headerBytes (n: number): number {
  return 3 + String(n).length
}

function writeHeader (out: Buffer, at: number, type: string, n: number): number {
  return at + out.write(`${type}${n}\r\n`, at, 'latin1')
}

function writeCommand (command: RedisCommand, out: Buffer, at: number): void {
  let p = writeHeader(out, at, '*', command.args.length)
  for (const arg of command.args) {
    p = writeHeader(out, p, '$', arg.length)
    p += arg.copy(out, p)
    out[p++] = CR
    out[p++] = LF
  }
}

function malformed (message: string): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, `malformed RESP reply: ${message}`)
}

// The end of the line that starts at p (the index after its LF), -1 if it has not arrived, or an error.
function lineEnd (buf: Buffer, p: number, end: number): number | RpcError {
  const lf = buf.indexOf(LF, p)
  if (lf < 0 || lf >= end) return -1
  if (lf === p || buf[lf - 1] !== CR) return malformed('a line not ended by CRLF')
  return lf + 1
}

function lengthOf (buf: Buffer, p: number, stop: number): number | RpcError {
  const text = buf.toString('latin1', p + 1, stop - 2)
  if (!/^-?\d+$/.test(text)) return malformed(`bad length ${JSON.stringify(text.slice(0, 20))}`)
  const n = Number(text)
  if (n < -1) return malformed(`bad length ${n}`)
  return n
}

// The end of the value that starts at p; -1 when it has not all arrived.
function scanValue (buf: Buffer, p: number, end: number, depth: number): number | RpcError {
  if (p >= end) return -1
  const stop = lineEnd(buf, p, end)
  if (typeof stop !== 'number' || stop < 0) return stop
  switch (buf[p]) {
    case 0x2b: // +
    case 0x2d: // -
    case 0x3a: // :
      return stop
    case 0x24: { // $
      const n = lengthOf(buf, p, stop)
      if (typeof n !== 'number') return n
      if (n === -1) return stop
      if (stop + n + 2 > end) return -1
      if (buf[stop + n] !== CR || buf[stop + n + 1] !== LF) return malformed('a bulk string not ended by CRLF')
      return stop + n + 2
    }
    case 0x2a: { // *
      const n = lengthOf(buf, p, stop)
      if (typeof n !== 'number') return n
      if (depth >= MAX_DEPTH) return malformed('arrays nested too deep')
      let q = stop
      for (let i = 0; i < n; i++) {
        q = scanValue(buf, q, end, depth + 1) as number
        if (typeof q !== 'number' || q < 0) return q
      }
      return q
    }
    default:
      return malformed(`unknown type byte 0x${buf[p]!.toString(16)}`)
  }
}

/** Finds where one reply ends. */
class ReplyScanner implements FrameScanner {
  scan (buf: Buffer, start: number, end: number): number | RpcError {
    const stop = scanValue(buf, start, end, 0)
    if (typeof stop !== 'number') return stop
    return stop < 0 ? 0 : stop - start
  }

  reset (): void {}
}

/** The RpcError of an error reply: Redis's text, its first word as the name. */
export function redisError (text: string): RpcError {
  const space = text.indexOf(' ')
  const name = space < 0 ? text : text.slice(0, space)
  return new RpcError(ErrorCode.REMOTE, text, { remote: { protocol: 'redis', code: 0, name, fatal: false } })
}

// Decodes the (complete, scanned) value at p; returns it and where it ends.
export function decodeValue (buf: Buffer, p: number): [RedisReply, number] {
  const stop = buf.indexOf(LF, p) + 1
  const line = (): string => buf.toString('utf8', p + 1, stop - 2)
  switch (buf[p]) {
    case 0x2b: return [line(), stop]
    case 0x2d: return [redisError(line()), stop]
    case 0x3a: {
      const text = line()
      const n = Number(text)
      return [Number.isSafeInteger(n) ? n : BigInt(text), stop]
    }
    case 0x24: {
      const n = Number(buf.toString('latin1', p + 1, stop - 2))
      if (n === -1) return [null, stop]
      // A copy: a view would pin the whole read chunk.
      return [Buffer.from(buf.subarray(stop, stop + n)), stop + n + 2]
    }
    default: { // '*', as scanned
      const n = Number(buf.toString('latin1', p + 1, stop - 2))
      if (n === -1) return [null, stop]
      const items: RedisReply[] = []
      let q = stop
      for (let i = 0; i < n; i++) {
        const [item, next] = decodeValue(buf, q)
        items.push(item)
        q = next
      }
      return [items, q]
    }
  }
}

function putLatin1 (out: FrameSink, text: string): void {
  const at = out.reserve(text.length)
  out.buffer.write(text, at, 'latin1')
}

// Errors after which the command did not run: worth trying again.
const RETRYABLE_ERRORS: ReadonlySet<string> = new Set(['BUSY', 'LOADING', 'TRYAGAIN'])
// Commands safe to send again after a lost connection: they change nothing.
const READ_ONLY: ReadonlySet<string> = new Set(['GET', 'MGET', 'EXISTS', 'STRLEN', 'TTL', 'PTTL', 'TYPE', 'LRANGE', 'LLEN',
  'SMEMBERS', 'SCARD', 'HGET', 'HGETALL', 'ZRANGE', 'ZCARD', 'PING', 'ECHO', 'DBSIZE', 'KEYS'])

/** RESP2, client side. */
export function redisClientProtocol (): ClientProtocol<RedisCommand, RedisReply> {
  return {
    name: 'redis',
    framing: { scanner: () => new ReplyScanner() },
    matching: 'in-order',
    encode (command, _id, out): void {
      if (!command.large) {
        const at = out.reserve(command.bytes)
        writeCommand(command, out.buffer, at)
        return
      }
      let head = `*${command.args.length}\r\n`
      // Each argument appended as it is (a large one not copied), between the headers and CRLFs around it.
      for (const arg of command.args) {
        putLatin1(out, `${head}$${arg.length}\r\n`)
        out.append(arg)
        head = '\r\n'
      }
      putLatin1(out, head)
    },
    decodeAnswer (_command, buf, start): RedisReply | RpcError {
      const [reply] = decodeValue(buf, start)
      return reply
    },
    retryable: (error, command) => error.remote !== undefined
      ? RETRYABLE_ERRORS.has(error.remote.name)
      : READ_ONLY.has(command.args[0]!.toString('latin1').toUpperCase())
  }
}
