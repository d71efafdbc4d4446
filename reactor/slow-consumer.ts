import { ErrorCode, RpcError } from '../codec/errors.js'
import type { TimerHandle } from '../scheduling/clock.js'
import type { FramedConnection } from '../transport/framed-connection.js'
import type { ConnectionGuard } from './connection-guard.js'
import type { RateLimitedLog } from './logger.js'
import type { ServerContext } from './server-context.js'
import { SUSPENDED_GRACE_MS } from './server-options.js'

/** What the watch needs of a connection. */
export interface Watched {
  readonly connection: FramedConnection
  readonly remoteAddress: string
}

/**
 * Slow consumers: past its outbound bound a connection is not read (the
 * kernel left more than the bound). A peer that takes none of what waits
 * for SUSPENDED_GRACE_MS at a time is a slow consumer: closed (QUEUE_FULL).
 * Taking is the kernel's write queue falling, or a drain; answers still
 * coming for requests already read do not count.
 */
export class SlowConsumerWatch implements ConnectionGuard<Watched> {
  readonly #ctx: ServerContext
  /** Connections not read for their outbound bound, and the timer that judges whether their peer takes anything. */
  readonly #suspended = new Map<Watched, TimerHandle>()
  readonly #log: RateLimitedLog

  constructor (ctx: ServerContext) {
    this.#ctx = ctx
    this.#log = ctx.rateLimitedLog()
  }

  /** The connection's reading was suspended (its outbound bound): its peer is watched. */
  watch (sc: Watched): void {
    const ctx = this.#ctx
    const clock = ctx.clock
    const connection = sc.connection
    let lastQueue = connection.writeQueueBytes
    let lastDrains = connection.drains
    const check = (): void => {
      this.#suspended.delete(sc)
      if (connection.isClosed || !connection.isReadingSuspended) return
      const queue = connection.writeQueueBytes
      if (queue < lastQueue || connection.drains !== lastDrains) {
        lastQueue = queue
        lastDrains = connection.drains
        this.#suspended.set(sc, clock.setTimer(check, SUSPENDED_GRACE_MS))
        return
      }
      const unsent = connection.outboundBytes
      this.#log.log(ctx.warn, () => `closing ${sc.remoteAddress}: it took none of its ${unsent} unsent bytes in ${SUSPENDED_GRACE_MS} ms, over the bound of ${connection.maxOutboundBytes}`,
        () => ({ protocol: ctx.protocol.name, remote: sc.remoteAddress, unsentBytes: unsent, maxOutboundBytes: connection.maxOutboundBytes }))
      connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
    }
    const armed = this.#suspended.get(sc)
    if (armed !== undefined) clock.clearTimer(armed)
    this.#suspended.set(sc, clock.setTimer(check, SUSPENDED_GRACE_MS))
  }

  closed (sc: Watched): void {
    if (this.#suspended.size === 0) return
    const timer = this.#suspended.get(sc)
    if (timer !== undefined) this.#ctx.clock.clearTimer(timer)
    this.#suspended.delete(sc)
  }
}
