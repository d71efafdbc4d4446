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
 *   slot, and its skiplist node with its arrays of links and spans).
 *
 * Time is `now()` in milliseconds (default `Date.now`), given to the
 * constructor, so tests can move it by hand.
 */

export const KEY_OVERHEAD_BYTES = 96
export const VALUE_OVERHEAD_BYTES = 32
export const LIST_ITEM_OVERHEAD_BYTES = 40
export const SET_MEMBER_OVERHEAD_BYTES = 48
export const HASH_FIELD_OVERHEAD_BYTES = 80
export const ZSET_MEMBER_OVERHEAD_BYTES = 160
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

/** A member of a sorted set and its score. */
export interface ScoredMember {
  readonly member: string
  readonly score: number
}

/** A skiplist node: `next[i]` and `span[i]` (members skipped, itself included) at each of its levels. */
class ZNode implements ScoredMember {
  readonly member: string
  readonly score: number
  backward: ZNode | null = null
  readonly next: (ZNode | null)[]
  readonly span: number[]
  constructor (member: string, score: number, levels: number) {
    this.member = member
    this.score = score
    this.next = new Array<ZNode | null>(levels).fill(null)
    this.span = new Array<number>(levels).fill(0)
  }
}

const ZSKIPLIST_MAXLEVEL = 32
const ZSKIPLIST_P = 0.25

/** Whether (score, member) sorts before the node: by score, then member bytes (latin1 strings compare as bytes). */
function before (node: ZNode, score: number, member: string): boolean {
  return node.score < score || (node.score === score && node.member < member)
}

/**
 * A sorted set: scores by member, and the members in (score, member) order
 * in a skiplist with spans, as Redis's zset (t_zset.c): insert, remove and
 * finding the member at a rank are O(log n) expected, whatever the order
 * members come in (one ZADD of millions of decreasing scores included).
 * Levels are drawn from Math.random, which a peer cannot steer.
 */
export class SortedSet {
  readonly scores = new Map<string, number>()
  readonly #header = new ZNode('', 0, ZSKIPLIST_MAXLEVEL)
  #tail: ZNode | null = null
  #level = 1
  // Scratch for insert and delete (the nodes before the place at each level, and their ranks).
  readonly #update: ZNode[] = new Array<ZNode>(ZSKIPLIST_MAXLEVEL)
  readonly #rank: number[] = new Array<number>(ZSKIPLIST_MAXLEVEL).fill(0)

  get size (): number {
    return this.scores.size
  }

  /** Adds or moves a member; true when it is new. */
  set (member: string, score: number): boolean {
    const old = this.scores.get(member)
    if (old !== undefined) {
      if (old === score) return false
      this.#delete(old, member)
    }
    this.scores.set(member, score)
    this.#insert(score, member)
    return old === undefined
  }

  delete (member: string): boolean {
    const old = this.scores.get(member)
    if (old === undefined) return false
    this.#delete(old, member)
    this.scores.delete(member)
    return true
  }

  /** Takes the `count` members with the lowest scores. */
  popMin (count: number): ScoredMember[] {
    const out: ScoredMember[] = []
    const header = this.#header
    while (out.length < count) {
      const first = header.next[0] ?? null
      if (first === null) break
      for (let i = 0; i < this.#level; i++) this.#update[i] = header
      this.#unlink(first)
      this.scores.delete(first.member)
      out.push(first)
    }
    return out
  }

  /**
   * The members at ranks [start, stop] (0 the lowest, both within the set),
   * lowest first; with `rev`, ranks count from the highest, highest first.
   */
  range (start: number, stop: number, rev: boolean): ScoredMember[] {
    const out: ScoredMember[] = []
    const length = this.size
    if (start > stop || start < 0 || stop >= length) return out
    let node = this.#byRank(rev ? length - start : start + 1)
    for (let i = start; i <= stop && node !== null; i++) {
      out.push(node)
      node = rev ? node.backward : node.next[0]!
    }
    return out
  }

  #randomLevel (): number {
    let level = 1
    while (level < ZSKIPLIST_MAXLEVEL && Math.random() < ZSKIPLIST_P) level++
    return level
  }

  #insert (score: number, member: string): void {
    const update = this.#update
    const rank = this.#rank
    const header = this.#header
    let x = header
    for (let i = this.#level - 1; i >= 0; i--) {
      rank[i] = i === this.#level - 1 ? 0 : rank[i + 1]!
      for (let next = x.next[i]!; next !== null && before(next, score, member); next = x.next[i]!) {
        rank[i]! += x.span[i]!
        x = next
      }
      update[i] = x
    }
    const level = this.#randomLevel()
    // size already counts the new member.
    const length = this.size - 1
    if (level > this.#level) {
      for (let i = this.#level; i < level; i++) {
        rank[i] = 0
        update[i] = header
        header.span[i] = length
      }
      this.#level = level
    }
    const node = new ZNode(member, score, level)
    for (let i = 0; i < level; i++) {
      const prev = update[i]!
      node.next[i] = prev.next[i]!
      prev.next[i] = node
      node.span[i] = prev.span[i]! - (rank[0]! - rank[i]!)
      prev.span[i] = rank[0]! - rank[i]! + 1
    }
    for (let i = level; i < this.#level; i++) update[i]!.span[i]!++
    node.backward = update[0] === header ? null : update[0]!
    if (node.next[0] !== null) node.next[0]!.backward = node
    else this.#tail = node
  }

  #delete (score: number, member: string): void {
    const update = this.#update
    let x = this.#header
    for (let i = this.#level - 1; i >= 0; i--) {
      for (let next = x.next[i]!; next !== null && before(next, score, member); next = x.next[i]!) x = next
      update[i] = x
    }
    const node = x.next[0]!
    // The member is there (its score is the map's): the node after the place is it.
    this.#unlink(node)
  }

  // Takes `node` out, `#update` holding the nodes before it at every level.
  #unlink (node: ZNode): void {
    const update = this.#update
    const header = this.#header
    for (let i = 0; i < this.#level; i++) {
      const prev = update[i]!
      if (prev.next[i] === node) {
        prev.span[i]! += node.span[i]! - 1
        prev.next[i] = node.next[i]!
      } else {
        prev.span[i]!--
      }
    }
    if (node.next[0] !== null) node.next[0]!.backward = node.backward
    else this.#tail = node.backward
    while (this.#level > 1 && header.next[this.#level - 1] === null) this.#level--
  }

  // The node at 1-based `rank`, or null.
  #byRank (rank: number): ZNode | null {
    let x = this.#header
    let traversed = 0
    for (let i = this.#level - 1; i >= 0; i--) {
      while (x.next[i] !== null && traversed + x.span[i]! <= rank) {
        traversed += x.span[i]!
        x = x.next[i]!
      }
      if (traversed === rank) return x
    }
    return null
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
