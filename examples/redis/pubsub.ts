import { ConnectionGroup, type ConnectionHandle } from '../../reactor/index.js'
import type { Command } from './commands.js'
import { GlobPattern, compiledGlob } from './glob.js'
import { EncodedPush, Raw, SLICE_BULK_BYTES, error, simple, type ConnectionState, type Reply, type RespRequest } from './resp.js'
import { COPIED_MESSAGE_BYTES, ChannelMessage } from './pubsub-message.js'
import { Subscriptions } from './subscriptions.js'

/**
 * Redis Pub/Sub as RESP2 has it (pubsub.c): SUBSCRIBE, UNSUBSCRIBE,
 * PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, PUBSUB and RESET, with Redis 7's
 * replies word for word.
 *
 * One `PubSub` per server (per reactor process, as the keyspace) holds the
 * channels and patterns, each with the connections subscribed to it. A
 * PUBLISH encodes the channel and message once, the `message` or
 * `pmessage` head once per channel or matching pattern (the patterns'
 * heads side by side in slabs of that PUBLISH), and queues the same
 * bytes on every subscriber (a channel's or pattern's subscribers, from
 * the second on, are a `ConnectionGroup`, which encodes once for all); a
 * run of matching patterns with the same lone subscriber goes out as one
 * push. What
 * one connection is subscribed to is kept in its `ConnectionState`
 * (`Subscriptions`); while it has any, the connection is in subscribed
 * mode: only the commands in `SUBSCRIBED_MODE_COMMANDS` run, the others
 * are refused in Redis's words (`subscribedModeRefusal`). When the
 * connection closes, its subscriptions go with it. While subscribed, the
 * connection is marked a session (`ConnectionHandle.markSession`), so the
 * server does not close it, quiet as it is, to make room at its
 * connection limit.
 *
 * A subscriber that does not read is the server's business: its pushes
 * (and its PING answers) count against the server's `pushOutputLimit`
 * (Redis's `client-output-buffer-limit pubsub`), past which the
 * connection closes and the others go on receiving.
 */

/**
 * The subscribers of one channel or pattern: the connection itself while
 * it is the only one (most channels have one subscriber, and a group costs
 * more than the subscription), a `ConnectionGroup` from the second on (it
 * encodes a message once for all its members).
 */
type Members = ConnectionHandle | ConnectionGroup

/** A pattern, compiled, with its subscribers (one object: a PUBLISH walks them all). */
class PatternEntry extends GlobPattern {
  members: Members
  /** The channel matched last (null: none yet) and whether it matched: PUBLISHes to one channel match each pattern once. */
  lastChannel: string | null = null
  lastMatch = false
  constructor (pattern: string, members: Members) {
    super(pattern)
    this.members = members
  }

  matchesChannel (channel: string): boolean {
    if (channel === this.lastChannel) return this.lastMatch
    const match = this.matches(channel)
    this.lastChannel = channel
    this.lastMatch = match
    return match
  }
}

const MESSAGE_HEAD = Buffer.from('*3\r\n$7\r\nmessage\r\n', 'latin1')
const EMPTY = Buffer.alloc(0)
const CRLF = Buffer.from('\r\n', 'latin1')

/** The registry of one server: channel → subscribers, pattern → subscribers. */
export class PubSub {
  readonly #channels = new Map<string, Members>()
  readonly #patterns = new Map<string, PatternEntry>()
  #lastChannel: string | null = null
  #lastHead = EMPTY

  /**
   * The connection's subscriptions, made on its first subscription; null
   * when its connection has already closed (nothing is registered for it).
   */
  subscriptionsOf (state: ConnectionState, connection: ConnectionHandle): Subscriptions | null {
    if (state.subscriptions !== null) return state.subscriptions
    if (connection.isClosed) return null
    const subscriptions: Subscriptions = new Subscriptions(connection, () => { this.unsubscribeAll(state) })
    connection.once('close', subscriptions.onClose)
    // A subscriber waits quietly for its messages: the server keeps it at its connection limit (a lone subscriber is in no ConnectionGroup).
    connection.markSession()
    state.subscriptions = subscriptions
    return subscriptions
  }

  /** Subscribes to `channel` (again: no change); false when the connection has closed. */
  subscribe (subscriptions: Subscriptions, channel: string): boolean {
    const connection = subscriptions.connection
    if (connection.isClosed) return false
    if (subscriptions.channels.has(channel)) return true
    const members = this.#channels.get(channel)
    if (members === undefined) this.#channels.set(channel, connection)
    else this.#channels.set(channel, joined(members, connection))
    subscriptions.channels.add(channel)
    return true
  }

  psubscribe (subscriptions: Subscriptions, pattern: string): boolean {
    const connection = subscriptions.connection
    if (connection.isClosed) return false
    if (subscriptions.patterns.has(pattern)) return true
    const entry = this.#patterns.get(pattern)
    if (entry === undefined) this.#patterns.set(pattern, new PatternEntry(pattern, connection))
    else entry.members = joined(entry.members, connection)
    subscriptions.patterns.add(pattern)
    return true
  }

