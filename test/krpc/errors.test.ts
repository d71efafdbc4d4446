// Behaviours 5–10 and 25 of Kudu's rpc-test list: unknown service and
// method, invalid request PBs (server side) and client-side validation,
// invalid or unparseable responses, application errors, feature flags.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcError, unsupportedFeatureFlagsOf } from '../../codec/krpc/codes.js'
import type { MethodDef, ServiceDef } from '../../codec/protobuf/schema.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import {
  CalculatorService, Probe, calculatorDef, calculatorHandlers, newClient, settle, startServer, tally, turns, rejection } from '../helpers/reactor-harness.js'
import { FakeServer, RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const AddRequest = CalculatorService.methods.Add.requestType
const AddResponse = CalculatorService.methods.Add.responseType

const unknownService: ServiceDef = { fullName: 'nyala.demo.NoSuchService', methods: calculatorDef.methods }
const unknownMethod: ServiceDef = {
  fullName: SERVICE,
  methods: { Nope: { ...(CalculatorService.methods.Add as unknown as MethodDef<unknown, unknown>), name: 'Nope' } }
}

t.test('unknown service → ERROR_NO_SUCH_SERVICE; the connection stays usable', async (t) => {
  const { endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const error = await rejection(client.call(endpoint, unknownService, 'Add', { x: 1, y: 2 }))
  t.equal(error.code, ErrorCode.REMOTE)
  t.equal(error.remote?.code, KrpcCode.ERROR_NO_SUCH_SERVICE)
  t.match(error.message, /NoSuchService/)
  t.notOk(error.fatal)
  t.equal((await client.service(CalculatorService).Add({ x: 1, y: 2 })).result, 3)
  t.equal(client.connectionCount, 1)
})

t.test('unknown service before the server is ready → ERROR_UNAVAILABLE, then NO_SUCH_SERVICE', async (t) => {
  const { endpoint, server } = await startServer(t, { ready: false })
  const client = newClient(t, { endpoint })
  const before = await rejection(client.call(endpoint, unknownService, 'Add', { x: 1, y: 2 }))
  t.equal(before.remote?.code, KrpcCode.ERROR_UNAVAILABLE)
  t.equal((await client.service(CalculatorService).Add({ x: 1, y: 2 })).result, 3, 'registered services are served')
  server.markReady()
  const after = await rejection(client.call(endpoint, unknownService, 'Add', { x: 1, y: 2 }))
  t.equal(after.remote?.code, KrpcCode.ERROR_NO_SUCH_SERVICE)
})

t.test('unknown method → ERROR_NO_SUCH_METHOD', async (t) => {
  const { endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const error = await rejection(client.call(endpoint, unknownMethod, 'Nope', { x: 1, y: 2 }))
  t.equal(error.code, ErrorCode.REMOTE)
  t.equal(error.remote?.code, KrpcCode.ERROR_NO_SUCH_METHOD)
  t.match(error.message, /Nope/)
  t.equal((await client.service(CalculatorService).Add({ x: 2, y: 2 })).result, 4)
})

t.test('a method the client does not know fails locally', async (t) => {
  const { endpoint, server } = await startServer(t)
  const client = newClient(t, { endpoint })
  const error = await rejection(client.call(endpoint, calculatorDef, 'Multiply', {}))
  t.equal(error.code, ErrorCode.INVALID_ARGUMENT)
  t.equal(server.stats().callsReceived, 0)
})

t.test('a request missing a required field → ERROR_INVALID_REQUEST naming it; the connection stays up', async (t) => {
  const { port, server } = await startServer(t)
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  // AddRequestPB with x only: 08 01. The client codec would refuse it, so it is hand-built.
  raw.write(Buffer.concat([clientHandshakeBytes(), requestFrame(0, SERVICE, 'Add', Buffer.from([0x08, 0x01]))]))
  const bad = await raw.nextResponse()
  t.equal(bad.header.call_id, 0)
  t.equal(bad.header.is_error, true)
  const status = ErrorStatusType.decode(bad.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, KrpcCode.ERROR_INVALID_REQUEST)
  t.match(status.message, /\by\b/, `the message names the missing field: ${status.message}`)
  t.notMatch(status.message, /\bx\b.*missing|missing.*\bx\b/, 'and not the field that is present')

  // Bytes that are not a protobuf at all.
  raw.write(requestFrame(1, SERVICE, 'Add', Buffer.from([0xff, 0xff, 0xff])))
  const garbage = await raw.nextResponse()
  const garbageStatus = ErrorStatusType.decode(garbage.message)
  if (garbageStatus instanceof RpcError) throw garbageStatus
  t.equal(garbageStatus.code, KrpcCode.ERROR_INVALID_REQUEST)

  raw.write(requestFrame(2, SERVICE, 'Add', AddRequest.encode({ x: 4, y: 5 })))
  const good = await raw.nextResponse()
  t.equal(good.header.call_id, 2)
  t.same(AddResponse.decode(good.message), { result: 9 }, 'the same connection serves the next call')
  t.notOk(raw.isClosed)
  t.equal(server.stats().badFrames, 0)
})

t.test('client-side validation: a missing required field fails at once, exactly once, and sends nothing', async (t) => {
  const { endpoint, server } = await startServer(t)
  const client = newClient(t, { endpoint })
  let settlements = 0
  const promise = client.call(endpoint, calculatorDef, 'Add', { x: 1 })
  promise.then(() => { settlements++ }, () => { settlements++ })
  const error = await rejection(promise)
  t.equal(error.code, ErrorCode.INVALID_ARGUMENT)
  t.match(error.message, /\by\b/, 'names the missing field')
  await turns(3)
  t.equal(settlements, 1)
  t.equal(client.pendingCalls, 0)
  t.equal(client.connectionCount, 0, 'no connection was even opened')
  // A wrong type is refused the same way.
  const typed = await rejection(client.call(endpoint, calculatorDef, 'Add', { x: 'one', y: 2 }))
  t.equal(typed.code, ErrorCode.INVALID_ARGUMENT)
  // Through a typed stub too.
  const stub = client.service(CalculatorService)
  t.equal((await rejection(stub.Echo({} as { data: string }))).code, ErrorCode.INVALID_ARGUMENT)
  t.equal(server.stats().callsReceived, 0)
})

t.test('application errors carry ERROR_APPLICATION and the handler\'s message', async (t) => {
  const { endpoint } = await startServer(t, {
    handlers: {
      ...calculatorHandlers,
      Echo: (req) => {
        if (req.data === 'remote-code') throw krpcError(KrpcCode.ERROR_SERVER_TOO_BUSY, 'ERROR_SERVER_TOO_BUSY: try later')
        if (req.data === 'async') return Promise.reject(new Error('async failure'))
        throw new Error(`cannot echo ${req.data}`)
      }
    }
  })
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const app = await rejection(calc.Sleep({ sleep_micros: 1000, return_app_error: true }))
  t.equal(app.code, ErrorCode.REMOTE)
  t.equal(app.remote?.code, KrpcCode.ERROR_APPLICATION)
  t.match(app.message, /Got some error/)
  t.notOk(app.fatal)

  const thrown = await rejection(calc.Echo({ data: 'this' }))
  t.equal(thrown.remote?.code, KrpcCode.ERROR_APPLICATION)
  t.match(thrown.message, /cannot echo this/)
  const async = await rejection(calc.Echo({ data: 'async' }))
  t.equal(async.remote?.code, KrpcCode.ERROR_APPLICATION)
  t.match(async.message, /async failure/)
  const coded = await rejection(calc.Echo({ data: 'remote-code' }))
  t.equal(coded.remote?.code, KrpcCode.ERROR_SERVER_TOO_BUSY, 'a handler may answer with another KRPC code')
  t.match(coded.message, /try later/)
  t.equal((await calc.Add({ x: 1, y: 1 })).result, 2, 'the connection is still good')
})

t.test('a handler that returns an invalid response → ERROR_APPLICATION, not a hang', async (t) => {
  const { endpoint } = await startServer(t, {
    handlers: { ...calculatorHandlers, Add: () => ({}) as { result: number } }
  })
  const client = newClient(t, { endpoint })
  const error = await rejection(client.service(CalculatorService).Add({ x: 1, y: 1 }))
  t.equal(error.remote?.code, KrpcCode.ERROR_APPLICATION)
})

t.test('feature flags: unsupported → ERROR_INVALID_REQUEST with unsupported_feature_flags; supported → OK', async (t) => {
  const plain = await startServer(t)
  const client = newClient(t)
  const error = await rejection(client.call(plain.endpoint, calculatorDef, 'Add', { x: 1, y: 2 }, { requiredFeatureFlags: [99] }))
  t.equal(error.code, ErrorCode.REMOTE)
  t.equal(error.remote?.code, KrpcCode.ERROR_INVALID_REQUEST)
  t.same(unsupportedFeatureFlagsOf(error), [99])

  const flagged = await startServer(t, { serviceOptions: { supportedFeatureFlags: [99] } })
  const ok = await client.call<{ result: number }>(flagged.endpoint, calculatorDef, 'Add', { x: 1, y: 2 }, { requiredFeatureFlags: [99] })
  t.equal(ok.response.result, 3)
  const partial = await rejection(client.call(flagged.endpoint, calculatorDef, 'Add', { x: 1, y: 2 }, { requiredFeatureFlags: [99, 100, 7] }))
  t.equal(partial.remote?.code, KrpcCode.ERROR_INVALID_REQUEST)
  t.same(unsupportedFeatureFlagsOf(partial), [100, 7], 'only the flags the service lacks')
  t.equal((await client.call<{ result: number }>(flagged.endpoint, calculatorDef, 'Add', { x: 5, y: 5 }, { requiredFeatureFlags: [] })).response.result, 10)
})

// ---------------------------------------------------------------------------
// Invalid responses, from a hand-driven server.

async function fakeWithClient (t: Test) {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint, defaultTimeoutMs: 10_000 })
  return { fake, client, calc: client.service(CalculatorService) }
}

t.test('a response missing a required field → RPC_ERR_INVALID_RESPONSE; the connection survives', async (t) => {
  const { fake, client, calc } = await fakeWithClient(t)
  const pending = rejection(calc.Add({ x: 1, y: 2 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respondRaw(call.header.call_id, Buffer.alloc(0)) // AddResponsePB without `result`
  const error = await pending
  t.equal(error.code, ErrorCode.INVALID_RESPONSE)
  t.match(error.message, /result/, 'names the missing field')

  const next = calc.Add({ x: 3, y: 4 })
  const call2 = await peer.nextCall()
  t.equal(call2.header.call_id, 1)
  peer.respond(1, AddResponse, { result: 7 })
  t.same(await next, { result: 7 })
  t.equal(client.connectionCount, 1)
})

t.test('an error response whose ErrorStatusPB does not parse → RPC_ERR_INVALID_RESPONSE', async (t) => {
  const { fake, calc } = await fakeWithClient(t)
  const pending = rejection(calc.Add({ x: 1, y: 2 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respondRaw(call.header.call_id, Buffer.from([0x10, 0x05]), true) // code only, no required message
  t.equal((await pending).code, ErrorCode.INVALID_RESPONSE)
})

t.test('an error response without a code is FATAL_UNKNOWN', async (t) => {
  // Regression: protobufjs reads an absent uint32 as 0, which once became krpcCode 0.
  const { fake, calc } = await fakeWithClient(t)
  const pending = rejection(calc.Add({ x: 1, y: 2 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respondRaw(call.header.call_id, ErrorStatusType.encode({ message: 'no code given' }), true)
  const error = await pending
  t.equal(error.remote?.code, KrpcCode.FATAL_UNKNOWN)
  t.match(error.message, /no code given/)
})

t.test('garbage bytes from the server fail every pending call; the process survives', async (t) => {
  const cases: Array<[string, Buffer, string]> = [
    ['truncated header', Buffer.from([0, 0, 0, 2, 0x05, 0x00]), ErrorCode.MALFORMED_FRAME],
    ['bad varint', Buffer.from([0, 0, 0, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), ErrorCode.MALFORMED_FRAME],
    ['zero length prefix', Buffer.from([0, 0, 0, 0]), ErrorCode.MALFORMED_FRAME],
    ['header without call_id', Buffer.from([0, 0, 0, 4, 0x02, 0x10, 0x00, 0x00]), ErrorCode.MALFORMED_FRAME],
    ['trailing bytes', Buffer.from([0, 0, 0, 6, 0x02, 0x08, 0x00, 0x00, 0x99, 0x99]), ErrorCode.MALFORMED_FRAME],
    ['oversize prefix', Buffer.from([0x7f, 0xff, 0xff, 0xff]), ErrorCode.FRAME_TOO_LARGE]
  ]
  for (const [name, bytes, expected] of cases) {
    const { fake, client, calc } = await fakeWithClient(t)
    const pending = Array.from({ length: 5 }, (_, i) => settle(calc.Add({ x: i, y: i })))
    const peer = await fake.peer()
    await peer.callsReceived(5)
    peer.write(bytes)
    t.same(tally(await Promise.all(pending)), { [expected]: 5 }, `${name}: all five pending calls fail with ${expected}`)
    t.equal(client.pendingCalls, 0)
    await peer.closed
    t.pass(`${name}: the client dropped the connection`)
  }
})

t.test('a response for an unknown call id is ignored', async (t) => {
  const { fake, calc } = await fakeWithClient(t)
  const pending = calc.Add({ x: 20, y: 22 })
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respond(999, AddResponse, { result: 1 })
  peer.respond(-7, AddResponse, { result: 2 })
  peer.respondError(12345, KrpcCode.ERROR_APPLICATION, 'nobody asked')
  peer.respond(call.header.call_id, AddResponse, { result: 42 })
  t.same(await pending, { result: 42 })
  // A second answer for the call that already finished is ignored too.
  peer.respond(call.header.call_id, AddResponse, { result: 43 })
  const next = calc.Add({ x: 1, y: 1 })
  const call2 = await peer.nextCall()
  peer.respond(call2.header.call_id, AddResponse, { result: 2 })
  t.same(await next, { result: 2 })
  t.notOk(peer.isClosed)
})

t.test('response sidecars with offsets out of range are a malformed frame', async (t) => {
  const { fake, calc } = await fakeWithClient(t)
  const pending = settle(calc.Add({ x: 1, y: 1 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  // header: call_id, is_error false, sidecar_offsets [50] but the body is 2 bytes.
  const header = Buffer.from([0x08, call.header.call_id, 0x10, 0x00, 0x18, 50])
  const body = Buffer.from([0x08, 0x02])
  const frame = Buffer.concat([Buffer.alloc(4), Buffer.from([header.length]), header, Buffer.from([body.length]), body])
  frame.writeUInt32BE(frame.length - 4, 0)
  peer.write(frame)
  t.equal(await pending, ErrorCode.MALFORMED_FRAME)
})

t.test('many error kinds at once settle each call exactly once', async (t) => {
  const probe = new Probe()
  const { endpoint } = await startServer(t, { handlers: probe.handlers() })
  const client = newClient(t, { endpoint })
  const outcomes = await Promise.all([
    settle(client.call(endpoint, calculatorDef, 'Add', { x: 1, y: 1 })),
    settle(client.call(endpoint, unknownService, 'Add', { x: 1, y: 1 })),
    settle(client.call(endpoint, unknownMethod, 'Nope', { x: 1, y: 1 })),
    settle(client.call(endpoint, calculatorDef, 'Add', { x: 1 })),
    settle(client.call(endpoint, calculatorDef, 'Sleep', { sleep_micros: 0, return_app_error: true })),
    settle(client.call(endpoint, calculatorDef, 'Add', { x: 1, y: 1 }, { requiredFeatureFlags: [5] }))
  ])
  t.same(outcomes, [
    'OK', 'REMOTE:ERROR_NO_SUCH_SERVICE', 'REMOTE:ERROR_NO_SUCH_METHOD', ErrorCode.INVALID_ARGUMENT,
    'REMOTE:ERROR_APPLICATION', 'REMOTE:ERROR_INVALID_REQUEST'
  ])
  t.equal(client.pendingCalls, 0)
})

t.test('a server without the APPLICATION_FEATURE_FLAGS RPC feature: flagged calls fail locally with NOT_SUPPORTED', async (t) => {
  const fake = await FakeServer.start({ features: [] })
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint })
  const calc = client.service(CalculatorService)
  // A call without flags works, and negotiation is now finished.
  const plain = calc.Add({ x: 1, y: 1 })
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respond(call.header.call_id, AddResponse, { result: 2 })
  t.same(await plain, { result: 2 })
  const error = await rejection(client.call(fake.endpoint, calculatorDef, 'Add', { x: 1, y: 1 }, { requiredFeatureFlags: [99] }))
  t.equal(error.code, ErrorCode.NOT_SUPPORTED)
  await turns(3)
  t.equal(peer.calls.length, 1, 'the flagged call was not sent')
  t.equal(client.pendingCalls, 0)
})

t.test('the first, flagged call on a connection to a server without APPLICATION_FEATURE_FLAGS fails with NOT_SUPPORTED', async (t) => {
  // Kudu checks the peer's RPC features when the call is about to be sent
  // (its reactor's ProcessOutboundTransfers), so a call made while the
  // connection negotiates is checked too (regression: it once was not).
  const fake = await FakeServer.start({ features: [] })
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint, defaultTimeoutMs: 2000 })
  const flagged = settle(client.call(fake.endpoint, calculatorDef, 'Add', { x: 1, y: 1 }, { requiredFeatureFlags: [99] }))
  const plain = client.service(CalculatorService).Add({ x: 2, y: 2 })
  const peer = await fake.peer()
  const first = await peer.nextCall()
  if (first.header.call_id === 0) peer.respond(0, AddResponse, { result: 2 })
  const second = first.header.call_id === 0 ? await peer.nextCall() : first
  peer.respond(second.header.call_id, AddResponse, { result: 4 })
  t.same(await plain, { result: 4 })
  t.equal(await flagged, ErrorCode.NOT_SUPPORTED)
  t.same(peer.calls.map(c => c.header.required_feature_flags ?? []).filter(f => f.length > 0), [], 'no flagged frame reached the server')
})

t.test('an ERROR_* answer fails one call and the connection is reused', async (t) => {
  const { fake, calc } = await fakeWithClient(t)
  const first = settle(calc.Add({ x: 1, y: 1 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respondError(call.header.call_id, KrpcCode.ERROR_SERVER_TOO_BUSY, 'busy')
  t.equal(await first, 'REMOTE:ERROR_SERVER_TOO_BUSY')
  const second = calc.Add({ x: 2, y: 2 })
  const call2 = await peer.nextCall()
  peer.respond(call2.header.call_id, AddResponse, { result: 4 })
  t.same(await second, { result: 4 })
  t.equal(fake.peers.length, 1)
})

t.test('after a FATAL_* answer the connection is not reused', async (t) => {
  // "FATAL_* means the connection must not be reused".
  const { fake, calc } = await fakeWithClient(t)
  const first = rejection(calc.Add({ x: 1, y: 1 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  peer.respondError(call.header.call_id, KrpcCode.FATAL_SERVER_SHUTTING_DOWN, 'going away')
  const error = await first
  t.equal(error.remote?.code, KrpcCode.FATAL_SERVER_SHUTTING_DOWN)
  t.ok(error.fatal, 'the error says the connection is done')
  const second = calc.Add({ x: 2, y: 2 }, { timeoutMs: 2000 })
  // Either a new connection appears, or (wrongly) the call arrives on the old one.
  const fresh = await Promise.race([fake.peer(1), peer.nextCall().then(() => null, () => new Promise<never>(() => {}))])
  t.not(fresh, null, 'the next call opened a new connection')
  if (fresh !== null) {
    const call2 = await fresh.nextCall()
    fresh.respond(call2.header.call_id, AddResponse, { result: 4 })
  } else {
    peer.respond(peer.calls[1]!.header.call_id, AddResponse, { result: 4 })
  }
  t.same(await second, { result: 4 })
  await peer.closed
  t.pass('the retired connection was closed')
})

t.test('close() fails the calls still pending on a connection retired by a FATAL_* answer', async (t) => {
  const { fake, client, calc } = await fakeWithClient(t)
  const first = rejection(calc.Add({ x: 1, y: 1 }))
  const second = rejection(calc.Add({ x: 2, y: 2 }))
  const peer = await fake.peer()
  const call = await peer.nextCall()
  await peer.nextCall()
  peer.respondError(call.header.call_id, KrpcCode.FATAL_SERVER_SHUTTING_DOWN, 'going away')
  t.equal((await first).remote?.code, KrpcCode.FATAL_SERVER_SHUTTING_DOWN)
  t.equal(client.pendingCalls, 1, 'the retired connection still has the second call')
  client.close()
  t.equal((await second).code, ErrorCode.CLIENT_CLOSED)
  t.equal(client.pendingCalls, 0)
  await peer.closed
})

// Flat messages are measured with one read of each field and written from
// what was read: a getter that changes, throws or calls again cannot make a
// frame longer or shorter than its room, nor leave a call behind.
t.test('a request whose getters change, throw or call again: the call settles cleanly, frames stay whole', async (t) => {
  const { endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  t.equal((await calc.Add({ x: 1, y: 2 })).result, 3)
  // Each field is read once, and what was read is sent.
  let reads = 0
  t.equal((await calc.Add({ get x () { return reads++ === 0 ? 1 : 2 ** 30 }, y: 1 })).result, 2)
  t.equal(reads, 1, 'x was read once')
  // A getter that throws: the call fails with its error and leaves nothing pending.
  const error = await calc.Add({ get x (): number { throw new Error('gone') }, y: 1 }).then(() => null, (e: Error) => e)
  t.match(error?.message, /gone/)
  t.equal(client.pendingCalls, 0, 'nothing left pending')
  // A getter that makes another call on the same connection while measured.
  let inner: Promise<{ result: number }> | null = null
  const outer = calc.Add({ get x () { inner ??= calc.Add({ x: 100, y: 1 }); return 5 }, y: 1 })
  t.same([(await outer).result, (await inner!).result], [6, 101])
  t.same(tally(await Promise.all([1, 2, 3].map((x) => settle(calc.Add({ x, y: 1 }))))), { OK: 3 })
})

t.test('a response whose getter throws when measured → ERROR_APPLICATION; the connection stays usable', async (t) => {
  const { endpoint } = await startServer(t, {
    handlers: {
      ...calculatorHandlers,
      Add: (request) => request.x === 7
        ? { get result (): number { throw new Error('gone') } } as unknown as { result: number }
        : { result: request.x + request.y }
    }
  })
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const error = await rejection(calc.Add({ x: 7, y: 1 }))
  t.equal(error.remote?.code, KrpcCode.ERROR_APPLICATION)
  t.match(error.message, /gone/)
  t.same(tally(await Promise.all([1, 2, 3].map((x) => settle(calc.Add({ x, y: 1 }))))), { OK: 3 })
})
