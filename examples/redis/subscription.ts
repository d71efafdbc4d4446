/**
 * Redis Pub/Sub, client side: a `Subscription` is one connection in RESP2's
 * subscribed mode, its channels and patterns, and the messages they bring,
 * as an async iterable.
 *
 *   const sub = await redis.subscribe('news', 'weather')   // RedisClient (client.ts)
 *   for await (const { channel, message, pattern } of sub) { ... }
 *   await sub.unsubscribe('news')                           // no argument: all; none left: the loop ends
 *
 * How it runs on `ProtocolClient`: a subscribed connection sends two kinds
 * of frames, messages (`message`, `pmessage`) whenever one is published,
 * and the replies to its commands (one confirmation per channel or
 * pattern, `pong`, errors). Messages are pushes (`isPush`), handed to the
 * subscription by `onPush`. The replies go to the first command: it is a
 * `stream` call that lasts as long as the subscription, each reply one of
 * its parts, and it ends (its last part) with the confirmation that leaves
 * nothing subscribed. The commands after it are sent with no answer of
 * their own (`answerOf` `no`); the subscription matches the replies to
 * them in order. Because that first call is in flight for the
 * subscription's whole life, a lost connection fails it at once: the
 * subscription ends with the connection's error instead of going quiet.
 *
 * Bounds: messages not yet read are held up to `maxBufferedMessages` and
 * `maxBufferedBytes`; past either the oldest is dropped and `dropped`
 * counts it. The server has its own bound for a subscriber that reads too
 * slowly (Redis's `client-output-buffer-limit pubsub`): it closes the
 * connection, and the subscription ends with that error.
 */
import Denque from 'denque'
import type { AnswerPart, ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ProtocolClient, realClock, type ClientEndpoint, type Clock, type ProtocolClientOptions, type TimerHandle } from '../../reactor/index.js'
import { RedisCommand, decodeValue, redisClientProtocol, type RedisReply } from './resp-client.js'

/** One message: its channel, its bytes, and the pattern it matched (PSUBSCRIBE's messages only). Names are UTF-8. */
export interface SubscriptionMessage {
  readonly channel: string
  readonly message: Buffer
  readonly pattern?: string
}

export interface SubscriptionOptions {
  /** Messages held for a reader that is not reading; default 10 000. */
  maxBufferedMessages?: number
  /** Their size (messages' bytes and channel names' length); default 32 MiB. Past either bound the oldest is dropped (the newest is always kept). */
  maxBufferedBytes?: number
  /** How long a command waits for its confirmations (its promise then rejects RPC_ERR_DEADLINE_EXCEEDED); default 30 000 ms, 0: no limit. */
  timeoutMs?: number
}

export const DEFAULT_MAX_BUFFERED_MESSAGES = 10_000
export const DEFAULT_MAX_BUFFERED_BYTES = 32 * 1024 * 1024
const DEFAULT_TIMEOUT_MS = 30_000

type Kind = 'subscribe' | 'psubscribe' | 'unsubscribe' | 'punsubscribe'

/** A command waiting for its confirmations. */
interface PendingCommand {
  readonly kind: Kind
  /** UNSUBSCRIBE or PUNSUBSCRIBE with no argument: as many confirmations as there are subscriptions of its kind (one if none). */
  readonly all: boolean
  /** Confirmations still to come (explicit names: one per name). */
  left: number
  /** Still waiting for its confirmations (false once settled, by them, an error reply or its deadline). */
  waiting: boolean
  timer: TimerHandle | null
  readonly resolve: () => void
  readonly reject: (error: RpcError) => void
}

/** A command of a subscriber connection; `owner` is set on the first, the call that gathers every reply. */
class SubscriberCommand extends RedisCommand {
  readonly owner: Subscription | null
  constructor (args: readonly string[], owner: Subscription | null) {
    super(args)
    this.owner = owner
  }
}

const MORE: AnswerPart = Object.freeze({ value: undefined, last: false })
const LAST: AnswerPart = Object.freeze({ value: undefined, last: true })

const MESSAGE_HEAD = Buffer.from('*3\r\n$7\r\nmessage\r\n', 'latin1')
const PMESSAGE_HEAD = Buffer.from('*4\r\n$8\r\npmessage\r\n', 'latin1')

