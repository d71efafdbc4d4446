// The TLS steps of KRPC negotiation as pure state machines, with a scripted
// TLS engine: the NEGOTIATE bytes Kudu's clients and servers write when TLS
// is on (computed by the protobuf encoding rules from client_negotiation.cc
// and server_negotiation.cc), the TLS_HANDSHAKE token rules (Kudu's
// NeedsExtraStep: TLS 1.3's last server bytes go out raw, TLS 1.2's as a
// token), TLS_AUTHENTICATION_ONLY, certificate authentication, refusals.
import t from 'tap'
import type { Socket } from 'node:net'
import { RpcError, ErrorCode } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { encodeRequestFrame, encodeResponseFrame } from '../../codec/krpc/encode-frame.js'
import { NEGOTIATE_CALL_ID, headerSchema } from '../../codec/krpc/frames.js'
import { splitFrame } from '../../codec/krpc/parsed-frame.js'
import { ClientNegotiation } from '../../codec/krpc/client-negotiation.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { ServerNegotiation } from '../../codec/krpc/server-negotiation.js'
import type { SecureChannel, TlsEngine, TlsEngineStep } from '../../codec/protocol.js'
import { hex, joinFrames, joinSlices, toHex } from '../helpers/bytes.js'
import { C_CONNECTION_CONTEXT, C_SASL_INITIATE } from '../helpers/golden.js'

const NegotiateType = headerSchema.type<Record<string, unknown>>('kudu.rpc.NegotiatePB')

// Kudu's C++ client on loopback with encryption optional: features {1,2,3}, authn [sasl].
const C_NEGOTIATE_TLS_LOOPBACK = hex('00 00 00 19 0b 18 df ff ff ff ff ff ff ff ff 01 0c 08 01 08 02 08 03 10 01 3a 02 0a 00')
// Off loopback (and Kudu's Java client everywhere): features {1,2}.
const C_NEGOTIATE_TLS = hex('00 00 00 17 0b 18 df ff ff ff ff ff ff ff ff 01 0a 08 01 08 02 10 01 3a 02 0a 00')
// With a client certificate: authn [sasl, certificate].
const C_NEGOTIATE_TLS_CERT = hex('00 00 00 1b 0b 18 df ff ff ff ff ff ff ff ff 01 0e 08 01 08 02 10 01 3a 02 0a 00 3a 02 1a 00')
// Kudu's server with a certificate, to a loopback client: features {1,2,3}, SASL with PLAIN.
const S_NEGOTIATE_TLS_LOOPBACK = hex('00 00 00 22 0b 08 df ff ff ff ff ff ff ff ff 01 15 08 01 08 02 08 03 10 01 22 07 12 05 50 4c 41 49 4e 3a 02 0a 00')

/** A TLS engine that answers from a script and records what it was given. */
class ScriptedEngine implements TlsEngine {
  readonly fed: string[] = []
  joined: { pending: string | null } | null = null
  closed = 0
  protocol: string | null
  peerName: string
  readonly #script: Array<TlsEngineStep | RpcError>
  constructor (script: Array<{ token: string, done: boolean } | RpcError>, protocol = 'TLSv1.3', peerName = '') {
    this.#script = script.map(s => s instanceof RpcError ? s : { token: Buffer.from(s.token), done: s.done })
    this.protocol = protocol
    this.peerName = peerName
  }

  continue (token: Uint8Array): Promise<TlsEngineStep> {
    this.fed.push(Buffer.from(token).toString())
    const next = this.#script.shift()
    if (next === undefined) return Promise.reject(new RpcError(ErrorCode.NEGOTIATION_FAILED, 'script ran out'))
    return next instanceof RpcError ? Promise.reject(next) : Promise.resolve(next)
  }

  join (_raw: Socket, pending: Buffer | null): SecureChannel {
    this.joined = { pending: pending === null ? null : pending.toString() }
    return { stream: null as never, input: () => {} }
  }

  close (): void { this.closed++ }
}

const tlsRequest = (token: string): Buffer => joinSlices(encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, NegotiateType.encode({ step: 5, tls_handshake: Buffer.from(token) })))
const tlsResponse = (token: string): Buffer => joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 5, tls_handshake: Buffer.from(token) })))

/** The step and tls_handshake token of each NegotiatePB frame in `send`. */
function sent (send: Buffer[][] | undefined, fromServer = true): Array<{ step: number, token?: string }> {
  return joinFrames(send ?? []).map(frame => {
    const parts = splitFrame(frame)
    if (parts instanceof RpcError) throw parts
    const body = NegotiateType.decode(parts.body) as { step: number, tls_handshake?: Uint8Array }
    if (body instanceof RpcError) throw body
    void fromServer
    return body.step !== 5 ? { step: body.step } : { step: body.step, token: Buffer.from(body.tls_handshake ?? []).toString() }
  })
}

