/**
 * One KRPC host of the resilience suite: the demo calculator service, with
 * Echo answering the host's name so that the load generator knows who
 * served each call, and counting every execution of a request whose data
 * starts `once:` (a non-idempotent call) by appending its id to a log file,
 * synchronously before answering, so that the count survives `kill -9`.
 *
 *   node dist/bench/resilience/host-krpc.js --name h1 --host 10.0.0.2 --port 7000 --log FILE
 */
import { parseArgs } from 'node:util'
import { Server } from '../../reactor/krpc/server.js'
import { silentLogger } from '../../reactor/logger.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'
import { ExecutionLog } from './execution-log.js'

const { values } = parseArgs({ options: { name: { type: 'string' }, host: { type: 'string' }, port: { type: 'string' }, log: { type: 'string' } } })
const name = values.name ?? 'host'
const log = new ExecutionLog(values.log ?? '/dev/null')
const server = new Server({ logger: silentLogger, idleTimeoutMs: 0 })
server.addService(CalculatorService, {
  ...calculatorHandlers,
  Echo: (request) => {
    if (request.data.startsWith('once:')) log.executed(request.data.slice(5))
    return { data: name }
  }
})
const address = await server.listen(Number(values.port ?? 0), values.host ?? '127.0.0.1')
console.log(`listening on ${address.address}:${address.port}`)
const close = (): void => { server.close({ graceMs: 1000 }).then(() => process.exit(0), () => process.exit(1)) }
process.once('SIGTERM', close)
process.once('SIGINT', close)
