// KRPC's hostile input: bad preambles, HTTP and TLS on the KRPC port, oversize and malformed KRPC frames, stalled negotiation, SASL PLAIN refusal.
// The generic hostile peers (garbage, partial frames, duplicate ids, half-closes, floods) are tested in test/reactor/hostile.test.ts.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CalculatorService, Probe, newClient, settle, startServer, turns, type Running } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const AddRequest = CalculatorService.methods.Add.requestType

async function stillServes (t: Test, running: Running): Promise<void> {
  const client = newClient(t, { endpoint: running.endpoint })
  t.same(await client.service(CalculatorService).Add({ x: 40, y: 2 }, { timeoutMs: 5000 }), { result: 42 }, 'a normal client is still served')
  client.close()
}

function prefix (n: number): Buffer {
  const b = Buffer.alloc(4)
  b.writeUInt32BE(n)
  return b
}

t.test('bad preambles are closed without a reply', async (t) => {
  const running = await startServer(t)
  const cases: Array<[string, Buffer]> = [
    ['HTTP GET', Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n', 'latin1')],
    ['HTTP POST', Buffer.from('POST /rpc HTTP/1.1\r\n\r\n', 'latin1')],
    ['HTTP OPTIONS', Buffer.from('OPTIONS * HTTP/1.1\r\n\r\n', 'latin1')],
    ['wrong version', Buffer.from([0x68, 0x72, 0x70, 0x63, 0x08, 0x00, 0x00, ...clientHandshakeBytes().subarray(7)])],
    ['wrong magic', Buffer.from('hrpx\x09\x00\x00', 'latin1')],
    ['TLS ClientHello', Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03])]
  ]
  for (const [name, bytes] of cases) {
    const raw = await RawClient.connect(running.port)
    raw.write(bytes)
    await raw.closed
    t.equal(raw.bytesReceived, 0, `${name}: closed with no bytes sent back`)
  }
  t.equal(running.server.stats().callsReceived, 0)
  await stillServes(t, running)
})

t.test('oversize length prefixes are refused at the prefix, during and after negotiation', async (t) => {
  const running = await startServer(t, { maxMessageBytes: 4096 })
  const during = await RawClient.connect(running.port)
  during.write(Buffer.concat([clientHandshakeBytes().subarray(0, 7), prefix(0x7fffffff)]))
  await during.closed
  t.equal(during.bytesReceived, 0, 'oversize NEGOTIATE frame: closed, no reply')

  const after = await RawClient.connect(running.port)
  after.write(Buffer.concat([clientHandshakeBytes(), prefix(4097)]))
  await after.closed
  t.equal(after.frames.filter(f => f.header.call_id >= 0).length, 0, 'oversize call frame: closed, no reply')
  await stillServes(t, running)
})

t.test('malformed frames after negotiation close the connection without a reply', async (t) => {
  const running = await startServer(t)
  const noRemoteMethod = (() => {
    // RequestHeader with only call_id 0, and an AddRequest body.
    const header = Buffer.from([0x18, 0x00])
    const body = Buffer.from(AddRequest.encode({ x: 1, y: 1 }))
    return Buffer.concat([prefix(2 + header.length + body.length), Buffer.from([header.length]), header, Buffer.from([body.length]), body])
  })()
  const good = requestFrame(0, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 }))
  const trailing = Buffer.concat([prefix(good.length - 4 + 3), good.subarray(4), Buffer.from([1, 2, 3])])
  const badOffsets = (() => {
    // call_id 0, remote_method, sidecar_offsets [200] past the 4-byte body.
    const frame = requestFrame(0, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 }), { sidecars: [Buffer.alloc(1)] })
    const copy = Buffer.from(frame)
    // The offset varint is the byte after the 0x80 0x01 tag; make it point past the end.
    const tag = copy.indexOf(Buffer.from([0x80, 0x01]))
    copy[tag + 2] = 0x7f
    return copy
  })()
  const cases: Array<[string, Buffer]> = [
    ['zero length prefix', prefix(0)],
    ['truncated header', Buffer.concat([prefix(2), Buffer.from([0x09, 0x18])])],
    ['bad header varint', Buffer.concat([prefix(6), Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff])])],
    ['missing remote_method', noRemoteMethod],
    ['trailing bytes', trailing],
    ['sidecar offset past the body', badOffsets],
    ['negative call id after negotiation', requestFrame(-5, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 }))]
  ]
  for (const [name, bytes] of cases) {
    const raw = await RawClient.connect(running.port)
    raw.write(Buffer.concat([clientHandshakeBytes(), bytes]))
    await raw.closed
    t.equal(raw.frames.filter(f => f.header.call_id >= 0).length, 0, `${name}: closed without a reply`)
  }
  t.equal(running.server.stats().badFrames, cases.length, 'each counted as a bad frame')
  t.equal(running.server.stats().callsReceived, 0)
  await stillServes(t, running)
})

t.test('a silent or stalled connection is dropped at the negotiation deadline', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, negotiationTimeoutMs: 500 })
  const silent = await RawClient.connect(running.port)
  const stalled = await RawClient.connect(running.port)
  // Preamble and half a NEGOTIATE frame, then nothing.
  const handshake = clientHandshakeBytes()
  stalled.write(handshake.subarray(0, 12))
  while (running.server.stats().connectionsAccepted < 2) await turns(1)
  await turns(5)
  clock.advance(499)
  await turns(5)
  t.notOk(silent.isClosed, 'not before the deadline')
  t.notOk(stalled.isClosed)
  clock.advance(1)
  await Promise.all([silent.closed, stalled.closed])
  t.equal(silent.bytesReceived, 0)
  t.equal(stalled.bytesReceived, 0)
  t.equal(running.server.stats().connectionsOpen, 0)
  await stillServes(t, running)
})

