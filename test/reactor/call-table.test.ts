/**
 * CallTable: agrees with a Map over random operation sequences (rising ids
 * as clients make them, clustered and hostile ids as a peer may send, with
 * growth, shrinking and backward-shift deletion on the way), rejects ids
 * that are not 32-bit integers, and hands out a copy of its values.
 */
import t from 'tap'
import fc from 'fast-check'
import { CallTable } from '../../reactor/call-table.js'

type Op = { kind: 'set', id: number } | { kind: 'delete', id: number } | { kind: 'take', id: number } | { kind: 'get', id: number }

function check (ops: Op[]): void {
  const table = new CallTable<{ id: number, n: number }>()
  const model = new Map<number, { id: number, n: number }>()
  let n = 0
  for (const op of ops) {
    if (op.kind === 'set') {
      const value = { id: op.id, n: n++ }
      table.set(op.id, value)
      model.set(op.id, value)
    } else if (op.kind === 'delete') {
      if (table.delete(op.id) !== model.delete(op.id)) throw new Error(`delete(${op.id}) disagrees`)
    } else if (op.kind === 'take') {
      const expected = model.get(op.id)
      model.delete(op.id)
      if (table.take(op.id) !== expected) throw new Error(`take(${op.id}) disagrees`)
    } else if (table.get(op.id) !== model.get(op.id) || table.has(op.id) !== model.has(op.id)) {
      throw new Error(`get(${op.id}) disagrees`)
    }
    if (table.size !== model.size) throw new Error(`size ${table.size} != ${model.size}`)
  }
  for (const [id, value] of model) if (table.get(id) !== value) throw new Error(`lost ${id}`)
  const values = table.values()
  if (values.length !== model.size || !values.every((v) => model.get(v.id) === v)) throw new Error('values() disagrees')
}

t.test('agrees with a Map on random ids, including negative and extreme ones', async (t) => {
  const id = fc.oneof(fc.integer({ min: -40, max: 40 }), fc.integer({ min: -0x80000000, max: 0x7fffffff }))
  const op = fc.oneof(
    id.map((id): Op => ({ kind: 'set', id })),
    id.map((id): Op => ({ kind: 'delete', id })),
    id.map((id): Op => ({ kind: 'take', id })),
    id.map((id): Op => ({ kind: 'get', id })))
  fc.assert(fc.property(fc.array(op, { maxLength: 400 }), (ops) => { check(ops) }), { numRuns: 300 })
  t.pass('no disagreement')
})

t.test('agrees with a Map on rising ids with a window of outstanding calls, through growth and shrinking', async (t) => {
  fc.assert(fc.property(fc.array(fc.tuple(fc.integer({ min: 1, max: 300 }), fc.integer({ min: 0, max: 300 })), { minLength: 1, maxLength: 8 }), (phases) => {
    const ops: Op[] = []
    let next = 0
    let oldest = 0
    for (const [start, finish] of phases) {
      for (let i = 0; i < start; i++) ops.push({ kind: 'set', id: next++ })
      for (let i = 0; i < finish && oldest < next; i++) {
        ops.push({ kind: 'get', id: oldest })
        // Out of order now and then, as responses to different methods are.
        ops.push({ kind: i % 2 === 0 ? 'take' : 'delete', id: i % 7 === 3 && oldest + 1 < next ? oldest + 1 : oldest })
        oldest++
      }
    }
    check(ops)
  }), { numRuns: 200 })
  t.pass('no disagreement')
})

t.test('a long churn with 100 outstanding keeps every call findable', async (t) => {
  const table = new CallTable<number>()
  for (let id = 0; id < 100; id++) table.set(id, id)
  let missing = 0
  for (let id = 100; id < 200_000; id++) {
    if (table.get(id - 100) !== id - 100) missing++
    table.delete(id - 100)
    table.set(id, id)
  }
  t.equal(missing, 0)
  t.equal(table.size, 100)
  for (let id = 199_900; id < 200_000; id++) table.delete(id)
  t.equal(table.size, 0)
  t.same(table.values(), [])
})

t.test('ids must be 32-bit integers; undefined is not a value', async (t) => {
  const table = new CallTable<string>()
  t.throws(() => table.set(2 ** 31, 'x'), RangeError)
  t.throws(() => table.set(1.5, 'x'), RangeError)
  t.throws(() => table.set(1, undefined as unknown as string), TypeError)
  t.equal(table.get(2 ** 31), undefined)
  t.equal(table.delete(2 ** 31), false)
  t.equal(table.size, 0)
})

t.test('values() is a copy, and clear() empties the table', async (t) => {
  const table = new CallTable<number>()
  for (let id = 0; id < 50; id++) table.set(id, id)
  const values = table.values()
  for (const v of values) table.delete(v)
  t.equal(values.length, 50)
  t.equal(table.size, 0)
  table.set(7, 7)
  table.clear()
  t.equal(table.size, 0)
  t.equal(table.get(7), undefined)
  table.set(8, 8)
  t.equal(table.get(8), 8)
})

t.test('a table of up to 256 slots keeps its size when emptied; a larger one shrinks back', async t => {
  const table = new CallTable<number>()
  for (let id = 0; id < 100; id++) table.set(id, id)
  t.equal(table.capacity, 256)
  for (let id = 0; id < 100; id++) table.delete(id)
  t.equal(table.capacity, 256, 'emptied, not shrunk')
  for (let id = 100; id < 200; id++) table.set(id, id)
  t.equal(table.size, 100)
  t.equal(table.capacity, 256, 'refilled, not grown')
  for (let id = 200; id < 5200; id++) table.set(id, id)
  t.equal(table.capacity, 16384)
  for (let id = 100; id < 5199; id++) table.delete(id)
  t.equal(table.size, 1)
  t.equal(table.capacity, 256, 'shrunk back to the floor')
  t.equal(table.get(5199), 5199)
})
