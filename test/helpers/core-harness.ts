/**
 * The generic core (`ProtocolServer`, `ProtocolClient`) on the toy
 * protocols, for test/reactor/: a server on loopback port 0 with a FakeClock
 * when timing matters, raw peers, handlers a test releases by hand, and
 * answers tallied by status. Only the package's public names are used, so
 * the suites keep testing the core while its internals move.
 */
import { connect, createServer, type Socket } from 'node:net'
import { once } from 'node:events'
import type { Test } from 'tap'
import { ErrorCode, ProtocolClient, ProtocolServer, RpcError, type CallContext, type Clock, type ProtocolClientOptions, type ServerOptions, type ServerProtocol, type TimerHandle } from '../../reactor/index.js'
import { FakeClock } from '../../reactor/testing.js'
import { Peer } from './socket-peer.js'
import { taggedAnswers, taggedProtocol } from './toy-protocols.js'
import { taggedClientProtocol, type ToyRequest } from './toy-client-protocols.js'

export { FakeClock }

/** A server under test: its port, and raw peers the teardown destroys. */
export interface Core {
  readonly server: ProtocolServer
  readonly port: number
  open: () => Promise<Peer>
}

/**
 * `protocol` served on 127.0.0.1:0 with `handlers` as the group the
 * protocol names (`tagged` or `lines`); `options.workers` and
 * `options.queueLength` also go to the group. Teardown destroys the peers
 * and closes the server.
 */
export async function serveCore (t: Test, protocol: ServerProtocol<any, any>, handlers: Record<string, (req: never, ctx: CallContext) => unknown>, options: ServerOptions = {}): Promise<Core> {
  const server = new ProtocolServer(protocol, { logger: null, ...options })
  server.addRoutes(protocol.name, handlers as never, { workers: options.workers, queueLength: options.queueLength })
  const { port } = await server.listen(0, '127.0.0.1')
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const peer of peers) peer.socket.destroy()
    await server.close({ graceMs: 0 })
  })
  const open = async (): Promise<Peer> => {
    const socket = connect(port, '127.0.0.1')
    const peer = new Peer(socket)
    peers.push(peer)
    await once(socket, 'connect')
    return peer
  }
  return { server, port, open }
}

/**
 * `tagged` with a time budget on the wire: a payload `NNN:rest` gives the
 * call NNN ms (CallHead.timeoutMs), so calls can carry deadlines of their
 * own, as KRPC's timeout_millis does.
 */
export function timedTaggedProtocol (): ServerProtocol<Buffer, Buffer> {
  const base = taggedProtocol()
  return {
    ...base,
    decodeHead (buf, start, end, head) {
      const error = base.decodeHead(buf, start, end, head)
      if (error !== null) return error
      const colon = buf.indexOf(0x3a, start + 7)
      if (colon > start + 7 && colon < end) {
        const ms = Number(buf.toString('latin1', start + 7, colon))
        if (Number.isInteger(ms) && ms > 0) head.timeoutMs = ms
      }
      return null
    }
  }
}

/** `tagged` that can push: a push is an answer frame of status 0 and id 0xffffffff carrying the message. */
export function pushingTaggedProtocol (): ServerProtocol<Buffer, Buffer> {
  return {
    ...taggedProtocol(),
    encodePush (message: unknown, sink): void {
      const body = message as Buffer
      const at = sink.reserve(7 + body.length)
      const out = sink.buffer.fill(0, at, at + 7)
      out.writeUInt16BE(5 + body.length, at)
      out.writeUInt32BE(0xffffffff, at + 3)
      body.copy(out, at + 7)
    }
  }
}

/**
 * `tagged` whose connections must first send a tagged frame with payload
 * `hello` (answered with an ok frame, id 0) before any call: a set-up, as
 * KRPC's negotiation, for the negotiation limits. Any other first frame fails it.
 */
export function helloTaggedProtocol (): ServerProtocol<Buffer, Buffer> {
  return {
    ...taggedProtocol(),
    handshake: () => ({
      onFrame (frame: Buffer) {
        if (frame.subarray(7).toString() !== 'hello') return { error: new RpcError(ErrorCode.NEGOTIATION_FAILED, 'expected hello') }
        const ack = Buffer.alloc(7)
        ack.writeUInt16BE(5, 0)
        return { send: [[ack]], done: { user: 'toy' } }
      }
    })
  }
}

/** Handlers that wait until the test releases them, in the order they started. */
export class Gate {
  readonly started: string[] = []
  readonly #waiting: Array<{ payload: string, release: (answer?: string) => void, fail: (error: Error) => void }> = []

  /** A handler (tagged: Buffer in, Buffer out) that waits for `release`; its answer is its payload. */
  readonly handler = (req: Buffer): Promise<Buffer> => {
    const payload = req.toString()
    this.started.push(payload)
    return new Promise<Buffer>((resolve, reject) => {
      this.#waiting.push({ payload, release: (answer) => resolve(Buffer.from(answer ?? payload)), fail: reject })
    })
  }

  get waiting (): number {
    return this.#waiting.length
  }

