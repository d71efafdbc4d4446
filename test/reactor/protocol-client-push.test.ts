// ProtocolClient's pushes (ClientProtocol.isPush / decodePush, onPush,
// pushes()): against raw node:net servers that send pushes between, before
// and after answers, by id and in order. Outcomes are counted by code; no
// duration is asserted.
import t from 'tap'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import type { LogFields } from '../../reactor/logger.js'
import { linesClientProtocol } from '../helpers/toy-client-protocols.js'
import {
  PUSH_STATUS, lineServer, outcomes, pushLinesProtocol, pushTaggedProtocol, taggedFrame, taggedServer, toyClient, until
} from '../helpers/push-stream-protocols.js'

// `echo X` is answered `X`, between a push before it and one after it.
const echoWithPushes = (line: string): string => {
  const arg = line.slice(line.indexOf(' ') + 1)
  return `>before ${arg}\n${arg}\n>after ${arg}\n`
}

t.test('in order: pushes between answers go to the handlers and iterators, never to a call', async (t) => {
  const { port } = await lineServer(t, echoWithPushes)
  const c = toyClient(t, pushLinesProtocol(), port)
  const seen: string[] = []
  const endpoints = new Set<string>()
  c.onPush((push, info) => { seen.push(push as string); endpoints.add(info.endpoint) })
  const iterator = c.pushes()
  const calls = Array.from({ length: 200 }, (_, i) => c.call({ route: 'echo', payload: `m${i}` }))
  t.same(await outcomes(calls), { ok: 200 })
  t.same(await Promise.all(calls), Array.from({ length: 200 }, (_, i) => `m${i}`), 'each call got its own answer')
  t.equal(seen.length, 400, 'two pushes per call')
  t.same(seen.slice(0, 4), ['before m0', 'after m0', 'before m1', 'after m1'], 'in the order they came')
  t.same([...endpoints], [`127.0.0.1:${port}`])
  const read: unknown[] = []
  for await (const push of iterator) {
    read.push(push)
    if (read.length === 400) break
  }
  t.same(read, seen, 'the iterator saw the same pushes')
  t.equal(c.stats().pushesReceived, 400)
  t.equal(c.stats().pushesDropped, 0)
  t.equal(c.stats().connections.length, 1, 'the connection stayed up')
})

t.test('without isPush an unasked frame on an in-order connection still fails it', async (t) => {
  const { port } = await lineServer(t, (line) => `${line.slice(5)}\n>unasked\n`)
  const c = toyClient(t, linesClientProtocol(), port, { retry: false })
  t.equal(await c.call({ route: 'echo', payload: 'x' }), 'x')
  await until(() => c.stats().connections.length === 0, 'the connection to fail')
  // With isPush, the same bytes are a push.
  const p = toyClient(t, pushLinesProtocol(), port, { retry: false })
  const pushes: unknown[] = []
  p.onPush((push) => pushes.push(push))
  t.equal(await p.call({ route: 'echo', payload: 'y' }), 'y')
  await until(() => pushes.length === 1, 'the push')
  t.same(pushes, ['unasked'])
  t.equal(p.stats().connections.length, 1)
})

t.test('by id: a push is not matched to the call whose id it carries', async (t) => {
  // Each request is answered after a push that carries the request's own id.
  const { port } = await taggedServer(t, (request) => [
    taggedFrame(PUSH_STATUS, request.id, `push for ${request.payload}`),
    taggedFrame(0, request.id, request.payload)
  ])
  const c = toyClient(t, pushTaggedProtocol(), port, { connectionsPerEndpoint: 2 })
  const pushes: unknown[] = []
  c.onPush((push) => pushes.push(push))
  const calls = Array.from({ length: 100 }, (_, i) => c.call({ route: 'echo', payload: `p${i}` }))
  t.same(await outcomes(calls), { ok: 100 })
  t.same(await Promise.all(calls), Array.from({ length: 100 }, (_, i) => `p${i}`))
  t.equal(pushes.length, 100)
  t.same(new Set(pushes), new Set(Array.from({ length: 100 }, (_, i) => `push for p${i}`)))
})

