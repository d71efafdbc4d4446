/**
 * FramedConnection.endAfterFlush over a real loopback socket: what was sent before
 * reaches the peer, then the socket ends; a frame sent after that (an async
 * handler settling late) is dropped with an error, never written after the end.
 */
import t from 'tap'
import { createServer, connect, type Socket } from 'node:net'
import { ErrorCode, type RpcError } from '../../codec/errors.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { FramedConnection } from '../../transport/framed-connection.js'
import { socketStream } from '../../transport/net-stream.js'

t.test('a frame sent after endAfterFlush is dropped, not written after the end', async t => {
  const received: Buffer[] = []
  let peerEnded!: () => void
  const ended = new Promise<void>((resolve) => { peerEnded = resolve })
  const server = createServer((peer: Socket) => {
    peer.on('data', (chunk: Buffer) => received.push(chunk))
    peer.on('end', () => { peer.end(); peerEnded() })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())))
  const port = (server.address() as { port: number }).port
  const socket = connect({ port, host: '127.0.0.1' })
  await new Promise<void>((resolve) => socket.once('connect', resolve))
  const connection = new FramedConnection(socketStream(socket), { socket, framing: krpcFraming })
  const closes: Array<RpcError | undefined> = []
  connection.attach({ onFrame: () => true, onClose: (error) => { closes.push(error) } })
  const frame = (byte: number): Buffer => Buffer.from([0, 0, 0, 1, byte])
  const outcomes: Array<RpcError | undefined> = []
  connection.send({ slices: [frame(1)], bytes: 5, onSent: (error) => outcomes.push(error) })
  connection.endAfterFlush()
  connection.send({ slices: [frame(2)], bytes: 5, onSent: (error) => outcomes.push(error) })
  await ended
  await new Promise((resolve) => setImmediate(resolve))
  t.same([...Buffer.concat(received)], [0, 0, 0, 1, 1], 'only the frame sent before the end')
  t.equal(outcomes.length, 2)
  t.equal(outcomes[0], undefined, 'the first was sent')
  t.equal(outcomes[1]?.code, ErrorCode.CONNECTION_CLOSED, 'the late one was dropped')
  t.equal(closes.length, 1, 'the connection closed once')
  t.notMatch(closes[0]?.message ?? '', /write after end/, 'no write after end')
  socket.destroy()
})
