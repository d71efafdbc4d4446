/** The sorted-set commands (t_zset.c): ZADD and its options, ZPOPMIN, ZRANGE by index, ZCARD. */
import { typedEntry, type HandlerTable, type RedisHandler } from './handler.js'
import { asNumber, rangeOf } from './arguments.js'
import { EMPTY_ARRAY, Errors } from './replies.js'
import { error, type Reply } from './resp.js'
import { KeyType, SortedSet, ZSET_MEMBER_OVERHEAD_BYTES, type RedisStore } from './store.js'

/** The sorted-set commands' route names. */
export type SortedSetCommandName = 'ZADD' | 'ZPOPMIN' | 'ZRANGE' | 'ZCARD'

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

/** The sorted-set commands' handlers over `store`. */
export function sortedSetHandlers (store: RedisStore): HandlerTable<SortedSetCommandName> {
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
    let entry = typedEntry(store, key, KeyType.ZSET)
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
    const entry = typedEntry(store, request.str(0), KeyType.ZSET)
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
    const entry = typedEntry(store, request.str(0), KeyType.ZSET)
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
    const entry = typedEntry(store, request.str(0), KeyType.ZSET)
    if (entry === null) return Errors.wrongType
    return entry === undefined ? 0 : (entry.value as SortedSet).size
  }

  return {
    ZADD: zadd,
    ZPOPMIN: zpopmin,
    ZRANGE: zrange,
    ZCARD: zcard
  }
}
