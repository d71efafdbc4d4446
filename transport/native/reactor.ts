import { lookup } from 'node:dns/promises'
import { isIP, type AddressInfo } from 'node:net'
import { errnoError } from './errno.js'
import { loadAddon, loadFailure, type NativeReactorHandle } from './load.js'
import { NativeStream, type StreamHost } from './native-stream.js'

/** The native backends (io.ts chooses among them and node:net). */
export type NativeBackend = 'io_uring' | 'epoll'

// Event kinds, as transport/native/nyala.h numbers them.
const EV_READ = 1
const EV_ACCEPT = 2
const EV_EOF = 3
const EV_ERROR = 4
const EV_WRITABLE = 5
const EV_CONNECTED = 6
const EV_ACCEPT_ERROR = 7
// A connection id's slot bits, as nyala.h's SLOT_BITS (18): the rest of the id is the slot's generation.
export const SLOT_MASK = (1 << 18) - 1

/** What a native listener tells its owner. */
export interface NativeAcceptor {
  /** A new connection (its reads wait until it is listened to). */
  onStream: (stream: NativeStream) => void
  /** accept() failed for want of descriptors ('EMFILE', 'ENFILE'): accepting resumes when a connection closes. */
  onAcceptError: (code: string) => void
}

/** A listening socket of a native reactor. */
export interface NativeListener {
  readonly address: AddressInfo
  close: () => void
}

const opened = new Map<NativeBackend, NativeReactor | string>()

/**
 * One native backend in this thread: the addon's reactor (one uv_poll_t
 * in Node's loop) and the streams and listeners on it. Each turn the addon
 * calls `#turn` once with every event of the turn: reads, accepts, ends,
 * errors, writability.
 */
export class NativeReactor implements StreamHost {
  readonly backend: NativeBackend
  readonly handle: NativeReactorHandle
  readonly #events: Int32Array
  /**
   * The open streams by slot: the low bits of an id (the addon's
   * connection table index); the rest is the slot's generation, checked
   * against the stream's id. A read's lookup is an index, not a Map's hash
   * probe (~100 instructions a read). The addon hands out slots round the
   * table, so this grows to the highest slot used so far: at most
   * SLOT_MASK + 1 entries (2 MiB of references), a closed stream's cleared.
   */
  readonly #streams: Array<NativeStream | undefined> = []
  readonly #acceptors = new Map<number, NativeAcceptor>()

  /** This thread's reactor of `backend`, opened once; a string says why it cannot be (not built, io_uring denied...). */
  static open (backend: NativeBackend): NativeReactor | string {
    let reactor = opened.get(backend)
    if (reactor === undefined) {
      reactor = NativeReactor.#open(backend)
      opened.set(backend, reactor)
    }
    return reactor
  }

  static #open (backend: NativeBackend): NativeReactor | string {
    const addon = loadAddon()
    if (addon === null) return loadFailure()
    let reactor: NativeReactor | null = null
    const handle = addon.open(backend, (n, slabs) => reactor!.#turn(n, slabs))
    if (typeof handle === 'number') return `${backend} cannot start here: ${errnoError(handle, 'open').code ?? handle}`
    reactor = new NativeReactor(backend, handle)
    return reactor
  }

  private constructor (backend: NativeBackend, handle: NativeReactorHandle) {
    this.backend = backend
    this.handle = handle
    this.#events = handle.events
  }

  forget (id: number): void {
    const slot = id & SLOT_MASK
    if (this.#streams[slot]?.id === id) this.#streams[slot] = undefined
  }

  // The open stream of `id`; undefined when it has closed (or its slot went to another).
  #stream (id: number): NativeStream | undefined {
    const stream = this.#streams[id & SLOT_MASK]
    return stream !== undefined && stream.id === id ? stream : undefined
  }

  #add (stream: NativeStream): void {
    const slot = stream.id & SLOT_MASK
    const streams = this.#streams
    // Filled up to the slot, so the array stays packed (no holes for V8 to probe past).
    while (streams.length < slot) streams.push(undefined)
    streams[slot] = stream
  }

  /** Listens on `host` (a name is resolved first); rejects with the errno error (EADDRINUSE, ...). */
  async listen (port: number, host: string, options: { backlog?: number, reusePort?: boolean }, acceptor: NativeAcceptor): Promise<NativeListener> {
    const address = isIP(host) !== 0 ? host : (await lookup(host)).address
    const bound = this.handle.listen(address, port, options.backlog ?? 511, options.reusePort === true)
    if (typeof bound === 'number') throw errnoError(bound, 'listen')
    const [index, boundPort] = bound
    this.#acceptors.set(index, acceptor)
    return {
      address: { address, family: isIP(address) === 6 ? 'IPv6' : 'IPv4', port: boundPort },
      close: () => {
        if (this.#acceptors.get(index) !== acceptor) return
        this.#acceptors.delete(index)
        this.handle.closeListener(index)
      }
    }
  }

  /** Connects to `host:port` (a name is resolved first); rejects with the errno error (ECONNREFUSED, ...). */
  async connect (port: number, host: string): Promise<NativeStream> {
    const address = isIP(host) !== 0 ? host : (await lookup(host)).address
    const stream = this.connectNow(port, address)
    return await new Promise<NativeStream>((resolve, reject) => {
      stream.whenConnected((error) => {
        if (error === null) resolve(stream)
        else reject(error)
      })
    })
  }

  /**
   * Starts connecting to `address` (an IP address) at once: the stream
   * takes writes now (they go once connected) and says through
   * `whenConnected` how the connect ended (a failed one closes it).
   * Throws the errno error when connect() fails at once.
   */
  connectNow (port: number, address: string, keepAliveMs = 0): NativeStream {
    const id = this.handle.connect(address, port, Math.ceil(keepAliveMs / 1000))
    if (id < 0) throw errnoError(id, 'connect')
    const stream = new NativeStream(this, id, true)
    this.#add(stream)
    return stream
  }

  // Every event of one turn, in order. An exception from a callback is thrown once the turn is handed out.
  #turn (n: number, slabs: Buffer[]): void {
    const events = this.#events
    let thrown: unknown = null
    for (let i = 0; i < 4 * n; i += 4) {
      const id = events[i]!
      const kind = events[i + 1]!
      try {
        if ((kind & 0xff) === EV_READ) this.#stream(id)?.read(slabs[kind >> 8]!, events[i + 2]!, events[i + 3]!)
        else this.#event(id, kind, events[i + 2]!)
      } catch (err) {
        thrown ??= err
      }
    }
    if (thrown !== null) throw thrown
  }

  #event (id: number, kind: number, value: number): void {
    switch (kind) {
      case EV_ACCEPT: {
        const acceptor = this.#acceptors.get(value)
        if (acceptor === undefined) {
          this.handle.close(id, false)
          return
        }
        const stream = new NativeStream(this, id)
        this.#add(stream)
        acceptor.onStream(stream)
        return
      }
      case EV_EOF:
        this.#stream(id)?.ended()
        return
      case EV_ERROR:
        this.#stream(id)?.failed(value, 'read')
        return
      case EV_WRITABLE:
        this.#stream(id)?.writable()
        return
      case EV_CONNECTED:
        this.#stream(id)?.connected(value)
        return
      case EV_ACCEPT_ERROR:
        this.#acceptors.get(id)?.onAcceptError(errnoError(value, 'accept').code ?? 'EMFILE')
    }
  }
}
