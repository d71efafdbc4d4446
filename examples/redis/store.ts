/**
 * The redis example's keyspace: one database of keys (latin1 strings, so
 * any bytes) holding strings (Buffers), lists (`Deque` of Buffers), sets
 * (`Set` of latin1 strings), hashes (`Map` of latin1 field to Buffer) and
 * sorted sets (`SortedSet`).
 *
 * Expiry is lazy, as in Redis: a key past its time is deleted when a
 * command touches it; and a periodic sweep (`sweep`, on an unref'd timer)
 * looks at a bounded number of the keys that have a time to live per tick,
 * so keys nobody asks for again go too.
 *
 * Memory: every key counts an estimate of its bytes against `maxMemoryBytes`,
 * and past it the least recently used keys are evicted (Redis's
 * allkeys-lru, exactly rather than sampled: the keys form a doubly-linked
 * list in access order). The estimate is not the process's heap; it counts
 * the bytes a key's data holds plus a fixed overhead for each JS object
 * around them:
 *
 * - a key: its length + KEY_OVERHEAD_BYTES (its entry object, the Map's
 *   slot, the key string's header);
 * - a string: its length + VALUE_OVERHEAD_BYTES (the Buffer);
 * - a list element: its length + LIST_ITEM_OVERHEAD_BYTES;
 * - a set member: its length + SET_MEMBER_OVERHEAD_BYTES;
 * - a hash field: field + value lengths + HASH_FIELD_OVERHEAD_BYTES;
 * - a sorted-set member: its length + ZSET_MEMBER_OVERHEAD_BYTES (the Map
 *   slot, and its node in the sorted array).
 *
 * Time is `now()` in milliseconds (default `Date.now`), given to the
 * constructor, so tests can move it by hand.
 */

export const KEY_OVERHEAD_BYTES = 96
export const VALUE_OVERHEAD_BYTES = 32
export const LIST_ITEM_OVERHEAD_BYTES = 40
export const SET_MEMBER_OVERHEAD_BYTES = 48
export const HASH_FIELD_OVERHEAD_BYTES = 80
export const ZSET_MEMBER_OVERHEAD_BYTES = 96
export const DEFAULT_MAX_MEMORY_BYTES = 64 * 1024 * 1024
/** Keys with a time to live looked at per sweep tick, and the ticks' period. */
export const SWEEP_KEYS = 200
export const DEFAULT_SWEEP_INTERVAL_MS = 100

export const KeyType = {
  STRING: 0,
  LIST: 1,
  SET: 2,
  HASH: 3,
  ZSET: 4
} as const
export type KeyType = typeof KeyType[keyof typeof KeyType]
export const TYPE_NAMES = ['string', 'list', 'set', 'hash', 'zset'] as const

/** A double-ended queue on a ring buffer: O(1) at both ends, indexable. */
export class Deque<T> {
  #items: (T | undefined)[] = new Array(8)
  #head = 0
  length = 0

