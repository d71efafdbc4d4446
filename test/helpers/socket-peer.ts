import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import type { Test } from 'tap'
import type { ServerProtocol } from '../../codec/protocol.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { ProtocolServer, type ServerOptions } from '../../reactor/server.js'

/** A raw client socket that collects every byte it receives and whether it closed. */
export class Peer {
  readonly socket: Socket
  received = Buffer.alloc(0)
  closed = false
  constructor (socket: Socket) {
    this.socket = socket
    socket.setNoDelay(true)
    socket.on('data', (chunk: Buffer) => { this.received = Buffer.concat([this.received, chunk]) })
    socket.on('close', () => { this.closed = true })
    socket.on('error', () => {})
  }

  get text (): string {
    return this.received.toString('latin1')
  }

  /** Polls (every 5 ms, 2.5 s at most) until `predicate` holds; throws naming `what` otherwise. */
  async until (predicate: () => boolean, what: string): Promise<void> {
    for (let i = 0; i < 500 && !predicate(); i++) await new Promise(resolve => setTimeout(resolve, 5))
    if (!predicate()) throw new Error(`timed out waiting for ${what}; received ${JSON.stringify(this.text)}`)
  }
}

/**
 * Connects to 127.0.0.1:`port`, writes `bytes` and then `trailer` (a request
 * the server always answers), and collects what comes back until `marker`
 * (in the trailer's answer) arrives, the server closes, or 300 ms pass: a
 * frame that announced more bytes than came waits for them, as it should.
 */
export async function exchange (port: number, bytes: Buffer, trailer: Buffer, marker: Buffer): Promise<{ received: Buffer, closed: boolean }> {
  const socket: Socket = connect(port, '127.0.0.1')
  socket.setNoDelay(true)
  socket.on('error', () => {})
  let received = Buffer.alloc(0)
  let closed = false
  socket.on('data', (d: Buffer) => { received = Buffer.concat([received, d]) })
  socket.on('close', () => { closed = true })
  await once(socket, 'connect')
  socket.write(Buffer.concat([bytes, trailer]))
  for (let i = 0; i < 60 && !closed && received.indexOf(marker) < 0; i++) await new Promise(resolve => setTimeout(resolve, 5))
  socket.destroy()
  return { received, closed }
}

/**
 * A ProtocolServer for `protocol` with `handlers` as route group `group`, on
 * 127.0.0.1 port 0, and a way to open Peers to it; the test's teardown
 * destroys the peers and closes the server. The group gets `options.workers`
 * and `options.queueLength`.
 */
export async function servePeers (t: Test, protocol: ServerProtocol<any, any>, group: string, handlers: Record<string, (req: never, ctx: CallContext) => unknown>, options: ServerOptions = {}): Promise<{ server: ProtocolServer, open: () => Promise<Peer> }> {
  const server = new ProtocolServer(protocol, options)
  server.addRoutes(group, handlers as never, { workers: options.workers, queueLength: options.queueLength })
  const { port } = await server.listen(0, '127.0.0.1')
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const peer of peers) peer.socket.destroy()
    await server.close({ graceMs: 100 })
  })
  const open = async (): Promise<Peer> => {
    const socket = connect(port, '127.0.0.1')
    await once(socket, 'connect')
    const peer = new Peer(socket)
    peers.push(peer)
    return peer
  }
  return { server, open }
}
