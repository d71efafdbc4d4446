/**
 * Connection metrics (Server.connectionStats, Client.connectionStats), as
 * Kudu's TestClientConnectionMetrics checks them with 8 MiB sidecars: a
 * queue that waits for 'drain' while the kernel takes a big frame in parts,
 * and answers to one read's pipelined requests leaving in one write.
 */
import t from 'tap'
import { Client } from '../../reactor/krpc/client.js'
import { RawClient, clientHandshakeBytes, requestFrame } from '../helpers/krpc-peers.js'
import { CalculatorService, calculatorDef, startServer } from '../helpers/reactor-harness.js'

const MIB = 1024 * 1024

t.test('8 MiB sidecars: partial writes, drain waits and queued transfers are visible on both sides', async t => {
  const { server, endpoint } = await startServer(t)
  const client = new Client({ endpoint })
  t.teardown(() => client.close())
  await client.service(CalculatorService).Add({ x: 1, y: 2 })
  const sidecar = Buffer.alloc(8 * MIB, 0x61)
  const calls = [0, 1, 2].map(() => client.call(endpoint, calculatorDef, 'EchoSidecars', {}, { sidecars: [sidecar] }))
  // Nothing is written in the caller's stack: the requests go out at the end
  // of this microtask checkpoint, together.
  t.match(client.connectionStats()[0], { queuedTransfers: 3, socketBufferedBytes: 0 })
  await Promise.resolve()
  // Same turn, checkpoint done: the first request is in the socket, the
  // kernel took part of it; the other two wait in the transfer queue for 'drain'.
  const [during] = client.connectionStats()
  t.match(during, { endpoint, pendingCalls: 3, queuedTransfers: 2 })
  t.ok(during!.queuedBytes > 16 * MIB, `queued bytes ${during!.queuedBytes}`)
  t.ok(during!.socketBufferedBytes > 0, 'the socket still buffers part of the first')
  t.ok(during!.partialWrites >= 1)
  t.ok(during!.drainWaits >= 1)
  for (const result of await Promise.all(calls)) t.equal(result.sidecars[0]!.length, 8 * MIB)

  const [after] = client.connectionStats()
  t.match(after, { pendingCalls: 0, queuedTransfers: 0, queuedBytes: 0, socketBufferedBytes: 0, dropped: 0 })
  t.ok(after!.drainWaits >= 3, 'every 8 MiB request waited for drain')
  t.ok(after!.bytesWritten > 24 * MIB)
  const [serverSide] = server.connectionStats()
  t.match(serverSide, { callsInFlight: 0, queuedTransfers: 0, queuedBytes: 0, dropped: 0 })
  t.ok(serverSide!.partialWrites >= 3, 'every 8 MiB answer was written in parts')
  t.ok(serverSide!.drainWaits >= 3)
  t.ok(serverSide!.bytesRead > 24 * MIB)
  t.equal(serverSide!.bytesWritten, after!.bytesRead, 'what the server wrote, the client read')
  t.ok(serverSide!.framesRead >= 4)
})

t.test('the answers to one read of pipelined requests leave in one write', async t => {
  const { server, port } = await startServer(t)
  const raw = await RawClient.connect(port)
  t.teardown(() => raw.close())
  const add = (id: number): Buffer => requestFrame(id, CalculatorService.fullName, 'Add', Buffer.from([0x08, id, 0x10, 1]))
  raw.write(Buffer.concat([clientHandshakeBytes(), add(0)]))
  await raw.nextResponse()
  const before = server.connectionStats()[0]!
  // One write of 20 requests: one read on the server.
  raw.write(Buffer.concat(Array.from({ length: 20 }, (_, i) => add(i + 1))))
  for (let i = 0; i < 20; i++) await raw.nextResponse()
  const after = server.connectionStats()[0]!
  t.equal(after.framesRead - before.framesRead, 20)
  t.equal(after.immediateWrites - before.immediateWrites, 0, 'no answer went out alone')
  t.equal(after.batchedWrites - before.batchedWrites, 1, 'one write')
  t.equal(after.batchedFrames - before.batchedFrames, 20, 'carrying all 20 answers')
})

t.test('both ends read through onread (the fast path), not data events', async t => {
  const { server, endpoint } = await startServer(t)
  const client = new Client({ endpoint })
  t.teardown(() => client.close())
  t.same(await client.service(CalculatorService).Add({ x: 2, y: 3 }), { result: 5 })
  t.equal(client.connectionStats()[0]!.readPath, 'onread', 'client')
  t.equal(server.connectionStats()[0]!.readPath, 'onread', 'server: the accepted socket was moved to a reader')
})
