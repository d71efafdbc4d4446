/**
 * The memcached example's cache, laid out the way memcached lays it out
 * and for the same reason: the cache holds many long-lived items that die
 * in LRU order, the worst case for a generational garbage collector. One
 * JS object and one ArrayBuffer per item (as a `Map` of items would have)
 * kept V8's major GC busy marking and sweeping ArrayBuffers on the cores
 * the clients need. So here an item is an index (an id) into typed arrays
 * of its fields, and its key and value bytes live in a chunk of a 1 MiB
 * slab page:
 *
 * - slab classes of chunk sizes growing by 1.25 (memcached's `-f`), up to
 *   one that holds a key and a `SLAB_VALUE_BYTES` value; each class takes
 *   pages as it needs them and keeps a free list of chunks;
 * - a hash table on the key bytes (chained, in an Int32Array), so no key
 *   string is made per request;
 * - the LRU order as a doubly-linked list of ids.
 *
 * A value above `SLAB_VALUE_BYTES` gets a buffer of its own (with its key
 * in front), as before: few, and large.
 *
 * Memory: items count key + value + ITEM_OVERHEAD_BYTES against
 * `memoryBytes` (memcached's `bytes`), and the least recently used are
 * evicted past it. The pages are bounded too: a class takes a new page
 * only while the pages stay within `memoryBytes` (its first page always,
 * as memcached does); past that a chunk comes from evicting an item of the
 * same class near the cold end of the LRU list, or, when there is none
 * there, the item gets a buffer of its own. Pages plus own buffers thus
 * stay below twice `memoryBytes` plus a page per class, and in a steady
 * workload within `memoryBytes` plus those first pages.
 *
 * Time comes from a `now()` clock (ms) given to the constructor, so tests
 * can move it by hand.
 *
 * Operations answer in the binary protocol's status codes (`Status`), with
 * memcached's choices where the protocol leaves room (proto_bin.c,
 * memcached.c do_store_item / do_add_delta): an ADD of a present key is
 * KEY_EEXISTS, a REPLACE of an absent one KEY_ENOENT, an APPEND to an
 * absent one NOT_STORED, and a non-zero CAS turns SET, ADD and REPLACE
 * alike into compare-and-swap.
 *
 * Keys are bytes (`Uint8Array`); a string is taken as latin1, one byte per
 * char (tests, STAT).
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
const EMPTY_BYTES = new Uint8Array(0)
const NONE = -1

// An item's numbers in MemcachedStore's #meta, STRIDE per id.
const STRIDE = 8
const HASH = 0
/** The next id in the same hash bucket. */
const CHAIN = 1
/** LRU list: toward the hot end, toward the cold end. */
const PREV = 2
const NEXT = 3
/** Where the key (then the value) lies: a slab page's index, or -1 - the index in #own (a buffer of its own). */
const PAGE = 4
/** The byte offset in the page (0 in an own buffer). */
const OFFSET = 5
const KEY_BYTES = 6
const VALUE_BYTES = 7
// #times, two per id: the CAS and when it expires.
const CAS = 0
const EXPIRES = 1

/** Values up to this size live in slab chunks; larger ones in buffers of their own. The protocol must send values of this size and below by copy (its `sliceValueBytes` at least this), since a chunk is reused once its item goes. */
export const SLAB_VALUE_BYTES = 16 * 1024
/** A slab page (memcached's `-I` default slab page). */
export const PAGE_BYTES = 1024 * 1024
const SMALLEST_CHUNK = 64
const GROWTH_FACTOR = 1.25
/** How far from the cold end an eviction looks for an item of the class that needs a chunk. */
const EVICTION_SEARCH = 64

/** Chunk sizes: 64 bytes growing by 1.25 (multiples of 8) up to one that fits the largest key and a SLAB_VALUE_BYTES value. */
const CHUNK_BYTES: readonly number[] = (() => {
  const sizes: number[] = []
  const largest = MAX_KEY_BYTES + SLAB_VALUE_BYTES
  for (let size = SMALLEST_CHUNK; size < largest; size = Math.ceil(size * GROWTH_FACTOR / 8) * 8) sizes.push(size)
  sizes.push(Math.ceil(largest / 8) * 8)
  return sizes
})()

