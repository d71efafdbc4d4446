// Server push through the protocol API: ctx.connection (send, close,
// writability, reading held), ConnectionGroup fan-out, the slow-consumer
// limits (hard at once, soft after its period on a fake clock), streamed
// answers (ctx.write) in request order, and the idle timeout counting a
// subscriber that receives pushes as active.
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { ConnectionHandle, ServerProtocol } from '../../codec/protocol.js'
import { FakeClock } from '../../scheduling/clock.js'
import { ConnectionGroup } from '../../reactor/connection-group.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { ProtocolServer, type ServerOptions } from '../../reactor/server.js'
import { linesProtocol, taggedProtocol, taggedRequest, taggedAnswers } from '../helpers/toy-protocols.js'
import { Peer, servePeers } from '../helpers/socket-peer.js'

// The lines protocol with pushes (`>message\n`) and streamed parts (`+part\n`).
function pushLines (): ServerProtocol<string, string | undefined> {
  return {
    ...linesProtocol(),
    encodePush: (message, out) => { out.append(Buffer.from(`>${String(message)}\n`)) },
    encodePart: (_call, part, out) => { out.append(Buffer.from(`+${String(part)}\n`)) }
  }
}

const tick = (ms = 5): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

t.test('a handler pushes before its answer, and later through the handle it kept', async t => {
  let kept: ConnectionHandle | null = null
  const { open } = await servePeers(t, pushLines(), 'lines', {
    sub: (arg: string, ctx: CallContext) => {
      kept = ctx.connection
      t.equal(ctx.connection.send(`hello ${arg}`), true)
      return 'subscribed'
    }
  })
  const peer = await open()
  peer.socket.write('sub a\n')
  await peer.until(() => peer.text.includes('subscribed\n'), 'the answer')
  t.equal(peer.text, '>hello a\nsubscribed\n', 'the push leaves before the answer of the handler that sent it')
  t.ok(kept !== null)
  const handle = kept! as ConnectionHandle
  t.match(handle.remoteAddress, /^127\.0\.0\.1:\d+$/)
  t.equal(handle.isClosed, false)
  for (let i = 0; i < 10; i++) t.equal(handle.send(`n${i}`), true)
  await peer.until(() => peer.text.includes('>n9\n'), 'ten pushes')
  t.equal(peer.text.split('\n').filter(l => l.startsWith('>n')).length, 10, 'ten pushes, each once')
  t.match(peer.text, />n0\n>n1\n>n2\n.*>n9\n$/s, 'in the order sent')
  let closeEvents = 0
  handle.on('close', () => { closeEvents++ })
  peer.socket.destroy()
  await handle.closed
  t.equal(handle.isClosed, true)
  t.equal(closeEvents, 1)
  t.equal(handle.send('late'), false, 'a closed connection drops a push')
})

t.test('ConnectionGroup encodes once, sends to every member, and drops members that close', async t => {
  const group = new ConnectionGroup()
  let encodes = 0
  const protocol = pushLines()
  const encode = protocol.encodePush!
  protocol.encodePush = (m, out) => { encodes++; encode(m, out) }
  const { open, server } = await servePeers(t, protocol, 'lines', {
    join: (_arg: string, ctx: CallContext) => { group.add(ctx.connection); group.add(ctx.connection); return 'joined' },
    publish: (arg: string) => String(group.send(arg))
  })
  const peers: Peer[] = []
  for (let i = 0; i < 3; i++) {
    const peer = await open()
    peer.socket.write('join x\n')
    await peer.until(() => peer.text.includes('joined\n'), 'joined')
    peers.push(peer)
  }
  t.equal(group.size, 3, 'one membership per connection')
  const publisher = await open()
  publisher.socket.write('publish m1\n')
  await publisher.until(() => publisher.text.includes('\n'), 'the count')
  t.equal(publisher.text, '3\n', 'PUBLISH-style count of receivers')
  t.equal(encodes, 1, 'encoded once for three members')
  for (const peer of peers) await peer.until(() => peer.text.includes('>m1\n'), 'the message')
  peers[0]!.socket.destroy()
  for (let i = 0; i < 100 && group.size !== 2; i++) await tick()
  t.equal(group.size, 2, 'a closed member leaves the group by itself')
  publisher.received = Buffer.alloc(0)
  publisher.socket.write('publish m2\n')
  await publisher.until(() => publisher.text.includes('\n'), 'the count')
  t.equal(publisher.text, '2\n')
  t.equal(server.stats().pushesSent, 5, '3 + 2 pushes counted')
  t.throws(() => group.add({} as ConnectionHandle), { code: ErrorCode.INVALID_ARGUMENT })
})

