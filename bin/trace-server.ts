/**
 * The server process `nyala trace` runs under strace (or perf trace): the
 * demo CalculatorService on a free loopback port, or the raw node:net echo
 * of bench/raw-echo.ts for comparison.
 *
 *   node bin/trace-server.js [--system nyala|nyala-direct|raw] [--max-message-bytes N]
 *
 * Prints `listening on HOST:PORT pid PID io BACKEND` once it accepts
 * connections (the pid is the node process's own, not the tracer's; the
 * transport the server's stats name). On SIGTERM it prints one
 * line `server-stats {JSON}` (server counters and per-connection transfer
 * queue counters, taken while the client is still connected), closes and
 * exits 0, so the tracer writes its summary.
 */
import { Server } from '../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'
import { startRawEchoServer } from '../bench/raw-echo.js'

export type TraceSystem = 'nyala' | 'nyala-direct' | 'raw'
export const TRACE_SYSTEMS: readonly TraceSystem[] = ['nyala', 'nyala-direct', 'raw']

async function main (argv: string[]): Promise<void> {
  const option = (name: string): string | undefined => {
    const at = argv.indexOf(name)
    return at >= 0 ? argv[at + 1] : undefined
  }
  const system = (option('--system') ?? 'nyala') as TraceSystem
  const maxMessageBytes = Number(option('--max-message-bytes') ?? 50 * 1024 * 1024)
  if (!TRACE_SYSTEMS.includes(system)) throw new Error(`unknown --system ${String(system)}; known: ${TRACE_SYSTEMS.join(', ')}`)
  let stats: () => unknown
  let close: () => Promise<void>
  let port: number
  let io: string
  if (system === 'raw') {
    io = 'node'
    const raw = await startRawEchoServer(0)
    port = raw.port
    stats = () => ({ system })
    // Its sockets have no close of their own: the exit closes them.
    close = async () => {}
  } else {
    // node:net unless NYALA_IO says otherwise: nyala trace sets it to each transport it traces (--io).
    const server = new Server({ scheduler: system === 'nyala-direct' ? 'direct' : 'pool', maxMessageBytes, io: 'node' }).addService(CalculatorService, calculatorHandlers)
    port = (await server.listen(0)).port
    io = server.stats().io
    stats = () => ({ system, server: server.stats(), connections: server.connectionStats() })
    close = () => server.close({ graceMs: 0 })
  }
  process.once('SIGTERM', () => {
    process.stdout.write(`server-stats ${JSON.stringify(stats())}\n`)
    close().then(() => process.exit(0), () => process.exit(1))
  })
  process.stdout.write(`listening on 127.0.0.1:${port} pid ${process.pid} io ${io}\n`)
}

await main(process.argv.slice(2))
