/**
 * One service's scheduler shared by several reactors (docs/scheduling.md,
 * 'Several reactors: one scheduler'), the half that runs in the process all
 * reactors talk to (the `node:cluster` primary). Kudu's service pool has
 * one queue and one set of workers for all its reactor threads; here a
 * reactor is a process that owns its connections and the bytes of their
 * calls, so what is shared is the *workers*, as tokens, and the *queue*, as
 * metadata: (reactor, entry id, deadline).
 *
 * - A reactor runs a call only while it holds a token. It starts holding the
 *   `workers` it contributed and keeps its tokens while nobody waits: the
 *   uncontended path sends nothing here.
 * - A call that finds no idle token in its reactor is `want`ed here. With a
 *   free token it is granted at once; otherwise it is queued in one EDF queue
 *   (bound: the queue lengths of all reactors, summed): when full, the latest
 *   deadline anywhere is refused (`full` for a newcomer, `evicted` for a
 *   queued entry), and an entry whose deadline passes is refused `expired`.
 * - While the queue is not empty every reactor is `recall`ed: it gives its
 *   idle tokens back and every token it frees after, and each token given
 *   back is granted to the earliest deadline queued, whichever reactor owns
 *   it. When the queue empties, reactors are told `calm` and keep tokens
 *   again, and the free tokens are `lend`t back to their contributors.
 * - A reactor that leaves (it died) takes its contribution: its tokens and
 *   its queued entries are gone, and the rest is granted as usual.
 */
import type { Clock, TimerHandle } from './clock.js'
import { DeadlineQueue, type QueueDiscipline } from './service-queue.js'

/** Why the broker refused a queued or wanted entry. */
export type BrokerRefusal = 'full' | 'evicted' | 'expired'

/** What the broker tells reactors; each call is one message to one reactor. */
export interface BrokerOutput {
  /** Entry `id` of `reactor` may run now: `reactor` holds one more token. */
  grant: (reactor: number, id: number) => void
  /** Entry `id` of `reactor` will not run. */
  refuse: (reactor: number, id: number, reason: BrokerRefusal) => void
  /** Entries wait: give idle tokens back, and every token freed from now on. */
  recall: (reactor: number) => void
  /** Nothing waits any longer: keep tokens again. */
  calm: (reactor: number) => void
  /** `n` free tokens go back to `reactor` to park, so its next calls run without asking. */
  lend: (reactor: number, n: number) => void
}

export interface TokenBrokerOptions {
  discipline: QueueDiscipline
  /** Its `now()` is the time base of the deadlines wanted (shared by all reactors). */
  clock: Clock
  output: BrokerOutput
}

/** Counters since construction. */
export interface TokenBrokerStats {
  wanted: number
  /** Granted at once from a free token. */
  grantedFree: number
  /** Granted from the queue when a token came back. */
  grantedQueued: number
  overflows: number
  evictions: number
  expired: number
  /** Queued entries dropped because their reactor left. */
  orphaned: number
  recalls: number
  /** Free tokens lent back to their contributors when the queue emptied. */
  lent: number
}

interface Entry {
  readonly reactor: number
  readonly id: number
  readonly deadline: number
}

interface Member {
  readonly workers: number
  readonly queueLength: number
  held: number
  recalled: boolean
}

const MAX_TIMER_MS = 2 ** 31 - 1

export class TokenBroker {
  readonly #discipline: QueueDiscipline
  readonly #clock: Clock
  readonly #out: BrokerOutput
  readonly #members = new Map<number, Member>()
  #queue: DeadlineQueue<Entry>
  /** Tokens nobody holds: the workers of all members less what they hold (negative after a member left holding few). */
  #free = 0
  #expiryTimer: TimerHandle | undefined
  #expiryAt = Infinity
  readonly #stats: TokenBrokerStats = { wanted: 0, grantedFree: 0, grantedQueued: 0, overflows: 0, evictions: 0, expired: 0, orphaned: 0, recalls: 0, lent: 0 }

  constructor (options: TokenBrokerOptions) {
    this.#discipline = options.discipline
    this.#clock = options.clock
    this.#out = options.output
    this.#queue = new DeadlineQueue<Entry>({ maxLength: 0, discipline: options.discipline })
  }

