/**
 * The package as a user gets it: `npm pack` (its prepack and prepare
 * scripts build a fresh dist/) in a copy of the sources, the tarball
 * installed into an empty project with the machine's npm (the
 * dependencies from npm's cache where it has them, else from the registry,
 * as for a user: `npm ci` caches their tarballs but not the registry's
 * package documents that an install resolves ranges with), and
 * docs/custom-protocols.md's kv server run there with a plain `node`,
 * importing only 'nyala'. The tarball carries what its entry points,
 * its bin and the modules they load by path need, and no tests; and the
 * native transport prebuilt by its prepack script (linux-x64), with the C
 * sources and build.sh for a source build, and no install script: the
 * prebuilt loads in the installed package and echoes on each backend, and
 * build.sh rebuilds it there (the fallback where the prebuilt cannot load).
 */
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { connect } from 'node:net'
import { once } from 'node:events'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import ts from 'typescript'

const root = fileURLToPath(new URL('..', import.meta.url)).replace(/\/$/, '')
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { name: string, version: string, exports: Record<string, { types: string, default: string } | string> }

// What the build needs of the checkout: the sources tsconfig.json names
// (the tests apart: the package carries none) and the files the package ships as they are.
const COPIED = ['package.json', 'package-lock.json', 'tsconfig.json', 'README.md', 'CHANGELOG.md', 'bin', 'bench', 'codec', 'docs', 'examples', 'reactor', 'scheduling', 'transport']

// Modules loaded by a computed path (fork, Worker, spawn), which an import scan does not see.
const LOADED_BY_PATH = ['dist/bin/serve-reactor.js', 'dist/bin/trace-server.js', 'dist/bench/bench-server.js', 'dist/bench/bench-load.js', 'dist/reactor/krpc/thread-worker.js']

// npm's own variables (set when the suite runs under `npm test`) would steer the nested npm: it gets a clean environment.
const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([key]) => !/^npm_/i.test(key)))

/** Runs npm in `cwd`, bounded in time: its stdout, and stdout and stderr together; rejects with them if it fails. */
async function npm (cwd: string, args: string[], timeoutMs: number): Promise<{ stdout: string, output: string }> {
  const child = spawn('npm', args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let output = ''
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString(); output += d.toString() })
  child.stderr.on('data', (d: Buffer) => { output += d.toString() })
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
  const [code, signal] = await once(child, 'exit') as [number | null, NodeJS.Signals | null]
  clearTimeout(timer)
  if (code !== 0) throw new Error(`npm ${args.join(' ')} ended with ${code ?? signal}:\n${output}`)
  return { stdout, output }
}

/** Every file under `dir`, as paths relative to it. */
function walk (dir: string, prefix = ''): string[] {
  const found: string[] = []
  for (const entry of readdirSync(join(dir, prefix), { withFileTypes: true })) {
    if (entry.isDirectory()) found.push(...walk(dir, `${prefix}${entry.name}/`))
    else found.push(`${prefix}${entry.name}`)
  }
  return found
}

// A build, an install and a type check: more than the suite's default per-file timeout, still bounded.
t.setTimeout(300_000)

const NATIVE = 'prebuilds/linux-x64/nyala.node'
const nativeHere = process.platform === 'linux' && process.arch === 'x64'

const npmVersion = spawnSync('npm', ['--version'], { env, encoding: 'utf8', timeout: 30_000 })
const skip = npmVersion.status === 0 ? false : 'npm is not on the PATH'

