/**
 * The bounded service queue between the reactor and the workers, after
 * Kudu's `LifoServiceQueue` (docs/design.md, 'The service queue') in its queue half; the worker
 * half lives in `worker-pool.ts`.
 *
 * With the 'edf' discipline, calls leave in earliest-deadline-first order, so
 * a retry that kept its original deadline overtakes newer calls instead of
 * losing the race for a free slot forever (the Impala unfairness that made
 * Kudu adopt EDF). When the queue is full, the call with the latest deadline
 * is the one dropped: the newcomer if it is not strictly earlier, otherwise
 * the queued call that truly ranks last. Kudu's current code compares with a
 * heap leaf instead, which is not always the latest; a min-max heap finds the
 * true latest in O(1) and removes it in O(log n).
 */
import Denque from 'denque'

/** Something that can wait in the queue. */
export interface Queued {
  /**
   * Monotonic milliseconds by which the client stops waiting; `Infinity`
   * when it has no deadline. Read once, when the item is put (as Kudu caches
   * `deadline_`); NaN counts as no deadline.
   */
  readonly deadline: number
}

/** 'edf': earliest deadline first, evicting the latest when full. 'fifo': arrival order, refusing newcomers when full. */
export type QueueDiscipline = 'edf' | 'fifo'

export interface DeadlineQueueOptions {
  /** Items the queue holds at most; 0 refuses every put. */
  maxLength: number
  discipline: QueueDiscipline
}

interface Entry<T> {
  readonly item: T
  readonly deadline: number
  /** Arrival order: breaks deadline ties, so equal deadlines leave first-come first-served. */
  readonly seq: number
}

/** Whether `a` leaves before `b`: earlier deadline, then earlier arrival. Never true both ways. */
function precedes<T> (a: Entry<T>, b: Entry<T>): boolean {
  return a.deadline < b.deadline || (a.deadline === b.deadline && a.seq < b.seq)
}

/** How one discipline stores entries. */
interface Store<T> {
  readonly length: number
  add: (entry: Entry<T>) => void
  /** The queue is full: keeps `entry` or not, and returns the item that was not kept. */
  displace: (entry: Entry<T>) => T
  first: () => Entry<T> | undefined
  takeFirst: () => Entry<T> | undefined
  earliestDeadline: () => number
  takeExpired: (now: number) => T[]
}

/**
 * A double-ended priority queue. Even levels (the root's) are min levels:
 * each entry there precedes all its descendants; odd levels are max levels:
 * each entry there follows all its descendants. So the first entry is the
 * root and the last is one of the root's children.
 */
class MinMaxHeap<T> {
  readonly #a: Array<Entry<T>> = []

  get length (): number {
    return this.#a.length
  }

  min (): Entry<T> | undefined {
    return this.#a[0]
  }

  max (): Entry<T> | undefined {
    return this.#a[this.#maxIndex()]
  }

  push (entry: Entry<T>): void {
    this.#a.push(entry)
    this.#bubbleUp(this.#a.length - 1)
  }

  popMin (): Entry<T> | undefined {
    return this.#removeAt(0)
  }

  popMax (): Entry<T> | undefined {
    return this.#removeAt(this.#maxIndex())
  }

