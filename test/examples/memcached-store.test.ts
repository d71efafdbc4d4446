/**
 * The memcached example's cache on a hand-moved clock: LRU eviction under
 * the memory limit, relative and absolute expiry, CAS, INCR/DECR edge
 * cases, APPEND/PREPEND, delayed flushes and the item size limit, with
 * memcached's statuses (checked against memcached 1.6.18).
 */
import t from 'tap'
import { ITEM_OVERHEAD_BYTES, Item, MAX_RELATIVE_EXPTIME_S, MemcachedStore, PAGE_BYTES, SLAB_VALUE_BYTES, Status, expiresAt, parseU64, type StoreOptions } from '../../examples/memcached/store.js'

/** A store on a clock that only moves when told (starting on 2026-01-01, in ms). */
function storeAt (options: StoreOptions = {}): { store: MemcachedStore, clock: { now: number } } {
  const clock = { now: Date.UTC(2026, 0, 1) }
  return { store: new MemcachedStore({ now: () => clock.now, ...options }), clock }
}

const bytes = (text: string): Buffer => Buffer.from(text, 'latin1')

function item (result: Item | number): Item {
  if (typeof result === 'number') throw new Error(`expected an item, got status 0x${result.toString(16)}`)
  return result
}

function valueOf (store: MemcachedStore, key: string): string | null {
  const found = store.get(key)
  return found === null ? null : found.value.toString('latin1')
}

t.test('set copies the value out of the caller\'s buffer; get returns flags and CAS', async t => {
  const { store } = storeAt()
  const frame = bytes('xxhelloxx')
  const stored = item(store.store('set', 'k', frame.subarray(2, 7), 0xdeadbeef, 0, 0))
  frame.fill(0x21)
  const got = store.get('k')!
  t.equal(got.value.toString(), 'hello')
  t.equal(got.flags, 0xdeadbeef)
  t.equal(got.cas, stored.cas)
  t.ok(got.cas > 0, 'CAS values are never 0')
  t.not(got.value.buffer, frame.buffer, 'shares no memory with the frame')
  t.equal(store.get('nope'), null)
  t.equal(store.size, 1)
  t.equal(store.usedBytes, 1 + 5 + ITEM_OVERHEAD_BYTES)
  t.match(store.stats, { cmd_get: 2, get_hits: 1, get_misses: 1, cmd_set: 1, total_items: 1 })
})

t.test('every write gets a new, larger CAS', async t => {
  const { store } = storeAt()
  const a = item(store.store('set', 'a', bytes('1'), 0, 0, 0)).cas
  const b = item(store.store('set', 'b', bytes('1'), 0, 0, 0)).cas
  const c = item(store.store('set', 'a', bytes('2'), 0, 0, 0)).cas
  const d = item(store.concat('a', bytes('3'), false, 0)).cas
  const e = item(store.arithmetic('a', true, 1n, 0n, 0, true, 0)).cas
  t.ok(a < b && b < c && c < d && d < e)
})

t.test('LRU: past the memory limit the least recently used items go', async t => {
  const itemBytes = 1 + 10 + ITEM_OVERHEAD_BYTES
  const { store } = storeAt({ memoryBytes: 3 * itemBytes })
  for (const key of ['a', 'b', 'c']) item(store.store('set', key, Buffer.alloc(10), 0, 0, 0))
  t.equal(store.size, 3)
  t.equal(store.usedBytes, 3 * itemBytes)
  store.get('a') // a is now the most recently used; b the least
  item(store.store('set', 'd', Buffer.alloc(10), 0, 0, 0))
  t.same(['a', 'b', 'c', 'd'].map(k => store.get(k) !== null), [true, false, true, true])
  t.equal(store.stats.evictions, 1)
  // An item twice the size evicts two.
  item(store.store('set', 'e', Buffer.alloc(10 + itemBytes), 0, 0, 0))
  t.equal(store.usedBytes <= store.memoryBytes, true)
  t.equal(store.stats.evictions, 3)
  t.equal(store.get('e')!.value.length, 10 + itemBytes)
})

