import type { ByteStream, ByteStreamListener } from '../byte-stream.js'
import type { NativeReactorHandle } from './load.js'
import { errnoError } from './errno.js'

/** What a NativeStream needs of its reactor. */
export interface StreamHost {
  readonly handle: NativeReactorHandle
  /** The stream closed: its id is forgotten. */
  forget: (id: number) => void
}

/**
 * A ByteStream over a connection of the native transport (epoll or
 * io_uring, transport/native/reactor.ts). Reads come from the reactor's
 * turn, as ranges of the turn's slabs (never rewritten: a view stays
 * valid). A write goes to the kernel at once (one sendmsg, or one send SQE
 * submitted at the end of the turn); what the kernel refuses stays here, in
 * order, and goes when the reactor says the socket is writable again.
 */
export class NativeStream implements ByteStream {
  readonly id: number
  readonly #host: StreamHost
  readonly #h: NativeReactorHandle
  #listener: ByteStreamListener = UNLISTENED
  #listened = false
  /** Reads before the first listener, and reads that arrived while paused (a completion already on its way). */
  #held: Buffer[] = []
  #heldBytes = 0
  #heldEnd = false
  #paused = false
  /** What the kernel refused, in order, and its size. */
  #pending: Buffer[] = []
  #pendingBytes = 0
  /** Bytes given to the stream, and taken by the kernel, so far; `onWritten` callbacks wait for a count. */
  #given = 0
  #taken = 0
  #written: Array<{ at: number, cb: (error: Error | null | undefined) => void }> = []
  #onEnded: (() => void) | null = null
  #endsAfterKernel = false
  #closed = false
  #peer: [string, number] | null | undefined
  /** An outbound connection not connected yet: writes wait here. */
  #connecting: boolean
  #onConnected: Array<(error: Error | null) => void> = []

  /** `connecting`: an outbound connection (`connected` follows). */
  constructor (host: StreamHost, id: number, connecting = false) {
    this.#host = host
    this.#h = host.handle
    this.id = id
    this.#connecting = connecting
  }

