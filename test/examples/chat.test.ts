// The chat example: pushes to a room's members (ConnectionGroup), the
// sender left out, members gone with their connections, nicks held by one
// connection at a time, and rate limits by connection and by peer address
// (on a FakeClock) answering over-limit commands without running their
// handlers, which neither a new nick nor another user's nick escapes.
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { chatServer } from '../../examples/chat/main.js'
import { FakeClock } from '../../reactor/testing.js'
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

t.test('the rate-limit filter answers over-limit commands itself, per connection and window', async t => {
  const clock = new FakeClock()
  const open = await serve(t, { rate: 3, now: () => clock.now() })
  const ann = await open()
  const bob = await open()
  bob.socket.write('NICK bob\nJOIN r\n')
  await bob.until(() => lines(bob).length === 2, 'bob joined')
  ann.socket.write('NICK ann\nJOIN r\nSAY r 1\nSAY r 2\n')
  await ann.until(() => lines(ann).length === 4, 'four answers')
  t.same(lines(ann), ['OK', 'joined r (2)', '1', '-ERR rate limited'], 'three calls a window per connection, NICK included')
  await bob.until(() => lines(bob).length === 3, 'bob got one')
  t.same(lines(bob).slice(2), ['> r ann: 1'], 'the refused SAY never reached the room')
  clock.advance(1000)
  ann.received = Buffer.alloc(0)
  ann.socket.write('SAY r again\n')
  await ann.until(() => lines(ann).length === 1, 'the answer')
  t.same(lines(ann), ['1'], 'a new window')
  await bob.until(() => lines(bob).length === 4, 'bob got it')
  t.equal(lines(bob)[3], '> r ann: again')
})

t.test('a new nick buys no new budget: rotating nicks in one burst gets the connection\'s rate, no more', async t => {
  const clock = new FakeClock()
  const open = await serve(t, { rate: 5, now: () => clock.now() })
  const eve = await open()
  // A new nick before every third command: keyed by nick, each would start a fresh window.
  let burst = ''
  for (let i = 0; i < 30; i++) burst += i % 3 === 0 ? `NICK eve${i}\n` : 'WHO r\n'
  eve.socket.write(burst)
  await eve.until(() => eve.text.split('\n').length > 30, 'thirty answers')
  const answers = eve.text.split('\n').slice(0, 30)
  t.equal(answers.filter(a => a !== '-ERR rate limited').length, 5, 'five accepted in the window')
  t.equal(answers.filter(a => a === '-ERR rate limited').length, 25, 'the other 25 refused')
})

t.test('connections from one address share its budget', async t => {
  const clock = new FakeClock()
  const open = await serve(t, { rate: 3, addressRate: 5, now: () => clock.now() })
  const peers = [await open(), await open(), await open()]
  let accepted = 0
  let refusedByAddress = 0
  for (const peer of peers) {
    peer.socket.write('WHO r\nWHO r\nWHO r\n')
    await peer.until(() => peer.text.split('\n').length > 3, 'three answers')
    const answers = peer.text.split('\n').slice(0, 3)
    accepted += answers.filter(a => !a.startsWith('-ERR')).length
    refusedByAddress += answers.filter(a => a === '-ERR rate limited (address)').length
  }
  t.equal(accepted, 5, 'nine commands on three connections, five accepted: the address\'s budget')
  t.equal(refusedByAddress, 4, 'the rest refused for the address')
  clock.advance(1000)
  const late = peers[2]!
  late.received = Buffer.alloc(0)
  late.socket.write('WHO r\n')
  await late.until(() => lines(late).length === 0 && late.text.length > 0, 'an answer')
  t.equal(late.text, '\n', 'a new window for the address (WHO of an unknown room is empty)')
})

t.test('a nick belongs to one connection: a second cannot take it, and cannot spend its holder\'s budget', async t => {
  const clock = new FakeClock()
  const open = await serve(t, { rate: 5, now: () => clock.now() })
  const ann = await open()
  const eve = await open()
  ann.socket.write('NICK ann\n')
  await ann.until(() => lines(ann).length === 1, 'ann named')
  t.same(lines(ann), ['OK'])
  let burst = 'NICK ann\n'
  for (let i = 0; i < 20; i++) burst += 'WHO r\n'
  eve.socket.write(burst)
  await eve.until(() => eve.text.split('\n').length > 21, 'eve answered')
  t.equal(eve.text.split('\n')[0], '-ERR nick ann is in use', 'taking a nick in use is refused')
  ann.received = Buffer.alloc(0)
  ann.socket.write('JOIN r\nSAY r hi\nWHO r\nLEAVE r\n')
  await ann.until(() => lines(ann).length === 4, 'ann answered')
  t.same(lines(ann), ['joined r (1)', '0', 'ann', 'OK'], 'none of the victim\'s commands refused')
  // Freed when its holder closes.
  ann.socket.destroy()
  clock.advance(1000)
  for (let i = 0; i < 200; i++) {
    eve.received = Buffer.alloc(0)
    eve.socket.write('NICK ann\n')
    await eve.until(() => lines(eve).length === 1, 'NICK')
    if (lines(eve)[0] === 'OK') break
    await new Promise(resolve => setTimeout(resolve, 5))
  }
  t.same(lines(eve), ['OK'], 'a closed connection\'s nick is free')
})
