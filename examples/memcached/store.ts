/**
 * The memcached example's cache: items in a `Map` for lookup and an
 * intrusive doubly-linked list for LRU order, evicted from the cold end
 * when the memory limit would be passed. Time comes from a `now()` clock
 * (ms) given to the constructor, so tests can move it by hand.
 *
 * Operations answer in the binary protocol's status codes (`Status`), with
 * memcached's choices where the protocol leaves room (proto_bin.c,
 * memcached.c do_store_item / do_add_delta): an ADD of a present key is
 * KEY_EEXISTS, a REPLACE of an absent one KEY_ENOENT, an APPEND to an
 * absent one NOT_STORED, and a non-zero CAS turns SET, ADD and REPLACE
 * alike into compare-and-swap.
 *
 * Keys are latin1 strings: one char per byte, so any byte string is a key,
 * and the string is what the `Map` needs anyway.
 */

/** The binary protocol's status codes that the cache's operations answer with. */
export const Status = {
  SUCCESS: 0x00,
  KEY_ENOENT: 0x01,
  KEY_EEXISTS: 0x02,
  E2BIG: 0x03,
  EINVAL: 0x04,
  NOT_STORED: 0x05,
  DELTA_BADVAL: 0x06,
  ENOMEM: 0x82
} as const
export type Status = typeof Status[keyof typeof Status]

/** How a store operation treats the key's current item. */
export type StoreMode = 'set' | 'add' | 'replace'

/**
 * What each item costs beyond its key and value bytes, for the memory
 * limit and the item size limit: memcached's item header (48 bytes), its
 * CAS (8) and the value's CRLF, rounded up. With it the largest value
 * matches memcached's for the same key (1 MiB minus about 64 bytes minus
 * the key). The JS objects cost more than this; the limit counts bytes
 * the way memcached does, not the process's heap.
 */
export const ITEM_OVERHEAD_BYTES = 64
/** memcached's `-I` default: 1 MiB per item, overhead and key included. */
export const DEFAULT_MAX_ITEM_BYTES = 1024 * 1024
/** memcached's `-m` default: 64 MiB. */
export const DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
/** memcached's REALTIME_MAXDELTA: an exptime above 30 days (in seconds) is a unix time, not a delta. */
export const MAX_RELATIVE_EXPTIME_S = 60 * 60 * 24 * 30
/** Longest key in bytes (memcached's KEY_MAX_LENGTH). */
export const MAX_KEY_BYTES = 250

const U64_MASK = (1n << 64n) - 1n
const EMPTY = Buffer.alloc(0)

/**
 * One cached item, and a node of the LRU list. Its value buffer is never
 * written after the item is made: an APPEND or INCR puts a new buffer in
 * its place, so an answer still waiting to be sent can hold the old one.
 */
export class Item {
  readonly key: string
  value: Buffer
  flags: number
  /** When it expires, in ms of the store's clock; 0: never. */
  expiresAt: number
  cas: number
  /** Bytes it counts against the memory limit. */
  size: number
  /** Toward the hot end (more recently used); null at the head. */
  prev: Item | null = null
  /** Toward the cold end; null at the tail. */
  next: Item | null = null

  constructor (key: string, value: Buffer, flags: number, expiresAt: number, cas: number) {
    this.key = key
    this.value = value
    this.flags = flags
    this.expiresAt = expiresAt
    this.cas = cas
    this.size = key.length + value.length + ITEM_OVERHEAD_BYTES
  }
}

/** Counters in memcached's `stats` names (those the store can know). */
export class StoreStats {
  total_items = 0
  evictions = 0
  /** Expired items whose memory was taken back (on access, or at the LRU tail). */
  reclaimed = 0
  cmd_get = 0
  get_hits = 0
  get_misses = 0
  get_expired = 0
  cmd_set = 0
  cmd_touch = 0
  touch_hits = 0
  touch_misses = 0
  delete_hits = 0
  delete_misses = 0
  incr_hits = 0
  incr_misses = 0
  decr_hits = 0
  decr_misses = 0
  cas_hits = 0
  cas_misses = 0
  cas_badval = 0
  cmd_flush = 0
}

export interface StoreOptions {
  /** Bytes of items (key + value + ITEM_OVERHEAD_BYTES each) kept before the least recently used are evicted. Default 64 MiB. */
  memoryBytes?: number
  /** Largest item (key + value + ITEM_OVERHEAD_BYTES); a larger one is refused with E2BIG. Default 1 MiB. */
  maxItemBytes?: number
  /** The clock, in ms since the unix epoch; default `Date.now`. */
  now?: () => number
}