  /** Unsubscribes from `channel` if subscribed; leaves subscribed mode when that was the last subscription. */
  unsubscribe (state: ConnectionState, channel: string): void {
    const subscriptions = state.subscriptions
    if (subscriptions === null || !subscriptions.channels.delete(channel)) return
    this.#leaveChannel(subscriptions.connection, channel)
    this.#release(state, subscriptions)
  }

  punsubscribe (state: ConnectionState, pattern: string): void {
    const subscriptions = state.subscriptions
    if (subscriptions === null || !subscriptions.patterns.delete(pattern)) return
    this.#leavePattern(subscriptions.connection, pattern)
    this.#release(state, subscriptions)
  }

  /** Every subscription of the connection (RESET, and its close). */
  unsubscribeAll (state: ConnectionState): void {
    const subscriptions = state.subscriptions
    if (subscriptions === null) return
    for (const channel of subscriptions.channels) this.#leaveChannel(subscriptions.connection, channel)
    for (const pattern of subscriptions.patterns) this.#leavePattern(subscriptions.connection, pattern)
    subscriptions.channels.clear()
    subscriptions.patterns.clear()
    this.#release(state, subscriptions)
  }

  /**
   * Sends `message` to the channel's subscribers (`message`), then to the
   * subscribers of every pattern that matches it (`pmessage`, one per
   * pattern: a connection subscribed to the channel and to two matching
   * patterns gets it three times). Returns how many were sent, as Redis's
   * PUBLISH counts them. `channel` is latin1 (one char per byte).
   * `message` is read during the call only, unless it is larger than
   * `SLICE_BULK_BYTES`: then it is queued as it is, and must not be
   * written over.
   */
  publish (channel: string, message: Buffer): number {
    const members = this.#channels.get(channel)
    if (members === undefined && this.#patterns.size === 0) return 0
    let tail: Uint8Array[] | null = null
    let receivers = 0
    if (members !== undefined) {
      if (message.length <= COPIED_MESSAGE_BYTES) {
        receivers += sendTo(members, new ChannelMessage(this.#messageHead(channel), message))
      } else {
        tail = encodeTail(channel, message)
        receivers += sendTo(members, new EncodedPush([MESSAGE_HEAD, ...tail]))
      }
    }
    // A subscriber closed by a send (over its push limit) leaves; a pattern left without one is deleted as the map is walked, which Map allows.
    // The matching patterns' heads are written one after the other into slabs of this PUBLISH (none is kept). A run of
    // patterns with the same lone subscriber (a connection's patterns sit side by side in the map) goes out as one push:
    // each `pmessage` whole, its head and a small tail copied, one after the other in the slab.
    let slab = EMPTY
    let used = 0
    let run: ConnectionHandle | null = null
    let runFrom = 0
    let runCount = 0
    for (const entry of this.#patterns.values()) {
      if (!entry.matchesChannel(channel)) continue
      tail ??= encodeTail(channel, message)
      const pattern = entry.source
      const headLength = pmessageHeadLength(pattern)
      const target = entry.members
      if (!(target instanceof ConnectionGroup) && tail.length === 1 && tail[0]!.length <= COPIED_TAIL_BYTES) {
        const small = tail[0]!
        const length = headLength + small.length
        if (target !== run || used + length > slab.length) {
          if (run !== null) receivers += run.send(new EncodedPush([slab.subarray(runFrom, used)])) ? runCount : 0
          if (used + length > slab.length) {
            slab = Buffer.allocUnsafe(Math.max(HEAD_SLAB_BYTES, length))
            used = 0
          }
          run = target
          runFrom = used
          runCount = 0
        }
        writePmessageHead(slab, used, pattern)
        slab.set(small, used + headLength)
        used += length
        runCount++
        continue
      }
      if (run !== null) {
        receivers += run.send(new EncodedPush([slab.subarray(runFrom, used)])) ? runCount : 0
        run = null
      }
      if (used + headLength > slab.length) {
        slab = Buffer.allocUnsafe(Math.max(HEAD_SLAB_BYTES, headLength))
        used = 0
      }
      writePmessageHead(slab, used, pattern)
      const head = slab.subarray(used, used + headLength)
      used += headLength
      receivers += sendTo(target, new EncodedPush(tail.length === 1 ? [head, tail[0]!] : [head, ...tail]))
    }
    if (run !== null) receivers += run.send(new EncodedPush([slab.subarray(runFrom, used)])) ? runCount : 0
    return receivers
  }

  /** `*3 message <channel> $` for `channel`: the last channel's is kept (a run of PUBLISHes to one channel makes it once). */
  #messageHead (channel: string): Buffer {
    if (channel === this.#lastChannel) return this.#lastHead
    const head = Buffer.from(`*3\r\n$7\r\nmessage\r\n$${channel.length}\r\n${channel}\r\n$`, 'latin1')
    this.#lastChannel = channel
    this.#lastHead = head
    return head
  }

  /** The channels with at least one subscriber, all or those `pattern` matches (PUBSUB CHANNELS). */
  channels (pattern?: string): string[] {
    const out: string[] = []
    const glob = pattern === undefined ? null : compiledGlob(pattern)
    for (const channel of this.#channels.keys()) if (glob === null || glob.matches(channel)) out.push(channel)
    return out
  }

  /** The channel's subscribers, patterns not counted (PUBSUB NUMSUB). */
  subscribers (channel: string): number {
    const members = this.#channels.get(channel)
    return members === undefined ? 0 : members instanceof ConnectionGroup ? members.size : 1
  }

  /** Patterns with at least one subscriber (PUBSUB NUMPAT: Redis 7 counts each pattern once). */
  get patternCount (): number {
    return this.#patterns.size
  }

  #leaveChannel (connection: ConnectionHandle, channel: string): void {
    const members = this.#channels.get(channel)
    if (members === undefined) return
    const left = without(members, connection)
    if (left === null) this.#channels.delete(channel)
    else if (left !== members) this.#channels.set(channel, left)
  }

  #leavePattern (connection: ConnectionHandle, pattern: string): void {
    const entry = this.#patterns.get(pattern)
    if (entry === undefined) return
    const left = without(entry.members, connection)
    if (left === null) this.#patterns.delete(pattern)
    else entry.members = left
  }

  // No subscription left: the connection leaves subscribed mode.
  #release (state: ConnectionState, subscriptions: Subscriptions): void {
    if (subscriptions.count > 0 || state.subscriptions !== subscriptions) return
    subscriptions.connection.off('close', subscriptions.onClose)
    subscriptions.connection.markSession(false)
    state.subscriptions = null
  }
}

/** `members` with `connection` added (it is not one of them). */
function joined (members: Members, connection: ConnectionHandle): Members {
  if (members instanceof ConnectionGroup) return members.add(connection)
  return new ConnectionGroup().add(members).add(connection)
}

/**
 * `members` without `connection`: null when none is left, the lone member
 * when one is. (A group also loses a member by itself when its connection
 * closes, before the registry hears of it: what is left decides.)
 */
function without (members: Members, connection: ConnectionHandle): Members | null {
  if (!(members instanceof ConnectionGroup)) return members === connection ? null : members
  members.delete(connection)
  if (members.size > 1) return members
  const [last] = members
  members.clear()
  return last ?? null
}

/** Queues `push` on every member, encoded once; how many took it (not closed, nor closed by it for their push limit). */
function sendTo (members: Members, push: EncodedPush): number {
  if (!(members instanceof ConnectionGroup)) return members.send(push) ? 1 : 0
  return members.send(push)
}

/** The channel and the message as the two bulk strings that end a `message` and a `pmessage`: one buffer, or three slices when the message is large (not copied). */
function encodeTail (channel: string, message: Buffer): Uint8Array[] {
  const head = `$${channel.length}\r\n${channel}\r\n$${message.length}\r\n`
  if (message.length > SLICE_BULK_BYTES) return [Buffer.from(head, 'latin1'), message, CRLF]
  const out = Buffer.allocUnsafe(head.length + message.length + 2)
  out.write(head, 0, 'latin1')
  message.copy(out, head.length)
  out[out.length - 2] = 0x0d
  out[out.length - 1] = 0x0a
  return [out]
}

const PMESSAGE_PREFIX = Buffer.from('*4\r\n$8\r\npmessage\r\n$', 'latin1')
/** The size of the slabs a PUBLISH writes its matching patterns' heads into. */
const HEAD_SLAB_BYTES = 64 * 1024
/** A `message`'s tail (channel and message) up to this size is copied after each `pmessage` head of a run; a larger one is shared. */
const COPIED_TAIL_BYTES = 512

/** The size of a `pmessage`'s head for `pattern` (latin1): the array's size, the kind, the pattern. */
function pmessageHeadLength (pattern: string): number {
  return PMESSAGE_PREFIX.length + String(pattern.length).length + pattern.length + 4
}

/** Writes a `pmessage`'s head for `pattern` at `out[at]` (pmessageHeadLength bytes). */
function writePmessageHead (out: Buffer, at: number, pattern: string): void {
  out.set(PMESSAGE_PREFIX, at)
  at += PMESSAGE_PREFIX.length
  const length = pattern.length
  if (length < 10) {
    out[at++] = 0x30 + length
  } else if (length < 100) {
    out[at++] = 0x30 + Math.floor(length / 10)
    out[at++] = 0x30 + length % 10
  } else {
    at += latin1Write.call(out, String(length), at)
  }
  out[at++] = 0x0d
  out[at++] = 0x0a
  at += latin1Write.call(out, pattern, at)
  out[at++] = 0x0d
  out[at] = 0x0a
}

// Buffer's own latin1 writer, without `write`'s argument checks (as resp.ts uses it).
const latin1Write = (Buffer.prototype as unknown as { latin1Write: (s: string, at: number) => number }).latin1Write

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

/** An answer of no bytes (an `encode` that writes nothing): what was to be said went out as a push. */
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
    // A message small enough to be copied into the encoding is read in place (no copy of its own).
    PUBLISH: request => pubsub.publish(request.str(0), request.length(1) > SLICE_BULK_BYTES ? request.bytes(1) : request.buf.subarray(request.ranges[2]!, request.ranges[3]!)),
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
