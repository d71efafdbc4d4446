/**
 * Toy client protocols with pushes and streamed answers, for the tests of
 * ProtocolClient's pushes, streams and interceptors, and scripted raw
 * node:net servers that speak them.
 *
 * - `pushLines`: the `lines` protocol of toy-client-protocols.ts, plus
 *   pushes (`>text\n`) and streamed answers to `list` requests (`+value\n`
 *   per part, `.\n` to end, `-ERR reason message\n` to fail it).
 * - `pushTagged`: the `tagged` protocol (matched by id), plus pushes
 *   (status 0xff; the id field means nothing) and streamed answers to
 *   `list` requests (status 0x10 per part, then status 0 with the last
 *   value, or with an empty payload for none).
 */
import type { Test } from 'tap'
import { createServer, type Server, type Socket } from 'node:net'
import { once } from 'node:events'
import type { AnswerPart, ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ProtocolClient, type ProtocolClientOptions } from '../../reactor/protocol-client.js'
import { linesClientProtocol, taggedClientProtocol, type ToyRequest } from './toy-client-protocols.js'

export const PUSH_STATUS = 0xff
export const PART_STATUS = 0x10

/** `lines` with pushes and streams. `>!` is a push that cannot be decoded (fatal). */
export function pushLinesProtocol (options: { pushes?: boolean } = {}): ClientProtocol<ToyRequest, string> {
  const base = linesClientProtocol()
  const protocol: ClientProtocol<ToyRequest, string> = {
    ...base,
    name: 'push-lines',
    answerOf: (request) => request.route === 'list' ? 'stream' : 'yes',
    decodePart (_request, buf, start, end): AnswerPart | RpcError {
      const line = buf.toString('utf8', start, end - 1)
      if (line === '.') return { value: undefined, last: true }
      if (line.startsWith('+')) return { value: line.slice(1), last: false }
      const answer = base.decodeAnswer({ route: 'list' }, buf, start, end)
      return answer instanceof RpcError ? answer : new RpcError(ErrorCode.MALFORMED_FRAME, `not a part: ${line}`)
    }
  }
  if (options.pushes === false) return protocol
  return {
    ...protocol,
    isPush: (buf, start) => buf[start] === 0x3e, // '>'
    decodePush: (buf, start, end) => buf[start + 1] === 0x21 // '!'
      ? new RpcError(ErrorCode.MALFORMED_FRAME, 'a push that says nothing')
      : buf.toString('utf8', start + 1, end - 1)
  }
}

/** `tagged` with pushes and streams. */
export function pushTaggedProtocol (): ClientProtocol<ToyRequest, string> {
  const base = taggedClientProtocol()
  return {
    ...base,
    name: 'push-tagged',
    answerOf: (request) => request.route === 'list' ? 'stream' : 'yes',
    decodePart (request, buf, start, end): AnswerPart | RpcError {
      const status = buf[start + 2]!
      if (status === PART_STATUS) return { value: buf.toString('utf8', start + 7, end), last: false }
      const answer = base.decodeAnswer(request, buf, start, end)
      if (answer instanceof RpcError) return answer
      return { value: answer === '' ? undefined : answer, last: true }
    },
    isPush: (buf, start) => buf[start + 2] === PUSH_STATUS,
    decodePush: (buf, start, end) => buf.toString('utf8', start + 7, end)
  }
}

/** A `tagged` frame: `[u16 length][u8 status][u32 id][payload]`. */
export function taggedFrame (status: number, id: number, text: string): Buffer {
  const payload = Buffer.from(text)
  const out = Buffer.alloc(7 + payload.length)
  out.writeUInt16BE(5 + payload.length, 0)
  out[2] = status
  out.writeUInt32BE(id, 3)
  payload.copy(out, 7)
  return out
}

/** A `tagged` request as the server reads it. */
export interface TaggedRequest { route: number, id: number, payload: string }

export interface RawServer {
  port: number
  sockets: Socket[]
}

/** A raw server; `onConnection` gets each accepted socket. Every socket and the listener are closed at the test's end. */
export async function rawServer (t: Test, onConnection: (socket: Socket) => void): Promise<RawServer> {
  const sockets: Socket[] = []
  const server: Server = createServer((socket) => {
    sockets.push(socket)
    socket.on('error', () => {})
    onConnection(socket)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    for (const s of sockets) s.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return { port: (server.address() as { port: number }).port, sockets }
}

/** A raw server of the lines protocol: `respond` gets each request line (without its newline) and returns what to write. */
export function lineServer (t: Test, respond: (line: string, socket: Socket) => string | null): Promise<RawServer> {
  return rawServer(t, (socket) => {
    let pending = ''
    socket.on('data', (chunk: Buffer) => {
      pending += chunk.toString('utf8')
      let out = ''
      for (let at = pending.indexOf('\n'); at >= 0; at = pending.indexOf('\n')) {
        const line = pending.slice(0, at)
        pending = pending.slice(at + 1)
        out += respond(line, socket) ?? ''
      }
      if (out !== '' && !socket.destroyed) socket.write(out)
    })
  })
}

/** A raw server of the tagged protocol: `respond` gets each request and returns the frames to write. */
export function taggedServer (t: Test, respond: (request: TaggedRequest, socket: Socket) => Buffer[]): Promise<RawServer> {
  return rawServer(t, (socket) => {
    let pending = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk])
      const out: Buffer[] = []
      while (pending.length >= 2 && pending.length >= 2 + pending.readUInt16BE(0)) {
        const size = 2 + pending.readUInt16BE(0)
        out.push(...respond({ route: pending[2]!, id: pending.readUInt32BE(3), payload: pending.toString('utf8', 7, size) }, socket))
        pending = pending.subarray(size)
      }
      if (out.length > 0 && !socket.destroyed) socket.write(Buffer.concat(out))
    })
  })
}

export function toyClient (t: Test, protocol: ClientProtocol<ToyRequest, string>, port: number, options: Partial<ProtocolClientOptions> = {}): ProtocolClient<ToyRequest, string> {
  const c = new ProtocolClient(protocol, { endpoint: `127.0.0.1:${port}`, logger: null, ...options })
  t.teardown(() => c.close())
  return c
}

/** Settles every promise, and counts outcomes: `ok` or the error's code (remote: its name). */
export async function outcomes (calls: Array<Promise<unknown>>): Promise<Record<string, number>> {
  const counts: Record<string, number> = {}
  for (const r of await Promise.allSettled(calls)) {
    const key = r.status === 'fulfilled' ? 'ok' : (r.reason as RpcError).remote?.name ?? (r.reason as RpcError).code
    counts[key] = (counts[key] ?? 0) + 1
  }
  return counts
}

/** Polls `predicate` on timers (not a fixed sleep) until it holds. */
export async function until (predicate: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 1000 && !predicate(); i++) await new Promise(resolve => setTimeout(resolve, 5))
  if (!predicate()) throw new Error(`timed out waiting for ${what}`)
}
