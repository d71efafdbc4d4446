import { ErrorCode, RpcError } from '../codec/errors.js'
import type { FramedConnection } from '../transport/framed-connection.js'
import type { ConnectionGuard } from './connection-guard.js'
import type { RateLimitedLog } from './logger.js'
import type { ServerContext } from './server-context.js'
import type { PushOutputLimitOptions } from './server-options.js'

export type { PushOutputLimitOptions } from './server-options.js'

export const DEFAULT_PUSH_HARD_BYTES = 32 * 1024 * 1024
export const DEFAULT_PUSH_SOFT_BYTES = 8 * 1024 * 1024
export const DEFAULT_PUSH_SOFT_MS = 60_000

/** What the push output limit follows of one connection. */
export class PushRecord {
  /** Something was pushed to it (`ConnectionHandle.send`, a group): the push output limits apply. */
  pushed = false
  /** Since when its unsent bytes have been over the soft push limit; -1: not over it. */
  softSince = -1
}

/** What the limit needs of a connection: its record, its unsent bytes (queued, and answers held for their turn). */
export interface Pushed {
  readonly connection: FramedConnection
  readonly remoteAddress: string
  readonly push: PushRecord
  readonly answers: { readonly heldBytes: number }
}

/** `PushOutputLimit.pushRange`: the connection cannot queue a range of a shared buffer now. */
export const NOT_TAKEN = -2

/** What the limit decided: close at once (`hard`), close after the soft period (`soft`), or keep. */
/** Why a connection that received pushes must close: past the hard limit; above the soft one too long; above the soft one while the server's outbound budget is exceeded; null: it may stay. */
export type PushVerdict = 'hard' | 'soft' | 'budget' | null

/**
 * The server's pushes and their slow-consumer rule
 * (`PushOutputLimitOptions`): queues what is pushed to a connection and
 * judges it at each push; the scan judges the connections over the soft
 * limit, which stop receiving pushes, until they close or come back below.
 * Closes are counted and logged, rate-limited.
 */
export class PushOutputLimit implements ConnectionGuard<Pushed> {
  readonly hardBytes: number
  readonly softBytes: number
  readonly softMs: number
  readonly #ctx: ServerContext
  /** Connections that received a push and are over the soft limit: the scan watches them. */
  readonly #overSoft = new Set<Pushed>()
  readonly #log: RateLimitedLog
  readonly #overBudget: () => boolean

  /** `overBudget` says whether the server's connections together hold more unsent bytes than its outbound budget. */
  constructor (ctx: ServerContext, options: PushOutputLimitOptions = {}, overBudget: () => boolean = () => false) {
    this.hardBytes = nonNegative(options.hardBytes ?? DEFAULT_PUSH_HARD_BYTES, 'pushOutputLimit.hardBytes')
    this.softBytes = nonNegative(options.softBytes ?? DEFAULT_PUSH_SOFT_BYTES, 'pushOutputLimit.softBytes')
    this.softMs = nonNegative(options.softMs ?? DEFAULT_PUSH_SOFT_MS, 'pushOutputLimit.softMs')
    this.#ctx = ctx
    this.#log = ctx.rateLimitedLog()
    this.#overBudget = overBudget
  }

