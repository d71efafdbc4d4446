import { ConnectionGroup, type ConnectionHandle } from '../../reactor/index.js'
import type { Command } from './commands.js'
import { globMatch } from './glob.js'
import { Raw, error, simple, type ConnectionState, type Reply, type RespRequest } from './resp.js'
import { Subscriptions } from './subscriptions.js'

/**
 * Redis Pub/Sub as RESP2 has it (pubsub.c): SUBSCRIBE, UNSUBSCRIBE,
 * PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, PUBSUB and RESET, with Redis 7's
 * replies word for word.
 *
 * One `PubSub` per server (per reactor process, as the keyspace) holds the
 * channels and patterns. Each is a `ConnectionGroup` of the connections
 * subscribed to it, so PUBLISH encodes a message once per channel (and
 * once per matching pattern, whose `pmessage` names the pattern) and
 * queues the same bytes on every subscriber. What one connection is
 * subscribed to is kept in its `ConnectionState` (`Subscriptions`); while
 * it has any, the connection is in subscribed mode: only the commands in
 * `SUBSCRIBED_MODE_COMMANDS` run, the others are refused in Redis's words
 * (`subscribedModeRefusal`). When the connection closes, its
 * subscriptions go with it.
 *
 * A subscriber that does not read is the server's business: its pushes
 * count against the server's `pushOutputLimit` (Redis's
 * `client-output-buffer-limit pubsub`), past which the connection closes
 * and the others go on receiving.
 */

/** The registry of one server: channel → subscribers, pattern → subscribers. */
export class PubSub {
  readonly #channels = new Map<string, ConnectionGroup>()
  readonly #patterns = new Map<string, ConnectionGroup>()

  /**
   * The connection's subscriptions, made on its first subscription; null
   * when its connection has already closed (nothing is registered for it).
   */
  subscriptionsOf (state: ConnectionState, connection: ConnectionHandle): Subscriptions | null {
    if (state.subscriptions !== null) return state.subscriptions
    if (connection.isClosed) return null
    const subscriptions: Subscriptions = new Subscriptions(connection, () => { this.unsubscribeAll(state) })
    connection.once('close', subscriptions.onClose)
    state.subscriptions = subscriptions
    return subscriptions
  }

  /** Subscribes to `channel` (again: no change); false when the connection has closed. */
  subscribe (subscriptions: Subscriptions, channel: string): boolean {
    return this.#add(this.#channels, subscriptions, subscriptions.channels, channel)
  }

  psubscribe (subscriptions: Subscriptions, pattern: string): boolean {
    return this.#add(this.#patterns, subscriptions, subscriptions.patterns, pattern)
  }

  /** Unsubscribes from `channel` if subscribed; leaves subscribed mode when that was the last subscription. */
  unsubscribe (state: ConnectionState, channel: string): void {
    const subscriptions = state.subscriptions
    if (subscriptions === null || !subscriptions.channels.delete(channel)) return
    this.#leave(this.#channels, subscriptions.connection, channel)
    this.#release(state, subscriptions)
  }

  punsubscribe (state: ConnectionState, pattern: string): void {
    const subscriptions = state.subscriptions
    if (subscriptions === null || !subscriptions.patterns.delete(pattern)) return
    this.#leave(this.#patterns, subscriptions.connection, pattern)
    this.#release(state, subscriptions)
  }

  /** Every subscription of the connection (RESET, and its close). */
  unsubscribeAll (state: ConnectionState): void {
    const subscriptions = state.subscriptions
    if (subscriptions === null) return
    for (const channel of subscriptions.channels) this.#leave(this.#channels, subscriptions.connection, channel)
    for (const pattern of subscriptions.patterns) this.#leave(this.#patterns, subscriptions.connection, pattern)
    subscriptions.channels.clear()
    subscriptions.patterns.clear()
    this.#release(state, subscriptions)
  }

