/**
 * Outlier ejection: which hosts of a balanced target take calls now.
 *
 * A host that fails `consecutiveFailures` calls (or connections, or
 * liveness checks) in a row with no success between is ejected: the
 * balancer skips it for an ejection time that doubles with each ejection
 * in a row, from `baseEjectionMs` up to `maxEjectionMs`. When the time is
 * up the host is half-open: it may take one probe (a call or a ping); the
 * probe's success takes it back, its failure (or no outcome within
 * `probeTimeoutMs`) ejects it again for longer. A probe that times out
 * is not failed at once: a host just back (connecting, negotiating,
 * warming up) may answer late, and anything it sends that no call waits
 * for (`heardFrom`) takes it back. This is Finagle's failure
 * accrual and gRPC's outlier detection, reduced to consecutive failures:
 * the failure mode a hung or vanished host shows.
 *
 * Never is every host ejected: at most `maxEjectedShare` of them
 * (rounded up), and always one fewer than all. A failure that would pass
 * that cap leaves the host in, counted in `stats().ejectionsRefused`, so
 * that a caller facing a cut from most of its hosts still has somewhere to
 * send and its retries go to the hosts that remain.
 *
 * Pure logic on a `Clock`: no timers, states move when asked about.
 */
import type { Clock } from './clock.js'

/** Options of outlier ejection. */
export interface OutlierEjectionOptions {
  /** Failures in a row that eject a host; default 5. */
  consecutiveFailures?: number
  /** First ejection time; default 500 ms. Each ejection in a row doubles it. */
  baseEjectionMs?: number
  /** Longest ejection time; default 3000 ms, so that a healed host is probed within it. */
  maxEjectionMs?: number
  /** Share of the hosts that may be ejected at once, rounded up, never all; default 0.5. */
  maxEjectedShare?: number
  /** A probe with no outcome after this long counts as failed; default 1000 ms. */
  probeTimeoutMs?: number
}

/** Counters of outlier ejection. */
export interface OutlierEjectionStats {
  /** Hosts ejected (a host ejected again after a failed probe counts again). */
  ejections: number
  /** Hosts taken back after a successful probe. */
  readmissions: number
  /** Ejections the cap (`maxEjectedShare`, one host always eligible) refused. */
  ejectionsRefused: number
  /** Probes that failed or timed out. */
  probeFailures: number
  /** Hosts ejected or half-open now. */
  ejected: number
  /** The hosts ejected or half-open now. */
  ejectedHosts: string[]
}

/** Where a host is: taking calls, ejected, or half-open (one probe may go). */
export type HostStatus = 'active' | 'ejected' | 'probe-due' | 'probing'

interface HostState {
  failures: number
  /** false: active. */
  out: boolean
  until: number
  timesEjected: number
  /** Clock ms the probe left, or -1: none in flight. */
  probeAt: number
}

const DEFAULTS = {
  consecutiveFailures: 5,
  baseEjectionMs: 500,
  maxEjectionMs: 3000,
  maxEjectedShare: 0.5,
  probeTimeoutMs: 1000
}

function positive (name: string, value: number | undefined, fallback: number, integer: boolean): number {
  if (value === undefined) return fallback
  if (!(value > 0) || (integer && !Number.isInteger(value))) throw new RangeError(`${name} must be a positive ${integer ? 'integer' : 'number'}, got ${value}`)
  return value
}

/** The ejection state of a set of hosts, by key (`host:port`). */
export class OutlierEjection {
  readonly #clock: Clock
  readonly #threshold: number
  readonly #baseMs: number
  readonly #maxMs: number
  readonly #share: number
  readonly #probeTimeoutMs: number
  #hosts = new Map<string, HostState>()
  #out = 0
  /** Hosts in with failures counted since their last success: while 0 (and none out), a success has nothing to reset. */
  #failing = 0
  readonly #counts = { ejections: 0, readmissions: 0, ejectionsRefused: 0, probeFailures: 0 }

