// TLS from the first byte (ServerOptions.tls, ProtocolClientOptions.tls)
// with the toy protocols: the happy path, mTLS naming ctx.user, refused
// certificates and names, plaintext and stalled peers, and application
// data split into one-byte TLS records. Certificates are made by openssl
// in a temporary directory. Outcomes are counted; no duration is asserted.
import t, { type Test } from 'tap'
import { connect as netConnect, createServer as netCreateServer, type Socket } from 'node:net'
import { TLSSocket, connect as tlsConnect, createSecureContext, type ConnectionOptions as TlsConnectOptions, type TlsOptions } from 'node:tls'
import { once } from 'node:events'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { FakeClock } from '../../scheduling/clock.js'
import { ProtocolServer, type ServerOptions } from '../../reactor/server.js'
import { ProtocolClient, type ProtocolClientOptions } from '../../reactor/protocol-client.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import type { LogFields } from '../../reactor/logger.js'
import { linesProtocol, taggedProtocol } from '../helpers/toy-protocols.js'
import { linesClientProtocol, taggedClientProtocol, type ToyRequest } from '../helpers/toy-client-protocols.js'
import { rejection } from '../helpers/reactor-harness.js'
import { withCerts, type TestCerts } from '../helpers/tls-certs.js'
import type { ServerProtocol } from '../../codec/protocol.js'

withCerts(t, tests)

/** Lets I/O run until `ready()` holds (at most `limit` turns); returns whether it did. */
async function until (ready: () => boolean, limit = 2000): Promise<boolean> {
  for (let i = 0; i < limit && !ready(); i++) await new Promise(resolve => setTimeout(resolve, 2))
  return ready()
}

