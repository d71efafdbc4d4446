import type { CallHead, CallInfo, ConnectionHandle, RefusalReason, ServerProtocol } from '../../reactor/index.js'
import type { RpcError } from '../../codec/errors.js'
import { Session } from './session.js'
import type { Reply, Shared } from './shared.js'
import { SessionOrder } from './session-order.js'
import { CANCEL_REQUEST_CODE, fatalError, GSSENC_REQUEST_CODE, lastWordsOf, pgFraming, SSL_REQUEST_CODE } from './wire.js'

/**
 * PostgreSQL's protocol v3 as a nyala `ServerProtocol`: every client
 * packet is a call of the group `pg`, its route the message type (a letter,
 * or `startup`, `ssl`, `gss`, `cancel` for the untyped packets before the
 * start), answered in order. The session (session.ts) runs them one at a
 * time (session-order.ts).
 */

/** A connection's state: its session and the order its messages run in. */
export class PgConnection {
  readonly session: Session
  readonly order: SessionOrder
  /** Decoding has passed the start-up packet: later frames are typed messages (as the scanner sees them). */
  typed = false

  constructor (shared: Shared, connection: ConnectionHandle | null) {
    this.session = new Session(shared)
    this.order = new SessionOrder(connection)
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
    maxFrameBytes,
    framing: pgFraming,
    connectionState: (_remote, connection) => new PgConnection(shared, connection),
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
    }
  }
}

function refusalBytes (reason: RefusalReason, message: string): Buffer {
  switch (reason) {
    case 'shutdown': return fatalError('57P01', 'terminating connection due to administrator command')
    case 'busy': case 'expired': return fatalError('53300', 'sorry, too many clients already')
    case 'no-method': case 'no-service': return fatalError('08P01', message)
    default: return fatalError('XX000', message)
  }
}

/** The handlers of the group `pg`: each message goes to its session, after the session's earlier ones. */
export function pgHandlers (): Record<string, (body: PgRequest, ctx: { connectionState: PgConnection, closeConnection: () => void }) => Reply | Promise<Reply>> {
  const finish = (reply: Reply, close: () => void): Reply => {
    if (reply.close) close()
    return reply
  }
  const run = (ctx: { connectionState: PgConnection, closeConnection: () => void }, step: (session: Session) => Reply | Promise<Reply>): Reply | Promise<Reply> => {
    const { session, order } = ctx.connectionState
    const result = order.run(() => step(session))
    return result instanceof Promise ? result.then(reply => finish(reply, () => ctx.closeConnection())) : finish(result, () => ctx.closeConnection())
  }
  const handlers: Record<string, (body: PgRequest, ctx: { connectionState: PgConnection, closeConnection: () => void }) => Reply | Promise<Reply>> = {
    startup: (packet, ctx) => run(ctx, session => session.startupPacket(packet, 0, packet.length)),
    cancel: (packet, ctx) => run(ctx, session => session.cancelPacket(packet, 0, packet.length)),
    ssl: (packet, ctx) => run(ctx, session => session.phase === 'startup' ? { bytes: Buffer.from('N'), close: false } : NO_REPLY),
    gss: (packet, ctx) => run(ctx, session => session.phase === 'startup' ? { bytes: Buffer.from('N'), close: false } : NO_REPLY)
  }
  for (const letter of 'QPBEDCHSXFdcfp') {
    const type = letter.charCodeAt(0)
    handlers[letter] = (body, ctx) => run(ctx, session => session.message(type, body))
  }
  return handlers
}
