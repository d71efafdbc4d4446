import Denque from 'denque'

/**
 * One `pushes()` iterator: a bounded queue of pushes not read yet, and the
 * reads waiting for one. Owned by its client, which offers each push and
 * ends it on `close()`. Bounded by count and by bytes (each push counted
 * as its frame's size): past either, the oldest held pushes are dropped
 * (the newest is always kept).
 */
export class PushIterator implements AsyncIterableIterator<unknown> {
  readonly #held = new Denque<unknown>()
  /** The size of each held push, in the same order. */
  readonly #sizes = new Denque<number>()
  readonly #reads = new Denque<(result: IteratorResult<unknown>) => void>()
  readonly #maxBuffered: number
  readonly #maxBufferedBytes: number
  readonly #counts: { dropped: number }
  readonly #owners: Set<PushIterator>
  #heldBytes = 0
  #done = false

  constructor (maxBuffered: number, maxBufferedBytes: number, counts: { dropped: number }, owners: Set<PushIterator>) {
    this.#maxBuffered = maxBuffered
    this.#maxBufferedBytes = maxBufferedBytes
    this.#counts = counts
    this.#owners = owners
  }

  /** The bytes of the pushes held now. */
  get heldBytes (): number {
    return this.#heldBytes
  }

  offer (push: unknown, bytes: number): void {
    if (this.#done) return
    const read = this.#reads.shift()
    if (read !== undefined) return read({ value: push, done: false })
    while (this.#held.length > 0 && (this.#held.length >= this.#maxBuffered || this.#heldBytes + bytes > this.#maxBufferedBytes)) {
      this.#take()
      this.#counts.dropped++
    }
    this.#held.push(push)
    this.#sizes.push(bytes)
    this.#heldBytes += bytes
  }

  next (): Promise<IteratorResult<unknown>> {
    if (this.#held.length > 0) return Promise.resolve({ value: this.#take(), done: false })
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
    if (discard) {
      this.#held.clear()
      this.#sizes.clear()
      this.#heldBytes = 0
    }
    for (let read = this.#reads.shift(); read !== undefined; read = this.#reads.shift()) read({ value: undefined, done: true })
  }

  // The oldest held push, out of the queue and its bytes.
  #take (): unknown {
    this.#heldBytes -= this.#sizes.shift()!
    return this.#held.shift()
  }

  [Symbol.asyncIterator] (): AsyncIterableIterator<unknown> {
    return this
  }
}
