/**
 * Two reactors sharing one scheduler, for test/krpc/shared-scheduler.test.ts,
 * run as its own process: `node [loader] shared-scheduler-server.ts`. Each
 * reactor has 1 worker and a queue of 1 (2 and 2 shared), round-robin
 * distribution so a test can put connections on both. The primary prints
 *   listening on HOST:PORT
 *   metrics on http://HOST:PORT/metrics
 * and closes the reactors on SIGTERM.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { serveReactors } from '../../reactor/cluster.js'
import { Server } from '../../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'
import { ReactorService, reactorHandlers } from './reactor-service.js'

const reactors = await serveReactors({
  reactors: 2,
  host: '127.0.0.1',
  port: 0,
  graceMs: 1000,
  distribution: 'round-robin',
  restartBackoff: { baseMs: 50, maxMs: 1000 },
  logger: null,
  build: () => new Server({ workers: 1, queueLength: 1 })
    .addService(CalculatorService, calculatorHandlers)
    .addService(ReactorService, reactorHandlers)
})

const http = createServer((req, res) => {
  reactors.metricsText().then((text) => res.end(text), (err: Error) => res.writeHead(500).end(err.message))
})
await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
process.stdout.write(`listening on ${reactors.address.host}:${reactors.address.port}\n`)
process.stdout.write(`metrics on http://127.0.0.1:${(http.address() as AddressInfo).port}/metrics\n`)
process.once('SIGTERM', () => {
  http.close()
  reactors.close().then(() => { process.exitCode = 0 }, () => { process.exitCode = 1 })
})
