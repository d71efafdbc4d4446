// The protocol API's per-connection parts, through the generic server and
// the toy protocols of test/helpers/toy-protocols.ts: a stream the protocol
// cannot go on reading answered in its own words after the answers before
// it (protocolError), the protocol's own state per connection
// (connectionState), frames that are not requests (CallHead.skip), and route
// keys past the linear route cache.
import t from 'tap'
import { servePeers } from '../helpers/socket-peer.js'
import type { RpcError } from '../../codec/errors.js'
import type { CallHead, ServerProtocol } from '../../codec/protocol.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { linesProtocol, taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

const serve = servePeers

const sleep = async (arg: string): Promise<string> => {
  const [ms, word] = arg.split(' ')
  await new Promise(resolve => setTimeout(resolve, Number(ms)))
  return word!
}

// The lines protocol with an answer for streams it cannot read, blank lines
// that are not requests, and a count of frames per connection.
interface LineState { frames: number }
function answeringLines (answer: ((error: RpcError) => Uint8Array[] | null) = (error) => [Buffer.from(`-ERR protocol: ${error.message}\n`)]): ServerProtocol<string, string | undefined> {
  const base = linesProtocol()
  return {
    ...base,
    maxFrameBytes: 32,
    connectionState: (): LineState => ({ frames: 0 }),
    decodeHead (buf: Buffer, start: number, end: number, head: CallHead, state?: unknown): RpcError | null {
      (state as LineState).frames++
      if (end - start === 1) {
        head.skip = true
        return null
      }
      return base.decodeHead(buf, start, end, head)
    },
    protocolError: (error) => answer(error)
  }
}

const handlers = {
  echo: (arg: string) => arg,
  sleep,
  frames: (_arg: string, ctx: CallContext) => String((ctx.connectionState as LineState).frames)
}

t.test('in order: a head the protocol refuses is answered after the answers before it, then the connection closes', async (t) => {
  const { server, open } = await serve(t, answeringLines(), 'lines', handlers)
  const peer = await open()
  peer.socket.write('sleep 30 a\necho b\n\u0000bad\necho never\n')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'a\nb\n-ERR protocol: a line may not start with NUL\n', 'earlier answers in order, then the protocol\'s words')
  t.equal(server.stats().callsReceived, 2, 'nothing after the bad frame was read')
  t.equal(server.stats().badFrames, 1)
})

t.test('in order: a framing error (a line over the maximum frame size) is answered the same way', async (t) => {
  const { server, open } = await serve(t, answeringLines(), 'lines', handlers)
  const peer = await open()
  peer.socket.write(`sleep 20 a\n${'x'.repeat(100)}`)
  await peer.until(() => peer.closed, 'the close')
  const lines = peer.text.split('\n')
  t.equal(lines[0], 'a', 'the answer before it first')
  t.match(lines[1], /^-ERR protocol: .*32/, 'then the protocol\'s words, naming the limit')
  t.equal(lines.length, 3, 'and nothing else')
  t.equal(server.stats().badFrames, 1)
})

t.test('a protocolError that returns null closes without a reply, as without the hook', async (t) => {
  const { open } = await serve(t, answeringLines(() => null), 'lines', handlers)
  const peer = await open()
  peer.socket.write('echo fine\n\u0000bad\necho never\n')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'fine\n')
})

t.test('by id: a refused head is answered once the calls in flight before it are, then the connection closes', async (t) => {
  const base = taggedProtocol()
  const protocol: ServerProtocol<Buffer, Buffer> = {
    ...base,
    protocolError: (error) => base.refusal({ service: 'tagged', method: '', callId: 0, data: undefined }, 'invalid', error.message)
  }
  const { server, open } = await serve(t, protocol, 'tagged', {
    echo: (payload: Buffer) => payload,
    sleep: async (payload: Buffer) => { await new Promise(resolve => setTimeout(resolve, 30)); return payload }
  })
  const peer = await open()
  const tooShort = Buffer.from([0, 2, 0, 0]) // a frame shorter than its header
  peer.socket.write(Buffer.concat([taggedRequest('sleep', 1, 'slow'), taggedRequest('echo', 2, 'fast'), tooShort, taggedRequest('echo', 3, 'never')]))
  await peer.until(() => peer.closed, 'the close')
  t.same(taggedAnswers(peer.received), [['ok', 2, 'fast'], ['ok', 1, 'slow'], ['invalid', 0, 'frame shorter than its header']], 'both calls answered, then the refusal')
  t.equal(server.stats().callsReceived, 2)
})

t.test('connectionState: each connection has its own, seen by decodeHead and by handlers', async (t) => {
  const { open } = await serve(t, answeringLines(), 'lines', handlers)
  const one = await open()
  const two = await open()
  one.socket.write('echo a\necho b\nframes\n')
  two.socket.write('frames\n')
  await one.until(() => one.text === 'a\nb\n3\n', 'three answers')
  await two.until(() => two.text === '1\n', 'one answer')
  t.pass('the counts are per connection')
})

t.test('CallHead.skip: a frame that is not a request gets no call, no answer and no place in the order', async (t) => {
  const { server, open } = await serve(t, answeringLines(), 'lines', handlers)
  const peer = await open()
  peer.socket.write('sleep 20 a\n\n\necho b\n\nframes\n')
  await peer.until(() => peer.text.split('\n').length === 4, 'three answers')
  t.equal(peer.text, 'a\nb\n6\n', 'in order, the blank lines counted as frames but not answered')
  t.equal(server.stats().callsReceived, 3)
})

t.test('route keys past the linear cache find their routes by identity', async (t) => {
  const names = Array.from({ length: 40 }, (_, i) => `r${i}`)
  const keys = new Map(names.map((name) => [name, { name }]))
  const base = linesProtocol()
  const protocol: ServerProtocol<string, string | undefined> = {
    ...base,
    decodeHead (buf, start, end, head): RpcError | null {
      const error = base.decodeHead(buf, start, end, head)
      head.routeKey = keys.get(head.method)
      return error
    }
  }
  const routes = Object.fromEntries(names.map((name) => [name, () => name]))
  const { open } = await serve(t, protocol, 'lines', routes)
  const peer = await open()
  const sequence = [...names, ...names.slice().reverse(), ...names]
  peer.socket.write(sequence.map((name) => `${name}\n`).join(''))
  await peer.until(() => peer.text.split('\n').length === sequence.length + 1, 'every answer')
  t.same(peer.text.split('\n').slice(0, -1), sequence, 'each request reached its own route')
})