  /**
   * Sends `message` to the channel's subscribers (`message`), then to the
   * subscribers of every pattern that matches it (`pmessage`, one per
   * pattern: a connection subscribed to the channel and to two matching
   * patterns gets it three times). Returns how many were sent, as Redis's
   * PUBLISH counts them.
   */
  publish (channel: string, message: Buffer): number {
    let receivers = 0
    const group = this.#channels.get(channel)
    if (group !== undefined) receivers += group.send(['message', channel, message])
    // A subscriber closed by a send (over its push limit) leaves; a pattern left without one is deleted as the map is walked, which Map allows.
    for (const [pattern, members] of this.#patterns) {
      if (globMatch(pattern, channel)) receivers += members.send(['pmessage', pattern, channel, message])
    }
    return receivers
  }

  /** The channels with at least one subscriber, all or those `pattern` matches (PUBSUB CHANNELS). */
  channels (pattern?: string): string[] {
    const out: string[] = []
    for (const channel of this.#channels.keys()) if (pattern === undefined || globMatch(pattern, channel)) out.push(channel)
    return out
  }

  /** The channel's subscribers, patterns not counted (PUBSUB NUMSUB). */
  subscribers (channel: string): number {
    return this.#channels.get(channel)?.size ?? 0
  }

  /** Patterns with at least one subscriber (PUBSUB NUMPAT: Redis 7 counts each pattern once). */
  get patternCount (): number {
    return this.#patterns.size
  }

  #add (registry: Map<string, ConnectionGroup>, subscriptions: Subscriptions, mine: Set<string>, name: string): boolean {
    const connection = subscriptions.connection
    if (connection.isClosed) return false
    if (mine.has(name)) return true
    let group = registry.get(name)
    if (group === undefined) {
      group = new ConnectionGroup()
      registry.set(name, group)
    }
    group.add(connection)
    mine.add(name)
    return true
  }

  #leave (registry: Map<string, ConnectionGroup>, connection: ConnectionHandle, name: string): void {
    const group = registry.get(name)
    if (group === undefined) return
    group.delete(connection)
    if (group.size === 0) registry.delete(name)
  }

  // No subscription left: the connection leaves subscribed mode.
  #release (state: ConnectionState, subscriptions: Subscriptions): void {
    if (subscriptions.count > 0 || state.subscriptions !== subscriptions) return
    subscriptions.connection.off('close', subscriptions.onClose)
    state.subscriptions = null
  }
}

/** What the Pub/Sub handlers need of their call: its connection, streamed parts, and the connection's state. */
export interface PubSubCallContext {
  readonly connectionState: unknown
  /** Absent only when a handler is called without a server (tests that call handlers directly). */
  readonly connection?: ConnectionHandle
  write?: (part: Reply) => boolean
}

export type PubSubCommandName = 'SUBSCRIBE' | 'UNSUBSCRIBE' | 'PSUBSCRIBE' | 'PUNSUBSCRIBE' | 'PUBLISH' | 'PUBSUB' | 'RESET'

/** The commands a connection in subscribed mode may run (Redis 7, RESP2). */
export const SUBSCRIBED_MODE_COMMANDS: ReadonlySet<string> = new Set(['ping', 'subscribe', 'unsubscribe', 'psubscribe', 'punsubscribe', 'quit', 'reset'])

// The subcommands of container commands, with their arities (the command and subcommand counted), for the
// name the refusal quotes (`config|get`). A subcommand not here, or with the wrong arity, runs its handler,
// which answers it as Redis does before it looks at the mode (unknown subcommand, wrong number of arguments).
const SUBCOMMAND_ARITIES: ReadonlyMap<string, ReadonlyMap<string, number>> = new Map(Object.entries({
  client: { setname: 3, getname: 2, id: 2, setinfo: 4 },
  config: { get: -3 },
  command: { count: 2, docs: -2, info: -2 },
  pubsub: { channels: -2, numsub: -2, numpat: 2, help: 2, shardchannels: -2, shardnumsub: -2 }
}).map(([name, subs]) => [name, new Map(Object.entries(subs))]))

