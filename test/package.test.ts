/**
 * The package entry point: package.json's main and types name the compiled
 * reactor/index, which exists in the sources and exports the public API.
 */
import t from 'tap'
import { existsSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const pkg = JSON.parse(readFileSync(`${root}/package.json`, 'utf8')) as { main: string, types: string }

t.test('main and types point at the compiled reactor/index, which has a source', async t => {
  t.equal(pkg.main, 'dist/reactor/index.js')
  t.equal(pkg.types, 'dist/reactor/index.d.ts')
  t.ok(existsSync(`${root}/reactor/index.ts`), 'reactor/index.ts exists')
})

t.test('the entry point exports the server, the client, errors and schemas', async t => {
  const api = await import('../reactor/index.js')
  for (const name of ['Server', 'Client', 'RpcError', 'ErrorCode', 'KrpcCode', 'ProtoSchema', 'serveReactors', 'ExponentialBackoff', 'RetryBudget']) {
    t.ok(name in api, `exports ${name}`)
  }
  const { Server, Client } = api
  const server = new Server()
  t.type(server.listen, 'function')
  const client = new Client()
  client.close()
})
