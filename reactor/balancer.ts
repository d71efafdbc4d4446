import type { Clock } from '../scheduling/clock.js'
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

export interface Address { host: string, port: number }

/** One connection slot: an address and its index among that address's connections. */
export interface Slot {
  readonly key: string
  readonly address: Address
  /** Consecutive failures to connect or negotiate; 0 once a connection works. */
  failures: number
  /** Until then (clock ms) the slot is skipped while another is usable. */
  retryAt: number
}

export interface BalancerOptions {
  connectionsPerEndpoint: number
  policy: BalancePolicy
  clock: Clock
  /** Calls waiting on a slot's connection now. */
  outstanding: (slot: Slot) => number
  /** Delay before a failed slot is tried again; default exponential from 10 ms, capped at 5 s, with jitter. */
  backoff?: Backoff
  random?: () => number
}

/**
 * The connection slots of one balanced target (a list of endpoints, or the
 * addresses a DNS name resolved to), times `connectionsPerEndpoint`. A slot
 * whose connection failed is skipped until its backoff passes, unless every
 * slot is failing, in which case the one due soonest is tried (a call is
 * never failed without an attempt).
 */
export class Balancer {
  readonly #options: BalancerOptions
  readonly #backoff: Backoff
  readonly #random: () => number
  #slots: Slot[] = []
  #next = 0

  constructor (addresses: readonly Address[], options: BalancerOptions) {
    if (!Number.isInteger(options.connectionsPerEndpoint) || options.connectionsPerEndpoint < 1) {
      throw new RangeError(`connectionsPerEndpoint must be an integer >= 1, got ${options.connectionsPerEndpoint}`)
    }
    this.#options = options
    this.#backoff = options.backoff ?? new ExponentialBackoff({ baseMs: 10, maxExponent: 9, capMs: 5000, jitter: 'equal' })
    this.#random = options.random ?? Math.random
    this.setAddresses(addresses)
  }

  get slots (): readonly Slot[] {
    return this.#slots
  }

  /** Replaces the addresses (after a DNS lookup); slots of addresses kept keep their state. */
  setAddresses (addresses: readonly Address[]): void {
    const old = new Map(this.#slots.map((s) => [s.key, s]))
    const slots: Slot[] = []
    for (const address of addresses) {
      for (let i = 0; i < this.#options.connectionsPerEndpoint; i++) {
        const key = `${address.host}:${address.port}#${i}`
        slots.push(old.get(key) ?? { key, address, failures: 0, retryAt: 0 })
      }
    }
    this.#slots = slots
    this.#next = 0
  }

  /** The slot for the next call; undefined only when there are no addresses. */
  pick (): Slot | undefined {
    const slots = this.#slots
    if (slots.length <= 1) return slots[0]
    const now = this.#options.clock.now()
    const healthy = (s: Slot): boolean => s.retryAt <= now
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
    // Every slot is backing off: try the one due soonest.
    let soonest = slots[0]!
    for (const slot of slots) if (slot.retryAt < soonest.retryAt) soonest = slot
    return soonest
  }

  /** The slot's connection could not be made or negotiated: skip it for a while. */
  failed (slot: Slot): void {
    slot.failures++
    slot.retryAt = this.#options.clock.now() + this.#backoff.delayMs(Math.min(slot.failures, 30))
  }

  /** The slot's connection negotiated: it is healthy again. */
  succeeded (slot: Slot): void {
    slot.failures = 0
    slot.retryAt = 0
  }
}