/** The class of a chunk of `bytes`, by bytes / 8 rounded up. */
const CLASS_OF: Uint8Array = (() => {
  const classes = new Uint8Array(CHUNK_BYTES.at(-1)! / 8 + 1)
  let c = 0
  for (let i = 0; i < classes.length; i++) {
    while (CHUNK_BYTES[c]! < i * 8) c++
    classes[i] = c
  }
  return classes
})()

/**
 * An item as an operation returns it: a snapshot of its fields, and views
 * of its key and value bytes in the cache's memory. The views are valid
 * until the item is next changed, replaced, deleted or evicted (its chunk
 * is then reused): use them before the next store operation, or copy them.
 * A value of more than SLAB_VALUE_BYTES is never written over (a change
 * makes a new buffer), so an answer may send it later without a copy.
 */
export class Item {
  // Every field is declared without a value (`declare`: no class field is
  // emitted), none is #private, and the constructor sets them in one
  // order: V8 then makes the object in line in a GET's handler (with
  // fields and #fields it went through the generic construct stub).
  declare readonly cas: number
  declare readonly flags: number
  /** When it expires, in ms of the store's clock; 0: never. */
  declare readonly expiresAt: number
  /**
   * The value's bytes, as `value` but a plain Uint8Array: made by the
   * store straight on its memory's ArrayBuffer, which costs about half a
   * Buffer's `subarray` (that reads `buffer` and `byteOffset` each time).
   */
  declare readonly valueBytes: Uint8Array
  declare private readonly memory: Buffer
  declare private readonly keyAt: number
  declare private readonly keyBytes: number

  /** `valueBytes`: a view of the value, which lies right after the key (`keyBytes` bytes at `memory[keyAt]`). */
  constructor (cas: number, flags: number, expiresAt: number, valueBytes: Uint8Array, memory: Buffer, keyAt: number, keyBytes: number) {
    this.cas = cas
    this.flags = flags
    this.expiresAt = expiresAt
    this.valueBytes = valueBytes
    this.memory = memory
    this.keyAt = keyAt
    this.keyBytes = keyBytes
  }

  /** The value's bytes (a view, as `key`). */
  get value (): Buffer {
    const bytes = this.valueBytes
    return bytes.length === 0 ? EMPTY : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length)
  }

  /** The key's bytes (a view, as `value`). */
  get key (): Buffer {
    return this.memory.subarray(this.keyAt, this.keyAt + this.keyBytes)
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
  /** Bytes of items (key + value + ITEM_OVERHEAD_BYTES each) kept before the least recently used are evicted; also the slab pages' bound. Default 64 MiB. */
  memoryBytes?: number
  /** Largest item (key + value + ITEM_OVERHEAD_BYTES); a larger one is refused with E2BIG. Default 1 MiB. */
  maxItemBytes?: number
  /** The clock, in ms since the unix epoch; default `Date.now`. */
  now?: () => number
}

/** A key as the store takes it: bytes, or a latin1 string. */
export type Key = Uint8Array | string

function keyBytes (key: Key): Uint8Array {
  return typeof key === 'string' ? Buffer.from(key, 'latin1') : key
}

// Keys are hashed four bytes at a time through a DataView of the buffer
// they lie in (one bounds check a word, where indexing a Uint8Array costs
// one a byte); the view of the last such buffer (the frame requests are
// read in, one per read slab) is kept for the next key. A key is compared
// with a stored one word by word too, the stored key's words read through
// an Int32Array over its memory (items start 8-byte aligned), so in the
// platform's byte order, which the DataView is told to read in: about 30
// instructions a word to compare where two DataViews took about 45 (for
// memcaslap's 64-byte keys, a GET's lookup ~630 instructions, was ~800).
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1
let keyBuffer: Uint8Array | null = null
let keyView: DataView = new DataView(new ArrayBuffer(0))

