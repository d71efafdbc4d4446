import type { Socket } from 'node:net'
import { Duplex } from 'node:stream'
import { createSecureContext, TLSSocket, type TlsOptions } from 'node:tls'
import type { SecureChannel } from '../../codec/protocol.js'

/**
 * TLS as PostgreSQL negotiates it: after an SSLRequest answered `S`
 * (handshake.ts), the connection's socket carries TLS, and the start-up
 * goes on through it. This makes the channel a set-up step's `upgrade`
 * switches to: node:tls over a Duplex of ours.
 */
export function secureChannelMaker (tls: TlsOptions): (raw: Socket) => SecureChannel {
  const secureContext = createSecureContext(tls)
  const requestCert = tls.requestCert === true
  return (raw) => secureChannel(raw, secureContext, requestCert)
}

// What the connection reads from the socket is pushed in, what TLS writes goes to the socket.
function secureChannel (raw: Socket, secureContext: ReturnType<typeof createSecureContext>, requestCert: boolean): SecureChannel {
  const wire = new Duplex({
    read: () => {},
    write: (chunk: Buffer, _encoding, callback) => { if (raw.write(chunk)) callback(); else raw.once('drain', () => callback()) },
    final: (callback) => { raw.end(() => callback()) }
  })
  const socket = new TLSSocket(wire, { isServer: true, secureContext, requestCert, rejectUnauthorized: requestCert })
  socket.disableRenegotiation()
  socket.on('error', () => { raw.destroy() })
  return { stream: socket, input: (chunk) => { wire.push(chunk) } }
}
