/**
 * The commands on keys whatever they hold (db.c, expire.c): DEL, EXISTS,
 * the expiry commands, KEYS, DBSIZE, the flushes, TYPE.
 */
import type { HandlerTable, RedisHandler } from './handler.js'
import { asNumber } from './arguments.js'
import { compiledGlob } from './glob.js'
import { Errors } from './replies.js'
import { OK, error, simple, type Reply, type RespRequest } from './resp.js'
import { TYPE_NAMES, type RedisStore } from './store.js'

/** The key commands' route names. */
export type KeyCommandName = 'DEL' | 'EXISTS' | 'EXPIRE' | 'PEXPIRE' | 'TTL' | 'PTTL' | 'PERSIST' | 'KEYS' | 'DBSIZE' | 'FLUSHDB' | 'FLUSHALL' | 'TYPE'

const TYPE_REPLIES = [...TYPE_NAMES, 'none'].map(name => simple(name))

/** The key commands' handlers over `store`. */
export function keyHandlers (store: RedisStore): HandlerTable<KeyCommandName> {
  // The absolute expiry time of SET's and EXPIRE's argument (`unit` ms per unit), or an error.
  const expiryOf = (request: RespRequest, i: number, unit: number, name: string): number | Reply => {
    const n = asNumber(request.int(i))
    if (n === null) return Errors.notInteger
    if (n <= 0 && name === 'set') return error(`ERR invalid expire time in '${name}' command`)
    const at = store.now() + n * unit
    if (!Number.isFinite(at) || Math.abs(n) > 9.2e15 / unit) return error(`ERR invalid expire time in '${name}' command`)
    return at
  }

  const del: RedisHandler = request => {
    let n = 0
    for (let i = 0; i < request.argc; i++) if (store.delete(request.str(i))) n++
    return n
  }

  const exists: RedisHandler = request => {
    let n = 0
    for (let i = 0; i < request.argc; i++) if (store.get(request.str(i)) !== undefined) n++
    return n
  }

  // EXPIRE and PEXPIRE key time [NX | XX | GT | LT] (expire.c).
  const expire = (unit: number, name: string): RedisHandler => request => {
    let nx = false
    let xx = false
    let gt = false
    let lt = false
    for (let i = 2; i < request.argc; i++) {
      if (request.is(i, 'nx')) nx = true
      else if (request.is(i, 'xx')) xx = true
      else if (request.is(i, 'gt')) gt = true
      else if (request.is(i, 'lt')) lt = true
      else return error(`ERR Unsupported option ${request.str(i)}`)
    }
    if (nx && (xx || gt || lt)) return error('ERR NX and XX, GT or LT options at the same time are not compatible')
    if (gt && lt) return error('ERR GT and LT options at the same time are not compatible')
    const at = expiryOf(request, 1, unit, name)
    if (typeof at !== 'number') return at
    const entry = store.get(request.str(0))
    if (entry === undefined) return 0
    const current = entry.expiresAt
    // A key without a time to live counts as an infinite one for GT and LT.
    if ((nx && current !== 0) || (xx && current === 0) ||
      (gt && (current === 0 || at <= current)) || (lt && current !== 0 && at >= current)) return 0
    if (at <= store.now()) {
      store.remove(entry)
      return 1
    }
    store.expire(entry, at)
    return 1
  }

  const ttl = (ms: boolean): RedisHandler => request => {
    const entry = store.get(request.str(0))
    if (entry === undefined) return -2
    if (entry.expiresAt === 0) return -1
    const left = Math.max(0, entry.expiresAt - store.now())
    return ms ? Math.round(left) : Math.floor((left + 500) / 1000)
  }

  const persist: RedisHandler = request => {
    const entry = store.get(request.str(0))
    if (entry === undefined || entry.expiresAt === 0) return 0
    store.expire(entry, 0)
    return 1
  }

  const keys: RedisHandler = request => {
    const pattern = request.str(0)
    const all = store.keys()
    // As in Redis, a lone `*` takes every key without matching (so also the empty key, which no pattern but '' matches).
    if (pattern === '*') return all
    const glob = compiledGlob(pattern)
    return all.filter(key => glob.matches(key))
  }

  const flush: RedisHandler = request => {
    if (request.argc > 1 || (request.argc === 1 && !request.is(0, 'async') && !request.is(0, 'sync'))) return Errors.syntax
    store.flush()
    return OK
  }

  const typeOf: RedisHandler = request => {
    const entry = store.get(request.str(0))
    return TYPE_REPLIES[entry === undefined ? 5 : entry.type]!
  }

  return {
    DEL: del,
    EXISTS: exists,
    EXPIRE: expire(1000, 'expire'),
    PEXPIRE: expire(1, 'pexpire'),
    TTL: ttl(false),
    PTTL: ttl(true),
    PERSIST: persist,
    KEYS: keys,
    // Like Redis, the keys in the table: expired ones not yet deleted count.
    DBSIZE: () => store.size,
    FLUSHDB: flush,
    FLUSHALL: flush,
    TYPE: typeOf
  }
}