t.test('LRU: touch, add of a present key and overwrites count as use', async t => {
  const itemBytes = 1 + 1 + ITEM_OVERHEAD_BYTES
  const { store } = storeAt({ memoryBytes: 3 * itemBytes })
  for (const key of ['a', 'b', 'c']) item(store.store('set', key, bytes('v'), 0, 0, 0))
  store.touch('a', 0)
  t.equal(store.store('add', 'b', bytes('v'), 0, 0, 0), Status.KEY_EEXISTS)
  item(store.store('set', 'c', bytes('w'), 0, 0, 0))
  item(store.store('set', 'd', bytes('v'), 0, 0, 0))
  t.equal(store.get('a'), null, 'a, touched first, was the least recently used')
  t.ok(store.get('b') && store.get('c') && store.get('d'))
})

t.test('expired items at the LRU tail are reclaimed, not evicted', async t => {
  const itemBytes = 1 + 1 + ITEM_OVERHEAD_BYTES
  const { store, clock } = storeAt({ memoryBytes: 2 * itemBytes })
  item(store.store('set', 'a', bytes('v'), 0, 1, 0))
  item(store.store('set', 'b', bytes('v'), 0, 0, 0))
  clock.now += 1000
  item(store.store('set', 'c', bytes('v'), 0, 0, 0))
  t.equal(store.stats.evictions, 0)
  t.equal(store.stats.reclaimed, 1)
})

t.test('item size limit: E2BIG, and a SET that is too large drops the old value', async t => {
  const { store } = storeAt()
  const largest = store.maxItemBytes - ITEM_OVERHEAD_BYTES - 3
  t.equal(store.maxItemBytes, 1024 * 1024)
  item(store.store('set', 'big', Buffer.alloc(largest), 0, 0, 0))
  t.equal(store.store('set', 'big', Buffer.alloc(largest + 1), 0, 0, 0), Status.E2BIG)
  t.equal(store.get('big'), null, 'as memcached: no stale value after a failed SET')
  item(store.store('set', 'big', bytes('small'), 0, 0, 0))
  t.equal(store.store('add', 'big', Buffer.alloc(largest + 1), 0, 0, 0), Status.E2BIG)
  t.equal(store.store('replace', 'big', Buffer.alloc(largest + 1), 0, 0, 0), Status.E2BIG)
  t.equal(valueOf(store, 'big'), 'small', 'ADD and REPLACE leave it')
})

t.test('an item larger than the whole memory is ENOMEM', async t => {
  const { store } = storeAt({ memoryBytes: 1000 })
  t.equal(store.store('set', 'k', Buffer.alloc(1000), 0, 0, 0), Status.ENOMEM)
  t.equal(store.size, 0)
})

t.test('relative expiry: seconds from now, up to 30 days', async t => {
  const { store, clock } = storeAt()
  item(store.store('set', 'ten', bytes('v'), 0, 10, 0))
  item(store.store('set', 'month', bytes('v'), 0, MAX_RELATIVE_EXPTIME_S, 0))
  item(store.store('set', 'never', bytes('v'), 0, 0, 0))
  clock.now += 9999
  t.ok(store.get('ten'))
  clock.now += 1
  t.equal(store.get('ten'), null, 'gone at exactly 10 s')
  t.equal(store.stats.get_expired, 1)
  t.equal(store.size, 2, 'unlinked on access')
  clock.now += MAX_RELATIVE_EXPTIME_S * 1000 - 10_000 - 1
  t.ok(store.get('month'))
  clock.now += 1
  t.equal(store.get('month'), null)
  clock.now += 10 * 365 * 86400_000
  t.ok(store.get('never'))
})

t.test('absolute expiry: an exptime past 30 days is a unix time', async t => {
  const { store, clock } = storeAt()
  const nowS = clock.now / 1000
  item(store.store('set', 'abs', bytes('v'), 0, nowS + 100, 0))
  item(store.store('set', 'past', bytes('v'), 0, nowS - 1, 0))
  item(store.store('set', 'ancient', bytes('v'), 0, MAX_RELATIVE_EXPTIME_S + 1, 0))
  item(store.store('set', 'negative', bytes('v'), 0, -1, 0))
  t.equal(store.get('past'), null, 'a unix time already past: expired at once')
  t.equal(store.get('ancient'), null, '30 days and 1 s is a unix time in 1970')
  t.equal(store.get('negative'), null, 'negative: expired at once')
  clock.now += 99_999
  t.ok(store.get('abs'))
  clock.now += 1
  t.equal(store.get('abs'), null)
})