function startsWith (buf: Buffer, start: number, end: number, head: Buffer): boolean {
  return end - start > head.length && buf.compare(head, 0, head.length, start, start + head.length) === 0
}

function malformed (message: string): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, `malformed Pub/Sub reply: ${message}`)
}

/** A message's fields from its decoded array, or an error when it is not one. */
function messageOf (value: RedisReply): SubscriptionMessage | RpcError {
  if (!Array.isArray(value) || !value.every((item) => Buffer.isBuffer(item))) return malformed('a message that is not an array of bulk strings')
  const items = value as readonly Buffer[]
  if (items.length === 3) return { channel: items[1]!.toString(), message: items[2]! }
  return { pattern: items[1]!.toString(), channel: items[2]!.toString(), message: items[3]! }
}

/** RESP2 on a subscribed connection: messages are pushes, the rest are parts of the first command's stream. */
function subscriberProtocol (): ClientProtocol<SubscriberCommand, RedisReply> {
  const base = redisClientProtocol() as unknown as ClientProtocol<SubscriberCommand, RedisReply>
  return {
    ...base,
    answerOf: (command) => command.owner === null ? 'no' : 'stream',
    silentResult: () => null,
    decodePart: (command, buf, start) => command.owner!.onReply(decodeValue(buf, start)[0]),
    isPush: (buf, start, end) => buf[start] === 0x2a && (startsWith(buf, start, end, MESSAGE_HEAD) || startsWith(buf, start, end, PMESSAGE_HEAD)),
    decodePush: (buf, start) => messageOf(decodeValue(buf, start)[0]),
    // A subscriber's commands are never sent twice: a second connection would not have the first one's subscriptions.
    retryable: () => false
  }
}

/** The connection a subscription opens: one, to one endpoint, with no retries. */
export type SubscriptionConnectionOptions = Pick<ProtocolClientOptions, 'tls' | 'connectTimeoutMs' | 'maxMessageBytes' | 'maxOutboundBytes' | 'clock' | 'logger'> & {
  endpoint: ClientEndpoint
}

/**
 * The channels and patterns of one subscriber connection, and their
 * messages (see the module comment). Made by `RedisClient.subscribe` and
 * `psubscribe`. Iterate it from one loop: each message goes to one
 * `next()`. The iteration ends (done) once nothing is subscribed any more,
 * or after `close()` (either after the messages it holds), or at once with
 * a `break` (`return()`), which also closes it. If the connection is lost
 * or the server closes it, the held messages are read first, then `next()`
 * rejects with the connection's error, once.
 */
export class Subscription implements AsyncIterableIterator<SubscriptionMessage> {
  readonly #client: ProtocolClient<SubscriberCommand, RedisReply>
  readonly #clock: Clock
  readonly #maxMessages: number
  readonly #maxBytes: number
  readonly #timeoutMs: number
  readonly #onEnd: () => void
  readonly #channels = new Set<string>()
  readonly #patterns = new Set<string>()
  /** Commands sent and not fully confirmed, in the order their replies come. */
  readonly #commands = new Denque<PendingCommand>()
  readonly #held = new Denque<SubscriptionMessage>()
  #heldBytes = 0
  readonly #reads = new Denque<{ resolve: (result: IteratorResult<SubscriptionMessage>) => void, reject: (error: RpcError) => void }>()
  #dropped = 0
  #received = 0
  #started = false
  /** No more commands: nothing is subscribed, or it is closing. */
  #ending = false
  #ended = false
  /** Why it ended, when not by unsubscribing or closing: reported once, after the held messages. */
  #error: RpcError | null = null

  /** @internal Use `RedisClient.subscribe` or `psubscribe`. */
  constructor (connection: SubscriptionConnectionOptions, options: SubscriptionOptions, onEnd: () => void) {
    this.#clock = connection.clock ?? realClock
    this.#maxMessages = positive(options.maxBufferedMessages ?? DEFAULT_MAX_BUFFERED_MESSAGES, 'maxBufferedMessages')
    this.#maxBytes = positive(options.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES, 'maxBufferedBytes')
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS
    this.#onEnd = onEnd
    this.#client = new ProtocolClient(subscriberProtocol(), { ...connection, connectionsPerEndpoint: 1, retry: false, defaultTimeoutMs: 0 })
    this.#client.onPush((push) => { this.#onMessage(push as SubscriptionMessage) })
  }

