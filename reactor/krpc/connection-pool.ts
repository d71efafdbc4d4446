import { createSecureContext, type SecureContext } from 'node:tls'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ResponseParts } from '../../codec/krpc/frames.js'
import type { Clock } from '../../scheduling/clock.js'
import type { BusyPoller } from '../../transport/busy-poll.js'
import type { ConnectionStats } from '../../transport/connection.js'
import { ClientConnection, type ConnectionOptions, type ConnectionOwner } from './client-connection.js'
import type { OutboundCalls } from './outbound-call.js'

/** Counters of one open connection of the client (`Client.connectionStats`). */
export interface ClientConnectionStats extends ConnectionStats {
  /** The endpoint as the calls named it. */
  endpoint: string
  /** Calls waiting for a response on this connection. */
  pendingCalls: number
}

/**
 * A client's connections: one per endpoint key (an endpoint, or a balancer
 * slot), reused by every call to it, and the retired ones still finishing
 * their calls.
 */
export class ConnectionPool implements ConnectionOwner {
  /** Open connections by key. */
  readonly connections = new Map<string, ClientConnection>()
  /** Connections retired after a FATAL_* answer, kept until their last call settles. */
  readonly #retired = new Set<ClientConnection>()
  readonly options: ConnectionOptions
  readonly clock: Clock
  readonly poller: BusyPoller | undefined
  readonly calls: OutboundCalls
  readonly parts = new ResponseParts()
  readonly secureContext: SecureContext | null
  readonly #onLeave: (cc: ClientConnection) => void
  /** `onLeave`: a connection leaves the pool, retired or closed (the client forgets it as its last one). */
  constructor (options: ConnectionOptions, clock: Clock, poller: BusyPoller | undefined, calls: OutboundCalls, onLeave: (cc: ClientConnection) => void) {
    this.options = options
    this.clock = clock
    this.poller = poller
    this.calls = calls
    this.#onLeave = onLeave
    if (options.requireTls === true && options.tls === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'requireTls needs tls (the client\'s TLS settings)')
    const tls = options.tls
    if (tls !== undefined && (tls.cert === undefined) !== (tls.key === undefined)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'tls.cert and tls.key go together')
    try {
      // Built once: every connection's handshake shares it.
      this.secureContext = tls === undefined ? null : createSecureContext({ ca: tls.ca, cert: tls.cert, key: tls.key })
    } catch (err) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad tls option: ${(err as Error).message}`, { cause: err })
    }
  }

  // A connection for a call, or why none could be opened (net.connect throws on some addresses).
  connectionOrError (target: { host: string, port: number }, key: string): ClientConnection | RpcError {
    try {
      return this.#connectionFor(target, key)
    } catch (err) {
      return err instanceof RpcError ? err : new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${key}: ${(err as Error).message}`, { cause: err })
    }
  }

  /** `cc` answered FATAL_*: new calls open another; it stays until its last call settles. */
  retire (cc: ClientConnection): void {
    if (this.connections.get(cc.key) === cc) this.connections.delete(cc.key)
    this.#onLeave(cc)
    cc.retired = true
    if (!cc.closed) this.#retired.add(cc)
  }

  /** `cc` closed (or is closed now): its pending calls fail with `error`. */
  closed (cc: ClientConnection, error: RpcError): void {
    if (this.connections.get(cc.key) === cc) this.connections.delete(cc.key)
    this.#onLeave(cc)
    this.#retired.delete(cc)
    cc.fail(error)
  }

  /** Calls waiting for a response on any connection, retired ones included. */
  get pendingCalls (): number {
    let n = 0
    for (const cc of this.connections.values()) n += cc.outstanding.size
    for (const cc of this.#retired) n += cc.outstanding.size
    return n
  }

  stats (): ClientConnectionStats[] {
    const out: ClientConnectionStats[] = []
    for (const cc of this.connections.values()) out.push({ endpoint: cc.key, pendingCalls: cc.outstanding.size, ...cc.connection.stats() })
    return out
  }

  /** Fails every pending call with `error` and closes every connection. */
  closeAll (error: RpcError): void {
    for (const cc of [...this.connections.values(), ...this.#retired]) this.closed(cc, error)
  }

  #connectionFor (target: { host: string, port: number }, key: string): ClientConnection {
    const existing = this.connections.get(key)
    if (existing !== undefined) return existing
    const cc = new ClientConnection(key, target, this)
    this.connections.set(key, cc)
    cc.negotiate()
    return cc
  }
}
