// A seeded PRNG (mulberry32), a hash to derive one per episode, and weighted choice.


/** mulberry32: small, fast, and the same sequence for the same seed on every run. */
export class Rng {
  #a: number

  constructor (seed: number) {
    this.#a = seed >>> 0
  }

  u32 (): number {
    this.#a = (this.#a + 0x6d2b79f5) >>> 0
    let x = this.#a
    x = Math.imul(x ^ (x >>> 15), x | 1)
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61)
    return (x ^ (x >>> 14)) >>> 0
  }

  float (): number {
    return this.u32() / 4294967296
  }

  /** An integer in [0, n). */
  int (n: number): number {
    return Math.floor(this.float() * n)
  }

  /** An integer in [lo, hi]. */
  range (lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1)
  }

  chance (p: number): boolean {
    return this.float() < p
  }

  pick<T> (items: readonly T[]): T {
    return items[this.int(items.length)]!
  }

  bytes (n: number): Buffer {
    const out = Buffer.allocUnsafe(n)
    for (let i = 0; i < n; i += 4) {
      const v = this.u32()
      out[i] = v
      if (i + 1 < n) out[i + 1] = v >>> 8
      if (i + 2 < n) out[i + 2] = v >>> 16
      if (i + 3 < n) out[i + 3] = v >>> 24
    }
    return out
  }
}

/** A 32-bit hash of a few integers (murmur3's finalizer over a running mix). */
export function mix (...parts: number[]): number {
  let h = 0x9e3779b9
  for (const p of parts) {
    h = Math.imul(h ^ (p >>> 0), 0x85ebca6b)
    h ^= h >>> 13
    h = Math.imul(h, 0xc2b2ae35)
    h ^= h >>> 16
  }
  return h >>> 0
}

/** Picks by weight: `[[weight, value], ...]`. */
export class Weighted<T> {
  readonly #items: ReadonlyArray<readonly [number, T]>
  readonly #total: number

  constructor (items: ReadonlyArray<readonly [number, T]>) {
    this.#items = items
    this.#total = items.reduce((sum, [w]) => sum + w, 0)
  }

  pick (rng: Rng): T {
    let r = rng.float() * this.#total
    for (const [w, value] of this.#items) {
      if (r < w) return value
      r -= w
    }
    return this.#items[this.#items.length - 1]![1]
  }
}
