import type { ServerProtocol } from '../codec/protocol.js'
import { realClock, type Clock } from '../scheduling/clock.js'
import { RateLimitedLog, resolveLogger, type LogFields, type Logger } from './logger.js'
import { ServerCounters } from './server-counters.js'
import { DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_NEGOTIATION_TIMEOUT_MS, LOG_INTERVAL_MS, type ServerOptions } from './server-options.js'

/** The server's options with the defaults every part reads resolved. */
export type ResolvedServerOptions = Required<Pick<ServerOptions, 'maxMessageBytes' | 'negotiationTimeoutMs' | 'idleTimeoutMs'>> & ServerOptions

/**
 * What every part of one server shares: its protocol, its options, its
 * clock, its logger, its open connections and its counters. One per
 * server, made first; the parts (call dispatch, admission, the guards, TLS
 * accept) each take it, or the piece of it they need. A class with plain
 * fields: loads from it in optimized code stay monomorphic.
 * `C` is the server's connection (a type parameter, so that the parts that
 * describe only what they need of a connection need not import it).
 */
export class ServerContext<C = unknown> {
  readonly protocol: ServerProtocol
  readonly options: ResolvedServerOptions
  readonly clock: Clock
  readonly log: Required<Logger>
  /** The open connections, negotiating ones included. */
  readonly connections = new Set<C>()
  readonly counters: ServerCounters
  // Called on the logger, so a class-based logger keeps its `this`.
  readonly warn = (message: string, fields?: LogFields): void => { this.log.warn(message, fields) }
  readonly error = (message: string, fields?: LogFields): void => { this.log.error(message, fields) }
  readonly #now = (): number => this.clock.now()

  constructor (protocol: ServerProtocol, options: ServerOptions) {
    this.protocol = protocol
    this.options = {
      ...options,
      maxMessageBytes: options.maxMessageBytes ?? protocol.maxFrameBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      negotiationTimeoutMs: options.negotiationTimeoutMs ?? DEFAULT_NEGOTIATION_TIMEOUT_MS,
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS
    }
    this.clock = options.clock ?? realClock
    this.log = resolveLogger(options.logger)
    this.counters = new ServerCounters(protocol.name, this.warn, this.#now)
  }

  /** A new log of one kind of event peers choose the rate of: at most one line per `LOG_INTERVAL_MS`. */
  rateLimitedLog (): RateLimitedLog {
    return new RateLimitedLog(LOG_INTERVAL_MS, this.#now)
  }
}
