import { createServer, connect, type Socket } from 'node:net'

/**
 * The baseline: a minimal node:net server and client framing `[u32 length][payload]`.
 * The server answers every frame of a read and writes all the answers of
 * that read with one write: the practical limit of the runtime.
 */
export function startRawEchoServer (port = 0, host = '127.0.0.1'): Promise<{ port: number, close: () => Promise<void> }> {
  const server = createServer({ noDelay: true }, (socket) => {
    // A partial frame's chunks wait here and are joined once, when the frame
    // is whole (a multi-MiB frame arrives in 64 KiB reads).
    const reader = new FrameChunks()
    socket.on('data', (chunk: Buffer) => {
      const data = reader.take(chunk)
      if (data === null) return
      let offset = 0
      const out: Buffer[] = []
      while (data.length - offset >= 4) {
        const length = data.readUInt32BE(offset)
        if (data.length - offset < 4 + length) break
        out.push(data.subarray(offset, offset + 4 + length))
        offset += 4 + length
      }
      reader.keep(data, offset)
      if (out.length === 1) socket.write(out[0]!)
      else if (out.length > 1) socket.write(Buffer.concat(out))
    })
    socket.on('error', () => socket.destroy())
  })
  return new Promise((resolve) => {
    server.listen(port, host, () => {
      const address = server.address()
      resolve({
        port: typeof address === 'object' && address !== null ? address.port : 0,
        close: () => new Promise((done) => server.close(() => done()))
      })
    })
  })
}

/** Chunks of a `[u32 length][payload]` stream, joined only when the first frame is whole. */
class FrameChunks {
  #chunks: Buffer[] = []
  #bytes = 0

