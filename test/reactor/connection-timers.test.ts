// Per-connection timers and the protocol's last words, on a fake clock:
// setIdleTimeout(0) switches the server's idle close off for a session;
// setIdleTimeout(ms, { inboundOnly }) closes a client that sends nothing
// even while pushes go to it (MQTT's keep-alive), and not one that does;
// every close the server decides (idle, frame timeout, slow frame, age,
// the inbound budget, shutdown) lets the protocol speak first
// (`lastWords(reason, state)`); close({ reset: true }) sends an RST.
import t from 'tap'
import type { ConnectionHandle, ServerProtocol } from '../../codec/protocol.js'
import { FakeClock, serveCore, turns, until } from '../helpers/core-harness.js'
import { linesProtocol, taggedProtocol, taggedRequest } from '../helpers/toy-protocols.js'

/** Moves the clock `ms` in steps of `stepMs`, letting I/O run between steps. */
async function pass (clock: FakeClock, ms: number, stepMs = 100): Promise<void> {
  for (let at = 0; at < ms; at += stepMs) {
    clock.advance(Math.min(stepMs, ms - at))
    await turns(2)
  }
}

interface Session { handle: ConnectionHandle | null, name: string }

/** Lines with pushes, last words (`-BYE reason name`), and a handler `idle ms [inbound]` that sets the connection's idle timeout. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
function sessionLines (onState?: (handle: ConnectionHandle) => void): ServerProtocol<string, string | undefined, any> {
  return {
    ...(linesProtocol() as unknown as ServerProtocol<string, string | undefined, Session>),
    connectionState: (_remote, handle) => { onState?.(handle); return { handle, name: 'anon' } },
    encodePush: (message, out) => { out.append(Buffer.from(`>${String(message)}\n`)) },
    lastWords: (reason, state) => [Buffer.from(`-BYE ${reason} ${state.name}\n`)]
  }
}

const handlers = {
  idle: (arg: string, ctx: { connection: ConnectionHandle }) => {
    const [ms = '0', inbound] = arg.split(' ')
    ctx.connection.setIdleTimeout(Number(ms), { inboundOnly: inbound === 'inbound' })
    return 'ok'
  },
  name: (arg: string, ctx: { connectionState: unknown }) => { (ctx.connectionState as Session).name = arg; return 'ok' },
  ping: () => 'pong'
}

t.test('setIdleTimeout(0) at accept: a quiet session outlives the server\'s idleTimeoutMs; others do not', async (t) => {
  const clock = new FakeClock()
  let first = true
  const { server, open } = await serveCore(t, sessionLines((handle) => { if (first) handle.setIdleTimeout(0); first = false }), handlers, { clock, idleTimeoutMs: 1000, frameTimeoutMs: 0 })
  const session = await open()
  const plain = await open()
  await until(() => server.stats().connectionsOpen === 2, 'both accepted')
  await pass(clock, 5000, 250)
  await plain.until(() => plain.closed, 'the plain one closed idle')
  t.notOk(session.closed, 'the session stays')
  t.equal(plain.text, '-BYE idle anon\n', 'its last words came first')
  t.equal(server.stats().idleClosed, 1)
})

t.test('setIdleTimeout(ms, { inboundOnly }): pushes do not keep a silent client open; its own bytes do', async (t) => {
  const clock = new FakeClock()
  const { open } = await serveCore(t, sessionLines(), handlers, { clock, idleTimeoutMs: 0, frameTimeoutMs: 0 })
  const silent = await open()
  const talker = await open()
  const counted = await open()
  silent.socket.write('name silent\nidle 1500 inbound\n')
  talker.socket.write('name talker\nidle 1500 inbound\n')
  counted.socket.write('name counted\nidle 1500\n')
  await until(() => [silent, talker, counted].every(p => p.text === 'ok\nok\n'), 'timeouts set')
  // 3 s pass; the talker pings every second.
  for (let step = 1; step <= 12; step++) {
    clock.advance(250)
    await turns(2)
    if (step % 4 === 0) talker.socket.write('ping\n')
    await turns(2)
  }
  await silent.until(() => silent.closed, 'the silent client closed by its keep-alive')
  t.match(silent.text, /-BYE idle silent\n$/)
  t.notOk(talker.closed, 'the client that sends stays')
  t.ok(counted.closed, 'without inboundOnly a client that is answered nothing is idle too')
})

t.test('inboundOnly: pushes to a client keep it open without inboundOnly, not with it', async (t) => {
  const clock = new FakeClock()
  const kept: Array<ConnectionHandle | null> = []
  const protocol = sessionLines((handle) => { kept.push(handle) })
  const { open } = await serveCore(t, protocol, handlers, { clock, idleTimeoutMs: 0, frameTimeoutMs: 0 })
  const inbound = await open()
  const any = await open()
  inbound.socket.write('idle 1000 inbound\n')
  any.socket.write('idle 1000\n')
  await until(() => inbound.text === 'ok\n' && any.text === 'ok\n', 'set')
  for (let step = 0; step < 20; step++) {
    for (const handle of kept) handle?.send('tick')
    clock.advance(100)
    await turns(3)
  }
  await inbound.until(() => inbound.closed, 'closed: pushes are not the client speaking')
  t.notOk(any.closed, 'pushes are progress when every byte counts')
  t.match(inbound.text, /-BYE idle anon\n$/)
})

t.test('lastWords: a frame timeout, a slow frame and the connection\'s age each get the protocol\'s words first', async (t) => {
  const clock = new FakeClock()
  const { open } = await serveCore(t, sessionLines(), handlers, { clock, idleTimeoutMs: 0, frameTimeoutMs: 1000, minFrameBytesPerSecond: 0 })
  const peer = await open()
  peer.socket.write('name half\nping wit')
  await until(() => peer.text === 'ok\n', 'named')
  await pass(clock, 2000)
  await peer.until(() => peer.closed, 'closed for its frame timeout')
  t.equal(peer.text, 'ok\n-BYE frame-timeout half\n')

  const clock2 = new FakeClock()
  const { open: open2 } = await serveCore(t, sessionLines(), handlers, { clock: clock2, idleTimeoutMs: 0, frameTimeoutMs: 0, minFrameBytesPerSecond: 100, slowFrameGraceMs: 500 })
  const slow = await open2()
  slow.socket.write('ping s')
  await turns(5)
  await pass(clock2, 3000, 250)
  await slow.until(() => slow.closed, 'closed for its slow frame')
  t.equal(slow.text, '-BYE slow-frame anon\n')

  const clock3 = new FakeClock()
  const { open: open3 } = await serveCore(t, sessionLines(), handlers, { clock: clock3, idleTimeoutMs: 0, frameTimeoutMs: 0, maxConnectionAgeMs: 1000 })
  const old = await open3()
  old.socket.write('ping\n')
  await until(() => old.text === 'pong\n', 'answered')
  await pass(clock3, 20_000, 500)
  await old.until(() => old.closed, 'closed for its age')
  t.equal(old.text, 'pong\n-BYE age anon\n')
})

t.test('lastWords: shutdown, and the inbound budget', async (t) => {
  const { server, open } = await serveCore(t, sessionLines(), handlers, { idleTimeoutMs: 0 })
  const peer = await open()
  peer.socket.write('name s\n')
  await until(() => peer.text === 'ok\n', 'named')
  await server.close({ graceMs: 1000 })
  await peer.until(() => peer.closed, 'closed by the shutdown')
  t.equal(peer.text, 'ok\n-BYE shutdown s\n')

  const tagged: ServerProtocol<Buffer, Buffer> = { ...taggedProtocol(), maxFrameBytes: 65_537, lastWords: (reason) => [Buffer.from(`bye ${reason}`)] }
  const { server: budgeted, open: openBudgeted } = await serveCore(t, tagged, { echo: (req: Buffer) => req }, { maxInboundBufferedBytes: 40_000, idleTimeoutMs: 0, frameTimeoutMs: 0 })
  const hog = await openBudgeted()
  hog.socket.write(taggedRequest('echo', 1, Buffer.alloc(65_000)).subarray(0, 50_000))
  await hog.until(() => hog.closed, 'closed by the budget')
  t.equal(budgeted.stats().inboundBudgetClosed, 1)
  t.equal(hog.text, 'bye inbound-budget')
})

t.test('close({ reset: true }) resets the connection; a plain close ends it', async (t) => {
  const { open } = await serveCore(t, linesProtocol(), {
    reset: (_arg: string, ctx: { connection: ConnectionHandle }) => { ctx.connection.close({ reset: true, reason: 'test' }); return 'unsent' },
    end: (_arg: string, ctx: { connection: ConnectionHandle }) => { ctx.connection.close('test'); return 'unsent' }
  })
  const reset = await open()
  let resetError = ''
  reset.socket.on('error', (err: NodeJS.ErrnoException) => { resetError = err.code ?? '' })
  reset.socket.write('reset\n')
  await reset.until(() => reset.closed, 'reset')
  t.equal(resetError, 'ECONNRESET')
  const ended = await open()
  let endError = ''
  ended.socket.on('error', (err: NodeJS.ErrnoException) => { endError = err.code ?? '' })
  ended.socket.write('end\n')
  await ended.until(() => ended.closed, 'ended')
  t.equal(endError, '')
})