t.test('expiresAt and the boundaries', async t => {
  const now = 1_800_000_000_000
  t.equal(expiresAt(0, now), 0)
  t.equal(expiresAt(1, now), now + 1000)
  t.equal(expiresAt(MAX_RELATIVE_EXPTIME_S, now), now + MAX_RELATIVE_EXPTIME_S * 1000)
  t.equal(expiresAt(MAX_RELATIVE_EXPTIME_S + 1, now), 1, 'absolute and past')
  t.equal(expiresAt(now / 1000 + 5, now), now + 5000)
  t.equal(expiresAt(now / 1000, now), 1, 'absolute, exactly now: expired')
  t.equal(expiresAt(-5, now), 1)
  t.equal(expiresAt(0xffffffff, now), 0xffffffff * 1000, 'the wire\'s largest: year 2106')
})

t.test('touch sets a new expiry; a miss or an expired item is null', async t => {
  const { store, clock } = storeAt()
  item(store.store('set', 'k', bytes('v'), 7, 1, 0))
  const cas = store.get('k')!.cas
  const touched = store.touch('k', 100)!
  t.equal(touched.cas, cas, 'touch keeps the CAS')
  t.equal(touched.flags, 7)
  clock.now += 50_000
  t.ok(store.get('k'))
  store.touch('k', 0)
  clock.now += 365 * 86400_000
  t.ok(store.get('k'), '0: never expires')
  store.touch('k', 1)
  clock.now += 1000
  t.equal(store.touch('k', 100), null)
  t.equal(store.touch('nope', 100), null)
  t.match(store.stats, { cmd_touch: 5, touch_hits: 3, touch_misses: 2 })
})

t.test('CAS: SET, ADD and REPLACE with a CAS are compare-and-swap', async t => {
  const { store } = storeAt()
  const first = item(store.store('set', 'k', bytes('1'), 0, 0, 0))
  t.equal(store.store('set', 'k', bytes('2'), 0, 0, first.cas + 1), Status.KEY_EEXISTS)
  const second = item(store.store('set', 'k', bytes('2'), 5, 0, first.cas))
  t.ok(second.cas > first.cas)
  t.equal(valueOf(store, 'k'), '2')
  t.equal(store.store('set', 'k', bytes('3'), 0, 0, first.cas), Status.KEY_EEXISTS, 'a used CAS no longer matches')
  t.equal(store.store('set', 'absent', bytes('3'), 0, 0, 1), Status.KEY_ENOENT, 'nothing to compare with')
  // memcached: a CAS turns ADD into compare-and-swap as well.
  t.equal(store.store('add', 'k', bytes('3'), 0, 0, 1), Status.KEY_EEXISTS)
  t.equal(store.store('add', 'absent', bytes('3'), 0, 0, 1), Status.KEY_ENOENT)
  item(store.store('add', 'k', bytes('4'), 0, 0, second.cas))
  t.equal(store.store('replace', 'absent', bytes('3'), 0, 0, 0), Status.KEY_ENOENT)
  t.match(store.stats, { cas_misses: 2, cas_badval: 3, cas_hits: 2 })
})

t.test('ADD only adds, REPLACE only replaces', async t => {
  const { store, clock } = storeAt()
  item(store.store('add', 'k', bytes('1'), 0, 1, 0))
  t.equal(store.store('add', 'k', bytes('2'), 0, 0, 0), Status.KEY_EEXISTS)
  item(store.store('replace', 'k', bytes('3'), 0, 1, 0))
  t.equal(valueOf(store, 'k'), '3')
  clock.now += 1000
  t.equal(store.store('replace', 'k', bytes('4'), 0, 0, 0), Status.KEY_ENOENT, 'an expired item is absent')
  item(store.store('add', 'k', bytes('5'), 0, 0, 0))
  t.equal(valueOf(store, 'k'), '5')
})

