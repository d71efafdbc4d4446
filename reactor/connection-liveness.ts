/**
 * Liveness of one client connection: is anybody answering? A stopped
 * process, or a host whose link went down without a FIN, leaves the
 * socket open and silent: TCP notices only after minutes of
 * retransmissions (or keepalive probes, for an idle socket). What the
 * client can tell sooner is silence while calls wait: once nothing has
 * been read for `pingAfterMs` while a call awaits its answer, the
 * protocol's ping goes out (memcached's NOOP; gRPC's HTTP/2 PING plays
 * this part), and if still nothing at all is read within `pingTimeoutMs`,
 * the connection is declared dead, so that its calls fail now (and are
 * retried elsewhere when they may be) instead of at their deadlines.
 *
 * Any frame read counts as a sign of life, the ping's answer or another:
 * a busy but alive peer is never pinged to death. Without a ping (a
 * protocol that has none) nothing is sent and nothing is declared: the
 * call's own deadlines (and attempt timeouts) are what notice then.
 *
 * Pure logic on a `Clock`: one timer at most, armed only while calls wait.
 */
import type { Clock, TimerHandle } from '../scheduling/clock.js'

/** Options of the liveness check of client connections. */
export interface LivenessOptions {
  /** Silence (nothing read) while a call waits before the ping goes; default 200 ms. */
  pingAfterMs?: number
  /** Silence after the ping before the connection is declared dead; default 300 ms. */
  pingTimeoutMs?: number
}

/** What the check does to its connection. */
export interface LivenessHooks {
  /** Sends the protocol's ping (its answer, like any frame, reaches `heard`). */
  ping: () => void
  /** Nothing was read for `silentMs` despite the ping: the peer is gone. */
  dead: (silentMs: number) => void
}

/** Defaults of `LivenessOptions`. */
export const DEFAULT_PING_AFTER_MS = 200
/** Defaults of `LivenessOptions`. */
export const DEFAULT_PING_TIMEOUT_MS = 300

/** The liveness check of one connection. */
export class ConnectionLiveness {
  readonly #clock: Clock
  readonly #hooks: LivenessHooks
  readonly #pingAfterMs: number
  readonly #pingTimeoutMs: number
  #lastHeard: number
  #waiting = 0
  #pingSentAt = -1
  #timer: TimerHandle | null = null
  #closed = false
  /** Pings sent. */
  pings = 0

  constructor (clock: Clock, options: LivenessOptions, hooks: LivenessHooks) {
    this.#clock = clock
    this.#hooks = hooks
    this.#pingAfterMs = options.pingAfterMs ?? DEFAULT_PING_AFTER_MS
    this.#pingTimeoutMs = options.pingTimeoutMs ?? DEFAULT_PING_TIMEOUT_MS
    if (!(this.#pingAfterMs > 0) || !(this.#pingTimeoutMs > 0)) throw new RangeError(`pingAfterMs and pingTimeoutMs must be positive, got ${this.#pingAfterMs} and ${this.#pingTimeoutMs}`)
    this.#lastHeard = clock.now()
  }

  /** A frame was read from the peer. */
  heard (): void {
    this.#lastHeard = this.#clock.now()
    this.#pingSentAt = -1
  }

  /** Calls awaiting an answer on the connection now (the check runs only while some do). */
  waiting (count: number): void {
    if (this.#closed) return
    const was = this.#waiting
    this.#waiting = count
    if (count > 0 && was === 0) {
      // Silence is measured from when somebody started waiting, not from the last answer of an idle spell.
      if (this.#pingSentAt < 0) this.#lastHeard = this.#clock.now()
      this.#arm(this.#pingAfterMs)
    }
  }

  /** The connection closed: no more timers. */
  close (): void {
    this.#closed = true
    if (this.#timer !== null) this.#clock.clearTimer(this.#timer)
    this.#timer = null
  }

  #arm (ms: number): void {
    if (this.#timer !== null || this.#closed) return
    this.#timer = this.#clock.setTimer(this.#check, ms)
  }

  readonly #check = (): void => {
    this.#timer = null
    if (this.#closed || this.#waiting === 0) return
    const now = this.#clock.now()
    if (this.#pingSentAt >= 0) {
      const left = this.#pingSentAt + this.#pingTimeoutMs - now
      if (left > 0) return this.#arm(left)
      this.#closed = true
      this.#hooks.dead(now - this.#lastHeard)
      return
    }
    const left = this.#lastHeard + this.#pingAfterMs - now
    if (left > 0) return this.#arm(left)
    this.#pingSentAt = now
    this.pings++
    this.#hooks.ping()
    this.#arm(this.#pingTimeoutMs)
  }
}