t.test('SASL PLAIN: the server\'s authenticator decides; the user reaches the handler', async (t) => {
  const probe = new Probe()
  const running = await startServer(t, {
    handlers: probe.handlers(),
    authenticate: (user, password) => user === 'alice' && password === 'secret'
  })
  const good = newClient(t, { endpoint: running.endpoint, user: 'alice', password: 'secret' })
  t.same(await good.service(CalculatorService).Add({ x: 1, y: 2 }), { result: 3 })
  t.equal(probe.calls[0]!.user, 'alice')
})

t.test('SASL PLAIN refusal: the call fails with NEGOTIATION_FAILED carrying FATAL_UNAUTHORIZED', async (t) => {
  const running = await startServer(t, {
    authenticate: async (user, password) => user === 'alice' && password === 'secret'
  })
  for (const [user, password] of [['alice', 'wrong'], ['mallory', 'secret']] as const) {
    const client = newClient(t, { endpoint: running.endpoint, user, password })
    const error = await client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }).then(() => null, (e: unknown) => e)
    t.ok(error instanceof RpcError, `${user}/${password}: refused`)
    const e = error as RpcError
    t.equal(e.code, ErrorCode.NEGOTIATION_FAILED, `${user}: code (${e.code}: ${e.message})`)
    t.equal(e.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, `${user}: krpcCode`)
    t.equal(client.connectionCount, 0)
  }
  t.equal(running.server.stats().callsReceived, 0)
})

t.test('SASL PLAIN refusal on the wire: one FATAL_UNAUTHORIZED error frame, then close', async (t) => {
  const running = await startServer(t, { authenticate: () => { throw new Error('auth backend down') } })
  const raw = await RawClient.connect(running.port)
  raw.write(Buffer.concat([clientHandshakeBytes('bob', 'pw'), requestFrame(0, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 }))]))
  await raw.closed
  const errors = raw.frames.filter(f => f.header.is_error === true)
  t.equal(errors.length, 1)
  t.equal(errors[0]!.header.call_id, -33)
  const status = ErrorStatusType.decode(errors[0]!.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, KrpcCode.FATAL_UNAUTHORIZED)
  t.equal(raw.frames.filter(f => f.header.call_id >= 0).length, 0, 'the call was not served')
  t.equal(running.server.stats().callsReceived, 0)
})

t.test('many hostile connections at once do not disturb a client in the middle of its calls', async (t) => {
  const running = await startServer(t, { maxMessageBytes: 4096 })
  const client = newClient(t, { endpoint: running.endpoint })
  const calc = client.service(CalculatorService)
  const calls = Array.from({ length: 200 }, (_, i) => settle(calc.Add({ x: i, y: 1 })))
  const garbage = [
    Buffer.from('GET / HTTP/1.0\r\n\r\n'),
    Buffer.concat([clientHandshakeBytes(), prefix(1 << 20)]),
    Buffer.concat([clientHandshakeBytes(), prefix(0)]),
    Buffer.from([0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0])
  ]
  const raws = await Promise.all(Array.from({ length: 20 }, () => RawClient.connect(running.port)))
  raws.forEach((raw, i) => raw.write(garbage[i % garbage.length]!))
  await Promise.all(raws.map(r => r.closed))
  const outcomes = await Promise.all(calls)
  t.same(outcomes.filter(o => o !== 'OK'), [])
  t.equal(client.connectionCount, 1)
})

t.test('method names of Object.prototype are unknown methods, not a crash (found by the fuzzer)', async (t) => {
  const running = await startServer(t)
  const raw = await RawClient.connect(running.port)
  const names = ['toString', 'constructor', 'valueOf', '__proto__', 'hasOwnProperty', '__defineGetter__']
  raw.write(Buffer.concat([clientHandshakeBytes(), ...names.map((name, i) => requestFrame(i, SERVICE, name, new Uint8Array(0)))]))
  for (let i = 0; i < names.length; i++) {
    const answer = await raw.nextResponse()
    const status = ErrorStatusType.decode(answer.message)
    if (status instanceof RpcError) throw status
    t.equal(status.code, KrpcCode.ERROR_NO_SUCH_METHOD, `${names[answer.header.call_id]!}: ERROR_NO_SUCH_METHOD`)
  }
  raw.close()
  await stillServes(t, running)
})

t.test('calls pipelined behind refused credentials never reach a handler (found by the fuzzer)', async (t) => {
  const probe = new Probe()
  const running = await startServer(t, {
    handlers: probe.handlers(),
    authenticate: async (user) => user !== 'intruder'
  })
  const raw = await RawClient.connect(running.port)
  // The handshake up to SASL_INITIATE (no ConnectionContext) and two calls
  // in one write; the authenticator answers after they have arrived.
  const handshake = clientHandshakeBytes('intruder', 'pw')
  let end = 7
  for (let frames = 0; frames < 2; frames++) end += 4 + handshake.readUInt32BE(end)
  raw.write(Buffer.concat([handshake.subarray(0, end), requestFrame(0, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 })),
    requestFrame(1, SERVICE, 'Add', AddRequest.encode({ x: 2, y: 2 }))]))
  await raw.closed
  t.equal(probe.count('Add'), 0, 'no handler ran')
  t.equal(running.server.stats().callsReceived, 0)
  t.equal(raw.frames.filter(f => f.header.call_id >= 0).length, 0, 'nothing answered')
  await stillServes(t, running)
})
