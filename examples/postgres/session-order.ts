import type { ConnectionHandle } from '../../reactor/index.js'

/**
 * Workaround, until the framework runs one connection's requests one at a
 * time in arrival order (execution order per connection).
 * `'in-order'` orders answers only, and the example runs its handlers with
 * `scheduler: 'direct'`, so a pipelined `SELECT pg_sleep(1)` then `INSERT`
 * would run the INSERT first. Each session chains its messages here: a
 * message runs at once (synchronously, the common case) when nothing of its
 * session is pending, else after the one before it settled.
 *
 * The chain is a queue: past `maxQueued` messages waiting, the session stops
 * reading its connection until it has caught up (the bytes then wait in the
 * kernel, bounded by TCP's window).
 *
 * Replaced by: the protocol's (or route group's) per-connection sequential
 * execution; then this file goes, and handlers call the session directly.
 */
export class SessionOrder {
  #tail: Promise<unknown> | null = null
  #queued = 0
  #paused = false
  readonly #maxQueued: number
  readonly #connection: ConnectionHandle | null

  constructor (connection: ConnectionHandle | null, maxQueued = 1024) {
    this.#connection = connection
    this.#maxQueued = maxQueued
  }

  /** Runs `step` after the session's earlier messages; its result (or promise of it). */
  run<T> (step: () => T | Promise<T>): T | Promise<T> {
    if (this.#tail === null) {
      const result = step()
      if (result instanceof Promise) this.#track(result)
      return result
    }
    this.#queued++
    if (this.#queued > this.#maxQueued && !this.#paused && this.#connection !== null) {
      this.#paused = true
      this.#connection.pauseReading()
    }
    const next = this.#tail.then(() => {
      this.#queued--
      if (this.#paused && this.#queued <= this.#maxQueued / 2) {
        this.#paused = false
        this.#connection?.resumeReading()
      }
      return step()
    })
    this.#track(next)
    return next
  }

  #track (promise: Promise<unknown>): void {
    const settled = promise.then(() => undefined, () => undefined)
    this.#tail = settled
    void settled.then(() => { if (this.#tail === settled) this.#tail = null })
  }
}
