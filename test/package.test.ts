/**
 * The package entry point: package.json's main and types name the compiled
 * reactor/index, which exists in the sources and exports the public API.
 */
import t from 'tap'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const pkg = JSON.parse(readFileSync(`${root}/package.json`, 'utf8')) as { main: string, types: string }

t.test('main and types point at the compiled reactor/index, which has a source', async t => {
  t.equal(pkg.main, 'dist/reactor/index.js')
  t.equal(pkg.types, 'dist/reactor/index.d.ts')
  t.ok(existsSync(`${root}/reactor/index.ts`), 'reactor/index.ts exists')
})

t.test('the entry points export the servers, the clients, errors and schemas', async t => {
  const api = await import('../reactor/index.js')
  for (const name of ['ProtocolServer', 'ProtocolClient', 'RpcError', 'ErrorCode', 'serveReactors', 'ExponentialBackoff', 'RetryBudget']) {
    t.ok(name in api, `nyala exports ${name}`)
  }
  const krpc = await import('../reactor/krpc/index.js')
  for (const name of ['KrpcServer', 'KrpcClient', 'KrpcCode', 'ProtoSchema']) t.ok(name in krpc, `nyala/krpc exports ${name}`)
  const server = new krpc.KrpcServer()
  t.type(server.listen, 'function')
  const client = new krpc.KrpcClient()
  client.close()
})

t.test('the exports map: nyala, nyala/krpc, nyala/demo and nyala/testing, each with a source; docs import only them', async t => {
  const exports = (JSON.parse(readFileSync(`${root}/package.json`, 'utf8')) as { exports: Record<string, { types: string, default: string } | string> }).exports
  t.same(Object.keys(exports).sort(), ['.', './demo', './krpc', './package.json', './testing'])
  for (const name of ['.', './krpc', './demo', './testing']) {
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
  for (const name of ['ProtocolServer', 'CallHead', 'InvalidRequest']) t.ok(name in api, `nyala exports ${name}`)
  const krpc = await import('../reactor/krpc/index.js')
  for (const name of ['krpcError', 'krpcCodeOf']) t.ok(name in krpc, `nyala/krpc exports ${name}`)
})

/** Every Markdown file of the repository, outside node_modules and dist. */
function markdownFiles (dir = root, prefix = ''): string[] {
  const found: string[] = []
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (entry.name === 'node_modules' || entry.name === 'dist' || entry.name.startsWith('.')) continue
    if (entry.isDirectory()) found.push(...markdownFiles(`${dir}/${entry.name}`, `${prefix}${entry.name}/`))
    else if (entry.name.endsWith('.md')) found.push(`${prefix}${entry.name}`)
  }
  return found
}

t.test('the README and every doc import only the public entry points: nyala, nyala/krpc, nyala/demo, nyala/testing', async (t) => {
  const docs = markdownFiles()
  t.ok(docs.includes('README.md') && docs.includes('docs/cluster.md') && docs.includes('docs/threads.md'), `${docs.length} Markdown files`)
  for (const doc of readdirSync(`${root}/docs`)) if (doc.endsWith('.md')) t.ok(docs.includes(`docs/${doc}`), `docs/${doc} is checked`)
  const publicEntries = ['nyala', 'nyala/krpc', 'nyala/demo', 'nyala/testing']
  for (const doc of docs) {
    const text = readFileSync(`${root}/${doc}`, 'utf8')
    // import ... from 'X', import('X'), require('X'), with either quote
    for (const m of text.matchAll(/(?:from\s+|import\s*\(\s*|require\s*\(\s*|import\s+)['"](nyala(?:\/[^'"]*)?)['"]/g)) {
      t.ok(publicEntries.includes(m[1]!), `${doc} imports ${m[1]}`)
    }
    // and no deep path into the package in prose either (nyala/dist/..., nyala/reactor/...)
    const deep = [...text.matchAll(/\bnyala\/(?!krpc\b|demo\b|testing\b)[\w.-]+/g)].map((m) => m[0])
    t.same(deep, [], `${doc} names no path inside the package`)
  }
})

t.test('new RetryBudget() needs no clock: it runs on the real one (no deep import of realClock)', async (t) => {
  const { RetryBudget, realClock } = await import('../reactor/index.js')
  const { KrpcClient } = await import('../reactor/krpc/index.js')
  const budget = new RetryBudget()
  budget.recordCall()
  t.equal(budget.balance, 100, 'the default floor: 10 retries per second over a 10 s window')
  t.equal(budget.tryWithdraw(), true)
  t.same(budget.stats, { calls: 1, retries: 1, refused: 0 })
  const strict = new RetryBudget({ ratio: 0, minRetriesPerSecond: 0 })
  t.equal(strict.ratio, 0, 'options alone, as the first argument')
  t.equal(strict.tryWithdraw(), false, 'no budget, no retry')
  const explicit = new RetryBudget(realClock, { windowMs: 1000 })
  t.equal(explicit.windowMs, 1000, 'a clock and options')
  const client = new KrpcClient({ retry: { budget: new RetryBudget({ ratio: 0.5 }) } })
  t.equal(client.retryStats?.budget?.calls, 0, 'a client takes it as its retry budget')
  client.close()
})

t.test('the native transport is built at pack time and shipped, never at install; npm test builds it where it can', async (t) => {
  const manifest = JSON.parse(readFileSync(`${root}/package.json`, 'utf8')) as { files: string[], scripts: Record<string, string>, optionalDependencies?: Record<string, string> }
  t.ok(manifest.files.includes('prebuilds/'), 'files ships prebuilds/')
  for (const name of ['transport/native/*.c', 'transport/native/*.h', 'transport/native/build.sh']) t.ok(manifest.files.includes(name), `files ships ${name} (the source build)`)
  t.match(manifest.scripts.prepack, /sh transport\/native\/build\.sh$/, 'prepack builds prebuilds/linux-x64/nyala.node (and fails without a compiler: a published package carries it)')
  t.match(manifest.scripts.test, /sh transport\/native\/build\.sh --if-possible/, 'npm test builds it first when it can')
  t.same(Object.keys(manifest.scripts).filter((name) => /^(pre|post)?install$/.test(name)), [], 'no install script')
  t.ok(manifest.optionalDependencies?.['node-api-headers'] !== undefined, 'node-api-headers comes along for a source build')
  t.notOk(existsSync(`${root}/binding.gyp`), 'no binding.gyp (npm would run node-gyp at install)')
  t.match(readFileSync(`${root}/.gitignore`, 'utf8'), /^prebuilds\/$/m, 'the built binary is not committed')
})
