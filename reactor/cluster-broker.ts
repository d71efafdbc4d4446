/**
 * The primary's side of the scheduler shared by the reactors of a server
 * (docs/scheduling.md, 'Several reactors: one scheduler'): one `TokenBroker`
 * per service name, fed by the reactors' operations (reactor/cluster-tokens.ts)
 * and answering each reactor in one message per microtask checkpoint. A
 * reactor that exits leaves every broker: its tokens and queued entries
 * are reclaimed, and the other reactors' entries are granted or refused as usual.
 */
import { performance } from 'node:perf_hooks'
import { realClock, type Clock } from '../scheduling/clock.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { TokenBroker, type TokenBrokerStats } from '../scheduling/token-broker.js'
import { SCHED_MESSAGE, type FromBroker, type ToBroker } from './cluster-tokens.js'

/** Where the primary sends a reactor's batch; false when the reactor cannot be reached. */
export type BrokerSend = (reactor: number, message: { type: typeof SCHED_MESSAGE, ops: FromBroker[] }) => void

/** The shared time base: the same in every process of the machine, to the clock's precision. */
const sharedClock: Clock = {
  now: () => performance.timeOrigin + performance.now(),
  setTimer: realClock.setTimer,
  clearTimer: realClock.clearTimer,
  defer: realClock.defer
}

export class ClusterBroker {
  readonly #send: BrokerSend
  readonly #clock: Clock
  readonly #brokers = new Map<string, TokenBroker>()
  readonly #out = new Map<number, FromBroker[]>()
  #flushScheduled = false
  readonly #flush = (): void => {
    this.#flushScheduled = false
    for (const [reactor, ops] of this.#out) this.#send(reactor, { type: SCHED_MESSAGE, ops })
    this.#out.clear()
  }

  constructor (send: BrokerSend, clock: Clock = sharedClock) {
    this.#send = send
    this.#clock = clock
  }

  /** A batch of operations from `reactor` (a cluster worker id). */
  receive (reactor: number, ops: unknown): void {
    if (!Array.isArray(ops)) return
    for (const op of ops as ToBroker[]) {
      if (!Array.isArray(op) || typeof op[1] !== 'string') continue
      switch (op[0]) {
        case 'join':
          this.#broker(op[1], op[4] === 'fifo' ? 'fifo' : 'edf').join(reactor, Number(op[2]), Number(op[3]))
          break
        case 'want':
          this.#brokers.get(op[1])?.want(reactor, Number(op[2]), op[3] === null ? Infinity : Number(op[3]))
          break
        case 'give':
          this.#brokers.get(op[1])?.give(reactor, Number(op[2]))
          break
      }
    }
  }

  /** `reactor` exited: every broker reclaims what it held. */
  leave (reactor: number): void {
    this.#out.delete(reactor)
    for (const broker of this.#brokers.values()) broker.leave(reactor)
  }

  /** Per service: workers, free tokens, queued entries and counters. */
  stats (): Record<string, TokenBrokerStats & { workers: number, free: number, queued: number }> {
    const out: Record<string, TokenBrokerStats & { workers: number, free: number, queued: number }> = {}
    for (const [name, broker] of this.#brokers) out[name] = { ...broker.stats, workers: broker.workers, free: broker.free, queued: broker.queueLength }
    return out
  }

  close (): void {
    for (const broker of this.#brokers.values()) broker.close()
  }

  #broker (name: string, discipline: QueueDiscipline): TokenBroker {
    let broker = this.#brokers.get(name)
    if (broker === undefined) {
      broker = new TokenBroker({
        discipline,
        clock: this.#clock,
        output: {
          grant: (reactor, id) => this.#push(reactor, ['grant', name, id]),
          refuse: (reactor, id, reason) => this.#push(reactor, ['refuse', name, id, reason]),
          recall: (reactor) => this.#push(reactor, ['recall', name]),
          calm: (reactor) => this.#push(reactor, ['calm', name]),
          lend: (reactor, n) => this.#push(reactor, ['lend', name, n])
        }
      })
      this.#brokers.set(name, broker)
    }
    return broker
  }

  #push (reactor: number, op: FromBroker): void {
    let ops = this.#out.get(reactor)
    if (ops === undefined) this.#out.set(reactor, ops = [])
    ops.push(op)
    if (this.#flushScheduled) return
    this.#flushScheduled = true
    queueMicrotask(this.#flush)
  }
}
