import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { RateLimitedLog } from '../logger.js'
import { PushIterator } from '../push-iterator.js'
import type { PushInfo } from './peer-connection.js'

/** A connection that was set up has closed (`ProtocolClient.onConnectionClose`). */
export interface ConnectionCloseInfo {
  /** The connection's endpoint, `host:port`. */
  readonly endpoint: string
  /** Why: the peer closed it, it broke, or the client closed. */
  readonly error: RpcError
}

/** Options of a push iterator (`ProtocolClient.pushes`). */
export interface ProtocolPushOptions {
  /**
   * Pushes held for an iterator that is not reading; default 1024. Past it
   * the oldest held push is dropped and `stats().pushesDropped` rises.
   */
  maxBuffered?: number
  /**
   * The bytes of the pushes held for an iterator that is not reading, each
   * counted as its frame's size on the wire; default 32 MiB (as
   * `RedisClient.subscribe`'s). Past it the oldest held pushes are dropped,
   * as past `maxBuffered`, until the newest fits (the newest is always
   * kept, however large), and `stats().pushesDropped` counts them.
   */
  maxBufferedBytes?: number
}

const DEFAULT_MAX_BUFFERED_PUSHES = 1024
const DEFAULT_MAX_BUFFERED_PUSH_BYTES = 32 * 1024 * 1024

/**
 * Where a client's pushes and connection closes go: its handlers and push
 * iterators. Handlers are kept in arrays replaced (never changed) when one
 * is added or removed, so that a handler may remove itself.
 */
export class PushHub {
  #pushHandlers: ReadonlyArray<(push: unknown, info: PushInfo) => void> = []
  #closeHandlers: ReadonlyArray<(info: ConnectionCloseInfo) => void> = []
  readonly #iterators = new Set<PushIterator>()
  /** Pushes received and dropped (an iterator over `maxBuffered` or `maxBufferedBytes`). */
  readonly counts = { received: 0, dropped: 0 }
  readonly #log: RateLimitedLog
  readonly #warn: (message: string, fields?: Record<string, unknown>) => void
  #ended = false

  /** `log`: the rate-limited warning a handler's throw is reported through. */
  constructor (log: RateLimitedLog, warn: (message: string, fields?: Record<string, unknown>) => void) {
    this.#log = log
    this.#warn = warn
  }

  /** Whether a connection's close has anyone to tell. */
  get hasCloseHandlers (): boolean {
    return this.#closeHandlers.length > 0
  }

  /** Adds a push handler; returns its remover. */
  onPush (handler: (push: unknown, info: PushInfo) => void): () => void {
    if (typeof handler !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'onPush needs a function')
    // A wrapper of its own, so that the same function added twice is removed once per remover.
    const entry = (push: unknown, info: PushInfo): void => handler(push, info)
    this.#pushHandlers = [...this.#pushHandlers, entry]
    return () => { this.#pushHandlers = this.#pushHandlers.filter((h) => h !== entry) }
  }

  /** Adds a connection-close handler; returns its remover. */
  onConnectionClose (handler: (info: ConnectionCloseInfo) => void): () => void {
    if (typeof handler !== 'function') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'onConnectionClose needs a function')
    const entry = (info: ConnectionCloseInfo): void => handler(info)
    this.#closeHandlers = [...this.#closeHandlers, entry]
    return () => { this.#closeHandlers = this.#closeHandlers.filter((h) => h !== entry) }
  }

  /** A new iterator over the pushes from now on (ended at once if the client has closed). */
  iterator (options: ProtocolPushOptions): PushIterator {
    const maxBuffered = options.maxBuffered ?? DEFAULT_MAX_BUFFERED_PUSHES
    if (!Number.isInteger(maxBuffered) || maxBuffered < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `maxBuffered must be a positive integer, got ${options.maxBuffered}`)
    const maxBufferedBytes = options.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_PUSH_BYTES
    if (!Number.isInteger(maxBufferedBytes) || maxBufferedBytes < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `maxBufferedBytes must be a positive integer, got ${options.maxBufferedBytes}`)
    const iterator = new PushIterator(maxBuffered, maxBufferedBytes, this.counts, this.#iterators)
    if (this.#ended) iterator.end(false)
    else this.#iterators.add(iterator)
    return iterator
  }

  /** A push (its frame `bytes` long): to every handler, then to every iterator. */
  push (push: unknown, info: PushInfo, bytes: number): void {
    this.counts.received++
    for (const handler of this.#pushHandlers) {
      try {
        handler(push, info)
      } catch (err) {
        this.#log.log(this.#warn, () => `a push handler threw (the push from ${info.endpoint} still went to the others): ${(err as Error)?.message ?? String(err)}`,
          () => ({ endpoint: info.endpoint }))
      }
    }
    for (const iterator of this.#iterators) iterator.offer(push, bytes)
  }

  /** A connection that was set up closed. */
  connectionClosed (info: ConnectionCloseInfo): void {
    for (const handler of this.#closeHandlers) {
      try {
        handler(info)
      } catch (err) {
        this.#log.log(this.#warn, () => `a connection-close handler threw: ${(err as Error)?.message ?? String(err)}`, () => ({ endpoint: info.endpoint }))
      }
    }
  }

  /** The client closed: iterators end after the pushes they hold, handlers are removed. */
  end (): void {
    this.#ended = true
    for (const iterator of [...this.#iterators]) iterator.end(false)
    this.#pushHandlers = []
  }
}