t.test('DELETE: with and without CAS', async t => {
  const { store } = storeAt()
  const k = item(store.store('set', 'k', bytes('v'), 0, 0, 0))
  t.equal(store.delete('k', k.cas + 1), Status.KEY_EEXISTS)
  t.equal(store.delete('k', k.cas), Status.SUCCESS)
  t.equal(store.delete('k', 0), Status.KEY_ENOENT)
  item(store.store('set', 'k', bytes('v'), 0, 0, 0))
  t.equal(store.delete('k', 0), Status.SUCCESS)
  t.equal(store.size, 0)
  t.equal(store.usedBytes, 0)
  t.match(store.stats, { delete_hits: 2, delete_misses: 1 })
})

t.test('INCR/DECR: created with the initial value unless told not to', async t => {
  const { store, clock } = storeAt()
  const created = item(store.arithmetic('n', true, 5n, 42n, 10, true, 0))
  t.equal(created.value.toString(), '42', 'the initial value, not initial + delta')
  t.equal(created.flags, 0)
  t.equal(store.arithmetic('missing', false, 1n, 0n, 0xffffffff, false, 0), Status.KEY_ENOENT)
  t.equal(store.get('missing'), null)
  t.equal(item(store.arithmetic('n', true, 5n, 0n, 0, true, 0)).value.toString(), '47')
  t.equal(item(store.arithmetic('n', false, 7n, 0n, 0, true, 0)).value.toString(), '40')
  clock.now += 10_000
  t.equal(store.get('n'), null, 'the creation\'s exptime holds')
  t.match(store.stats, { incr_misses: 1, decr_misses: 1, incr_hits: 1, decr_hits: 1 })
})

t.test('INCR wraps at 2^64, DECR stops at 0', async t => {
  const { store } = storeAt()
  item(store.store('set', 'n', bytes('18446744073709551615'), 0, 0, 0))
  t.equal(item(store.arithmetic('n', true, 2n, 0n, 0, true, 0)).value.toString(), '1')
  t.equal(item(store.arithmetic('n', false, 5n, 0n, 0, true, 0)).value.toString(), '0')
  t.equal(item(store.arithmetic('n', false, 1n, 0n, 0, true, 0)).value.toString(), '0')
  t.equal(item(store.arithmetic('n', true, 18446744073709551615n, 0n, 0, true, 0)).value.toString(), '18446744073709551615')
  item(store.store('set', 'n', bytes('10'), 0, 0, 0))
  t.equal(item(store.arithmetic('n', false, 1n, 0n, 0, true, 0)).value.toString(), '9', 'no padding where memcached leaves "9 "')
})

t.test('INCR/DECR: what is not a number is DELTA_BADVAL; flags and expiry stay', async t => {
  const { store } = storeAt()
  for (const text of ['abc', '12abc', '-1', '+1', '', '1 2', '18446744073709551616', '1'.repeat(10_000), '0x10']) {
    item(store.store('set', 'v', bytes(text), 0, 0, 0))
    t.equal(store.arithmetic('v', true, 1n, 0n, 0, true, 0), Status.DELTA_BADVAL, JSON.stringify(text))
  }
  // strtoull's white space, and leading zeros
  for (const [text, next] of [[' 12 ', '14'], ['\t7\r\n', '9'], ['0000000000000000000000000042', '44']]) {
    item(store.store('set', 'v', bytes(text!), 3, 100, 0))
    const result = item(store.arithmetic('v', true, 2n, 0n, 0, true, 0))
    t.equal(result.value.toString(), next, JSON.stringify(text))
    t.equal(result.flags, 3)
  }
})

t.test('INCR/DECR with a CAS', async t => {
  const { store } = storeAt()
  const n = item(store.store('set', 'n', bytes('1'), 0, 0, 0))
  t.equal(store.arithmetic('n', true, 1n, 0n, 0, true, n.cas + 1), Status.KEY_EEXISTS)
  const next = item(store.arithmetic('n', true, 1n, 0n, 0, true, n.cas))
  t.equal(next.value.toString(), '2')
  t.ok(next.cas > n.cas)
  item(store.store('set', 'e', bytes(''), 0, 0, 0))
  t.equal(store.arithmetic('e', true, 1n, 0n, 0, true, 1), Status.DELTA_BADVAL, 'memcached checks for an empty value before the CAS')
})

