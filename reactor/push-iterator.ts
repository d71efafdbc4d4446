import Denque from 'denque'

/**
 * One `pushes()` iterator: a bounded queue of pushes not read yet, and the
 * reads waiting for one. Owned by its client, which offers each push and
 * ends it on `close()`.
 */
export class PushIterator implements AsyncIterableIterator<unknown> {
  readonly #held = new Denque<unknown>()
  readonly #reads = new Denque<(result: IteratorResult<unknown>) => void>()
  readonly #maxBuffered: number
  readonly #counts: { dropped: number }
  readonly #owners: Set<PushIterator>
  #done = false

  constructor (maxBuffered: number, counts: { dropped: number }, owners: Set<PushIterator>) {
    this.#maxBuffered = maxBuffered
    this.#counts = counts
    this.#owners = owners
  }

  offer (push: unknown): void {
    if (this.#done) return
    const read = this.#reads.shift()
    if (read !== undefined) return read({ value: push, done: false })
    if (this.#held.length >= this.#maxBuffered) {
      this.#held.shift()
      this.#counts.dropped++
    }
    this.#held.push(push)
  }

  next (): Promise<IteratorResult<unknown>> {
    if (this.#held.length > 0) return Promise.resolve({ value: this.#held.shift(), done: false })
    if (this.#done) return Promise.resolve({ value: undefined, done: true })
    return new Promise((resolve) => { this.#reads.push(resolve) })
  }

  return (): Promise<IteratorResult<unknown>> {
    this.end(true)
    return Promise.resolve({ value: undefined, done: true })
  }

  /** No more pushes: waiting reads get done; `discard` drops the held pushes too (else they are read first). */
  end (discard: boolean): void {
    this.#done = true
    this.#owners.delete(this)
    if (discard) this.#held.clear()
    for (let read = this.#reads.shift(); read !== undefined; read = this.#reads.shift()) read({ value: undefined, done: true })
  }

  [Symbol.asyncIterator] (): AsyncIterableIterator<unknown> {
    return this
  }
}
