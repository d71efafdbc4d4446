/**
 * Time, as everything in nyala that waits sees it. Production code gets
 * `realClock`; tests pass a `FakeClock` and move time by hand, so no test
 * sleeps or asserts a duration.
 */
import { performance } from 'node:perf_hooks'

/** A source of time and timers: `realClock` in production, `FakeClock` in tests (the `clock` option of servers, clients and retry policies). */
export interface Clock {
  /** Monotonic milliseconds (fractional). */
  now: () => number
  /**
   * Runs `callback` once after `ms`. The timer does not keep the process
   * alive by itself unless `keepAlive` (work that waits on nothing else,
   * such as a call sleeping before its retry).
   */
  setTimer: (callback: () => void, ms: number, keepAlive?: boolean) => TimerHandle
  /** Cancels a timer that has not fired yet (a fired or cleared one: nothing happens). */
  clearTimer: (handle: TimerHandle) => void
  /**
   * Runs `callback` after the I/O that is ready now has been processed
   * (`setImmediate`): a timer that fires late after an event-loop stall uses
   * it to let an already-arrived response win before declaring a timeout.
   */
  defer: (callback: () => void) => void
  /**
   * For a clock whose time moves in steps the program can run between (a
   * fake clock): `listener` runs just before each step, so work that reads
   * the clock lazily (the client stamps its calls' deadlines at the end of
   * a microtask checkpoint) can read it before time moves on. Returns the
   * unsubscribe function. Real time needs none.
   */
  beforeStep?: (listener: () => void) => () => void
}

/** An opaque timer handle. */
export interface TimerHandle {
  /** Whatever identifies the timer to its clock; not for callers to read. */
  readonly id?: unknown
}

const MAX_TIMEOUT_MS = 2 ** 31 - 1

/** A timer longer than setTimeout allows, as a chain of maximal steps. */
class LongTimer implements TimerHandle {
  readonly id = 'long-timer'
  #timer: NodeJS.Timeout | null = null

  constructor (callback: () => void, ms: number, keepAlive: boolean) {
    const due = performance.now() + ms
    const step = (): void => {
      const left = due - performance.now()
      if (left > 0) {
        this.#timer = setTimeout(step, Math.min(left, MAX_TIMEOUT_MS))
        if (!keepAlive) this.#timer.unref()
        return
      }
      this.#timer = null
      callback()
    }
    this.#timer = setTimeout(step, MAX_TIMEOUT_MS)
    if (!keepAlive) this.#timer.unref()
  }

  clear (): void {
    if (this.#timer !== null) clearTimeout(this.#timer)
    this.#timer = null
  }
}

function longTimer (callback: () => void, ms: number, keepAlive: boolean): TimerHandle {
  return new LongTimer(callback, ms, keepAlive)
}

const hrtime = process.hrtime
/** What `process.hrtime()` reads, in ms, minus `performance.now()` at the same moment: the two clocks are one. */
const HRTIME_ORIGIN_MS = ((): number => {
  const ms = (t: [number, number]): number => t[0] * 1e3 + t[1] / 1e6
  // The pair of readings closest together (the first calls set themselves up): within a few µs.
  let best = Infinity
  let origin = 0
  for (let i = 0; i < 8; i++) {
    const before = ms(hrtime())
    const p = performance.now()
    const after = ms(hrtime())
    if (after - before < best) {
      best = after - before
      origin = (before + after) / 2 - p
    }
  }
  return origin
})()

/** The process's monotonic clock and timers. */
export const realClock: Clock = {
  // performance.now()'s time, read through process.hrtime: performance.now()
  // checks its receiver on every call (a validator behind a wrapper, about
  // 130 instructions a read once the caller's inlining budget is spent),
  // where hrtime is the same clock_gettime and a two-number array.
  now: () => {
    const t = hrtime()
    return t[0] * 1e3 + t[1] / 1e6 - HRTIME_ORIGIN_MS
  },
  setTimer (callback, ms, keepAlive) {
    // setTimeout cuts a delay over 2^31-1 ms to 1 ms: such a wait is made of
    // maximal steps.
    if (ms > MAX_TIMEOUT_MS) return longTimer(callback, ms, keepAlive === true)
    const timer = setTimeout(callback, Math.max(0, ms))
    if (keepAlive !== true) timer.unref()
    return timer as unknown as TimerHandle
  },
  clearTimer (handle) {
    if (handle instanceof LongTimer) handle.clear()
    else clearTimeout(handle as unknown as NodeJS.Timeout)
  },
  defer (callback) {
    setImmediate(callback)
  }
}

interface FakeTimer extends TimerHandle {
  at: number
  seq: number
  callback: () => void
  cancelled: boolean
}

/**
 * A clock that moves only when told. `advance(ms)` fires due timers in
 * order of due time (then creation), each seeing `now()` at its due time, and
 * runs deferred callbacks after each timer, as the event loop would.
 */
export class FakeClock implements Clock {
  #now: number
  #seq = 0
  #timers: FakeTimer[] = []
  #deferred: Array<() => void> = []
  readonly #stepListeners = new Set<() => void>()

  constructor (startMs = 1000) {
    this.#now = startMs
  }

  now (): number {
    return this.#now
  }

  setTimer (callback: () => void, ms: number): TimerHandle {
    const timer: FakeTimer = { at: this.#now + Math.max(0, ms), seq: this.#seq++, callback, cancelled: false }
    this.#timers.push(timer)
    return timer
  }

  /** Cancels a timer not yet fired: it will not fire, and no longer counts in `pendingTimers`. */
  clearTimer (handle: TimerHandle): void {
    const timer = handle as FakeTimer
    timer.cancelled = true
    this.#timers = this.#timers.filter(t => t !== timer)
  }

  defer (callback: () => void): void {
    this.#deferred.push(callback)
  }

  /** Timers not yet fired or cleared. */
  get pendingTimers (): number {
    return this.#timers.length
  }

  /** Runs deferred callbacks (those queued by `defer`), including ones they queue. */
  runDeferred (): void {
    while (this.#deferred.length > 0) {
      const batch = this.#deferred
      this.#deferred = []
      for (const callback of batch) callback()
    }
  }

  beforeStep (listener: () => void): () => void {
    this.#stepListeners.add(listener)
    return () => { this.#stepListeners.delete(listener) }
  }

  /** Moves time forward by `ms`, firing every timer due by then. */
  advance (ms: number): void {
    const target = this.#now + ms
    for (;;) {
      let next: FakeTimer | undefined
      for (const t of this.#timers) {
        if (t.at <= target && (next === undefined || t.at < next.at || (t.at === next.at && t.seq < next.seq))) next = t
      }
      if (next === undefined) break
      this.#timers = this.#timers.filter(t => t !== next)
      this.#step(Math.max(this.#now, next.at))
      next.callback()
      this.runDeferred()
    }
    this.#step(target)
    this.runDeferred()
  }

  // Time moves to `to`: what ran so far read the clock before it did.
  #step (to: number): void {
    if (to === this.#now) return
    for (const listener of this.#stepListeners) listener()
    this.#now = to
  }
}
