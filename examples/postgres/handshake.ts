import type { TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Handshake, HandshakeStep } from '../../codec/protocol.js'
import type { ConnectionHandle } from '../../reactor/index.js'
import type { Reply } from './shared.js'
import type { Session } from './session.js'
import { secureChannelMaker } from './tls.js'
import {
  authFraming, CANCEL_REQUEST_CODE, fatalError, GSSENC_REQUEST_CODE, MAX_AUTH_MESSAGE_BYTES, SSL_REQUEST_CODE, startupFraming
} from './wire.js'

/**
 * A connection's start-up as the server's set-up phase (the protocol's
 * `handshake`), as PostgreSQL's ProcessStartupPacket and
 * ClientAuthentication run it: untyped packets (`startupFraming`) until the
 * StartupMessage, SCRAM's typed password messages (`authFraming`) when the
 * user has a password, and `done` with the first ReadyForQuery; the
 * protocol's typed framing reads the rest.
 *
 * - SSLRequest: `N`, or `S` and TLS with `tls` (the StartupMessage then
 *   comes through it); GSSENCRequest: `N`. Bytes the client sent behind
 *   either before it had the answer are refused FATAL 08P01
 *   (CVE-2021-23214: they were not encrypted).
 * - CancelRequest: cancels the target session's statement, then the
 *   connection ends without a reply and without a failure (nothing logged).
 * - With `tls`, TLS is required (as a `hostssl` pg_hba.conf line): a
 *   StartupMessage in the clear is refused 28000.
 * - A FATAL answer (a bad protocol version, no user, a wrong password)
 *   fails the set-up: its bytes go out, then the connection closes.
 */
export function pgHandshake (tls: TlsOptions | undefined): (remote: string, connection: ConnectionHandle) => Handshake<{ user?: string }> {
  const secureChannel = tls === undefined ? null : secureChannelMaker(tls)
  return (remote, connection) => {
    const session = (connection.state as { session: Session }).session
    let secured = false
    return {
      framing: startupFraming,
      // The largest frame of the set-up: a password message (start-up packets stop at 10000 bytes in their framing).
      maxFrameBytes: MAX_AUTH_MESSAGE_BYTES + 5,
      onFrame (frame: Buffer, pipelined: number): HandshakeStep<{ user?: string }> {
        // SCRAM's exchange: typed password messages.
        if (session.phase === 'auth-first' || session.phase === 'auth-final') {
          return started(session, session.password(frame[0]!, frame.subarray(5)))
        }
        const code = frame.readInt32BE(4)
        if (code === SSL_REQUEST_CODE || code === GSSENC_REQUEST_CODE) {
          const upgrade = code === SSL_REQUEST_CODE && secureChannel !== null && !secured
          if (pipelined > 0) {
            const refusal = code === SSL_REQUEST_CODE ? UNENCRYPTED_AFTER_SSL : UNENCRYPTED_AFTER_GSS
            // Without TLS, PostgreSQL answers the request first, then refuses what came behind it.
            return { send: upgrade ? [[refusal]] : [[ANSWER_N], [refusal]], error: new RpcError(ErrorCode.NEGOTIATION_FAILED, 'unencrypted data after an encryption request') }
          }
          if (!upgrade) return { send: [[ANSWER_N]] }
          secured = true
          return { send: [[ANSWER_S]], upgrade: secureChannel }
        }
        if (code === CANCEL_REQUEST_CODE) {
          session.cancelPacket(frame, 0, frame.length)
          return { close: true }
        }
        if (secureChannel !== null && !secured) {
          const host = remote.slice(0, remote.lastIndexOf(':')).replace(/^\[|\]$/g, '')
          return { send: [[fatalError('28000', `no pg_hba.conf entry for host "${host}", no encryption`)]], error: new RpcError(ErrorCode.NEGOTIATION_FAILED, 'TLS required') }
        }
        return started(session, session.startupPacket(frame, 0, frame.length))
      }
    }
  }
}

// The step after a StartupMessage or a password message: refused, the password asked (typed messages next), or started.
function started (session: Session, reply: Reply): HandshakeStep<{ user?: string }> {
  const send = reply.bytes === null ? undefined : [[reply.bytes]]
  if (reply.close) return { send, error: new RpcError(ErrorCode.NEGOTIATION_FAILED, 'start-up refused') }
  if (session.phase === 'ready') return { send, done: { user: session.startup!.user } }
  return { send, framing: authFraming }
}

const ANSWER_N = Buffer.from('N')
const ANSWER_S = Buffer.from('S')
const UNENCRYPTED_AFTER_SSL = fatalError('08P01', 'received unencrypted data after SSL request',
  'This could be either a client-software bug or evidence of an attempted man-in-the-middle attack.')
const UNENCRYPTED_AFTER_GSS = fatalError('08P01', 'received unencrypted data after GSSAPI encryption request',
  'This could be either a client-software bug or evidence of an attempted man-in-the-middle attack.')