const REFUSALS = new Map<string, Reply>()

function refusal (name: string): Reply {
  let reply = REFUSALS.get(name)
  if (reply === undefined) {
    reply = error(`ERR Can't execute '${name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context`)
    REFUSALS.set(name, reply)
  }
  return reply
}

/**
 * A command other than those of `SUBSCRIBED_MODE_COMMANDS` on a connection
 * in subscribed mode, its arity already checked: Redis's refusal, naming
 * the command as Redis 7 does (lower case, `container|subcommand`); or,
 * for a container command whose subcommand is unknown or has the wrong
 * number of arguments, the handler's own answer, which Redis gives first.
 */
export function subscribedModeRefusal<C> (command: Command, request: RespRequest, run: (request: RespRequest, ctx: C) => Reply, ctx: C): Reply {
  const subcommands = SUBCOMMAND_ARITIES.get(command.name)
  if (subcommands === undefined || request.argc === 0) return refusal(command.name)
  const sub = request.prefix(0, 16).toLowerCase()
  const arity = subcommands.get(sub)
  if (arity === undefined || request.length(0) > 16) return run(request, ctx)
  const argc = request.argc + 1
  if (arity >= 0 ? argc !== arity : argc < -arity) return run(request, ctx)
  return refusal(`${command.name}|${sub}`)
}

/**
 * PING in subscribed mode: `pong` and the argument (empty without one) as
 * an array, as Redis answers it in RESP2. It goes out as a push, so it
 * counts against the connection's push output limit as the messages do:
 * Redis counts all of a subscriber's output against its pubsub limit, so
 * a subscriber that pipelines PING and never reads is closed there, not
 * merely stopped being read. The answer itself is then empty (no bytes).
 * Every command a subscribed connection may run is synchronous, so the
 * answers before it are queued already and the push keeps their order.
 */
export function subscribedPing (request: RespRequest, ctx: PubSubCallContext): Reply {
  const reply: Reply = ['pong', request.argc === 0 ? EMPTY : request.bytes(0)]
  if (ctx.connection === undefined) return reply
  ctx.connection.send(reply)
  return NO_ANSWER
}

const EMPTY = Buffer.alloc(0)
/** An answer of no bytes (`encodedLength` 0): what was to be said went out as a push. */
const NO_ANSWER = new Raw(EMPTY)
const RESET = simple('RESET')
const NO_CONNECTION = error('ERR Pub/Sub needs a connection')

const PUBSUB_HELP: Reply = [
  'PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:',
  'CHANNELS [<pattern>]',
  "    Return the currently active channels matching a <pattern> (default: '*').",
  'NUMPAT',
  '    Return number of subscriptions to patterns.',
  'NUMSUB [<channel> ...]',
  '    Return the number of subscribers for the specified channels, excluding',
  '    pattern subscriptions(default: no channels).',
  'SHARDCHANNELS [<pattern>]',
  "    Return the currently active shard level channels matching a <pattern> (default: '*').",
  'SHARDNUMSUB [<shardchannel> ...]',
  '    Return the number of subscribers for the specified shard level channel(s)',
  'HELP',
  '    Prints this help.'
].map(line => simple(line))

/**
 * The handlers of the Pub/Sub commands over `pubsub`, their arity already
 * checked by the caller (handlers.ts), as the other commands'. RESET is
 * here because leaving subscribed mode is what it does in this server; it
 * also clears the connection's name, as Redis's does.
 */
