/**
 * The server process of one `nyala bench` run (forked by bench/rpc-bench.ts):
 *
 *   bench-server nyala|raw|grpc [--workers W] [--reactors R]
 *
 * - `nyala`: the demo CalculatorService (`Add`, `Echo`) as `nyala serve
 *   --workers W` serves it, in one process.
 * - `raw`: bench/raw-echo.ts's node:net echo server.
 * - `grpc`: the same calculator.proto served by @grpc/grpc-js (a
 *   devDependency), `Add` and `Echo`, unary.
 *
 * Each speaks `nyala serve`'s IPC contract (bench-ipc.ts): `nyala:listening`
 * once it accepts connections, `nyala:usage` answered with this process's
 * resource usage. SIGTERM or the end of the IPC channel stops it.
 */
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Server } from '../reactor/server.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator.js'
import { startRawEchoServer } from './raw-echo.js'
import { loadGrpc } from './grpc-calculator.js'
import type { ListeningMessage, System, UsageAnswer, UsageRequest } from './bench-ipc.js'

const HOST = '127.0.0.1'

async function startNyala (workers: number | undefined): Promise<{ port: number, close: () => Promise<void> }> {
  const server = new Server(workers === undefined ? {} : { workers }).addService(CalculatorService, calculatorHandlers)
  const address = await server.listen(0, HOST)
  return { port: address.port, close: () => server.close() }
}

async function startGrpc (): Promise<{ port: number, close: () => Promise<void> }> {
  const { grpc, service } = await loadGrpc()
  const server = new grpc.Server()
  server.addService(service, {
    Add: (call: { request: { x: number, y: number } }, callback: (error: null, response: { result: number }) => void) => {
      callback(null, { result: (call.request.x + call.request.y) >>> 0 })
    },
    Echo: (call: { request: { data: string } }, callback: (error: null, response: { data: string }) => void) => {
      callback(null, { data: call.request.data })
    }
  })
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync(`${HOST}:0`, grpc.ServerCredentials.createInsecure(), (error, bound) => error === null ? resolve(bound) : reject(error))
  })
  return { port, close: () => new Promise((resolve) => server.tryShutdown(() => resolve())) }
}

async function main (): Promise<void> {
  const { values, positionals } = parseArgs({ options: { workers: { type: 'string' }, reactors: { type: 'string', default: '1' } }, allowPositionals: true, strict: true })
  const system = positionals[0] as System
  const workers = values.workers === undefined ? undefined : Number(values.workers)
  if (Number(values.reactors) !== 1) throw new Error('--server-reactors above 1 needs reactor/cluster.ts')
  const started = system === 'nyala' ? await startNyala(workers) : system === 'raw' ? await startRawEchoServer(0, HOST) : await startGrpc()
  let stopping = false
  const stop = (): void => {
    if (stopping) return
    stopping = true
    started.close().then(() => process.exit(0), () => process.exit(1))
    // Clients that linger must not keep a finished run waiting.
    setTimeout(() => process.exit(0), 2000).unref()
  }
  process.on('message', (message: UsageRequest) => {
    if (message.type !== 'nyala:usage') return
    const answer: UsageAnswer = { type: 'nyala:usage', id: message.id, usage: [process.resourceUsage()], pids: [process.pid] }
    process.send!(answer)
  })
  process.once('SIGTERM', stop)
  process.once('disconnect', stop)
  const listening: ListeningMessage = { type: 'nyala:listening', host: HOST, port: started.port, pids: [process.pid] }
  process.send!(listening)
}

if (process.send !== undefined && process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: Error) => {
    process.stderr.write(`bench server: ${err.stack ?? err.message}\n`)
    process.exit(1)
  })
}