  /** The channels subscribed to, as confirmed by the server. */
  get channels (): ReadonlySet<string> {
    return this.#channels
  }

  /** The patterns subscribed to, as confirmed by the server. */
  get patterns (): ReadonlySet<string> {
    return this.#patterns
  }

  /** Messages received, read or not. */
  get received (): number {
    return this.#received
  }

  /** Messages dropped because `maxBufferedMessages` or `maxBufferedBytes` were held already. */
  get dropped (): number {
    return this.#dropped
  }

  /** Messages held, not read yet. */
  get buffered (): number {
    return this.#held.length
  }

  /** Whether it has ended or is ending (unsubscribed from everything, closed, or its connection lost): it takes no more commands. */
  get isClosed (): boolean {
    return this.#ending
  }

  /** Subscribes to more channels; resolves once each is confirmed. */
  subscribe (...channels: string[]): Promise<void> {
    return this.#command('subscribe', channels)
  }

  /** Subscribes to glob patterns (Redis's matching: `*`, `?`, `[...]`, `\`); resolves once each is confirmed. */
  psubscribe (...patterns: string[]): Promise<void> {
    return this.#command('psubscribe', patterns)
  }

  /** Unsubscribes from `channels`, or from every channel without an argument; with nothing left subscribed, the iteration ends. */
  unsubscribe (...channels: string[]): Promise<void> {
    return this.#command('unsubscribe', channels)
  }

  /** Unsubscribes from `patterns`, or from every pattern without an argument. */
  punsubscribe (...patterns: string[]): Promise<void> {
    return this.#command('punsubscribe', patterns)
  }

  /** Closes the connection (every subscription goes with it); the iteration ends after the messages held. */
  async close (): Promise<void> {
    await this.#end(null)
  }

