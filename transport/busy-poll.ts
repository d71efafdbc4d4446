/**
 * Busy polling (opt-in): after its connections read or send, the event loop
 * keeps polling for `windowUs` microseconds instead of sleeping in
 * epoll_wait, by keeping a `setImmediate` pending (libuv then polls with a
 * zero timeout).
 *
 * Why: on a VM, waking a process that sleeps in epoll_wait is the most
 * expensive part of a small RPC. The peer's write must send an
 * inter-processor interrupt and the woken side starts cold; measured here,
 * it is 20-30 us of a synchronous round trip. A side that is still polling
 * when the next frame arrives needs no wake-up: synchronous calls/s rose
 * 20-29 % with a 100 us window on one side. The price is CPU: each window
 * spins one core for up to `windowUs` after the last activity (Linux's
 * SO_BUSY_POLL trades the same way). Off by default.
 *
 * One poller serves every connection of a server or client: touching it
 * costs a boolean store; the clock is read once per spin, not per frame.
 */
import { performance } from 'node:perf_hooks'

export class BusyPoller {
  readonly #windowMs: number
  readonly #now: () => number
  #touched = false
  #lastActivity = 0
  #spinning = false
  #stopped = false
  #spins = 0
  readonly #spin = (): void => {
    if (this.#stopped) {
      this.#spinning = false
      return
    }
    const now = this.#now()
    if (this.#touched) {
      this.#touched = false
      this.#lastActivity = now
    }
    if (now - this.#lastActivity < this.#windowMs) {
      this.#spins++
      setImmediate(this.#spin)
    } else {
      this.#spinning = false
    }
  }

  constructor (windowUs: number, now: () => number = () => performance.now()) {
    if (!Number.isFinite(windowUs) || windowUs <= 0) throw new RangeError(`busy-poll window must be a positive number of microseconds, got ${windowUs}`)
    this.#windowMs = windowUs / 1000
    this.#now = now
  }

  /** Activity (a read or a send): keep polling for the window from now. */
  touch (): void {
    if (this.#spinning) {
      this.#touched = true
      return
    }
    if (this.#stopped) return
    this.#spinning = true
    this.#touched = false
    this.#lastActivity = this.#now()
    setImmediate(this.#spin)
  }

  /** True while the loop is kept polling. */
  get spinning (): boolean {
    return this.#spinning
  }

  /** Loop turns spent polling so far. */
  get spins (): number {
    return this.#spins
  }

  /** Stops for good (the owner closed): a pending spin ends without re-arming. */
  stop (): void {
    this.#stopped = true
  }
}
