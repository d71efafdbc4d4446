import { COMMANDS, UNKNOWN_COMMAND, type Command, type CommandName } from './commands.js'
import { globMatch } from './glob.js'
import { PubSub, SUBSCRIBED_MODE_COMMANDS, pubsubHandlers, subscribedModeRefusal, subscribedPing, type PubSubCallContext, type PubSubCommandName } from './pubsub.js'
import { NIL_ARRAY, OK, PONG, error, oneLine, parseInteger, simple, type ConnectionState, type Reply, type RespRequest } from './resp.js'
import {
  Deque, HASH_FIELD_OVERHEAD_BYTES, KeyType, LIST_ITEM_OVERHEAD_BYTES, SET_MEMBER_OVERHEAD_BYTES, SortedSet, TYPE_NAMES,
  VALUE_OVERHEAD_BYTES, ZSET_MEMBER_OVERHEAD_BYTES, type Entry, type RedisStore
} from './store.js'

export { globMatch } from './glob.js'

/**
 * The commands, one synchronous handler per route, over one `RedisStore`.
 * Answers and errors are Redis 7's, word for word (t_string.c, t_list.c,
 * t_set.c, t_hash.c, t_zset.c, expire.c, db.c, server.c): a handler that
 * cannot do what it was asked returns Redis's error reply, never throws.
 */

/**
 * What a handler needs of its call: closing the connection after its answer
 * (QUIT), the connection's `ConnectionState` (the protocol's
 * `connectionState`; the server's context types it `unknown`), and for
 * Pub/Sub the connection's handle and streamed parts.
 */
export interface RedisCallContext extends PubSubCallContext {
  closeConnection (): void
}

export type RedisHandler = (request: RespRequest, ctx: RedisCallContext) => Reply

export interface RedisHandlerOptions {
  /** INFO's redis_version and HELLO's version; default 7.0.0. */
  version?: string
  /** The port, for INFO. */
  port?: () => number
  /** Connections open, for INFO (connected_clients). */
  connectedClients?: () => number
  /** CONFIG GET's proto-max-bulk-len. */
  protoMaxBulkLen?: number
  /** The channels and patterns (one per server, as the store); default a registry of its own. */
  pubsub?: PubSub
}

export const Errors = {
  wrongType: error('WRONGTYPE Operation against a key holding the wrong kind of value'),
  notInteger: error('ERR value is not an integer or out of range'),
  notFloat: error('ERR value is not a valid float'),
  syntax: error('ERR syntax error'),
  overflow: error('ERR increment or decrement would overflow'),
  decrementOverflow: error('ERR decrement would overflow'),
  notPositive: error('ERR value is out of range, must be positive'),
  dbIndex: error('ERR DB index is out of range'),
  noProto: error('NOPROTO unsupported protocol version'),
  protoVersion: error('ERR Protocol version is not an integer or out of range'),
  clientName: error('ERR Client names cannot contain spaces, newlines or special characters.')
} as const

/** Redis's rule for a client name (CLIENT SETNAME, HELLO SETNAME): printable ASCII, no space. */
function validClientName (name: string): boolean {
  for (let k = 0; k < name.length; k++) {
    const c = name.charCodeAt(k)
    if (c < 0x21 || c > 0x7e) return false
  }
  return true
}

const ARITY_ERRORS = new Map<string, Reply>()

/** `-ERR wrong number of arguments for 'name' command` (subcommands as `client|setname`). */
export function arityError (name: string): Reply {
  let reply = ARITY_ERRORS.get(name)
  if (reply === undefined) {
    reply = error(`ERR wrong number of arguments for '${name}' command`)
    ARITY_ERRORS.set(name, reply)
  }
  return reply
}

function arityOk (arity: number, argc: number): boolean {
  // Redis counts the command name.
  return arity >= 0 ? argc + 1 === arity : argc + 1 >= -arity
}

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

