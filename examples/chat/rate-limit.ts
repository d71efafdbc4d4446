import type { ConnectionHandle, Filter } from '../../reactor/index.js'

/** Which budget refused a call: the connection's own, or the one all connections from its address share. */
export type RateLimitedBy = 'connection' | 'address'

export interface RateLimitOptions {
  /** Calls each connection may make per window; default 10. */
  callsPerConnection?: number
  /** Calls all connections from one peer address may make per window together; default 100. */
  callsPerAddress?: number
  /** The window, in ms; default 1000. */
  windowMs?: number
  /** The answer to a call over either limit. */
  refuse: (by: RateLimitedBy) => unknown
  /** The clock, in ms (tests); default Date.now. */
  now?: () => number
  /** Addresses remembered at most; past it the oldest window is forgotten. Default 100 000. */
  maxAddresses?: number
}

/** One fixed window's count. */
interface Window { start: number, used: number }

/**
 * A filter that lets each connection make at most `callsPerConnection`
 * calls per fixed window, and all the connections from one peer address
 * (its port left out) at most `callsPerAddress` together, and answers the
 * rest with `refuse(by)` without running their handler. It keys on what a
 * peer cannot choose: a name the protocol lets the peer pick (a chat nick)
 * would let it rotate names for a fresh budget each time, or spend another
 * user's. A refused call spends neither budget. It is synchronous: a
 * synchronous handler behind it stays so. Its memory is bounded: the
 * connections' windows go with their connections, the addresses' by
 * `maxAddresses`.
 */
export function rateLimit (options: RateLimitOptions): Filter {
  const perConnection = options.callsPerConnection ?? 10
  const perAddress = options.callsPerAddress ?? 100
  const windowMs = options.windowMs ?? 1000
  const maxAddresses = options.maxAddresses ?? 100_000
  const now = options.now ?? Date.now
  const connections = new WeakMap<ConnectionHandle, Window>()
  const addresses = new Map<string, Window>()
  return (request, ctx, next) => {
    const at = now()
    let mine = connections.get(ctx.connection)
    if (mine === undefined) connections.set(ctx.connection, mine = { start: at, used: 0 })
    else if (at - mine.start >= windowMs) { mine.start = at; mine.used = 0 }
    if (mine.used >= perConnection) return options.refuse('connection')
    const address = ctx.remoteAddress.replace(/:\d+$/, '')
    let shared = addresses.get(address)
    if (shared === undefined || at - shared.start >= windowMs) {
      if (shared === undefined && addresses.size >= maxAddresses) addresses.delete(addresses.keys().next().value!)
      // Re-inserted: the map stays in order of windows started, the oldest first to go.
      addresses.delete(address)
      addresses.set(address, shared = { start: at, used: 0 })
    }
    if (shared.used >= perAddress) return options.refuse('address')
    mine.used++
    shared.used++
    return next(request, ctx)
  }
}
