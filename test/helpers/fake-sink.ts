import type { WritableSink } from '../../transport/transfer-queue.js'

/** One buffer the sink received (a `write`, or one slice of a `writev`). */
export interface SinkWrite {
  chunk: Buffer
  /** The slices of one `writev` share a group (as writes between a cork and its uncork do): one writev on a real socket. */
  group: number
  hasCallback: boolean
}

/**
 * A WritableSink double: records every write, and lets the test decide what
 * `write` returns (false = kernel buffer full, wait for 'drain'), what
 * `writableLength` reports, and when write callbacks fire.
 */
export class FakeSink implements WritableSink {
  readonly writes: SinkWrite[] = []
  /** What the next `write` calls return. */
  writeReturns = true
  /** What `writableLength` reports. */
  writableLength = 0
  /** Called inside every `write`, before it returns. */
  onWrite: ((chunk: Buffer) => void) | null = null
  #corked = 0
  #group = 0
  #pending: Array<(error?: Error | null) => void> = []

  write (chunk: Buffer, callback?: (error?: Error | null) => void): boolean {
    if (this.#corked === 0) this.#group++
    this.writes.push({ chunk, group: this.#group, hasCallback: callback !== undefined })
    if (callback !== undefined) this.#pending.push(callback)
    this.onWrite?.(chunk)
    return this.writeReturns
  }

  writev (slices: readonly Buffer[], callback?: (error: Error | null | undefined) => void): boolean {
    this.#group++
    const last = slices.length - 1
    for (let i = 0; i <= last; i++) {
      const withCallback = i === last && callback !== undefined
      this.writes.push({ chunk: slices[i]!, group: this.#group, hasCallback: withCallback })
      if (withCallback) this.#pending.push(callback)
      this.onWrite?.(slices[i]!)
    }
    return this.writeReturns
  }

  cork (): void {
    if (this.#corked++ === 0) this.#group++
  }

  uncork (): void {
    if (this.#corked === 0) throw new Error('uncork without cork')
    this.#corked--
  }

  get corked (): boolean {
    return this.#corked > 0
  }

  /** Write callbacks not fired yet. */
  get pendingCallbacks (): number {
    return this.#pending.length
  }

  /** Fires every pending write callback, as the kernel taking the bytes would (or with `error`). */
  completeWrites (error?: Error): void {
    const pending = this.#pending
    this.#pending = []
    for (const callback of pending) callback(error ?? null)
  }

  /** Every byte written, in order. */
  bytes (): Buffer {
    return Buffer.concat(this.writes.map(w => w.chunk))
  }

  /** Bytes of each write group (one entry per write, or per corked writev). */
  groups (): Buffer[] {
    const out = new Map<number, Buffer[]>()
    for (const w of this.writes) {
      const list = out.get(w.group) ?? []
      list.push(w.chunk)
      out.set(w.group, list)
    }
    return [...out.values()].map(list => Buffer.concat(list))
  }
}

/** Resolves after every `process.nextTick` callback queued before it (the queue's end-of-turn flush). */
export function nextTick (): Promise<void> {
  return new Promise(resolve => process.nextTick(resolve))
}
