/**
 * A server for the descriptor-exhaustion test, run in a child process under
 * a low `ulimit -n`: `maxConnections` above the limit on purpose, scans every
 * 10 ms. Prints its port, then answers each line on stdin with its stats.
 */
import { createInterface } from 'node:readline'
import { Server } from '../../reactor/krpc/server.js'
import { consoleLogger } from '../../reactor/logger.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'

const server = new Server({ maxConnections: 10_000, maxNegotiatingConnections: 10_000, idleTimeoutMs: 40, logger: consoleLogger() })
  .addService(CalculatorService, calculatorHandlers)
const { port } = await server.listen(0)
process.stdout.write(`${port}\n`)
const lines = createInterface({ input: process.stdin })
lines.on('line', () => { process.stdout.write(`${JSON.stringify(server.stats())}\n`) })
lines.on('close', () => { void server.close({ graceMs: 0 }).then(() => process.exit(0)) })