  /**
   * Judges a connection holding `unsentBytes` at `now`: 'hard', 'soft' or
   * 'budget' when it must close, null otherwise. Records (in
   * `record.softSince`) when it went over the soft limit, and forgets it
   * once it is below. Above the soft limit while the server's outbound
   * budget is exceeded, it closes at once: N subscribers that do not read
   * then cost the budget, not N × the hard limit (pausing their reading,
   * as the budget does for answers, would not stop the pushes).
   */
  judge (record: PushRecord, unsentBytes: number, now: number): PushVerdict {
    if (this.hardBytes > 0 && unsentBytes > this.hardBytes) return 'hard'
    if (this.softBytes > 0 && unsentBytes > this.softBytes && this.#overBudget()) return 'budget'
    if (this.softBytes === 0 || unsentBytes <= this.softBytes) {
      record.softSince = -1
      return null
    }
    if (record.softSince < 0) {
      record.softSince = now
      return this.softMs === 0 ? 'soft' : null
    }
    return now - record.softSince >= this.softMs ? 'soft' : null
  }

  /**
   * Pushed bytes for `sc`: queued (closed past its outbound bound), then
   * judged by the push limits. Returns its unsent bytes then (queued, and
   * answers held for their turn), or -1 when it is closed (or was, for them).
   */
  push (sc: Pushed, slices: Uint8Array[], bytes: number): number {
    const connection = sc.connection
    if (connection.isClosed) return -1
    sc.push.pushed = true
    return this.#queued(sc, connection.send({ slices: slices as Buffer[], bytes }))
  }

  /**
   * `push` of `buffer[start, start + bytes)`, a frame encoded once for many
   * connections (transport/shared-frame.ts), queued as a range of it;
   * `NOT_TAKEN` when the connection cannot queue a range of a shared buffer
   * now (it waits for 'drain'): push the frame as bytes of its own.
   */
  pushRange (sc: Pushed, buffer: Buffer, start: number, bytes: number): number {
    const connection = sc.connection
    if (connection.isClosed) return -1
    sc.push.pushed = true
    const sent = connection.sendRange(buffer, start, bytes)
    return sent === null ? NOT_TAKEN : this.#queued(sc, sent)
  }

  // A push was queued (`sent`) or refused by the outbound bound: the connection's unsent bytes, or -1 when closed.
  #queued (sc: Pushed, sent: boolean): number {
    if (!sent) {
      this.#ctx.log.warn(`closing ${sc.remoteAddress}: it reads slower than it is sent to (outbound bound exceeded)`, { protocol: this.#ctx.protocol.name, remote: sc.remoteAddress })
      sc.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
      return -1
    }
    this.#ctx.counters.pushSent()
    // Within both limits the verdict needs no time: no clock read per push (a fan-out pushes to every member).
    const unsent = sc.connection.outboundBytes + sc.answers.heldBytes
    if ((this.hardBytes === 0 || unsent <= this.hardBytes) && (this.softBytes === 0 || unsent <= this.softBytes)) {
      sc.push.softSince = -1
      if (this.#overSoft.size > 0) this.#overSoft.delete(sc)
      return unsent
    }
    return this.#judgePushed(sc, this.#ctx.clock.now()) ? unsent : -1
  }

  /** The scan looks at least this often while a soft limit is set (its period is a quarter of this). */
  scanEveryMs (): number {
    return this.softBytes > 0 ? Math.max(this.softMs, 40) : Infinity
  }

  /** Over the soft push limit: closed once there for softMs, forgotten once below (pushes may have stopped). */
  tick (now: number): void {
    if (this.#overSoft.size > 0) for (const sc of [...this.#overSoft]) this.#judgePushed(sc, now)
  }

  closed (sc: Pushed): void {
    if (this.#overSoft.size > 0) this.#overSoft.delete(sc)
  }

  // The push limits for a connection that received pushes; false: closed for them.
  #judgePushed (sc: Pushed, now: number): boolean {
    const ctx = this.#ctx
    const record = sc.push
    const unsent = sc.connection.outboundBytes + sc.answers.heldBytes
    const verdict = this.judge(record, unsent, now)
    if (record.softSince >= 0) this.#overSoft.add(sc)
    else if (this.#overSoft.size > 0) this.#overSoft.delete(sc)
    if (verdict === null) return true
    const why = verdict === 'hard'
      ? `${unsent} unsent bytes, over the hard push limit of ${this.hardBytes}`
      : verdict === 'budget'
        ? `${unsent} unsent bytes, over the soft push limit of ${this.softBytes} while the server's unsent bytes are over its outbound budget`
        : `over the soft push limit of ${this.softBytes} bytes for ${Math.round(now - record.softSince)} ms (${unsent} unsent bytes)`
    ctx.counters.pushLimitClosed(verdict !== 'soft')
    this.#overSoft.delete(sc)
    this.#log.log(ctx.warn, () => `closing ${sc.remoteAddress}: it does not read what is pushed to it: ${why}`,
      () => ({ protocol: ctx.protocol.name, remote: sc.remoteAddress, unsentBytes: unsent, limit: verdict }))
    sc.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, `closed as a slow consumer: ${why}`))
    return false
  }
}

function nonNegative (value: number, name: string): number {
  if (!Number.isSafeInteger(value) || value < 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be a non-negative integer, got ${value}`)
  return value
}
