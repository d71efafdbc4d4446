/**
 * The contract between the command table (handlers.ts) and the handlers of
 * each data type (strings.ts, keys.ts, lists.ts, sets.ts, hashes.ts,
 * sorted-sets.ts, server-commands.ts, pubsub.ts): one synchronous function
 * per command, its arity already checked.
 */
import type { PubSubCallContext } from './pubsub.js'
import type { Reply, RespRequest } from './resp.js'
import type { Entry, KeyType, RedisStore } from './store.js'

/**
 * What a handler needs of its call: closing the connection after its answer
 * (QUIT), the connection's `ConnectionState` (the protocol's
 * `connectionState`; the server's context types it `unknown`), and for
 * Pub/Sub the connection's handle and streamed parts.
 */
export interface RedisCallContext extends PubSubCallContext {
  closeConnection (): void
}

/** One command's handler: Redis's answer or error reply, never a throw. */
export type RedisHandler = (request: RespRequest, ctx: RedisCallContext) => Reply

/** The handlers of a data type's commands, by route name. */
export type HandlerTable<Name extends string> = Record<Name, RedisHandler>

/**
 * The key's entry if it holds `type`; undefined when absent (null: it holds
 * another type, answered WRONGTYPE).
 */
export function typedEntry (store: RedisStore, key: string, type: KeyType): Entry | undefined | null {
  const entry = store.get(key)
  if (entry !== undefined && entry.type !== type) return null
  return entry
}