t.test('a push without encodePush is refused; connectionState gets the handle', async t => {
  const seen: ConnectionHandle[] = []
  const protocol: ServerProtocol<string, string | undefined> = { ...linesProtocol(), connectionState: (_address, connection) => { seen.push(connection); return { n: 1 } } }
  const { open } = await servePeers(t, protocol, 'lines', {
    push: (_arg: string, ctx: CallContext) => {
      t.equal(ctx.connection, seen[0], 'the same handle as connectionState got')
      t.same(ctx.connection.state, { n: 1 })
      try {
        ctx.connection.send('x')
        return 'sent'
      } catch (err) {
        return (err as RpcError).code
      }
    }
  })
  const peer = await open()
  peer.socket.write('push\n')
  await peer.until(() => peer.text.includes('\n'), 'the answer')
  t.equal(peer.text, `${ErrorCode.INVALID_ARGUMENT}\n`)
  t.equal(seen.length, 1)
})

t.test('streamed parts leave in the request\'s place in the order, before its answer', async t => {
  const { open } = await servePeers(t, pushLines(), 'lines', {
    slow: async (arg: string) => { await tick(30); return `slow ${arg}` },
    stream: (arg: string, ctx: CallContext) => {
      for (let i = 0; i < 3; i++) t.equal(ctx.write(`${arg}${i}`), true)
      return 'end'
    },
    late: (_arg: string, ctx: CallContext) => {
      const write = ctx.write.bind(ctx)
      queueMicrotask(() => { try { write('x') } catch (err) { t.equal((err as RpcError).code, ErrorCode.INVALID_ARGUMENT, 'ctx.write after the answer throws') } })
      return 'done'
    }
  }, { workers: 4 })
  const peer = await open()
  peer.socket.write('slow a\nstream p\nstream q\nlate\n')
  await peer.until(() => peer.text.includes('done\n'), 'every answer')
  t.equal(peer.text, 'slow a\n+p0\n+p1\n+p2\nend\n+q0\n+q1\n+q2\nend\ndone\n')
})

t.test('protocols matched by id send parts at once', async t => {
  const protocol: ServerProtocol<Buffer, Buffer> = {
    ...taggedProtocol(),
    encodePart: (call, part, sink) => {
      const at = sink.reserve(7 + (part as Buffer).length)
      const out = sink.buffer.fill(0, at, at + 7)
      out.writeUInt16BE(5 + (part as Buffer).length, at)
      out.writeUInt32BE(call.callId, at + 3)
      ;(part as Buffer).copy(out, at + 7)
    }
  }
  const { open } = await servePeers(t, protocol, 'tagged', {
    echo: (req: Buffer, ctx: CallContext) => { ctx.write(Buffer.from('part')); return req }
  })
  const peer = await open()
  peer.socket.write(Buffer.concat([taggedRequest('echo', 7, 'a'), taggedRequest('echo', 8, 'b')]))
  await peer.until(() => taggedAnswers(peer.received).length === 4, 'four frames')
  t.same(taggedAnswers(peer.received), [['ok', 7, 'part'], ['ok', 7, 'a'], ['ok', 8, 'part'], ['ok', 8, 'b']])
})

// A peer that does not read: the kernel's buffers fill, then the server's.
async function stalledPeer (port: number): Promise<Peer> {
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  const peer = new Peer(socket)
  socket.pause()
  socket.removeAllListeners('data')
  return peer
}

async function pushServer (t: Test, options: ServerOptions): Promise<{ server: ProtocolServer, port: number, handles: ConnectionHandle[] }> {
  const handles: ConnectionHandle[] = []
  const server = new ProtocolServer(pushLines(), { logger: null, ...options })
  server.addRoutes('lines', { hello: (_a: string, ctx: CallContext) => { handles.push(ctx.connection); return 'hi' } })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 50 }))
  return { server, port, handles }
}


