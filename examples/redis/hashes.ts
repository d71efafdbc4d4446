/** The hash commands (t_hash.c): HSET, HGET, HDEL, HGETALL. */
import { typedEntry, type HandlerTable, type RedisHandler } from './handler.js'
import { EMPTY_ARRAY, Errors, arityError } from './replies.js'
import type { Reply } from './resp.js'
import { HASH_FIELD_OVERHEAD_BYTES, KeyType, type RedisStore } from './store.js'

/** The hash commands' route names. */
export type HashCommandName = 'HSET' | 'HGET' | 'HDEL' | 'HGETALL'

/** The hash commands' handlers over `store`. */
export function hashHandlers (store: RedisStore): HandlerTable<HashCommandName> {
  const hset: RedisHandler = request => {
    if (request.argc % 2 === 0) return arityError('hset')
    const key = request.str(0)
    let entry = typedEntry(store, key, KeyType.HASH)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) entry = store.create(key, KeyType.HASH, new Map<string, Buffer>(), 0)
    const fields = entry.value as Map<string, Buffer>
    let added = 0
    let bytes = 0
    for (let i = 1; i < request.argc; i += 2) {
      const field = request.str(i)
      const value = request.bytes(i + 1)
      const old = fields.get(field)
      if (old === undefined) {
        added++
        bytes += field.length + value.length + HASH_FIELD_OVERHEAD_BYTES
      } else {
        bytes += value.length - old.length
      }
      fields.set(field, value)
    }
    store.resize(entry, bytes)
    store.evict(entry)
    return added
  }

  const hget: RedisHandler = request => {
    const entry = typedEntry(store, request.str(0), KeyType.HASH)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? null : (entry.value as Map<string, Buffer>).get(request.str(1)) ?? null
  }

  const hdel: RedisHandler = request => {
    const entry = typedEntry(store, request.str(0), KeyType.HASH)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return 0
    const fields = entry.value as Map<string, Buffer>
    let removed = 0
    for (let i = 1; i < request.argc; i++) {
      const field = request.str(i)
      const old = fields.get(field)
      if (old === undefined) continue
      fields.delete(field)
      store.resize(entry, -(field.length + old.length + HASH_FIELD_OVERHEAD_BYTES))
      removed++
    }
    if (fields.size === 0) store.remove(entry)
    return removed
  }

  const hgetall: RedisHandler = request => {
    const entry = typedEntry(store, request.str(0), KeyType.HASH)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return EMPTY_ARRAY
    const out: Reply[] = []
    for (const [field, value] of entry.value as Map<string, Buffer>) out.push(field, value)
    return out
  }

  return {
    HSET: hset,
    HGET: hget,
    HDEL: hdel,
    HGETALL: hgetall
  }
}
