import type { Address } from '../balancer.js'

/**
 * Which of a name's resolved addresses a client uses when there are more
 * than it may connect to (`maxResolvedAddresses`): a subset drawn by
 * rendezvous hashing, as gRPC's and Envoy's subsetting draw theirs. Each
 * address is ranked by a hash of the client's seed and the address; the
 * `max` lowest ranks are kept. So the subset is random across clients (the
 * load spreads over all the addresses), the same for one client whatever
 * order the addresses come in, and when a resolution changes it is drawn
 * again with the fewest changes: an address kept stays unless a new one
 * outranks it, and only a removed address's place is drawn anew.
 */
export function subsetAddresses (addresses: readonly Address[], max: number, seed: number): Address[] {
  if (addresses.length <= max) return [...addresses]
  const ranked = addresses.map((address) => ({ address, rank: rankOf(address, seed) }))
  // Ties (a 32-bit hash collision) are broken by the address itself, so the order never depends on the input's.
  ranked.sort((a, b) => a.rank - b.rank || compareAddresses(a.address, b.address))
  return ranked.slice(0, max).map((r) => r.address)
}

/** A 32-bit hash of `seed` and the address (FNV-1a, then murmur3's finalizer to spread the bits). */
function rankOf (address: Address, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0
  const text = `${address.host}:${address.port}`
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i)
    h = Math.imul(h, 0x01000193)
  }
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

function compareAddresses (a: Address, b: Address): number {
  return a.host < b.host ? -1 : a.host > b.host ? 1 : a.port - b.port
}
