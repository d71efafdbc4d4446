import { ErrorCode, RpcError } from '../codec/errors.js'
import type { SecureChannel } from '../codec/protocol.js'
import type { ByteStream, ByteStreamListener } from './byte-stream.js'
import { NodeStream } from './net-stream.js'

/**
 * The ByteStream of a connection whose set-up switched to a secure channel
 * (KRPC's TLS inside negotiation): frames are read from and written to the
 * channel's stream (TLS), which writes its records to the socket itself.
 * What the socket reads is the channel's input. Reading is stopped at the
 * socket (TLS then has nothing to decrypt); the counters are the socket's,
 * where the kernel's progress shows. Either side's end, error or close
 * reaches the listener (the connection closes once, on the first).
 */
export class ChannelStream implements ByteStream {
  readonly #tls: NodeStream
  readonly #base: ByteStream
  readonly #channel: SecureChannel
  #listener: ByteStreamListener | null = null

  constructor (channel: SecureChannel, base: ByteStream) {
    this.#channel = channel
    this.#base = base
    this.#tls = new NodeStream(channel.stream)
    base.listen({
      onRead: (buf, start, end) => channel.input(start === 0 && end === buf.length ? buf : buf.subarray(start, end)),
      onWritable: () => this.#listener?.onWritable(),
      onEnd: () => this.#listener?.onEnd(),
      onError: (err) => this.#listener?.onError(err),
      onClose: () => this.#listener?.onClose()
    })
  }

  /** Hands bytes the socket read before the switch to the channel, as if read now. */
  input (chunk: Buffer): void {
    this.#channel.input(chunk)
  }

  listen (listener: ByteStreamListener): void {
    this.#listener = listener
    // The channel's own failures are named as TLS's, the socket's as the socket's.
    this.#tls.listen({
      onRead: listener.onRead,
      onWritable: listener.onWritable,
      onEnd: listener.onEnd,
      onError: (err) => listener.onError(err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECTION_CLOSED, `TLS error: ${err.message}`, { cause: err })),
      onClose: listener.onClose
    })
  }

  write (chunk: Buffer): boolean {
    return this.#tls.write(chunk)
  }

  writev (slices: readonly Buffer[], onWritten?: (error: Error | null | undefined) => void): boolean {
    return this.#tls.writev(slices, onWritten)
  }

  get writableLength (): number {
    return this.#tls.writableLength
  }

  pauseReading (): void {
    this.#base.pauseReading()
  }

  resumeReading (): void {
    this.#base.resumeReading()
  }

  get bufferedReadBytes (): number {
    return this.#base.bufferedReadBytes + this.#tls.bufferedReadBytes
  }

  end (onEnded: () => void): void {
    // TLS writes its close_notify, then the channel ends the socket.
    this.#tls.end(onEnded)
  }

  close (): void {
    this.#base.close()
    this.#tls.close()
  }

  reset (): void {
    this.#base.reset()
    this.#tls.close()
  }

  get bytesWritten (): number {
    return this.#base.bytesWritten
  }

  get writeQueueBytes (): number {
    return this.#base.writeQueueBytes
  }

  get secureProtocol (): string | null {
    return this.#tls.secureProtocol
  }
}
