import type { Duplex } from 'node:stream'
import type { Socket } from 'node:net'
import type { ByteStream, ByteStreamListener } from './byte-stream.js'
import type { SocketReader } from './socket-reader.js'

/**
 * A ByteStream over a Node socket: a `net.Socket` read through a
 * SocketReader's `onread` slabs (the fast path), or any Duplex read through
 * its 'data' events (a `tls.TLSSocket`, a socket Node would not give
 * `onread`). Node does the non-blocking part: `write` tries the kernel at
 * once and buffers what it refused, returning false past the high-water
 * mark, and 'drain' is the writable notification.
 */
export class NodeStream implements ByteStream {
  readonly #duplex: Duplex
  readonly #reader: SocketReader | null
  #listener: ByteStreamListener = UNLISTENED
  #listening = false
  readonly #onData = (chunk: Buffer): void => this.#listener.onRead(chunk, 0, chunk.length)

  /** `duplex` with `reader`: the socket was made with `reader.onread`, reads come from it, not from 'data' events. */
  constructor (duplex: Duplex, reader?: SocketReader) {
    this.#duplex = duplex
    this.#reader = reader ?? null
    duplex.on('drain', () => this.#listener.onWritable())
    duplex.on('error', (err: Error) => this.#listener.onError(err))
    duplex.on('end', () => this.#listener.onEnd())
    duplex.on('close', () => this.#listener.onClose())
  }

  /** How reads arrive: `onread` slabs, or 'data' events. */
  get readPath (): 'onread' | 'data' {
    return this.#reader === null ? 'data' : 'onread'
  }

  listen (listener: ByteStreamListener): void {
    this.#listener = listener
    // The reader calls the listener's own function: no hop of ours per read.
    if (this.#reader !== null) this.#reader.attach(listener.onRead)
    else if (!this.#listening) this.#duplex.on('data', this.#onData)
    this.#listening = true
  }

  write (chunk: Buffer): boolean {
    return this.#duplex.write(chunk)
  }

  writev (slices: readonly Buffer[], onWritten?: (error: Error | null | undefined) => void): boolean {
    const duplex = this.#duplex
    const last = slices.length - 1
    // Corked, the slices leave in one writev.
    duplex.cork()
    for (let i = 0; i < last; i++) duplex.write(slices[i]!)
    const ok = onWritten === undefined ? duplex.write(slices[last]!) : duplex.write(slices[last]!, onWritten)
    duplex.uncork()
    return ok
  }

  get writableLength (): number {
    return this.#duplex.writableLength
  }

  pauseReading (): void {
    this.#duplex.pause()
  }

  resumeReading (): void {
    this.#duplex.resume()
  }

  get bufferedReadBytes (): number {
    return this.#reader === null ? this.#duplex.readableLength : 0
  }

  end (onEnded: () => void): void {
    this.#duplex.end(onEnded)
  }

  close (): void {
    this.#duplex.destroy()
  }

  reset (): void {
    const socket = this.#duplex as Duplex & { resetAndDestroy?: () => void }
    // Node >= 16.17; a Duplex without it (TLS over a socket of its own) is destroyed.
    if (typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy()
    else socket.destroy()
  }

  get bytesWritten (): number {
    const written = (this.#duplex as Partial<{ bytesWritten: number }>).bytesWritten
    return typeof written === 'number' ? written : 0
  }

  get writeQueueBytes (): number {
    return writeQueueBytesOf(this.#duplex)
  }

  get secureProtocol (): string | null {
    return (this.#duplex as Partial<{ getProtocol: () => string | null }>).getProtocol?.() ?? null
  }
}

/**
 * Bytes libuv still has to write from requests already handed to it, for a
 * Node socket. Under TLS the TCP handle beneath counts the kernel's progress
 * (the TLS one holds a write whole until done).
 */
export function writeQueueBytesOf (duplex: Duplex): number {
  type Handle = { writeQueueSize?: unknown, _parent?: Handle } | null
  const handle = (duplex as unknown as { _handle?: Handle })._handle
  const size = (handle?._parent ?? handle)?.writeQueueSize
  return typeof size === 'number' ? size : 0
}

function ignore (): void {}

// The listener until the connection's: reads wait in the reader (or unread in the Duplex); events are dropped.
const UNLISTENED: ByteStreamListener = { onRead: ignore, onWritable: ignore, onEnd: ignore, onError: ignore, onClose: ignore }

/**
 * The ByteStream of a connection's socket (TCP, or TLS from the first
 * byte): Nagle off, frames leave as they are written. `reader`: the socket
 * was made with `reader.onread`.
 */
export function socketStream (socket: Socket, reader?: SocketReader): NodeStream {
  socket.setNoDelay(true)
  return new NodeStream(socket, reader)
}
