// TlsTunnel: a TLS handshake carried in tokens (as KRPC's TLS_HANDSHAKE
// steps carry it), then the same session joined onto a real socket pair:
// what TLS writes after the last token goes out first, the peer's pause
// holds (the tunnel never resumes a socket it did not pause), and ending
// the TLS stream finishes only once the socket has sent everything.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { createServer, connect, type Socket } from 'node:net'
import { createSecureContext } from 'node:tls'
import { TlsTunnel } from '../../codec/krpc/tls-tunnel.js'
import { withCerts, type TestCerts } from '../helpers/tls-certs.js'

withCerts(t, tests)

async function socketPair (t: Test): Promise<[Socket, Socket]> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const accepted = once(server, 'connection')
  const client = connect((server.address() as { port: number }).port, '127.0.0.1')
  const [serverSide] = await accepted as [Socket]
  await once(client, 'connect')
  t.teardown(() => { client.destroy(); serverSide.destroy(); server.close() })
  return [serverSide, client]
}

/** Runs the handshake token for token; returns the server's last token when TLS 1.3 keeps it to send raw. */
async function handshake (client: TlsTunnel, server: TlsTunnel): Promise<Buffer | null> {
  let step = await client.continue(new Uint8Array(0))
  for (let i = 0; i < 8; i++) {
    const s = await server.continue(step.token)
    if (s.done && server.protocol === 'TLSv1.3') return s.token
    if (s.done) {
      // TLS 1.2: the server's last flight is the client's last token.
      await client.continue(s.token)
      return null
    }
    step = await client.continue(s.token)
  }
  throw new Error('the handshake did not finish')
}

function tests (certs: TestCerts): void {
  async function joined (t: Test, maxVersion: 'TLSv1.3' | 'TLSv1.2' = 'TLSv1.3', pauseOnRead = false) {
    const server = TlsTunnel.server(createSecureContext({ cert: certs.serverCert, key: certs.serverKey, maxVersion }), false)
    const client = TlsTunnel.client({ ca: certs.ca, servername: 'localhost' })
    t.teardown(() => { server.close(); client.close() })
    const pending = await handshake(client, server)
    const [serverRaw, clientRaw] = await socketPair(t)
    const serverChannel = server.join(serverRaw, pending)
    const clientChannel = client.join(clientRaw, null)
    serverRaw.on('data', (chunk: Buffer) => {
      // As a connection whose owner stops reading while it handles this chunk.
      if (pauseOnRead) serverRaw.pause()
      serverChannel.input(chunk)
    })
    clientRaw.on('data', (chunk: Buffer) => clientChannel.input(chunk))
    return { server, client, serverRaw, clientRaw, serverChannel, clientChannel }
  }

  t.test('after the tokens, both sides talk TLS on the socket, TLS 1.3 and 1.2', async t => {
    for (const version of ['TLSv1.3', 'TLSv1.2'] as const) {
      const j = await joined(t, version)
      const got = once(j.serverChannel.stream, 'data')
      j.clientChannel.stream.write('ping')
      t.equal(String((await got)[0]), 'ping', `${version}: client to server`)
      const back = once(j.clientChannel.stream, 'data')
      j.serverChannel.stream.write('pong')
      t.equal(String((await back)[0]), 'pong', `${version}: server to client`)
    }
  })

  t.test('a paused socket stays paused while TLS reads what was already read', async t => {
    const j = await joined(t, 'TLSv1.3', true)
    const got = once(j.serverChannel.stream, 'data')
    j.clientChannel.stream.write('held')
    t.equal(String((await got)[0]), 'held')
    for (let i = 0; i < 5; i++) await new Promise(resolve => setImmediate(resolve))
    t.equal(j.serverRaw.isPaused(), true, 'the tunnel did not resume it')
  })

  t.test('ending TLS finishes once the socket has sent it all, to a reader that is behind', async t => {
    const j = await joined(t)
    const payload = Buffer.alloc(8 * 1024 * 1024, 7)
    let received = 0
    j.clientChannel.stream.on('data', (chunk: Buffer) => { received += chunk.length })
    const ended = once(j.clientChannel.stream, 'end')
    j.clientRaw.pause()
    // As FramedConnection.endAfterFlush: end the TLS stream, destroy the socket when it has finished.
    let socketDone: boolean | undefined
    const finished = new Promise<void>((resolve) => {
      j.serverChannel.stream.end(payload, () => {
        socketDone = j.serverRaw.writableFinished
        j.serverRaw.destroy()
        resolve()
      })
    })
    await new Promise(resolve => setTimeout(resolve, 20))
    j.clientRaw.resume()
    await Promise.all([ended, finished])
    t.equal(socketDone, true, 'TLS finished after the socket had sent everything')
    t.equal(received, payload.length, 'every byte arrived before the close')
  })
}
