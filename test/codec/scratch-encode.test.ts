/**
 * `encodeScratch` writes into one writer the codec reuses: its bytes equal
 * `encode`'s, a message that grew the writer past its keep size leaves it
 * for a fresh one (so one large message pins no memory), and an encode that
 * fails leaves no half-written state for the next. `decodeRange` decodes a
 * slice of a larger buffer exactly as `decode` decodes a copy of it.
 */
import t from 'tap'
import { RpcError } from '../../codec/errors.js'
import { CalculatorService } from '../../examples/calculator.js'

const Add = CalculatorService.methods.Add
const Echo = CalculatorService.methods.Echo

t.test('scratch bytes equal encode bytes, and are valid until the next encode', async t => {
  for (const message of [{ x: 0, y: 0 }, { x: 1, y: 2 }, { x: 0xffffffff, y: 7 }]) {
    const scratch = Buffer.from(Add.requestType.encodeScratch(message))
    t.same(scratch, Buffer.from(Add.requestType.encode(message)))
  }
  const first = Add.requestType.encodeScratch({ x: 300, y: 1 })
  const copy = Buffer.from(first)
  Add.requestType.encodeScratch({ x: 1, y: 1 })
  t.notSame(Buffer.from(first), copy, 'the next encode reuses the same bytes: callers must copy at once')
})

t.test('a large message does not keep its writer; later encodes still match', async t => {
  const big = { data: 'x'.repeat(200 * 1024) }
  const bigBytes = Echo.requestType.encodeScratch(big)
  t.equal(bigBytes.length, Echo.requestType.encode(big).length)
  const small = Echo.requestType.encodeScratch({ data: 'hi' })
  t.not(small.buffer, bigBytes.buffer, 'a fresh writer after the large one')
  t.same(Buffer.from(small), Buffer.from(Echo.requestType.encode({ data: 'hi' })))
  t.equal(Buffer.from(bigBytes).toString('latin1', bigBytes.length - 3), 'xxx', 'the large result is untouched')
})

t.test('a failed encode leaves the scratch writer clean', async t => {
  t.throws(() => Add.requestType.encodeScratch({ x: 1 } as never), { message: /missing fields: y/ })
  t.throws(() => Add.requestType.encodeScratch({ x: 'one', y: 1 } as never), { message: /invalid nyala\.demo\.AddRequestPB/ })
  t.same(Buffer.from(Add.requestType.encodeScratch({ x: 5, y: 6 })), Buffer.from(Add.requestType.encode({ x: 5, y: 6 })))
})

t.test('decodeRange reads a slice in place, and reports bad bytes as errors', async t => {
  const body = Add.requestType.encode({ x: 41, y: 1 })
  const padded = Buffer.concat([Buffer.from([0xff, 0xff, 0xff]), body, Buffer.from([0x08, 0x09])])
  t.same(Add.requestType.decodeRange(padded, 3, 3 + body.length), { x: 41, y: 1 })
  const missing = Add.requestType.decodeRange(padded, 3, 5)
  t.type(missing, RpcError)
  t.match((missing as RpcError).message, /missing fields: y/)
  const truncated = Add.requestType.decodeRange(Buffer.from([0x08]), 0, 1)
  t.type(truncated, RpcError)
})
