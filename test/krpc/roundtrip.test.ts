// Behaviours 1, 2 and 24 of Kudu's rpc-test list: round trips and call-id
// multiplexing on one reused connection, frame reassembly under short reads
// and pipelining, and connection reuse keyed by endpoint and credentials.
import t from 'tap'
import { type RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { Client } from '../../reactor/krpc/client.js'
import {
  CalculatorService, Probe, calculatorHandlers, crc32, newClient, settle, startServer, tally
} from '../helpers/reactor-harness.js'
import { FakeServer, RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const AddRequest = CalculatorService.methods.Add.requestType
const AddResponse = CalculatorService.methods.Add.responseType

t.test('sequential and concurrent calls share one connection', async (t) => {
  const { server, endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)

  t.same(await calc.Add({ x: 1, y: 2 }, { timeoutMs: 1000 }), { result: 3 })
  t.same(await calc.Echo({ data: 'hello, krpc' }), { data: 'hello, krpc' })
  for (let i = 0; i < 10; i++) t.equal((await calc.Add({ x: i, y: 100 })).result, i + 100)

  const concurrent = await Promise.all(Array.from({ length: 50 }, (_, i) => calc.Add({ x: i, y: i })))
  t.same(concurrent.map(r => r.result), Array.from({ length: 50 }, (_, i) => 2 * i), 'each answer matches its own request')
  // uint32 wrap, as the demo handler specifies
  t.equal((await calc.Add({ x: 0xffffffff, y: 2 })).result, 1)

  t.equal(client.connectionCount, 1, 'one connection for every call')
  t.equal(server.stats().connectionsAccepted, 1)
  t.equal(client.pendingCalls, 0)
})

t.test('call ids start at 0 and increase per connection (seen by a raw server)', async (t) => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint })
  const calc = client.service(CalculatorService)
  const answered = (async () => {
    const peer = await fake.peer(0)
    for (let i = 0; i < 10; i++) {
      const call = await peer.nextCall()
      const req = AddRequest.decode(call.message)
      if (req instanceof Error) throw req
      peer.respond(call.header.call_id, AddResponse, { result: req.x + req.y })
    }
  })()
  for (let i = 0; i < 10; i++) t.equal((await calc.Add({ x: i, y: 1 })).result, i + 1)
  await answered
  const peer = fake.peers[0]!
  t.same(peer.calls.map(c => c.header.call_id), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
  t.same(peer.calls.map(c => c.header.remote_method), Array(10).fill({ service_name: SERVICE, method_name: 'Add' }))
  t.equal(fake.peers.length, 1, 'one connection')
})

t.test('call ids as the server sees them: 0..9 on each fresh connection', async (t) => {
  const probe = new Probe()
  const { endpoint } = await startServer(t, { handlers: probe.handlers() })
  for (const user of ['first', 'second']) {
    const client = newClient(t, { endpoint, user })
    const calc = client.service(CalculatorService)
    for (let i = 0; i < 10; i++) await calc.Add({ x: i, y: i })
  }
  t.same(probe.calls.map(c => c.callId), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
  t.same([...new Set(probe.calls.map(c => c.user))], ['first', 'second'], 'the negotiated SASL user reaches the handler')
})

t.test('responses are matched by call id when the server answers out of order', async (t) => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint })
  const calc = client.service(CalculatorService)
  const N = 8
  const results = Array.from({ length: N }, (_, i) => calc.Add({ x: i, y: 1000 }))
  const peer = await fake.peer(0)
  await peer.callsReceived(N)
  // Answer in reverse order; each answer carries x + y of its own request.
  for (const call of [...peer.calls].reverse()) {
    const req = AddRequest.decode(call.message)
    if (req instanceof Error) throw req
    peer.respond(call.header.call_id, AddResponse, { result: req.x + req.y })
  }
  t.same((await Promise.all(results)).map(r => r.result), Array.from({ length: N }, (_, i) => i + 1000))
})

