// Where a server's connections come from: a node:net server, or a listener
// of the native transport (epoll, io_uring), chosen by the `io` option when
// the server listens. The server gets node:net sockets (`onSocket`, TLS
// included) or native streams (`onStream`); either way it builds the same
// framed connection over a ByteStream.
import cluster from 'node:cluster'
import { createServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net'
import { resolveIo, type IoBackend, type IoOption } from '../transport/io.js'
import type { NativeListener } from '../transport/native/reactor.js'
import type { NativeStream } from '../transport/native/native-stream.js'
import { ListenError } from './listen-error.js'
import type { Logger } from './logger.js'

/** What the listener tells the server. */
export interface ListenerHost {
  onSocket: (socket: Socket) => void
  onStream: (stream: NativeStream) => void
  /** accept() failed for want of descriptors. */
  outOfDescriptors: (code: string) => void
  /** A listener error once listening (not EMFILE/ENFILE). */
  listenerError: (err: NodeJS.ErrnoException) => void
}

export class ServerListener {
  readonly #host: ListenerHost
  readonly #io: IoOption | undefined
  readonly #tls: boolean
  readonly #log: Required<Logger>
  readonly #name: string
  readonly #net: NetServer
  #native: NativeListener | null = null
  #backend: IoBackend = 'node'

  /** `tls`: connections use node:tls, or a set-up may upgrade to it (the native transport carries plain TCP only, and an upgrade needs a node:net socket). */
  constructor (host: ListenerHost, options: { io: IoOption | undefined, tls: boolean, log: Required<Logger>, name: string }) {
    this.#host = host
    this.#io = options.io
    this.#tls = options.tls
    this.#log = options.log
    this.#name = options.name
    // Paused on accept: nothing is read before the server moves the socket
    // to a SocketReader (see readThrough).
    this.#net = createServer({ noDelay: true, pauseOnConnect: true }, (socket) => host.onSocket(socket))
    this.#net.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EMFILE' || err.code === 'ENFILE') {
        host.outOfDescriptors(err.code)
        return
      }
      // Before listening, listen() reports the error to its caller instead.
      if (this.#net.listening) host.listenerError(err)
    })
  }

  /** The transport in use ('node' until listening on a native one). */
  get backend (): IoBackend {
    return this.#backend
  }

  get listening (): boolean {
    return this.#native !== null || this.#net.listening
  }

  address (): AddressInfo | null {
    return this.#native?.address ?? this.#net.address() as AddressInfo | null
  }

  /** Listens on the transport `io` names; rejects with a ListenError, or an Error when an explicit native `io` cannot start. */
  listen (port: number, host: string, reusePort: boolean): Promise<AddressInfo> {
    let chosen
    try {
      chosen = this.#chooseIo(reusePort)
    } catch (err) {
      return Promise.reject(err)
    }
    const { reactor, backend, fallback } = chosen
    const where = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`
    // One line names the transport; a warning when `auto` could not have the native one it prefers.
    const fellBack = fallback !== null && !this.#tls && !cluster.isWorker
    const line = `${this.#name} server on ${where}: io ${backend}${fallback === null ? '' : ` (${fallback})`}`
    if (fellBack) this.#log.warn(line, { protocol: this.#name, io: backend })
    else this.#log.info(line, { protocol: this.#name, io: backend })
    if (reactor === null) return this.#listenNet(port, host, reusePort)
    const acceptor = { onStream: this.#host.onStream, onAcceptError: this.#host.outOfDescriptors }
    return reactor.listen(port, host, { backlog: 512, reusePort }, acceptor).then((listener) => {
      this.#native = listener
      this.#backend = backend
      return listener.address
    }, (err: NodeJS.ErrnoException) => {
      throw new ListenError(err, host, port)
    })
  }

  #chooseIo (reusePort: boolean): ReturnType<typeof resolveIo> {
    // A cluster worker without SO_REUSEPORT listens through the primary's handle (node:cluster's round-robin): node:net only.
    if (cluster.isWorker && !reusePort) {
      if (this.#io === 'epoll' || this.#io === 'io_uring') throw new Error(`io '${this.#io}' needs a listener of its own: with several reactors, the reusePort distribution (Node >= 22.12)`)
      return { backend: 'node', reactor: null, fallback: 'a reactor without reusePort shares the primary\'s listener' }
    }
    if (!this.#tls) return resolveIo(this.#io)
    // NYALA_IO chooses for plain TCP only: TLS (from the first byte, or by a set-up's upgrade) stays on node:tls; only a server that asks for a native `io` with `tls` is refused.
    const io = this.#io
    if (io === 'epoll' || io === 'io_uring') throw new Error(`io '${io}' cannot carry TLS: a server with \`tls\` uses node:tls (io 'auto' or 'node')`)
    return { backend: 'node', reactor: null, fallback: 'TLS uses node:tls' }
  }

  #listenNet (port: number, host: string, reusePort: boolean): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      const onListening = (): void => {
        this.#net.off('error', onError)
        this.#backend = 'node'
        resolve(this.#net.address() as AddressInfo)
      }
      const onError = (err: NodeJS.ErrnoException): void => {
        // The failed listen's callback goes too (a later listen would run it).
        this.#net.off('listening', onListening)
        // Not logged: the caller gets it, and decides.
        reject(new ListenError(err, host, port))
      }
      this.#net.once('error', onError)
      // `reusePort` is not in Node 20's types; `exclusive` keeps a cluster worker from sharing the primary's handle.
      const listenOptions = reusePort ? { port, host, backlog: 512, reusePort: true, exclusive: true } : { port, host, backlog: 512 }
      try {
        this.#net.listen(listenOptions, onListening)
      } catch (err) {
        // Thrown at once for options node:net refuses (a bad host type, a listen already under way).
        this.#net.off('error', onError)
        this.#net.off('listening', onListening)
        reject(err)
      }
    })
  }

  /** Stops accepting; `done` once the listener is closed (and, on node:net, every connection it accepted). */
  close (done: () => void): void {
    if (this.#native !== null) {
      this.#native.close()
      this.#native = null
      // node:net's close waits for its connections; the server waits for its own anyway.
      queueMicrotask(done)
      return
    }
    this.#net.close(() => done())
  }
}
