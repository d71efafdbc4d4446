/**
 * The API reference (docs/api/, TypeDoc with typedoc-plugin-markdown, from
 * the TSDoc comments) covers the public entry points of package.json's
 * exports map, each under its import name; every exported member has a
 * comment, every type a public signature names is exported by an entry
 * point or is a folded type typedoc.json lists as `intentionallyNotExported`
 * (test/public-types.test.ts keeps that list exact), and every link resolves (TypeDoc's validation, which typedoc.json
 * makes fatal: `npm run docs:api` then generates nothing); and docs/api/ is
 * what the sources generate now (regenerated into a temporary folder and
 * compared), so the reference never goes stale.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '')
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { name: string, exports: Record<string, { default: string } | string> }
const config = JSON.parse(readFileSync(join(root, 'typedoc.json'), 'utf8')) as { entryPoints: string[], out: string, treatValidationWarningsAsErrors?: boolean }

/** The exports map's modules: import name → source file. */
const entries = Object.entries(pkg.exports).flatMap(([name, entry]) => typeof entry === 'string'
  ? []
  : [[`${pkg.name}${name.slice(1)}`, entry.default.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts')] as const])

/** Every file under `dir`, relative to it, sorted. */
function walk (dir: string, prefix = ''): string[] {
  if (!existsSync(join(dir, prefix))) return []
  const found: string[] = []
  for (const entry of readdirSync(join(dir, prefix), { withFileTypes: true })) {
    if (entry.isDirectory()) found.push(...walk(dir, `${prefix}${entry.name}/`))
    else found.push(`${prefix}${entry.name}`)
  }
  return found.sort()
}

// TypeDoc reads the whole program: up to a minute on a busy machine, bounded here.
t.setTimeout(240_000)

t.test('typedoc.json documents exactly the exports map\'s entry points, into docs/api', async (t) => {
  t.same([...config.entryPoints].sort(), entries.map(([, source]) => source).sort())
  t.equal(config.out, 'docs/api')
  t.equal(config.treatValidationWarningsAsErrors, true, 'a missing comment, an unexported type or a broken link fails `npm run docs:api`')
})

t.test('TypeDoc: every exported member documented, and docs/api/ up to date', { timeout: 200_000 }, async (t) => {
  const out = mkdtempSync(join(tmpdir(), 'nyala-api-'))
  t.teardown(() => rmSync(out, { recursive: true, force: true }))
  const child = spawn(process.execPath, [join(root, 'node_modules', 'typedoc', 'bin', 'typedoc'), '--out', out, '--logLevel', 'Warn'], {
    cwd: root, env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' }, stdio: ['ignore', 'pipe', 'pipe']
  })
  let log = ''
  child.stdout.on('data', (d: Buffer) => { log += d.toString() })
  child.stderr.on('data', (d: Buffer) => { log += d.toString() })
  const timer = setTimeout(() => child.kill('SIGKILL'), 150_000)
  const [code] = await once(child, 'exit') as [number | null]
  clearTimeout(timer)
  log = log.replace(/\x1b\[[0-9;]*m/g, '') // colours, should a terminal setting force them
  t.equal(code, 0, 'TypeDoc ran clean', { log: log.slice(-4000) })

  const lines = log.split('\n').filter((line) => line.startsWith('[warning]') || line.startsWith('[error]'))
  t.same(lines.filter((line) => line.startsWith('[error]')), [], 'no errors')

  // "<member> (<kind>), defined in nyala/<file>, does not have any documentation"
  const undocumented = new Map<string, string[]>()
  // "<type>, defined in nyala/<file>, is referenced by <member> but not included in the documentation"
  const notExported: string[] = []
  const other: string[] = []
  for (const line of lines.filter((l) => l.startsWith('[warning]'))) {
    const text = line.slice('[warning] '.length)
    const missing = /^(.*), defined in [^/]+\/(\S+), does not have any documentation$/.exec(text)
    if (missing !== null) {
      const list = undocumented.get(missing[2]!) ?? []
      list.push(missing[1]!)
      undocumented.set(missing[2]!, list)
    } else if (/is referenced by .* but not included in the documentation$/.test(text)) {
      notExported.push(text)
    } else if (/^Found \d+ errors and \d+ warnings$/.test(text)) {
      // TypeDoc's summary line.
    } else {
      other.push(text)
    }
  }
  for (const [file, members] of [...undocumented].sort()) t.same(members, [], `${file}: every exported member has a TSDoc comment`)
  // A type a public signature names but no entry point exports: export it, or fold it (typedoc.json's
  // intentionallyNotExported, and a row in CHANGELOG.md saying how to reach it).
  t.same(notExported, [], 'every type the public API names is exported by an entry point, or listed as folded')
  t.same(other, [], 'no other warnings')
  // A validation warning stops TypeDoc before it writes anything: there is nothing to compare.
  if (code !== 0) return

  // Each entry point under its import name (its `@module` tag).
  const index = readFileSync(join(out, 'README.md'), 'utf8')
  for (const [name, source] of entries) {
    const tagged = new RegExp(`@module ${name.replace('/', '\\/')}(?![\\w/])`).test(readFileSync(join(root, source), 'utf8'))
    t.ok(tagged && index.includes(`[${name}]`), `the reference has the module ${name}: \`@module ${name}\` in ${source}'s first comment`)
  }

  const generated = walk(out)
  const committed = walk(join(root, config.out))
  t.same(committed, generated, 'docs/api/ has the files TypeDoc generates now (npm run docs:api)')
  const stale = generated.filter((file) => committed.includes(file) && readFileSync(join(out, file), 'utf8') !== readFileSync(join(root, config.out, file), 'utf8'))
  t.same(stale, [], 'docs/api/ says what the sources say now: run npm run docs:api when a comment or signature changes')
})
