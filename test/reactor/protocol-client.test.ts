// The generic client (reactor/protocol-client.ts) with the two toy
// protocols: against the generic ProtocolServer, and against raw node:net
// servers scripted to close mid-answer, send garbage, or never answer.
// Outcomes are counted by code; no duration is asserted.
import t, { type Test } from 'tap'
import { createServer, type Server, type Socket } from 'node:net'
import { once } from 'node:events'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { FakeClock } from '../../scheduling/clock.js'
import { ProtocolServer } from '../../reactor/server.js'
import { ProtocolClient, type ProtocolClientOptions } from '../../reactor/protocol-client.js'
import type { ClientProtocol } from '../../codec/client-protocol.js'
import type { ServerProtocol } from '../../codec/protocol.js'
import { linesProtocol, taggedProtocol } from '../helpers/toy-protocols.js'
import { linesClientProtocol, taggedClientProtocol, type ToyRequest } from '../helpers/toy-client-protocols.js'

async function toyServer (t: Test, kind: 'lines' | 'tagged'): Promise<{ port: number, server: ProtocolServer }> {
  const server = new ProtocolServer<unknown, unknown>(kind === 'lines' ? linesProtocol() as ServerProtocol : taggedProtocol() as ServerProtocol, { idleTimeoutMs: 0 })
  const handlers = kind === 'lines'
    ? { echo: (arg: string) => arg, fail: () => { throw new Error('it broke') } }
    : { echo: (arg: Buffer) => arg, fail: () => { throw new Error('it broke') } }
  server.addRoutes(kind, handlers as never)
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(async () => { await server.close({ graceMs: 100 }) })
  return { port, server }
}

