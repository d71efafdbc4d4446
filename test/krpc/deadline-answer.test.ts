// A handler that gives up when its call's deadline passes (it rejects with
// ctx.signal's reason) is not answered on KRPC: the client set that deadline
// and has given up by then, so it reports its own timeout, as it would
// against a Kudu server whose handler answers after the client gave up. An
// answer at the deadline would race the client's timer, and the Kudu Java
// client surfaces whichever comes first (a remote error, or "Service
// unavailable" for ERROR_SERVER_TOO_BUSY outside a tablet), not its TimedOut.
// Calls that expire while queued keep Kudu's ERROR_SERVER_TOO_BUSY answer.
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ErrorStatusType } from '../../codec/krpc/frames.js'
import type { SleepResponse } from '../../examples/calculator/index.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CalculatorService, calculatorHandlers, newClient, rejection, startServer, turns } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'

const SERVICE = CalculatorService.fullName
const SleepRequest = CalculatorService.methods.Sleep.requestType
const AddRequest = CalculatorService.methods.Add.requestType
const AddResponse = CalculatorService.methods.Add.responseType

// Sleep waits for its signal and gives up with the signal's reason.
const givesUp = {
  ...calculatorHandlers,
  Sleep: (_req: unknown, ctx: { signal: AbortSignal }) => new Promise<SleepResponse>((_resolve, reject) => {
    ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true })
  })
}

async function until (condition: () => boolean, what: string): Promise<void> {
  for (let i = 0; !condition(); i++) {
    if (i >= 20_000) throw new Error(`gave up waiting for ${what}`)
    await turns(1)
  }
}

// A Sleep (300 ms timeout) that gives up at its deadline once `clock` moves
// by `advanceMs`, then an Add on the same connection: returns the raw client
// and the Add's answer, the first one the connection gets.
async function sleepThenAdd (t: Test, clock: FakeClock, advanceMs: number) {
  const { server, port } = await startServer(t, { clock, handlers: givesUp })
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  raw.write(clientHandshakeBytes())
  raw.write(requestFrame(1, SERVICE, 'Sleep', SleepRequest.encode({ sleep_micros: 1_500_000 }), { timeoutMs: 300 }))
  await until(() => server.stats().callsInFlight === 1, 'the Sleep call running')
  clock.advance(advanceMs)
  await until(() => server.stats().callsInFlight === 0, 'the Sleep call released')
  raw.write(requestFrame(2, SERVICE, 'Add', AddRequest.encode({ x: 2, y: 3 })))
  return { raw, next: await raw.nextResponse() }
}

t.test('KRPC: a handler that gives up at its deadline sends nothing for that call id; the connection goes on', async (t) => {
  const { raw, next } = await sleepThenAdd(t, new FakeClock(), 300)
  t.equal(next.header.call_id, 2, 'the first answer on the connection is the Add\'s')
  t.notOk(next.header.is_error)
  t.same(AddResponse.decode(next.message), { result: 5 })
  t.same(raw.frames.filter(f => f.header.call_id === 1), [], 'nothing was sent for the Sleep')
  t.notOk(raw.isClosed, 'the connection stays open')
})

t.test('KRPC: a call whose deadline passes in the queue is still answered ERROR_SERVER_TOO_BUSY, "Timed out"', async (t) => {
  const clock = new FakeClock()
  let release: (() => void) | undefined
  const handlers = {
    ...calculatorHandlers,
    Sleep: () => new Promise<SleepResponse>((resolve) => { release = () => resolve({}) })
  }
  const { server, port } = await startServer(t, { clock, handlers, workers: 1 })
  t.teardown(() => release?.())
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  raw.write(clientHandshakeBytes())
  raw.write(requestFrame(1, SERVICE, 'Sleep', SleepRequest.encode({ sleep_micros: 0 })))
  await until(() => release !== undefined, 'the worker busy')
  raw.write(requestFrame(2, SERVICE, 'Sleep', SleepRequest.encode({ sleep_micros: 0 }), { timeoutMs: 300 }))
  await until(() => server.stats().callsInFlight === 2, 'the second call queued')
  clock.advance(301)
  release!()
  const answers = [await raw.nextResponse(), await raw.nextResponse()]
  const expired = answers.find(f => f.header.call_id === 2)!
  t.equal(expired.header.is_error, true)
  const status = ErrorStatusType.decode(expired.message)
  if (status instanceof RpcError) throw status
  t.equal(status.code, 4, 'ERROR_SERVER_TOO_BUSY')
  t.match(status.message, /^Timed out: .*waited in the queue past client deadline/)
})

t.test('the nyala client reports RPC_ERR_DEADLINE_EXCEEDED for a handler that gives up at the deadline', async (t) => {
  const clock = new FakeClock()
  const { server, endpoint } = await startServer(t, { clock, handlers: givesUp })
  const client = newClient(t, { endpoint, clock })
  const calls = Array.from({ length: 5 }, () => rejection(client.service(CalculatorService).Sleep({ sleep_micros: 1_500_000 }, { timeoutMs: 300 })))
  await until(() => server.stats().callsInFlight === 5, 'five calls running')
  clock.advance(300)
  const errors = await Promise.all(calls)
  t.same(errors.map(e => e.code), Array(5).fill(ErrorCode.DEADLINE_EXCEEDED), 'five calls, five deadline errors')
  await until(() => server.stats().callsInFlight === 0, 'every call released')
  t.same(await client.service(CalculatorService).Add({ x: 1, y: 2 }), { result: 3 }, 'the connection still serves')
})

// Node's timers may fire a fraction of a millisecond before the clock's
// reading reaches the deadline: the signal's own reason decides, not the clock.
class EarlyTimers extends FakeClock {
  override setTimer (callback: () => void, ms: number): ReturnType<FakeClock['setTimer']> {
    return super.setTimer(callback, ms - 0.5)
  }
}

t.test('KRPC: the deadline abort that fires just before the clock reaches the deadline is still the deadline', async (t) => {
  const { next } = await sleepThenAdd(t, new EarlyTimers(), 299.5)
  t.equal(next.header.call_id, 2, 'nothing was sent for the Sleep')
})
