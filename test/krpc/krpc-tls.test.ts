// TLS inside KRPC negotiation, as Kudu does it: the TLS handshake in
// NegotiatePB TLS_HANDSHAKE steps, then TLS on the socket (or plain text
// again when both sides are on loopback and offer TLS_AUTHENTICATION_ONLY);
// SASL PLAIN inside TLS; certificate authentication naming ctx.user; every
// refusal. A recording proxy between client and server shows what crossed
// the wire, and can forward it one byte per write. Certificates are made by
// openssl in a temporary directory. Outcomes are counted; no duration is
// asserted.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { connect as netConnect, createServer as netCreateServer, type Server as NetServer, type Socket } from 'node:net'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { encodeRequestFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { KRPC_PREAMBLE, NEGOTIATE_CALL_ID, RequestHeaderType, ResponseHeaderType, headerSchema } from '../../codec/krpc/frames.js'
import { splitFrame } from '../../codec/krpc/parsed-frame.js'
import { FakeClock } from '../../scheduling/clock.js'
import type { ClientOptions } from '../../reactor/krpc/client.js'
import type { KrpcServerOptions } from '../../reactor/krpc/server.js'
import { TlsTunnel } from '../../codec/krpc/tls-tunnel.js'
import { joinSlices } from '../helpers/bytes.js'
import { CalculatorService, calculatorHandlers, newClient, rejection, settle, startServer, tally } from '../helpers/reactor-harness.js'
import { withCerts, type TestCerts } from '../helpers/tls-certs.js'

const NegotiateType = headerSchema.type<Record<string, unknown>>('kudu.rpc.NegotiatePB')

withCerts(t, tests)

/** Lets I/O run until `ready()` holds (at most `limit` turns); returns whether it did. */
async function until (ready: () => boolean, limit = 2000): Promise<boolean> {
  for (let i = 0; i < limit && !ready(); i++) await new Promise(resolve => setTimeout(resolve, 2))
  return ready()
}

interface Proxy { endpoint: string, up: Buffer[], down: Buffer[], upBytes: () => Buffer, downBytes: () => Buffer, singleByteWrites: () => number }

/** A TCP proxy to `target` that records both directions; `byteByByte` forwards each byte in a write of its own, a turn apart. */
async function proxy (t: Test, target: string, byteByByte = false): Promise<Proxy> {
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))]
  const up: Buffer[] = []
  const down: Buffer[] = []
  const sockets = new Set<Socket>()
  let singles = 0
  const pipe = (from: Socket, to: Socket, log: Buffer[]): void => {
    let chain = Promise.resolve()
    from.on('data', (chunk: Buffer) => {
      log.push(chunk)
      if (!byteByByte) {
        to.write(chunk)
        return
      }
      chain = chain.then(async () => {
        for (let i = 0; i < chunk.length; i++) {
          if (to.destroyed) return
          to.write(chunk.subarray(i, i + 1))
          singles++
          await new Promise(resolve => setImmediate(resolve))
        }
      })
    })
    from.on('end', () => { void chain.then(() => to.end()) })
    from.on('error', () => to.destroy())
    from.on('close', () => { void chain.then(() => to.destroy()) })
  }
  const server: NetServer = netCreateServer((inbound) => {
    const outbound = netConnect({ host, port, noDelay: true })
    inbound.setNoDelay(true)
    sockets.add(inbound).add(outbound)
    pipe(inbound, outbound, up)
    pipe(outbound, inbound, down)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    for (const s of sockets) s.destroy()
    await new Promise(resolve => server.close(resolve))
  })
  const address = server.address() as { port: number }
  return { endpoint: `127.0.0.1:${address.port}`, up, down, upBytes: () => Buffer.concat(up), downBytes: () => Buffer.concat(down), singleByteWrites: () => singles }
}

