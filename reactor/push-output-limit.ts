import { ErrorCode, RpcError } from '../codec/errors.js'

/**
 * The slow-consumer rule for connections that receive pushes, as Redis's
 * `client-output-buffer-limit pubsub 32mb 8mb 60`: a connection whose
 * unsent bytes pass the hard limit is closed at once; one that stays above
 * the soft limit for `softMs` without a break is closed then. So N
 * subscribers that stop reading cost at most N × the hard limit, and a
 * burst above the soft limit that drains in time costs nothing.
 */
export interface PushOutputLimitOptions {
  /** Unsent bytes past which a connection that received pushes is closed at once; default 32 MiB; 0: no hard limit. */
  hardBytes?: number
  /** Unsent bytes above which it may stay only `softMs`; default 8 MiB; 0: no soft limit. */
  softBytes?: number
  /** How long it may stay above `softBytes`; default 60 000 ms. */
  softMs?: number
}

export const DEFAULT_PUSH_HARD_BYTES = 32 * 1024 * 1024
export const DEFAULT_PUSH_SOFT_BYTES = 8 * 1024 * 1024
export const DEFAULT_PUSH_SOFT_MS = 60_000

/** What the limit needs of a connection: since when it has been over the soft limit (-1: it is not). */
export interface PushLimited {
  softSince: number
}

export type PushVerdict = 'hard' | 'soft' | null

export class PushOutputLimit {
  readonly hardBytes: number
  readonly softBytes: number
  readonly softMs: number

  constructor (options: PushOutputLimitOptions = {}) {
    this.hardBytes = nonNegative(options.hardBytes ?? DEFAULT_PUSH_HARD_BYTES, 'pushOutputLimit.hardBytes')
    this.softBytes = nonNegative(options.softBytes ?? DEFAULT_PUSH_SOFT_BYTES, 'pushOutputLimit.softBytes')
    this.softMs = nonNegative(options.softMs ?? DEFAULT_PUSH_SOFT_MS, 'pushOutputLimit.softMs')
  }

  /**
   * Judges a connection holding `unsentBytes` at `now`: 'hard' or 'soft'
   * when it must close, null otherwise. Records (in `member.softSince`)
   * when it went over the soft limit, and forgets it once it is below.
   */
  judge (member: PushLimited, unsentBytes: number, now: number): PushVerdict {
    if (this.hardBytes > 0 && unsentBytes > this.hardBytes) return 'hard'
    if (this.softBytes === 0 || unsentBytes <= this.softBytes) {
      member.softSince = -1
      return null
    }
    if (member.softSince < 0) {
      member.softSince = now
      return this.softMs === 0 ? 'soft' : null
    }
    return now - member.softSince >= this.softMs ? 'soft' : null
  }
}

function nonNegative (value: number, name: string): number {
  if (!Number.isSafeInteger(value) || value < 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be a non-negative integer, got ${value}`)
  return value
}