t.test('a handler that throws does not break the client; a removed handler gets nothing', async (t) => {
  const { port } = await lineServer(t, echoWithPushes)
  const warnings: string[] = []
  const logger = { warn: (message: string, _fields?: LogFields) => { warnings.push(message) }, error () {}, info () {} }
  const c = toyClient(t, pushLinesProtocol(), port, { logger })
  let thrower = 0
  let after = 0
  let removed = 0
  c.onPush(() => { thrower++; throw new Error('handler bug') })
  c.onPush(() => { after++ })
  const remove = c.onPush(() => { removed++ })
  t.equal(await c.call({ route: 'echo', payload: 'a' }), 'a')
  await until(() => after === 2, 'both pushes')
  remove()
  remove() // a second time does nothing
  const calls = Array.from({ length: 10 }, (_, i) => c.call({ route: 'echo', payload: `b${i}` }))
  t.same(await outcomes(calls), { ok: 10 })
  await until(() => after === 22, 'every push')
  t.equal(thrower, 22, 'the throwing handler still gets every push')
  t.equal(removed, 2, 'the removed handler got only the pushes before its removal')
  t.equal(warnings.length, 1, 'reported, rate-limited')
  t.match(warnings[0], /push handler threw/)
  t.equal(c.stats().connections.length, 1)
})

