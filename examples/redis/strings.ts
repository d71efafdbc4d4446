/**
 * The string commands (t_string.c): SET and its options, GET, GETSET, the
 * INCR family on 64-bit integers, APPEND, STRLEN, MGET, MSET.
 */
import type { HandlerTable, RedisHandler } from './handler.js'
import { asNumber } from './arguments.js'
import { Errors, arityError } from './replies.js'
import { OK, error, parseInteger, type Reply, type RespRequest } from './resp.js'
import { KeyType, VALUE_OVERHEAD_BYTES, type Entry, type RedisStore } from './store.js'

/** The string commands' route names. */
export type StringCommandName = 'SET' | 'GET' | 'GETSET' | 'INCR' | 'INCRBY' | 'DECR' | 'DECRBY' | 'APPEND' | 'STRLEN' | 'MGET' | 'MSET'

const LLONG_MAX = 0x7fffffffffffffffn
const LLONG_MIN = -0x8000000000000000n
const MAX_SAFE = Number.MAX_SAFE_INTEGER

/** A string value's integer (Redis's string2ll on its bytes), or null. */
function intValue (value: Buffer): number | bigint | null {
  return parseInteger(value, 0, value.length)
}

/** a + b within a signed 64-bit integer, or null when it overflows. */
function add64 (a: number | bigint, b: number | bigint): number | bigint | null {
  if (typeof a === 'number' && typeof b === 'number') {
    const sum = a + b
    if (sum <= MAX_SAFE && sum >= -MAX_SAFE) return sum
  }
  const sum = BigInt(a) + BigInt(b)
  if (sum > LLONG_MAX || sum < LLONG_MIN) return null
  return Number.isSafeInteger(Number(sum)) ? Number(sum) : sum
}

function digitsBuffer (n: number | bigint): Buffer {
  return Buffer.from(String(n), 'latin1')
}

