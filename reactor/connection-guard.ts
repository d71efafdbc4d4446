import type { RpcError } from '../codec/errors.js'
import type { Clock, TimerHandle } from '../scheduling/clock.js'

/**
 * One limit or watch of the server over its connections, told at accept,
 * at each tick of the periodic scan, and at close. The server composes its
 * guards once, at construction (`ConnectionGuards`); adding a limit is
 * adding one guard. Nothing here runs per frame: what a frame must check
 * (a connection asked to close, or retired) is a field the call dispatch
 * reads directly. `C` is what the guard needs of a connection.
 */
export interface ConnectionGuard<C> {
  /** A connection was accepted (before its TLS or protocol set-up). */
  accepted?: (sc: C) => void
  /** The longest the scan may wait between two ticks for this guard (Infinity: it needs none); read when the scan is armed. */
  scanEveryMs?: () => number
  /** One scan tick, before the connections are looked at (`onTime`: the tick was not delayed by an event-loop stall). */
  tick?: (now: number, onTime: boolean) => void
  /** One connection at a scan tick; true: it was closed (the guards after this one skip it). */
  scan?: (sc: C, now: number, onTime: boolean) => boolean
  /** The connection closed. */
  closed?: (sc: C, error: RpcError | undefined) => void
}

/** The scan's period: a quarter of the shortest period a guard asks for, within 10 ms to 1 s. */
function periodOf (shortestMs: number): number {
  return Math.max(10, Math.min(1000, shortestMs / 4))
}

/**
 * The server's guards, composed once: each hook runs over the guards that
 * have it, in the order given, and the scan runs on one timer per server.
 */
export class ConnectionGuards<C> {
  readonly #clock: Clock
  readonly #connections: Iterable<C>
  readonly #guards: ReadonlyArray<ConnectionGuard<C>>
  readonly #accepted: Array<(sc: C) => void>
  readonly #ticks: Array<(now: number, onTime: boolean) => void>
  readonly #scans: Array<(sc: C, now: number, onTime: boolean) => boolean>
  readonly #closed: Array<(sc: C, error: RpcError | undefined) => void>
  #timer: TimerHandle | null = null

  constructor (clock: Clock, connections: Iterable<C>, guards: ReadonlyArray<ConnectionGuard<C>>) {
    this.#clock = clock
    this.#connections = connections
    this.#guards = guards
    this.#accepted = guards.flatMap(g => g.accepted === undefined ? [] : [g.accepted.bind(g)])
    this.#ticks = guards.flatMap(g => g.tick === undefined ? [] : [g.tick.bind(g)])
    this.#scans = guards.flatMap(g => g.scan === undefined ? [] : [g.scan.bind(g)])
    this.#closed = guards.flatMap(g => g.closed === undefined ? [] : [g.closed.bind(g)])
  }

  /** Tells the guards of a new connection. */
  accepted (sc: C): void {
    for (const accepted of this.#accepted) accepted(sc)
  }

  /** Tells the guards a connection closed. */
  closed (sc: C, error: RpcError | undefined): void {
    for (const closed of this.#closed) closed(sc, error)
  }

  /** Starts the scan (a no-op while it runs, or when no guard needs it); its period follows the shortest a guard asks for. */
  arm (): void {
    let shortest = Infinity
    for (const guard of this.#guards) if (guard.scanEveryMs !== undefined) shortest = Math.min(shortest, guard.scanEveryMs())
    if (shortest === Infinity || this.#timer !== null) return
    const periodMs = periodOf(shortest)
    const clock = this.#clock
    let lastScanAt = clock.now()
    const scan = (): void => {
      this.#timer = clock.setTimer(scan, periodMs)
      const now = clock.now()
      // A scan late by more than a period ran after an event-loop stall,
      // before the reads that waited meanwhile: it judges no frame's rate.
      const onTime = now - lastScanAt <= 2 * periodMs
      lastScanAt = now
      for (const tick of this.#ticks) tick(now, onTime)
      const scans = this.#scans
      for (const sc of this.#connections) {
        for (const one of scans) if (one(sc, now, onTime)) break
      }
    }
    this.#timer = clock.setTimer(scan, periodMs)
  }

  /** Stops the scan (the server is closing). */
  stop (): void {
    if (this.#timer !== null) this.#clock.clearTimer(this.#timer)
    this.#timer = null
  }
}
