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

t.test('auto is the first native backend that starts: io_uring, else epoll (else node:net, saying why)', async (t) => {
  const [epoll, uring] = nativeBackends()
  const resolved = resolveIo('auto', '')
  const expected = uring!.skip === false ? 'io_uring' : epoll!.skip === false ? 'epoll' : 'node'
  t.equal(resolved.backend, expected)
  t.equal(resolved.fallback === null, uring!.skip === false, 'a fallback is said only when io_uring could not start')
})

t.test('a native io with tls is a start-up error', async (t) => {
  const server = new ProtocolServer(text, { io: 'epoll', tls: {} })
  await t.rejects(server.listen(0), /cannot carry TLS/)
  await server.close({ graceMs: 0 })
})

// A set-up that upgrades to TLS needs a node:net socket (KRPC with tls, a PostgreSQL-style SSLRequest).
t.test('a protocol whose set-up may upgrade to TLS stays on node:net, whatever NYALA_IO and io ask', async (t) => {
  const upgrading = Object.create(text, { upgradesInSetUp: { value: true } }) as typeof text
  const saved = process.env.NYALA_IO
  t.teardown(() => { if (saved === undefined) delete process.env.NYALA_IO; else process.env.NYALA_IO = saved })
  for (const io of ['io_uring', 'epoll', 'auto'] as const) {
    process.env.NYALA_IO = io
    const server = new ProtocolServer(upgrading, { io: 'auto' })
    await server.listen(0)
    t.equal(server.stats().io, 'node', `NYALA_IO=${io}: node`)
    await server.close({ graceMs: 0 })
  }
})

for (const { backend, skip } of nativeBackends()) {
  t.test(`${backend}: a plain server whose set-up step upgrades refuses it cleanly: the connection closes, the server serves on`, { skip }, async (t) => {
    let upgrades = 0
    const upgrading = Object.create(text, {
      handshake: {
        value: () => ({
          onFrame: (frame: Buffer) => frame.toString().startsWith('TLS')
            ? { send: [[Buffer.from('S\n')]], upgrade: () => { upgrades++; throw new Error('not reached: no socket') } }
            : { done: {} }
        })
      }
    }) as typeof text
    const server = new ProtocolServer(upgrading, { io: backend })
    server.addRoutes('text', { UPPER: (s: string) => s.toUpperCase() })
    server.markReady()
    const { port } = await server.listen(0)
    const saved = process.env.NYALA_IO
    if (saved !== undefined && saved !== '' && saved !== backend) { await server.close({ graceMs: 0 }); return }
    t.equal(server.stats().io, backend)
    const upgrader = connect(port, '127.0.0.1')
    let got = ''
    upgrader.on('data', (d) => { got += d.toString() })
    upgrader.on('error', () => {})
    upgrader.write('TLS please\n')
    await once(upgrader, 'close')
    t.equal(upgrades, 0, 'the upgrade was never handed a socket')
    t.ok(got === '' || got === 'S\n', `closed, with at most what was queued before the upgrade (${JSON.stringify(got)})`)
    const plain = connect(port, '127.0.0.1')
    let answer = ''
    plain.on('data', (d) => { answer += d.toString() })
    plain.write('hello\nUPPER ok\n')
    for (let i = 0; i < 500 && !answer.includes('OK'); i++) await new Promise((resolve) => setTimeout(resolve, 4))
    t.match(answer, /OK/, 'a connection that does not upgrade is served')
    plain.destroy()
    await server.close({ graceMs: 1000 })
    t.equal(server.stats().connectionsOpen, 0)
  })

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
