// The server's types follow its protocol's: handlers of the wrong request
// or answer type, or reading a connection state of the wrong type, fail to
// compile; the right ones (including a route that takes a narrower request
// than the protocol's union) compile. Checked with the TypeScript compiler
// on small files written for the test.
import t from 'tap'
import { fileURLToPath } from 'node:url'
import { compileErrors } from '../helpers/compile-errors.js'

const entry = fileURLToPath(new URL('../../reactor/index.ts', import.meta.url))

const prelude = `
import { ProtocolServer, type ServerProtocol } from ${JSON.stringify(entry)}
type Get = { kind: 'get', key: string }
type Set = { kind: 'set', key: string, value: string }
declare const kv: ServerProtocol<Get | Set, string, { user: string }>
const server = new ProtocolServer(kv)
`

function errorsOf (body: string): string[] {
  return compileErrors(prelude + body)
}

t.test('handlers that fit the protocol compile', async t => {
  t.same(errorsOf(`
server.addRoutes('kv', {
  get: (req: Get | Set, ctx) => req.key + ctx.connectionState.user,
  set: (req: Set) => req.value,                       // narrower than the union: allowed
  later: async (req) => req.key,                      // inferred, a promise of the answer
  spec: { handler: (req: Get) => req.key, spec: 1 }
})
server.use((req, ctx, next) => ctx.connectionState.user === '' ? 'anonymous' : next(req, ctx))
`), [])
})

t.test('a handler of the wrong request type fails', async t => {
  const errors = errorsOf(`server.addRoutes('kv', { get: (req: number) => String(req) })`)
  t.equal(errors.length, 1, errors.join('\n'))
})

t.test('a handler of the wrong answer type fails', async t => {
  const errors = errorsOf(`server.addRoutes('kv', { get: (req: Get) => req.key.length })`)
  t.equal(errors.length, 1, errors.join('\n'))
})

t.test('reading the connection state as another type fails', async t => {
  const errors = errorsOf(`server.addRoutes('kv', { get: (req: Get, ctx) => { const n: number = ctx.connectionState.user; return String(n) } })`)
  t.equal(errors.length, 1, errors.join('\n'))
})

t.test('a filter of the wrong answer type fails', async t => {
  const errors = errorsOf(`server.use((req, ctx, next) => 42)`)
  t.equal(errors.length, 1, errors.join('\n'))
})