  /** Calls `done` once the connect ended: null when connected, else the error (the stream is closed then). At once if it has ended. */
  whenConnected (done: (error: Error | null) => void): void {
    if (this.#connecting) this.#onConnected.push(done)
    else queueMicrotask(() => done(this.#closed ? new Error('stream closed') : null))
  }

  /** The peer's address ('?' when unknown). */
  get remoteAddress (): string {
    return this.#peerOf()[0]
  }

  get remotePort (): number {
    return this.#peerOf()[1]
  }

  #peerOf (): [string, number] {
    if (this.#peer === undefined) this.#peer = this.#closed ? null : this.#h.peer(this.id)
    return this.#peer ?? ['?', 0]
  }

  listen (listener: ByteStreamListener): void {
    this.#listener = listener
    if (this.#listened) return
    this.#listened = true
    if (this.#held.length > 0 || this.#heldEnd) queueMicrotask(() => this.#release())
  }

  // ---- from the reactor's turn ----

  /** Bytes read: `slab[start, end)`. */
  read (slab: Buffer, start: number, end: number): void {
    if (this.#closed) return
    if (this.#paused || !this.#listened || this.#held.length > 0) {
      this.#held.push(slab.subarray(start, end))
      this.#heldBytes += end - start
      return
    }
    this.#listener.onRead(slab, start, end)
  }

  /** The peer's FIN. */
  ended (): void {
    if (this.#closed) return
    if (this.#paused || !this.#listened || this.#held.length > 0) this.#heldEnd = true
    else this.#listener.onEnd()
  }

  /** The connection failed (`errno`): reported, then closed. */
  failed (errno: number, syscall: string): void {
    if (this.#closed) return
    this.#listener.onError(errnoError(errno, syscall))
    this.close()
  }

  /** The connect ended (`errno` 0: connected): what was written meanwhile goes, then `whenConnected` hears. */
  connected (errno: number): void {
    if (!this.#connecting) return
    this.#connecting = false
    const waiting = this.#onConnected
    this.#onConnected = []
    const error = errno === 0 ? null : errnoError(errno, 'connect')
    for (const done of waiting) done(error)
    if (error !== null) {
      this.failed(errno, 'connect')
      return
    }
    if (this.#pendingBytes > 0 && this.#flush()) this.#callWritten()
  }

  /** The kernel takes bytes again. */
  writable (): void {
    if (this.#closed) return
    if (this.#endsAfterKernel) {
      this.#endsAfterKernel = false
      this.#ended()
      return
    }
    if (!this.#flush()) return
    this.#callWritten()
    if (this.#onEnded !== null) this.#shutdown()
    else this.#listener.onWritable()
  }

  // ---- ByteStream ----

  write (chunk: Buffer): boolean {
    if (this.#closed) return false
    this.#given += chunk.length
    // Before the connect, as node:net does: kept, and true.
    if (this.#connecting) return this.#keep(chunk, 0) || true
    if (this.#pendingBytes > 0) return this.#keep(chunk, 0)
    const n = this.#h.send(this.id, chunk)
    if (n < 0) return this.#sendFailed(n)
    this.#taken += n
    return n === chunk.length || this.#keep(chunk, n)
  }

  writeRange (buf: Buffer, start: number, end: number): boolean {
    if (this.#closed) return false
    const bytes = end - start
    this.#given += bytes
    if (this.#connecting) return this.#keep(buf.subarray(start, end), 0) || true
    if (this.#pendingBytes > 0) return this.#keep(buf.subarray(start, end), 0)
    // The addon copies what it takes (io_uring) or the kernel does (epoll): only a refused rest is kept, as a view.
    // Its numbers go through the shared sendArgs (no N-API number conversions
    // per send), and the Buffer only when it is not the one the addon holds.
    const h = this.#h
    const args = h.sendArgs
    args[0] = this.id
    args[1] = start
    args[2] = end
    if (buf === h.source) h.sendRange()
    else h.sendRange(buf)
    const n = args[3]!
    if (n < 0) return this.#sendFailed(n)
    this.#taken += n
    return n === bytes || this.#keep(buf.subarray(start, end), n)
  }

  writev (slices: readonly Buffer[], onWritten?: (error: Error | null | undefined) => void): boolean {
    if (this.#closed) {
      if (onWritten !== undefined) queueMicrotask(() => onWritten(new Error('stream closed')))
      return false
    }
    let total = 0
    for (let i = 0; i < slices.length; i++) total += slices[i]!.length
    this.#given += total
    if (onWritten !== undefined) this.#written.push({ at: this.#given, cb: onWritten })
    let n = 0
    if (this.#connecting) {
      for (const slice of slices) this.#keep(slice, 0)
      return true
    }
    if (this.#pendingBytes === 0) {
      n = slices.length === 1 ? this.#h.send(this.id, slices[0]!) : this.#h.sendv(this.id, slices)
      if (n < 0) return this.#sendFailed(n)
      this.#taken += n
    }
    if (n === total) {
      if (onWritten !== undefined) queueMicrotask(() => this.#callWritten())
      return true
    }
    for (let i = 0; i < slices.length; i++) {
      const slice = slices[i]!
      if (n >= slice.length) {
        n -= slice.length
        continue
      }
      this.#keep(slice, n)
      n = 0
    }
    return false
  }

  get writableLength (): number {
    return this.#pendingBytes
  }

  pauseReading (): void {
    if (this.#paused || this.#closed) return
    this.#paused = true
    this.#h.setReading(this.id, false)
  }

  resumeReading (): void {
    if (!this.#paused || this.#closed) return
    this.#paused = false
    this.#h.setReading(this.id, true)
    if (this.#held.length > 0 || this.#heldEnd) queueMicrotask(() => this.#release())
  }

  get bufferedReadBytes (): number {
    return this.#heldBytes
  }

  end (onEnded: () => void): void {
    if (this.#closed || this.#onEnded !== null) return
    this.#onEnded = onEnded
    if (this.#pendingBytes === 0) this.#shutdown()
  }

  close (): void {
    this.#close(false)
  }

  reset (): void {
    this.#close(true)
  }

  /** `close`, under node:net's name (what a server calls on a connection it refuses). */
  destroy (): void {
    this.#close(false)
  }

  get bytesWritten (): number {
    return this.#taken
  }

  get writeQueueBytes (): number {
    return this.#pendingBytes + (this.#closed ? 0 : this.#h.queued(this.id))
  }

  get secureProtocol (): string | null {
    return null
  }

  // ---- inside ----

  #close (reset: boolean): void {
    if (this.#closed) return
    this.#closed = true
    this.#h.close(this.id, reset)
    this.#host.forget(this.id)
    this.#pending = []
    this.#pendingBytes = 0
    this.#held = []
    this.#heldBytes = 0
    const written = this.#written
    this.#written = []
    const connecting = this.#onConnected
    this.#onConnected = []
    this.#connecting = false
    queueMicrotask(() => {
      for (const done of connecting) done(new Error('stream closed'))
      for (const w of written) w.cb(new Error('stream closed'))
      this.#listener.onClose()
    })
  }

  // Keeps `chunk[from..]` for when the kernel takes bytes again; false (wait for onWritable).
  #keep (chunk: Buffer, from: number): false {
    this.#pending.push(from === 0 ? chunk : chunk.subarray(from))
    this.#pendingBytes += chunk.length - from
    return false
  }

  // Writes what was kept; true when all of it went (false: the reactor says when the kernel takes more).
  #flush (): boolean {
    while (this.#pendingBytes > 0) {
      const pending = this.#pending
      // The addon takes at most MAX_IOV slices a call.
      const count = Math.min(pending.length, MAX_IOV)
      let offered = 0
      for (let i = 0; i < count; i++) offered += pending[i]!.length
      const n = count === 1 ? this.#h.send(this.id, pending[0]!) : this.#h.sendv(this.id, count === pending.length ? pending : pending.slice(0, count))
      if (n < 0) {
        this.#sendFailed(n)
        return false
      }
      this.#taken += n
      this.#pendingBytes -= n
      let left = n
      let i = 0
      while (i < pending.length && left >= pending[i]!.length) left -= pending[i++]!.length
      this.#pending = i === 0 ? pending : pending.slice(i)
      if (left > 0) this.#pending[0] = this.#pending[0]!.subarray(left)
      if (n < offered) return false
    }
    return true
  }

  #callWritten (): void {
    while (this.#written.length > 0 && this.#written[0]!.at <= this.#taken) this.#written.shift()!.cb(null)
  }

  #sendFailed (errno: number): false {
    queueMicrotask(() => this.failed(-errno, 'write'))
    return false
  }

  // FIN once the kernel took every byte; io_uring may still hold a send, then the reactor says when it went.
  #shutdown (): void {
    const status = this.#h.shutdown(this.id)
    if (status === 1) {
      this.#endsAfterKernel = true
      return
    }
    queueMicrotask(() => this.#ended())
  }

  #ended (): void {
    const onEnded = this.#onEnded
    if (onEnded !== null && !this.#closed) onEnded()
  }

  // Hands on the reads held while paused (or before the first listener), then the end they came before.
  #release (): void {
    while (this.#held.length > 0 && !this.#paused && !this.#closed) {
      const chunk = this.#held.shift()!
      this.#heldBytes -= chunk.length
      this.#listener.onRead(chunk, 0, chunk.length)
    }
    if (this.#held.length === 0 && this.#heldEnd && !this.#paused && !this.#closed) {
      this.#heldEnd = false
      this.#listener.onEnd()
    }
  }
}

/** The most slices one sendv takes (send.c; MAX_IOV in nyala.h). */
const MAX_IOV = 1024

function ignore (): void {}

const UNLISTENED: ByteStreamListener = { onRead: ignore, onWritable: ignore, onEnd: ignore, onError: ignore, onClose: ignore }