t.test('the NEGOTIATE bytes of Kudu\'s clients and servers with TLS on', async t => {
  const engine = (): TlsEngine => new ScriptedEngine([])
  t.equal(toHex(joinFrames(new ClientNegotiation({ tls: engine, authOnlyLoopback: true }).start())[1]!), toHex(C_NEGOTIATE_TLS_LOOPBACK), 'on loopback')
  t.equal(toHex(joinFrames(new ClientNegotiation({ tls: engine }).start())[1]!), toHex(C_NEGOTIATE_TLS), 'off loopback')
  t.equal(toHex(joinFrames(new ClientNegotiation({ tls: engine, certificate: true }).start())[1]!), toHex(C_NEGOTIATE_TLS_CERT), 'with a certificate')
  const server = new ServerNegotiation({ tls: engine, authOnlyLoopback: true })
  const reply = await server.onFrame(C_NEGOTIATE_TLS_LOOPBACK)
  t.equal(toHex(joinFrames(reply.send ?? [])[0]!), toHex(S_NEGOTIATE_TLS_LOOPBACK), 'the server\'s answer')
  // A Java client ({1,2} only) on loopback gets no TLS_AUTHENTICATION_ONLY: the connection is encrypted.
  const java = await new ServerNegotiation({ tls: engine, authOnlyLoopback: true }).onFrame(C_NEGOTIATE_TLS)
  t.same((NegotiateType.decode((splitFrame(joinFrames(java.send ?? [])[0]!) as { body: Buffer }).body) as { supported_features: number[] }).supported_features, [1, 2])
})

t.test('server: TLS 1.3 keeps its last bytes (session tickets) to send raw; TLS 1.2 sends them as a token', async t => {
  for (const [protocol, expectSend, expectPending] of [['TLSv1.3', [], 'tickets'], ['TLSv1.2', [{ step: 5, token: 'tickets' }], null]] as const) {
    const engine = new ScriptedEngine([{ token: 'server-hello', done: false }, { token: 'tickets', done: true }], protocol)
    const server = new ServerNegotiation({ tls: () => engine })
    await server.onFrame(C_NEGOTIATE_TLS)
    const first = await server.onFrame(tlsRequest('client-hello'))
    t.same(sent(first.send), [{ step: 5, token: 'server-hello' }], `${protocol}: the flight is a token`)
    t.equal(first.upgrade, undefined)
    const last = await server.onFrame(tlsRequest('finished'))
    t.same(sent(last.send), expectSend, `${protocol}: the last bytes`)
    t.type(last.upgrade, 'function', 'then TLS on the socket')
    last.upgrade!(null as never)
    t.same(engine.joined, { pending: expectPending })
    t.same(engine.fed, ['client-hello', 'finished'])
    // SASL follows, inside TLS.
    const sasl = await server.onFrame(C_SASL_INITIATE)
    t.same(sent(sasl.send), [{ step: 0 }], 'SASL_SUCCESS')
  }
})

t.test('server: unfinished steps always answer, empty tokens included (an incomplete record)', async t => {
  const engine = new ScriptedEngine([{ token: '', done: false }])
  const server = new ServerNegotiation({ tls: () => engine })
  await server.onFrame(C_NEGOTIATE_TLS)
  t.same(sent((await server.onFrame(tlsRequest('clie'))).send), [{ step: 5, token: '' }])
})

t.test('TLS_AUTHENTICATION_ONLY: TLS authenticates, and the engine is dropped', async t => {
  const engine = new ScriptedEngine([{ token: 'flight', done: false }, { token: 'tickets', done: true }])
  const server = new ServerNegotiation({ tls: () => engine, authOnlyLoopback: true })
  await server.onFrame(C_NEGOTIATE_TLS_LOOPBACK)
  await server.onFrame(tlsRequest('hello'))
  const last = await server.onFrame(tlsRequest('finished'))
  t.equal(last.upgrade, undefined, 'no TLS on the socket')
  t.equal(engine.closed, 1)
  t.same(sent((await server.onFrame(C_SASL_INITIATE)).send), [{ step: 0 }], 'SASL in plain text')
  const done = await server.onFrame(C_CONNECTION_CONTEXT)
  t.same([done.done?.tls, [...done.done!.features]], [null, [1, 2, 3]], 'plain text, with the feature agreed')
})

