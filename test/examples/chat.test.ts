// The chat example: pushes to a room's members (ConnectionGroup), the
// sender left out, members gone with their connections, and a per-user
// rate-limit filter (on a fake clock) answering over-limit commands
// without running their handlers.
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { chatServer } from '../../examples/chat/main.js'
import { Peer } from '../helpers/socket-peer.js'

async function serve (t: Test, options: Parameters<typeof chatServer>[0] = {}): Promise<() => Promise<Peer>> {
  const server = chatServer(options)
  const { port } = await server.listen(0, '127.0.0.1')
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const peer of peers) peer.socket.destroy()
    await server.close({ graceMs: 50 })
  })
  return async () => {
    const socket = connect(port, '127.0.0.1')
    await once(socket, 'connect')
    const peer = new Peer(socket)
    peers.push(peer)
    return peer
  }
}

const lines = (peer: Peer): string[] => peer.text.split('\n').filter(l => l !== '')

t.test('members of a room receive what is said there, the speaker does not', async t => {
  const open = await serve(t)
  const [ann, bob, cy] = [await open(), await open(), await open()]
  ann.socket.write('NICK ann\nJOIN r\n')
  bob.socket.write('NICK bob\nJOIN r\n')
  cy.socket.write('NICK cy\nJOIN other\n')
  await ann.until(() => lines(ann).length === 2, 'ann joined')
  await bob.until(() => lines(bob).length === 2, 'bob joined')
  await cy.until(() => lines(cy).length === 2, 'cy joined')
  ann.socket.write('SAY r hello there\nWHO r\n')
  await ann.until(() => lines(ann).length === 4, 'ann answered')
  t.same(lines(ann).slice(2), ['1', 'ann bob'], 'one receiver; WHO lists both')
  await bob.until(() => lines(bob).length === 3, 'bob got the message')
  t.equal(lines(bob)[2], '> r ann: hello there')
  t.same(lines(cy), ['OK', 'joined other (1)'], 'another room hears nothing')
  bob.socket.destroy()
  for (let i = 0; i < 200; i++) {
    ann.received = Buffer.alloc(0)
    ann.socket.write('WHO r\n')
    await ann.until(() => lines(ann).length === 1, 'WHO')
    if (lines(ann)[0] === 'ann') break
  }
  t.same(lines(ann), ['ann'], 'a closed member left the room')
})

t.test('the rate-limit filter answers over-limit commands itself, per user and window', async t => {
  let now = 0
  const open = await serve(t, { rate: 3, now: () => now })
  const ann = await open()
  const bob = await open()
  bob.socket.write('NICK bob\nJOIN r\n')
  await bob.until(() => lines(bob).length === 2, 'bob joined')
  ann.socket.write('NICK ann\nJOIN r\nSAY r 1\nSAY r 2\nSAY r 3\n')
  await ann.until(() => lines(ann).length === 5, 'five answers')
  // NICK counts for the address it came from; then ann has three a window.
  t.same(lines(ann), ['OK', 'joined r (2)', '1', '1', '-ERR rate limited'], 'three calls a window per user')
  await bob.until(() => lines(bob).length === 4, 'bob got two')
  t.same(lines(bob).slice(2), ['> r ann: 1', '> r ann: 2'], 'the refused SAY never reached the room')
  now += 1000
  ann.received = Buffer.alloc(0)
  ann.socket.write('SAY r again\n')
  await ann.until(() => lines(ann).length === 1, 'the answer')
  t.same(lines(ann), ['1'], 'a new window')
  await bob.until(() => lines(bob).length === 5, 'bob got it')
  t.equal(lines(bob)[4], '> r ann: again')
})