/** The cache. Every operation reads the clock once. */
export class MemcachedStore {
  readonly memoryBytes: number
  readonly maxItemBytes: number
  readonly stats = new StoreStats()
  readonly #now: () => number
  readonly #items = new Map<string, Item>()
  /** Most recently used. */
  #head: Item | null = null
  /** Least recently used: the next to be evicted. */
  #tail: Item | null = null
  #usedBytes = 0
  /** The last CAS given out; CAS values start at 1 (0 means "no CAS" on the wire). Exact up to 2^53. */
  #cas = 0
  /** When a delayed flush takes effect (clock ms); 0: none pending. */
  #flushAt = 0

  constructor (options: StoreOptions = {}) {
    this.memoryBytes = options.memoryBytes ?? DEFAULT_MEMORY_BYTES
    this.maxItemBytes = options.maxItemBytes ?? DEFAULT_MAX_ITEM_BYTES
    this.#now = options.now ?? Date.now
  }

  /** The store's clock, in ms. */
  now (): number {
    return this.#now()
  }

  /** Items held, expired ones not yet reclaimed included (memcached's `curr_items`). */
  get size (): number {
    return this.#items.size
  }

  /** Bytes counted against the memory limit (memcached's `bytes`). */
  get usedBytes (): number {
    return this.#usedBytes
  }

  /** GET: the live item, made the most recently used; null on a miss. */
  get (key: string): Item | null {
    const now = this.#tick()
    const stats = this.stats
    stats.cmd_get++
    const item = this.#find(key, now, true)
    if (item === null) {
      stats.get_misses++
      return null
    }
    stats.get_hits++
    this.#bump(item)
    return item
  }

  /** TOUCH and GAT: sets a live item's expiry (`exptime` as on the wire) and returns it; null on a miss. */
  touch (key: string, exptime: number): Item | null {
    const now = this.#tick()
    const stats = this.stats
    stats.cmd_touch++
    const item = this.#find(key, now, false)
    if (item === null) {
      stats.touch_misses++
      return null
    }
    stats.touch_hits++
    item.expiresAt = expiresAt(exptime, now)
    this.#bump(item)
    return item
  }

  /**
   * SET, ADD and REPLACE: stores a copy of `value`. With a non-zero `cas`
   * the current item must have that CAS (else KEY_EEXISTS; KEY_ENOENT when
   * there is none), whatever the mode. Returns the new item (its `cas` is
   * the answer's) or the failure's status.
   */
  store (mode: StoreMode, key: string, value: Uint8Array, flags: number, exptime: number, cas: number): Item | Status {
    const now = this.#tick()
    const stats = this.stats
    stats.cmd_set++
    const size = key.length + value.length + ITEM_OVERHEAD_BYTES
    if (size > this.maxItemBytes || size > this.memoryBytes) {
      // memcached drops the current value of a SET it cannot store, so
      // that a reader does not go on seeing data the writer replaced.
      if (mode === 'set') this.#drop(key)
      return size > this.maxItemBytes ? Status.E2BIG : Status.ENOMEM
    }
    const old = this.#find(key, now, false)
    if (cas !== 0) {
      if (old === null) {
        stats.cas_misses++
        return Status.KEY_ENOENT
      }
      if (old.cas !== cas) {
        stats.cas_badval++
        return Status.KEY_EEXISTS
      }
      stats.cas_hits++
    } else if (mode === 'add' && old !== null) {
      this.#bump(old)
      return Status.KEY_EEXISTS
    } else if (mode === 'replace' && old === null) {
      return Status.KEY_ENOENT
    }
    return this.#link(key, copyOf(value), flags, expiresAt(exptime, now), old, now)
  }

  /**
   * APPEND and PREPEND: adds `data` after (or before) a live item's value,
   * keeping its flags and expiry. NOT_STORED when there is no item;
   * KEY_EEXISTS when `cas` is non-zero and not the item's.
   */
  concat (key: string, data: Uint8Array, prepend: boolean, cas: number): Item | Status {
    const now = this.#tick()
    this.stats.cmd_set++
    // As memcached: the new piece alone too large is E2BIG; the joined value too large is NOT_STORED.
    if (key.length + data.length + ITEM_OVERHEAD_BYTES > this.maxItemBytes) return Status.E2BIG
    const old = this.#find(key, now, false)
    if (old === null) return Status.NOT_STORED
    if (cas !== 0 && old.cas !== cas) return Status.KEY_EEXISTS
    const length = old.value.length + data.length
    if (key.length + length + ITEM_OVERHEAD_BYTES > this.maxItemBytes) return Status.NOT_STORED
    const value = Buffer.allocUnsafeSlow(length)
    if (prepend) {
      value.set(data, 0)
      value.set(old.value, data.length)
    } else {
      value.set(old.value, 0)
      value.set(data, old.value.length)
    }
    return this.#link(key, value, old.flags, old.expiresAt, old, now)
  }

