/**
 * The callback form of a stub method (`calc.Add(request, [options,]
 * callback)`, Kudu's `Proxy::AsyncRequest`): every call ends in exactly one
 * callback, with the response or a typed error; a callback never runs before
 * the call that made it has returned, so chains that re-issue from their
 * callbacks cannot recurse; a throwing callback leaves the client whole and
 * surfaces as an uncaught exception (from setImmediate).
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { Client, type Callback } from '../../reactor/krpc/client.js'
import { FakeClock } from '../../scheduling/clock.js'
import { CLOSED_ENDPOINT, FakeServer } from '../helpers/krpc-peers.js'
import { CalculatorService, newClient, startServer, tally, turns } from '../helpers/reactor-harness.js'

type AddResponse = { result: number }

/** A callback that records how it was called, and whether the call that made it had returned by then. */
function recorder (): { callback: Callback<AddResponse>, calls: Array<{ error: RpcError | null, response: AddResponse | undefined, afterReturn: boolean }>, returned: () => void, done: Promise<void> } {
  const calls: Array<{ error: RpcError | null, response: AddResponse | undefined, afterReturn: boolean }> = []
  let hasReturned = false
  let resolve!: () => void
  const done = new Promise<void>((r) => { resolve = r })
  return {
    calls,
    callback: (error, response) => {
      calls.push({ error, response, afterReturn: hasReturned })
      resolve()
    },
    returned: () => { hasReturned = true },
    done
  }
}

t.test('100 pipelined callback calls: 100 callbacks, each with its own answer, once', async t => {
  const { endpoint } = await startServer(t)
  const calc = newClient(t, { endpoint }).service(CalculatorService)
  const seen = new Map<number, number>()
  await new Promise<void>((resolve, reject) => {
    let pending = 100
    for (let i = 0; i < 100; i++) {
      const result = calc.Add({ x: i, y: 1000 }, (error, response) => {
        if (error !== null) return reject(error)
        seen.set(i, (seen.get(i) ?? 0) + 1)
        if (response!.result !== i + 1000) reject(new Error(`Add(${i}) answered ${response!.result}`))
        if (--pending === 0) resolve()
      })
      t.equal(result, undefined, 'the callback form returns nothing')
    }
  })
  await turns(3)
  t.equal(seen.size, 100)
  t.ok([...seen.values()].every((n) => n === 1), 'each callback called exactly once')
})

t.test('options and a callback: the timeout applies, and the error is typed', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const clock = new FakeClock()
  const calc = newClient(t, { endpoint: fake.endpoint, clock }).service(CalculatorService)
  const r = recorder()
  calc.Add({ x: 1, y: 2 }, { timeoutMs: 500 }, r.callback)
  r.returned()
  const peer = await fake.peer()
  await peer.callsReceived(1)
  clock.advance(499)
  await turns(2)
  t.equal(r.calls.length, 0, 'not before the deadline')
  clock.advance(1)
  clock.runDeferred()
  await r.done
  t.equal(r.calls.length, 1)
  t.equal(r.calls[0]!.error?.code, ErrorCode.DEADLINE_EXCEEDED)
  t.equal(r.calls[0]!.response, undefined)
})

t.test('a remote error reaches the callback as an RpcError with its KRPC code', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const calc = newClient(t, { endpoint: fake.endpoint }).service(CalculatorService)
  const r = recorder()
  calc.Add({ x: 1, y: 2 }, r.callback)
  r.returned()
  const peer = await fake.peer()
  await peer.callsReceived(1)
  peer.respondError(peer.calls[0]!.header.call_id, 2 /* ERROR_NO_SUCH_SERVICE */, 'no such service')
  await r.done
  t.equal(r.calls[0]!.error?.code, ErrorCode.REMOTE)
  t.match(r.calls[0]!.error?.message, /no such service/)
})

t.test('calls that fail while they start are called back on a later tick, never inside the call', async t => {
  const { endpoint } = await startServer(t)
  // A closed client, a request the encoder refuses, an aborted signal.
  const closed = new Client({ endpoint })
  closed.close()
  const cases: Array<[string, (cb: Callback<AddResponse>) => void, string]> = [
    ['closed client', (cb) => closed.service(CalculatorService).Add({ x: 1, y: 1 }, cb), ErrorCode.CLIENT_CLOSED],
    ['missing required field', (cb) => newClient(t, { endpoint }).service(CalculatorService).Add({ x: 1 } as never, cb), ErrorCode.INVALID_ARGUMENT],
    ['aborted signal', (cb) => newClient(t, { endpoint }).service(CalculatorService).Add({ x: 1, y: 1 }, { signal: AbortSignal.abort() }, cb), ErrorCode.CANCELLED],
    ['nothing listening', (cb) => newClient(t, { endpoint: CLOSED_ENDPOINT }).service(CalculatorService).Add({ x: 1, y: 1 }, cb), ErrorCode.CONNECT_FAILED]
  ]
  for (const [name, make, code] of cases) {
    const r = recorder()
    make(r.callback)
    r.returned()
    await r.done
    t.equal(r.calls.length, 1, `${name}: one callback`)
    t.equal(r.calls[0]!.error?.code, code, `${name}: ${code}`)
    t.ok(r.calls[0]!.afterReturn, `${name}: after the call returned`)
  }
})

