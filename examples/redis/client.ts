/**
 * A Redis client speaking RESP2, on nyala's generic `ProtocolClient`.
 * RESP has no ids: answers come in request order on each connection
 * (`in-order` matching), so a pipelined burst is simply many calls made in
 * one turn, which leave in one write (or a few, for long bursts).
 *
 *   const redis = new RedisClient({ endpoint: '127.0.0.1:6379' })
 *   await redis.set('k', 'v')           // 'OK'
 *   await redis.command('GET', 'k')     // <Buffer 76>
 *
 * Replies: a simple string as a string, an integer as a number (a bigint
 * beyond 2^53), a bulk string as a Buffer (null for the nil bulk), an
 * array as an array (null for the nil array). An error reply rejects with
 * an RpcError of code RPC_ERR_REMOTE, its message Redis's error text and
 * `remote` { protocol: 'redis', name: the first word (ERR, WRONGTYPE…) };
 * an error inside an array (EXEC) is an RpcError element.
 *
 * Large array replies: `commandCompact(...args)` decodes an array reply as
 * a `RedisArrayReply` (reply-array.ts), the reply's bytes and one offset
 * per element, each element decoded when asked for (`at(i)`, `bytes(i)`
 * without a copy, `string(i)`): an LRANGE of millions of elements without
 * an object per element.
 *
 *   const list = await redis.commandCompact('LRANGE', 'big', 0, -1) as RedisArrayReply
 *   list.length; list.string(0); for (const item of list) { ... }
 *
 * Pub/Sub: `subscribe(...channels)` and `psubscribe(...patterns)` give a
 * `Subscription` (subscription.ts) on a connection of its own, as RESP2
 * requires: a subscribed connection runs nothing else.
 *
 *   const sub = await redis.subscribe('news')
 *   for await (const { channel, message } of sub) { ... }   // until sub.unsubscribe()
 */
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ProtocolClient, type ClientEndpoint, type ProtocolCallOptions, type ProtocolClientOptions } from '../../reactor/index.js'
import type { CompactReply, RedisArrayReply } from './reply-array.js'
import { RedisCommand, redisClientProtocol, type RedisArg, type RedisReply } from './resp-client.js'
import { Subscription, type SubscriptionOptions } from './subscription.js'

export { RedisCommand, decodeValue, redisClientProtocol, redisError, type RedisArg, type RedisReply } from './resp-client.js'
export { RedisArrayReply, decodeCompact, type CompactReply } from './reply-array.js'
export { Subscription, type SubscriptionMessage, type SubscriptionOptions } from './subscription.js'

export interface SetOptions {
  /** Expire after this many seconds (EX) or milliseconds (PX). */
  ex?: number
  px?: number
  /** Only if absent (NX) or present (XX). */
  nx?: boolean
  xx?: boolean
}

/** `ProtocolClientOptions`: with `tls` (node:tls connection options: ca, cert, key, servername) every connection is TLS. */
export interface RedisClientOptions extends ProtocolClientOptions {
  /** What `subscribe` and `psubscribe` give their subscriptions (bounds, timeout); see `SubscriptionOptions`. */
  subscription?: SubscriptionOptions
}

/** Redis commands over a `ProtocolClient` (see the module comment). */
export class RedisClient {
  /** The client under it: a `RedisArrayReply` comes back only for a `compact` command. */
  readonly client: ProtocolClient<RedisCommand, RedisReply | RedisArrayReply>
  readonly #options: RedisClientOptions
  readonly #subscriptions = new Set<Subscription>()
  #closed = false

  constructor (options: RedisClientOptions) {
    this.client = new ProtocolClient(redisClientProtocol(), options)
    this.#options = options
  }

  /** Any command: its reply, decoded. */
  command (...args: RedisArg[]): Promise<RedisReply> {
    return this.commandWith(args)
  }

  /** Any command, with per-call options (deadline, signal). */
  commandWith (args: readonly RedisArg[], options?: ProtocolCallOptions): Promise<RedisReply> {
    let command: RedisCommand
    try {
      command = new RedisCommand(args)
    } catch (err) {
      return Promise.reject(err)
    }
    return this.client.call(command, options) as Promise<RedisReply>
  }