t.test('a real server answers Sleeps of different lengths out of order', async (t) => {
  const { endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const order: string[] = []
  const tagged = (name: string, p: Promise<unknown>): Promise<void> => p.then(() => { order.push(name) })
  await Promise.all([
    tagged('sleep60', calc.Sleep({ sleep_micros: 60_000 })),
    tagged('sleep30', calc.Sleep({ sleep_micros: 30_000 })),
    tagged('add', calc.Add({ x: 2, y: 3 }).then((r) => t.equal(r.result, 5)))
  ])
  t.same(order, ['add', 'sleep30', 'sleep60'], 'completion order follows the server, not the send order')
  t.equal(client.connectionCount, 1)
})

t.test('1,000 pipelined Adds on one connection get 1,000 answers', async (t) => {
  const { server, endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  const N = 1000
  const outcomes = await Promise.all(Array.from({ length: N }, (_, i) =>
    calc.Add({ x: i, y: 7 }).then((r) => r.result === i + 7 ? 'OK' : `WRONG:${i}:${r.result}`, (e: Error) => e.message)))
  t.same(tally(outcomes), { OK: N })
  t.equal(server.stats().connectionsAccepted, 1)
  t.equal(server.stats().callsSucceeded, N)
  t.equal(client.pendingCalls, 0)
})

t.test('the server reassembles a connection written one byte at a time', async (t) => {
  const { server, port } = await startServer(t)
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  const bytes = Buffer.concat([
    clientHandshakeBytes('bytewise'),
    requestFrame(0, SERVICE, 'Add', AddRequest.encode({ x: 20, y: 22 }), { timeoutMs: 10_000 })
  ])
  await raw.writeByteByByte(bytes)
  const response = await raw.nextResponse()
  t.equal(response.header.call_id, 0)
  t.equal(response.header.is_error, false)
  t.same(AddResponse.decode(response.message), { result: 42 })
  t.equal(server.stats().badFrames, 0)
  t.notOk(raw.isClosed)
})

t.test('many frames in one write (handshake included) are all answered, in one read or many', async (t) => {
  const { server, port } = await startServer(t)
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  const N = 50
  const frames = Array.from({ length: N }, (_, i) => requestFrame(i, SERVICE, 'Add', AddRequest.encode({ x: i, y: 1 })))
  // The calls ride in the same write as the negotiation, behind the ConnectionContext.
  raw.write(Buffer.concat([clientHandshakeBytes(), ...frames]))
  const seen = new Map<number, number>()
  for (let i = 0; i < N; i++) {
    const response = await raw.nextResponse()
    const decoded = AddResponse.decode(response.message)
    if (decoded instanceof Error) throw decoded
    seen.set(response.header.call_id, decoded.result)
  }
  t.equal(seen.size, N)
  for (let i = 0; i < N; i++) t.equal(seen.get(i), i + 1, `call ${i}`)
  t.equal(server.stats().callsSucceeded, N)
  t.equal(raw.parseError, null)
})

t.test('a 300 KiB frame whose length prefix is split across reads, then a small frame, both parse', async (t) => {
  // A large frame followed by a small one, in two writes that cut the large frame's
  // length prefix in half: the server must keep the partial prefix across reads.
  const { server, port } = await startServer(t)
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  const big = Buffer.alloc(300 * 1024, 0x61)
  const all = Buffer.concat([
    clientHandshakeBytes(),
    requestFrame(0, SERVICE, 'PushStrings', CalculatorService.methods.PushStrings.requestType.encode({ sidecar_indexes: [0] }), { sidecars: [big] }),
    requestFrame(1, SERVICE, 'Add', AddRequest.encode({ x: 1, y: 1 }))
  ])
  const cut = clientHandshakeBytes().length + 2
  raw.write(all.subarray(0, cut))
  await new Promise<void>((resolve) => setImmediate(resolve))
  raw.write(all.subarray(cut))
  const first = await raw.nextResponse()
  const second = await raw.nextResponse()
  t.same([first.header.call_id, second.header.call_id].sort(), [0, 1])
  const push = first.header.call_id === 0 ? first : second
  t.same(CalculatorService.methods.PushStrings.responseType.decode(push.message), { sizes: [big.length], crcs: [crc32(big)] })
  t.equal(server.stats().badFrames, 0)
})

t.test('connections are reused per endpoint and per client', async (t) => {
  const a = await startServer(t)
  const b = await startServer(t)
  const client = newClient(t)
  const calcA = client.service(CalculatorService, a.endpoint)
  const calcB = client.service(CalculatorService, { host: '127.0.0.1', port: b.port })
  await Promise.all([calcA.Add({ x: 1, y: 1 }), calcA.Add({ x: 2, y: 2 }), calcB.Add({ x: 3, y: 3 }), calcB.Add({ x: 4, y: 4 })])
  t.equal(client.connectionCount, 2, 'one connection per endpoint')
  t.equal(a.server.stats().connectionsAccepted, 1)
  t.equal(b.server.stats().connectionsAccepted, 1)

  // Another client (other credentials) gets its own connection.
  const other = new Client({ endpoint: a.endpoint, user: 'someone-else' })
  t.teardown(() => other.close())
  await other.service(CalculatorService).Add({ x: 5, y: 5 })
  t.equal(a.server.stats().connectionsAccepted, 2)
})

t.test('after its connection fails, the next call opens a new one', async (t) => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const client = newClient(t, { endpoint: fake.endpoint })
  const calc = client.service(CalculatorService)
  const first = settle(calc.Add({ x: 1, y: 1 }))
  const peer0 = await fake.peer(0)
  await peer0.nextCall()
  peer0.socket.destroy()
  t.equal(await first, 'RPC_ERR_CONNECTION_CLOSED')
  const second = calc.Add({ x: 2, y: 2 })
  const peer1 = await fake.peer(1)
  const call = await peer1.nextCall()
  t.equal(call.header.call_id, 0, 'call ids restart on the new connection')
  peer1.respond(call.header.call_id, AddResponse, { result: 4 })
  t.same(await second, { result: 4 })
  t.equal(fake.peers.length, 2)
})

t.test('routes stay right as services are added, and with names too long to cache', async (t) => {
  const { server, endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  t.equal((await calc.Add({ x: 1, y: 2 })).result, 3)
  const longName = `pkg.${'L'.repeat(300)}`
  const longDef = { fullName: longName, methods: CalculatorService.methods } as unknown as typeof CalculatorService
  const refused = await client.service(longDef).Add({ x: 1, y: 1 }).then(() => null, (error: RpcError) => error)
  t.equal(refused?.remote?.code, KrpcCode.ERROR_NO_SUCH_SERVICE, 'not registered yet')
  // Registered after calls were routed: the route cache must not hide it.
  server.addService(longDef, { ...calculatorHandlers, Add: (request) => ({ result: request.x * 10 + request.y }) })
  const long = client.service(longDef)
  for (let i = 0; i < 3; i++) t.equal((await long.Add({ x: 4, y: i })).result, 40 + i, 'the long-named service answers')
  for (let i = 0; i < 3; i++) t.equal((await calc.Add({ x: 4, y: i })).result, 4 + i, 'the first service still answers')
})