  /** Workers of all members. */
  get workers (): number {
    let n = 0
    for (const m of this.#members.values()) n += m.workers
    return n
  }

  get free (): number {
    return this.#free
  }

  get queueLength (): number {
    return this.#queue.length
  }

  get maxQueueLength (): number {
    return this.#queue.maxLength
  }

  /** Tokens `reactor` holds (running calls or parked there); 0 for a stranger. */
  held (reactor: number): number {
    return this.#members.get(reactor)?.held ?? 0
  }

  get stats (): TokenBrokerStats {
    return { ...this.#stats }
  }

  /** `reactor` joins with `workers` tokens, which it holds from now on, and `queueLength` more queue slots. Joining twice is ignored. */
  join (reactor: number, workers: number, queueLength: number): void {
    if (this.#members.has(reactor)) return
    if (!Number.isSafeInteger(workers) || workers < 0 || !Number.isSafeInteger(queueLength) || queueLength < 0) return
    this.#members.set(reactor, { workers, queueLength, held: workers, recalled: false })
    this.#rebound()
    if (this.#queue.length > 0) this.#recallOne(reactor)
  }

  /** `reactor` is gone: its tokens and queued entries with it. */
  leave (reactor: number): void {
    const member = this.#members.get(reactor)
    if (member === undefined) return
    this.#members.delete(reactor)
    this.#free -= member.workers - member.held
    const kept: Entry[] = []
    for (const entry of this.#queue.drain()) {
      if (entry.reactor === reactor) this.#stats.orphaned++
      else kept.push(entry)
    }
    this.#queue = new DeadlineQueue<Entry>({ maxLength: this.#queue.maxLength, discipline: this.#discipline })
    for (const entry of kept) this.#queue.put(entry)
    this.#rebound()
    this.#dispatch()
  }

  /** Entry `id` of `reactor` (deadline on the shared time base; Infinity: none) needs a token. */
  want (reactor: number, id: number, deadline: number): void {
    if (!this.#members.has(reactor)) return
    this.#stats.wanted++
    const due = Number.isNaN(deadline) ? Infinity : deadline
    if (due !== Infinity && due <= this.#clock.now()) {
      this.#stats.expired++
      this.#out.refuse(reactor, id, 'expired')
      return
    }
    if (this.#free > 0 && this.#queue.length === 0) {
      this.#stats.grantedFree++
      this.#grant({ reactor, id, deadline: due })
      return
    }
    const entry: Entry = { reactor, id, deadline: due }
    const dropped = this.#queue.put(entry)
    if (dropped === entry) this.#stats.overflows++
    else if (dropped !== undefined) this.#stats.evictions++
    if (dropped !== undefined) this.#out.refuse(dropped.reactor, dropped.id, dropped === entry ? 'full' : 'evicted')
    if (this.#queue.length > 0) this.#recallAll()
    this.#armExpiry()
    this.#dispatch()
  }

  /** `reactor` gives `n` tokens back. */
  give (reactor: number, n: number): void {
    const member = this.#members.get(reactor)
    if (member === undefined || !Number.isSafeInteger(n) || n <= 0) return
    const given = Math.min(n, member.held)
    member.held -= given
    this.#free += given
    this.#dispatch()
  }

  /** Grants free tokens to the earliest deadlines queued; calms the members once the queue is empty. */
  #dispatch (): void {
    this.#expireDue()
    while (this.#free > 0) {
      const entry = this.#queue.take()
      if (entry === undefined) break
      this.#stats.grantedQueued++
      this.#grant(entry)
    }
    if (this.#queue.length === 0) this.#calmAll()
    this.#armExpiry()
  }

  #grant (entry: Entry): void {
    this.#free--
    this.#members.get(entry.reactor)!.held++
    this.#out.grant(entry.reactor, entry.id)
  }

  /** Queue bound: the members' queue lengths summed; entries over a smaller bound are evicted, latest first. */
  #rebound (): void {
    let bound = 0
    for (const m of this.#members.values()) bound += m.queueLength
    if (bound === this.#queue.maxLength) return
    const entries = this.#queue.drain()
    this.#queue = new DeadlineQueue<Entry>({ maxLength: bound, discipline: this.#discipline })
    for (const entry of entries) {
      const dropped = this.#queue.put(entry)
      if (dropped === undefined) continue
      this.#stats.evictions++
      this.#out.refuse(dropped.reactor, dropped.id, 'evicted')
    }
  }

  #recallAll (): void {
    for (const reactor of this.#members.keys()) this.#recallOne(reactor)
  }

  #recallOne (reactor: number): void {
    const member = this.#members.get(reactor)!
    if (member.recalled) return
    member.recalled = true
    this.#stats.recalls++
    this.#out.recall(reactor)
  }

  /**
   * The queue emptied: recalled members keep tokens again, and the free
   * tokens go back to the members that hold fewer than they contributed
   * (once per calm, so a closing reactor giving its tokens back is not lent
   * them again): after an overload, the uncontended path needs no message.
   */
  #calmAll (): void {
    let calmed = false
    for (const [reactor, member] of this.#members) {
      if (!member.recalled) continue
      member.recalled = false
      calmed = true
      this.#out.calm(reactor)
    }
    if (!calmed) return
    for (const [reactor, member] of this.#members) {
      const n = Math.min(this.#free, member.workers - member.held)
      if (n <= 0) continue
      this.#free -= n
      member.held += n
      this.#stats.lent += n
      this.#out.lend(reactor, n)
    }
  }

  #expireDue (): void {
    const earliest = this.#queue.earliestDeadline()
    if (earliest === Infinity) return
    const now = this.#clock.now()
    if (earliest > now) return
    for (const entry of this.#queue.takeExpired(now)) {
      this.#stats.expired++
      this.#out.refuse(entry.reactor, entry.id, 'expired')
    }
  }

  #armExpiry (): void {
    const earliest = this.#queue.earliestDeadline()
    if (earliest === Infinity) {
      this.#disarm()
      return
    }
    if (this.#expiryTimer !== undefined && this.#expiryAt <= earliest) return
    this.#disarm()
    this.#expiryAt = earliest
    this.#expiryTimer = this.#clock.setTimer(() => {
      this.#expiryTimer = undefined
      this.#expiryAt = Infinity
      this.#dispatch()
    }, Math.min(Math.max(0, earliest - this.#clock.now()), MAX_TIMER_MS))
  }

  #disarm (): void {
    if (this.#expiryTimer === undefined) return
    this.#clock.clearTimer(this.#expiryTimer)
    this.#expiryTimer = undefined
    this.#expiryAt = Infinity
  }

  /** Drops every timer (the primary is closing). */
  close (): void {
    this.#disarm()
  }
}
