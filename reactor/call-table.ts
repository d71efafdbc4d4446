/**
 * A connection's calls by call id: the client's outstanding calls, the
 * server's calls in flight.
 *
 * Why not a `Map`: V8 keeps a Map's entries in an ordered hash table that
 * it replaces when it rehashes, and the replaced table keeps a pointer to
 * its successor (for iterators still walking it) and the entries it held.
 * Call ids only rise, so a Map with 100 calls outstanding rehashes every
 * hundred-odd calls. Once one of its tables is in the old generation (a
 * full GC moves every live young object there), each replaced table keeps
 * the next one alive through every scavenge, with the calls it holds and
 * their promises, requests and responses: everything gets promoted until
 * the next full GC, which seeds the chain again. Measured in `nyala bench`'s
 * load process (100 calls outstanding): scavenges of 6-12 ms promoting
 * ~2.6 MB each instead of 0.5 ms promoting nothing, and the client's CPU per
 * call doubled. A synthetic churn of 100 live entries: 5.2 M operations in
 * 3 s with a Map, 20.4 M with this table.
 *
 * Open addressing: linear probing from a Fibonacci hash of the id, at most
 * half full; deletion shifts the entries that follow back (no tombstones),
 * so steady churn allocates nothing. The table is rebuilt into new arrays,
 * which keep no link to the old ones, when it grows past half full or,
 * above 256 slots, falls below an eighth.
 */
const MIN_CAPACITY = 16
// Tables up to this size never shrink: a connection whose calls come and go
// in bursts (all of a read's responses, then as many new calls) would
// otherwise shrink and grow again on every read.
const SHRINK_FLOOR = 256

export class CallTable<T> {
  #keys: Int32Array
  #values: Array<T | undefined>
  #mask: number
  #shift: number
  #size = 0

  constructor (capacity = MIN_CAPACITY) {
    const bits = Math.max(4, Math.ceil(Math.log2(Math.max(MIN_CAPACITY, capacity))))
    this.#keys = new Int32Array(1 << bits)
    this.#values = new Array<T | undefined>(1 << bits).fill(undefined)
    this.#mask = (1 << bits) - 1
    this.#shift = 32 - bits
  }

  get size (): number {
    return this.#size
  }

  /** Slots allocated (a power of two, at least twice the size). */
  get capacity (): number {
    return this.#values.length
  }

  // Fibonacci hashing: rising ids land far apart, so probes stay short.
  #home (id: number): number {
    return Math.imul(id, 0x9e3779b1) >>> this.#shift
  }

  #find (id: number): number {
    const keys = this.#keys
    const values = this.#values
    const mask = this.#mask
    for (let i = this.#home(id); values[i] !== undefined; i = (i + 1) & mask) {
      if (keys[i] === id) return i
    }
    return -1
  }

  get (id: number): T | undefined {
    const i = this.#find(id)
    return i < 0 ? undefined : this.#values[i]
  }

  has (id: number): boolean {
    return this.#find(id) >= 0
  }

  /** Adds or replaces the call with `id` (a 32-bit signed integer). */
  set (id: number, value: T): void {
    // Small on purpose: it is inlined into the client's call path, where
    // V8's inlining budget is short (the rare cases are calls out).
    if ((id | 0) !== id || value === undefined) badEntry(id)
    if ((this.#size + 1) * 2 > this.#values.length) this.#resize(this.#values.length * 2)
    const keys = this.#keys
    const values = this.#values
    const mask = this.#mask
    // One probe: the id's slot if present, else the free slot that ends its run.
    let i = this.#home(id)
    for (; values[i] !== undefined; i = (i + 1) & mask) {
      if (keys[i] === id) {
        values[i] = value
        return
      }
    }
    keys[i] = id
    values[i] = value
    this.#size++
  }

  /** Removes the call with `id`; false if there was none. */
  delete (id: number): boolean {
    const i = this.#find(id)
    if (i < 0) return false
    this.#removeAt(i)
    return true
  }

  /** Removes and returns the call with `id` (one probe, where get and delete take two); undefined if there was none. */
  take (id: number): T | undefined {
    const i = this.#find(id)
    if (i < 0) return undefined
    const value = this.#values[i]
    this.#removeAt(i)
    return value
  }

  #removeAt (i: number): void {
    const keys = this.#keys
    const values = this.#values
    const mask = this.#mask
    // Backward-shift deletion: an entry after the hole moves into it unless
    // its home lies cyclically in (hole, entry], where probing still finds it.
    for (let j = i; ;) {
      values[i] = undefined
      for (;;) {
        j = (j + 1) & mask
        if (values[j] === undefined) {
          this.#size--
          if (values.length > SHRINK_FLOOR && this.#size * 8 < values.length) this.#resize(values.length / 2)
          return
        }
        const home = this.#home(keys[j]!)
        const stays = i <= j ? (i < home && home <= j) : (i < home || home <= j)
        if (!stays) break
      }
      keys[i] = keys[j]!
      values[i] = values[j]
      i = j
    }
  }

  /** The calls, in no particular order (a copy: the table may change while they are handled). */
  values (): T[] {
    const out: T[] = []
    for (const value of this.#values) if (value !== undefined) out.push(value)
    return out
  }

  clear (): void {
    if (this.#size === 0) return
    this.#keys = new Int32Array(MIN_CAPACITY)
    this.#values = new Array<T | undefined>(MIN_CAPACITY).fill(undefined)
    this.#mask = MIN_CAPACITY - 1
    this.#shift = 32 - Math.log2(MIN_CAPACITY)
    this.#size = 0
  }

  #resize (capacity: number): void {
    const keys = this.#keys
    const values = this.#values
    const bits = Math.log2(capacity)
    this.#keys = new Int32Array(capacity)
    this.#values = new Array<T | undefined>(capacity).fill(undefined)
    this.#mask = capacity - 1
    this.#shift = 32 - bits
    const mask = this.#mask
    for (let k = 0; k < values.length; k++) {
      const value = values[k]
      if (value === undefined) continue
      let i = this.#home(keys[k]!)
      while (this.#values[i] !== undefined) i = (i + 1) & mask
      this.#keys[i] = keys[k]!
      this.#values[i] = value
    }
  }
}

function badEntry (id: number): never {
  if ((id | 0) !== id) throw new RangeError(`CallTable: call id ${id} is not a 32-bit integer`)
  throw new TypeError('CallTable: undefined is not a value')
}
