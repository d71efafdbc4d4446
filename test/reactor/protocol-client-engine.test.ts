// What the generic client gained as the one engine under KRPC's Client:
// the callback form, per-call protocol data, retiring a connection after a
// fatal remote error, and the warning when the retry budget refuses
// retries. Against raw node:net servers speaking the toy `tagged`
// protocol; outcomes are counted, no duration is asserted.
import t, { type Test } from 'tap'
import { createServer, type Socket } from 'node:net'
import { once } from 'node:events'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { RetryBudget } from '../../scheduling/retry.js'
import { FakeClock } from '../../scheduling/clock.js'
import { ProtocolClient } from '../../reactor/protocol-client.js'
import { taggedClientProtocol, type ToyRequest } from '../helpers/toy-client-protocols.js'

/** A raw `tagged` server: each request is answered by `answer(payload)` (status and text), with its id. Counts connections. */
async function taggedServer (t: Test, answer: (payload: string) => { status: number, text: string }): Promise<{ port: number, connections: () => number }> {
  const sockets: Socket[] = []
  const server = createServer((socket) => {
    sockets.push(socket)
    socket.on('error', () => {})
    let held = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      held = Buffer.concat([held, chunk])
      while (held.length >= 2 && held.length >= 2 + held.readUInt16BE(0)) {
        const end = 2 + held.readUInt16BE(0)
        const id = held.readUInt32BE(3)
        const { status, text } = answer(held.toString('utf8', 7, end))
        held = held.subarray(end)
        const body = Buffer.from(text)
        const out = Buffer.alloc(7 + body.length)
        out.writeUInt16BE(5 + body.length, 0)
        out[2] = status
        out.writeUInt32BE(id, 3)
        body.copy(out, 7)
        socket.write(out)
      }
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    for (const s of sockets) s.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return { port: (server.address() as { port: number }).port, connections: () => sockets.length }
}

const echo = (payload: string): { status: number, text: string } => ({ status: 0, text: payload })

t.test('the callback form: N calls, N callbacks, none before its call returns; a closed client answers from setImmediate', async (t) => {
  const { port } = await taggedServer(t, echo)
  const client = new ProtocolClient(taggedClientProtocol(), { endpoint: `127.0.0.1:${port}` })
  t.teardown(() => client.close())
  const N = 20
  const seen: string[] = []
  let returned = 0
  let early = 0
  await new Promise<void>((resolve) => {
    for (let i = 0; i < N; i++) {
      const before = returned
      client.call({ route: 'echo', payload: `p${i}` }, {}, (error, response) => {
        if (returned === before) early++
        seen.push(error === null ? response! : error.code)
        if (seen.length === N) resolve()
      })
      returned++
    }
  })
  t.equal(early, 0, 'no callback ran before its call returned')
  t.same([...seen].sort(), Array.from({ length: N }, (_, i) => `p${i}`).sort(), 'every call answered once, with its own payload')
  await client.close()
  let closedReturned = false
  const error = await new Promise<RpcError | null>((resolve) => {
    client.call({ route: 'echo', payload: 'late' }, {}, (err) => {
      t.ok(closedReturned, 'the closed client\'s callback came after call() returned')
      resolve(err)
    })
    closedReturned = true
  })
  t.equal(error?.code, ErrorCode.CLIENT_CLOSED)
})

t.test('per-call protocol data reaches the encoder and the decoder', async (t) => {
  const { port } = await taggedServer(t, echo)
  const base = taggedClientProtocol()
  const seenData: unknown[] = []
  const protocol: ClientProtocol<ToyRequest, string> = {
    ...base,
    encode: (request, id, out, data) => {
      seenData.push(data)
      base.encode(request, id, out)
    },
    decodeAnswer: (request, buf, start, end, data) => {
      const text = base.decodeAnswer(request, buf, start, end)
      return typeof text === 'string' && data === 'upper' ? text.toUpperCase() : text
    }
  }
  const client = new ProtocolClient(protocol, { endpoint: `127.0.0.1:${port}` })
  t.teardown(() => client.close())
  t.equal(await client.call({ route: 'echo', payload: 'abc' }, { data: 'upper' }), 'ABC')
  t.equal(await client.call({ route: 'echo', payload: 'abc' }), 'abc')
  t.same(seenData, ['upper', undefined])
})

t.test('a fatal remote error retires its connection: the next call opens another, the retired one closes once idle', async (t) => {
  const { port, connections } = await taggedServer(t, (payload) => payload === 'fatal' ? { status: 8, text: 'go away' } : echo(payload))
  const base = taggedClientProtocol()
  // Status 8 ('failed') is fatal here: the connection must not be reused.
  const protocol: ClientProtocol<ToyRequest, string> = {
    ...base,
    decodeAnswer: (request, buf, start, end) => {
      const result = base.decodeAnswer(request, buf, start, end)
      return result instanceof RpcError && result.remote?.code === 8
        ? new RpcError(ErrorCode.REMOTE, result.message, { remote: { ...result.remote, fatal: true } })
        : result
    }
  }
  const client = new ProtocolClient(protocol, { endpoint: `127.0.0.1:${port}`, retry: false, logger: null })
  t.teardown(() => client.close())
  const closes: string[] = []
  client.onConnectionClose((info) => closes.push(info.error.code))
  t.equal(await client.call({ route: 'echo', payload: 'one' }), 'one')
  const error = await client.call({ route: 'echo', payload: 'fatal' }).catch((err: RpcError) => err)
  t.equal((error as RpcError).remote?.fatal, true, 'the call fails with the fatal error')
  t.equal(await client.call({ route: 'echo', payload: 'two' }), 'two', 'the next call works')
  t.equal(connections(), 2, 'on a second connection')
  t.same(closes, [ErrorCode.CONNECTION_CLOSED], 'the retired connection closed, having no call left')
  t.equal(client.stats().connections.length, 1)
})

t.test('a retry budget that refuses retries is logged, rate-limited, and each refused call counts as exhausted', async (t) => {
  const { port } = await taggedServer(t, () => ({ status: 1, text: 'busy now' }))
  const clock = new FakeClock()
  const warnings: string[] = []
  const logger = { warn: (message: string) => { warnings.push(message) }, error: () => {}, info: () => {}, debug: () => {} }
  const client = new ProtocolClient(taggedClientProtocol(), {
    endpoint: `127.0.0.1:${port}`,
    clock,
    logger,
    retry: { budget: new RetryBudget(clock, { ratio: 0, minRetriesPerSecond: 0 }) }
  })
  t.teardown(() => client.close())
  const N = 5
  const codes = await Promise.all(Array.from({ length: N }, async () => await client.call({ route: 'echo', payload: 'x' }).then(() => 'ok', (err: RpcError) => err.codeName)))
  t.same(codes, Array(N).fill('busy'), 'every call fails with its own busy answer')
  t.equal(client.stats().exhausted, N)
  t.equal(client.stats().retries, 0)
  t.equal(warnings.length, 1, 'one warning for the lot')
  t.match(warnings[0], /retry budget spent: tagged call fails without retrying \(busy\)/)
})
