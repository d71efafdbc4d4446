// ProtocolClient's streamed answers (answerOf 'stream', decodePart):
// against raw node:net servers, in order and by id, with deadlines on a
// fake clock, lost connections, the maxStreamParts bound and remote
// errors. Outcomes are counted by code; no duration is asserted.
import t from 'tap'
import type { Socket } from 'node:net'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { FakeClock } from '../../scheduling/clock.js'
import {
  PART_STATUS, lineServer, outcomes, pushLinesProtocol, pushTaggedProtocol, taggedFrame, taggedServer, toyClient, until
} from '../helpers/push-stream-protocols.js'

// `list n` is answered with n parts `+i` and the end; `echo X` with X.
const listOrEcho = (line: string): string => {
  const [route, arg = ''] = line.split(' ')
  if (route !== 'list') return `${arg}\n`
  return Array.from({ length: Number(arg) }, (_, i) => `+${i}\n`).join('') + '.\n'
}

const range = (n: number): string[] => Array.from({ length: n }, (_, i) => `${i}`)

t.test('in order: stream calls between ordinary ones resolve with their parts; N calls, N settlements', async (t) => {
  const { port } = await lineServer(t, listOrEcho)
  const c = toyClient(t, pushLinesProtocol(), port)
  const calls: Array<Promise<unknown>> = []
  const expected: unknown[] = []
  for (let i = 0; i < 300; i++) {
    const n = i % 7
    if (i % 3 === 0) {
      calls.push(c.call({ route: 'list', payload: `${n}` }))
      expected.push(range(n))
    } else {
      calls.push(c.call({ route: 'echo', payload: `e${i}` }))
      expected.push(`e${i}`)
    }
  }
  t.same(await outcomes(calls), { ok: 300 })
  t.same(await Promise.all(calls), expected, 'each call got its own answer, a stream its parts in order')
  t.same(await c.call({ route: 'list', payload: '0' }), [], 'an empty stream: no part has a value')
})

t.test('by id: the parts of two streams interleaved reach their own calls', async (t) => {
  const waiting: Array<{ id: number, payload: string, socket: Socket }> = []
  const { port } = await taggedServer(t, (request, socket) => {
    if (request.route !== 200) return [taggedFrame(0, request.id, request.payload)]
    waiting.push({ id: request.id, payload: request.payload, socket })
    if (waiting.length < 2) return []
    // Both streams at once, their parts alternating, the second first.
    const [a, b] = waiting.splice(0, 2) as [typeof waiting[0], typeof waiting[0]]
    const frames: Buffer[] = []
    for (let i = 0; i < 5; i++) frames.push(taggedFrame(PART_STATUS, b.id, `${b.payload}${i}`), taggedFrame(PART_STATUS, a.id, `${a.payload}${i}`))
    frames.push(taggedFrame(0, b.id, `${b.payload}-end`), taggedFrame(0, a.id, ''))
    return frames
  })
  const c = toyClient(t, pushTaggedProtocol(), port)
  const first = c.call({ route: 'list', payload: 'a' })
  const second = c.call({ route: 'list', payload: 'b' })
  const echo = c.call({ route: 'echo', payload: 'between' })
  t.same(await outcomes([first, second, echo]), { ok: 3 })
  t.same(await first, ['a0', 'a1', 'a2', 'a3', 'a4'], 'a last part without a value adds none')
  t.same(await second, ['b0', 'b1', 'b2', 'b3', 'b4', 'b-end'])
  t.equal(await echo, 'between')
})

t.test('the deadline covers the whole stream; in order, the late parts are read past and the next answer is right', async (t) => {
  let stalled: Socket | null = null
  const { port } = await lineServer(t, (line, socket) => {
    if (line.startsWith('list')) {
      stalled = socket
      return '+0\n+1\n'
    }
    return null // echo is answered below, after the stream's rest
  })
  const clock = new FakeClock()
  const c = toyClient(t, pushLinesProtocol(), port, { clock })
  const stream = c.call({ route: 'list', payload: '3' }, { timeoutMs: 100 })
  const after = c.call({ route: 'echo', payload: 'next' }, { timeoutMs: 10_000 })
  await until(() => stalled !== null && c.stats().connections[0]?.framesRead === 2, 'the first parts')
  clock.advance(100)
  const error = await stream.catch((e: unknown) => e as RpcError)
  t.equal((error as RpcError).code, ErrorCode.DEADLINE_EXCEEDED, 'the parts that came did not extend the deadline')
  // The rest of the stream, then the answer to the call after it.
  stalled!.write('+2\n.\nnext\n')
  t.equal(await after, 'next')
  // The overdue stream held up every answer behind it: its connection was retired at the deadline, and closes once none waits.
  t.equal(c.stats().connections.length, 0, 'the connection was retired')
  let closed = false
  stalled!.once('close', () => { closed = true })
  await until(() => closed || stalled!.destroyed, 'the retired connection to close')
})

