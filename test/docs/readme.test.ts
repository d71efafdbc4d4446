/**
 * The README is an on-ramp: at most 250 lines; set-up in exactly two
 * commands; one example each for a request/response protocol, a push
 * protocol and KRPC, each run here as written (imports pointed at the
 * sources) and type-checked with the repo's compiler options; and a map
 * that links every doc of docs/ (the reference the README used to hold
 * lives there: test/docs/cli-reference.test.ts, citations.test.ts and the
 * others check those files).
 */
import t from 'tap'
import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startListening } from '../helpers/listening-child.js'
import { REPO, runSourceProgram, runTsc, toSources } from '../helpers/typegen.js'

// Four child processes and a tsc run: minutes on a busy machine, bounded here.
t.setTimeout(300_000)

const readme = readFileSync(join(REPO, 'README.md'), 'utf8')

/** The body of the section under `## heading`, to the next `## `. */
function section (heading: string): string {
  const start = readme.indexOf(`\n## ${heading}\n`)
  if (start < 0) throw new Error(`README.md has no "## ${heading}" section`)
  const rest = readme.slice(start + heading.length + 5)
  const next = rest.indexOf('\n## ')
  return next < 0 ? rest : rest.slice(0, next)
}

/** The first ```ts block of a section. */
function code (heading: string): string {
  const m = /```ts\n([\s\S]*?)```/.exec(section(heading))
  if (m === null) throw new Error(`README.md's "${heading}" has no ts block`)
  return m[1]!
}

const EXAMPLES = { 'A request/response protocol': 'kv.mts', 'A push protocol': 'pubsub.mts', KRPC: 'krpc.mts' } as const

/** Writes an example to `dir`, its imports pointed at the sources and its fixed port replaced by a free one it prints. */
function writeExample (dir: string, heading: keyof typeof EXAMPLES): string {
  const file = join(dir, EXAMPLES[heading])
  const text = toSources(code(heading)).replace(/^await server\.listen\((\d+)\)/m, 'const { port } = await server.listen(0)\nconsole.log(`listening on 127.0.0.1:${port}`)')
  writeFileSync(file, text)
  return file
}

/** Connects, sends `lines` and collects what arrives until `done` says so (at most ~2 s). */
async function exchange (port: number, lines: string, done: (got: string) => boolean, socket?: Socket): Promise<{ socket: Socket, got: () => string }> {
  const s = socket ?? connect(port, '127.0.0.1')
  if (socket === undefined) await once(s, 'connect')
  let got = ''
  s.on('data', (d: Buffer) => { got += d.toString() })
  s.write(lines)
  for (let i = 0; i < 400 && !done(got); i++) await new Promise(resolve => setTimeout(resolve, 5))
  return { socket: s, got: () => got }
}

t.test('an on-ramp: short, two set-up commands, a map of every doc', async (t) => {
  const lines = readme.split('\n').length
  t.ok(lines <= 250, `README.md is ${lines} lines`)
  const setup = /```sh\n([\s\S]*?)```/.exec(section('Set up'))![1]!.trim().split('\n').map((l) => l.replace(/\s+#.*$/, ''))
  t.same(setup, ['npm ci && npm start', 'npm test'], 'exactly two set-up commands')
  const map = section('Docs')
  for (const doc of readdirSync(join(REPO, 'docs')).filter((f) => f.endsWith('.md'))) {
    t.equal(map.split('\n').filter((l) => l.startsWith(`- [docs/${doc}](docs/${doc})`)).length, 1, `one line for docs/${doc}`)
  }
  t.match(section('Figures'), /\[bench\/RESULTS\.md\]\(bench\/RESULTS\.md\)/, 'the figures link their source')
  t.match(section('Figures'), /\(20\d\d-\d\d-\d\d\)/, 'and are dated')
})

t.test('the three examples type-check', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-readme-tsc-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const files: string[] = []
  for (const heading of Object.keys(EXAMPLES) as Array<keyof typeof EXAMPLES>) {
    const name = EXAMPLES[heading].replace(/\.mts$/, '.ts')
    writeFileSync(join(dir, name), code(heading))
    t.same([...code(heading).matchAll(/from '([^']+)'/g)].map((m) => m[1]!).filter((m) => !m.startsWith('nyala')), [], `${heading}: imports only the package`)
    files.push(name)
  }
  const ran = await runTsc(dir, files)
  t.equal(ran.code, 0, ran.output)
})

t.test('the request/response example answers as the README says', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-readme-kv-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const { child, port } = await startListening(t, writeExample(dir, 'A request/response protocol'))
  const { socket, got } = await exchange(port, 'SET greeting hello world\nGET greeting\nDEL greeting\n', (g) => g.split('\n').length > 3)
  socket.destroy()
  t.equal(got(), 'OK\nhello world\n-ERR no-method: call on service kv received with an invalid method name: DEL\n')
  t.match(section('A request/response protocol'), "`printf 'SET greeting hello world\\nGET greeting\\n' | nc 127.0.0.1 7380` prints `OK` and\n`hello world`", 'the README shows those answers')
  child.kill('SIGTERM')
  await once(child, 'exit')
})

t.test('the push example fans a message out to its subscribers', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-readme-push-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const { child, port } = await startListening(t, writeExample(dir, 'A push protocol'))
  const a = await exchange(port, 'SUB\n', (g) => g === 'OK\n')
  const b = await exchange(port, 'SUB\n', (g) => g === 'OK\n')
  const publisher = await exchange(port, 'PUB hello there\n', (g) => g.endsWith('\n'))
  for (let i = 0; i < 400 && !(a.got().endsWith('> hello there\n') && b.got().endsWith('> hello there\n')); i++) await new Promise(resolve => setTimeout(resolve, 5))
  t.equal(publisher.got(), '2\n', 'PUB answers how many it reached')
  t.equal(a.got(), 'OK\n> hello there\n', 'the first subscriber gets the push')
  t.equal(b.got(), 'OK\n> hello there\n', 'and the second')
  for (const s of [a, b, publisher]) s.socket.destroy()
  child.kill('SIGTERM')
  await once(child, 'exit')
})

t.test('the KRPC example runs to its end and prints what it says', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-readme-krpc-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const ran = await runSourceProgram(writeExample(dir, 'KRPC'))
  t.equal(ran.code, 0, ran.stderr)
  t.equal(ran.stdout, '{ result: 3 }\n')
})
