/**
 * The server process of one `nyala bench` run (forked by bench/rpc-bench.ts):
 *
 *   bench-server nyala|raw|grpc [--workers W] [--reactors R] [--busy-poll-us U]
 *                [--tls-cert FILE --tls-key FILE]
 *
 * - `nyala`: the demo CalculatorService (`Add`, `Echo`) as `nyala serve
 *   --workers W --reactors R` serves it: `serveReactors` (reactor/cluster.ts),
 *   in this process for R = 1, else in R node:cluster reactor processes
 *   supervised by this one. With `--tls-cert` and `--tls-key` (nyala-tls):
 *   KRPC's TLS inside negotiation, required and with `encryptLoopback`.
 * - `raw`: bench/raw-echo.ts's node:net echo server.
 * - `grpc`: the same calculator.proto served by @grpc/grpc-js (a
 *   devDependency), `Add` and `Echo`, unary.
 *
 * Each speaks `nyala serve`'s IPC contract (bench-ipc.ts): `nyala:listening`
 * once it accepts connections, `nyala:usage` answered with the resource
 * usage of every server process (the primary and each reactor). SIGTERM or
 * the end of the IPC channel stops it.
 */
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { serveReactors, type ProcessUsage } from '../reactor/cluster.js'
import { Server } from '../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'
import { startRawEchoServer } from './raw-echo.js'
import { loadGrpc } from './grpc-calculator.js'
import type { ListeningMessage, System, UsageAnswer, UsageRequest } from './bench-ipc.js'

const HOST = '127.0.0.1'

/** A started server: its address, the usage of all its processes, and a graceful close. */
interface Started {
  port: number
  usage: () => Promise<ProcessUsage[]>
  close: () => Promise<void>
}

const ownUsage = async (): Promise<ProcessUsage[]> => [{ pid: process.pid, usage: process.resourceUsage() }]

// `reactors` > 1: this script runs again in every reactor process, where
// `serveReactors` builds the server and never resolves.
async function startNyala (workers: number | undefined, reactors: number, busyPollUs: number, tls: { cert: Buffer, key: Buffer } | undefined): Promise<Started> {
  const options = {
    ...(workers === undefined ? {} : { workers }),
    ...(busyPollUs > 0 ? { busyPollUs } : {}),
    ...(tls === undefined ? {} : { tls, requireTls: true, encryptLoopback: true })
  }
  const served = await serveReactors({
    reactors,
    host: HOST,
    port: 0,
    build: () => new Server(options).addService(CalculatorService, calculatorHandlers)
  })
  return { port: served.address.port, usage: () => served.processUsage(), close: () => served.close() }
}

async function startRaw (): Promise<Started> {
  const started = await startRawEchoServer(0, HOST)
  return { port: started.port, usage: ownUsage, close: started.close }
}

async function startGrpc (): Promise<Started> {
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
  return { port, usage: ownUsage, close: () => new Promise((resolve) => server.tryShutdown(() => resolve())) }
}

async function main (): Promise<void> {
  const { values, positionals } = parseArgs({
    options: { workers: { type: 'string' }, reactors: { type: 'string', default: '1' }, 'busy-poll-us': { type: 'string', default: '0' }, 'tls-cert': { type: 'string' }, 'tls-key': { type: 'string' } },
    allowPositionals: true,
    strict: true
  })
  const system = positionals[0] as System
  const workers = values.workers === undefined ? undefined : Number(values.workers)
  const certFile = values['tls-cert']
  const keyFile = values['tls-key']
  const tls = certFile === undefined || keyFile === undefined ? undefined : { cert: readFileSync(certFile), key: readFileSync(keyFile) }
  const started = system === 'nyala' ? await startNyala(workers, Number(values.reactors), Number(values['busy-poll-us']), tls) : system === 'raw' ? await startRaw() : await startGrpc()
  let stopping = false
  const stop = (): void => {
    if (stopping) return
    stopping = true
    started.close().then(() => process.exit(0), () => process.exit(1))
    // Clients that linger must not keep a finished run waiting.
    setTimeout(() => process.exit(0), 5000).unref()
  }
  process.on('message', (message: UsageRequest) => {
    if (message.type !== 'nyala:usage') return
    started.usage().then((list) => {
      const answer: UsageAnswer = { type: 'nyala:usage', id: message.id, usage: list.map((u) => u.usage), pids: list.map((u) => u.pid) }
      process.send!(answer)
    }, (err: Error) => process.stderr.write(`bench server: usage: ${err.message}\n`))
  })
  process.once('SIGTERM', stop)
  process.once('disconnect', stop)
  const listening: ListeningMessage = { type: 'nyala:listening', host: HOST, port: started.port, pids: (await started.usage()).map((u) => u.pid) }
  process.send!(listening)
}

if (process.send !== undefined && process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: Error) => {
    process.stderr.write(`bench server: ${err.stack ?? err.message}\n`)
    process.exit(1)
  })
}
