/** The set commands (t_set.c): SADD, SPOP, SMEMBERS, SCARD. */
import { typedEntry, type HandlerTable, type RedisHandler } from './handler.js'
import { asNumber } from './arguments.js'
import { EMPTY_ARRAY, Errors } from './replies.js'
import { KeyType, SET_MEMBER_OVERHEAD_BYTES, type RedisStore } from './store.js'

/** The set commands' route names. */
export type SetCommandName = 'SADD' | 'SPOP' | 'SMEMBERS' | 'SCARD'

/** The set commands' handlers over `store`. */
export function setHandlers (store: RedisStore): HandlerTable<SetCommandName> {
  const sadd: RedisHandler = request => {
    const key = request.str(0)
    let entry = typedEntry(store, key, KeyType.SET)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) entry = store.create(key, KeyType.SET, new Set<string>(), 0)
    const members = entry.value as Set<string>
    let added = 0
    let bytes = 0
    for (let i = 1; i < request.argc; i++) {
      const member = request.str(i)
      if (members.has(member)) continue
      members.add(member)
      added++
      bytes += member.length + SET_MEMBER_OVERHEAD_BYTES
    }
    store.resize(entry, bytes)
    store.evict(entry)
    return added
  }

  const spop: RedisHandler = request => {
    if (request.argc > 2) return Errors.syntax
    let count = -1
    if (request.argc === 2) {
      const n = asNumber(request.int(1))
      if (n === null || n < 0) return Errors.notPositive
      count = n
    }
    const entry = typedEntry(store, request.str(0), KeyType.SET)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return count < 0 ? null : EMPTY_ARRAY
    const members = entry.value as Set<string>
    const want = count < 0 ? 1 : Math.min(count, members.size)
    const out: string[] = new Array(want)
    // One pass of one iterator (a Set has no random access, and restarting
    // its iteration for every pop walks again over the holes the pops left):
    // each member taken is a random one of the next few, never skipping so
    // many that fewer than the members still wanted are left.
    let taken = 0
    let left = members.size
    let skip = 0
    for (const member of members) {
      if (taken === want) break
      if (skip === 0) skip = Math.floor(Math.random() * Math.min(16, left - (want - taken) + 1)) + 1
      left--
      if (--skip > 0) continue
      members.delete(member)
      store.resize(entry, -(member.length + SET_MEMBER_OVERHEAD_BYTES))
      out[taken++] = member
    }
    if (members.size === 0) store.remove(entry)
    return count < 0 ? out[0] ?? null : out
  }

  const smembers: RedisHandler = request => {
    const entry = typedEntry(store, request.str(0), KeyType.SET)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? EMPTY_ARRAY : [...(entry.value as Set<string>)]
  }

  const scard: RedisHandler = request => {
    const entry = typedEntry(store, request.str(0), KeyType.SET)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? 0 : (entry.value as Set<string>).size
  }

  return {
    SADD: sadd,
    SPOP: spop,
    SMEMBERS: smembers,
    SCARD: scard
  }
}