t.test('the hard push limit closes a subscriber that does not read, at once; a reading one keeps receiving', async t => {
  const { server, port, handles } = await pushServer(t, { pushOutputLimit: { hardBytes: 256 * 1024, softBytes: 0 } })
  const stalled = await stalledPeer(port)
  const reader = await connect(port, '127.0.0.1')
  await once(reader, 'connect')
  const readerPeer = new Peer(reader)
  stalled.socket.write('hello\n')
  reader.write('hello\n')
  for (let i = 0; i < 200 && handles.length < 2; i++) await tick()
  t.equal(handles.length, 2)
  const group = new ConnectionGroup()
  for (const h of handles) group.add(h)
  const chunk = 'x'.repeat(16 * 1024)
  let pushes = 0
  // At most 64 MiB: loopback's kernel buffers take a few MiB before the server's fill.
  while (!handles[0]!.isClosed && pushes < 4096) {
    group.send(chunk)
    pushes++
    // 64 KiB at a time, and the reader catches up before the next: only the stalled one piles up.
    if (pushes % 4 === 0) for (let i = 0; i < 100 && handles[1]!.bufferedBytes > 0; i++) await tick(1)
  }
  t.equal(handles[0]!.isClosed, true, 'the stalled subscriber was closed')
  t.equal(server.stats().pushHardLimitClosed, 1)
  t.equal(server.stats().pushSoftLimitClosed, 0)
  t.equal(handles[1]!.isClosed, false, 'the reading subscriber stays')
  group.send('last')
  await readerPeer.until(() => readerPeer.text.endsWith('>last\n'), 'the last push')
  t.equal(readerPeer.received.length, 'hi\n'.length + pushes * (chunk.length + 2) + '>last\n'.length, 'the reader got every push')
  t.equal(group.size, 1)
  stalled.socket.destroy()
  reader.destroy()
})

t.test('the soft push limit closes after its period above it (fake clock), and forgets a subscriber that drained', async t => {
  const clock = new FakeClock()
  const { server, port, handles } = await pushServer(t, { clock, idleTimeoutMs: 0, frameTimeoutMs: 0, pushOutputLimit: { hardBytes: 0, softBytes: 64 * 1024, softMs: 2000 } })
  const stalled = await stalledPeer(port)
  stalled.socket.write('hello\n')
  for (let i = 0; i < 200 && handles.length < 1; i++) await tick()
  const handle = handles[0]!
  const chunk = 'y'.repeat(16 * 1024)
  for (let i = 0; i < 4096 && handle.bufferedBytes <= 64 * 1024; i++) {
    handle.send(chunk)
    if (i % 64 === 63) await tick(1)
  }
  t.ok(handle.bufferedBytes > 64 * 1024, 'over the soft limit')
  clock.advance(1000)
  t.equal(handle.isClosed, false, 'not yet: half its period')
  clock.advance(1500)
  t.equal(handle.isClosed, true, 'closed once above the soft limit for its period')
  t.equal(server.stats().pushSoftLimitClosed, 1)
  stalled.socket.destroy()
})

t.test('writable turns false past the high watermark and drain comes at the low one', async t => {
  const { port, handles } = await pushServer(t, { writeWatermarks: { highBytes: 64 * 1024, lowBytes: 16 * 1024 }, pushOutputLimit: { hardBytes: 0, softBytes: 0 } })
  const stalled = await stalledPeer(port)
  stalled.socket.write('hello\n')
  for (let i = 0; i < 200 && handles.length < 1; i++) await tick()
  const handle = handles[0]!
  let drains = 0
  handle.on('drain', () => { drains++ })
  const chunk = 'z'.repeat(16 * 1024)
  let sent = 0
  while (handle.writable && sent < 4096) {
    handle.send(chunk)
    sent++
    if (sent % 64 === 0) await tick(1)
  }
  t.equal(handle.writable, false, 'past the high watermark')
  t.ok(handle.bufferedBytes > 64 * 1024)
  t.equal(drains, 0)
  let read = 0
  stalled.socket.on('data', (d: Buffer) => { read += d.length })
  stalled.socket.resume()
  for (let i = 0; i < 500 && drains === 0; i++) await tick()
  t.equal(drains, 1, 'one drain once the peer read')
  t.equal(handle.writable, true)
  for (let i = 0; i < 500 && read < sent * (chunk.length + 2); i++) await tick()
  t.equal(read, 'hi\n'.length + sent * (chunk.length + 2), 'every pushed byte arrived')
  stalled.socket.destroy()
})