  /**
   * INCREMENT and DECREMENT of a decimal value (unsigned 64 bits: an
   * increment wraps, a decrement stops at 0). An absent key is created
   * with `initial` (flags 0, expiry `exptime`) unless `create` is false
   * (the wire's exptime 0xffffffff), which answers KEY_ENOENT. A value that
   * is not a number is DELTA_BADVAL; a non-zero `cas` that is not the
   * item's is KEY_EEXISTS. Returns the item, whose value is the new number.
   */
  arithmetic (key: string, increment: boolean, delta: bigint, initial: bigint, exptime: number, create: boolean, cas: number): Item | Status {
    const now = this.#tick()
    const stats = this.stats
    const old = this.#find(key, now, false)
    if (old === null) {
      if (increment) stats.incr_misses++
      else stats.decr_misses++
      if (!create) return Status.KEY_ENOENT
      return this.#link(key, digitsOf(initial & U64_MASK), 0, expiresAt(exptime, now), null, now)
    }
    // memcached's order: an empty value, then the CAS, then the number.
    if (old.value.length === 0) return Status.DELTA_BADVAL
    if (cas !== 0 && old.cas !== cas) return Status.KEY_EEXISTS
    const current = parseU64(old.value)
    if (current === null) return Status.DELTA_BADVAL
    let next: bigint
    if (increment) {
      stats.incr_hits++
      next = (current + delta) & U64_MASK
    } else {
      stats.decr_hits++
      next = delta > current ? 0n : current - delta
    }
    // memcached rewrites the digits in place, padding with spaces when the
    // number got shorter ("10" - 1 reads "9 "); here the value is exactly
    // the number's digits.
    return this.#link(key, digitsOf(next), old.flags, old.expiresAt, old, now)
  }

  /** DELETE: SUCCESS, KEY_ENOENT, or KEY_EEXISTS when `cas` is non-zero and not the item's. */
  delete (key: string, cas: number): Status {
    const now = this.#tick()
    const stats = this.stats
    const item = this.#find(key, now, false)
    if (item === null) {
      stats.delete_misses++
      return Status.KEY_ENOENT
    }
    if (cas !== 0 && item.cas !== cas) return Status.KEY_EEXISTS
    stats.delete_hits++
    this.#unlink(item)
    return Status.SUCCESS
  }

  /**
   * FLUSH: every item goes, now (`exptime` 0) or when `exptime` (seconds
   * from now, or a unix time past 30 days, as an item's) comes; a later
   * flush replaces a pending one. Items stored before that moment go;
   * items stored after it stay.
   */
  flush (exptime = 0): void {
    const now = this.#tick()
    this.stats.cmd_flush++
    const at = exptime === 0 ? 0 : expiresAt(exptime, now)
    if (at === 0 || at <= now) {
      this.#flushAt = 0
      this.#clear()
    } else {
      this.#flushAt = at
    }
  }

  /** STAT reset: the counters go back to 0 (the items stay). */
  resetStats (): void {
    Object.assign(this.stats, new StoreStats())
  }

