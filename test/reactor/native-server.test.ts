/**
 * The server and the client on the native transport (epoll and io_uring):
 * `io` picks it and `stats().io` says so; a line protocol served and called
 * through it (ProtocolClient's connections go through the reactor too); a
 * connection limit and an oversized frame meet the same outcomes as on
 * node:net; a refused connect is retried, then fails naming ECONNREFUSED; a bad
 * NYALA_IO, and a native io with `tls`, are start-up errors. Skipped, with
 * the reason, where the addon is not built.
 */
import t from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { RpcError } from '../../codec/errors.js'
import { lines } from '../../codec/framings.js'
import { simpleClientProtocol, simpleProtocol } from '../../codec/simple-protocol.js'
import { ProtocolServer, type ServerOptions } from '../../reactor/server.js'
import { ProtocolClient } from '../../reactor/protocol-client.js'
import { resolveIo } from '../../transport/io.js'
import { nativeBackends } from '../helpers/native.js'

const text = simpleProtocol<string, string>({
  name: 'text',
  framing: lines({ max: 64 }),
  service: 'text',
  decode (line) {
    const s = line.toString('utf8')
    const space = s.indexOf(' ')
    return { route: (space < 0 ? s : s.slice(0, space)).toUpperCase(), request: space < 0 ? '' : s.slice(space + 1) }
  },
  encode: (_call, answer) => Buffer.from(answer),
  refusal: (_call, reason, message) => Buffer.from(`-ERR ${reason}: ${message}`)
})

const textClient = simpleClientProtocol<string, string>({
  name: 'text',
  framing: lines({ max: 256 }),
  matching: 'in-order',
  encode: (request) => Buffer.from(request),
  decode: (_request, payload) => payload.toString(),
  retryable: () => false
})

async function serve (options: ServerOptions): Promise<{ server: ProtocolServer, port: number }> {
  const server = new ProtocolServer(text, options)
  server.addRoutes('text', { UPPER: (s: string) => s.toUpperCase(), ECHO: (s: string) => s })
  server.markReady()
  const { port } = await server.listen(0)
  return { server, port }
}

t.test('io node: stats says node', async (t) => {
  const { server } = await serve({ io: 'node' })
  t.equal(server.stats().io, process.env.NYALA_IO === undefined || process.env.NYALA_IO === '' ? 'node' : process.env.NYALA_IO)
  await server.close({ graceMs: 0 })
})

t.test('NYALA_IO with a value that is not a backend is refused', async (t) => {
  t.throws(() => resolveIo('auto', 'fast'), /NYALA_IO must be auto, io_uring, epoll or node/)
  t.equal(resolveIo('epoll', 'node').backend, 'node', 'NYALA_IO overrides the option')
})

t.test('a native io with tls is a start-up error', async (t) => {
  const server = new ProtocolServer(text, { io: 'epoll', tls: {} })
  await t.rejects(server.listen(0), /cannot carry TLS/)
  await server.close({ graceMs: 0 })
})

for (const { backend, skip } of nativeBackends()) {
  t.test(`${backend}: server and client`, { skip }, async (t) => {
    t.test('served and called through the native transport; stats says so', async (t) => {
      const { server, port } = await serve({ io: backend })
      t.equal(server.stats().io, process.env.NYALA_IO === undefined || process.env.NYALA_IO === '' ? backend : process.env.NYALA_IO)
      const client = new ProtocolClient(textClient, { endpoint: `127.0.0.1:${port}`, io: backend, connectionsPerEndpoint: 2 })
      const answers = await Promise.all(Array.from({ length: 200 }, (_, i) => client.call(i % 2 === 0 ? `UPPER u${i}` : `ECHO e${i}`)))
      t.same(answers, Array.from({ length: 200 }, (_, i) => i % 2 === 0 ? `U${i}` : `e${i}`))
      t.equal(server.stats().callsSucceeded, 200)
      client.close()
      await server.close({ graceMs: 1000 })
      t.equal(server.stats().connectionsOpen, 0, 'close() waited for every connection')
    })

    t.test('an oversized frame closes its connection, counted as a bad frame', async (t) => {
      const { server, port } = await serve({ io: backend })
      const socket = connect(port, '127.0.0.1')
      await once(socket, 'connect')
      socket.on('error', () => {})
      socket.write('x'.repeat(200) + '\n')
      await once(socket, 'close')
      t.equal(server.stats().badFrames, 1)
      await server.close({ graceMs: 0 })
    })

    t.test('at maxConnections a newcomer evicts a silent connection', async (t) => {
      const { server, port } = await serve({ io: backend, maxConnections: 1 })
      const first = connect(port, '127.0.0.1')
      first.on('error', () => {})
      await once(first, 'connect')
      while (server.stats().connectionsOpen < 1) await new Promise((resolve) => setTimeout(resolve, 2))
      const second = connect(port, '127.0.0.1')
      second.on('error', () => {})
      // The silent first is evicted, or, too fresh to evict, the newcomer is refused: either way one goes.
      await Promise.race([once(first, 'close'), once(second, 'close')])
      const stats = server.stats()
      t.equal(stats.connectionsEvicted + stats.connectionsRefused, 1, 'one connection made room or was refused')
      first.destroy()
      second.destroy()
      await server.close({ graceMs: 0 })
    })

    t.test('a refused connect is retried until the deadline, then fails naming ECONNREFUSED', async (t) => {
      const { server, port } = await serve({ io: backend })
      await server.close({ graceMs: 0 })
      const client = new ProtocolClient(textClient, { endpoint: `127.0.0.1:${port}`, io: backend })
      const err = await client.call('ECHO x', { timeoutMs: 300 }).then(() => null, (e: unknown) => e)
      t.ok(err instanceof RpcError)
      t.match((err as RpcError).message, /cannot connect to 127\.0\.0\.1:\d+: connect ECONNREFUSED/)
      client.close()
    })
  })
}