t.test('pauseReading holds a connection\'s requests until resumeReading; close(reason) ends it after its bytes', async t => {
  let handle: ConnectionHandle | null = null
  const { open } = await servePeers(t, pushLines(), 'lines', {
    hold: (_a: string, ctx: CallContext) => { handle = ctx.connection; ctx.connection.pauseReading(); return 'held' },
    echo: (a: string) => a
  })
  const peer = await open()
  peer.socket.write('hold\n')
  await peer.until(() => peer.text === 'held\n', 'held')
  peer.socket.write('echo 1\necho 2\n')
  await tick(50)
  t.equal(peer.text, 'held\n', 'nothing read while held')
  handle!.resumeReading()
  await peer.until(() => peer.text === 'held\n1\n2\n', 'both answers')
  handle!.send('bye')
  handle!.close('done with it')
  await peer.until(() => peer.closed, 'the close')
  t.equal(peer.text, 'held\n1\n2\n>bye\n', 'the queued push went out before the end')
  await handle!.closed
})

t.test('a subscriber that receives pushes is not idle (fake clock); one that gets nothing is', async t => {
  const clock = new FakeClock()
  const { server, port, handles } = await pushServer(t, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0 })
  const a = new Peer(connect(port, '127.0.0.1'))
  const b = new Peer(connect(port, '127.0.0.1'))
  a.socket.write('hello\n')
  b.socket.write('hello\n')
  for (let i = 0; i < 200 && handles.length < 2; i++) await tick()
  const [first, second] = handles as [ConnectionHandle, ConnectionHandle]
  const pushed = first.remoteAddress === `127.0.0.1:${a.socket.localPort}` ? first : second
  const quiet = pushed === first ? second : first
  for (let ms = 0; ms < 5000; ms += 250) {
    pushed.send(`tick ${ms}`)
    await tick(2)
    clock.advance(250)
  }
  t.equal(pushed.isClosed, false, 'a message every 250 ms keeps it open past 5 idle timeouts')
  t.equal(quiet.isClosed, true, 'the one that got nothing was closed idle')
  t.equal(server.stats().idleClosed, 1)
  a.socket.destroy()
  b.socket.destroy()
})

t.test('small pushes to a group: a member that stops reading still gets every push, in order, once it reads again', async t => {
  const { port, handles } = await pushServer(t, {})
  const stalledSocket = connect(port, '127.0.0.1')
  await once(stalledSocket, 'connect')
  const stalled = new Peer(stalledSocket)
  stalledSocket.write('hello\n')
  await stalled.until(() => stalled.text === 'hi\n', 'its answer')
  stalledSocket.pause()
  const readerSocket = connect(port, '127.0.0.1')
  await once(readerSocket, 'connect')
  const reader = new Peer(readerSocket)
  readerSocket.write('hello\n')
  for (let i = 0; i < 200 && handles.length < 2; i++) await tick()
  t.equal(handles.length, 2)
  const group = new ConnectionGroup()
  for (const h of handles) group.add(h)
  const sent: string[] = []
  let queued = 0
  let after = -1
  // Batches of 200 pushes of ~900 bytes, one a turn (each member's pushes of a turn are one run of the push slab), until
  // the stalled member is backed up, then 20 batches more (queued as copies while it waits for drain); at most 60,000.
  for (let batch = 0; batch < 300 && after < 20; batch++) {
    for (let i = 0; i < 200; i++) {
      const message = `${sent.length} ${'x'.repeat(900)}`
      sent.push(message)
      queued += group.send(message)
    }
    if (!handles[0]!.writable) after++
    for (let i = 0; i < 200 && handles[1]!.bufferedBytes > 0; i++) await tick(1)
  }
  t.equal(after, 20, 'the stalled member backed up, and 20 batches went to it backed up')
  t.equal(queued, 2 * sent.length, 'every push queued on both')
  const expected = sent.map(m => `>${m}\n`).join('')
  await reader.until(() => reader.received.length >= 'hi\n'.length + expected.length, 'every push at the reader')
  t.equal(reader.text, 'hi\n' + expected, 'the reader: every push, in order')
  stalledSocket.resume()
  for (let i = 0; i < 2000 && stalled.received.length < 'hi\n'.length + expected.length; i++) await tick()
  t.equal(stalled.received.length, 'hi\n'.length + expected.length)
  t.equal(stalled.text, 'hi\n' + expected, 'the stalled member: every push, in order')
  stalledSocket.destroy()
  readerSocket.destroy()
})
