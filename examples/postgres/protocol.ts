import type { CallContext, CallHead, CallInfo, ConnectionHandle, RefusalReason, RouteHandlers, ServerProtocol } from '../../reactor/index.js'
import type { RpcError } from '../../codec/errors.js'
import { Session } from './session.js'
import type { Reply, Shared } from './shared.js'
import { CANCEL_REQUEST_CODE, fatalError, GSSENC_REQUEST_CODE, lastWordsOf, pgFraming, SSL_REQUEST_CODE } from './wire.js'

/**
 * PostgreSQL's protocol v3 as a nyala `ServerProtocol`: every client
 * packet is a call of the group `pg`, its route the message type (a letter,
 * or `startup`, `ssl`, `gss`, `cancel` for the untyped packets before the
 * start), answered in order. The protocol's `execution: 'sequential'`
 * runs one connection's messages one at a time, in arrival order, each
 * after the previous one was answered, as a PostgreSQL backend does.
 */

/** A connection's state: its session. */
export class PgConnection {
  readonly session: Session
  /** Decoding has passed the start-up packet: later frames are typed messages (as the scanner sees them). */
  typed = false

  constructor (shared: Shared, connection: ConnectionHandle | null) {
    this.session = new Session(shared)
    connection?.on('close', () => this.session.closed())
  }
}

/** The request a route gets: the message body (the whole packet for untyped ones). */
export type PgRequest = Buffer

const ROUTE_KEYS = new Map<string, object>()
function routeKey (name: string): object {
  let key = ROUTE_KEYS.get(name)
  if (key === undefined) { key = Object.freeze({ name }); ROUTE_KEYS.set(name, key) }
  return key
}
const TYPE_NAMES: string[] = Array.from({ length: 256 }, (_, i) => String.fromCharCode(i))
const TYPE_KEYS: object[] = TYPE_NAMES.map(routeKey)

const NO_REPLY: Reply = { bytes: null, close: false }

/** The protocol, for a server whose sessions share `shared`. */
export function pgProtocol (shared: Shared, maxFrameBytes = 1024 * 1024): ServerProtocol<PgRequest, Reply, PgConnection> {
  return {
    name: 'postgres',
    ordering: 'in-order',
    execution: 'sequential',
    maxFrameBytes,
    framing: pgFraming,
    connectionState: (_remote, connection) => {
      // A session waits for its client as long as the client likes (PostgreSQL's idle_session_timeout is 0 by default).
      connection.setIdleTimeout(0)
      return new PgConnection(shared, connection)
    },
    decodeHead (buf: Buffer, start: number, end: number, head: CallHead, state?: PgConnection): RpcError | null {
      head.service = 'pg'
      if (state !== undefined && !state.typed) {
        const code = buf.readInt32BE(start + 4)
        const name = code === SSL_REQUEST_CODE ? 'ssl' : code === GSSENC_REQUEST_CODE ? 'gss' : code === CANCEL_REQUEST_CODE ? 'cancel' : 'startup'
        if (name !== 'ssl' && name !== 'gss') state.typed = true
        head.method = name
        head.routeKey = routeKey(name)
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
    protocolError: (error: RpcError) => {
      const words = lastWordsOf(error)
      return words === null ? null : [words]
    },
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
  const run = (ctx: PgContext, step: (session: Session) => Reply | Promise<Reply>): Reply | Promise<Reply> => {
    const result = step(ctx.connectionState.session)
    return result instanceof Promise ? result.then(reply => finish(reply, ctx)) : finish(result, ctx)
  }
  const handlers: RouteHandlers<PgRequest, Reply, PgConnection> = {
    startup: (packet, ctx) => run(ctx, session => session.startupPacket(packet, 0, packet.length)),
    cancel: (packet, ctx) => run(ctx, session => session.cancelPacket(packet, 0, packet.length)),
    ssl: (_packet, ctx) => run(ctx, session => session.phase === 'startup' ? ANSWER_N : NO_REPLY),
    gss: (_packet, ctx) => run(ctx, session => session.phase === 'startup' ? ANSWER_N : NO_REPLY)
  }
  for (const letter of 'QPBEDCHSXFdcfp') {
    const type = letter.charCodeAt(0)
    handlers[letter] = (body: PgRequest, ctx: PgContext) => run(ctx, session => session.message(type, body))
  }
  return handlers
}

const ANSWER_N: Reply = { bytes: Buffer.from('N'), close: false }
