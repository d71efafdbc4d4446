import type { ByteStream, ByteStreamListener } from '../../transport/byte-stream.js'

/**
 * A ByteStream double with a scripted kernel, to test the framed connection
 * as a WebSocket receiver is tested: the test decides what the peer sends
 * and how it is split into reads, how much the kernel takes of each write,
 * and when the peer ends or resets. Like a socket, a stream that is not
 * reading sees nothing: neither the peer's bytes nor its end (they wait, as
 * in the kernel's buffer). Reads land in slabs the stream owns, at an
 * offset, never written again: `start` is rarely 0.
 */
export class FakeStream implements ByteStream {
  #listener: ByteStreamListener | null = null
  /** The peer's bytes and events not seen yet (the stream is not reading, or no listener yet). */
  readonly #inbound: Array<Buffer | 'end' | Error> = []
  #reading = true
  #pumpScheduled = false
  /** Bytes the kernel will still take before refusing (Infinity: all). */
  kernelRoom = Infinity
  /** Bytes the kernel took, in order: what the peer receives. */
  readonly sent: Buffer[] = []
  /** One entry per `write` or `writev` call: the bytes it was given. */
  readonly writes: Buffer[] = []
  /** Bytes handed to the stream that the kernel has not taken, with the callback of the write they end. */
  readonly #held: Array<{ bytes: Buffer, onWritten?: ((error: Error | null | undefined) => void) | undefined }> = []
  #heldBytes = 0
  #needsWritable = false
  #bytesWritten = 0
  /** Calls of `listen` (the connection's, then its read gate's probe listener and back). */
  listens = 0
  pauses = 0
  resumes = 0
  ended = false
  closed = false
  wasReset = false

  listen (listener: ByteStreamListener): void {
    this.#listener = listener
    this.listens++
    this.#schedulePump()
  }

  /** True while the connection lets the stream read. */
  get reading (): boolean {
    return this.#reading
  }

  /** The peer sends `bytes`, read as one read when the stream reads (`split` cuts it into several). */
  peerSends (bytes: Buffer, ...split: number[]): void {
    let at = 0
    for (const cut of [...split, bytes.length]) {
      if (cut > at) this.#inbound.push(bytes.subarray(at, cut))
      at = cut
    }
    this.#schedulePump()
  }

  /** The peer half-closes (FIN): seen once the stream reads. */
  peerEnds (): void {
    this.#inbound.push('end')
    this.#schedulePump()
  }

  /** The peer resets: an ECONNRESET error, then the close, once the stream reads. */
  peerResets (): void {
    this.#inbound.push(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }))
    this.#schedulePump()
  }

  /** Delivers what waits while the stream reads (as the event loop would, on its own turn). */
  pump (): void {
    this.#pumpScheduled = false
    while (this.#reading && this.#listener !== null && this.#inbound.length > 0 && !this.closed) {
      const next = this.#inbound.shift()!
      const listener = this.#listener
      if (next === 'end') listener.onEnd()
      else if (next instanceof Error) {
        listener.onError(next)
        this.closed = true
        listener.onClose()
      } else {
        // A slab of the stream's own, the read at an offset inside it, never reused.
        const slab = Buffer.alloc(next.length + 16)
        next.copy(slab, 7)
        listener.onRead(slab, 7, 7 + next.length)
      }
    }
  }

  #schedulePump (): void {
    if (this.#pumpScheduled) return
    this.#pumpScheduled = true
    setImmediate(() => this.pump())
  }

  write (chunk: Buffer): boolean {
    return this.writev([chunk])
  }

  writev (slices: readonly Buffer[], onWritten?: (error: Error | null | undefined) => void): boolean {
    if (this.ended || this.closed) throw new Error('write after end')
    const bytes = Buffer.concat(slices)
    this.writes.push(bytes)
    this.#held.push({ bytes, onWritten })
    this.#heldBytes += bytes.length
    this.#flush()
    if (this.#heldBytes === 0) return true
    this.#needsWritable = true
    return false
  }

  /** The kernel makes room for `bytes` more (the peer read them): held bytes go out, and a stream that refused a write reports it writable. */
  makeRoom (bytes: number): void {
    this.kernelRoom += bytes
    this.#flush()
    if (this.#heldBytes === 0 && this.#needsWritable) {
      this.#needsWritable = false
      this.#listener?.onWritable()
    }
  }

  // The kernel takes what it has room for.
  #flush (): void {
    while (this.#held.length > 0 && this.kernelRoom > 0) {
      const first = this.#held[0]!
      const take = Math.min(first.bytes.length, this.kernelRoom)
      this.sent.push(first.bytes.subarray(0, take))
      this.kernelRoom -= take
      this.#heldBytes -= take
      this.#bytesWritten += take
      if (take < first.bytes.length) {
        first.bytes = first.bytes.subarray(take)
        return
      }
      this.#held.shift()
      first.onWritten?.(null)
    }
  }

  get writableLength (): number {
    return this.#heldBytes
  }

  pauseReading (): void {
    this.pauses++
    this.#reading = false
  }

  resumeReading (): void {
    this.resumes++
    this.#reading = true
    this.#schedulePump()
  }

  get bufferedReadBytes (): number {
    return 0
  }

  end (onEnded: () => void): void {
    this.ended = true
    const done = (): void => {
      if (this.closed) return
      if (this.#heldBytes === 0) setImmediate(onEnded)
      else setImmediate(done)
    }
    done()
  }

  close (): void {
    this.closed = true
  }

  reset (): void {
    this.wasReset = true
    this.closed = true
  }

  get bytesWritten (): number {
    return this.#bytesWritten
  }

  get writeQueueBytes (): number {
    return this.#heldBytes
  }

  get secureProtocol (): string | null {
    return null
  }

  /** Every byte the kernel took, in order. */
  received (): Buffer {
    return Buffer.concat(this.sent)
  }
}

/** Resolves once the streams' scheduled reads ran (each `setImmediate` turn delivers what waits). */
export function settle (): Promise<void> {
  return new Promise(resolve => setImmediate(() => setImmediate(resolve)))
}
