// The protocol's last words before a close the server decides (idle, a
// frame too slow or too long in coming, the inbound budget, the connection's
// age, shutdown): `ServerProtocol.lastWords(reason, state)` returns bytes
// written before the end (PostgreSQL's FATAL, an MQTT 5 DISCONNECT, RESP's
// -ERR), bounded in size (MAX_LAST_WORDS_BYTES) and in time: a peer that
// does not take them within LAST_WORDS_MS is dropped anyway.
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { ServerProtocol } from '../codec/protocol.js'
import type { FramedConnection } from '../transport/framed-connection.js'
import type { ServerContext } from './server-context.js'

/** Why the server closes a connection itself (`ServerProtocol.lastWords`). */
export type ServerCloseReason = Parameters<NonNullable<ServerProtocol['lastWords']>>[0]

/** The most bytes of last words sent; longer ones are dropped (the connection closes without them). */
export const MAX_LAST_WORDS_BYTES = 64 * 1024

/** How long a connection saying its last words may take to flush them before it is destroyed. */
export const LAST_WORDS_MS = 1000

/** What a close with last words needs of a connection. */
export interface Speaker {
  readonly connection: FramedConnection
  /** The protocol's state of the connection. */
  readonly state: unknown
  /** Its set-up is done (a connection still in set-up gets no last words). */
  readonly ready: boolean
}

/** Connections flushing their last words. */
const speaking = new WeakSet<FramedConnection>()

/**
 * The protocol's last words for `reason`, bounded; null when there are
 * none (no hook, a throw, nothing, too long, or a connection in set-up).
 */
export function lastWordsOf (ctx: ServerContext, sc: Speaker, reason: ServerCloseReason): Uint8Array[] | null {
  const hook = ctx.protocol.lastWords
  if (hook === undefined || !sc.ready || sc.connection.isClosed) return null
  let words: Uint8Array[] | null
  try {
    words = hook(reason, sc.state)
  } catch {
    return null // a protocol that breaks its contract: closed without them
  }
  if (words === null || words.length === 0) return null
  let bytes = 0
  for (const slice of words) bytes += slice.length
  if (bytes > MAX_LAST_WORDS_BYTES) {
    ctx.log.warn(`the ${ctx.protocol.name} protocol's last words (${reason}) are ${bytes} bytes, over ${MAX_LAST_WORDS_BYTES}: not sent`)
    return null
  }
  return words
}

/**
 * Closes `sc` for `reason`: with the protocol's last words, they are
 * queued after what is already queued, and the connection ends once they
 * are flushed (destroyed LAST_WORDS_MS later at the latest); without, it
 * is destroyed at once with `error`, as before.
 */
export function closeWithLastWords (ctx: ServerContext, sc: Speaker, reason: ServerCloseReason, error?: RpcError): void {
  if (!sayLastWords(ctx, sc, reason, error)) sc.connection.destroy(error)
}

/** Like `closeWithLastWords`, but false (nothing done) when the protocol has no last words for it. */
export function sayLastWords (ctx: ServerContext, sc: Speaker, reason: ServerCloseReason, error?: RpcError): boolean {
  const connection = sc.connection
  // Already saying its last words (a later scan, a second reason): it ends with those.
  if (speaking.has(connection)) return true
  const words = lastWordsOf(ctx, sc, reason)
  if (words === null) return false
  let bytes = 0
  for (const slice of words) bytes += slice.length
  speaking.add(connection)
  connection.send({ slices: words as Buffer[], bytes })
  const why = error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, `closed by the server (${reason})`)
  connection.endAfterFlush(why)
  if (!connection.isClosed) ctx.clock.setTimer(() => connection.destroy(why), LAST_WORDS_MS)
  return true
}