function viewOf (bytes: Uint8Array): DataView {
  if (bytes !== keyBuffer) {
    keyView = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
    keyBuffer = bytes
  }
  return keyView
}

// MurmurHash3 (x86, 32-bit, starting from 0) over key[start, end), as a signed
// 32-bit number (what #meta holds).
function hashOf (key: Uint8Array, start = 0, end = key.length): number {
  const length = end - start
  const whole = start + (length & ~3)
  const view = viewOf(key)
  let h = 0
  let i = start
  for (; i < whole; i += 4) {
    let k = view.getInt32(i, true)
    k = Math.imul(k, 0xcc9e2d51)
    k = Math.imul((k << 15) | (k >>> 17), 0x1b873593)
    h ^= k
    h = (h << 13) | (h >>> 19)
    h = (Math.imul(h, 5) + 0xe6546b64) | 0
  }
  let k = 0
  switch (length & 3) {
    case 3: k ^= key[i + 2]! << 16 // falls through
    case 2: k ^= key[i + 1]! << 8 // falls through
    case 1:
      k ^= key[i]!
      k = Math.imul(k, 0xcc9e2d51)
      h ^= Math.imul((k << 15) | (k >>> 17), 0x1b873593)
  }
  h ^= length
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b)
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35)
  return h ^ (h >>> 16)
}

// True when key[start, start + length) is the key stored at byte `at` (a
// multiple of 4) of `bytes`, whose words `words` reads.
function sameKey (words: Int32Array, bytes: Uint8Array, at: number, key: Uint8Array, start: number, length: number): boolean {
  const view = viewOf(key)
  const whole = length >> 2
  const first = at >> 2
  for (let w = 0; w < whole; w++) if (words[first + w] !== view.getInt32(start + 4 * w, LITTLE_ENDIAN)) return false
  for (let i = whole << 2; i < length; i++) if (bytes[at + i] !== key[start + i]) return false
  return true
}

// Writes key[start, start + length) at byte `at` (a multiple of 4) of `bytes`, whose words `words` writes.
function putKey (words: Int32Array, bytes: Uint8Array, at: number, key: Uint8Array, start: number, length: number): void {
  const view = viewOf(key)
  const whole = length >> 2
  const first = at >> 2
  for (let w = 0; w < whole; w++) words[first + w] = view.getInt32(start + 4 * w, LITTLE_ENDIAN)
  for (let i = whole << 2; i < length; i++) bytes[at + i] = key[start + i]!
}

// The words of an item of its own (a large value, rare): made for one comparison or copy.
function ownWords (memory: Buffer): Int32Array {
  return new Int32Array(memory.buffer, memory.byteOffset, memory.length >> 2)
}

/** The cache. Every operation reads the clock at most once (a GET only when a flush is pending or the item it found has an expiry). */
export class MemcachedStore {
  readonly memoryBytes: number
  readonly maxItemBytes: number
  readonly stats = new StoreStats()
  readonly #now: () => number

  // The items' fields, by id, grown by doubling; an id not in use is on
  // #freeIds. What a lookup reads (hash, chain, where the key is, its
  // length) sits together in #meta, STRIDE numbers per id, so that a lookup
  // costs one cache miss for them rather than one per field.
  #capacity = 0
  #meta = new Int32Array(0)
  #times = new Float64Array(0)
  #flags = new Uint32Array(0)
  #freeIds: number[] = []

  #buckets = new Int32Array(1024).fill(NONE)
  #count = 0
  /** Most recently used. */
  #head = NONE
  /** Least recently used: the next to be evicted. */
  #tail = NONE
  #usedBytes = 0

  /** Slab pages, and per class the free chunks as page * PAGE_BYTES + offset. */
  #pages: Buffer[] = []
  /** Each page's ArrayBuffer (Item.valueBytes); a page starts at its offset 0. */
  #pageBuffers: ArrayBuffer[] = []
  /** Each page as an Int32Array (sameKey, putKey). */
  #pageWords: Int32Array[] = []
  #pageClass: number[] = []
  #freeChunks: number[][] = CHUNK_BYTES.map(() => [])
  #classPages: number[] = CHUNK_BYTES.map(() => 0)
  /** Items in buffers of their own (PAGE -1 - index); freed indexes are reused. */
  #own: (Buffer | undefined)[] = []
  #freeOwn: number[] = []

