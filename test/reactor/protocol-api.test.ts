// The generic server with two toy protocols (test/helpers/toy-protocols.ts):
// a scanned, in-order line protocol and a length-prefixed one answered by
// id. Frames split at every byte, in-order answers from handlers that finish
// out of order, requests without answers, overload and expiry in the
// protocol's words, and the maximum frame size for both kinds of framing.
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { Peer, servePeers } from '../helpers/socket-peer.js'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { ScanDecoder } from '../../codec/scan-decoder.js'
import { FakeClock } from '../../scheduling/clock.js'
import { ProtocolServer, type ServerOptions } from '../../reactor/server.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { linesProtocol, scanners, taggedAnswers, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

function start (t: Test, protocol: 'lines' | 'tagged', handlers: Record<string, (req: never, ctx: CallContext) => unknown>, options: ServerOptions = {}): Promise<{ server: ProtocolServer, open: () => Promise<Peer> }> {
  return servePeers(t, protocol === 'lines' ? linesProtocol() : taggedProtocol(), protocol, handlers, options)
}

const lineHandlers = {
  echo: (arg: string) => arg,
  sleep: async (arg: string) => {
    const [ms, word] = arg.split(' ')
    await new Promise(resolve => setTimeout(resolve, Number(ms)))
    return word
  },
  quiet: () => undefined,
  fail: () => { throw new Error('it broke') },
  quit: (_arg: string, ctx: CallContext) => { ctx.closeConnection(); return 'bye' }
}

t.test('decoders: a stream of frames split at every byte gives the same frames, and a resumed scan reads each byte once', async (t) => {
  const lines = Buffer.from('echo a\nsleep 5 bb\n\necho ccc\n')
  const tagged = Buffer.concat([taggedRequest('echo', 1, 'x'), taggedRequest('echo', 2, ''), taggedRequest('sleep', 3, 'yyyy')])
  for (const [name, stream, make] of [
    ['lines', lines, () => new ScanDecoder(linesProtocol().framing as never)],
    ['tagged', tagged, () => new FrameDecoder(taggedProtocol().framing as never)]
  ] as const) {
    const whole: string[] = []
    make().pushRanges(stream, (buf, s, e) => { whole.push(buf.toString('latin1', s, e)) })
    for (let a = 0; a <= stream.length; a++) {
      for (let b = a; b <= stream.length; b++) {
        const decoder = make()
        const frames: string[] = []
        for (const piece of [stream.subarray(0, a), stream.subarray(a, b), stream.subarray(b)]) {
          t.equal(decoder.pushRanges(piece, (buf, s, e) => { frames.push(buf.toString('latin1', s, e)) }), null)
        }
        if (frames.join('|') !== whole.join('|')) t.fail(`${name} split at ${a},${b}: ${frames.join('|')}`)
      }
    }
    t.ok(whole.length >= 3, `${name}: ${whole.length} frames at every split`)
  }
  // One byte at a time: the line scanner resumes, so it looks at each byte once.
  scanners.length = 0
  const decoder = new ScanDecoder(linesProtocol().framing as never)
  const long = Buffer.from(`echo ${'z'.repeat(2000)}\n`)
  let frames = 0
  for (let i = 0; i < long.length; i++) decoder.pushRanges(long.subarray(i, i + 1), () => { frames++ })
  t.equal(frames, 1)
  t.equal(scanners[0]!.looked, long.length, 'each byte scanned once')
})

t.test('lines, end to end: one byte per read, then answers in request order although handlers finish out of order', async (t) => {
  const { server, open } = await start(t, 'lines', lineHandlers)
  const peer = await open()
  const request = Buffer.from('echo one\necho two\n')
  for (let i = 0; i < request.length; i++) {
    peer.socket.write(request.subarray(i, i + 1))
    await peer.until(() => server.connectionStats()[0]!.bytesRead === i + 1, `byte ${i + 1} read`)
  }
  await peer.until(() => peer.text === 'one\ntwo\n', 'both answers')
  peer.received = Buffer.alloc(0)
  peer.socket.write('sleep 40 first\nsleep 0 second\necho third\nsleep 10 fourth\n')
  await peer.until(() => peer.text.split('\n').length === 5, 'four answers')
  t.equal(peer.text, 'first\nsecond\nthird\nfourth\n', 'request order')
  t.equal(server.stats().callsSucceeded, 6)
})