t.test('parseU64', async t => {
  t.equal(parseU64(bytes('0')), 0n)
  t.equal(parseU64(bytes('18446744073709551615')), 18446744073709551615n)
  t.equal(parseU64(bytes('18446744073709551616')), null)
  t.equal(parseU64(bytes('  5\n')), 5n)
  t.equal(parseU64(bytes('  ')), null)
  t.equal(parseU64(bytes('5 5')), null)
  t.equal(parseU64(Buffer.from('xx123yy').subarray(2, 5)), 123n, 'a view reads its own bytes only')
})

t.test('APPEND/PREPEND: keep the flags and expiry, ignore what is absent', async t => {
  const { store, clock } = storeAt()
  item(store.store('set', 'k', bytes('hello'), 9, 10, 0))
  const appended = item(store.concat('k', bytes(' world'), false, 0))
  t.equal(appended.value.toString(), 'hello world')
  t.equal(appended.flags, 9)
  t.equal(item(store.concat('k', bytes('>> '), true, 0)).value.toString(), '>> hello world')
  t.equal(store.concat('absent', bytes('x'), false, 0), Status.NOT_STORED)
  t.equal(store.concat('absent', bytes('x'), true, 0), Status.NOT_STORED)
  t.equal(store.get('absent'), null)
  clock.now += 10_000
  t.equal(store.get('k'), null, 'the expiry of the SET still holds')
})

t.test('APPEND/PREPEND with a CAS, and the size limit', async t => {
  const { store } = storeAt()
  const k = item(store.store('set', 'k', bytes('a'), 0, 0, 0))
  t.equal(store.concat('k', bytes('b'), false, k.cas + 1), Status.KEY_EEXISTS)
  item(store.concat('k', bytes('b'), false, k.cas))
  const largest = store.maxItemBytes - ITEM_OVERHEAD_BYTES - 1
  t.equal(store.concat('k', Buffer.alloc(largest + 1), false, 0), Status.E2BIG, 'the piece alone is too large')
  t.equal(store.concat('k', Buffer.alloc(largest - 1), false, 0), Status.NOT_STORED, 'together they are too large')
  t.equal(valueOf(store, 'k'), 'ab')
  t.equal(item(store.concat('k', Buffer.alloc(largest - 2), false, 0)).value.length, largest)
})

t.test('an earlier answer keeps a large value when the item changes (sent without a copy)', async t => {
  const { store } = storeAt()
  const one = Buffer.alloc(SLAB_VALUE_BYTES + 1, 'a')
  item(store.store('set', 'k', one, 0, 0, 0))
  const before = store.get('k')!.value
  t.not(before.buffer, one.buffer)
  item(store.concat('k', bytes('+'), false, 0))
  item(store.store('set', 'k', Buffer.alloc(SLAB_VALUE_BYTES + 1, 'b'), 0, 0, 0))
  store.delete('k', 0)
  t.ok(before.equals(one), 'its own buffer is never written over')
})

t.test('slab chunks: a freed chunk is reused; pages stay within the memory limit', async t => {
  const { store } = storeAt({ memoryBytes: 4 * PAGE_BYTES })
  item(store.store('set', 'a', bytes('one'), 0, 0, 0))
  const first = store.get('a')!.value
  store.delete('a', 0)
  item(store.store('set', 'b', bytes('two'), 0, 0, 0))
  t.equal(first.toString(), 'two', 'the same chunk (hence: small values are copied when answered)')
  const value = Buffer.alloc(1000, 'x')
  for (let i = 0; i < 20_000; i++) item(store.store('set', `key${i}`, value, 0, 0, 0))
  t.ok(store.heldBytes <= 4 * PAGE_BYTES + PAGE_BYTES, `held ${store.heldBytes} bytes`)
  t.ok(store.usedBytes <= store.memoryBytes)
  t.ok(store.stats.evictions > 0)
  t.equal(store.get('key19999')!.value.toString(), value.toString(), 'the latest is there')
  t.equal(store.get('key0'), null, 'the oldest went')
})

