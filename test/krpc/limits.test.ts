// KRPC's own limits: the negotiation frame and user name a KRPC peer may send, the demo Sleep ending at its timeout_millis, an abandoned call's KRPC status.
// The generic limits (connections, frames, inbound and outbound budgets, abandoned handlers, connection age) are tested in test/reactor/limits.test.ts.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CalculatorService, calculatorHandlers, newClient, startServer, type Running } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, negotiatedRaw as negotiated, requestFrame, untilReady as until } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName

async function stillServes (t: Test, running: Running): Promise<void> {
  const client = newClient(t, { endpoint: running.endpoint })
  t.same(await client.service(CalculatorService).Add({ x: 40, y: 2 }), { result: 42 }, 'a normal client is served')
  client.close()
}

t.test('a 40 MiB negotiation frame is refused at its prefix; a 300-byte user name gets FATAL_UNAUTHORIZED', async (t) => {
  const running = await startServer(t)
  const raw = await RawClient.connect(running.port)
  const handshake = clientHandshakeBytes()
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(40 * 1024 * 1024)
  // The preamble (7 bytes), then a SASL_INITIATE announcing 40 MiB and 64 KiB of it.
  raw.write(Buffer.concat([handshake.subarray(0, 7), prefix, Buffer.alloc(64 * 1024)]))
  await raw.closed
  t.equal(raw.bytesReceived, 0, 'closed without an answer')

  const long = newClient(t, { endpoint: running.endpoint, user: 'u'.repeat(300) })
  const error = await long.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }).then(() => null, (e: unknown) => e as RpcError)
  t.equal(error?.code, ErrorCode.NEGOTIATION_FAILED)
  t.equal(error?.remote?.code, KrpcCode.FATAL_UNAUTHORIZED)
  long.close()
  const ok = newClient(t, { endpoint: running.endpoint, user: 'u'.repeat(256) })
  t.same(await ok.service(CalculatorService).Add({ x: 1, y: 2 }), { result: 3 }, 'a 256-byte user name is accepted')
  ok.close()
})

t.test('the demo Sleep ends at its deadline: stuck sleeps do not lock out a good Add', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, { clock, workers: 10, queueLength: 0 })
  const raw = await negotiated(running.port)
  const sleeps: Buffer[] = []
  for (let i = 0; i < 10; i++) sleeps.push(requestFrame(i, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 20_000_000 }), { timeoutMs: 100 }))
  raw.write(Buffer.concat(sleeps))
  await until(() => running.server.stats().callsInFlight === 10)
  raw.close()
  clock.advance(100)
  await until(() => running.server.stats().callsInFlight === 0)
  t.equal(running.server.stats().callsInFlight, 0, 'every Sleep ended with its deadline')
  await stillServes(t, running)
})

t.test('the error status of an abandoned call names the abandonment', async (t) => {
  const clock = new FakeClock()
  const running = await startServer(t, {
    clock, workers: 1, abandonAfterMs: 500,
    handlers: { ...calculatorHandlers, Sleep: () => new Promise(() => {}) }
  })
  const raw = await negotiated(running.port)
  raw.write(requestFrame(0, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 1 }), { timeoutMs: 100 }))
  await until(() => running.server.stats().callsInFlight === 1)
  clock.advance(1000)
  const answer = await raw.nextResponse()
  const status = ErrorStatusType.decode(answer.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, KrpcCode.ERROR_APPLICATION)
  t.match(status.message, /abandoned/)
  raw.close()
})
