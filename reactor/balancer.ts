import type { Clock } from '../scheduling/clock.js'
import type { OutlierEjection, OutlierEjectionStats } from '../scheduling/outlier-ejection.js'
import { ExponentialBackoff, type Backoff } from '../scheduling/retry.js'

/**
 * How a balanced client picks a connection per call.
 * - `round-robin`: each slot in turn.
 * - `least-outstanding`: the slot with the fewest calls waiting (ties: the first).
 * - `p2c`: power of two choices: two slots at random, the one with fewer calls waiting.
 *   Nearly as good as least-outstanding, without scanning every slot, and it
 *   does not herd every client onto the same momentarily idle connection.
 */
export type BalancePolicy = 'round-robin' | 'least-outstanding' | 'p2c'

/** An endpoint's host and port. */
export interface Address { host: string, port: number }

/** One connection slot: an address and its index among that address's connections. */
export interface Slot {
  readonly key: string
  readonly address: Address
  /** `host:port`: the host whose outlier-ejection state the slot shares with its sibling connections. */
  readonly host: string
  /** Consecutive failures to connect or negotiate; 0 once a connection works. */
  failures: number
  /** Until then (clock ms) the slot is skipped while another is usable. */
  retryAt: number
}

/** How the balancer picks and skips slots. */
export interface BalancerOptions {
  connectionsPerEndpoint: number
  policy: BalancePolicy
  clock: Clock
  /** Calls waiting on a slot's connection now. */
  outstanding: (slot: Slot) => number
  /** Delay before a failed slot is tried again; default exponential from 10 ms, capped at 5 s, with jitter. */
  backoff?: Backoff
  random?: () => number
  /**
   * Outlier ejection by host (scheduling/outlier-ejection.ts): the slots of
   * an ejected host are skipped while another host is eligible, and a
   * half-open host gets the next call as its probe. The client reports each
   * call's outcome (`callSucceeded`, `callFailed`). null or absent: none.
   */
  ejection?: OutlierEjection | null
}

/**
 * The connection slots of one balanced target (a list of endpoints, or the
 * addresses a DNS name resolved to), times `connectionsPerEndpoint`. A slot
 * whose connection failed is skipped until its backoff passes, unless every
 * slot is failing, in which case the one due soonest is tried (a call is
 * never failed without an attempt). With `ejection`, the slots of an
 * ejected host are skipped too (its outlier-ejection state is shared by
 * every connection to it), and a host whose ejection ended gets the next
 * call as its one probe.
 */
export class Balancer {
  readonly #options: BalancerOptions
  readonly #backoff: Backoff
  readonly #random: () => number
  readonly #ejection: OutlierEjection | null
  #slots: Slot[] = []
  #next = 0
  /** The one slot, when there is exactly one (`pick` then always answers it); else null. */
  soleSlot: Slot | null = null

  constructor (addresses: readonly Address[], options: BalancerOptions) {
    if (!Number.isInteger(options.connectionsPerEndpoint) || options.connectionsPerEndpoint < 1) {
      throw new RangeError(`connectionsPerEndpoint must be an integer >= 1, got ${options.connectionsPerEndpoint}`)
    }
    this.#options = options
    this.#backoff = options.backoff ?? new ExponentialBackoff({ baseMs: 10, maxExponent: 9, capMs: 5000, jitter: 'equal' })
    this.#random = options.random ?? Math.random
    this.#ejection = options.ejection ?? null
    this.setAddresses(addresses)
  }

  /** Every slot, in address order. */
  get slots (): readonly Slot[] {
    return this.#slots
  }

