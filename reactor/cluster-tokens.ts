/**
 * The reactor side of the scheduler shared by the reactors of a server
 * (docs/scheduling.md, 'Several reactors: one scheduler'): each service's
 * `TokenPool` here talks to its `TokenBroker` in the primary
 * (reactor/cluster-broker.ts) over the cluster IPC channel. The calls and
 * their bytes stay here; only (service, entry id, deadline) and token
 * counts cross. Messages of one microtask checkpoint go as one.
 */
import { performance } from 'node:perf_hooks'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import type { TokenLink } from '../scheduling/token-pool.js'

/** Operations from a reactor to the primary. Deadlines are on the shared time base (`performance.timeOrigin + now`); null: none. */
export type ToBroker =
  | ['join', string, number, number, QueueDiscipline]
  | ['want', string, number, number | null]
  | ['give', string, number]

/** Operations from the primary to a reactor. */
export type FromBroker =
  | ['grant', string, number]
  | ['refuse', string, number, 'full' | 'evicted' | 'expired']
  | ['recall', string]
  | ['calm', string]
  | ['lend', string, number]

/** The IPC message that carries a batch of either. */
export const SCHED_MESSAGE = 'nyala:sched'

/** What the link delivers the broker's answers to (a `TokenPool`). */
export interface TokenReceiver {
  grant: (id: number) => void
  refuse: (id: number, reason: 'full' | 'evicted' | 'expired') => void
  recall: () => void
  calm: () => void
  lend: (n: number) => void
  lost: () => void
}

/** This reactor's link to the shared scheduler: one per process, set up before the server is built. */
export class SharedScheduling {
  readonly #send: (ops: ToBroker[]) => void
  readonly #pools = new Map<string, TokenReceiver>()
  #ops: ToBroker[] = []
  #flushScheduled = false
  readonly #flush = (): void => {
    this.#flushScheduled = false
    const ops = this.#ops
    this.#ops = []
    if (ops.length > 0) this.#send(ops)
  }

  readonly #base = performance.timeOrigin

  constructor (send: (ops: ToBroker[]) => void) {
    this.#send = send
  }

  /**
   * How service `name`'s pool joins the shared scheduler with its `workers`
   * and `queueLength`; undefined when a pool of that name joined already
   * (a second server in this process keeps a pool of its own).
   */
  connect (name: string, workers: number, queueLength: number, discipline: QueueDiscipline): ((pool: TokenReceiver) => TokenLink) | undefined {
    if (this.#pools.has(name)) return undefined
    return (pool) => {
      this.#pools.set(name, pool)
      this.#push(['join', name, workers, queueLength, discipline])
      return {
        want: (id, deadline) => this.#push(['want', name, id, deadline === Infinity ? null : this.#base + deadline]),
        give: (n) => this.#push(['give', name, n])
      }
    }
  }

  /** A batch from the primary. */
  receive (ops: unknown): void {
    if (!Array.isArray(ops)) return
    for (const op of ops as FromBroker[]) {
      if (!Array.isArray(op)) continue
      const pool = this.#pools.get(op[1])
      if (pool === undefined) continue
      switch (op[0]) {
        case 'grant': pool.grant(op[2]); break
        case 'refuse': pool.refuse(op[2], op[3]); break
        case 'recall': pool.recall(); break
        case 'calm': pool.calm(); break
        case 'lend': pool.lend(op[2]); break
      }
    }
  }

  /** The primary is gone: calls waiting for it are answered, and nothing more is asked. */
  lost (): void {
    for (const pool of this.#pools.values()) pool.lost()
  }

  #push (op: ToBroker): void {
    this.#ops.push(op)
    if (this.#flushScheduled) return
    this.#flushScheduled = true
    queueMicrotask(this.#flush)
  }
}

let shared: SharedScheduling | null = null

/** This process's link to the shared scheduler; null outside a reactor that shares one. */
export function sharedScheduling (): SharedScheduling | null {
  return shared
}

/** Sets up this reactor's link (reactor/cluster-reactor.ts does, before `build()`). */
export function installSharedScheduling (send: (ops: ToBroker[]) => void): SharedScheduling {
  shared = new SharedScheduling(send)
  return shared
}