t.test('pushes(): bounded, the oldest dropped and counted', async (t) => {
  // `burst n` is answered `ok` after n pushes.
  const { port } = await lineServer(t, (line) => {
    const n = Number(line.split(' ')[1])
    return Array.from({ length: n }, (_, i) => `>${i}\n`).join('') + 'ok\n'
  })
  const c = toyClient(t, pushLinesProtocol(), port)
  const small = c.pushes({ maxBuffered: 3 })
  const large = c.pushes()
  t.equal(await c.call({ route: 'burst', payload: '10' }), 'ok')
  t.equal(c.stats().pushesReceived, 10)
  t.equal(c.stats().pushesDropped, 7, 'the small iterator dropped 7')
  const fromSmall: unknown[] = []
  for (let i = 0; i < 3; i++) fromSmall.push((await small.next()).value)
  t.same(fromSmall, ['7', '8', '9'], 'the newest were kept')
  const fromLarge: unknown[] = []
  for (let i = 0; i < 10; i++) fromLarge.push((await large.next()).value)
  t.same(fromLarge, Array.from({ length: 10 }, (_, i) => `${i}`))
  t.throws(() => c.pushes({ maxBuffered: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
})

t.test('pushes(): bounded by bytes too (each push its frame size), the oldest dropped and counted; 32 MiB by default', async (t) => {
  // `big n size` is answered `ok` after n pushes of `size` bytes (their frames: `>`, the bytes, LF).
  const { port } = await lineServer(t, (line) => {
    const [, n, size] = line.split(' ').map(Number)
    return Array.from({ length: n! }, (_, i) => `>${String(i % 10).repeat(size!)}\n`).join('') + 'ok\n'
  })
  const c = toyClient(t, pushLinesProtocol(), port)
  const small = c.pushes({ maxBufferedBytes: 10_000 })
  t.equal(await c.call({ route: 'big', payload: '20 998' }), 'ok')
  t.equal(c.stats().pushesReceived, 20)
  t.equal(c.stats().pushesDropped, 10, 'ten frames of 1,000 bytes fit in 10,000')
  const kept: string[] = []
  for (let i = 0; i < 10; i++) kept.push(((await small.next()).value as string).slice(0, 1))
  t.same(kept, ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'], 'the newest (the 11th to the 20th) were kept')
  // The newest is kept whatever its size.
  t.equal(await c.call({ route: 'big', payload: '1 20000' }), 'ok')
  t.equal(((await small.next()).value as string).length, 20_000)
  t.equal(c.stats().pushesDropped, 10)
  await small.return!()

  // Default: 32 MiB, whatever the count (under its 1,024).
  const unread = c.pushes()
  const before = c.stats().pushesDropped
  t.equal(await c.call({ route: 'big', payload: '40 1048574' }, { timeoutMs: 60_000 }), 'ok')
  t.equal(c.stats().pushesDropped - before, 8, '40 pushes of 1 MiB: the 32 newest kept')
  const first = (await unread.next()).value as string
  t.equal(first.slice(0, 1), '8', 'the oldest kept is the 9th')
  await unread.return!()
  t.throws(() => c.pushes({ maxBufferedBytes: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
})

t.test('pushes(): return() ends an iterator at once; close() ends every iterator after what it holds', async (t) => {
  const { port } = await lineServer(t, (line) => `>one\n>two\n${line.slice(5)}\n`)
  const c = toyClient(t, pushLinesProtocol(), port)
  const broken = c.pushes()
  const waiting = c.pushes()
  const held = c.pushes()
  t.equal(await c.call({ route: 'echo', payload: 'x' }), 'x')
  // A for-await loop that breaks calls return().
  for await (const push of broken) {
    t.equal(push, 'one')
    break
  }
  t.same(await broken.next(), { value: undefined, done: true }, 'ended by return(), the held push dropped')
  t.same(await waiting.next(), { value: 'one', done: false })
  t.same(await waiting.next(), { value: 'two', done: false })
  const pending = waiting.next()
  await c.close()
  t.same(await pending, { value: undefined, done: true }, 'a waiting read ends with close()')
  const fromHeld: unknown[] = []
  for await (const push of held) fromHeld.push(push)
  t.same(fromHeld, ['one', 'two'], 'close() lets the held pushes be read, then ends')
  t.same(await c.pushes().next(), { value: undefined, done: true }, 'an iterator made after close() is ended')
})

t.test('a push that decodes to a fatal error fails the connection and its calls', async (t) => {
  // `bad` is answered with a garbage push first; `echo` normally.
  const { port } = await lineServer(t, (line) => line.startsWith('bad') ? '>!\n' : `${line.slice(5)}\n`)
  const c = toyClient(t, pushLinesProtocol(), port, { retry: false })
  const calls = [c.call({ route: 'bad' }), c.call({ route: 'echo', payload: 'a' }), c.call({ route: 'echo', payload: 'b' })]
  const counts = await outcomes(calls)
  t.same(counts, { [ErrorCode.MALFORMED_FRAME]: 3 }, 'every call on the connection failed')
  t.equal(c.stats().pushesReceived, 0)
  t.equal(c.stats().connections.length, 0)
  t.equal(await c.call({ route: 'echo', payload: 'again' }), 'again', 'a new connection serves the next call')
})

t.test('onPush with a non-function throws', async (t) => {
  const c = toyClient(t, pushLinesProtocol(), 1)
  t.throws(() => c.onPush(42 as unknown as () => void), { code: ErrorCode.INVALID_ARGUMENT })
  const error = await c.close().then(() => c.call({ route: 'echo' })).catch((e: unknown) => e as RpcError)
  t.equal((error as RpcError).code, ErrorCode.CLIENT_CLOSED)
})

t.test('onConnectionClose tells a push consumer that its connection went, once per connection', async (t) => {
  const sockets: import('node:net').Socket[] = []
  const { port } = await lineServer(t, (line, socket) => {
    sockets.push(socket)
    return `${line.slice(line.indexOf(' ') + 1)}\n`
  })
  const c = toyClient(t, pushLinesProtocol(), port)
  const closes: Array<{ endpoint: string, code: string }> = []
  const off = c.onConnectionClose(({ endpoint, error }) => { closes.push({ endpoint, code: error.code }) })
  c.onConnectionClose(() => { throw new Error('a throwing handler changes nothing') })
  t.equal(await c.call({ route: 'echo', payload: 'a' }), 'a')
  sockets[0]!.destroy()
  await until(() => closes.length === 1, 'the close')
  t.same(closes, [{ endpoint: `127.0.0.1:${port}`, code: ErrorCode.CONNECTION_CLOSED }])
  t.equal(await c.call({ route: 'echo', payload: 'b' }), 'b', 'the next call opens a new connection')
  off()
  sockets[1]!.destroy()
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(closes.length, 1, 'a removed handler hears nothing')
  t.throws(() => c.onConnectionClose('x' as never), { code: ErrorCode.INVALID_ARGUMENT })
})
