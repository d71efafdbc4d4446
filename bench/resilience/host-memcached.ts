/**
 * One memcached host of the resilience suite: the memcached example's
 * store, protocol and handlers, with two keys of the suite's scheme.
 * `whoami` holds the host's name (set at start), so that a GET tells the
 * load generator who served it; an INCREMENT of a key `once:ID` (the
 * suite's non-idempotent call) appends ID to the execution log before it
 * answers, so that the count survives `kill -9`.
 *
 *   node dist/bench/resilience/host-memcached.js --name h1 --host 10.0.0.2 --port 7000 --log FILE
 */
import { parseArgs } from 'node:util'
import { ProtocolServer } from '../../reactor/server.js'
import { silentLogger } from '../../reactor/logger.js'
import { memcachedHandlers } from '../../examples/memcached/handlers.js'
import { memcachedProtocol } from '../../examples/memcached/protocol.js'
import { MemcachedStore } from '../../examples/memcached/store.js'
import { ExecutionLog } from './execution-log.js'

const { values } = parseArgs({ options: { name: { type: 'string' }, host: { type: 'string' }, port: { type: 'string' }, log: { type: 'string' } } })
const name = values.name ?? 'host'
const log = new ExecutionLog(values.log ?? '/dev/null')
const store = new MemcachedStore()
store.store('set', 'whoami', Buffer.from(name), 0, 0, 0)
const server = new ProtocolServer(memcachedProtocol({ maxItemBytes: store.maxItemBytes }), { requestTimeoutMs: 1000, idleTimeoutMs: 0, logger: silentLogger })
const handlers = memcachedHandlers(store)
const increment = handlers.INCREMENT
server.addRoutes('memcached', {
  ...handlers,
  INCREMENT: (request, ctx) => {
    const key = request.key.toString('latin1')
    if (key.startsWith('once:')) log.executed(key.slice(5))
    return increment(request, ctx)
  }
})
const address = await server.listen(Number(values.port ?? 0), values.host ?? '127.0.0.1')
console.log(`listening on ${address.address}:${address.port}`)
const close = (): void => { server.close({ graceMs: 1000 }).then(() => process.exit(0), () => process.exit(1)) }
process.once('SIGTERM', close)
process.once('SIGINT', close)