t.test('a chain that re-issues from its callback, even on a closed client, does not recurse', async t => {
  const { endpoint } = await startServer(t)
  const client = newClient(t, { endpoint })
  const calc = client.service(CalculatorService)
  let depth = 0
  let maxDepth = 0
  let answered = 0
  let failed = 0
  await new Promise<void>((resolve) => {
    const next = (error: RpcError | null): void => {
      if (error === null) answered++
      else failed++
      if (answered === 2000) client.close()
      if (failed >= 2000) return resolve()
      depth++
      maxDepth = Math.max(maxDepth, depth)
      calc.Add({ x: answered, y: 1 }, next)
      depth--
    }
    for (let i = 0; i < 10; i++) calc.Add({ x: i, y: 1 }, next)
  })
  t.ok(answered >= 2000, `${answered} answered before the close`)
  t.ok(failed >= 2000, `${failed} failures after it, each called back on its own tick`)
  t.ok(maxDepth <= 2, `re-issued calls nest at most one level deep (${maxDepth})`)
})

t.test('with retries on, the callback form goes through them', async t => {
  const { endpoint } = await startServer(t)
  const client = newClient(t, { endpoint, retry: {} })
  const calc = client.service(CalculatorService)
  const r = recorder()
  calc.Add({ x: 2, y: 3 }, r.callback)
  r.returned()
  await r.done
  t.same(r.calls.map((c) => [c.error, c.response]), [[null, { result: 5 }]])
  t.equal(client.retryStats?.retries, 0)
})

t.test('a callback that is not a function is a TypeError at once', async t => {
  const { endpoint } = await startServer(t)
  const calc = newClient(t, { endpoint }).service(CalculatorService)
  t.throws(() => (calc.Add as (...args: unknown[]) => unknown)({ x: 1, y: 1 }, {}, 'nope'), TypeError)
})

t.test('a throwing callback: an uncaught exception, the client and its other calls unharmed', async t => {
  // In a process of its own: the exception is meant to be uncaught.
  const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))
  const harness = fileURLToPath(new URL('../helpers/reactor-harness.ts', import.meta.url))
  const script = `
    const { Server } = await import(${JSON.stringify(fileURLToPath(new URL('../../reactor/krpc/server.ts', import.meta.url)))})
    const { Client } = await import(${JSON.stringify(fileURLToPath(new URL('../../reactor/krpc/client.ts', import.meta.url)))})
    const { CalculatorService, calculatorHandlers } = await import(${JSON.stringify(harness)})
    const server = new Server({}).addService(CalculatorService, calculatorHandlers)
    const { port } = await server.listen(0, '127.0.0.1')
    const client = new Client({ endpoint: '127.0.0.1:' + port })
    const calc = client.service(CalculatorService)
    let others = 0
    process.on('uncaughtException', (err) => {
      console.log('uncaught:' + err.message)
      // The calls made in the same read as the throwing one still end well.
      setTimeout(() => calc.Add({ x: 1, y: 1 }, (e, r) => { console.log('after:' + (e === null ? r.result : e.code) + ' others:' + others); client.close(); server.close() }), 50)
    })
    for (let i = 0; i < 20; i++) calc.Add({ x: i, y: 0 }, (e, r) => { if (i === 10) throw new Error('boom'); if (e === null && r.result === i) others++ })
  `
  const child = spawn(process.execPath, [...LOADER, '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
  t.teardown(() => { if (child.exitCode === null) child.kill('SIGKILL') })
  let out = ''
  let err = ''
  child.stdout!.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { err += d.toString() })
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
  t.equal(code, 0, err)
  t.match(out, /uncaught:boom/)
  t.match(out, /after:2 others:19/)
})

t.test('tallies: 200 callback calls against a server that answers half and then goes away', async t => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const calc = newClient(t, { endpoint: fake.endpoint }).service(CalculatorService)
  const outcomes: string[] = []
  const all = new Promise<void>((resolve) => {
    for (let i = 0; i < 200; i++) {
      calc.Add({ x: i, y: 0 }, (error) => {
        outcomes.push(error === null ? 'OK' : error.code)
        if (outcomes.length === 200) resolve()
      })
    }
  })
  const peer = await fake.peer()
  await peer.callsReceived(200)
  for (let i = 0; i < 100; i++) peer.respond(peer.calls[i]!.header.call_id, CalculatorService.methods.Add.responseType, { result: i })
  await turns(5)
  peer.socket.destroy()
  await all
  await turns(3)
  t.same(tally(outcomes), { OK: 100, [ErrorCode.CONNECTION_CLOSED]: 100 })
})

t.test('an endpoint net.connect cannot use fails the call once, in either form, and leaves nothing to time out', async t => {
  const clock = new FakeClock()
  const client = newClient(t, { clock })
  for (const endpoint of [{ host: '127.0.0.1', port: 70000 }, { host: '', port: 7050 }, { host: '127.0.0.1', port: 1.5 }]) {
    const calc = client.service(CalculatorService, endpoint)
    const r = recorder()
    calc.Add({ x: 1, y: 1 }, { timeoutMs: 100 }, r.callback)
    r.returned()
    await r.done
    await calc.Add({ x: 1, y: 1 }, { timeoutMs: 100 }).then(() => t.fail('answered'), (err: RpcError) => t.equal(err.code, ErrorCode.INVALID_ARGUMENT, `${JSON.stringify(endpoint)}: promise form`))
    clock.advance(1000)
    clock.runDeferred()
    await turns(3)
    t.equal(r.calls.length, 1, `${JSON.stringify(endpoint)}: one callback, no later timeout`)
    t.equal(r.calls[0]!.error?.code, ErrorCode.INVALID_ARGUMENT)
    t.ok(r.calls[0]!.afterReturn)
  }
  t.equal(client.pendingCalls, 0)
})