t.test('npm pack, then install the tarball into an empty project and run the kv example against it', { skip, timeout: 280_000 }, async (t) => {
  const work = mkdtempSync(join(tmpdir(), 'nyala-pack-'))
  t.teardown(() => rmSync(work, { recursive: true, force: true }))
  const source = join(work, 'source')
  for (const name of COPIED) cpSync(join(root, name), join(source, name), { recursive: true })
  // A module compiled from a source since removed: prepack clears dist/ so that it is not shipped.
  mkdirSync(join(source, 'dist', 'reactor'), { recursive: true })
  writeFileSync(join(source, 'dist', 'reactor', 'removed-module.js'), 'export {}\n')
  symlinkSync(join(root, 'node_modules'), join(source, 'node_modules'), 'dir')

  const packed = await npm(source, ['pack', '--json', '--pack-destination', work], 150_000)
  const report = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as Array<{ filename: string, files: Array<{ path: string }> }>
  const files = report[0]!.files.map((f) => f.path)
  const tarball = join(work, report[0]!.filename)
  t.ok(existsSync(tarball), `npm pack wrote ${report[0]!.filename} (${files.length} files)`)

  t.test('the tarball: dist/ built by npm pack, the bin, the .proto assets, README and docs; no tests', async (t) => {
    for (const name of ['package.json', 'README.md', 'CHANGELOG.md', 'bin/nyala', 'codec/krpc/rpc_header.proto', 'examples/calculator/calculator.proto', 'docs/custom-protocols.md', 'docs/api/README.md', 'dist/reactor/index.js', 'dist/reactor/index.d.ts', 'dist/bin/cli.js']) {
      t.ok(files.includes(name), `carries ${name}`)
    }
    t.same(files.filter((f) => /^(test|dist\/test)\//.test(f) || /\.ts$/.test(f) && !f.endsWith('.d.ts')), [], 'no tests and no TypeScript sources')
    t.notOk(files.includes('dist/reactor/removed-module.js'), 'nothing left in dist/ from before the build')
  })

  t.test('the native transport: prebuilt at pack time, its sources beside it, no install script', async (t) => {
    t.ok(files.includes(NATIVE), `carries ${NATIVE}, built by prepack`)
    for (const name of ['transport/native/build.sh', 'transport/native/nyala.h', 'transport/native/addon.c', 'transport/native/send.c', 'transport/native/epoll.c', 'transport/native/uring.c', 'transport/native/heap.c']) {
      t.ok(files.includes(name), `carries ${name} (the source build)`)
    }
    t.notOk(files.includes('binding.gyp'), 'no binding.gyp (npm would add `node-gyp rebuild` as an install script)')
    const packed = JSON.parse(readFileSync(join(source, 'package.json'), 'utf8')) as { scripts?: Record<string, string>, gypfile?: boolean }
    t.same(Object.keys(packed.scripts ?? {}).filter((name) => /^(pre|post)?install$/.test(name)), [], 'no preinstall, install or postinstall script')
    t.notOk(packed.gypfile, 'not a gyp package')
  })

  const app = join(work, 'app')
  mkdirSync(app)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'kv-app', version: '1.0.0', private: true, type: 'module' }, null, 2))
  const installed = await npm(app, ['install', '--prefer-offline', '--no-audit', '--no-fund', tarball], 120_000)
  const home = join(app, 'node_modules', pkg.name)
  t.ok(existsSync(join(home, 'dist', 'reactor', 'index.js')), `installed ${pkg.name} with its dist/ (${/added \d+ packages?/.exec(installed.output)?.[0] ?? 'npm said nothing'})`)

  t.test('installing ran no script; the prebuilt loads and echoes on each backend; build.sh rebuilds it from the installed sources', { skip: nativeHere ? false : 'the prebuilt is for linux-x64' }, async (t) => {
    t.notMatch(installed.output, /> (pre|post)?install\b|node-gyp|prebuild/, 'npm ran no install script')
    t.ok(existsSync(join(home, NATIVE)), `installed ${NATIVE}`)
    t.ok(existsSync(join(app, 'node_modules', 'node-api-headers', 'include', 'node_api.h')), 'node-api-headers (optional dependency: node_api.h for a source build) installed beside it')
    const echo = (addon: string): Record<string, unknown> => {
      const run = spawnSync(process.execPath, [join(root, 'test', 'helpers', 'native-echo.cjs'), addon], { env, encoding: 'utf8', timeout: 60_000 })
      t.equal(run.status, 0, `native-echo.cjs ran ${run.stderr}`)
      return JSON.parse(run.stdout.trim() || '{}') as Record<string, unknown>
    }
    const prebuilt = echo(join(home, NATIVE)) as { backends?: Record<string, string>, trimHeap?: string }
    t.equal(prebuilt.backends?.epoll, 'ok', `the prebuilt on ${process.version}: epoll echoes`)
    // io_uring can be denied (seccomp, kernel.io_uring_disabled): then the open fails, it does not echo wrong.
    t.match(prebuilt.backends?.io_uring, /^(ok|cannot open: errno \d+)$/, `io_uring: ${prebuilt.backends?.io_uring}`)
    t.equal(prebuilt.trimHeap, 'boolean', 'trimHeap is there')
    const out = join(work, 'rebuilt')
    const build = spawnSync('sh', [join(home, 'transport', 'native', 'build.sh')], { cwd: app, env: { ...env, NYALA_NATIVE_OUT: out }, encoding: 'utf8', timeout: 120_000 })
    t.equal(build.status, 0, `sh node_modules/${pkg.name}/transport/native/build.sh ${build.stdout}${build.stderr}`)
    t.equal((echo(join(out, 'nyala.node')) as { backends?: Record<string, string> }).backends?.epoll, 'ok', 'the source-built addon echoes on epoll')
  })

  t.test('every relative import of an installed module, and every module loaded by path, is installed; every benchmark module is one nyala bench loads', async (t) => {
    const modules = walk(home).filter((f) => f.endsWith('.js'))
    const imports = new Map<string, string[]>()
    const missing: string[] = []
    for (const file of modules) {
      const text = readFileSync(join(home, file), 'utf8')
      const targets: string[] = []
      for (const m of text.matchAll(/(?:from\s*|import\s*\(\s*|new URL\(\s*)['"](\.{1,2}\/[^'"]+\.(?:js|proto))['"]/g)) {
        const target = relative(home, resolve(dirname(join(home, file)), m[1]!))
        if (existsSync(join(home, target))) targets.push(target)
        else missing.push(`${file} → ${target}`)
      }
      imports.set(file, targets)
    }
    for (const file of LOADED_BY_PATH) if (!existsSync(join(home, file))) missing.push(file)
    t.same(missing, [], `${modules.length} modules, each import resolved`)
    // What the entry points, the bin and the modules loaded by path reach.
    const reached = new Set<string>()
    const exportsMap = Object.values(pkg.exports).flatMap((entry) => typeof entry === 'string' ? [] : [entry.default.replace(/^\.\//, '')])
    const pending = [...exportsMap, 'dist/bin/cli.js', ...LOADED_BY_PATH]
    for (let file = pending.pop(); file !== undefined; file = pending.pop()) {
      if (reached.has(file)) continue
      reached.add(file)
      pending.push(...imports.get(file) ?? [])
    }
    t.same(modules.filter((f) => f.startsWith('dist/bench/') && !reached.has(f)), [], 'no benchmark module that nothing installed loads')
  })

  t.test('the exports map resolves in the installed package, types beside each module', async (t) => {
    for (const [name, entry] of Object.entries(pkg.exports)) {
      if (typeof entry === 'string') continue
      const source = entry.default.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts')
      if (!existsSync(join(root, source))) {
        t.fail(`${pkg.name}${name.slice(1)} has a source`, { todo: `${source} is not written yet` })
        continue
      }
      t.ok(existsSync(join(home, entry.types)), `${name}: ${entry.types}`)
      const loaded = spawnSync(process.execPath, ['--input-type=module', '-e', `const m = await import(${JSON.stringify(pkg.name + name.slice(1))}); console.log(Object.keys(m).length)`], { cwd: app, env, encoding: 'utf8', timeout: 30_000 })
      t.equal(loaded.status, 0, `import('${pkg.name}${name.slice(1)}') loads ${loaded.stdout.trim()} exports ${loaded.stderr}`)
    }
  })

  t.test('the installed bin runs: nyala --version', async (t) => {
    // env(1) clears the loader tap's process tracking puts into NODE_OPTIONS (on Node 26 it cannot load the extensionless launcher).
    const run = spawnSync('env', ['-u', 'NODE_OPTIONS', join(app, 'node_modules', '.bin', 'nyala'), '--version'], { cwd: app, env, encoding: 'utf8', timeout: 30_000 })
    t.equal(run.status, 0, `exit 0 ${run.stderr}`)
    t.equal(run.stdout.trim(), pkg.version, 'the package\'s version')
  })

  t.test('docs/custom-protocols.md\'s kv server: its types check against the package, and it runs as the doc shows', async (t) => {
    const doc = readFileSync(join(root, 'docs', 'custom-protocols.md'), 'utf8')
    const block = /```ts\n([\s\S]*?)```/.exec(doc)![1]!
    t.same([...block.matchAll(/from '([^']+)'/g)].map((m) => m[1]), ['nyala'], 'it imports only nyala')
    writeFileSync(join(app, 'kv.ts'), block)
    // The doc's `kv.ts` against the installed declarations, as a user's project would see them.
    const tsc = spawnSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '--noEmit', '--strict', '--target', 'es2022', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--types', 'node', '--typeRoots', join(root, 'node_modules', '@types'), 'kv.ts'], { cwd: app, env, encoding: 'utf8', timeout: 60_000 })
    t.equal(tsc.status, 0, `tsc kv.ts against the installed types ${tsc.stdout}${tsc.stderr}`)
    // `.mjs without the types`, as the doc offers: plain node, no loader.
    writeFileSync(join(app, 'kv.mjs'), ts.transpileModule(block, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText)
    const child = spawn(process.execPath, ['kv.mjs'], { cwd: app, env: { ...env, PORT: '0' }, stdio: ['ignore', 'pipe', 'pipe'] })
    t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
    let out = ''
    let err = ''
    child.stderr.on('data', (d: Buffer) => { err += d.toString() })
    const port = await new Promise<number>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString()
        const m = /listening on 127\.0\.0\.1:(\d+)/.exec(out)
        if (m !== null) resolve(Number(m[1]))
      })
      child.once('exit', (code) => reject(new Error(`kv.mjs exited (${code}) before listening: ${err}`)))
    })
    const socket = connect(port, '127.0.0.1')
    await once(socket, 'connect')
    let answers = ''
    socket.on('data', (d: Buffer) => { answers += d.toString() })
    socket.write('SET greeting hello world\nGET greeting\nDEL greeting\n')
    for (let i = 0; i < 400 && answers.split('\n').length < 4; i++) await new Promise((resolve) => setTimeout(resolve, 5))
    socket.destroy()
    const shown = /\$ printf[^\n]*\n([\s\S]*?)```/.exec(doc)![1]!
    t.equal(answers, shown, 'the answers the doc shows')
    child.kill('SIGTERM')
    await once(child, 'exit')
  })
})