/** The string commands' handlers over `store`. */
export function stringHandlers (store: RedisStore): HandlerTable<StringCommandName> {
  const setString = (key: string, value: Buffer, keepTtl = false): Entry => {
    const old = store.get(key)
    let entry: Entry
    if (old !== undefined && old.type === KeyType.STRING) {
      store.replaceString(old, value)
      if (!keepTtl && old.expiresAt !== 0) store.expire(old, 0)
      entry = old
    } else {
      entry = store.create(key, KeyType.STRING, value, value.length + VALUE_OVERHEAD_BYTES)
    }
    return entry
  }

  const set: RedisHandler = request => {
    const argc = request.argc
    let nx = false
    let xx = false
    let get = false
    let keepTtl = false
    let expiry = -1
    let expiryArg = -1
    let unit = 0
    let absolute = false
    for (let i = 2; i < argc; i++) {
      const next = i + 1 < argc
      if (request.is(i, 'nx') && !xx) nx = true
      else if (request.is(i, 'xx') && !nx) xx = true
      else if (request.is(i, 'get')) get = true
      else if (request.is(i, 'keepttl') && expiryArg < 0) keepTtl = true
      else if (next && expiryArg < 0 && !keepTtl && (request.is(i, 'ex') || request.is(i, 'px') || request.is(i, 'exat') || request.is(i, 'pxat'))) {
        unit = request.is(i, 'ex') || request.is(i, 'exat') ? 1000 : 1
        absolute = request.is(i, 'exat') || request.is(i, 'pxat')
        expiryArg = ++i
      } else return Errors.syntax
    }
    if (expiryArg >= 0) {
      const n = asNumber(request.int(expiryArg))
      if (n === null) return Errors.notInteger
      if (n <= 0) return error('ERR invalid expire time in \'set\' command')
      // EXAT and PXAT are unix times; the store's clock is Date.now in production.
      expiry = absolute ? n * unit : store.now() + n * unit
    }
    const key = request.str(0)
    const old = store.get(key)
    let previous: Reply = null
    if (get) {
      if (old !== undefined && old.type !== KeyType.STRING) return Errors.wrongType
      previous = old === undefined ? null : old.value as Buffer
    }
    if ((nx && old !== undefined) || (xx && old === undefined)) return get ? previous : null
    const entry = setString(key, request.bytes(1), keepTtl)
    if (expiry >= 0) store.expire(entry, expiry)
    store.evict(entry)
    return get ? previous : OK
  }

  const get: RedisHandler = request => {
    const entry = store.counted(store.get(request.str(0)))
    if (entry === undefined) return null
    if (entry.type !== KeyType.STRING) return Errors.wrongType
    return entry.value as Buffer
  }

  const getset: RedisHandler = request => {
    const key = request.str(0)
    const old = store.get(key)
    if (old !== undefined && old.type !== KeyType.STRING) return Errors.wrongType
    const previous = old === undefined ? null : old.value as Buffer
    const entry = setString(key, request.bytes(1))
    store.evict(entry)
    return previous
  }

  const incrBy = (request: RespRequest, delta: number | bigint): Reply => {
    const key = request.str(0)
    const entry = store.get(key)
    let current: number | bigint = 0
    if (entry !== undefined) {
      if (entry.type !== KeyType.STRING) return Errors.wrongType
      const value = intValue(entry.value as Buffer)
      if (value === null) return Errors.notInteger
      current = value
    }
    const next = add64(current, delta)
    if (next === null) return Errors.overflow
    const digits = digitsBuffer(next)
    if (entry !== undefined) store.replaceString(entry, digits)
    else store.evict(store.create(key, KeyType.STRING, digits, digits.length + VALUE_OVERHEAD_BYTES))
    return next
  }

  const incrByArg = (negate: boolean): RedisHandler => request => {
    const delta = request.int(1)
    if (delta === null) return Errors.notInteger
    if (negate) {
      if (delta === LLONG_MIN) return Errors.decrementOverflow
      return incrBy(request, typeof delta === 'bigint' ? -delta : -delta)
    }
    return incrBy(request, delta)
  }

  const append: RedisHandler = request => {
    const key = request.str(0)
    const entry = store.get(key)
    if (entry === undefined) {
      const value = request.bytes(1)
      store.evict(store.create(key, KeyType.STRING, value, value.length + VALUE_OVERHEAD_BYTES))
      return value.length
    }
    if (entry.type !== KeyType.STRING) return Errors.wrongType
    const old = entry.value as Buffer
    const joined = Buffer.allocUnsafe(old.length + request.length(1))
    old.copy(joined, 0)
    request.buf.copy(joined, old.length, request.ranges[2], request.ranges[3])
    store.replaceString(entry, joined)
    store.evict(entry)
    return joined.length
  }

  const strlen: RedisHandler = request => {
    const entry = store.get(request.str(0))
    if (entry === undefined) return 0
    if (entry.type !== KeyType.STRING) return Errors.wrongType
    return (entry.value as Buffer).length
  }

  const mget: RedisHandler = request => {
    const out: Reply[] = new Array(request.argc)
    for (let i = 0; i < request.argc; i++) {
      const entry = store.counted(store.get(request.str(i)))
      out[i] = entry === undefined || entry.type !== KeyType.STRING ? null : entry.value as Buffer
    }
    return out
  }

  const mset: RedisHandler = request => {
    if (request.argc % 2 !== 0) return arityError('mset')
    for (let i = 0; i < request.argc; i += 2) store.evict(setString(request.str(i), request.bytes(i + 1)))
    return OK
  }

  return {
    SET: set,
    GET: get,
    GETSET: getset,
    INCR: request => incrBy(request, 1),
    INCRBY: incrByArg(false),
    DECR: request => incrBy(request, -1),
    DECRBY: incrByArg(true),
    APPEND: append,
    STRLEN: strlen,
    MGET: mget,
    MSET: mset
  }
}