  /** The bytes to parse now (leftover plus `chunk`), or null while the first frame is incomplete. */
  take (chunk: Buffer): Buffer | null {
    if (this.#bytes === 0) return chunk
    this.#chunks.push(chunk)
    this.#bytes += chunk.length
    if (this.#bytes < 4) return null
    const first = this.#chunks[0]!
    const length = first.length >= 4 ? first.readUInt32BE(0) : Buffer.concat(this.#chunks, this.#bytes).readUInt32BE(0)
    if (this.#bytes < 4 + length) return null
    const data = Buffer.concat(this.#chunks, this.#bytes)
    this.#chunks = []
    this.#bytes = 0
    return data
  }

  /** Keeps `data` from `offset` on (an incomplete frame) for the next `take`. */
  keep (data: Buffer, offset: number): void {
    if (offset >= data.length) return
    this.#chunks = [data.subarray(offset)]
    this.#bytes = data.length - offset
  }
}

/**
 * A raw client that keeps `depth` requests of `payloadBytes` outstanding and
 * resolves with the calls completed by `endAt`. It does the least an RPC
 * client must: it parses every answer frame by its length prefix (frames may
 * span reads), completes one call per frame, and writes the calls issued in
 * one turn with one write (at `process.nextTick`), the first one at once.
 */
export function runRawClient (port: number, depth: number, payloadBytes: number, endAt: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket: Socket = connect({ port, host: '127.0.0.1', noDelay: true })
    const frame = Buffer.alloc(4 + payloadBytes, 1)
    frame.writeUInt32BE(payloadBytes, 0)
    let completed = 0
    let stopping = false
    let outstanding = 0
    let pending: Buffer | null = null
    let batched = 0
    let flushScheduled = false
    const flush = (): void => {
      flushScheduled = false
      if (batched === 1) socket.write(frame)
      else if (batched > 1) socket.write(Buffer.concat(new Array<Buffer>(batched).fill(frame)))
      batched = 0
    }
    const send = (): void => {
      outstanding++
      if (!flushScheduled) {
        socket.write(frame)
        flushScheduled = true
        process.nextTick(flush)
      } else {
        batched++
      }
    }
    const complete = (payload: Buffer): void => {
      if (payload.length !== payloadBytes) throw new Error('short answer')
      completed++
      outstanding--
      if (!stopping && performance.now() >= endAt) stopping = true
      if (!stopping) send()
      else if (outstanding === 0) {
        socket.destroy()
        resolve(completed)
      }
    }
    socket.on('connect', () => { for (let i = 0; i < depth; i++) send() })
    socket.on('data', (chunk: Buffer) => {
      const data = pending === null ? chunk : Buffer.concat([pending, chunk])
      pending = null
      let offset = 0
      while (data.length - offset >= 4) {
        const length = data.readUInt32BE(offset)
        if (data.length - offset < 4 + length) break
        complete(data.subarray(offset + 4, offset + 4 + length))
        offset += 4 + length
      }
      if (offset < data.length) pending = Buffer.from(data.subarray(offset))
    })
    socket.on('error', reject)
  })
}

/**
 * A raw client on one long-lived connection, for counting syscalls: connect,
 * then runs of exactly `calls` echoes of `payloadBytes` with `depth`
 * outstanding. Calls issued in one turn go out as `runRawClient`'s do: the
 * first at once, the rest in one write at `process.nextTick`.
 */
export class RawEchoClient {
  readonly #socket: Socket
  readonly #reader = new FrameChunks()
  #bytesRead = 0
  #onAnswer: ((payloadBytes: number) => void) | null = null
  #batch: Buffer[] = []
  #flushScheduled = false
  readonly #flush = (): void => {
    this.#flushScheduled = false
    const batch = this.#batch
    this.#batch = []
    if (batch.length === 1) this.#socket.write(batch[0]!)
    else if (batch.length > 1) this.#socket.write(Buffer.concat(batch))
  }

  private constructor (socket: Socket) {
    this.#socket = socket
    socket.on('data', (chunk: Buffer) => {
      this.#bytesRead += chunk.length
      const data = this.#reader.take(chunk)
      if (data === null) return
      let offset = 0
      while (data.length - offset >= 4) {
        const length = data.readUInt32BE(offset)
        if (data.length - offset < 4 + length) break
        offset += 4 + length
        this.#onAnswer?.(length)
      }
      this.#reader.keep(data, offset)
    })
    socket.on('error', () => socket.destroy())
  }

  static connect (port: number, host = '127.0.0.1'): Promise<RawEchoClient> {
    return new Promise((resolve, reject) => {
      const socket = connect({ port, host, noDelay: true })
      socket.once('error', reject)
      socket.once('connect', () => {
        socket.off('error', reject)
        resolve(new RawEchoClient(socket))
      })
    })
  }

  /** Bytes received so far (every byte the server wrote to this connection). */
  get bytesRead (): number {
    return this.#bytesRead
  }

  /** Runs `calls` echoes of `payloadBytes` with `depth` outstanding; resolves when all are answered. */
  run (calls: number, depth: number, payloadBytes: number): Promise<void> {
    if (calls <= 0) return Promise.resolve()
    const frame = Buffer.alloc(4 + payloadBytes, 1)
    frame.writeUInt32BE(payloadBytes, 0)
    return new Promise((resolve, reject) => {
      let issued = 0
      let answered = 0
      const send = (): void => {
        issued++
        if (this.#flushScheduled) {
          this.#batch.push(frame)
          return
        }
        this.#socket.write(frame)
        this.#flushScheduled = true
        process.nextTick(this.#flush)
      }
      this.#onAnswer = (length) => {
        if (length !== payloadBytes) {
          reject(new Error(`answer of ${length} bytes, expected ${payloadBytes}`))
          return
        }
        answered++
        if (issued < calls) send()
        else if (answered === calls) {
          this.#onAnswer = null
          resolve()
        }
      }
      this.#socket.once('close', () => { if (answered < calls) reject(new Error('connection closed')) })
      for (let i = 0; i < Math.min(depth, calls); i++) send()
    })
  }

  close (): void {
    this.#socket.destroy()
  }
}
