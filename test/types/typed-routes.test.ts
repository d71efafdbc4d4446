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

t.test('ctx.connection is a ConnectionHandle of the protocol\'s state; a group keeps typed data per member', async t => {
  t.same(errorsOf(`
import { ConnectionGroup, type ConnectionHandle } from ${JSON.stringify(entry)}
const subscribers = new ConnectionGroup<{ user: string }, { qos: 0 | 1 | 2 }>()
server.addRoutes('kv', {
  get: (req: Get, ctx) => {
    const handle: ConnectionHandle<{ user: string }> = ctx.connection
    subscribers.add(handle, { qos: 1 })
    for (const [member, data] of subscribers.entries()) if (data.qos > 0) member.send(member.state.user)
    return ctx.connection.state.user + String(subscribers.get(handle)?.qos)
  }
})
const plain = new ConnectionGroup()
declare const any: ConnectionHandle
plain.add(any)
ConnectionGroup.sendOnce([subscribers], 'm', (_member, data) => data.qos === 1)
`), [])
  t.equal(errorsOf(`
import { ConnectionGroup } from ${JSON.stringify(entry)}
server.addRoutes('kv', { get: (req: Get, ctx) => { const n: number = ctx.connection.state; return String(n) } })
`).length, 1, 'the state is not a number')
  t.equal(errorsOf(`
import { ConnectionGroup, type ConnectionHandle } from ${JSON.stringify(entry)}
declare const h: ConnectionHandle
new ConnectionGroup<unknown, { qos: number }>().add(h)
`).length, 1, 'a group with member data needs the data')
})