t.test('server refusals during the TLS steps are FATAL_UNAUTHORIZED, and drop the engine', async t => {
  const cases: Array<[string, Buffer, ScriptedEngine, RegExp]> = [
    ['a SASL step instead', C_SASL_INITIATE, new ScriptedEngine([]), /expected TLS_HANDSHAKE step/],
    ['TLS fails', tlsRequest('junk'), new ScriptedEngine([new RpcError(ErrorCode.NEGOTIATION_FAILED, 'TLS handshake failed: wrong version number')]), /wrong version number/]
  ]
  for (const [name, frame, engine, message] of cases) {
    const server = new ServerNegotiation({ tls: () => engine })
    await server.onFrame(C_NEGOTIATE_TLS)
    const step = await server.onFrame(frame)
    t.equal(step.error?.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, name)
    t.match(step.error?.message, message)
    t.equal(engine.closed, 1, `${name}: engine dropped`)
  }
  const required = await new ServerNegotiation({ tls: () => new ScriptedEngine([]), requireTls: true }).onFrame(hex('00 00 00 15 0b 18 df ff ff ff ff ff ff ff ff 01 08 08 01 10 01 3a 02 0a 00'))
  t.match(required.error?.message, /client does not support required TLS encryption/)
})

t.test('certificate authentication: the CN is the user, no SASL', async t => {
  const engine = new ScriptedEngine([{ token: 'flight', done: false }, { token: '', done: true }], 'TLSv1.3', 'alice')
  let requested: boolean | undefined
  const server = new ServerNegotiation({ tls: (requestCert) => { requested = requestCert; return engine }, verifiesClientCerts: true })
  const negotiate = await server.onFrame(C_NEGOTIATE_TLS_CERT)
  t.equal(requested, true, 'the engine asks for the client certificate')
  t.same((NegotiateType.decode((splitFrame(joinFrames(negotiate.send ?? [])[0]!) as { body: Buffer }).body) as { authn_types: unknown[] }).authn_types, [{ certificate: {} }])
  await server.onFrame(tlsRequest('hello'))
  await server.onFrame(tlsRequest('finished'))
  const done = await server.onFrame(C_CONNECTION_CONTEXT)
  t.same([done.done?.user, done.done?.authentication, done.done?.tls], ['alice', 'certificate', 'TLSv1.3'])
})

t.test('client: the ClientHello, the tokens, then SASL_INITIATE as the first encrypted frame', async t => {
  const engine = new ScriptedEngine([{ token: 'hello', done: false }, { token: 'finished', done: true }])
  const client = new ClientNegotiation({ user: 'user', tls: () => engine })
  client.start()
  const serverNegotiate = joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 1, supported_features: [1, 2], sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }] })))
  const hello = await client.onFrame(serverNegotiate)
  t.same(sent(hello.send), [{ step: 5, token: 'hello' }])
  t.same(engine.fed, [''], 'TLS begins from an empty token')
  const last = await client.onFrame(tlsResponse('server-flight'))
  t.same(sent(last.send), [{ step: 5, token: 'finished' }], 'TLS 1.3\'s Finished is a token')
  t.type(last.upgrade, 'function')
  t.same(joinFrames(last.sendUpgraded ?? []).map(toHex), [toHex(C_SASL_INITIATE)], 'SASL_INITIATE, byte for byte, inside TLS')
  last.upgrade!(null as never)
  t.same(engine.joined, { pending: null })
  const success = await client.onFrame(joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 0 }))))
  t.same([success.done?.user, success.done?.tls, [...success.done!.features]], ['user', 'TLSv1.3', [1, 2]])
})

t.test('client refusals', async t => {
  const noTls = joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 1, supported_features: [1], sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }] })))
  const requireTls = new ClientNegotiation({ tls: () => new ScriptedEngine([]), requireTls: true })
  requireTls.start()
  t.match(((await requireTls.onFrame(noTls)) as NegotiationStep).error?.message, /server does not support required TLS encryption/)
  const certChosen = joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 1, supported_features: [1, 2], authn_types: [{ certificate: {} }] })))
  const noCert = new ClientNegotiation({ tls: () => new ScriptedEngine([]) })
  noCert.start()
  t.match((await noCert.onFrame(certChosen)).error?.message, /client has no certificate/)
  const engine = new ScriptedEngine([{ token: 'hello', done: false }, new RpcError(ErrorCode.NEGOTIATION_FAILED, 'TLS handshake failed: certificate has expired')])
  const failing = new ClientNegotiation({ tls: () => engine })
  failing.start()
  await failing.onFrame(joinSlices(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 1, supported_features: [1, 2], sasl_mechanisms: [{ mechanism: 'PLAIN' }], authn_types: [{ sasl: {} }] }))))
  const failed = await failing.onFrame(tlsResponse('flight'))
  t.match(failed.error?.message, /certificate has expired/)
  t.equal(engine.closed, 1, 'engine dropped')
})
