import type { Socket } from 'node:net'
import { Duplex } from 'node:stream'
import { createSecureContext, TLSSocket, type TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Handshake, HandshakeStep, SecureChannel } from '../../codec/protocol.js'
import { Session } from './session.js'
import type { Shared } from './shared.js'
import { CANCEL_REQUEST_CODE, fatalError, GSSENC_REQUEST_CODE, SSL_REQUEST_CODE } from './wire.js'

/**
 * TLS as PostgreSQL negotiates it: the client's SSLRequest is answered `S`
 * and the connection turns TLS (then the StartupMessage comes through it).
 * With TLS on, this example requires it (as a `hostssl` pg_hba.conf line):
 * a StartupMessage in the clear is refused 28000. A CancelRequest, which
 * libpq sends in the clear, is honoured and closed without a reply.
 */
export function tlsHandshake (tls: TlsOptions, shared: Shared): (remote: string) => Handshake<{ user?: string }> {
  const secureContext = createSecureContext(tls)
  const requestCert = tls.requestCert === true
  return (remote) => ({
    maxFrameBytes: 10_000,
    onFrame (frame: Buffer, pipelined: number): HandshakeStep<{ user?: string }> {
      const code = frame.readInt32BE(4)
      // CVE-2021-23214: bytes sent behind an SSLRequest, before its answer, are refused, not read as TLS.
      if (code === SSL_REQUEST_CODE && pipelined > 0) return { send: [[UNENCRYPTED_AFTER_SSL]], close: true }
      if (code === SSL_REQUEST_CODE) return { send: [[Buffer.from('S')]], upgrade: (raw) => secureChannel(raw, secureContext, requestCert), done: {} }
      if (code === GSSENC_REQUEST_CODE) return { send: [[Buffer.from('N')]] }
      if (code === CANCEL_REQUEST_CODE) {
        new Session(shared).cancelPacket(frame, 0, frame.length)
        return { close: true }
      }
      const host = remote.slice(0, remote.lastIndexOf(':')).replace(/^\[|\]$/g, '')
      return {
        send: [[fatalError('28000', `no pg_hba.conf entry for host "${host}", no encryption`)]],
        error: new RpcError(ErrorCode.CONNECTION_CLOSED, 'TLS required')
      }
    }
  })
}

const UNENCRYPTED_AFTER_SSL = fatalError('08P01', 'received unencrypted data after SSL request',
  'This could be either a client-software bug or evidence of an attempted man-in-the-middle attack.')

// node:tls over a Duplex of ours: what the connection reads from the socket is pushed in, what TLS writes goes to the socket.
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