t.test('a stream call is not retried once a part has arrived, even when idempotent', async (t) => {
  // Every stream is cut after its first part.
  const { port } = await lineServer(t, (_line, socket) => {
    socket.end('+0\n')
    return null
  })
  const c = toyClient(t, pushLinesProtocol(), port)
  const counts: Record<string, number> = {}
  // One at a time: calls behind the cut one on its connection had no part yet, and would be retried.
  for (let i = 0; i < 5; i++) {
    for (const [code, n] of Object.entries(await outcomes([c.call({ route: 'list', payload: '2' }, { idempotent: true })]))) counts[code] = (counts[code] ?? 0) + n
  }
  t.same(counts, { [ErrorCode.CONNECTION_CLOSED]: 5 })
  t.equal(c.stats().retries, 0)
})

t.test('an idempotent stream call with no part yet is retried after a lost connection', async (t) => {
  let seen = 0
  const { port } = await lineServer(t, (line, socket) => {
    if (seen++ === 0) {
      socket.destroy()
      return null
    }
    return listOrEcho(line)
  })
  const c = toyClient(t, pushLinesProtocol(), port, { retry: { backoff: { delayMs: () => 0 } } })
  t.same(await c.call({ route: 'list', payload: '2' }, { idempotent: true }), ['0', '1'])
  t.equal(c.stats().retries, 1)
})

t.test('maxStreamParts: the call over it fails QUEUE_FULL and its connection closes', async (t) => {
  const { port } = await lineServer(t, listOrEcho)
  const c = toyClient(t, pushLinesProtocol(), port, { maxStreamParts: 5, retry: false })
  t.same(await c.call({ route: 'list', payload: '5' }), range(5), 'at the bound: fine')
  const calls = [c.call({ route: 'list', payload: '6' }), c.call({ route: 'echo', payload: 'x' }), c.call({ route: 'echo', payload: 'y' })]
  t.same(await outcomes(calls), { [ErrorCode.QUEUE_FULL]: 1, [ErrorCode.CONNECTION_CLOSED]: 2 })
  t.equal((await calls[0]!.catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.QUEUE_FULL)
  t.equal(c.stats().connections.length, 0)
  t.equal(await c.call({ route: 'echo', payload: 'again' }), 'again', 'a new connection serves the next call')
  t.throws(() => toyClient(t, pushLinesProtocol(), port, { maxStreamParts: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
})

t.test('a remote error ends the stream and fails its call; a garbage part fails the connection', async (t) => {
  const { port } = await lineServer(t, (line) => {
    if (line.startsWith('list oops')) return '+0\n-ERR failed it broke\n'
    if (line.startsWith('list junk')) return '+0\n?\n'
    return listOrEcho(line)
  })
  const c = toyClient(t, pushLinesProtocol(), port, { retry: false })
  const calls = [c.call({ route: 'list', payload: 'oops' }), c.call({ route: 'echo', payload: 'after' }), c.call({ route: 'list', payload: '1' })]
  t.same(await outcomes(calls), { failed: 1, ok: 2 })
  const error = await calls[0]!.catch((e: unknown) => e as RpcError) as RpcError
  t.equal(error.code, ErrorCode.REMOTE)
  t.same(await calls[2], ['0'])
  t.equal(c.stats().connections.length, 1, 'a remote error keeps the connection')
  const broken = [c.call({ route: 'list', payload: 'junk' }), c.call({ route: 'echo', payload: 'x' })]
  t.same(await outcomes(broken), { [ErrorCode.MALFORMED_FRAME]: 2 })
})

t.test('a stream answer without decodePart is refused before anything is sent', async (t) => {
  const { port } = await lineServer(t, listOrEcho)
  const protocol = { ...pushLinesProtocol(), decodePart: undefined }
  const c = toyClient(t, protocol, port)
  const error = await c.call({ route: 'list', payload: '1' }).catch((e: unknown) => e as RpcError)
  t.ok(error instanceof RpcError)
  t.equal((error as RpcError).code, ErrorCode.INVALID_ARGUMENT)
  t.equal(c.stats().connections.length, 0, 'nothing was opened')
})
