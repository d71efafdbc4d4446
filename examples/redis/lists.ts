/** The list commands (t_list.c): LPUSH, RPUSH, LPOP, RPOP, LRANGE, LLEN. */
import { typedEntry, type HandlerTable, type RedisHandler } from './handler.js'
import { asNumber, rangeOf } from './arguments.js'
import { EMPTY_ARRAY, Errors, arityError } from './replies.js'
import { NIL_ARRAY, type Reply } from './resp.js'
import { Deque, KeyType, LIST_ITEM_OVERHEAD_BYTES, type RedisStore } from './store.js'

/** The list commands' route names. */
export type ListCommandName = 'LPUSH' | 'RPUSH' | 'LPOP' | 'RPOP' | 'LRANGE' | 'LLEN'

/** The list commands' handlers over `store`. */
export function listHandlers (store: RedisStore): HandlerTable<ListCommandName> {
  const push = (left: boolean): RedisHandler => request => {
    const key = request.str(0)
    let entry = typedEntry(store, key, KeyType.LIST)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) entry = store.create(key, KeyType.LIST, new Deque<Buffer>(), 0)
    const list = entry.value as Deque<Buffer>
    let bytes = 0
    for (let i = 1; i < request.argc; i++) {
      const item = request.bytes(i)
      bytes += item.length + LIST_ITEM_OVERHEAD_BYTES
      if (left) list.unshift(item)
      else list.push(item)
    }
    store.resize(entry, bytes)
    store.evict(entry)
    return list.length
  }

  const pop = (left: boolean): RedisHandler => request => {
    let count = -1
    if (request.argc > 2) return arityError(left ? 'lpop' : 'rpop')
    if (request.argc === 2) {
      const n = asNumber(request.int(1))
      if (n === null || n < 0) return Errors.notPositive
      count = n
    }
    const entry = typedEntry(store, request.str(0), KeyType.LIST)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return count < 0 ? null : NIL_ARRAY
    const list = entry.value as Deque<Buffer>
    const take = (): Buffer => {
      const item = (left ? list.shift() : list.pop())!
      store.resize(entry, -(item.length + LIST_ITEM_OVERHEAD_BYTES))
      return item
    }
    let reply: Reply
    if (count < 0) {
      reply = take()
    } else {
      const out: Buffer[] = []
      while (out.length < count && list.length > 0) out.push(take())
      reply = out
    }
    if (list.length === 0) store.remove(entry)
    return reply
  }

  const lrange: RedisHandler = request => {
    const start = asNumber(request.int(1))
    const stop = asNumber(request.int(2))
    if (start === null || stop === null) return Errors.notInteger
    const entry = typedEntry(store, request.str(0), KeyType.LIST)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return EMPTY_ARRAY
    const list = entry.value as Deque<Buffer>
    const range = rangeOf(start, stop, list.length)
    if (range === null) return EMPTY_ARRAY
    const out: Buffer[] = new Array(range[1] - range[0] + 1)
    for (let i = range[0]; i <= range[1]; i++) out[i - range[0]] = list.at(i)
    return out
  }

  const llen: RedisHandler = request => {
    const entry = typedEntry(store, request.str(0), KeyType.LIST)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? 0 : (entry.value as Deque<Buffer>).length
  }

  return {
    LPUSH: push(true),
    RPUSH: push(false),
    LPOP: pop(true),
    RPOP: pop(false),
    LRANGE: lrange,
    LLEN: llen
  }
}