  constructor (clock: Clock, options: OutlierEjectionOptions = {}) {
    this.#clock = clock
    this.#threshold = positive('consecutiveFailures', options.consecutiveFailures, DEFAULTS.consecutiveFailures, true)
    this.#baseMs = positive('baseEjectionMs', options.baseEjectionMs, DEFAULTS.baseEjectionMs, false)
    this.#maxMs = positive('maxEjectionMs', options.maxEjectionMs, DEFAULTS.maxEjectionMs, false)
    if (this.#maxMs < this.#baseMs) throw new RangeError(`maxEjectionMs (${this.#maxMs}) must be at least baseEjectionMs (${this.#baseMs})`)
    this.#share = positive('maxEjectedShare', options.maxEjectedShare, DEFAULTS.maxEjectedShare, false)
    if (this.#share > 1) throw new RangeError(`maxEjectedShare must be at most 1, got ${this.#share}`)
    this.#probeTimeoutMs = positive('probeTimeoutMs', options.probeTimeoutMs, DEFAULTS.probeTimeoutMs, false)
  }

  /** Sets the hosts (after a DNS lookup); hosts kept keep their state. */
  setHosts (keys: readonly string[]): void {
    const hosts = new Map<string, HostState>()
    let out = 0
    let failing = 0
    for (const key of keys) {
      const state = this.#hosts.get(key) ?? { failures: 0, out: false, until: 0, timesEjected: 0, probeAt: -1 }
      if (state.out) out++
      if (state.failures > 0) failing++
      hosts.set(key, state)
    }
    this.#hosts = hosts
    this.#out = out
    this.#failing = failing
  }

  /** Hosts ejected or half-open now. */
  get ejectedCount (): number {
    return this.#out
  }

  /** How many hosts may be ejected at once. */
  get maxEjected (): number {
    return Math.min(this.#hosts.size - 1, Math.ceil(this.#share * this.#hosts.size))
  }

  /** Where `key` is now (an unknown host is active). */
  status (key: string): HostStatus {
    const state = this.#hosts.get(key)
    if (state === undefined || !state.out) return 'active'
    const now = this.#clock.now()
    if (state.probeAt >= 0) {
      if (now - state.probeAt < this.#probeTimeoutMs) return 'probing'
      // The probe's outcome never came: as good as a failure.
      this.#probeFailed(state, now)
      return 'ejected'
    }
    return now >= state.until ? 'probe-due' : 'ejected'
  }

  /** May a call go to `key` now without being its probe? Only when active. */
  eligible (key: string): boolean {
    return this.status(key) === 'active'
  }

  /** The probe of a half-open host leaves now (after `status` said `probe-due`); its outcome is the next `succeeded`/`failed`. */
  probeStarted (key: string): void {
    const state = this.#hosts.get(key)
    if (state === undefined || !state.out) return
    state.probeAt = this.#clock.now()
  }

  /** A call, connection or ping to `key` worked. */
  succeeded (key: string): void {
    // Every answer comes here: with no host failing or out, without a lookup.
    if (this.#failing === 0 && this.#out === 0) return
    const state = this.#hosts.get(key)
    if (state === undefined) return
    this.#setFailures(state, 0)
    // An ejected host's late answers prove nothing until it is probed.
    if (!state.out || state.probeAt < 0) return
    this.#readmit(state)
  }

  /**
   * Something came from `key` that no call was waiting for: the answer to
   * a call already given up on, or a finished protocol handshake. A host
   * being probed is alive, and is taken back; for any other host nothing
   * changes (a late answer does not undo the time-out that gave its call up).
   */
  heardFrom (key: string): void {
    if (this.#out === 0) return
    const state = this.#hosts.get(key)
    if (state === undefined || !state.out || state.probeAt < 0) return
    this.#readmit(state)
  }

  /** A call to `key` timed out or its connection failed (failures of the call's own making, such as a remote application error, are not the host's). */
  failed (key: string): void {
    const state = this.#hosts.get(key)
    if (state === undefined) return
    const now = this.#clock.now()
    if (state.out) {
      // Only the probe's failure counts while out: calls sent before the ejection fail late.
      if (state.probeAt >= 0) this.#probeFailed(state, now)
      return
    }
    this.#setFailures(state, state.failures + 1)
    if (state.failures < this.#threshold) return
    if (this.#out + 1 > this.maxEjected) {
      this.#counts.ejectionsRefused++
      return
    }
    this.#eject(state, now)
  }

  /**
   * A call to `key` got no answer within its time (its deadline, or its
   * attempt's). As `failed` for a host taking calls; while the host is
   * out, nothing: a probe has until `probeTimeoutMs`, since a host just
   * back answers its first call slowly, and that late answer
   * (`heardFrom`) still takes it back.
   */
  timedOut (key: string): void {
    const state = this.#hosts.get(key)
    if (state === undefined || state.out) return
    this.failed(key)
  }

  /**
   * A connection to `key` stayed silent through a liveness ping: as good as
   * `consecutiveFailures` failures at once (the host is ejected now if the
   * cap allows), since nothing answers there at all.
   */
  unresponsive (key: string): void {
    const state = this.#hosts.get(key)
    if (state === undefined) return
    if (!state.out) this.#setFailures(state, Math.max(state.failures, this.#threshold - 1))
    this.failed(key)
  }

  /** Counters, and the hosts out now. */
  stats (): OutlierEjectionStats {
    const ejectedHosts: string[] = []
    for (const [key, state] of this.#hosts) if (state.out) ejectedHosts.push(key)
    return { ...this.#counts, ejected: this.#out, ejectedHosts }
  }

  #setFailures (state: HostState, failures: number): void {
    if ((state.failures > 0) !== (failures > 0)) this.#failing += failures > 0 ? 1 : -1
    state.failures = failures
  }

  #readmit (state: HostState): void {
    state.out = false
    state.probeAt = -1
    state.timesEjected = 0
    this.#out--
    this.#counts.readmissions++
  }

  #probeFailed (state: HostState, now: number): void {
    this.#counts.probeFailures++
    state.probeAt = -1
    state.out = false
    this.#out--
    this.#eject(state, now)
  }

  #eject (state: HostState, now: number): void {
    state.out = true
    this.#setFailures(state, 0)
    state.probeAt = -1
    state.until = now + Math.min(this.#maxMs, this.#baseMs * 2 ** Math.min(state.timesEjected, 30))
    state.timesEjected++
    this.#out++
    this.#counts.ejections++
  }
}
