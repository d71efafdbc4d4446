import type { Socket } from 'node:net'

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
