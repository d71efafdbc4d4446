/**
 * Start-up errors in the library: `Server.listen` and `serveReactors`
 * reject with a clear error (a ListenError with the errno code and the
 * address, or RPC_ERR_INVALID_ARGUMENT for a bad port) and leave nothing
 * behind. The CLI's side is test/bin/serve-errors.test.ts.
 */
import t, { type Test } from 'tap'
import { Server as NetServerClass, createServer, type AddressInfo, type Server as NetServer } from 'node:net'
import { RpcError } from '../../codec/errors.js'
import { serveReactors } from '../../reactor/cluster.js'
import { Server } from '../../reactor/krpc/server.js'
import { ListenError } from '../../reactor/server.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'

async function occupied (t: Test): Promise<number> {
  const taken: NetServer = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { taken.close() })
  return (taken.address() as AddressInfo).port
}

t.test('Server.listen on a busy port rejects with a ListenError; the server can listen elsewhere after', async (t) => {
  const port = await occupied(t)
  const server = new Server({ logger: null }).addService(CalculatorService, calculatorHandlers)
  t.teardown(() => server.close({ graceMs: 0 }))
  const err = await server.listen(port, '127.0.0.1').then(() => null, (e: unknown) => e)
  t.ok(err instanceof ListenError, 'a ListenError')
  t.match(err, { code: 'EADDRINUSE', host: '127.0.0.1', port, message: `cannot listen on 127.0.0.1:${port}: address already in use (EADDRINUSE)` })
  t.equal(server.address(), null, 'not listening')
  const bound = await server.listen(0, '127.0.0.1')
  t.ok(bound.port > 0, 'listens on another port afterwards')
})

t.test('a failed listen leaves no listener behind: neither its \'error\' nor its \'listening\' callback', async (t) => {
  const port = await occupied(t)
  // The server's node:net server, caught as it listens.
  const nets: NetServer[] = []
  const listen = NetServerClass.prototype.listen
  NetServerClass.prototype.listen = function (this: NetServer, ...args: unknown[]) {
    nets.push(this)
    return (listen as (...a: unknown[]) => NetServer).apply(this, args)
  } as typeof listen
  t.teardown(() => { NetServerClass.prototype.listen = listen })
  // node:net's own listener is what this test watches (the native transport's listener holds no callbacks):
  // io 'node', and NYALA_IO (which overrides the option, .ci/run's native passes set it) unset while it listens.
  const savedIo = process.env.NYALA_IO
  delete process.env.NYALA_IO
  t.teardown(() => { if (savedIo !== undefined) process.env.NYALA_IO = savedIo })
  const server = new Server({ logger: null, io: 'node' }).addService(CalculatorService, calculatorHandlers)
  t.teardown(() => server.close({ graceMs: 0 }))
  for (let i = 0; i < 3; i++) {
    const err = await server.listen(port, '127.0.0.1').then(() => null, (e: unknown) => e)
    t.ok(err instanceof ListenError, `attempt ${i + 1} fails`)
  }
  NetServerClass.prototype.listen = listen
  const net = nets[0]!
  t.ok(nets.length === 3 && nets.every((n) => n === net), 'one node:net server, three listens')
  t.equal(net.listenerCount('listening'), 0, 'no \'listening\' callback left by the failed listens')
  const errorListeners = net.listenerCount('error')
  await server.listen(0, '127.0.0.1')
  t.equal(net.listenerCount('listening'), 0)
  t.equal(net.listenerCount('error'), errorListeners, 'the server\'s own \'error\' listener only')
})

t.test('Server.listen and serveReactors refuse a port outside 0-65535 before binding anything', async (t) => {
  const server = new Server({ logger: null })
  t.teardown(() => server.close({ graceMs: 0 }))
  await t.rejects(server.listen(99999, '127.0.0.1'), { code: 'RPC_ERR_INVALID_ARGUMENT', message: 'port must be an integer 0-65535, got 99999' })
  let built = 0
  const reactors = serveReactors({ reactors: 2, host: '127.0.0.1', port: 70000, build: () => { built++; return new Server({ logger: null }) } })
  const err = await reactors.then(() => null, (e: unknown) => e)
  t.ok(err instanceof RpcError, 'an RpcError')
  t.match(err, { code: 'RPC_ERR_INVALID_ARGUMENT', message: /got 70000/ })
  t.equal(built, 0, 'nothing built, nothing forked')
})

t.test('serveReactors in one process: a busy port rejects with the ListenError and the built server is closed', async (t) => {
  const port = await occupied(t)
  let closed = 0
  class Counted extends Server {
    override close (options?: { graceMs?: number }): Promise<void> {
      closed++
      return super.close(options)
    }
  }
  const err = await serveReactors({
    reactors: 1,
    host: '127.0.0.1',
    port,
    logger: null,
    build: () => new Counted({ logger: null }).addService(CalculatorService, calculatorHandlers)
  }).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ListenError)
  t.match(err, { code: 'EADDRINUSE', port })
  t.equal(closed, 1, 'the server it built was closed')
})