  #maxIndex (): number {
    const a = this.#a
    if (a.length <= 2) return a.length - 1
    return precedes(a[1]!, a[2]!) ? 2 : 1
  }

  #removeAt (i: number): Entry<T> | undefined {
    const a = this.#a
    const removed = a[i]
    if (removed === undefined) return undefined
    const last = a.pop()!
    if (i < a.length) {
      // Only the min (root) or the max (a root child) is ever removed; the
      // last entry is no more extreme than the one it replaces, so it only
      // needs to move down from the freed slot.
      a[i] = last
      this.#trickleDown(i)
    }
    return removed
  }

  /** On a min level `x` ranks "first" when it precedes `y`; on a max level when it follows. */
  #ranksFirst (minLevel: boolean, x: Entry<T>, y: Entry<T>): boolean {
    return minLevel ? precedes(x, y) : precedes(y, x)
  }

  #swap (i: number, j: number): void {
    const a = this.#a
    const tmp = a[i]!
    a[i] = a[j]!
    a[j] = tmp
  }

  #bubbleUp (i: number): void {
    if (i === 0) return
    const a = this.#a
    const parent = (i - 1) >> 1
    const minLevel = isMinLevel(i)
    if (this.#ranksFirst(!minLevel, a[i]!, a[parent]!)) {
      // It belongs on the parent's side (e.g. later than a max-level parent).
      this.#swap(i, parent)
      this.#bubbleUpAmong(parent, !minLevel)
    } else {
      this.#bubbleUpAmong(i, minLevel)
    }
  }

  /** Moves up through grandparents, which share the entry's level kind. */
  #bubbleUpAmong (i: number, minLevel: boolean): void {
    const a = this.#a
    while (i >= 3) {
      const grandparent = (((i - 1) >> 1) - 1) >> 1
      if (!this.#ranksFirst(minLevel, a[i]!, a[grandparent]!)) return
      this.#swap(i, grandparent)
      i = grandparent
    }
  }

  #trickleDown (i: number): void {
    const a = this.#a
    const minLevel = isMinLevel(i)
    for (;;) {
      const m = this.#firstDescendant(i, minLevel)
      if (m < 0 || !this.#ranksFirst(minLevel, a[m]!, a[i]!)) return
      this.#swap(i, m)
      if (m <= 2 * i + 2) return // a child: its own subtree was already ordered
      // A grandchild: the entry moved down may now rank wrongly against the
      // grandchild's parent, which is on the other level kind.
      const parent = (m - 1) >> 1
      if (this.#ranksFirst(!minLevel, a[m]!, a[parent]!)) this.#swap(m, parent)
      i = m
    }
  }

  /** Index of the child or grandchild that ranks first for `minLevel`; -1 if a leaf. */
  #firstDescendant (i: number, minLevel: boolean): number {
    const a = this.#a
    let best = -1
    const consider = (j: number): void => {
      if (j < a.length && (best < 0 || this.#ranksFirst(minLevel, a[j]!, a[best]!))) best = j
    }
    consider(2 * i + 1)
    consider(2 * i + 2)
    for (let j = 4 * i + 3; j <= 4 * i + 6; j++) consider(j)
    return best
  }
}

function isMinLevel (i: number): boolean {
  // Level of index i is floor(log2(i + 1)).
  return ((31 - Math.clz32(i + 1)) & 1) === 0
}

class EdfStore<T> implements Store<T> {
  readonly #heap = new MinMaxHeap<T>()

  get length (): number {
    return this.#heap.length
  }

  add (entry: Entry<T>): void {
    this.#heap.push(entry)
  }

  displace (entry: Entry<T>): T {
    const latest = this.#heap.max()
    // The newcomer arrived last, so on a deadline tie it ranks after every
    // queued entry and is the one refused.
    if (latest === undefined || !precedes(entry, latest)) return entry.item
    this.#heap.popMax()
    this.#heap.push(entry)
    return latest.item
  }

  first (): Entry<T> | undefined {
    return this.#heap.min()
  }

  takeFirst (): Entry<T> | undefined {
    return this.#heap.popMin()
  }

  earliestDeadline (): number {
    return this.#heap.min()?.deadline ?? Infinity
  }

  takeExpired (now: number): T[] {
    // Expired entries are exactly the front of EDF order.
    const out: T[] = []
    for (let first = this.#heap.min(); first !== undefined && first.deadline <= now; first = this.#heap.min()) {
      out.push(this.#heap.popMin()!.item)
    }
    return out
  }
}

class FifoStore<T> implements Store<T> {
  readonly #entries = new Denque<Entry<T>>()
  /**
   * The entries that may yet become the earliest deadline: arrival order,
   * non-decreasing deadlines (a sliding-window minimum), so the front is the
   * earliest deadline queued and each entry is added and dropped once.
   */
  #minima = new Denque<Entry<T>>()

  get length (): number {
    return this.#entries.length
  }

  add (entry: Entry<T>): void {
    this.#entries.push(entry)
    while (this.#minima.length > 0 && this.#minima.peekBack()!.deadline > entry.deadline) this.#minima.pop()
    this.#minima.push(entry)
  }

  displace (entry: Entry<T>): T {
    return entry.item
  }

  first (): Entry<T> | undefined {
    return this.#entries.peekFront()
  }

  takeFirst (): Entry<T> | undefined {
    const entry = this.#entries.shift()
    // The oldest entry, if still a candidate minimum, is the oldest candidate.
    if (entry !== undefined && this.#minima.peekFront() === entry) this.#minima.shift()
    return entry
  }

  earliestDeadline (): number {
    return this.#minima.peekFront()?.deadline ?? Infinity
  }

  takeExpired (now: number): T[] {
    if (this.earliestDeadline() > now) return []
    // Expired entries may sit anywhere in arrival order: one O(n) pass.
    const all = this.#entries.toArray()
    this.#entries.clear()
    this.#minima = new Denque<Entry<T>>()
    const out: T[] = []
    for (const entry of all) {
      if (entry.deadline <= now) out.push(entry.item)
      else this.add(entry)
    }
    return out
  }
}

/**
 * A bounded queue of items with deadlines. 'edf': `put`, `take`,
 * `takeExpired` (per item) and eviction are O(log n), `peek` and
 * `earliestDeadline` O(1). 'fifo': all O(1) (amortized) except
 * `takeExpired`, which is O(n) when something has expired.
 */
export class DeadlineQueue<T extends Queued> {
  readonly #maxLength: number
  readonly #discipline: QueueDiscipline
  readonly #store: Store<T>
  #seq = 0

  constructor ({ maxLength, discipline }: DeadlineQueueOptions) {
    if (!Number.isSafeInteger(maxLength) || maxLength < 0) {
      throw new RangeError(`maxLength must be a non-negative integer, got ${maxLength}`)
    }
    if (discipline !== 'edf' && discipline !== 'fifo') {
      throw new RangeError(`discipline must be 'edf' or 'fifo', got ${String(discipline)}`)
    }
    this.#maxLength = maxLength
    this.#discipline = discipline
    this.#store = discipline === 'edf' ? new EdfStore<T>() : new FifoStore<T>()
  }

  get length (): number {
    return this.#store.length
  }

  get maxLength (): number {
    return this.#maxLength
  }

  get discipline (): QueueDiscipline {
    return this.#discipline
  }

  /**
   * Queues `item`. Returns undefined when it fit; otherwise the item that
   * was not kept: `item` itself when refused, or (edf only) the queued item
   * with the latest deadline, evicted because `item` is strictly earlier.
   */
  put (item: T): T | undefined {
    const deadline = Number.isNaN(item.deadline) ? Infinity : item.deadline
    const entry: Entry<T> = { item, deadline, seq: this.#seq++ }
    if (this.#store.length < this.#maxLength) {
      this.#store.add(entry)
      return undefined
    }
    if (this.#maxLength === 0) return item
    return this.#store.displace(entry)
  }

  /** Removes and returns the next item (earliest deadline for edf, oldest for fifo). */
  take (): T | undefined {
    return this.#store.takeFirst()?.item
  }

  /** The item `take()` would return, left in place. */
  peek (): T | undefined {
    return this.#store.first()?.item
  }

  /** The earliest deadline queued; Infinity when empty or no item has a deadline. */
  earliestDeadline (): number {
    return this.#store.earliestDeadline()
  }

  /** Removes and returns every item whose deadline is <= `now`, in take order. */
  takeExpired (now: number): T[] {
    return this.#store.takeExpired(now)
  }

  /** Removes and returns every item, in take order. */
  drain (): T[] {
    const out: T[] = []
    for (let entry = this.#store.takeFirst(); entry !== undefined; entry = this.#store.takeFirst()) out.push(entry.item)
    return out
  }
}