  /** Releases the oldest waiting handler. */
  releaseOne (answer?: string): void {
    this.#waiting.shift()?.release(answer)
  }

  /** Releases the waiting handler whose payload is `payload`. */
  release (payload: string): void {
    const at = this.#waiting.findIndex(w => w.payload === payload)
    if (at >= 0) this.#waiting.splice(at, 1)[0]!.release()
  }

  releaseAll (): void {
    while (this.#waiting.length > 0) this.releaseOne()
  }
}

/** The tagged answers in `bytes`, counted by status (`ok`, `busy`, `expired`, ...). */
export function tally (bytes: Buffer): Record<string, number> {
  const out: Record<string, number> = {}
  for (const [status] of taggedAnswers(bytes)) out[status] = (out[status] ?? 0) + 1
  return out
}

/** Settled promises counted by outcome: `ok`, or the rejection's `code` (or its message). */
export async function outcomes (calls: Array<Promise<unknown>>): Promise<Record<string, number>> {
  const out: Record<string, number> = {}
  for (const result of await Promise.allSettled(calls)) {
    const key = result.status === 'fulfilled' ? 'ok' : String((result.reason as { code?: string }).code ?? (result.reason as Error).message)
    out[key] = (out[key] ?? 0) + 1
  }
  return out
}

/** Lets `n` turns of the event loop pass (I/O callbacks included), no time. */
export async function turns (n = 1): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise(resolve => setImmediate(resolve))
}

/** Polls every 5 ms (2.5 s at most) until `predicate` holds; throws naming `what` otherwise. */
export async function until (predicate: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 500 && !predicate(); i++) await new Promise(resolve => setTimeout(resolve, 5))
  if (!predicate()) throw new Error(`timed out waiting for ${what}`)
}

/** A `ProtocolClient` of the tagged protocol to `port`, closed by the teardown. */
export function taggedClient (t: Test, port: number, options: Partial<ProtocolClientOptions> = {}): ProtocolClient<ToyRequest, string> {
  const client = new ProtocolClient(taggedClientProtocol(), { endpoint: `127.0.0.1:${port}`, logger: null, ...options })
  t.teardown(() => client.close())
  return client
}

/** Counts of the process's active handles by kind (TCPSocketWrap, TCPServerWrap, Timeout, ...). */
export function activeResources (): Record<string, number> {
  const out: Record<string, number> = {}
  for (const kind of process.getActiveResourcesInfo()) out[kind] = (out[kind] ?? 0) + 1
  return out
}

/**
 * An endpoint nothing listens on. Not a port 0 pick just freed: a test file
 * running beside this one may be given it. Port 1 (tcpmux) is privileged and
 * served by nothing here.
 */
export const CLOSED_ENDPOINT = '127.0.0.1:1'

/**
 * A raw listener on 127.0.0.1:0 standing in for a server the client test
 * scripts by hand: `onData` sees each connection's chunks, `sockets` holds
 * the accepted connections. Teardown destroys them and closes the listener.
 */
export async function rawServer (t: Test, onData: (socket: Socket, chunk: Buffer) => void = () => {}): Promise<{ port: number, sockets: Socket[] }> {
  const sockets: Socket[] = []
  const server = createServer((socket) => {
    sockets.push(socket)
    socket.on('error', () => {})
    socket.on('data', (chunk: Buffer) => { onData(socket, chunk) })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    for (const socket of sockets) socket.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return { port: (server.address() as { port: number }).port, sockets }
}

/** A tagged answer frame (status ok) for call `id`, as a raw server sends it. */
export function taggedAnswer (id: number, text: string): Buffer {
  const out = Buffer.alloc(7 + Buffer.byteLength(text))
  out.writeUInt16BE(5 + Buffer.byteLength(text), 0)
  out.writeUInt32BE(id, 3)
  out.write(text, 7)
  return out
}

/**
 * A clock whose timers fire only through `fire()`, while `defer` is a real
 * `setImmediate`. Firing from a real timer callback reproduces a loop that
 * was stalled: the overdue timer runs in the timers phase, and the I/O that
 * is ready (an answer already in the socket) is read before the deferred
 * check.
 */
export class ManualClock implements Clock {
  #now = 1000
  #timers = new Set<{ at: number, callback: () => void }>()

  now (): number {
    return this.#now
  }

  setTimer (callback: () => void, ms: number): TimerHandle {
    const timer = { at: this.#now + Math.max(0, ms), callback }
    this.#timers.add(timer)
    return timer as unknown as TimerHandle
  }

  clearTimer (handle: TimerHandle): void {
    this.#timers.delete(handle as unknown as { at: number, callback: () => void })
  }

  defer (callback: () => void): void {
    setImmediate(callback)
  }

  /** Timers set and not yet fired or cleared. */
  get pendingTimers (): number {
    return this.#timers.size
  }

  /** Moves time by `ms` and runs, synchronously, every timer now due. */
  fire (ms: number): void {
    this.#now += ms
    const due = [...this.#timers].filter(t => t.at <= this.#now).sort((a, b) => a.at - b.at)
    for (const t of due) {
      this.#timers.delete(t)
      t.callback()
    }
  }
}
