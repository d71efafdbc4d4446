/**
 * Deadlines for many short-lived items (a client's calls), without a timer
 * and a closure per item: items with the same (whole-millisecond) timeout
 * share one list and one timer, and their deadlines are in arrival order,
 * since the clock is monotonic. Other timeouts (a retry's remaining time)
 * get a timer of their own.
 *
 * An item in a list is stamped with its deadline at the end of the
 * microtask checkpoint it was armed in (for a client, when its request is
 * written out): one clock reading for every item of the checkpoint (a
 * reading costs about as much as encoding a request). The deadline may so
 * be later than the caller's clock by the rest of that checkpoint, never
 * earlier (docs/scheduling.md).
 *
 * The list holds stamps, one per checkpoint, and each stamp its items:
 * per item, a push onto the young stamp's array and a count. (A list of
 * calls took an old-generation queue's write barrier and a shift per call,
 * ~3 % of a pipelining client's CPU in perf.)
 */
import Denque from 'denque'
import type { Clock, TimerHandle } from './clock.js'

/** What the lists expire: an item that carries its stamp and, if it has one, its own timer. */
export interface Expiring<T> {
  /**
   * Its deadline, shared with the items armed in the same checkpoint,
   * which also hold it in a deadline list; NaN until that checkpoint
   * ends. `NO_DEADLINE` until armed.
   */
  stamp: Stamp<T>
  /** Its own timer, when its timeout shares no list; null otherwise and once it fired. */
  timer: TimerHandle | null
}

// Distinct timeouts with a shared list each; beyond, items get their own timer.
const MAX_DEADLINE_LISTS = 32

/**
 * The deadline of the items one checkpoint put in a deadline list (NaN
 * until it ends), or of one item with a timer of its own.
 */
export class Stamp<T> {
  deadline: number
  /** The list it is in; null for an item's own stamp, and once it has left the list. */
  list: DeadlineList<T> | null
  /** Its items in the order armed, finished ones included until the stamp leaves (or the list compacts). */
  items: T[] = []
  /** Its items not finished yet. */
  live = 0

  constructor (deadline: number, list: DeadlineList<T> | null) {
    this.deadline = deadline
    this.list = list
  }
}

/** The stamp of items without a deadline. */
export const NO_DEADLINE: Stamp<never> = new Stamp<never>(Number.POSITIVE_INFINITY, null)
const RESOLVED = Promise.resolve()

/** The pending items of one timeout value, by stamp in deadline order, and their one timer. */
class DeadlineList<T> {
  readonly timeoutMs: number
  readonly stamps = new Denque<Stamp<T>>()
  /** Items not finished in those stamps. */
  liveItems = 0
  /** Items the stamps in `stamps` hold, finished or not. */
  heldItems = 0
  timer: TimerHandle | null = null
  /** The stamp of the items this checkpoint added, until it ends (the list is then in `DeadlineLists`' list of such lists). */
  open: Stamp<T> | null = null

  constructor (timeoutMs: number) {
    this.timeoutMs = timeoutMs
  }
}

/**
 * The deadline lists of one owner (a client), by timeout. `arm` gives an
 * item its deadline, `leave` takes a finished item out; `onExpired` is
 * called for each item still unfinished (`isDone` false) when its deadline
 * passes.
 */
export class DeadlineLists<T extends Expiring<T>> {
  readonly #clock: Clock
  readonly #onExpired: (item: T, timeoutMs: number) => void
  readonly #isDone: (item: T) => boolean
  readonly #lists = new Map<number, DeadlineList<T>>()
  #lastList: DeadlineList<T> | null = null
  // Deadline lists with items waiting for their deadline (see arm).
  readonly #unstamped: Array<DeadlineList<T>> = []
  readonly #stampMicrotask = (): void => { this.#stamp() }
  readonly #unsubscribeClock: (() => void) | null

  constructor (clock: Clock, onExpired: (item: T, timeoutMs: number) => void, isDone: (item: T) => boolean) {
    this.#clock = clock
    this.#onExpired = onExpired
    this.#isDone = isDone
    this.#unsubscribeClock = clock.beforeStep?.(this.#stampMicrotask) ?? null
  }