t.test('FLUSH: now, or after a delay; a later flush replaces a pending one', async t => {
  const { store, clock } = storeAt()
  item(store.store('set', 'a', bytes('v'), 0, 0, 0))
  store.flush()
  t.equal(store.get('a'), null)
  t.equal(store.usedBytes, 0)

  item(store.store('set', 'a', bytes('v'), 0, 0, 0))
  store.flush(10)
  clock.now += 5000
  item(store.store('set', 'b', bytes('v'), 0, 0, 0))
  t.ok(store.get('a') && store.get('b'), 'still there before the deadline')
  clock.now += 5000
  t.equal(store.get('a'), null, 'gone at the deadline')
  t.equal(store.get('b'), null, 'stored before the deadline: gone too')
  item(store.store('set', 'c', bytes('v'), 0, 0, 0))
  clock.now += 60_000
  t.ok(store.get('c'), 'stored after the deadline: stays')

  store.flush(10)
  store.flush(100)
  clock.now += 50_000
  t.ok(store.get('c'), 'the 10 s flush was replaced')
  clock.now += 50_000
  t.equal(store.get('c'), null)

  item(store.store('set', 'd', bytes('v'), 0, 0, 0))
  store.flush(10)
  store.flush(0)
  item(store.store('set', 'e', bytes('v'), 0, 0, 0))
  clock.now += 20_000
  t.ok(store.get('e'), 'an immediate flush cancels a pending one')

  store.flush(clock.now / 1000 + 5) // a unix time
  clock.now += 5000
  t.equal(store.get('e'), null)
  t.equal(store.stats.cmd_flush, 7)
})

t.test('resetStats zeroes the counters and keeps the items', async t => {
  const { store } = storeAt()
  item(store.store('set', 'a', bytes('v'), 0, 0, 0))
  store.get('a')
  store.resetStats()
  t.match(store.stats, { cmd_get: 0, get_hits: 0, cmd_set: 0, total_items: 0 })
  t.ok(store.get('a'))
})

t.test('keys are byte strings: latin1 keys with any byte', async t => {
  const { store } = storeAt()
  const key = Buffer.from([0x00, 0xff, 0x80, 0x20]).toString('latin1')
  item(store.store('set', key, bytes('v'), 0, 0, 0))
  t.ok(store.get(key))
  t.equal(store.get(Buffer.from([0x00, 0xff, 0x80]).toString('latin1')), null)
  t.equal(store.usedBytes, 4 + 1 + ITEM_OVERHEAD_BYTES)
})

t.test('keys of every length up to 250 bytes, compared word by word and then byte by byte, from any offset of a frame', async t => {
  const { store } = storeAt()
  // Keys that differ only in their last byte (past the last whole word, or in it), stored from odd offsets of a frame.
  const keyOf = (length: number, last: number): Buffer => Buffer.from('k'.repeat(length - 1) + String.fromCharCode(last), 'latin1')
  const frame = Buffer.alloc(300)
  for (const length of [1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 250]) {
    for (const last of [0x41, 0x42]) {
      const offset = 1 + (length % 3)
      keyOf(length, last).copy(frame, offset)
      item(store.store('set', frame, bytes(`${length}:${last}`), 0, 0, 0, offset, offset + length))
    }
  }
  for (const length of [1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 250]) {
    for (const last of [0x41, 0x42]) {
      const key = keyOf(length, last)
      t.equal(valueOf(store, key.toString('latin1')), `${length}:${last}`, `${length} bytes ending in ${last}`)
      t.same(store.get(key)!.key, key, 'its key\'s bytes')
      const offset = 5
      key.copy(frame, offset)
      t.equal(store.get(frame, offset, offset + length)?.value.toString('latin1'), `${length}:${last}`, 'found from a frame')
    }
    t.equal(store.get(keyOf(length, 0x43)), null, `${length} bytes: another last byte is another key`)
  }
  // An item of its own (a value past SLAB_VALUE_BYTES) is compared and copied the same way.
  const big = Buffer.alloc(SLAB_VALUE_BYTES + 1, 0x62)
  item(store.store('set', 'big-key', big, 0, 0, 0))
  item(store.store('set', 'big-keY', big.subarray(1), 0, 0, 0))
  t.equal(store.get('big-key')!.value.length, SLAB_VALUE_BYTES + 1)
  t.equal(store.get('big-keY')!.value.length, SLAB_VALUE_BYTES)
  t.same(store.get('big-keY')!.key, bytes('big-keY'))
})