t.test('lines: requests without answers keep their place and send nothing', async (t) => {
  const { open } = await start(t, 'lines', lineHandlers)
  const peer = await open()
  peer.socket.write('quiet a\nsleep 20 x\nquiet b\nquiet c\necho y\nquiet d\n')
  await peer.until(() => peer.text === 'x\ny\n', 'two answers')
  peer.socket.write('echo z\n')
  await peer.until(() => peer.text === 'x\ny\nz\n', 'the next answer')
  t.pass('only the requests that have an answer are answered, in order')
})

t.test('lines: unknown routes and failing handlers are answered in the protocol\'s words, in place', async (t) => {
  const { open } = await start(t, 'lines', lineHandlers)
  const peer = await open()
  peer.socket.write('sleep 20 a\nnope x\nfail\necho b\n')
  await peer.until(() => peer.text.split('\n').length === 5, 'four answers')
  t.same(peer.text.split('\n').slice(0, 4), ['a', '-ERR no-method call on service lines received with an invalid method name: nope', '-ERR failed it broke', 'b'])
})

t.test('lines: closeConnection() closes after the answer, and nothing after it is read', async (t) => {
  const { server, open } = await start(t, 'lines', lineHandlers)
  const peer = await open()
  peer.socket.write('sleep 20 a\nquit\necho never\n')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'a\nbye\n')
  t.equal(server.stats().callsReceived, 2, 'the request after quit was not read')
})

t.test('overload and expiry are answered in the protocol\'s words, in order (FakeClock)', async (t) => {
  const clock = new FakeClock()
  const release: Array<() => void> = []
  const { server, open } = await start(t, 'lines', {
    ...lineHandlers,
    block: (arg: string) => new Promise<string>(resolve => release.push(() => resolve(arg)))
  }, { clock, workers: 1, queueLength: 1, requestTimeoutMs: 100 })
  const peer = await open()
  peer.socket.write('block a\nblock b\nblock c\nblock d\n')
  await peer.until(() => server.stats().callsReceived === 4, 'four requests')
  // The burst is held one turn; no worker finished, so the queue judges it: busy.
  clock.runDeferred()
  clock.runDeferred()
  t.equal(release.length, 1, 'one runs, one waits in the queue')
  // The queued one passes its deadline (receipt + requestTimeoutMs) in the queue.
  clock.advance(150)
  release.shift()!()
  await peer.until(() => peer.text.split('\n').length === 5, 'four answers')
  const [first, second, third, fourth] = peer.text.split('\n')
  t.equal(first, 'a')
  t.match(second, /^-ERR expired /, 'the queued request expired')
  t.match(third, /^-ERR busy /, 'the third was refused busy')
  t.match(fourth, /^-ERR busy /, 'the fourth was refused busy')
})

t.test('tagged: answers leave by id as handlers finish, and overload is the protocol\'s status', async (t) => {
  const { server, open } = await start(t, 'tagged', {
    echo: (req: Buffer) => req,
    sleep: async (req: Buffer) => { await new Promise(resolve => setTimeout(resolve, 30)); return req }
  })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('sleep', 1, 'slow'), taggedRequest('echo', 2, 'fast'), taggedRequest('fail', 3), taggedRequest('nope', 4)]))
  await peer.until(() => taggedAnswers(peer.received).length === 4, 'four answers')
  t.same(taggedAnswers(peer.received), [['ok', 2, 'fast'], ['no-method', 3, 'call on service tagged received with an invalid method name: fail'], ['no-method', 4, 'call on service tagged received with an invalid method name: route-200'], ['ok', 1, 'slow']])
  // A duplicate id in flight breaks the protocol: the connection closes.
  peer.received = Buffer.alloc(0)
  peer.socket.write(Buffer.concat([taggedRequest('sleep', 7), taggedRequest('sleep', 7)]))
  await peer.until(() => peer.closed, 'the close')
  t.equal(server.stats().badFrames, 1)
})