/** The NegotiatePB steps of the frames with call id -33 at the start of a stream (after `skip` bytes), until the first that is not one. */
function negotiateSteps (bytes: Buffer, skip: number, fromServer: boolean): number[] {
  const steps: number[] = []
  let at = skip
  while (at + 4 <= bytes.length) {
    const length = bytes.readUInt32BE(at)
    if (length > 65536 || at + 4 + length > bytes.length) break
    const parts = splitFrame(bytes.subarray(at, at + 4 + length))
    if (parts instanceof RpcError) break
    const header = (fromServer ? ResponseHeaderType : RequestHeaderType).decode(parts.header)
    if (header instanceof RpcError || header.call_id !== NEGOTIATE_CALL_ID) break
    const body = NegotiateType.decode(parts.body)
    if (body instanceof RpcError) break
    steps.push(body.step as number)
    at += 4 + length
  }
  return steps
}

function tests (certs: TestCerts): void {
  const serverTls = { cert: certs.serverCert, key: certs.serverKey }
  const handlers = { ...calculatorHandlers, Echo: (_req: { data: string }, ctx: { user: string }) => ({ data: ctx.user }) }
  let handlerRuns = 0
  const counted = { ...handlers, Add: (req: { x: number, y: number }, ctx: never) => { handlerRuns++; return calculatorHandlers.Add(req, ctx) } }

  async function serve (t: Test, options: KrpcServerOptions): Promise<string> {
    const { endpoint } = await startServer(t, { idleTimeoutMs: 0, logger: null, ...options, handlers: counted as never })
    return endpoint
  }

  /** `n` calls and then `Echo`, which answers with ctx.user; and the TLS version the client's connection reports. */
  async function calls (t: Test, endpoint: string, options: ClientOptions, n = 20): Promise<{ outcomes: Record<string, number>, user: string, tls: Array<string | null> }> {
    const client = newClient(t, { endpoint, retry: false, ...options })
    const calc = client.service(CalculatorService)
    const outcomes = tally(await Promise.all(Array.from({ length: n }, (_, i) => settle(calc.Add({ x: i, y: 1 })))))
    let user = ''
    try { user = (await calc.Echo({ data: '' })).data } catch {}
    return { outcomes, user, tls: client.connectionStats().map(c => c.tls) }
  }

  async function refused (t: Test, endpoint: string, options: ClientOptions): Promise<RpcError> {
    const client = newClient(t, { endpoint, retry: false, ...options })
    const before = handlerRuns
    const error = await rejection(client.service(CalculatorService).Add({ x: 1, y: 2 }))
    t.equal(handlerRuns, before, 'no handler ran')
    return error
  }

  const SERVICE_NAME = Buffer.from(CalculatorService.fullName)

  t.test('encrypted: the handshake in TLS_HANDSHAKE steps, then nothing readable on the wire', async t => {
    for (const maxVersion of ['TLSv1.3', 'TLSv1.2'] as const) {
      const { endpoint, server } = await startServer(t, { idleTimeoutMs: 0, logger: null, handlers: counted as never, tls: { ...serverTls, maxVersion }, encryptLoopback: true })
      const wire = await proxy(t, endpoint)
      const r = await calls(t, wire.endpoint, { tls: { ca: certs.ca }, requireTls: true, encryptLoopback: true, user: 'bob', password: 'sesame' })
      t.same(r.outcomes, { OK: 20 }, `${maxVersion}: every call answered`)
      t.equal(r.user, 'bob', 'SASL PLAIN inside TLS names the user')
      t.same(r.tls, [maxVersion], 'the client\'s connection says it is encrypted')
      t.same(server.connectionStats().map(c => c.tls), [maxVersion], 'and so does the server\'s')
      const up = wire.upBytes()
      const down = wire.downBytes()
      t.ok(up.subarray(0, 7).equals(KRPC_PREAMBLE), 'the preamble goes in clear')
      // NEGOTIATE, then TLS_HANDSHAKE tokens; SASL is inside TLS.
      const upSteps = negotiateSteps(up, 7, false)
      const downSteps = negotiateSteps(down, 0, true)
      t.equal(upSteps[0], 1, 'NEGOTIATE first')
      t.ok(upSteps.length >= 3 && upSteps.slice(1).every(s => s === 5), `then only TLS_HANDSHAKE steps in clear (${upSteps.join(',')})`)
      t.ok(downSteps.length >= 2 && downSteps.slice(1).every(s => s === 5), `the server's too (${downSteps.join(',')})`)
      t.equal(up.indexOf(SERVICE_NAME), -1, 'no service name in clear')
      t.equal(up.indexOf(Buffer.from('sesame')), -1, 'no password in clear')
      t.equal(up.indexOf(Buffer.from('\0bob\0')), -1, 'no SASL token in clear')
    }
  })

  t.test('loopback by default: TLS authenticates, then both sides stay in plain text (TLS_AUTHENTICATION_ONLY)', async t => {
    const endpoint = await serve(t, { tls: serverTls })
    const wire = await proxy(t, endpoint)
    const r = await calls(t, wire.endpoint, { tls: { ca: certs.ca }, requireTls: true, user: 'carol' })
    t.same(r.outcomes, { OK: 20 })
    t.equal(r.user, 'carol')
    t.same(r.tls, [null], 'plain text after the handshake')
    const up = wire.upBytes()
    const steps = negotiateSteps(up, 7, false)
    t.same([steps[0], steps.includes(5), steps.includes(2)], [1, true, true], `NEGOTIATE, TLS_HANDSHAKE and then SASL_INITIATE in clear (${steps.join(',')})`)
    t.not(up.indexOf(SERVICE_NAME), -1, `calls in clear (${up.length} bytes)`)
  })

  t.test('records split at every byte, both ways, during negotiation and after', async t => {
    for (const maxVersion of ['TLSv1.3', 'TLSv1.2'] as const) {
      const endpoint = await serve(t, { tls: { ...serverTls, maxVersion }, encryptLoopback: true })
      const wire = await proxy(t, endpoint, true)
      const r = await calls(t, wire.endpoint, { tls: { ca: certs.ca }, encryptLoopback: true, user: 'dave' }, 5)
      t.same(r.outcomes, { OK: 5 }, `${maxVersion}: every call answered`)
      t.equal(r.user, 'dave')
      t.equal(wire.singleByteWrites(), wire.upBytes().length + wire.downBytes().length, 'every byte crossed in a write of its own')
    }
  })

  t.test('SASL PLAIN checked inside TLS: the wrong password is FATAL_UNAUTHORIZED', async t => {
    const endpoint = await serve(t, { tls: serverTls, encryptLoopback: true, authenticate: (user, password) => user === 'erin' && password === 'right' })
    t.same((await calls(t, endpoint, { tls: { ca: certs.ca }, encryptLoopback: true, user: 'erin', password: 'right' })).outcomes, { OK: 20 })
    const wire = await proxy(t, endpoint)
    const error = await refused(t, wire.endpoint, { tls: { ca: certs.ca }, encryptLoopback: true, user: 'erin', password: 'wrong' })
    t.equal(error.code, ErrorCode.NEGOTIATION_FAILED, error.message)
    t.equal(error.remote?.code, KrpcCode.FATAL_UNAUTHORIZED)
  })

  t.test('certificate authentication: the client certificate names ctx.user', async t => {
    const endpoint = await serve(t, { tls: { ...serverTls, ca: certs.ca }, requireClientCert: true, encryptLoopback: true })
    const withCert = { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey }
    const r = await calls(t, endpoint, { tls: withCert, encryptLoopback: true, user: 'not-used' })
    t.same(r.outcomes, { OK: 20 })
    t.equal(r.user, 'alice', 'the CN, not the SASL user')
    const authOnly = await calls(t, endpoint, { tls: withCert, user: 'not-used' })
    t.same([authOnly.outcomes, authOnly.user], [{ OK: 20 }, 'alice'], 'also when TLS only authenticates')

    const none = await refused(t, endpoint, { tls: { ca: certs.ca }, encryptLoopback: true })
    t.equal(none.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, 'no client certificate: FATAL_UNAUTHORIZED')
    t.match(none.message, /requires certificate authentication/)

    const plain = await refused(t, endpoint, {})
    t.equal(plain.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, 'no TLS at all: FATAL_UNAUTHORIZED')

    // Signed by a CA the server does not trust: the server's TLS refuses it.
    // Under TLS 1.3 the client is done by then, and reads the refusal in
    // plain text where TLS records were expected.
    for (const maxVersion of ['TLSv1.3', 'TLSv1.2'] as const) {
      const strict = await serve(t, { tls: { ...serverTls, ca: certs.ca, maxVersion }, requireClientCert: true, encryptLoopback: true })
      const foreign = await refused(t, strict, { tls: { ca: certs.ca, cert: certs.otherClientCert, key: certs.otherClientKey }, encryptLoopback: true })
      t.equal(foreign.code, ErrorCode.NEGOTIATION_FAILED, `${maxVersion}: a foreign certificate fails negotiation`)
      t.equal(foreign.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, `${maxVersion}: refused FATAL_UNAUTHORIZED`)
      t.match(foreign.message, /certificate/, foreign.message)
    }

    // Signed by the CA but naming no user: refused after the handshake, through TLS.
    for (const maxVersion of ['TLSv1.3', 'TLSv1.2'] as const) {
      const strict = await serve(t, { tls: { ...serverTls, ca: certs.ca, maxVersion }, requireClientCert: true, encryptLoopback: true })
      const nameless = await refused(t, strict, { tls: { ca: certs.ca, cert: certs.namelessClientCert, key: certs.namelessClientKey }, encryptLoopback: true })
      t.equal(nameless.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, `${maxVersion}: no CN, FATAL_UNAUTHORIZED`)
      t.match(nameless.message, /names no user/)
    }
  })

  t.test('an optional client certificate: certificate authentication when offered, SASL otherwise', async t => {
    const endpoint = await serve(t, { tls: { ...serverTls, ca: certs.ca }, encryptLoopback: true })
    t.equal((await calls(t, endpoint, { tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey }, encryptLoopback: true, user: 'x' })).user, 'alice')
    t.equal((await calls(t, endpoint, { tls: { ca: certs.ca }, encryptLoopback: true, user: 'frank' })).user, 'frank')
  })

  t.test('the client checks the server: wrong CA, expired certificate, wrong name', async t => {
    const endpoint = await serve(t, { tls: serverTls, encryptLoopback: true })
    const wrongCa = await refused(t, endpoint, { tls: { ca: certs.otherCa }, encryptLoopback: true })
    t.equal(wrongCa.code, ErrorCode.NEGOTIATION_FAILED)
    t.match(wrongCa.message, /TLS handshake failed: .*(certificate|self.signed)/i)

    const wrongName = await refused(t, endpoint, { tls: { ca: certs.ca, servername: 'example.com' }, encryptLoopback: true })
    t.equal(wrongName.code, ErrorCode.NEGOTIATION_FAILED)
    t.match(wrongName.message, /TLS handshake failed: .*(altnames|does not match)/i)

    const expired = await serve(t, { tls: { cert: certs.expiredServerCert, key: certs.serverKey }, encryptLoopback: true })
    const old = await refused(t, expired, { tls: { ca: certs.ca }, encryptLoopback: true })
    t.equal(old.code, ErrorCode.NEGOTIATION_FAILED)
    t.match(old.message, /TLS handshake failed: .*expired/i)

    // rejectUnauthorized: false checks nothing (Kudu's clients with SASL: VERIFY_NONE).
    t.same((await calls(t, endpoint, { tls: { ca: certs.otherCa, rejectUnauthorized: false }, encryptLoopback: true })).outcomes, { OK: 20 })
  })

  t.test('plaintext when TLS is required, either side', async t => {
    const required = await serve(t, { tls: serverTls, requireTls: true })
    const plain = await refused(t, required, {})
    t.equal(plain.code, ErrorCode.NEGOTIATION_FAILED)
    t.equal(plain.remote?.code, KrpcCode.FATAL_UNAUTHORIZED)
    t.match(plain.message, /client does not support required TLS encryption/)

    const noTls = await serve(t, {})
    const insists = await refused(t, noTls, { tls: { ca: certs.ca }, requireTls: true })
    t.equal(insists.code, ErrorCode.NEGOTIATION_FAILED)
    t.match(insists.message, /server does not support required TLS encryption/)

    // Without requireTls, a TLS client and a plain server agree on plain text.
    t.same((await calls(t, noTls, { tls: { ca: certs.ca } })).outcomes, { OK: 20 })
    t.throws(() => newClient(t, { requireTls: true }), { code: ErrorCode.INVALID_ARGUMENT })
  })

  t.test('options are checked at construction', async t => {
    const { Server } = await import('../../reactor/krpc/server.js')
    t.throws(() => new Server({ requireTls: true }), { code: ErrorCode.INVALID_ARGUMENT })
    t.throws(() => new Server({ tls: serverTls, requireClientCert: true }), { code: ErrorCode.INVALID_ARGUMENT }, 'requireClientCert needs tls.ca')
    t.throws(() => new Server({ tls: { cert: certs.serverCert } }), { code: ErrorCode.INVALID_ARGUMENT }, 'cert without key')
    t.throws(() => new Server({ tls: { cert: Buffer.from('junk'), key: Buffer.from('junk') } }), { code: ErrorCode.INVALID_ARGUMENT }, 'a bad certificate')
  })

  t.test('a client that stalls mid-handshake meets the negotiation deadline', async t => {
    const clock = new FakeClock()
    const { endpoint, server } = await startServer(t, { clock, idleTimeoutMs: 0, logger: null, tls: serverTls, negotiationTimeoutMs: 3000 })
    const [host, port] = endpoint.split(':')
    const socket = netConnect({ host, port: Number(port) })
    t.teardown(() => socket.destroy())
    const received: Buffer[] = []
    socket.on('data', (chunk: Buffer) => received.push(chunk))
    const closed = once(socket, 'close')
    socket.write(Buffer.concat([KRPC_PREAMBLE, joinSlices(encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, NegotiateType.encode({ step: 1, supported_features: [1, 2], authn_types: [{ sasl: {} }] })))]))
    t.ok(await until(() => received.length > 0), 'the server answered NEGOTIATE')
    // A real ClientHello, then silence.
    const tunnel = TlsTunnel.client({ rejectUnauthorized: false })
    t.teardown(() => tunnel.close())
    const hello = await tunnel.continue(new Uint8Array(0))
    const before = Buffer.concat(received).length
    socket.write(joinSlices(encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, NegotiateType.encode({ step: 5, tls_handshake: hello.token }))))
    t.ok(await until(() => Buffer.concat(received).length > before), 'the server sent its part of the handshake')
    t.equal(server.stats().connectionsOpen ?? server.connectionStats().length, 1)
    clock.advance(2999)
    t.equal(socket.destroyed, false, 'still open before the deadline')
    clock.advance(1)
    await closed
    t.pass('closed at the deadline')
  })

  t.test('a server that stalls mid-handshake fails the client at its negotiation deadline', async t => {
    const sockets = new Set<Socket>()
    const stalling = netCreateServer((s) => {
      sockets.add(s)
      // Answers NEGOTIATE offering TLS, then never answers the ClientHello.
      s.once('data', () => {
        s.write(joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({
          step: 1, supported_features: [1, 2], sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }]
        }))))
      })
    })
    stalling.listen(0, '127.0.0.1')
    await once(stalling, 'listening')
    t.teardown(async () => { for (const s of sockets) s.destroy(); await new Promise(resolve => stalling.close(resolve)) })
    const clock = new FakeClock()
    const client = newClient(t, { endpoint: `127.0.0.1:${(stalling.address() as { port: number }).port}`, clock, retry: false, tls: { rejectUnauthorized: false }, negotiationTimeoutMs: 500 })
    const call = settle(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 0 }))
    t.ok(await until(() => sockets.size === 1 && sockets.values().next().value!.bytesRead > 100), 'the ClientHello arrived')
    clock.advance(500)
    t.equal(await call, ErrorCode.NEGOTIATION_FAILED)
  })
}
