/**
 * A slow link, as netem would make one (the kernel here has none): a TCP
 * proxy in the host's namespace that forwards every byte to the server,
 * delaying each chunk towards the server by `--delay-ms` while delaying is
 * on. SIGUSR1 turns delaying on, SIGUSR2 off; order is kept either way.
 * A connection whose delayed bytes pass `--max-queued-bytes` (default
 * 64 MiB) is reset: the bound of the one queue here.
 *
 *   node dist/bench/resilience/delay-proxy.js --listen 10.0.0.2:7000 --target 127.0.0.1:7000 [--delay-ms 200]
 */
import { createServer, connect, type Socket } from 'node:net'
import { parseArgs } from 'node:util'

const { values } = parseArgs({ options: { listen: { type: 'string' }, target: { type: 'string' }, 'delay-ms': { type: 'string' }, 'max-queued-bytes': { type: 'string' } } })
function split (hostPort: string | undefined): { host: string, port: number } {
  const at = (hostPort ?? '').lastIndexOf(':')
  return { host: hostPort!.slice(0, at), port: Number(hostPort!.slice(at + 1)) }
}
const listen = split(values.listen)
const target = split(values.target)
const delayMs = Number(values['delay-ms'] ?? 200)
const maxQueued = Number(values['max-queued-bytes'] ?? 64 * 1024 * 1024)
let delaying = false
process.on('SIGUSR1', () => { delaying = true })
process.on('SIGUSR2', () => { delaying = false })

/** Chunks from `from` to `to`, each held until its time when delaying. */
function pipeDelayed (from: Socket, to: Socket): void {
  const queue: Array<{ at: number, chunk: Buffer }> = []
  let queued = 0
  let timer: NodeJS.Timeout | null = null
  const flush = (): void => {
    timer = null
    const now = performance.now()
    while (queue.length > 0 && queue[0]!.at <= now) {
      const { chunk } = queue.shift()!
      queued -= chunk.length
      to.write(chunk)
    }
    if (queue.length > 0) timer = setTimeout(flush, queue[0]!.at - now)
  }
  from.on('data', (chunk: Buffer) => {
    if (!delaying && queue.length === 0) {
      to.write(chunk)
      return
    }
    queue.push({ at: performance.now() + (delaying ? delayMs : 0), chunk })
    queued += chunk.length
    if (queued > maxQueued) {
      from.resetAndDestroy()
      to.resetAndDestroy()
      return
    }
    if (timer === null) timer = setTimeout(flush, Math.max(0, queue[0]!.at - performance.now()))
  })
  from.on('close', () => {
    if (timer !== null) clearTimeout(timer)
    to.destroy()
  })
}

const server = createServer({ pauseOnConnect: true }, (client) => {
  const upstream = connect({ host: target.host, port: target.port, noDelay: true })
  client.setNoDelay(true)
  client.on('error', () => {})
  upstream.on('error', () => {})
  upstream.once('connect', () => {
    pipeDelayed(client, upstream)
    upstream.pipe(client)
    upstream.on('close', () => client.destroy())
    client.resume()
  })
  // The server is gone: the client sees what a closed port sends.
  upstream.once('error', () => client.resetAndDestroy())
})
server.listen(listen.port, listen.host, () => console.log(`listening on ${listen.host}:${listen.port}`))
process.once('SIGTERM', () => process.exit(0))
process.once('SIGINT', () => process.exit(0))
