// The KRPC server wraps a generic ProtocolServer rather than extending it:
// its routes come only from addService, which gives each the method
// definition KRPC decodes and encodes it with. A route added through the
// generic `addRoutes` had none, and every call to it was answered
// ERROR_INVALID_REQUEST; the member is gone, for the compiler and at run time.
import t from 'tap'
import { fileURLToPath } from 'node:url'
import * as krpc from '../../reactor/krpc/index.js'
import { KrpcServer } from '../../reactor/krpc/index.js'
import * as nyala from '../../reactor/index.js'
import { ProtocolServer } from '../../reactor/index.js'
import { compileErrors } from '../helpers/compile-errors.js'

const krpcEntry = fileURLToPath(new URL('../../reactor/krpc/index.ts', import.meta.url))

function errorsOf (body: string): string[] {
  return compileErrors(`import { KrpcServer, type ServiceDef } from ${JSON.stringify(krpcEntry)}\nconst server = new KrpcServer({ logger: null })\n${body}`)
}

t.test('the KRPC server has no addRoutes for the compiler', async t => {
  const errors = errorsOf(`server.addRoutes('kudu.Echo', { Echo: () => ({}) })`)
  t.equal(errors.length, 1, errors.join('\n'))
  t.match(errors[0], /addRoutes/)
})

t.test('its own API compiles', async t => {
  t.same(errorsOf(`
declare const def: ServiceDef<{ Echo: { request: { x: number }, response: { x: number } } }>
server.addService(def, { Echo: (req, ctx) => ({ x: req.x + ctx.sidecars.length }) })
server.use((req, ctx, next) => next(req, ctx))
const stats: number = server.stats().callsReceived + server.limits().maxConnections
void server.listen(0).then(() => server.close({ graceMs: 0 }))
`), [])
})

t.test('at run time: no addRoutes, not a ProtocolServer', async t => {
  const server = new KrpcServer({ logger: null })
  t.notOk('addRoutes' in server, 'no addRoutes member')
  t.equal((server as unknown as Record<string, unknown>).addRoutes, undefined)
  t.notOk((server as unknown) instanceof ProtocolServer, 'wraps a ProtocolServer, is not one')
  await server.close({ graceMs: 0 })
})

t.test('the former names are gone: Server and Client from neither entry point', async t => {
  for (const name of ['Server', 'Client']) {
    t.notOk(name in krpc, `nyala/krpc has no ${name} (KrpcServer, KrpcClient)`)
    t.notOk(name in nyala, `nyala has no ${name}`)
  }
  const errors = compileErrors(`import { Server, Client } from ${JSON.stringify(krpcEntry)}\nvoid Server; void Client`)
  t.equal(errors.length, 2, errors.join('\n'))
})
