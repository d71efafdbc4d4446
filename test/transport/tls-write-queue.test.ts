/**
 * FramedConnection.writeQueueBytes over TLS: the TLS handle counts a write whole
 * until it completes; the TCP handle under it shows the kernel taking the
 * bytes, the progress the idle scan must see.
 */
import t from 'tap'
import { createServer, type Socket } from 'node:net'
import { once } from 'node:events'
import { TLSSocket, connect as tlsConnect, createSecureContext } from 'node:tls'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { FramedConnection } from '../../transport/framed-connection.js'
import { socketStream } from '../../transport/net-stream.js'
import { haveOpenssl, makeCerts } from '../helpers/tls-certs.js'

if (!haveOpenssl()) {
  t.plan(0, 'skip: the openssl command is missing (apt-get install openssl)')
} else {
  const certs = makeCerts()
  t.teardown(() => certs.remove())
  t.test('a large write to a peer that does not read: writeQueueBytes counts its queued bytes', async t => {
    const secureContext = createSecureContext({ cert: certs.serverCert, key: certs.serverKey })
    const accepted: TLSSocket[] = []
    const server = createServer((raw: Socket) => {
      const secure = new TLSSocket(raw, { isServer: true, secureContext })
      secure.on('error', () => {})
      accepted.push(secure)
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const port = (server.address() as { port: number }).port
    const client = tlsConnect({ host: '127.0.0.1', port, ca: certs.ca, servername: 'localhost' })
    client.on('error', () => {})
    t.teardown(() => { client.destroy(); for (const s of accepted) s.destroy(); server.close() })
    await once(client, 'secureConnect')
    // The peer reads nothing from here on.
    client.pause()
    const socket = accepted[0]!
    const connection = new FramedConnection(socketStream(socket), { socket, framing: krpcFraming })
    connection.attach({ onFrame: () => true, onClose: () => {} })
    socket.write(Buffer.alloc(32 << 20, 1))
    await new Promise(resolve => setTimeout(resolve, 50))
    const before = connection.writeQueueBytes
    t.ok(before > 0, `queued bytes seen: ${before}`)
    // The peer takes a few MB, far from the whole write: the count falls.
    for (let i = 0; i < 4; i++) {
      client.read(1 << 20)
      await new Promise(resolve => setTimeout(resolve, 20))
    }
    const after = connection.writeQueueBytes
    t.ok(after > 0 && after < before, `progress seen during one write: ${before} then ${after}`)
  })
}
