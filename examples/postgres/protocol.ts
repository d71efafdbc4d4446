import type { TlsOptions } from 'node:tls'
import type { CallContext, CallHead, CallInfo, ConnectionHandle, RefusalReason, RouteHandlers, ServerProtocol } from '../../reactor/index.js'
import type { RpcError } from '../../codec/errors.js'
import { pgHandshake } from './handshake.js'
import { Session } from './session.js'
import type { Reply, Shared } from './shared.js'
import { fatalError, isGroup, messageFraming, StreamError } from './wire.js'

/**
 * PostgreSQL's protocol v3 as a nyala `ServerProtocol`: the start-up is the
 * connection's set-up (handshake.ts); then every client message is a call
 * of the group `pg`, its route the message type (a letter), or `group` for
 * extended-query messages that arrived together up to a Sync or Flush (one
 * call for pgbench's Bind, Execute, Sync), answered in order. The
 * protocol's `execution: 'sequential'` runs one connection's calls one at a
 * time, in arrival order, each after the previous one was answered, as a
 * PostgreSQL backend does.
 */

/** A connection's state: its session. */
export class PgConnection {
  readonly session: Session

  constructor (shared: Shared, connection: ConnectionHandle | null) {
    this.session = new Session(shared)
    connection?.on('close', () => this.session.closed())
  }
}

/** The request a route gets: the message body (a group's: its messages, whole). */
export type PgRequest = Buffer

const TYPE_NAMES: string[] = Array.from({ length: 256 }, (_, i) => String.fromCharCode(i))
const TYPE_KEYS: object[] = TYPE_NAMES.map(name => Object.freeze({ name }))
const GROUP_KEY = Object.freeze({ name: 'group' })

/** The protocol, for a server whose sessions share `shared`; with `tls`, an SSLRequest is answered `S` and TLS is required. */
export function pgProtocol (shared: Shared, maxFrameBytes = 1024 * 1024, tls?: TlsOptions): ServerProtocol<PgRequest, Reply, PgConnection> {
  return {
    name: 'postgres',
    ordering: 'in-order',
    execution: 'sequential',
    maxFrameBytes,
    framing: messageFraming(maxFrameBytes),
    handshake: pgHandshake(tls),
    // The upgrade after an SSLRequest needs a node:net socket.
    upgradesInSetUp: tls !== undefined,
    connectionState: (_remote, connection) => {
      // A session waits for its client as long as the client likes (PostgreSQL's idle_session_timeout is 0 by default).
      connection.setIdleTimeout(0)
      return new PgConnection(shared, connection)
    },
    decodeHead (buf: Buffer, start: number, end: number, head: CallHead): RpcError | null {
      head.service = 'pg'
      if (isGroup(buf, start, end)) {
        head.method = 'group'
        head.routeKey = GROUP_KEY
        return null
      }
      const type = buf[start]!
      head.method = TYPE_NAMES[type]!
      head.routeKey = TYPE_KEYS[type]
      head.bodyStart = start + 5
      return null
    },
    decodeRequest: (_route, buf, head) => buf.subarray(head.bodyStart, head.bodyEnd),
    encode (_call, reply, out) {
      if (reply.bytes !== null && reply.bytes.length > 0) out.append(reply.bytes)
    },
    refusal: (_call: CallInfo, reason: RefusalReason, message: string) => [refusalBytes(reason, message)],
    protocolError: (error: RpcError) => error instanceof StreamError && error.words !== null ? [error.words] : null,
    lastWords: (reason) => [LAST_WORDS[reason]]
  }
}

// What PostgreSQL says before the closes the server decides (postgres.c's ProcessInterrupts; the rest have no PostgreSQL counterpart).
const LAST_WORDS = {
  shutdown: fatalError('57P01', 'terminating connection due to administrator command'),
  idle: fatalError('57P05', 'terminating connection due to idle-session timeout'),
  age: fatalError('57P01', 'terminating connection due to administrator command'),
  'frame-timeout': fatalError('08P01', 'terminating connection: the message did not arrive in time'),
  'slow-frame': fatalError('08P01', 'terminating connection: the message arrives too slowly'),
  'inbound-budget': fatalError('53200', 'out of memory', 'The server\'s inbound buffers are full.')
} as const

function refusalBytes (reason: RefusalReason, message: string): Buffer {
  switch (reason) {
    case 'shutdown': return fatalError('57P01', 'terminating connection due to administrator command')
    case 'busy': case 'expired': return fatalError('53300', 'sorry, too many clients already')
    case 'no-method': case 'no-service': return fatalError('08P01', message)
    default: return fatalError('XX000', message)
  }
}

type PgContext = CallContext<PgConnection>

/** The handlers of the group `pg`: each message goes to its session (the protocol runs a session's messages one at a time). */
export function pgHandlers (): RouteHandlers<PgRequest, Reply, PgConnection> {
  const finish = (reply: Reply, ctx: PgContext): Reply => {
    if (reply.close) ctx.closeConnection()
    return reply
  }
  const finished = (result: Reply | Promise<Reply>, ctx: PgContext): Reply | Promise<Reply> =>
    result instanceof Promise ? result.then(reply => finish(reply, ctx)) : finish(result, ctx)
  const handlers: RouteHandlers<PgRequest, Reply, PgConnection> = {
    group: (frame, ctx) => finished(ctx.connectionState.session.messages(frame), ctx)
  }
  for (const letter of 'QPBEDCHSXFdcfp') {
    const type = letter.charCodeAt(0)
    handlers[letter] = (body: PgRequest, ctx: PgContext) => finished(ctx.connectionState.session.message(type, body, 0, body.length), ctx)
  }
  return handlers
}
