/**
 * A cluster of reactors for test/krpc/cluster.test.ts, run as its own
 * process: `node [loader] cluster-server.ts --reactors N [--build-delay-ms D] [...]`. The reactor
 * processes re-run this script (serveReactors' default `exec`), build the
 * same server and listen. The primary prints, one line each:
 *   listening on HOST:PORT
 *   pids PRIMARY,REACTOR,...
 *   metrics on http://HOST:PORT/metrics
 * and closes every reactor gracefully on SIGTERM, then exits 0.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { parseArgs } from 'node:util'
import { consoleLogger } from '../../reactor/logger.js'
import { serveReactors } from '../../reactor/cluster.js'
import { Server } from '../../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'
import { ReactorService, reactorHandlers } from './reactor-service.js'

const { values } = parseArgs({
  options: {
    reactors: { type: 'string', default: '2' },
    'max-connection-age-ms': { type: 'string' },
    'restart-base-ms': { type: 'string', default: '50' },
    // Each reactor waits this long before building its server: a window in which a test can act between a fork and its listen.
    'build-delay-ms': { type: 'string', default: '0' },
    // round-robin or reusePort; default: what serveReactors picks for this Node.
    distribution: { type: 'string' }
  }
})

const reactors = await serveReactors({
  reactors: Number(values.reactors),
  host: '127.0.0.1',
  port: 0,
  graceMs: 10_000,
  restartBackoff: { baseMs: Number(values['restart-base-ms']), maxMs: 2000 },
  ...(values.distribution === 'round-robin' || values.distribution === 'reusePort' ? { distribution: values.distribution } : {}),
  ...(values['max-connection-age-ms'] === undefined ? {} : { maxConnectionAgeMs: Number(values['max-connection-age-ms']) }),
  logger: consoleLogger(true),
  build: async () => {
    await new Promise((resolve) => setTimeout(resolve, Number(values['build-delay-ms'])))
    return new Server({ logger: consoleLogger(true) })
      .addService(CalculatorService, calculatorHandlers)
      .addService(ReactorService, reactorHandlers)
  }
})

// Only the primary gets here.
const http = createServer((req, res) => {
  if (req.url === '/pids') {
    res.end(reactors.pids().join(','))
    return
  }
  reactors.metricsText().then((text) => res.end(text), (err: Error) => res.writeHead(500).end(err.message))
})
await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
process.stdout.write(`listening on ${reactors.address.host}:${reactors.address.port}\n`)
process.stdout.write(`pids ${reactors.pids().join(',')}\n`)
process.stdout.write(`metrics on http://127.0.0.1:${(http.address() as AddressInfo).port}/metrics\n`)
process.stdout.write(`distribution ${reactors.distribution}\n`)
process.once('SIGTERM', () => {
  http.close()
  reactors.close().then(() => { process.exitCode = 0 }, () => { process.exitCode = 1 })
})
