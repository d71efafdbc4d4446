// Tiny pipelined answers to a peer that does not read cost their wire
// bytes, not an object each: once the connection waits for 'drain', small
// answers are encoded in place into chunks of the connection's own, so the
// outbound bounds (which count bytes) bound the heap too. Before, each
// answer of a few bytes was a buffer and a transfer of its own (~190 bytes
// of heap), and 10 connections x 1 M NOOPs took the memcached example past
// 1.9 GiB without meeting any bound.
import t from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { servePeers } from '../helpers/socket-peer.js'
import { linesProtocol } from '../helpers/toy-protocols.js'

t.test('a backed-up connection queues 50 000 small answers in a few entries, and delivers them all', async t => {
  const { server } = await servePeers(t, linesProtocol(), 'lines', {
    big: () => 'x'.repeat(8 * 1024 * 1024),
    echo: (arg: string) => arg
  }, { logger: null })
  const { port } = server.address()!
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  socket.pause()
  const count = 50_000
  // The big answer fills the kernel's buffers; the small ones queue behind it.
  socket.write('big\n' + 'echo y\n'.repeat(count))
  for (let i = 0; i < 1000 && server.stats().callsSucceeded < count + 1; i++) await new Promise(resolve => setTimeout(resolve, 5))
  t.equal(server.stats().callsSucceeded, count + 1, 'every request answered')
  const [stats] = server.connectionStats()
  t.ok(stats!.queuedTransfers > count / 2, `${stats!.queuedTransfers} answers wait for the peer`)
  t.ok(stats!.queuedEntries < 100, `in ${stats!.queuedEntries} queue entries`)
  let received = 0
  socket.on('data', (chunk: Buffer) => { received += chunk.length })
  socket.resume()
  const total = 8 * 1024 * 1024 + 1 + count * 2
  for (let i = 0; i < 2000 && received < total; i++) await new Promise(resolve => setTimeout(resolve, 5))
  t.equal(received, total, 'every byte arrived once the peer read')
  socket.destroy()
})
