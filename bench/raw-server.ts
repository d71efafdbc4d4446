import { createServer } from 'node:net'
import { parseArgs } from 'node:util'

/**
 * The frame of the raw baselines (bench/raw-memcached.ts, bench/raw-redis.ts):
 * a node:net server that hands each read (joined with the incomplete rest
 * of the last one) to `take`, which pushes the answers of the whole
 * requests in it onto `out` and returns how many bytes they took; every
 * read's answers leave in one write. No limits, no framework.
 */
export function serveRaw (take: (data: Buffer, out: Buffer[]) => number, port: number, host = '127.0.0.1'): Promise<{ port: number, close: () => Promise<void> }> {
  const server = createServer({ noDelay: true }, (socket) => {
    let pending: Buffer | null = null
    socket.on('data', (chunk: Buffer) => {
      const data: Buffer = pending === null ? chunk : Buffer.concat([pending, chunk])
      const out: Buffer[] = []
      const at = take(data, out)
      pending = at < data.length ? data.subarray(at) : null
      if (out.length === 1) socket.write(out[0]!)
      else if (out.length > 1) socket.write(Buffer.concat(out))
    })
    socket.on('error', () => socket.destroy())
  })
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, () => {
      const address = server.address()
      resolve({
        port: typeof address === 'object' && address !== null ? address.port : 0,
        close: () => new Promise((done) => server.close(() => done()))
      })
    })
  })
}

/** Run as a script (`--port P`, default 0): prints `listening on 127.0.0.1:PORT`; SIGTERM/SIGINT close it. */
export async function serveRawFromCommandLine (start: (port: number) => Promise<{ port: number, close: () => Promise<void> }>): Promise<void> {
  const { values } = parseArgs({ options: { port: { type: 'string', default: '0' } }, strict: true })
  const started = await start(Number(values.port))
  process.stdout.write(`listening on 127.0.0.1:${started.port}\n`)
  const stop = (): void => { void started.close().then(() => process.exit(0)) }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
}
