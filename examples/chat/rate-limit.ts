import type { Filter } from '../../reactor/index.js'

export interface RateLimitOptions {
  /** Calls each user may make per window; default 10. */
  calls?: number
  /** The window, in ms; default 1000. */
  windowMs?: number
  /** Who a call is from; default `ctx.user`, or the peer's address when the connection named no user. */
  userOf?: (ctx: Parameters<Filter>[1]) => string
  /** The answer to a call over the limit. */
  refuse: (user: string) => unknown
  /** The clock, in ms (tests); default Date.now. */
  now?: () => number
  /** Users remembered at most; past it the oldest window is forgotten. Default 100 000. */
  maxUsers?: number
}

/**
 * A filter that lets each user make at most `calls` calls per fixed
 * window and answers the rest with `refuse(user)`, without running their
 * handler. It is synchronous: a synchronous handler behind it stays so.
 * Its memory is bounded by `maxUsers`.
 */
export function rateLimit (options: RateLimitOptions): Filter {
  const calls = options.calls ?? 10
  const windowMs = options.windowMs ?? 1000
  const maxUsers = options.maxUsers ?? 100_000
  const now = options.now ?? Date.now
  const userOf = options.userOf ?? ((ctx) => ctx.user !== '' ? ctx.user : ctx.remoteAddress.replace(/:\d+$/, ''))
  const windows = new Map<string, { start: number, used: number }>()
  return (request, ctx, next) => {
    const user = userOf(ctx)
    const at = now()
    let window = windows.get(user)
    if (window === undefined || at - window.start >= windowMs) {
      if (window === undefined && windows.size >= maxUsers) windows.delete(windows.keys().next().value!)
      window = { start: at, used: 0 }
      windows.delete(user)
      windows.set(user, window)
    }
    if (window.used >= calls) return options.refuse(user)
    window.used++
    return next(request, ctx)
  }
}