  /** Any command: its reply, an array as a `RedisArrayReply` (no object per element until one is asked for). */
  commandCompact (...args: RedisArg[]): Promise<CompactReply> {
    return this.commandCompactWith(args)
  }

  /** As `commandCompact`, with per-call options (deadline, signal). */
  commandCompactWith (args: readonly RedisArg[], options?: ProtocolCallOptions): Promise<CompactReply> {
    let command: RedisCommand
    try {
      command = new RedisCommand(args, true)
    } catch (err) {
      return Promise.reject(err)
    }
    return this.client.call(command, options) as Promise<CompactReply>
  }

  async get (key: RedisArg): Promise<Buffer | null> {
    return await this.command('GET', key) as Buffer | null
  }

  /** 'OK', or null when NX or XX kept it from being set. */
  async set (key: RedisArg, value: RedisArg, options: SetOptions = {}): Promise<'OK' | null> {
    const args: RedisArg[] = ['SET', key, value]
    if (options.ex !== undefined) args.push('EX', options.ex)
    if (options.px !== undefined) args.push('PX', options.px)
    if (options.nx === true) args.push('NX')
    if (options.xx === true) args.push('XX')
    return await this.command(...args) as 'OK' | null
  }

  /** How many of the keys existed. */
  async del (...keys: RedisArg[]): Promise<number> {
    return await this.command('DEL', ...keys) as number
  }

  async incr (key: RedisArg): Promise<number | bigint> {
    return await this.command('INCR', key) as number | bigint
  }

  /** The list's length after the push. */
  async lpush (key: RedisArg, ...values: RedisArg[]): Promise<number> {
    return await this.command('LPUSH', key, ...values) as number
  }

  async lrange (key: RedisArg, start: number, stop: number): Promise<Buffer[]> {
    return await this.command('LRANGE', key, start, stop) as Buffer[]
  }

  /**
   * Subscribes to `channels` on a connection of its own (to the first
   * endpoint): resolves once Redis has confirmed each, with the
   * `Subscription` that yields their messages.
   */
  subscribe (...channels: string[]): Promise<Subscription> {
    return this.#subscribeWith((subscription) => subscription.subscribe(...channels))
  }

  /** Subscribes to the glob `patterns` (PSUBSCRIBE), as `subscribe` does to channels. */
  psubscribe (...patterns: string[]): Promise<Subscription> {
    return this.#subscribeWith((subscription) => subscription.psubscribe(...patterns))
  }

  async #subscribeWith (first: (subscription: Subscription) => Promise<void>): Promise<Subscription> {
    if (this.#closed) throw new RpcError(ErrorCode.CLIENT_CLOSED, 'the client is closed')
    const options = this.#options
    // Pub/Sub is one server's: every command of a subscription goes to the same one.
    const endpoints = options.endpoint as ClientEndpoint | readonly ClientEndpoint[]
    const endpoint = Array.isArray(endpoints) ? (endpoints as readonly ClientEndpoint[])[0] : endpoints as ClientEndpoint
    if (endpoint === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no endpoint: the list is empty')
    const subscription = new Subscription({
      endpoint,
      tls: options.tls,
      connectTimeoutMs: options.connectTimeoutMs,
      maxMessageBytes: options.maxMessageBytes,
      maxOutboundBytes: options.maxOutboundBytes,
      clock: options.clock,
      logger: options.logger
    }, { timeoutMs: options.defaultTimeoutMs, ...options.subscription }, () => { this.#subscriptions.delete(subscription) })
    this.#subscriptions.add(subscription)
    try {
      await first(subscription)
    } catch (err) {
      await subscription.close()
      throw err
    }
    return subscription
  }

  /**
   * Settles every pending call with RPC_ERR_CLIENT_CLOSED and closes the
   * connections, the subscriptions' too (their iterators end after the
   * messages they hold).
   */
  async close (): Promise<void> {
    this.#closed = true
    await Promise.all([...this.#subscriptions].map((subscription) => subscription.close()))
    await this.client.close()
  }
}