  /** Replaces the addresses (after a DNS lookup); slots of addresses kept keep their state. */
  setAddresses (addresses: readonly Address[]): void {
    const old = new Map(this.#slots.map((s) => [s.key, s]))
    const slots: Slot[] = []
    for (const address of addresses) {
      for (let i = 0; i < this.#options.connectionsPerEndpoint; i++) {
        const host = `${address.host}:${address.port}`
        const key = `${host}#${i}`
        slots.push(old.get(key) ?? { key, address, host, failures: 0, retryAt: 0 })
      }
    }
    this.#slots = slots
    this.#next = 0
    this.soleSlot = slots.length === 1 ? slots[0]! : null
    this.#ejection?.setHosts([...new Set(slots.map((s) => s.host))])
  }

  /** The slot for the next call; undefined only when there are no addresses. */
  pick (): Slot | undefined {
    const slots = this.#slots
    if (slots.length <= 1) return slots[0]
    const now = this.#options.clock.now()
    const ejection = this.#ejection
    let healthy = (s: Slot): boolean => s.retryAt <= now
    if (ejection !== null && ejection.ejectedCount > 0) {
      const probe = this.#probeSlot(ejection)
      if (probe !== undefined) return probe
      healthy = (s: Slot): boolean => s.retryAt <= now && ejection.eligible(s.host)
    }
    switch (this.#options.policy) {
      case 'round-robin': {
        for (let tried = 0; tried < slots.length; tried++) {
          const slot = slots[this.#next]!
          this.#next = (this.#next + 1) % slots.length
          if (healthy(slot)) return slot
        }
        break
      }
      case 'least-outstanding': {
        let best: Slot | undefined
        let bestLoad = Number.POSITIVE_INFINITY
        for (const slot of slots) {
          if (!healthy(slot)) continue
          const load = this.#options.outstanding(slot)
          if (load < bestLoad) { best = slot; bestLoad = load }
        }
        if (best !== undefined) return best
        break
      }
      case 'p2c': {
        const a = slots[Math.floor(this.#random() * slots.length)]!
        let b = slots[Math.floor(this.#random() * (slots.length - 1))]!
        if (b === a) b = slots[slots.length - 1]!
        const aOk = healthy(a)
        const bOk = healthy(b)
        if (aOk && bOk) return this.#options.outstanding(b) < this.#options.outstanding(a) ? b : a
        if (aOk) return a
        if (bOk) return b
        // Both failing: fall back to any healthy slot.
        for (const slot of slots) if (healthy(slot)) return slot
        break
      }
    }
    // Every slot is backing off (or ejected): try the one due soonest, of an eligible host if there is one.
    let soonest: Slot | undefined
    if (ejection !== null) {
      for (const slot of slots) if (ejection.eligible(slot.host) && (soonest === undefined || slot.retryAt < soonest.retryAt)) soonest = slot
    }
    if (soonest !== undefined) return soonest
    soonest = slots[0]!
    for (const slot of slots) if (slot.retryAt < soonest.retryAt) soonest = slot
    return soonest
  }

  // A slot of a half-open host, its probe now started; undefined when no probe is due.
  // The slot's own connect backoff is not waited for: while a host is out,
  // the ejection's times alone say when it is tried again, so that a host
  // back up is probed (and taken back) within maxEjectionMs.
  #probeSlot (ejection: OutlierEjection): Slot | undefined {
    for (const slot of this.#slots) {
      if (ejection.status(slot.host) !== 'probe-due') continue
      ejection.probeStarted(slot.host)
      return slot
    }
    return undefined
  }

  /** A call on the slot's connection was answered (the host is alive, whatever the answer said). */
  callSucceeded (slot: Slot): void {
    this.#ejection?.succeeded(slot.host)
  }

  /** A call on the slot's connection timed out or lost its connection, or a liveness check failed. */
  callFailed (slot: Slot): void {
    this.#ejection?.failed(slot.host)
  }

  /** A call on the slot's connection got no answer in its time (deadline or attempt): a failure, except for a host being probed, whose probe may answer late. */
  callTimedOut (slot: Slot): void {
    this.#ejection?.timedOut(slot.host)
  }

  /** The slot's host sent what no call waited for (a late answer, a finished handshake): a host being probed is taken back. */
  heardFrom (slot: Slot): void {
    this.#ejection?.heardFrom(slot.host)
  }

  /** A connection of the slot's host stayed silent through a liveness ping: eject the host now (within the cap). */
  unresponsive (slot: Slot): void {
    this.#ejection?.unresponsive(slot.host)
  }

  /** Outlier-ejection counters; null without ejection. */
  ejectionStats (): OutlierEjectionStats | null {
    return this.#ejection?.stats() ?? null
  }

  /** The slot's connection could not be made or negotiated: skip it for a while (and count it against its host). */
  failed (slot: Slot): void {
    this.#ejection?.failed(slot.host)
    slot.failures++
    slot.retryAt = this.#options.clock.now() + this.#backoff.delayMs(Math.min(slot.failures, 30))
  }

  /**
   * The slot's connection negotiated: it is healthy again. Not proof that
   * its host answers calls (a stopped process's kernel still completes
   * TCP handshakes), so outlier ejection waits for `callSucceeded` (or,
   * for a protocol with a handshake, the client's `heardFrom`).
   */
  succeeded (slot: Slot): void {
    slot.failures = 0
    slot.retryAt = 0
  }
}
