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

t.test('the exports map: nyala, nyala/demo and nyala/testing, each with a source; docs import only them', async t => {
  const exports = (JSON.parse(readFileSync(`${root}/package.json`, 'utf8')) as { exports: Record<string, { types: string, default: string } | string> }).exports
  t.same(Object.keys(exports).sort(), ['.', './demo', './package.json', './testing'])
  for (const name of ['.', './demo', './testing']) {
    const entry = exports[name] as { types: string, default: string }
    const source = entry.default.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts')
    t.ok(existsSync(`${root}/${source}`), `${name} → ${entry.default} (source ${source})`)
    t.equal(entry.types, entry.default.replace(/\.js$/, '.d.ts'))
  }
  const demo = await import('../examples/calculator/index.js')
  t.ok('CalculatorService' in demo && 'calculatorHandlers' in demo, 'nyala/demo: the calculator service')
  const testing = await import('../reactor/testing.js')
  t.type(testing.FakeClock, 'function', 'nyala/testing: FakeClock')
  const api = await import('../reactor/index.js')
  for (const name of ['ProtocolServer', 'CallHead', 'InvalidRequest', 'krpcError', 'krpcCodeOf']) t.ok(name in api, `nyala exports ${name}`)
  const { readdirSync } = await import('node:fs')
  const docs = ['README.md', ...readdirSync(`${root}/docs`).map((f) => `docs/${f}`)]
  for (const doc of docs) {
    const text = readFileSync(`${root}/${doc}`, 'utf8')
    for (const m of text.matchAll(/from '(nyala[^']*)'/g)) t.ok(['nyala', 'nyala/demo', 'nyala/testing'].includes(m[1]!), `${doc} imports ${m[1]}`)
  }
})