/** A score as Redis 7.0 prints a double in RESP2 (%.17g; inf, -inf). */
export function formatScore (score: number): string {
  if (score === Infinity) return 'inf'
  if (score === -Infinity) return '-inf'
  if (Number.isInteger(score) && Math.abs(score) < 1e17) return String(score)
  const exponential = score.toExponential(16)
  const e = exponential.indexOf('e')
  const exponent = Number(exponential.slice(e + 1))
  if (exponent < -4 || exponent >= 17) {
    let mantissa = exponential.slice(0, e)
    if (mantissa.includes('.')) mantissa = mantissa.replace(/0+$/, '').replace(/\.$/, '')
    const abs = Math.abs(exponent)
    return `${mantissa}e${exponent < 0 ? '-' : '+'}${abs < 10 ? '0' : ''}${abs}`
  }
  let fixed = score.toFixed(Math.max(0, 16 - exponent))
  if (fixed.includes('.')) fixed = fixed.replace(/0+$/, '').replace(/\.$/, '')
  return fixed
}

/** A score argument as Redis reads it (strtod, inf and -inf), or null. */
function parseScore (text: string): number | null {
  const lower = text.toLowerCase()
  if (lower === 'inf' || lower === '+inf' || lower === 'infinity' || lower === '+infinity') return Infinity
  if (lower === '-inf' || lower === '-infinity') return -Infinity
  if (text.length === 0 || /\s/.test(text[0]!) || !/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(text)) return null
  const value = Number(text)
  return Number.isNaN(value) ? null : value
}

/** LRANGE's and ZRANGE's index arithmetic: [start, end] inclusive within [0, length), or null when empty. */
function rangeOf (start: number, stop: number, length: number): [number, number] | null {
  if (start < 0) start += length
  if (stop < 0) stop += length
  if (start < 0) start = 0
  if (start > stop || start >= length) return null
  if (stop >= length) stop = length - 1
  return [start, stop]
}

function asNumber (n: number | bigint | null): number | null {
  if (n === null) return null
  return typeof n === 'bigint' ? Number(n) : n
}