  next (): Promise<IteratorResult<SubscriptionMessage>> {
    const held = this.#held.shift()
    if (held !== undefined) {
      this.#heldBytes -= held.message.length + held.channel.length
      return Promise.resolve({ value: held, done: false })
    }
    if (this.#ended) {
      const error = this.#error
      if (error !== null) {
        this.#error = null
        return Promise.reject(error)
      }
      return Promise.resolve({ value: undefined, done: true })
    }
    return new Promise((resolve, reject) => { this.#reads.push({ resolve, reject }) })
  }

  /** A `break` out of `for await`: closes the subscription and drops what it holds. */
  async return (): Promise<IteratorResult<SubscriptionMessage>> {
    this.#held.clear()
    this.#heldBytes = 0
    this.#error = null
    await this.#end(null)
    return { value: undefined, done: true }
  }

  [Symbol.asyncIterator] (): AsyncIterableIterator<SubscriptionMessage> {
    return this
  }

  #command (kind: Kind, names: string[]): Promise<void> {
    if (this.#ending) return Promise.reject(new RpcError(ErrorCode.CLIENT_CLOSED, 'the subscription is closed'))
    if (names.length === 0 && (kind === 'subscribe' || kind === 'psubscribe')) {
      return Promise.reject(new RpcError(ErrorCode.INVALID_ARGUMENT, `${kind} needs at least one ${kind === 'subscribe' ? 'channel' : 'pattern'}`))
    }
    let command: SubscriberCommand
    try {
      command = new SubscriberCommand([kind.toUpperCase(), ...names], this.#started ? null : this)
    } catch (err) {
      return Promise.reject(err)
    }
    return new Promise<void>((resolve, reject) => {
      const pending: PendingCommand = { kind, all: names.length === 0, left: names.length, waiting: true, timer: null, resolve, reject }
      if (this.#timeoutMs > 0) {
        pending.timer = this.#clock.setTimer(() => {
          pending.timer = null
          // Its confirmations may still come: it stays in the queue to take them.
          this.#settle(pending, new RpcError(ErrorCode.DEADLINE_EXCEEDED, `redis ${kind} was not confirmed within ${this.#timeoutMs} ms`))
        }, this.#timeoutMs)
      }
      this.#commands.push(pending)
      const call = this.#client.call(command, { timeoutMs: 0, retry: false })
      if (command.owner !== null) {
        this.#started = true
        // The stream ends with the confirmation that leaves nothing subscribed, or fails with the connection.
        call.then(() => { void this.#end(null) }, (error: unknown) => { void this.#end(error as RpcError) })
      } else {
        // Not sent (the connection's queue is full, or it closed): no reply will come for it.
        call.catch((error: unknown) => {
          this.#forget(pending)
          this.#settle(pending, error as RpcError)
        })
      }
    })
  }

  /** A reply on the connection (a part of the first command's stream): matched to the oldest command waiting. @internal */
  onReply (reply: RedisReply): AnswerPart | RpcError {
    const pending = this.#commands.peekFront()
    if (pending === undefined) return malformed('a reply with no command waiting for it')
    if (reply instanceof RpcError) {
      // The command was refused whole (as a wrong number of arguments is).
      this.#commands.shift()
      this.#settle(pending, reply)
      return this.#next()
    }
    if (!Array.isArray(reply) || reply.length !== 3 || !Buffer.isBuffer(reply[0]) || typeof reply[2] !== 'number') {
      return malformed(`${JSON.stringify(String(reply))} where a ${pending.kind} confirmation was due`)
    }
    const kind = (reply[0] as Buffer).toString('latin1')
    if (kind !== pending.kind) return malformed(`a ${kind} confirmation where a ${pending.kind} confirmation was due`)
    const name = reply[1]
    if (name !== null && !Buffer.isBuffer(name)) return malformed(`a ${kind} confirmation without a name`)
    const mine = kind === 'subscribe' || kind === 'unsubscribe' ? this.#channels : this.#patterns
    if (name !== null) {
      if (kind === 'subscribe' || kind === 'psubscribe') mine.add(name.toString())
      else mine.delete(name.toString())
    }
    const count = reply[2] as number
    if (count !== this.#channels.size + this.#patterns.size) {
      return malformed(`the server counts ${count} subscriptions, the client ${this.#channels.size + this.#patterns.size}`)
    }
    if (pending.all ? name === null || mine.size === 0 : --pending.left === 0) {
      this.#commands.shift()
      this.#settle(pending, null)
    }
    return this.#next()
  }

  // After a command's last reply: the stream goes on, or ends with nothing subscribed and no command waiting.
  #next (): AnswerPart {
    if (this.#commands.length > 0 || this.#channels.size + this.#patterns.size > 0) return MORE
    this.#ending = true
    return LAST
  }

  #onMessage (message: SubscriptionMessage): void {
    this.#received++
    const read = this.#reads.shift()
    if (read !== undefined) return read.resolve({ value: message, done: false })
    this.#held.push(message)
    this.#heldBytes += message.message.length + message.channel.length
    while (this.#held.length > 1 && (this.#held.length > this.#maxMessages || this.#heldBytes > this.#maxBytes)) {
      const oldest = this.#held.shift()!
      this.#heldBytes -= oldest.message.length + oldest.channel.length
      this.#dropped++
    }
  }

  #settle (pending: PendingCommand, error: RpcError | null): void {
    if (pending.timer !== null) this.#clock.clearTimer(pending.timer)
    pending.timer = null
    if (!pending.waiting) return
    pending.waiting = false
    if (error === null) pending.resolve()
    else pending.reject(error)
  }

  #forget (pending: PendingCommand): void {
    const commands = this.#commands.toArray()
    const at = commands.indexOf(pending)
    if (at >= 0) this.#commands.removeOne(at)
  }

  // Ends it: `error` when the connection failed (reported to the reader), null when it was unsubscribed or closed.
  async #end (error: RpcError | null): Promise<void> {
    this.#ending = true
    if (this.#ended) return
    this.#ended = true
    const reason = error ?? new RpcError(ErrorCode.CLIENT_CLOSED, 'the subscription is closed')
    for (let pending = this.#commands.shift(); pending !== undefined; pending = this.#commands.shift()) this.#settle(pending, reason)
    // Closing it ourselves fails the stream with RPC_ERR_CLIENT_CLOSED: not an error to report.
    if (error !== null && error.code !== ErrorCode.CLIENT_CLOSED) this.#error = error
    for (let read = this.#reads.shift(); read !== undefined; read = this.#reads.shift()) {
      const failure = this.#error
      this.#error = null
      if (failure !== null) read.reject(failure)
      else read.resolve({ value: undefined, done: true })
    }
    this.#onEnd()
    await this.#client.close()
  }
}

function positive (value: number, name: string): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be a positive integer, got ${value}`)
  return value
}