t.test('the maximum frame size, for a length field and for a scan', async (t) => {
  await t.test('tagged: refused at its length field, before the frame arrives', async (t) => {
    const { server, open } = await start(t, 'tagged', { echo: (req: Buffer) => req })
    const peer = await open()
    const prefix = Buffer.alloc(2)
    prefix.writeUInt16BE(5000, 0)
    peer.socket.write(prefix)
    await peer.until(() => peer.closed, 'the close')
    t.equal(server.stats().connectionsOpen, 0)
  })
  await t.test('lines: refused once that many bytes came without an end', async (t) => {
    const { server, open } = await start(t, 'lines', lineHandlers, { maxMessageBytes: 64 })
    const peer = await open()
    peer.socket.write('echo ' + 'x'.repeat(40))
    await new Promise(resolve => setTimeout(resolve, 20))
    t.notOk(peer.closed, 'within the limit it waits')
    peer.socket.write('y'.repeat(40))
    await peer.until(() => peer.closed, 'the close')
    t.equal(server.stats().connectionsOpen, 0)
  })
  await t.test('lines: a frame that ends past the limit within one read is refused too', async (t) => {
    const { open } = await start(t, 'lines', lineHandlers, { maxMessageBytes: 64 })
    const peer = await open()
    peer.socket.write('echo ' + 'x'.repeat(100) + '\n')
    await peer.until(() => peer.closed, 'the close')
    t.equal(peer.text, '')
  })
  const decoder = new ScanDecoder(linesProtocol().framing as never, 10)
  const error = decoder.pushRanges(Buffer.from('0123456789abc'), () => {}) as RpcError
  t.equal(error?.code, ErrorCode.FRAME_TOO_LARGE)
})

t.test('a head the protocol refuses closes the connection as a bad frame', async (t) => {
  const { server, open } = await start(t, 'lines', lineHandlers)
  const peer = await open()
  peer.socket.write('echo fine\n\u0000bad\necho never\n')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'fine\n')
  t.equal(server.stats().badFrames, 1)
})

t.test('shutdown: requests after close() are refused in the protocol\'s words', async (t) => {
  const release: Array<() => void> = []
  const { server, open } = await start(t, 'lines', { ...lineHandlers, block: (arg: string) => new Promise<string>(resolve => release.push(() => resolve(arg))) })
  const peer = await open()
  peer.socket.write('block a\n')
  await peer.until(() => release.length === 1, 'the handler to start')
  const closed = server.close({ graceMs: 5000 })
  peer.socket.write('echo late\n')
  await peer.until(() => server.stats().callsReceived === 2, 'the late request')
  release[0]!()
  await closed
  await peer.until(() => peer.closed, 'the close')
  t.same(peer.text.split('\n').slice(0, 2), ['a', '-ERR shutdown server is shutting down'])
})

t.test('tagged (by id): closeConnection() waits for the calls in flight before it, then closes', async (t) => {
  const { server, open } = await start(t, 'tagged', {
    echo: (req: Buffer) => req,
    sleep: async (req: Buffer) => { await new Promise(resolve => setTimeout(resolve, 40)); return req },
    quit: (_req: Buffer, ctx: CallContext) => { ctx.closeConnection(); return Buffer.from('bye') }
  })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('sleep', 1, 'slow'), taggedRequest('quit', 2), taggedRequest('echo', 3, 'never')]))
  await peer.until(() => peer.closed, 'the close')
  t.same(taggedAnswers(peer.received), [['ok', 2, 'bye'], ['ok', 1, 'slow']], 'the slow call before it is answered, then the connection ends')
  t.equal(server.stats().callsReceived, 2, 'nothing after the quit was read')
})

t.test('tagged, end to end: two frames sent one byte per read are answered as sent whole', async (t) => {
  const { server, open } = await start(t, 'tagged', { echo: (req: Buffer) => req })
  const peer = await open()
  const request = Buffer.concat([taggedRequest('echo', 5, 'first'), taggedRequest('echo', 6, '')])
  for (let i = 0; i < request.length; i++) {
    peer.socket.write(request.subarray(i, i + 1))
    await peer.until(() => server.connectionStats()[0]!.bytesRead === i + 1, `byte ${i + 1} read`)
  }
  await peer.until(() => taggedAnswers(peer.received).length === 2, 'both answers')
  t.same(taggedAnswers(peer.received), [['ok', 5, 'first'], ['ok', 6, '']])
})

// Found by review: each of these failed before its fix.

t.test('ids of 32 bits unsigned are answered (a u32 id of 2^31 or more once crashed the process)', async (t) => {
  const { server, open } = await start(t, 'tagged', { echo: (req: Buffer) => req })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('echo', 0x80000000, 'a'), taggedRequest('echo', 0xffffffff, 'b'), taggedRequest('echo', 7, 'c')]))
  await peer.until(() => taggedAnswers(peer.received).length === 3, 'three answers')
  t.same(taggedAnswers(peer.received), [['ok', 0x80000000, 'a'], ['ok', 0xffffffff, 'b'], ['ok', 7, 'c']])
  t.equal(server.stats().badFrames, 0)
})