export function pubsubHandlers (pubsub: PubSub): Record<PubSubCommandName, (request: RespRequest, ctx: PubSubCallContext) => Reply> {
  // SUBSCRIBE a b c, PSUBSCRIBE: one confirmation per argument, the count after it; all but the last as parts.
  const subscribeTo = (kind: 'subscribe' | 'psubscribe') => (request: RespRequest, ctx: PubSubCallContext): Reply => {
    const connection = ctx.connection
    if (connection === undefined || ctx.write === undefined) return NO_CONNECTION
    const subscriptions = pubsub.subscriptionsOf(ctx.connectionState as ConnectionState, connection)
    // Closed meanwhile: nobody to answer.
    if (subscriptions === null) return null
    const last = request.argc - 1
    for (let i = 0; ; i++) {
      const name = request.str(i)
      const open = kind === 'subscribe' ? pubsub.subscribe(subscriptions, name) : pubsub.psubscribe(subscriptions, name)
      const reply: Reply = [kind, name, subscriptions.count]
      if (i === last || !open) return reply
      if (!ctx.write(reply)) return null
    }
  }

  // UNSUBSCRIBE [channel ...], PUNSUBSCRIBE [pattern ...]: one confirmation per argument, or per subscription when
  // there is none, or one naming nil when there is none of those either.
  const unsubscribeFrom = (kind: 'unsubscribe' | 'punsubscribe') => (request: RespRequest, ctx: PubSubCallContext): Reply => {
    const state = ctx.connectionState as ConnectionState
    const leave = kind === 'unsubscribe' ? (name: string) => { pubsub.unsubscribe(state, name) } : (name: string) => { pubsub.punsubscribe(state, name) }
    let names: string[]
    if (request.argc > 0) {
      names = Array.from({ length: request.argc }, (_, i) => request.str(i))
    } else {
      const subscriptions = state.subscriptions
      names = subscriptions === null ? [] : [...(kind === 'unsubscribe' ? subscriptions.channels : subscriptions.patterns)]
      if (names.length === 0) return [kind, null, subscriptions?.count ?? 0]
    }
    for (let i = 0; ; i++) {
      leave(names[i]!)
      const reply: Reply = [kind, names[i]!, state.subscriptions?.count ?? 0]
      if (i === names.length - 1) return reply
      if (ctx.write === undefined || !ctx.write(reply)) return null
    }
  }

  const pubsubCommand = (request: RespRequest): Reply => {
    const argc = request.argc
    if (request.is(0, 'channels') || request.is(0, 'shardchannels')) {
      if (argc > 2) return subcommandSyntaxError(request)
      if (request.is(0, 'shardchannels')) return []
      return pubsub.channels(argc === 2 ? request.str(1) : undefined)
    }
    if (request.is(0, 'numsub') || request.is(0, 'shardnumsub')) {
      const shard = request.is(0, 'shardnumsub')
      const out: Reply[] = []
      for (let i = 1; i < argc; i++) {
        const channel = request.str(i)
        out.push(channel, shard ? 0 : pubsub.subscribers(channel))
      }
      return out
    }
    if (request.is(0, 'numpat')) return argc === 1 ? pubsub.patternCount : error("ERR wrong number of arguments for 'pubsub|numpat' command")
    if (request.is(0, 'help')) return argc === 1 ? PUBSUB_HELP : error("ERR wrong number of arguments for 'pubsub|help' command")
    return error(`ERR unknown subcommand '${request.prefix(0, 128)}'. Try PUBSUB HELP.`)
  }

  return {
    SUBSCRIBE: subscribeTo('subscribe'),
    PSUBSCRIBE: subscribeTo('psubscribe'),
    UNSUBSCRIBE: unsubscribeFrom('unsubscribe'),
    PUNSUBSCRIBE: unsubscribeFrom('punsubscribe'),
    PUBLISH: request => pubsub.publish(request.str(0), request.bytes(1)),
    PUBSUB: pubsubCommand,
    // RESET: out of subscribed mode (no confirmations), and the name cleared, as a new connection's.
    RESET: (_request, ctx) => {
      const state = ctx.connectionState as ConnectionState
      pubsub.unsubscribeAll(state)
      state.name = ''
      return RESET
    }
  }
}

/** Redis's words for a subcommand called with the wrong arguments (PUBSUB CHANNELS a b). */
function subcommandSyntaxError (request: RespRequest): Reply {
  return error(`ERR unknown subcommand or wrong number of arguments for '${request.prefix(0, 128)}'. Try PUBSUB HELP.`)
}