  /** The last CAS given out; CAS values start at 1 (0 means "no CAS" on the wire). Exact up to 2^53. */
  #lastCas = 0
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
    return this.#count
  }

  /** Bytes counted against the memory limit (memcached's `bytes`). */
  get usedBytes (): number {
    return this.#usedBytes
  }

  /** Bytes of slab pages and own buffers held (what the cache costs the process, beyond the fields' arrays). */
  get heldBytes (): number {
    let bytes = this.#pages.length * PAGE_BYTES
    for (const own of this.#own) bytes += own?.length ?? 0
    return bytes
  }

  /** GET: the live item, made the most recently used; null on a miss. With `start` and `end`, the key is `key[start, end)` (a request's frame: no view of it made). */
  get (key: Key, start?: number, end?: number): Item | null {
    // The clock only when it matters: a flush is due (#tick), or the item found has an expiry (#findHashed).
    const now = this.#flushAt === 0 ? NaN : this.#tick()
    const stats = this.stats
    stats.cmd_get++
    const bytes = keyBytes(key)
    const from = start ?? 0
    const to = end ?? bytes.length
    const id = this.#findHashed(bytes, hashOf(bytes, from, to), now, true, from, to)
    if (id === NONE) {
      stats.get_misses++
      return null
    }
    stats.get_hits++
    this.#bump(id)
    return this.#item(id)
  }

  /** TOUCH and GAT: sets a live item's expiry (`exptime` as on the wire) and returns it; null on a miss. */
  touch (key: Key, exptime: number): Item | null {
    const now = this.#tick()
    const stats = this.stats
    stats.cmd_touch++
    const id = this.#find(keyBytes(key), now, false)
    if (id === NONE) {
      stats.touch_misses++
      return null
    }
    stats.touch_hits++
    this.#times[id * 2 + EXPIRES] = expiresAt(exptime, now)
    this.#bump(id)
    return this.#item(id)
  }

  /**
   * SET, ADD and REPLACE: stores a copy of `value`. With a non-zero `cas`
   * the current item must have that CAS (else KEY_EEXISTS; KEY_ENOENT when
   * there is none), whatever the mode. Returns the new item (its `cas` is
   * the answer's) or the failure's status.
   */
  store (mode: StoreMode, key: Key, value: Uint8Array, flags: number, exptime: number, cas: number, start?: number, end?: number): Item | Status {
    const now = this.#tick()
    const bytes = keyBytes(key)
    const from = start ?? 0
    const to = end ?? bytes.length
    const stats = this.stats
    stats.cmd_set++
    const size = to - from + value.length + ITEM_OVERHEAD_BYTES
    if (size > this.maxItemBytes || size > this.memoryBytes) {
      // memcached drops the current value of a SET it cannot store, so
      // that a reader does not go on seeing data the writer replaced.
      if (mode === 'set') {
        const id = this.#lookup(bytes, hashOf(bytes, from, to), from, to)
        if (id !== NONE) this.#unlink(id)
      }
      return size > this.maxItemBytes ? Status.E2BIG : Status.ENOMEM
    }
    const hash = hashOf(bytes, from, to)
    const old = this.#findHashed(bytes, hash, now, false, from, to)
    if (cas !== 0) {
      if (old === NONE) {
        stats.cas_misses++
        return Status.KEY_ENOENT
      }
      if (this.#times[old * 2 + CAS] !== cas) {
        stats.cas_badval++
        return Status.KEY_EEXISTS
      }
      stats.cas_hits++
    } else if (mode === 'add' && old !== NONE) {
      this.#bump(old)
      return Status.KEY_EEXISTS
    } else if (mode === 'replace' && old === NONE) {
      return Status.KEY_ENOENT
    }
    if (old !== NONE) this.#unlink(old)
    return this.#link(bytes, from, to, hash, value, flags, expiresAt(exptime, now), now)
  }

  /**
   * APPEND and PREPEND: adds `data` after (or before) a live item's value,
   * keeping its flags and expiry. NOT_STORED when there is no item;
   * KEY_EEXISTS when `cas` is non-zero and not the item's.
   */
  concat (key: Key, data: Uint8Array, prepend: boolean, cas: number): Item | Status {
    const now = this.#tick()
    const bytes = keyBytes(key)
    this.stats.cmd_set++
    // As memcached: the new piece alone too large is E2BIG; the joined value too large is NOT_STORED.
    if (bytes.length + data.length + ITEM_OVERHEAD_BYTES > this.maxItemBytes) return Status.E2BIG
    const hash = hashOf(bytes)
    const old = this.#findHashed(bytes, hash, now, false)
    if (old === NONE) return Status.NOT_STORED
    if (cas !== 0 && this.#times[old * 2 + CAS] !== cas) return Status.KEY_EEXISTS
    const oldValue = this.#valueView(old)
    if (bytes.length + oldValue.length + data.length + ITEM_OVERHEAD_BYTES > this.maxItemBytes) return Status.NOT_STORED
    // Joined before the old item goes: its chunk may be the new one's.
    const joined = prepend ? Buffer.concat([data, oldValue]) : Buffer.concat([oldValue, data])
    const flags = this.#flags[old]!
    const expiry = this.#times[old * 2 + EXPIRES]!
    this.#unlink(old)
    return this.#link(bytes, 0, bytes.length, hash, joined, flags, expiry, now)
  }

  /**
   * INCREMENT and DECREMENT of a decimal value (unsigned 64 bits: an
   * increment wraps, a decrement stops at 0). An absent key is created
   * with `initial` (flags 0, expiry `exptime`) unless `create` is false
   * (the wire's exptime 0xffffffff), which answers KEY_ENOENT. A value that
   * is not a number is DELTA_BADVAL; a non-zero `cas` that is not the
   * item's is KEY_EEXISTS. Returns the item, whose value is the new number.
   */
  arithmetic (key: Key, increment: boolean, delta: bigint, initial: bigint, exptime: number, create: boolean, cas: number): Item | Status {
    const now = this.#tick()
    const bytes = keyBytes(key)
    const stats = this.stats
    const hash = hashOf(bytes)
    const old = this.#findHashed(bytes, hash, now, false)
    if (old === NONE) {
      if (increment) stats.incr_misses++
      else stats.decr_misses++
      if (!create) return Status.KEY_ENOENT
      return this.#link(bytes, 0, bytes.length, hash, digitsOf(initial & U64_MASK), 0, expiresAt(exptime, now), now)
    }
    // memcached's order: an empty value, then the CAS, then the number.
    const value = this.#valueView(old)
    if (value.length === 0) return Status.DELTA_BADVAL
    if (cas !== 0 && this.#times[old * 2 + CAS] !== cas) return Status.KEY_EEXISTS
    const current = parseU64(value)
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
    const flags = this.#flags[old]!
    const expiry = this.#times[old * 2 + EXPIRES]!
    this.#unlink(old)
    return this.#link(bytes, 0, bytes.length, hash, digitsOf(next), flags, expiry, now)
  }

  /** DELETE: SUCCESS, KEY_ENOENT, or KEY_EEXISTS when `cas` is non-zero and not the item's. */
  delete (key: Key, cas: number): Status {
    const now = this.#tick()
    const stats = this.stats
    const id = this.#find(keyBytes(key), now, false)
    if (id === NONE) {
      stats.delete_misses++
      return Status.KEY_ENOENT
    }
    if (cas !== 0 && this.#times[id * 2 + CAS] !== cas) return Status.KEY_EEXISTS
    stats.delete_hits++
    this.#unlink(id)
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

  #find (key: Uint8Array, now: number, countExpired: boolean): number {
    return this.#findHashed(key, hashOf(key), now, countExpired)
  }

  // The live item under `key` (key[start, end)), or NONE; an expired one
  // found is unlinked. `now` NaN: the clock is read here if it is needed.
  #findHashed (key: Uint8Array, hash: number, now: number, countExpired: boolean, start = 0, end = key.length): number {
    const id = this.#lookup(key, hash, start, end)
    if (id === NONE) return NONE
    const expires = this.#times[id * 2 + EXPIRES]!
    if (expires !== 0 && expires <= (Number.isNaN(now) ? this.#now() : now)) {
      if (countExpired) this.stats.get_expired++
      this.stats.reclaimed++
      this.#unlink(id)
      return NONE
    }
    return id
  }

  #lookup (key: Uint8Array, hash: number, start = 0, end = key.length): number {
    const length = end - start
    const meta = this.#meta
    for (let id = this.#buckets[hash & (this.#buckets.length - 1)]!; id !== NONE; id = meta[id * STRIDE + CHAIN]!) {
      const m = id * STRIDE
      if (meta[m + HASH] !== hash || meta[m + KEY_BYTES] !== length) continue
      const page = meta[m + PAGE]!
      if (page >= 0 ? sameKey(this.#pageWords[page]!, this.#pages[page]!, meta[m + OFFSET]!, key, start, length) : this.#sameOwnKey(page, key, start, length)) return id
    }
    return NONE
  }

  #sameOwnKey (page: number, key: Uint8Array, start: number, length: number): boolean {
    const memory = this.#own[-1 - page]!
    return sameKey(ownWords(memory), memory, 0, key, start, length)
  }

  // The buffer an item's bytes are in (its page, or its own), key first at OFFSET.
  #memoryOf (id: number): Buffer {
    const page = this.#meta[id * STRIDE + PAGE]!
    return page >= 0 ? this.#pages[page]! : this.#own[-1 - page]!
  }

  #valueView (id: number): Buffer {
    const m = id * STRIDE
    const at = this.#meta[m + OFFSET]! + this.#meta[m + KEY_BYTES]!
    return this.#memoryOf(id).subarray(at, at + this.#meta[m + VALUE_BYTES]!)
  }

  #item (id: number): Item {
    const m = id * STRIDE
    const meta = this.#meta
    const page = meta[m + PAGE]!
    const keyAt = meta[m + OFFSET]!
    const keyLength = meta[m + KEY_BYTES]!
    const valueLength = meta[m + VALUE_BYTES]!
    const memory = page >= 0 ? this.#pages[page]! : this.#own[-1 - page]!
    // An item of its own (a large value) is rare: its ArrayBuffer is asked for then.
    const value = valueLength === 0
      ? EMPTY_BYTES
      : page >= 0
        ? new Uint8Array(this.#pageBuffers[page]!, keyAt + keyLength, valueLength)
        : new Uint8Array(memory.buffer, memory.byteOffset + keyAt + keyLength, valueLength)
    return new Item(this.#times[id * 2 + CAS]!, this.#flags[id]!, this.#times[id * 2 + EXPIRES]!, value, memory, keyAt, keyLength)
  }

  // Makes a new item under key[start, end) (no item has it now), with a new CAS at the hot end, then evicts from the cold
  // end until the memory fits.
  #link (key: Uint8Array, start: number, end: number, hash: number, value: Uint8Array, flags: number, expiry: number, now: number): Item {
    const id = this.#newId()
    const keyLength = end - start
    const valueLength = value.length
    const meta = this.#meta
    const m = id * STRIDE
    meta[m + KEY_BYTES] = keyLength
    meta[m + VALUE_BYTES] = valueLength
    this.#place(id, keyLength + valueLength, valueLength, now)
    const page = meta[m + PAGE]!
    const memory = page >= 0 ? this.#pages[page]! : this.#own[-1 - page]!
    const at = meta[m + OFFSET]!
    putKey(page >= 0 ? this.#pageWords[page]! : ownWords(memory), memory, at, key, start, keyLength)
    if (valueLength !== 0) memory.set(value, at + keyLength)
    this.#times[id * 2 + CAS] = ++this.#lastCas
    this.#times[id * 2 + EXPIRES] = expiry
    this.#flags[id] = flags
    meta[m + HASH] = hash
    const bucket = hash & (this.#buckets.length - 1)
    meta[m + CHAIN] = this.#buckets[bucket]!
    this.#buckets[bucket] = id
    this.#count++
    this.#pushHead(id)
    this.#usedBytes += keyLength + valueLength + ITEM_OVERHEAD_BYTES
    this.stats.total_items++
    this.#evictFor(id, now)
    if (this.#count > this.#buckets.length) this.#rehash()
    return this.#item(id)
  }

  // Finds the item's memory: a free chunk of its class, a new page, or an
  // evicted item's chunk; a buffer of its own when it is too large for a
  // chunk or no chunk of its class is to be had.
  #place (id: number, bytes: number, valueBytes: number, now: number): void {
    const m = id * STRIDE
    if (valueBytes <= SLAB_VALUE_BYTES) {
      const cls = CLASS_OF[(bytes + 7) >> 3]!
      const free = this.#freeChunks[cls]!
      if (free.length === 0) this.#growClass(cls, now)
      const chunk = free.pop()
      if (chunk !== undefined) {
        this.#meta[m + PAGE] = Math.floor(chunk / PAGE_BYTES)
        this.#meta[m + OFFSET] = chunk % PAGE_BYTES
        return
      }
    }
    const index = this.#freeOwn.pop() ?? this.#own.length
    this.#own[index] = Buffer.allocUnsafeSlow(bytes)
    this.#meta[m + PAGE] = -1 - index
    this.#meta[m + OFFSET] = 0
  }

  // Gives a class free chunks: a new page while the pages are within the
  // limit (a class's first page always), else the chunk of the item of
  // that class nearest the cold end (within EVICTION_SEARCH of it).
  #growClass (cls: number, now: number): void {
    if (this.#classPages[cls] === 0 || (this.#pages.length + 1) * PAGE_BYTES <= this.memoryBytes) {
      const page = this.#pages.length
      // Not zeroed (a chunk's bytes are written before they are read); a buffer of its own, at offset 0 of its ArrayBuffer.
      const memory = Buffer.allocUnsafeSlow(PAGE_BYTES)
      this.#pages.push(memory)
      this.#pageBuffers.push(memory.buffer)
      this.#pageWords.push(new Int32Array(memory.buffer))
      this.#pageClass.push(cls)
      this.#classPages[cls]!++
      const size = CHUNK_BYTES[cls]!
      const free = this.#freeChunks[cls]!
      // Pushed last to first, so that chunks are handed out in address order.
      for (let at = Math.floor(PAGE_BYTES / size) * size - size; at >= 0; at -= size) free.push(page * PAGE_BYTES + at)
      return
    }
    let victim = this.#tail
    for (let i = 0; i < EVICTION_SEARCH && victim !== NONE; i++, victim = this.#meta[victim * STRIDE + PREV]!) {
      const page = this.#meta[victim * STRIDE + PAGE]!
      if (page < 0 || this.#pageClass[page] !== cls) continue
      this.#countEviction(victim, now)
      this.#unlink(victim)
      return
    }
  }

  #countEviction (id: number, now: number): void {
    const expires = this.#times[id * 2 + EXPIRES]!
    if (expires !== 0 && expires <= now) this.stats.reclaimed++
    else this.stats.evictions++
  }

  // Evicts least recently used items (never `keep`, which is at the head)
  // until the used bytes are within the limit. Expired ones at the tail
  // count as reclaimed, not evicted.
  #evictFor (keep: number, now: number): void {
    while (this.#usedBytes > this.memoryBytes) {
      const victim = this.#tail
      if (victim === NONE || victim === keep) return
      this.#countEviction(victim, now)
      this.#unlink(victim)
    }
  }

  // Takes the item out of the table and the LRU list and frees its memory.
  #unlink (id: number): void {
    const meta = this.#meta
    const m = id * STRIDE
    const bucket = meta[m + HASH]! & (this.#buckets.length - 1)
    let at = this.#buckets[bucket]!
    if (at === id) {
      this.#buckets[bucket] = meta[m + CHAIN]!
    } else {
      while (meta[at * STRIDE + CHAIN] !== id) at = meta[at * STRIDE + CHAIN]!
      meta[at * STRIDE + CHAIN] = meta[m + CHAIN]!
    }
    const prev = meta[m + PREV]!
    const next = meta[m + NEXT]!
    if (prev === NONE) this.#head = next
    else meta[prev * STRIDE + NEXT] = next
    if (next === NONE) this.#tail = prev
    else meta[next * STRIDE + PREV] = prev
    this.#count--
    this.#usedBytes -= meta[m + KEY_BYTES]! + meta[m + VALUE_BYTES]! + ITEM_OVERHEAD_BYTES
    const page = meta[m + PAGE]!
    if (page < 0) {
      this.#own[-1 - page] = undefined
      this.#freeOwn.push(-1 - page)
    } else {
      this.#freeChunks[this.#pageClass[page]!]!.push(page * PAGE_BYTES + meta[m + OFFSET]!)
    }
    this.#freeIds.push(id)
  }

  #pushHead (id: number): void {
    const meta = this.#meta
    const head = this.#head
    meta[id * STRIDE + PREV] = NONE
    meta[id * STRIDE + NEXT] = head
    if (head === NONE) this.#tail = id
    else meta[head * STRIDE + PREV] = id
    this.#head = id
  }

  // Moves an item to the hot end.
  #bump (id: number): void {
    if (id === this.#head) return
    const meta = this.#meta
    // Not the head, so prev is set.
    const prev = meta[id * STRIDE + PREV]!
    const next = meta[id * STRIDE + NEXT]!
    meta[prev * STRIDE + NEXT] = next
    if (next === NONE) this.#tail = prev
    else meta[next * STRIDE + PREV] = prev
    this.#pushHead(id)
  }

  #newId (): number {
    if (this.#freeIds.length === 0) this.#grow()
    return this.#freeIds.pop()!
  }

  // Doubles the fields' arrays; the new ids go on the free list.
  #grow (): void {
    const old = this.#capacity
    const capacity = Math.max(1024, old * 2)
    const meta = new Int32Array(capacity * STRIDE)
    meta.set(this.#meta)
    this.#meta = meta
    const times = new Float64Array(capacity * 2)
    times.set(this.#times)
    this.#times = times
    const flags = new Uint32Array(capacity)
    flags.set(this.#flags)
    this.#flags = flags
    this.#capacity = capacity
    for (let id = capacity - 1; id >= old; id--) this.#freeIds.push(id)
  }

  // Doubles the buckets (kept at least as many as the items).
  #rehash (): void {
    const meta = this.#meta
    const buckets = new Int32Array(this.#buckets.length * 2).fill(NONE)
    const mask = buckets.length - 1
    for (let id = this.#head; id !== NONE; id = meta[id * STRIDE + NEXT]!) {
      const bucket = meta[id * STRIDE + HASH]! & mask
      meta[id * STRIDE + CHAIN] = buckets[bucket]!
      buckets[bucket] = id
    }
    this.#buckets = buckets
  }

  // Everything goes: memory back to the runtime, fields reset.
  #clear (): void {
    this.#capacity = 0
    this.#meta = new Int32Array(0)
    this.#times = new Float64Array(0)
    this.#flags = new Uint32Array(0)
    this.#freeIds = []
    this.#buckets = new Int32Array(1024).fill(NONE)
    this.#count = 0
    this.#head = this.#tail = NONE
    this.#usedBytes = 0
    this.#pages = []
    this.#pageBuffers = []
    this.#pageWords = []
    this.#pageClass = []
    this.#freeChunks = CHUNK_BYTES.map(() => [])
    this.#classPages = CHUNK_BYTES.map(() => 0)
    this.#own = []
    this.#freeOwn = []
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

// A number's decimal digits (copied into the item's chunk).
function digitsOf (number: bigint): Buffer {
  return Buffer.from(number.toString(), 'latin1')
}