function tests (certs: TestCerts): void {
  const serverTls: TlsOptions = { cert: certs.serverCert, key: certs.serverKey }
  const mtls: TlsOptions = { ...serverTls, ca: certs.ca, requestCert: true, rejectUnauthorized: true }

  let handlerRuns = 0
  async function start (t: Test, kind: 'lines' | 'tagged', options: ServerOptions): Promise<{ port: number, server: ProtocolServer, warnings: string[] }> {
    const warnings: string[] = []
    const logger = { error: (m: string) => { warnings.push(m) }, warn: (m: string, _f?: LogFields) => { warnings.push(m) }, info: () => {} }
    const server = new ProtocolServer<unknown, unknown>(kind === 'lines' ? linesProtocol() as ServerProtocol : taggedProtocol() as ServerProtocol, { idleTimeoutMs: 0, logger, ...options })
    const handlers = kind === 'lines'
      ? { echo: (arg: string) => { handlerRuns++; return arg }, who: (_arg: string, ctx: CallContext) => `user=${ctx.user}` }
      : { echo: (arg: Buffer) => arg }
    server.addRoutes(kind, handlers as never)
    const { port } = await server.listen(0, '127.0.0.1')
    t.teardown(async () => { await server.close({ graceMs: 100 }) })
    return { port, server, warnings }
  }

  function client (t: Test, kind: 'lines' | 'tagged', port: number, options: Partial<ProtocolClientOptions> = {}): ProtocolClient<ToyRequest, string> {
    const c = new ProtocolClient(kind === 'lines' ? linesClientProtocol() : taggedClientProtocol(), { endpoint: `127.0.0.1:${port}`, ...options })
    t.teardown(() => c.close())
    return c
  }

  t.test('happy path: both toy protocols through ProtocolServer and ProtocolClient over TLS', async t => {
    for (const kind of ['lines', 'tagged'] as const) {
      const { port, server } = await start(t, kind, { tls: serverTls })
      const c = client(t, kind, port, { tls: { ca: certs.ca } })
      const answers = await Promise.all([1, 2, 3].map(i => c.call({ route: 'echo', payload: `hello ${i}` })))
      t.same(answers, ['hello 1', 'hello 2', 'hello 3'], `${kind}: answers in plaintext`)
      t.equal(server.connectionStats()[0]?.readPath, 'data', `${kind}: the server reads TLS through 'data' events`)
      t.equal(c.stats().connections[0]?.readPath, 'data', `${kind}: so does the client`)
      t.equal(server.connectionStats()[0]?.tls, 'TLSv1.3', `${kind}: the server's connection names its TLS version`)
      t.equal(c.stats().connections[0]?.tls, 'TLSv1.3', `${kind}: so does the client's`)
      t.equal(server.stats().tlsHandshakeFailures, 0)
    }
  })

  t.test('without tls nothing changes: the onread path and zero TLS counters', async t => {
    const { port, server } = await start(t, 'lines', {})
    const c = client(t, 'lines', port)
    t.equal(await c.call({ route: 'echo', payload: 'plain' }), 'plain')
    t.equal(server.connectionStats()[0]?.readPath, 'onread')
    t.equal(server.stats().tlsHandshakeFailures, 0)
    t.equal(server.stats().tlsHandshakeTimeouts, 0)
  })

  t.test('mTLS: ctx.user is the client certificate\'s CN', async t => {
    const { port } = await start(t, 'lines', { tls: mtls })
    const c = client(t, 'lines', port, { tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } })
    t.equal(await c.call({ route: 'who' }), 'user=alice')
  })

  t.test('TLS without a client certificate: ctx.user stays empty', async t => {
    const { port } = await start(t, 'lines', { tls: serverTls })
    const c = client(t, 'lines', port, { tls: { ca: certs.ca } })
    t.equal(await c.call({ route: 'who' }), 'user=')
  })

  t.test('a server certificate from another CA: the client refuses, CONNECT_FAILED', async t => {
    const { port, server } = await start(t, 'lines', { tls: serverTls })
    const c = client(t, 'lines', port, { tls: { ca: certs.otherCa }, retry: false })
    const err = await rejection(c.call({ route: 'echo', payload: 'x' }))
    t.equal(err.code, ErrorCode.CONNECT_FAILED)
    t.match(err.message, /TLS: .*certificate/)
    t.ok(await until(() => server.stats().connectionsOpen === 0), 'the server closed its side')
  })

  t.test('a host name the certificate does not name: CONNECT_FAILED', async t => {
    const { port } = await start(t, 'lines', { tls: serverTls })
    const c = client(t, 'lines', port, { tls: { ca: certs.ca, servername: 'wrong.example' }, retry: false })
    const err = await rejection(c.call({ route: 'echo', payload: 'x' }))
    t.equal(err.code, ErrorCode.CONNECT_FAILED)
    t.match(err.message, /TLS: .*wrong\.example/)
  })

  t.test('client certificate required but absent: refused, counted, CONNECT_FAILED', async t => {
    const { port, server, warnings } = await start(t, 'lines', { tls: mtls })
    const c = client(t, 'lines', port, { tls: { ca: certs.ca }, retry: false })
    const err = await rejection(c.call({ route: 'echo', payload: 'x' }))
    t.equal(err.code, ErrorCode.CONNECT_FAILED)
    t.match(err.message, /TLS: /)
    t.ok(await until(() => server.stats().tlsHandshakeFailures === 1), 'counted once')
    t.match(warnings.join('\n'), /TLS handshake with 127\.0\.0\.1:\d+ failed/)
    // A client with its certificate still gets in.
    const good = client(t, 'lines', port, { tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } })
    t.equal(await good.call({ route: 'who' }), 'user=alice')
  })

  t.test('retried per the usual rules: a refused TLS connect is retried until the deadline', async t => {
    const { port } = await start(t, 'lines', { tls: serverTls })
    const c = client(t, 'lines', port, { tls: { ca: certs.otherCa }, retry: { backoff: { delayMs: () => 1 }, budget: null, maxAttempts: 3 } })
    const err = await rejection(c.call({ route: 'echo', payload: 'x' }, { timeoutMs: 5000 }))
    t.equal(err.code, ErrorCode.CONNECT_FAILED)
    t.equal(c.stats().retries, 2, 'two retries after the first attempt')
  })

  t.test('a plaintext client on the TLS port: closed, counted, the server fine afterwards', async t => {
    const { port, server, warnings } = await start(t, 'lines', { tls: serverTls })
    for (let i = 0; i < 3; i++) {
      const raw = netConnect(port, '127.0.0.1')
      raw.on('error', () => {})
      raw.on('connect', () => raw.write('echo hi\n'))
      const got: Buffer[] = []
      raw.on('data', (chunk: Buffer) => got.push(chunk))
      await once(raw, 'close')
      t.notMatch(Buffer.concat(got).toString('latin1'), /hi/, 'no plaintext answer')
    }
    t.ok(await until(() => server.stats().tlsHandshakeFailures === 3), 'each counted')
    t.equal(warnings.filter(w => w.includes('TLS handshake')).length, 1, 'logged once (rate-limited)')
    t.equal(server.stats().connectionsOpen, 0)
    const c = client(t, 'lines', port, { tls: { ca: certs.ca } })
    t.equal(await c.call({ route: 'echo', payload: 'still fine' }), 'still fine')
  })

  t.test('a peer that stalls mid-handshake is closed by tlsHandshakeTimeoutMs; handshakes count as negotiating', async t => {
    const clock = new FakeClock()
    const { port, server } = await start(t, 'lines', { tls: serverTls, clock, frameTimeoutMs: 0, maxNegotiatingConnections: 2 })
    const stalled: Socket[] = []
    t.teardown(() => { for (const s of stalled) s.destroy() })
    const stall = async (): Promise<Socket> => {
      const raw = netConnect(port, '127.0.0.1')
      raw.on('error', () => {})
      stalled.push(raw)
      await once(raw, 'connect')
      // The start of a TLS record holding a ClientHello, and then nothing.
      raw.write(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]))
      return raw
    }
    const first = await stall()
    await stall()
    t.ok(await until(() => server.stats().connectionsOpen === 2), 'both accepted')
    await stall()
    t.ok(await until(() => server.stats().negotiatingEvicted === 1 && first.destroyed), 'a third handshake evicts the oldest')
    clock.advance(9_999)
    t.equal(server.stats().tlsHandshakeTimeouts, 0, 'not before the deadline')
    clock.advance(1)
    t.equal(server.stats().tlsHandshakeTimeouts, 2, 'both stalled handshakes closed at the deadline')
    t.ok(await until(() => server.stats().connectionsOpen === 0 && stalled.every(s => s.destroyed)))
    t.equal(clock.pendingTimers > 0, true, 'the idle scan stays armed')
    const c = client(t, 'lines', port, { tls: { ca: certs.ca } })
    t.equal(await c.call({ route: 'echo', payload: 'after' }), 'after')
    t.equal(server.stats().tlsHandshakeTimeouts, 2, 'a finished handshake leaves no deadline behind')
    clock.advance(20_000)
    t.equal(server.stats().connectionsOpen, 1, 'the finished connection is not closed by the handshake deadline')
  })

  t.test('application data one byte per TLS record: the frames come whole', async t => {
    for (const kind of ['lines', 'tagged'] as const) {
      const { port } = await start(t, kind, { tls: serverTls })
      const socket = tlsConnect({ host: '127.0.0.1', port, ca: certs.ca })
      t.teardown(() => socket.destroy())
      await once(socket, 'secureConnect')
      const got: Buffer[] = []
      socket.on('data', (chunk: Buffer) => got.push(chunk))
      const request = kind === 'lines'
        ? Buffer.from('echo ab\necho cd\n')
        : Buffer.concat([tagged(1, 'ab'), tagged(2, 'cd')])
      for (const byte of request) {
        socket.write(Buffer.from([byte]))
        await new Promise(resolve => setImmediate(resolve))
      }
      const want = kind === 'lines' ? 'ab\ncd\n' : 'abcd'
      t.ok(await until(() => Buffer.concat(got).length >= (kind === 'lines' ? 6 : 2 * 9)), `${kind}: both answers`)
      const bytes = Buffer.concat(got)
      const text = kind === 'lines' ? bytes.toString() : bytes.subarray(7, 9).toString() + bytes.subarray(16, 18).toString()
      t.equal(text, want, `${kind}: answers to the frames sent byte by byte`)
    }
  })

  /** A TLS client whose raw TCP socket underneath stays reachable, after one answered call. */
  async function rawTls (t: Test, port: number, options: TlsConnectOptions = {}): Promise<{ raw: Socket, secure: ReturnType<typeof tlsConnect> }> {
    const raw = netConnect(port, '127.0.0.1')
    raw.on('error', () => {})
    t.teardown(() => raw.destroy())
    await once(raw, 'connect')
    const secure = tlsConnect({ socket: raw, ca: certs.ca, servername: 'localhost', ...options })
    secure.on('error', () => {})
    await once(secure, 'secureConnect')
    secure.write('echo ok\n')
    await once(secure, 'data')
    return { raw, secure }
  }

  t.test('a corrupt TLS record after the handshake: the server closes the connection and counts it', async t => {
    const { port, server, warnings } = await start(t, 'lines', { tls: serverTls })
    const { raw } = await rawTls(t, port)
    t.equal(server.stats().connectionsOpen, 1)
    // An application-data record whose contents do not decrypt.
    raw.write(Buffer.concat([Buffer.from([0x17, 0x03, 0x03, 0x00, 0x20]), Buffer.alloc(32, 0xab)]))
    t.ok(await until(() => server.stats().connectionsOpen === 0, 500), 'closed by the server')
    t.ok(await until(() => raw.destroyed || raw.readableEnded, 500), 'the peer sees the close')
    t.equal(server.stats().badFrames, 1, 'counted as bad data')
    t.match(warnings.join('\n'), /TLS: /)
    const c = client(t, 'lines', port, { tls: { ca: certs.ca } })
    t.equal(await c.call({ route: 'echo', payload: 'still fine' }), 'still fine')
  })

  t.test('TLS 1.2 client renegotiation is refused', async t => {
    const { port, server } = await start(t, 'lines', { tls: serverTls })
    const { raw, secure } = await rawTls(t, port, { maxVersion: 'TLSv1.2' })
    t.equal(secure.getProtocol(), 'TLSv1.2')
    let renegotiated = 0
    for (let i = 0; i < 6 && !raw.destroyed; i++) {
      const ok = await new Promise<boolean>(resolve => {
        const started = secure.renegotiate({}, (err) => { resolve(err === null || err === undefined) })
        if (!started) resolve(false)
        raw.once('close', () => resolve(false))
      })
      if (!ok) break
      renegotiated++
    }
    t.equal(renegotiated, 0, 'no renegotiation completes')
    t.ok(await until(() => server.stats().connectionsOpen === 0, 500), 'the server closed the connection')
  })

  t.test('an untrusted client certificate with a request right behind the handshake: no handler runs, closed, counted', async t => {
    const { port, server } = await start(t, 'lines', { tls: mtls })
    const runs = handlerRuns
    for (const maxVersion of ['TLSv1.2', 'TLSv1.3'] as const) {
      const raw = netConnect(port, '127.0.0.1')
      raw.on('error', () => {})
      t.teardown(() => raw.destroy())
      const secure = tlsConnect({ host: '127.0.0.1', port, socket: raw, ca: certs.ca, servername: 'localhost', cert: certs.otherClientCert, key: certs.otherClientKey, maxVersion })
      secure.on('error', () => {})
      const got: Buffer[] = []
      secure.on('data', (chunk: Buffer) => got.push(chunk))
      secure.on('secureConnect', () => { secure.write('echo a\necho b\n') })
      await once(raw, 'close')
      t.equal(Buffer.concat(got).length, 0, `${maxVersion}: no answer`)
    }
    t.equal(handlerRuns, runs, 'the handler never ran')
    t.ok(await until(() => server.stats().connectionsOpen === 0 && server.stats().tlsHandshakeFailures === 2), 'closed and counted')
  })

  t.test('requestCert without ca is refused at construction', async t => {
    const err = (() => { try { new ProtocolServer(linesProtocol(), { tls: { ...serverTls, requestCert: true } }); return null } catch (e) { return e } })()
    t.ok(err instanceof RpcError && err.code === ErrorCode.INVALID_ARGUMENT, 'RPC_ERR_INVALID_ARGUMENT')
    t.match((err as Error).message, /tls\.ca/)
    t.doesNotThrow(() => new ProtocolServer(linesProtocol(), { tls: { ...serverTls, requestCert: true, rejectUnauthorized: false } }), 'unverified certificates name no user: allowed')
  })

  t.test('a TLS error after a non-idempotent request was written: the call fails once, not retried', async t => {
    let connections = 0
    const raws: Socket[] = []
    const secureContext = createSecureContext(serverTls)
    const server = netCreateServer(raw => {
      connections++
      raws.push(raw)
      raw.on('error', () => {})
      const secure = new TLSSocket(raw, { isServer: true, secureContext })
      secure.on('error', () => {})
      // The request arrived: answer with a record that does not decrypt.
      secure.once('data', () => { raw.write(Buffer.concat([Buffer.from([0x17, 0x03, 0x03, 0x00, 0x20]), Buffer.alloc(32, 0xab)])) })
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    t.teardown(() => { for (const r of raws) r.destroy(); server.close() })
    const port = (server.address() as { port: number }).port
    const c = client(t, 'lines', port, { tls: { ca: certs.ca }, retry: { backoff: { delayMs: () => 1 }, budget: null, maxAttempts: 3 } })
    const err = await rejection(c.call({ route: 'echo', payload: 'once' }, { timeoutMs: 5000 }))
    t.not(err.code, ErrorCode.CONNECT_FAILED, `a failure of a sent call: ${err.code} ${err.message}`)
    t.equal(c.stats().retries, 0, 'not retried')
    t.equal(connections, 1, 'one connection, one request')
  })

  t.test('bad tlsHandshakeTimeoutMs and ALPNProtocols are refused at construction', async t => {
    const refused = (options: ServerOptions): unknown => { try { new ProtocolServer(linesProtocol(), options); return null } catch (e) { return e } }
    for (const ms of [0, -1, 1.5, Number.NaN, Infinity]) {
      const err = refused({ tls: serverTls, tlsHandshakeTimeoutMs: ms })
      t.ok(err instanceof RpcError && err.code === ErrorCode.INVALID_ARGUMENT, `tlsHandshakeTimeoutMs ${ms}`)
    }
    for (const alpn of [['x'.repeat(256)], [''], 'h2', [42]]) {
      const err = refused({ tls: { ...serverTls, ALPNProtocols: alpn as never } })
      t.ok(err instanceof RpcError && err.code === ErrorCode.INVALID_ARGUMENT, `ALPNProtocols ${JSON.stringify(alpn).slice(0, 20)}`)
    }
    t.doesNotThrow(() => new ProtocolServer(linesProtocol(), { tls: { ...serverTls, ALPNProtocols: ['nyala', 'x'] }, tlsHandshakeTimeoutMs: 500 }))
  })

  t.test('a throwing connectionState: the connection is closed and counted, the server keeps serving', async t => {
    for (const tls of [undefined, serverTls]) {
      let throwNext = true
      const base = linesProtocol()
      const protocol = { ...base, connectionState: () => { if (throwNext) { throwNext = false; throw new Error('no state') } return undefined } }
      const server = new ProtocolServer(protocol as typeof base, { idleTimeoutMs: 0, logger: { error: () => {}, warn: () => {}, info: () => {} }, tls })
      server.addRoutes('lines', { echo: (arg: string) => arg } as never)
      const { port } = await server.listen(0, '127.0.0.1')
      t.teardown(async () => { await server.close({ graceMs: 100 }) })
      const raw = netConnect(port, '127.0.0.1')
      raw.on('error', () => {})
      await once(raw, 'close')
      t.equal(server.stats().acceptErrors, 1, `${tls === undefined ? 'plaintext' : 'TLS'}: counted`)
      t.equal(server.stats().connectionsOpen, 0)
      const c = client(t, 'lines', port, tls === undefined ? {} : { tls: { ca: certs.ca } })
      t.equal(await c.call({ route: 'echo', payload: 'next' }), 'next', 'the next connection is served')
    }
  })

  t.test('client: bad TLS options throw at construction, not at connect', async t => {
    t.throws(() => new ProtocolClient(linesClientProtocol(), { endpoint: '127.0.0.1:1', tls: { cert: 'not a certificate', key: 'not a key' } }))
  })
}

/** `[u16 length][u8 route][u32 id][payload]` of the tagged toy protocol, route echo. */
function tagged (id: number, payload: string): Buffer {
  const out = Buffer.alloc(7 + payload.length)
  out.writeUInt16BE(5 + payload.length, 0)
  out[2] = 0
  out.writeUInt32BE(id, 3)
  out.write(payload, 7)
  return out
}
