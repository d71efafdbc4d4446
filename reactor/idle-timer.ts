// One connection's own idle timeout (`ConnectionHandle.setIdleTimeout`),
// in place of the server's `idleTimeoutMs` for it: a psql session that may
// sit for hours (0: never closed for idleness), or MQTT's keep-alive (1.5 ×
// the client's value, counting only what the client sends: pushes to a
// subscriber do not keep a dead client open). A timer of its own per
// connection that has one, ticking at an eighth of the timeout: the close
// comes between `ms` and `ms` + ms/8 after the last activity.
import type { ConnectionRecord } from './connection-record.js'
import { closeWithLastWords } from './last-words.js'
import type { ServerContext } from './server-context.js'
import type { TimerHandle } from '../scheduling/clock.js'

/** The shortest tick of a connection's idle timer. */
const MIN_TICK_MS = 10

/** A connection's own idle rule: closes it after `ms` without activity (inbound only, when asked). */
export class IdleTimer {
  readonly #ctx: ServerContext
  readonly #sc: ConnectionRecord
  #ms = 0
  #inboundOnly = false
  #timer: TimerHandle | null = null
  /** What was last seen of the connection's activity (reads only, when inbound only) and when it last changed. */
  #seen = -1
  #seenOut = -1
  #quietSince = 0
  readonly #tick = (): void => this.#check()

  constructor (ctx: ServerContext, sc: ConnectionRecord) {
    this.#ctx = ctx
    this.#sc = sc
  }

  /** Sets the rule (0: none, the connection is never closed for idleness); its clock starts now. */
  set (ms: number, inboundOnly: boolean): void {
    this.stop()
    this.#ms = ms
    this.#inboundOnly = inboundOnly
    if (ms <= 0) return
    this.#seen = this.#activity()
    this.#seenOut = this.#outbound()
    this.#quietSince = this.#ctx.clock.now()
    this.#arm(ms)
  }

  /** The connection closed: the timer goes. */
  stop (): void {
    if (this.#timer !== null) this.#ctx.clock.clearTimer(this.#timer)
    this.#timer = null
  }

  // Reads only (inbound only), or any progress as the server's idle scan counts it (with #outbound).
  #activity (): number {
    const connection = this.#sc.connection
    return this.#inboundOnly ? connection.reads : connection.activity
  }

  // Bytes still to go out (the kernel taking some is progress); not counted when inbound only.
  #outbound (): number {
    const connection = this.#sc.connection
    return this.#inboundOnly ? 0 : connection.outboundBytes + connection.writeQueueBytes
  }

  #arm (leftMs: number): void {
    this.#timer = this.#ctx.clock.setTimer(this.#tick, Math.max(MIN_TICK_MS, Math.min(leftMs, this.#ms / 8)))
  }

  #check (): void {
    this.#timer = null
    const sc = this.#sc
    if (sc.connection.isClosed) return
    const now = this.#ctx.clock.now()
    const seen = this.#activity()
    const out = this.#outbound()
    // A call in flight, or a set-up under way (its own deadline), is not idleness.
    if (seen !== this.#seen || out !== this.#seenOut || sc.inFlight.size > 0 || !sc.ready) {
      this.#seen = seen
      this.#seenOut = out
      this.#quietSince = now
    } else if (now - this.#quietSince >= this.#ms) {
      const ctx = this.#ctx
      ctx.counters.idleClosed()
      ctx.log.info(`closing idle connection from ${sc.remoteAddress} after ${this.#ms} ms without ${this.#inboundOnly ? 'a byte from it' : 'progress'} (its own idle timeout)`,
        { protocol: ctx.protocol.name, remote: sc.remoteAddress, idleMs: this.#ms, inboundOnly: this.#inboundOnly })
      closeWithLastWords(ctx, sc, 'idle')
      return
    }
    this.#arm(this.#ms - (now - this.#quietSince))
  }
}