  /** Gives `item` a deadline `timeoutMs` from the end of this microtask checkpoint. */
  arm (item: T, timeoutMs: number): void {
    // Items mostly share one timeout: the last list found is tried first.
    let list = this.#lastList !== null && this.#lastList.timeoutMs === timeoutMs ? this.#lastList : this.#lists.get(timeoutMs)
    if (list === undefined) {
      if (!Number.isInteger(timeoutMs) || this.#lists.size >= MAX_DEADLINE_LISTS) {
        item.stamp = new Stamp<T>(this.#clock.now() + timeoutMs, null)
        item.timer = this.#clock.setTimer(() => {
          item.timer = null
          if (!this.#isDone(item)) this.#onExpired(item, timeoutMs)
        }, timeoutMs)
        return
      }
      list = new DeadlineList<T>(timeoutMs)
      this.#lists.set(timeoutMs, list)
    }
    this.#lastList = list
    let stamp = list.open
    if (stamp === null) {
      stamp = list.open = new Stamp<T>(Number.NaN, list)
      list.stamps.push(stamp)
      this.#unstamped.push(list)
      // A resolved promise's then: unlike queueMicrotask, no AsyncResource.
      if (this.#unstamped.length === 1) void RESOLVED.then(this.#stampMicrotask)
    }
    stamp.live++
    stamp.items.push(item)
    list.liveItems++
    // Finished items wait in their stamps until the stamps leave the list: a
    // stuck item would otherwise keep every item armed after it.
    if (++list.heldItems > 64 && list.heldItems > 4 * list.liveItems) this.#compact(list)
    item.stamp = stamp
    if (list.timer === null) list.timer = this.#clock.setTimer(() => this.#onDeadlines(list), timeoutMs)
  }

  /**
   * A finished item leaves: its own timer is cleared, or it leaves its
   * stamp. Stamps whose items have all finished leave the front of the
   * list at once, the rest when they reach it.
   *
   * An emptied list keeps its timer: one call after another (sync callers)
   * would otherwise set and clear a timer per call (1.3 us each here). It
   * fires at most once per timeout, finds nothing due, and re-arms only for
   * items still waiting.
   */
  leave (item: T): void {
    if (item.timer !== null) {
      this.#clock.clearTimer(item.timer)
      item.timer = null
    }
    const stamp = item.stamp
    const list = stamp.list
    if (list === null) return
    list.liveItems--
    if (--stamp.live > 0) return
    const stamps = list.stamps
    for (let front = stamps.peekFront(); front !== undefined && front.live === 0 && front !== list.open; front = stamps.peekFront()) {
      this.#dropStamp(list, stamps.shift()!)
    }
  }

  /**
   * Clears the lists' timers and stops following the clock's steps. Every
   * item must have finished (or no longer matter): none expires after.
   */
  close (): void {
    this.#unsubscribeClock?.()
    for (const list of this.#lists.values()) {
      if (list.timer !== null) this.#clock.clearTimer(list.timer)
      list.timer = null
    }
  }

  // Gives the items armed since the last stamp their deadlines: one stamp per list.
  #stamp (): void {
    const lists = this.#unstamped
    if (lists.length === 0) return
    const now = this.#clock.now()
    for (let i = 0; i < lists.length; i++) {
      const list = lists[i]!
      list.open!.deadline = now + list.timeoutMs
      list.open = null
    }
    lists.length = 0
  }

  #onDeadlines (list: DeadlineList<T>): void {
    list.timer = null
    // A fake clock fires timers from inside a checkpoint.
    this.#stamp()
    const now = this.#clock.now()
    const stamps = list.stamps
    for (let front = stamps.peekFront(); front !== undefined; front = stamps.peekFront()) {
      if (front.live > 0 && front.deadline > now) break
      this.#dropStamp(list, stamps.shift()!)
      if (front.live === 0) continue
      list.liveItems -= front.live
      for (const item of front.items) {
        if (!this.#isDone(item)) this.#onExpired(item, list.timeoutMs)
      }
    }
    const next = stamps.peekFront()
    if (next !== undefined) list.timer = this.#clock.setTimer(() => this.#onDeadlines(list), next.deadline - now)
  }

  // A stamp leaves its list: its items, finished or timed out, no longer count there.
  #dropStamp (list: DeadlineList<T>, stamp: Stamp<T>): void {
    stamp.list = null
    list.heldItems -= stamp.items.length
  }

  // Keeps only the stamps with items waiting, and in them only those items.
  #compact (list: DeadlineList<T>): void {
    const kept = list.stamps.toArray()
    list.stamps.clear()
    list.heldItems = 0
    for (const stamp of kept) {
      if (stamp.live === 0 && stamp !== list.open) {
        stamp.list = null
        continue
      }
      stamp.items = stamp.items.filter((c) => !this.#isDone(c))
      list.heldItems += stamp.items.length
      list.stamps.push(stamp)
    }
  }
}