  // Reads the clock, and carries out a delayed flush whose time has come.
  // Everything present then was stored before that time (every earlier
  // operation saw the clock before it), so all of it goes.
  #tick (): number {
    const now = this.#now()
    if (this.#flushAt !== 0 && now >= this.#flushAt) {
      this.#flushAt = 0
      this.#clear()
    }
    return now
  }

  // The live item under `key`, or null; an expired one found is unlinked.
  #find (key: string, now: number, countExpired: boolean): Item | null {
    const item = this.#items.get(key)
    if (item === undefined) return null
    if (item.expiresAt !== 0 && item.expiresAt <= now) {
      if (countExpired) this.stats.get_expired++
      this.stats.reclaimed++
      this.#unlink(item)
      return null
    }
    return item
  }

  // Puts a new item in place of `old` (or as a new key), with a new CAS,
  // at the hot end, then evicts from the cold end until the memory fits.
  #link (key: string, value: Buffer, flags: number, expiry: number, old: Item | null, now: number): Item {
    if (old !== null) this.#unlink(old)
    const item = new Item(key, value, flags, expiry, ++this.#cas)
    this.#items.set(key, item)
    this.#pushHead(item)
    this.#usedBytes += item.size
    this.stats.total_items++
    this.#evictFor(item, now)
    return item
  }

  // Evicts least recently used items (never `keep`, which is at the head)
  // until the used bytes are within the limit. Expired ones at the tail
  // count as reclaimed, not evicted.
  #evictFor (keep: Item, now: number): void {
    while (this.#usedBytes > this.memoryBytes) {
      const victim = this.#tail
      if (victim === null || victim === keep) return
      if (victim.expiresAt !== 0 && victim.expiresAt <= now) this.stats.reclaimed++
      else this.stats.evictions++
      this.#unlink(victim)
    }
  }

  #drop (key: string): void {
    const item = this.#items.get(key)
    if (item !== undefined) this.#unlink(item)
  }

  #unlink (item: Item): void {
    this.#items.delete(item.key)
    const { prev, next } = item
    if (prev === null) this.#head = next
    else prev.next = next
    if (next === null) this.#tail = prev
    else next.prev = prev
    item.prev = item.next = null
    this.#usedBytes -= item.size
  }

  #pushHead (item: Item): void {
    const head = this.#head
    item.prev = null
    item.next = head
    if (head === null) this.#tail = item
    else head.prev = item
    this.#head = item
  }

  // Moves an item to the hot end.
  #bump (item: Item): void {
    if (item === this.#head) return
    const { prev, next } = item
    // Not the head, so prev is set.
    prev!.next = next
    if (next === null) this.#tail = prev
    else next.prev = prev
    this.#pushHead(item)
  }

  #clear (): void {
    this.#items.clear()
    this.#head = this.#tail = null
    this.#usedBytes = 0
  }
}

/**
 * An exptime from the wire as a time of the clock (ms): 0 never expires; up
 * to 30 days it is seconds from now, beyond that a unix time; negative (the
 * text protocol's) is already past. A time already past comes out as 1
 * (expired, and not the "never" of 0).
 */
export function expiresAt (exptime: number, now: number): number {
  if (exptime === 0) return 0
  if (exptime < 0) return 1
  const at = exptime > MAX_RELATIVE_EXPTIME_S ? exptime * 1000 : now + exptime * 1000
  return at <= now ? 1 : at
}

/**
 * A value's decimal number as memcached's safe_strtoull reads it: leading
 * white space, digits, then nothing or white space; at most 2^64 - 1. Null
 * for anything else (a sign, other characters, no digits, overflow).
 */
export function parseU64 (value: Uint8Array): bigint | null {
  let i = 0
  const n = value.length
  while (i < n && isSpace(value[i]!)) i++
  const start = i
  while (i < n && value[i]! >= 0x30 && value[i]! <= 0x39) i++
  const end = i
  if (end === start) return null
  while (i < n && isSpace(value[i]!)) i++
  if (i !== n) return null
  // Past its leading zeros a number below 2^64 has at most 20 digits; a
  // longer one is refused before BigInt spends time on a megabyte of them.
  let first = start
  while (first < end - 1 && value[first] === 0x30) first++
  if (end - first > 20) return null
  const number = BigInt(Buffer.from(value.buffer, value.byteOffset + first, end - first).toString('latin1'))
  return number > U64_MASK ? null : number
}

function isSpace (byte: number): boolean {
  // C isspace: space, \t \n \v \f \r.
  return byte === 0x20 || (byte >= 0x09 && byte <= 0x0d)
}

// A copy of a value that shares memory with nothing: an item must not pin
// the read chunk it arrived in (a pooled Buffer.allocUnsafe slice would pin
// an 8 KiB pool slab, so the memory limit would no longer bound the heap).
function copyOf (value: Uint8Array): Buffer {
  if (value.length === 0) return EMPTY
  const copy = Buffer.allocUnsafeSlow(value.length)
  copy.set(value, 0)
  return copy
}

// A number's decimal digits in a buffer of its own (not a pool slice, as copyOf).
function digitsOf (number: bigint): Buffer {
  const text = number.toString()
  const bytes = Buffer.allocUnsafeSlow(text.length)
  bytes.write(text, 0, 'latin1')
  return bytes
}