  push (item: T): void {
    if (this.length === this.#items.length) this.#grow()
    this.#items[(this.#head + this.length) & (this.#items.length - 1)] = item
    this.length++
  }

  unshift (item: T): void {
    if (this.length === this.#items.length) this.#grow()
    this.#head = (this.#head - 1) & (this.#items.length - 1)
    this.#items[this.#head] = item
    this.length++
  }

  shift (): T | undefined {
    if (this.length === 0) return undefined
    const item = this.#items[this.#head]
    this.#items[this.#head] = undefined
    this.#head = (this.#head + 1) & (this.#items.length - 1)
    this.length--
    return item
  }

  pop (): T | undefined {
    if (this.length === 0) return undefined
    const at = (this.#head + this.length - 1) & (this.#items.length - 1)
    const item = this.#items[at]
    this.#items[at] = undefined
    this.length--
    return item
  }

  at (i: number): T {
    return this.#items[(this.#head + i) & (this.#items.length - 1)]!
  }

  #grow (): void {
    const grown: (T | undefined)[] = new Array(this.#items.length * 2)
    for (let i = 0; i < this.length; i++) grown[i] = this.at(i)
    this.#items = grown
    this.#head = 0
  }
}

/** A sorted set: scores by member, and the members sorted by (score, member). */
export class SortedSet {
  readonly scores = new Map<string, number>()
  /** Sorted by score, then member (bytes, as latin1 strings compare). */
  readonly order: { score: number, member: string }[] = []

  get size (): number {
    return this.scores.size
  }

  #index (score: number, member: string): number {
    const order = this.order
    let lo = 0
    let hi = order.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      const item = order[mid]!
      if (item.score < score || (item.score === score && item.member < member)) lo = mid + 1
      else hi = mid
    }
    return lo
  }

  /** Adds or moves a member; true when it is new. */
  set (member: string, score: number): boolean {
    const old = this.scores.get(member)
    if (old !== undefined) {
      if (old === score) return false
      this.order.splice(this.#index(old, member), 1)
    }
    this.scores.set(member, score)
    this.order.splice(this.#index(score, member), 0, { score, member })
    return old === undefined
  }

  delete (member: string): boolean {
    const old = this.scores.get(member)
    if (old === undefined) return false
    this.order.splice(this.#index(old, member), 1)
    this.scores.delete(member)
    return true
  }

  /** Takes the `count` members with the lowest scores. */
  popMin (count: number): { score: number, member: string }[] {
    const taken = this.order.splice(0, count)
    for (const item of taken) this.scores.delete(item.member)
    return taken
  }
}

export type Value = Buffer | Deque<Buffer> | Set<string> | Map<string, Buffer> | SortedSet

/** A key: its value, type, time to live, estimated bytes, and place in the LRU list. */
export class Entry {
  readonly key: string
  type: KeyType
  value: Value
  /** When it expires, in ms of the store's clock; 0: never. */
  expiresAt = 0
  /** Its estimated bytes, the key's overhead included. */
  bytes: number
  /** Toward the most recently used end, toward the least. */
  newer: Entry | null = null
  older: Entry | null = null

  constructor (key: string, type: KeyType, value: Value, bytes: number) {
    this.key = key
    this.type = type
    this.value = value
    this.bytes = bytes
  }
}

export interface StoreOptions {
  /** Default 64 MiB. */
  maxMemoryBytes?: number
  /** The clock, in ms; default `Date.now`. */
  now?: () => number
  /** The sweep's period in ms; 0: no timer (tests call `sweep()`). Default 100. */
  sweepIntervalMs?: number
}

export interface StoreStats {
  expiredKeys: number
  evictedKeys: number
  keyspaceHits: number
  keyspaceMisses: number
}

export class RedisStore {
  readonly maxMemoryBytes: number
  readonly stats: StoreStats = { expiredKeys: 0, evictedKeys: 0, keyspaceHits: 0, keyspaceMisses: 0 }
  readonly #keys = new Map<string, Entry>()
  /** The keys that have a time to live, for the sweep. */
  readonly #volatile = new Set<Entry>()
  #sweeper: IterableIterator<Entry> | null = null
  #newest: Entry | null = null
  #oldest: Entry | null = null
  #usedBytes = 0
  readonly #now: () => number
  #timer: NodeJS.Timeout | null = null

  constructor (options: StoreOptions = {}) {
    this.maxMemoryBytes = options.maxMemoryBytes ?? DEFAULT_MAX_MEMORY_BYTES
    this.#now = options.now ?? Date.now
    const period = options.sweepIntervalMs ?? DEFAULT_SWEEP_INTERVAL_MS
    if (period > 0) {
      this.#timer = setInterval(() => this.sweep(), period)
      this.#timer.unref()
    }
  }

  now (): number {
    return this.#now()
  }

  get size (): number {
    return this.#keys.size
  }

  get volatileCount (): number {
    return this.#volatile.size
  }

  get usedBytes (): number {
    return this.#usedBytes
  }

  /** Stops the sweep's timer. */
  close (): void {
    if (this.#timer !== null) clearInterval(this.#timer)
    this.#timer = null
  }

  /** The live key, touched as most recently used; undefined when absent or expired (then deleted). */
  get (key: string): Entry | undefined {
    const entry = this.#keys.get(key)
    if (entry === undefined) return undefined
    if (entry.expiresAt !== 0 && entry.expiresAt <= this.#now()) {
      this.stats.expiredKeys++
      this.#remove(entry)
      return undefined
    }
    this.#touch(entry)
    return entry
  }

  /** Counts a read's hit or miss (GET and friends), as Redis's keyspace_hits and keyspace_misses. */
  counted (entry: Entry | undefined): Entry | undefined {
    if (entry === undefined) this.stats.keyspaceMisses++
    else this.stats.keyspaceHits++
    return entry
  }

  /** A new key (replacing any old one), without a time to live; `bytes` is its value's estimate. */
  create (key: string, type: KeyType, value: Value, bytes: number): Entry {
    const old = this.#keys.get(key)
    if (old !== undefined) this.#remove(old)
    const entry = new Entry(key, type, value, KEY_OVERHEAD_BYTES + key.length + bytes)
    this.#keys.set(key, entry)
    this.#usedBytes += entry.bytes
    this.#link(entry)
    return entry
  }

  /** A string key's new value, keeping its time to live. */
  replaceString (entry: Entry, value: Buffer): void {
    entry.type = KeyType.STRING
    this.resize(entry, value.length + VALUE_OVERHEAD_BYTES - this.#valueBytes(entry))
    entry.value = value
  }

  // A key's value estimate, as `create` was told it (its bytes less the key's own).
  #valueBytes (entry: Entry): number {
    return entry.bytes - KEY_OVERHEAD_BYTES - entry.key.length
  }

  /** A key's value grew or shrank by `delta` estimated bytes. */
  resize (entry: Entry, delta: number): void {
    entry.bytes += delta
    this.#usedBytes += delta
  }

  delete (key: string): boolean {
    const entry = this.get(key)
    if (entry === undefined) return false
    this.#remove(entry)
    return true
  }

  /** Deletes a key known to be live (a list, set or hash left empty). */
  remove (entry: Entry): void {
    if (this.#keys.get(entry.key) === entry) this.#remove(entry)
  }

  /** Sets (`at` > 0, store ms) or clears (0) a key's time to live. */
  expire (entry: Entry, at: number): void {
    entry.expiresAt = at
    if (at === 0) this.#volatile.delete(entry)
    else this.#volatile.add(entry)
  }

  flush (): void {
    this.#keys.clear()
    this.#volatile.clear()
    this.#sweeper = null
    this.#newest = this.#oldest = null
    this.#usedBytes = 0
  }

  /** The live keys (expired ones are deleted on the way). */
  keys (): string[] {
    const now = this.#now()
    const out: string[] = []
    for (const entry of this.#keys.values()) {
      if (entry.expiresAt !== 0 && entry.expiresAt <= now) continue
      out.push(entry.key)
    }
    return out
  }

  /**
   * Evicts least recently used keys while the estimate is over the limit;
   * `keep` (the key just written) goes last, only if it alone is over.
   */
  evict (keep: Entry | null = null): void {
    while (this.#usedBytes > this.maxMemoryBytes && this.#oldest !== null) {
      let victim: Entry | null = this.#oldest
      if (victim === keep) victim = victim.newer
      if (victim === null) victim = keep!
      this.stats.evictedKeys++
      this.#remove(victim)
    }
  }

  /** One sweep tick: up to `max` keys with a time to live are looked at, and the expired deleted. */
  sweep (max = SWEEP_KEYS): number {
    const now = this.#now()
    let deleted = 0
    for (let i = 0; i < max && this.#volatile.size > 0; i++) {
      this.#sweeper ??= this.#volatile.values()
      const next = this.#sweeper.next()
      if (next.done === true) {
        this.#sweeper = null
        continue
      }
      const entry = next.value
      if (entry.expiresAt !== 0 && entry.expiresAt <= now) {
        this.stats.expiredKeys++
        this.#remove(entry)
        deleted++
      }
    }
    return deleted
  }

  #remove (entry: Entry): void {
    this.#keys.delete(entry.key)
    if (entry.expiresAt !== 0) this.#volatile.delete(entry)
    this.#usedBytes -= entry.bytes
    this.#unlink(entry)
  }

  #link (entry: Entry): void {
    entry.older = this.#newest
    entry.newer = null
    if (this.#newest !== null) this.#newest.newer = entry
    this.#newest = entry
    if (this.#oldest === null) this.#oldest = entry
  }

  #unlink (entry: Entry): void {
    if (entry.newer !== null) entry.newer.older = entry.older
    else this.#newest = entry.older
    if (entry.older !== null) entry.older.newer = entry.newer
    else this.#oldest = entry.newer
    entry.newer = entry.older = null
  }

  #touch (entry: Entry): void {
    if (this.#newest === entry) return
    this.#unlink(entry)
    this.#link(entry)
  }
}
