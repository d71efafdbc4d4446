// docs/your-own-service.md is a walkthrough: this test runs it. The doc's
// .proto goes through `nyala gen`; the generated file and the doc's server
// and client type-check under the repo's strict compiler options (`nyala`
// mapped to the sources), and a handler of the wrong type does not; then
// the server runs on 127.0.0.1 port 0, the client prints what the doc shows,
// and `nyala call --proto` answers as the doc shows.
import t from 'tap'
import { once } from 'node:events'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startListening } from '../helpers/listening-child.js'
import { runCli, runSourceProgram, runTsc, toSources } from '../helpers/typegen.js'

const doc = readFileSync(new URL('../../docs/your-own-service.md', import.meta.url), 'utf8')
const blocks = (lang: string): string[] => [...doc.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]!)

t.test('the walkthrough: generate, type-check, serve, call', async (t) => {
  const [proto] = blocks('proto')
  const [server, client] = blocks('ts')
  const [shown] = blocks('text')
  t.ok(proto !== undefined && server !== undefined && client !== undefined && shown !== undefined, 'the doc has the .proto, the server, the client and the output')
  const imports = [...`${server}${client}`.matchAll(/from '([^']+)'/g)].map((m) => m[1]!)
  t.same(imports.filter((i) => !i.startsWith('./')), ['nyala/krpc', 'nyala/krpc'], 'the code imports only the package\'s KRPC entry point (and the generated file)')

  const dir = mkdtempSync(join(tmpdir(), 'nyala-own-service-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, 'kv.proto'), proto!)
  writeFileSync(join(dir, 'server.ts'), server!)
  writeFileSync(join(dir, 'client.ts'), client!)

  // nyala gen kv.proto, as the doc runs it (from the sources).
  const gen = await runCli(t, ['gen', join(dir, 'kv.proto')])
  t.equal(gen.code, 0, `nyala gen: ${gen.stderr}`)
  t.match(gen.stdout, /wrote .*kv\.ts/)

  const checked = await runTsc(dir, ['kv.ts', 'server.ts', 'client.ts'])
  t.equal(checked.code, 0, `the generated file, the server and the client compile under strict TypeScript:\n${checked.output}`)

  // The doc's claim: a handler of the wrong type does not compile.
  const wrong = mkdtempSync(join(tmpdir(), 'nyala-own-service-wrong-'))
  t.teardown(() => rmSync(wrong, { recursive: true, force: true }))
  writeFileSync(join(wrong, 'kv.ts'), readFileSync(join(dir, 'kv.ts'), 'utf8'))
  t.match(server!, /return \{ version \}/)
  writeFileSync(join(wrong, 'server.ts'), server!.replace('return { version }', 'return { version: 1 }'))
  const refused = await runTsc(wrong, ['kv.ts', 'server.ts'])
  t.not(refused.code, 0, 'a number where the .proto says int64 is a compile error')
  t.match(refused.output, /server\.ts\(\d+,\d+\): error TS2322/)

  // Run them: the sources with `nyala` pointed at the repo.
  const run = join(dir, 'run')
  mkdirSync(run)
  for (const file of ['kv.ts', 'server.ts', 'client.ts']) writeFileSync(join(run, file.replace(/\.ts$/, '.mts')), toSources(readFileSync(join(dir, file), 'utf8')).replace(/'\.\/kv\.js'/g, "'./kv.mts'"))
  const { child, port } = await startListening(t, join(run, 'server.mts'), [], { ...process.env, PORT: '0' })
  const ran = await runSourceProgram(join(run, 'client.mts'), [`127.0.0.1:${port}`])
  t.equal(ran.code, 0, ran.stderr)
  t.equal(ran.stdout, shown, 'the client prints what the doc shows')

  // nyala call --proto, each command of section 5 and the line the doc shows after it.
  const section = doc.slice(doc.indexOf('## 5.'))
  const sh = /```sh\n([\s\S]*?)```/.exec(section)![1]!.trim().split('\n')
  t.equal(sh.length, 4, 'two commands, each with its answer')
  for (let i = 0; i < sh.length; i += 2) {
    const args = [...sh[i]!.matchAll(/'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2]!).slice(2)
    t.equal(args[0], 'call')
    const argv = args.map((a) => a === '127.0.0.1:7070' ? `127.0.0.1:${port}` : a === 'kv.proto' ? join(dir, 'kv.proto') : a)
    const called = await runCli(t, argv)
    t.equal(called.code, 0, called.stderr)
    t.equal(called.stdout.trim(), sh[i + 1], `nyala ${args.slice(0, 3).join(' ')}`)
  }

  child.kill('SIGTERM')
  await once(child, 'exit')
})
