import { createServer, connect, type Socket } from 'node:net'

/**
 * The baseline: a minimal node:net server and client framing `[u32 length][payload]`.
 * The server answers every frame of a read and writes all the answers of
 * that read with one write: the practical limit of the runtime.
 */
export function startRawEchoServer (port = 0, host = '127.0.0.1'): Promise<{ port: number, close: () => Promise<void> }> {
  const server = createServer({ noDelay: true }, (socket) => {
    let pending: Buffer | null = null
    socket.on('data', (chunk: Buffer) => {
      let data = pending === null ? chunk : Buffer.concat([pending, chunk])
      pending = null
      let offset = 0
      const out: Buffer[] = []
      while (data.length - offset >= 4) {
        const length = data.readUInt32BE(offset)
        if (data.length - offset < 4 + length) break
        out.push(data.subarray(offset, offset + 4 + length))
        offset += 4 + length
      }
      if (offset < data.length) pending = Buffer.from(data.subarray(offset))
      if (out.length === 1) socket.write(out[0]!)
      else if (out.length > 1) socket.write(Buffer.concat(out))
      data = Buffer.alloc(0)
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