/** The handlers of every command, by route name, and of the internal route (an unknown command). */
export function redisHandlers (store: RedisStore, options: RedisHandlerOptions = {}): Record<string, RedisHandler> {
  const version = options.version ?? '7.0.0'
  const startedAt = Date.now()

  // The key's entry if it holds `type`; undefined when absent.
  // (null: it holds another type, answered WRONGTYPE.)
  const typed = (key: string, type: KeyType): Entry | undefined | null => {
    const entry = store.get(key)
    if (entry !== undefined && entry.type !== type) return null
    return entry
  }

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

  // The absolute expiry time of SET's and EXPIRE's argument (`unit` ms per unit), or an error.
  const expiryOf = (request: RespRequest, i: number, unit: number, name: string): number | Reply => {
    const n = asNumber(request.int(i))
    if (n === null) return Errors.notInteger
    if (n <= 0 && name === 'set') return error(`ERR invalid expire time in '${name}' command`)
    const at = store.now() + n * unit
    if (!Number.isFinite(at) || Math.abs(n) > 9.2e15 / unit) return error(`ERR invalid expire time in '${name}' command`)
    return at
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
    return pattern === '*' ? all : all.filter(key => globMatch(pattern, key))
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

  // Lists.
  const push = (left: boolean): RedisHandler => request => {
    const key = request.str(0)
    let entry = typed(key, KeyType.LIST)
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
    const entry = typed(request.str(0), KeyType.LIST)
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
    const entry = typed(request.str(0), KeyType.LIST)
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
    const entry = typed(request.str(0), KeyType.LIST)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? 0 : (entry.value as Deque<Buffer>).length
  }

  // Sets.
  const sadd: RedisHandler = request => {
    const key = request.str(0)
    let entry = typed(key, KeyType.SET)
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
    const entry = typed(request.str(0), KeyType.SET)
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
    const entry = typed(request.str(0), KeyType.SET)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? EMPTY_ARRAY : [...(entry.value as Set<string>)]
  }

  const scard: RedisHandler = request => {
    const entry = typed(request.str(0), KeyType.SET)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? 0 : (entry.value as Set<string>).size
  }

  // Hashes.
  const hset: RedisHandler = request => {
    if (request.argc % 2 === 0) return arityError('hset')
    const key = request.str(0)
    let entry = typed(key, KeyType.HASH)
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
    const entry = typed(request.str(0), KeyType.HASH)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? null : (entry.value as Map<string, Buffer>).get(request.str(1)) ?? null
  }

  const hdel: RedisHandler = request => {
    const entry = typed(request.str(0), KeyType.HASH)
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
    const entry = typed(request.str(0), KeyType.HASH)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return EMPTY_ARRAY
    const out: Reply[] = []
    for (const [field, value] of entry.value as Map<string, Buffer>) out.push(field, value)
    return out
  }

  // Sorted sets.
  const zadd: RedisHandler = request => {
    let nx = false
    let xx = false
    let gt = false
    let lt = false
    let ch = false
    let incr = false
    let i = 1
    for (; i < request.argc; i++) {
      if (request.is(i, 'nx')) nx = true
      else if (request.is(i, 'xx')) xx = true
      else if (request.is(i, 'gt')) gt = true
      else if (request.is(i, 'lt')) lt = true
      else if (request.is(i, 'ch')) ch = true
      else if (request.is(i, 'incr')) incr = true
      else break
    }
    const pairs = request.argc - i
    if (pairs === 0 || pairs % 2 !== 0) return Errors.syntax
    if (nx && xx) return error('ERR XX and NX options at the same time are not compatible')
    if ((gt && nx) || (lt && nx) || (gt && lt)) return error('ERR GT, LT, and/or NX options at the same time are not compatible')
    if (incr && pairs > 2) return error('ERR INCR option supports a single increment-element pair')
    const scores: number[] = []
    for (let k = i; k < request.argc; k += 2) {
      const score = parseScore(request.str(k))
      if (score === null) return Errors.notFloat
      scores.push(score)
    }
    const key = request.str(0)
    let entry = typed(key, KeyType.ZSET)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) {
      if (xx) return incr ? null : 0
      entry = store.create(key, KeyType.ZSET, new SortedSet(), 0)
    }
    const zset = entry.value as SortedSet
    let added = 0
    let changed = 0
    let incrResult: number | null = null
    for (let k = i, s = 0; k < request.argc; k += 2, s++) {
      const member = request.str(k + 1)
      const old = zset.scores.get(member)
      let score = scores[s]!
      if (old === undefined) {
        if (xx) continue
      } else {
        if (nx) continue
        if (incr) score += old
        if (Number.isNaN(score)) return error('ERR resulting score is not a number (NaN)')
        if ((gt && score <= old) || (lt && score >= old)) continue
      }
      if (zset.set(member, score)) {
        added++
        store.resize(entry, member.length + ZSET_MEMBER_OVERHEAD_BYTES)
      } else if (old !== score) changed++
      incrResult = score
    }
    if (zset.size === 0) store.remove(entry)
    else store.evict(entry)
    if (incr) return incrResult === null ? null : formatScore(incrResult)
    return ch ? added + changed : added
  }

  const zpopmin: RedisHandler = request => {
    if (request.argc > 2) return Errors.syntax
    let count = 1
    if (request.argc === 2) {
      const n = asNumber(request.int(1))
      if (n === null || n < 0) return Errors.notPositive
      count = n
    }
    const entry = typed(request.str(0), KeyType.ZSET)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return EMPTY_ARRAY
    const zset = entry.value as SortedSet
    const out: Reply[] = []
    for (const item of zset.popMin(count)) {
      store.resize(entry, -(item.member.length + ZSET_MEMBER_OVERHEAD_BYTES))
      out.push(item.member, formatScore(item.score))
    }
    if (zset.size === 0) store.remove(entry)
    return out
  }

  // ZRANGE key start stop [REV] [WITHSCORES]: by index (BYSCORE, BYLEX and LIMIT are not implemented).
  const zrange: RedisHandler = request => {
    let rev = false
    let withScores = false
    for (let i = 3; i < request.argc; i++) {
      if (request.is(i, 'rev')) rev = true
      else if (request.is(i, 'withscores')) withScores = true
      else return Errors.syntax
    }
    const start = asNumber(request.int(1))
    const stop = asNumber(request.int(2))
    if (start === null || stop === null) return Errors.notInteger
    const entry = typed(request.str(0), KeyType.ZSET)
    if (entry === null) return Errors.wrongType
    if (entry === undefined) return EMPTY_ARRAY
    const zset = entry.value as SortedSet
    const range = rangeOf(start, stop, zset.size)
    if (range === null) return EMPTY_ARRAY
    const out: Reply[] = []
    for (const item of zset.range(range[0], range[1], rev)) {
      out.push(item.member)
      if (withScores) out.push(formatScore(item.score))
    }
    return out
  }

  const zcard: RedisHandler = request => {
    const entry = typed(request.str(0), KeyType.ZSET)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? 0 : (entry.value as SortedSet).size
  }

  // Server and connection commands.
  const info: RedisHandler = request => {
    const wanted = request.argc === 0 ? null : new Set(Array.from({ length: request.argc }, (_, i) => request.str(i).toLowerCase()))
    const all = wanted === null || wanted.has('all') || wanted.has('everything') || wanted.has('default')
    const sections: [string, [string, string | number][]][] = [
      ['Server', [
        ['redis_version', version], ['redis_mode', 'standalone'], ['os', `${process.platform} ${process.arch}`],
        ['arch_bits', 64], ['multiplexing_api', 'epoll'], ['process_id', process.pid],
        ['tcp_port', options.port?.() ?? 0], ['uptime_in_seconds', Math.floor((Date.now() - startedAt) / 1000)],
        ['executable', 'nyala examples/redis']
      ]],
      ['Clients', [['connected_clients', options.connectedClients?.() ?? 0]]],
      ['Memory', [
        ['used_memory', store.usedBytes], ['maxmemory', store.maxMemoryBytes], ['maxmemory_policy', 'allkeys-lru']
      ]],
      ['Persistence', [['loading', 0], ['rdb_changes_since_last_save', 0], ['aof_enabled', 0]]],
      ['Stats', [
        ['expired_keys', store.stats.expiredKeys], ['evicted_keys', store.stats.evictedKeys],
        ['keyspace_hits', store.stats.keyspaceHits], ['keyspace_misses', store.stats.keyspaceMisses]
      ]],
      ['Replication', [['role', 'master'], ['connected_slaves', 0]]],
      ['Keyspace', store.size > 0 ? [['db0', `keys=${store.size},expires=${store.volatileCount},avg_ttl=0`]] : []]
    ]
    const lines: string[] = []
    for (const [name, fields] of sections) {
      if (!all && !wanted!.has(name.toLowerCase())) continue
      if (lines.length > 0) lines.push('')
      lines.push(`# ${name}`)
      for (const [field, value] of fields) lines.push(`${field}:${value}`)
    }
    return lines.length === 0 ? '' : lines.join('\r\n') + '\r\n'
  }

  // COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli (which asks COMMAND DOCS for its hints).
  const commandInfo = (command: Command): Reply => {
    const keyed = !['ping', 'echo', 'dbsize', 'flushdb', 'flushall', 'keys', 'info', 'command', 'client', 'select', 'config', 'quit', 'hello',
      'subscribe', 'unsubscribe', 'psubscribe', 'punsubscribe', 'publish', 'pubsub', 'reset'].includes(command.name)
    const step = command.name === 'mset' ? 2 : 1
    const last = ['del', 'exists', 'mget', 'mset'].includes(command.name) ? -1 : keyed ? 1 : 0
    return [command.name, command.arity, EMPTY_ARRAY, keyed ? 1 : 0, last, keyed ? step : 0, EMPTY_ARRAY, EMPTY_ARRAY, EMPTY_ARRAY, EMPTY_ARRAY]
  }
  const command: RedisHandler = request => {
    if (request.argc === 0) return COMMANDS.map(commandInfo)
    if (request.is(0, 'count')) return COMMANDS.length
    if (request.is(0, 'docs')) return EMPTY_ARRAY
    if (request.is(0, 'info')) {
      const out: Reply[] = []
      for (let i = 1; i < request.argc; i++) {
        const name = request.str(i).toLowerCase()
        const found = COMMANDS.find(c => c.name === name)
        out.push(found === undefined ? NIL_ARRAY : commandInfo(found))
      }
      return out
    }
    return unknownSubcommand(request.prefix(0, 128), 'COMMAND')
  }

  const client: RedisHandler = (request, ctx) => {
    const state = ctx.connectionState as ConnectionState
    if (request.is(0, 'setname')) {
      if (request.argc !== 2) return arityError('client|setname')
      const name = request.str(1)
      if (!validClientName(name)) return Errors.clientName
      state.name = name
      return OK
    }
    if (request.is(0, 'getname')) {
      if (request.argc !== 1) return arityError('client|getname')
      return state.name === '' ? null : state.name
    }
    if (request.is(0, 'id')) {
      if (request.argc !== 1) return arityError('client|id')
      return state.id
    }
    if (request.is(0, 'setinfo')) {
      if (request.argc !== 3) return arityError('client|setinfo')
      return OK
    }
    return unknownSubcommand(request.prefix(0, 128), 'CLIENT')
  }

  const select: RedisHandler = request => {
    const n = request.int(0)
    if (n === null) return Errors.notInteger
    return n === 0 ? OK : Errors.dbIndex
  }

  const configValues: [string, string][] = [
    ['save', ''], ['appendonly', 'no'], ['databases', '1'], ['maxmemory', String(store.maxMemoryBytes)],
    ['maxmemory-policy', 'allkeys-lru'], ['proto-max-bulk-len', String(options.protoMaxBulkLen ?? 512 * 1024 * 1024)],
    ['timeout', '0'], ['port', String(options.port?.() ?? 0)], ['bind', '127.0.0.1']
  ]
  const config: RedisHandler = request => {
    if (request.is(0, 'get')) {
      if (request.argc < 2) return arityError('config|get')
      const out: string[] = []
      for (const [name, value] of configValues) {
        for (let i = 1; i < request.argc; i++) {
          const pattern = request.str(i)
          // As Redis: a name without glob characters is looked up, and answered as it was asked.
          const literal = !/[[*?]/.test(pattern)
          if (literal ? pattern.toLowerCase() === name : globMatch(pattern, name, true)) {
            out.push(literal ? pattern : name, value)
            break
          }
        }
      }
      return out
    }
    return unknownSubcommand(request.prefix(0, 128), 'CONFIG')
  }

  const hello: RedisHandler = (request, ctx) => {
    const state = ctx.connectionState as ConnectionState
    let proto = 2
    if (request.argc > 0) {
      const n = asNumber(request.int(0))
      if (n === null) return Errors.protoVersion
      if (n !== 2) return Errors.noProto
      proto = n
      let name: string | null = null
      for (let i = 1; i < request.argc; i++) {
        if (request.is(i, 'setname') && i + 1 < request.argc) name = request.str(++i)
        else if (request.is(i, 'auth') && i + 2 < request.argc) i += 2
        else return error(`ERR Syntax error in HELLO option '${oneLine(request.prefix(i, 128))}'`)
      }
      // Checked as CLIENT SETNAME checks it, once every option is known good (as Redis does).
      if (name !== null) {
        if (!validClientName(name)) return Errors.clientName
        state.name = name
      }
    }
    return ['server', 'redis', 'version', version, 'proto', proto, 'id', state.id, 'mode', 'standalone', 'role', 'master', 'modules', EMPTY_ARRAY]
  }

  const handlers: Record<Exclude<CommandName, PubSubCommandName>, RedisHandler> = {
    PING: (request, ctx) => request.argc > 1
      ? arityError('ping')
      : (ctx.connectionState as ConnectionState).subscriptions !== null ? subscribedPing(request) : request.argc === 0 ? PONG : request.bytes(0),
    ECHO: request => request.bytes(0),
    SET: set,
    GET: get,
    GETSET: getset,
    DEL: del,
    EXISTS: exists,
    INCR: request => incrBy(request, 1),
    INCRBY: incrByArg(false),
    DECR: request => incrBy(request, -1),
    DECRBY: incrByArg(true),
    APPEND: append,
    STRLEN: strlen,
    MGET: mget,
    MSET: mset,
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
    TYPE: typeOf,
    LPUSH: push(true),
    RPUSH: push(false),
    LPOP: pop(true),
    RPOP: pop(false),
    LRANGE: lrange,
    LLEN: llen,
    SADD: sadd,
    SPOP: spop,
    SMEMBERS: smembers,
    SCARD: scard,
    HSET: hset,
    HGET: hget,
    HDEL: hdel,
    HGETALL: hgetall,
    ZADD: zadd,
    ZPOPMIN: zpopmin,
    ZRANGE: zrange,
    ZCARD: zcard,
    INFO: info,
    COMMAND: command,
    CLIENT: client,
    SELECT: select,
    CONFIG: config,
    QUIT: (_request, ctx) => {
      ctx.closeConnection()
      return OK
    },
    HELLO: hello
  }

  const all: Record<CommandName, RedisHandler> = { ...handlers, ...pubsubHandlers(options.pubsub ?? new PubSub()) }
  // Every command checks its arity first, as Redis does before calling it, then (but for the few
  // allowed there) that the connection is not in subscribed mode.
  const routes: Record<string, RedisHandler> = {}
  for (const cmd of COMMANDS) {
    const handler = all[cmd.method as CommandName]!
    const arity = cmd.arity
    const wrong = arityError(cmd.name)
    routes[cmd.method] = SUBSCRIBED_MODE_COMMANDS.has(cmd.name)
      ? (request, ctx) => arityOk(arity, request.argc) ? handler(request, ctx) : wrong
      : (request, ctx) => !arityOk(arity, request.argc)
          ? wrong
          : (ctx.connectionState as ConnectionState).subscriptions !== null ? subscribedModeRefusal(cmd, request, handler, ctx) : handler(request, ctx)
  }
  routes[UNKNOWN_COMMAND.method] = unknownCommand
  return routes
}

const EMPTY_ARRAY: readonly Reply[] = Object.freeze([])
const TYPE_REPLIES = [...TYPE_NAMES, 'none'].map(name => simple(name))

/** Redis's words for a command it does not have: the name and the first arguments, quoted. */
function unknownCommand (request: RespRequest): Reply {
  // Only the bytes quoted are read (an argument may be 512 MiB).
  let args = ''
  for (let i = 1; i < request.argc && args.length < 128; i++) args += `'${request.prefix(i, 128 - args.length)}' `
  return error(`ERR unknown command '${request.prefix(0, 128)}', with args beginning with: ${args}`)
}

function unknownSubcommand (sub: string, command: string): Reply {
  return error(`ERR unknown subcommand '${oneLine(sub).slice(0, 128)}'. Try ${command} HELP.`)
}

