// close() answers the requests that arrived before it: the rest of the
// read it was called in and what waits in the kernel's receive buffer are
// answered as usual, once each, before the connections end.
import t from 'tap'
import { CalculatorService, calculatorHandlers, startServer, turns } from '../helpers/reactor-harness.js'
import { RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'
import type { KrpcServer } from '../../reactor/krpc/server.js'

const SERVICE = CalculatorService.fullName
const AddRequest = CalculatorService.methods.Add.requestType

async function until (ready: () => boolean, limit = 2000): Promise<boolean> {
  for (let i = 0; i < limit; i++) {
    if (ready()) return true
    await turns(1)
  }
  return ready()
}

t.test('pipelined requests, close() called as the first of them is handled: the rest of that read answered normally', async (t) => {
  const count = 40
  let server: KrpcServer | null = null
  let closing: Promise<void> | null = null
  const running = await startServer(t, {
    workers: 10,
    queueLength: 1000,
    handlers: {
      ...calculatorHandlers,
      // The first call closes the server, in the turn its bytes (and those behind them) arrived.
      Add: (req, ctx) => {
        closing ??= server!.close({ graceMs: 10_000 })
        return calculatorHandlers.Add(req, ctx)
      }
    }
  })
  server = running.server
  const raw = await RawClient.connect(running.port)
  raw.socket.setNoDelay(true)
  raw.write(clientHandshakeBytes())
  await until(() => raw.frames.length >= 2 || raw.isClosed)
  const frames: Buffer[] = []
  for (let i = 0; i < count; i++) frames.push(requestFrame(i, SERVICE, 'Add', AddRequest.encode({ x: i, y: 1 })))
  // One write of under 4 KiB (one read, the smallest read buffer): all of it had arrived when close() began.
  t.ok(frames.reduce((n, f) => n + f.length, 0) < 4096)
  raw.write(Buffer.concat(frames))
  await raw.closed
  await closing
  const answers = new Map<number, number>()
  let errors = 0
  for (const f of raw.frames) {
    if (f.header.call_id < 0) continue
    answers.set(f.header.call_id, (answers.get(f.header.call_id) ?? 0) + 1)
    if (f.header.is_error === true) errors++
  }
  t.ok(closing !== null, 'close() was called by the first call')
  t.equal(answers.size, count, 'every request answered')
  t.ok([...answers.values()].every(n => n === 1), 'each once')
  t.equal(errors, 0, 'normally, none refused shutdown')
})

t.test('requests still in the kernel when the server drains are read and answered shutdown, not dropped', async (t) => {
  const count = 200
  let release: () => void = () => {}
  const blocked = new Promise<void>((resolve) => { release = resolve })
  const running = await startServer(t, {
    abandonAfterMs: 0,
    handlers: { ...calculatorHandlers, Sleep: async () => { await blocked; return {} } }
  })
  const raw = await RawClient.connect(running.port)
  raw.socket.setNoDelay(true)
  raw.write(clientHandshakeBytes())
  await until(() => raw.frames.length >= 2 || raw.isClosed)
  raw.write(requestFrame(0, SERVICE, 'Sleep', CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: 1 })))
  await until(() => running.server.stats().callsInFlight === 1)
  const closing = running.server.close({ graceMs: 10_000 })
  // The last call in flight is answered, and in the same turn more requests are sent: the server is draining.
  release()
  const frames: Buffer[] = []
  for (let i = 1; i <= count; i++) frames.push(requestFrame(i, SERVICE, 'Add', AddRequest.encode({ x: i, y: 1 })))
  raw.write(Buffer.concat(frames))
  await raw.closed
  await closing
  const answers = new Map<number, number>()
  for (const f of raw.frames) if (f.header.call_id >= 0) answers.set(f.header.call_id, (answers.get(f.header.call_id) ?? 0) + 1)
  t.equal(answers.get(0), 1, 'the call in flight answered')
  t.equal(answers.size, count + 1, 'every request answered')
  t.ok([...answers.values()].every(n => n === 1), 'each once')
})