t.test('a protocol whose decodeHead throws, or gives a call id that is not a 32-bit integer, gets a bad frame, not a crash', async (t) => {
  const base = taggedProtocol()
  for (const [name, decodeHead] of [
    ['throws', () => { throw new Error('bug') }],
    ['fractional id', (buf: Buffer, start: number, end: number, head: { callId: number }) => { const r = base.decodeHead(buf, start, end, head as never); head.callId = 1.5; return r }]
  ] as const) {
    const server = new ProtocolServer({ ...base, decodeHead: decodeHead as never })
    server.addRoutes('tagged', { echo: (req: Buffer) => req })
    const { port } = await server.listen(0, '127.0.0.1')
    const socket = connect(port, '127.0.0.1')
    const peer = new Peer(socket)
    await once(socket, 'connect')
    socket.write(taggedRequest('echo', 1, 'x'))
    await peer.until(() => peer.closed, `${name}: the close`)
    t.equal(server.stats().badFrames, 1, `${name}: one bad frame`)
    await server.close({ graceMs: 100 })
  }
})

t.test('closeConnection() from an async handler: requests read after it are not answered', async (t) => {
  const { server, open } = await start(t, 'lines', {
    ...lineHandlers,
    aquit: async (_arg: string, ctx: CallContext) => { ctx.closeConnection(); await new Promise(resolve => setTimeout(resolve, 20)); return 'bye' }
  })
  const peer = await open()
  peer.socket.write('echo before\naquit\necho after1\necho after2\n')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'before\nbye\n')
  t.equal(server.stats().callsReceived, 2, 'nothing after the quit was read')
})

t.test('by id: frames arriving while a closing connection waits for its calls are dropped, not misread as bad frames', async (t) => {
  const { server, open } = await start(t, 'tagged', {
    sleep: async (req: Buffer) => { await new Promise(resolve => setTimeout(resolve, 60)); return req },
    quit: (_req: Buffer, ctx: CallContext) => { ctx.closeConnection(); return Buffer.from('bye') }
  })
  const peer = await open()
  const late = taggedRequest('sleep', 9, 'late')
  peer.socket.write(Buffer.concat([taggedRequest('sleep', 1, 'slow'), taggedRequest('quit', 2), late.subarray(0, 4)]))
  await new Promise(resolve => setTimeout(resolve, 20))
  peer.socket.write(late.subarray(4))
  await peer.until(() => peer.closed, 'the close')
  t.same(taggedAnswers(peer.received), [['ok', 2, 'bye'], ['ok', 1, 'slow']])
  t.equal(server.stats().badFrames, 0, 'no bad frame')
})

t.test('in order: empty answers held behind a slow one count against maxOutboundBytes', async (t) => {
  const release: Array<() => void> = []
  const { server, open } = await start(t, 'lines', { ...lineHandlers, block: (arg: string) => new Promise<string>(resolve => release.push(() => resolve(arg))) }, { maxOutboundBytes: 4096 })
  const peer = await open()
  peer.socket.write('block a\n' + 'quiet x\n'.repeat(200))
  await peer.until(() => peer.closed, 'the close')
  t.equal(server.stats().connectionsOpen, 0, 'closed: 200 held entries are over a 4 KiB bound')
  for (const r of release) r()
})

t.test('in order: a refusal that closes the connection waits for the answers before it', async (t) => {
  const server = new ProtocolServer(linesProtocol({ closeOnUnknown: true }))
  server.addRoutes('lines', lineHandlers as never)
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 100 }))
  const socket = connect(port, '127.0.0.1')
  const peer = new Peer(socket)
  await once(socket, 'connect')
  socket.write('sleep 30 first\necho second\nnope\necho never\n')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'first\nsecond\n')
})

t.test('a scanner\'s lower bound does not make the decoder hold that much', async (t) => {
  const decoder = new ScanDecoder({ scanner: () => ({ scan: () => -50_000_000, reset: () => {} }) })
  t.equal(decoder.pushRanges(Buffer.from('$50000000\n'), () => {}), null)
  t.ok(decoder.heldBytes <= 64 * 1024, `holds ${decoder.heldBytes} bytes for 10 received`)
})