/** A raw server: `onData` sees each connection's chunks. */
async function rawServer (t: Test, onData: (socket: Socket, chunk: Buffer) => void): Promise<{ port: number, sockets: Socket[], chunks: () => number }> {
  const sockets: Socket[] = []
  let chunks = 0
  const server: Server = createServer((socket) => {
    sockets.push(socket)
    socket.on('error', () => {})
    socket.on('data', (chunk: Buffer) => { chunks++; onData(socket, chunk) })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    for (const s of sockets) s.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return { port: (server.address() as { port: number }).port, sockets, chunks: () => chunks }
}

function client (t: Test, protocol: ClientProtocol<ToyRequest, string>, port: number, options: Partial<ProtocolClientOptions> = {}): ProtocolClient<ToyRequest, string> {
  const c = new ProtocolClient(protocol, { endpoint: `127.0.0.1:${port}`, ...options })
  t.teardown(() => c.close())
  return c
}

/** Settles every promise, and counts outcomes: `ok` or the error's code (remote: its name). */
async function outcomes (calls: Array<Promise<string>>): Promise<Record<string, number>> {
  const counts: Record<string, number> = {}
  for (const r of await Promise.allSettled(calls)) {
    const key = r.status === 'fulfilled' ? 'ok' : (r.reason as RpcError).remote?.name ?? (r.reason as RpcError).code
    counts[key] = (counts[key] ?? 0) + 1
  }
  return counts
}

async function until (predicate: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 1000 && !predicate(); i++) await new Promise(resolve => setTimeout(resolve, 5))
  if (!predicate()) throw new Error(`timed out waiting for ${what}`)
}

t.test('tagged (by id): N calls over 3 connections give N settlements, by code, with the right payloads', async (t) => {
  const { port } = await toyServer(t, 'tagged')
  const c = client(t, taggedClientProtocol(), port, { connectionsPerEndpoint: 3 })
  const calls: Array<Promise<string>> = []
  for (let i = 0; i < 300; i++) calls.push(i % 3 === 2 ? c.call({ route: 'fail' }) : c.call({ route: 'echo', payload: `p${i}` }))
  t.same(await outcomes(calls), { ok: 200, failed: 100 })
  const values = await Promise.all(calls.filter((_, i) => i % 3 !== 2))
  t.same(values, Array.from({ length: 300 }, (_, i) => i).filter((i) => i % 3 !== 2).map((i) => `p${i}`), 'each answer matched its own request')
  const error = await c.call({ route: 'nope' }).catch((e: unknown) => e as RpcError)
  t.equal((error as RpcError).code, ErrorCode.REMOTE)
  t.equal((error as RpcError).remote?.protocol, 'tagged')
  t.equal((error as RpcError).remote?.name, 'no-method')
  t.equal(c.stats().connections.length, 3, 'three connections')
})

t.test('lines (in order): N calls give N settlements in request order, errors in place', async (t) => {
  const { port } = await toyServer(t, 'lines')
  const c = client(t, linesClientProtocol(), port)
  const calls: Array<Promise<string>> = []
  for (let i = 0; i < 500; i++) calls.push(i % 5 === 4 ? c.call({ route: 'nope', payload: 'x' }) : c.call({ route: 'echo', payload: `line${i}` }))
  t.same(await outcomes(calls), { ok: 400, 'no-method': 100 })
  const values = await Promise.all(calls.filter((_, i) => i % 5 !== 4))
  t.same(values, Array.from({ length: 500 }, (_, i) => i).filter((i) => i % 5 !== 4).map((i) => `line${i}`))
})

t.test('a peer that closes mid-answer settles every call once, with a connection error, not retried once sent', async (t) => {
  for (const kind of ['tagged', 'lines'] as const) {
    const { port } = await rawServer(t, (socket, chunk) => {
      // Half an answer, then gone.
      socket.write(kind === 'tagged' ? Buffer.from([0, 20, 0, 0, 0, 0, chunk[6]!, 0x61]) : 'half an ans')
      socket.destroy()
    })
    const c = client(t, kind === 'tagged' ? taggedClientProtocol() : linesClientProtocol(), port)
    let settled = 0
    const calls = Array.from({ length: 20 }, (_, i) => c.call({ route: 'echo', payload: `${i}` }).finally(() => { settled++ }))
    t.same(await outcomes(calls), { [ErrorCode.CONNECTION_CLOSED]: 20 }, kind)
    t.equal(settled, 20)
    t.equal(c.stats().retries, 0, 'sent calls are not retried')
  }
})

t.test('garbage answers fail the connection: every call settles with a fatal error', async (t) => {
  for (const kind of ['tagged', 'lines'] as const) {
    const { port } = await rawServer(t, (socket) => {
      socket.write(kind === 'tagged' ? Buffer.from([0, 1, 0xff]) : Buffer.from([0, 0x41, 0x0a]))
    })
    const c = client(t, kind === 'tagged' ? taggedClientProtocol() : linesClientProtocol(), port, { retry: false })
    const calls = Array.from({ length: 10 }, (_, i) => c.call({ route: 'echo', payload: `${i}` }))
    t.same(await outcomes(calls), { [ErrorCode.MALFORMED_FRAME]: 10 }, kind)
    // The next call opens a new connection.
    t.equal(c.stats().connections.length, 0)
  }
  // An oversized answer is fatal too.
  const { port } = await rawServer(t, (socket) => { socket.write(Buffer.from([0xff, 0xff, 0, 0, 0, 0, 0])) })
  const c = client(t, taggedClientProtocol(), port, { retry: false, maxMessageBytes: 1024 })
  t.same(await outcomes([c.call({ route: 'echo' })]), { [ErrorCode.FRAME_TOO_LARGE]: 1 })
})

t.test('deadline on a fake clock: a call the peer never answers times out; a late answer is dropped', async (t) => {
  let received = 0
  const { port, sockets } = await rawServer(t, () => { received++ })
  const clock = new FakeClock()
  const c = client(t, taggedClientProtocol(), port, { clock })
  const call = c.call({ route: 'echo', payload: 'x' }, { timeoutMs: 100 })
  const other = c.call({ route: 'echo', payload: 'y' }, { timeoutMs: 5000 })
  await until(() => received > 0, 'the request')
  clock.advance(99)
  let settled = false
  void call.then(() => { settled = true }, () => { settled = true })
  await new Promise(resolve => setImmediate(resolve))
  t.notOk(settled, 'not before its deadline')
  clock.advance(1)
  const error = await call.catch((e: unknown) => e as RpcError)
  t.equal((error as RpcError).code, ErrorCode.DEADLINE_EXCEEDED)
  // The late answer to the first call (id 0) is dropped; the second (id 1) is answered.
  sockets[0]!.write(Buffer.concat([answer(0, 'late'), answer(1, 'y!')]))
  t.equal(await other, 'y!')
})

function answer (id: number, text: string): Buffer {
  const out = Buffer.alloc(7 + text.length)
  out.writeUInt16BE(5 + text.length, 0)
  out.writeUInt32BE(id, 3)
  out.write(text, 7)
  return out
}

t.test('AbortSignal: an aborted call rejects with RPC_ERR_CANCELLED, the others are unaffected', async (t) => {
  const { port, sockets } = await rawServer(t, () => {})
  const c = client(t, taggedClientProtocol(), port)
  const already = new AbortController()
  already.abort()
  t.equal((await c.call({ route: 'echo' }, { signal: already.signal }).catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.CANCELLED)
  const controller = new AbortController()
  const aborted = c.call({ route: 'echo', payload: 'a' }, { signal: controller.signal })
  const kept = c.call({ route: 'echo', payload: 'b' })
  await until(() => sockets.length > 0, 'the connection')
  controller.abort()
  t.equal((await aborted.catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.CANCELLED)
  // The aborted call had id 0 (the one aborted at once never reached a connection): its late answer is dropped.
  sockets[0]!.write(Buffer.concat([answer(0, 'a!'), answer(1, 'b!')]))
  t.equal(await kept, 'b!')
})

t.test('retry: calls that could not be sent (endpoint down) go to another endpoint and succeed', async (t) => {
  const dead = await rawServer(t, () => {})
  const deadPort = dead.port
  // Close the dead one's listener now: connections to it are refused.
  const { port } = await toyServer(t, 'tagged')
  const probe = createServer()
  probe.listen(0, '127.0.0.1')
  await once(probe, 'listening')
  const refused = (probe.address() as { port: number }).port
  await new Promise<void>((resolve) => probe.close(() => resolve()))
  t.ok(deadPort > 0)
  const c = new ProtocolClient(taggedClientProtocol(), { endpoint: [`127.0.0.1:${refused}`, `127.0.0.1:${port}`], balance: 'round-robin' })
  t.teardown(() => c.close())
  const calls = Array.from({ length: 50 }, (_, i) => c.call({ route: 'echo', payload: `${i}` }))
  t.same(await outcomes(calls), { ok: 50 })
  t.ok(c.stats().retries > 0, `${c.stats().retries} retries`)
  // Without retries the refused attempts fail with RPC_ERR_CONNECT_FAILED.
  const plain = new ProtocolClient(taggedClientProtocol(), { endpoint: `127.0.0.1:${refused}`, retry: false })
  t.teardown(() => plain.close())
  t.same(await outcomes([plain.call({ route: 'echo' })]), { [ErrorCode.CONNECT_FAILED]: 1 })
})

t.test('coalescing: the requests of one turn leave in one write', async (t) => {
  const { port, chunks } = await rawServer(t, (socket, chunk) => {
    // Answer every request in the chunk.
    const out: Buffer[] = []
    for (let at = 0; at + 7 <= chunk.length; at += 2 + chunk.readUInt16BE(at)) out.push(answer(chunk.readUInt32BE(at + 3), 'ok'))
    socket.write(Buffer.concat(out))
  })
  const c = client(t, taggedClientProtocol(), port)
  t.equal(await c.call({ route: 'echo' }), 'ok', 'warm-up')
  const before = c.stats().connections[0]!
  const writesBefore = before.immediateWrites + before.batchedWrites
  const chunksBefore = chunks()
  const calls = Array.from({ length: 40 }, () => c.call({ route: 'echo' }))
  t.same(await outcomes(calls), { ok: 40 })
  const after = c.stats().connections[0]!
  t.equal(after.immediateWrites + after.batchedWrites - writesBefore, 1, 'one write for 40 requests')
  t.equal(after.batchedFrames - before.batchedFrames, 40)
  t.equal(chunks() - chunksBefore, 1, 'the server read them in one chunk')
})

t.test('bounds and close: maxInFlight refuses with RPC_ERR_QUEUE_FULL; close() settles the rest with RPC_ERR_CLIENT_CLOSED', async (t) => {
  const { port } = await rawServer(t, () => {})
  const c = new ProtocolClient(taggedClientProtocol(), { endpoint: `127.0.0.1:${port}`, maxInFlight: 5, retry: false })
  const calls = Array.from({ length: 8 }, (_, i) => c.call({ route: 'echo', payload: `${i}` }))
  const full = await Promise.allSettled(calls.slice(5))
  t.same(full.map((r) => r.status === 'rejected' && (r.reason as RpcError).code), [ErrorCode.QUEUE_FULL, ErrorCode.QUEUE_FULL, ErrorCode.QUEUE_FULL])
  await c.close()
  t.same(await outcomes(calls.slice(0, 5)), { [ErrorCode.CLIENT_CLOSED]: 5 })
  t.equal((await c.call({ route: 'echo' }).catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.CLIENT_CLOSED)
  // With retries on, a call sleeping before its retry is settled by close() too.
  const probe = createServer()
  probe.listen(0, '127.0.0.1')
  await once(probe, 'listening')
  const refused = (probe.address() as { port: number }).port
  await new Promise<void>((resolve) => probe.close(() => resolve()))
  const r = new ProtocolClient(taggedClientProtocol(), { endpoint: `127.0.0.1:${refused}`, retry: { backoff: { delayMs: () => 60_000 } }, defaultTimeoutMs: 0 })
  const sleeping = r.call({ route: 'echo' })
  await until(() => r.stats().retries > 0, 'a retry scheduled')
  await r.close()
  t.equal((await sleeping.catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.CLIENT_CLOSED)
})

t.test('retry: an error the protocol calls retryable (busy) goes again; so does an idempotent call whose connection was lost', async (t) => {
  // The first request of each phase is refused busy or loses its connection; the next is answered.
  let mode: 'busy' | 'close' = 'busy'
  let requests = 0
  const { port } = await rawServer(t, (socket, chunk) => {
    const id = chunk.readUInt32BE(3)
    if (requests++ > 0) {
      socket.write(answer(id, 'done'))
    } else if (mode === 'busy') {
      const out = answer(id, 'too busy')
      out[2] = 1 // REASONS[0]: busy
      socket.write(out)
    } else {
      socket.destroy()
    }
  })
  const c = client(t, taggedClientProtocol(), port)
  t.equal(await c.call({ route: 'echo' }), 'done', 'busy, then answered')
  t.equal(c.stats().retries, 1)
  mode = 'close'
  requests = 0
  const plain = await c.call({ route: 'echo' }).catch((e: unknown) => e as RpcError)
  t.equal((plain as RpcError).code, ErrorCode.CONNECTION_CLOSED, 'a sent call is not retried after a lost connection')
  t.equal(c.stats().retries, 1)
  requests = 0
  t.equal(await c.call({ route: 'echo' }, { idempotent: true }), 'done', 'an idempotent one is')
  t.equal(c.stats().retries, 2)
  // Without retries, the busy refusal is the call's error.
  mode = 'busy'
  requests = 0
  const once = client(t, taggedClientProtocol(), port, { retry: false })
  const busy = await once.call({ route: 'echo' }).catch((e: unknown) => e as RpcError)
  t.equal((busy as RpcError).remote?.name, 'busy')
})
