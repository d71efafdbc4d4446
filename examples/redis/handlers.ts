/**
 * The command table: one synchronous handler per route, over one
 * `RedisStore`, assembled from the handlers of each data type (strings.ts,
 * keys.ts, lists.ts, sets.ts, hashes.ts, sorted-sets.ts,
 * server-commands.ts, pubsub.ts). Answers and errors are Redis 7's, word
 * for word (t_string.c, t_list.c, t_set.c, t_hash.c, t_zset.c, expire.c,
 * db.c, server.c): a handler that cannot do what it was asked returns
 * Redis's error reply, never throws.
 */
import { COMMANDS, UNKNOWN_COMMAND, type CommandName } from './commands.js'
import type { RedisHandler } from './handler.js'
import { hashHandlers } from './hashes.js'
import { keyHandlers } from './keys.js'
import { listHandlers } from './lists.js'
import { PubSub, SUBSCRIBED_MODE_COMMANDS, pubsubHandlers, subscribedModeRefusal } from './pubsub.js'
import { arityError, unknownCommand } from './replies.js'
import type { ConnectionState } from './resp.js'
import { serverHandlers, type ServerCommandOptions } from './server-commands.js'
import { setHandlers } from './sets.js'
import { sortedSetHandlers } from './sorted-sets.js'
import type { RedisStore } from './store.js'
import { stringHandlers } from './strings.js'

export { globMatch } from './glob.js'
export { formatScore } from './sorted-sets.js'
export { Errors, arityError } from './replies.js'
export type { RedisCallContext, RedisHandler } from './handler.js'

/** What the handlers are told of their server: INFO's, CONFIG GET's and HELLO's facts, and the Pub/Sub registry. */
export interface RedisHandlerOptions extends ServerCommandOptions {
  /** The channels and patterns (one per server, as the store); default a registry of its own. */
  pubsub?: PubSub
}

function arityOk (arity: number, argc: number): boolean {
  // Redis counts the command name.
  return arity >= 0 ? argc + 1 === arity : argc + 1 >= -arity
}

/** The handlers of every command, by route name, and of the internal route (an unknown command). */
export function redisHandlers (store: RedisStore, options: RedisHandlerOptions = {}): Record<string, RedisHandler> {
  const all: Record<CommandName, RedisHandler> = {
    ...serverHandlers(store, options),
    ...stringHandlers(store),
    ...keyHandlers(store),
    ...listHandlers(store),
    ...setHandlers(store),
    ...hashHandlers(store),
    ...sortedSetHandlers(store),
    ...pubsubHandlers(options.pubsub ?? new PubSub())
  }
  // Every command checks its arity first, as Redis does before calling it, then (but for the few
  // allowed there) that the connection is not in subscribed mode.
  const routes: Record<string, RedisHandler> = {}
  for (const cmd of COMMANDS) {
    const handler = all[cmd.method as CommandName]!
    const arity = cmd.arity
    const wrong = arityError(cmd.name)
    routes[cmd.method] = SUBSCRIBED_MODE_COMMANDS.has(cmd.name)
      ? (request, ctx) => arityOk(arity, request.argc) ? handler(request, ctx) : wrong
      : (request, ctx) => !arityOk(arity, request.argc)
          ? wrong
          : (ctx.connectionState as ConnectionState).subscriptions !== null ? subscribedModeRefusal(cmd, request, handler, ctx) : handler(request, ctx)
  }
  routes[UNKNOWN_COMMAND.method] = unknownCommand
  return routes
}
