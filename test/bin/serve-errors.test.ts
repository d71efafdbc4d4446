/**
 * `nyala serve` start-up errors, through the bin/nyala launcher and dist/
 * (built by `npx tsc -p tsconfig.json`): a busy RPC port, a busy metrics
 * port, a port out of range, a busy port with two reactor processes, and a
 * password file or TLS key that cannot be read.
 * Each must be one line on stderr naming the problem, no stack, no
 * `listening on`, a non-zero exit, and nothing left running: no process
 * the CLI started survives it and the ports it was given are free again.
 * Each run is bounded; on timeout the CLI and its children are killed by pid.
 */
import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createServer, type AddressInfo, type Server as NetServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

t.setTimeout(240_000)

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const LAUNCHER = `${ROOT}bin/nyala`
const RUN_LIMIT_MS = 60_000

// The launcher runs dist/: test it when dist/ was built from these sources.
const BUILT_FROM = ['bin/serve.ts', 'bin/cli.ts', 'reactor/cluster.ts', 'reactor/cluster-reactor.ts', 'reactor/server.ts', 'reactor/krpc/password-file.ts', 'bin/tls-flags.ts']
const distFresh = BUILT_FROM.every((f) => {
  const out = `${ROOT}dist/${f.replace(/\.ts$/, '.js')}`
  return existsSync(out) && statSync(out).mtimeMs >= statSync(`${ROOT}${f}`).mtimeMs
})
const skip = distFresh ? false : 'dist/ is missing or older than the sources: npx tsc -p tsconfig.json'
// npm test builds dist/ first; under CI a stale dist/ is a failure, not a skip (nothing would be tested).
if (!distFresh && process.env.CI !== undefined && process.env.CI !== '') {
  t.fail('dist/ is missing or older than the sources while CI is set: the launcher tests below cannot run (npm test builds it)')
}

/** The parent pid of `pid` (Linux /proc), or null once it is gone. */
function parentOf (pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
  } catch {
    return null
  }
}

/** Processes whose parent is `pid` now. */
function childrenOf (pid: number): number[] {
  const found: number[] = []
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    if (parentOf(Number(entry)) === pid) found.push(Number(entry))
  }
  return found
}

/** Alive and not a zombie. */
function isRunning (pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z'
  } catch {
    return false
  }
}

interface Outcome { code: number | null, signal: string | null, stdout: string, stderr: string, children: number[] }

/**
 * Runs `node bin/nyala ARGS`, watching which processes it starts (polling
 * /proc while it runs), bounded by RUN_LIMIT_MS: past it, the CLI and every
 * child seen are killed by pid and the run fails.
 */
async function nyala (t: Test, args: string[]): Promise<Outcome> {
  const env = { ...process.env }
  delete env.NODE_OPTIONS
  delete env.NYALA_DEBUG
  // env(1) drops NODE_OPTIONS again just before it execs node (same pid): tap's spawn wrapper
  // puts its coverage hooks back in, and on Node 26 they load the extensionless ES module
  // bin/nyala through require() (ERR_REQUIRE_CYCLE_MODULE). Users run it without them.
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, LAUNCHER, ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
  const pid = child.pid!
  const children = new Set<number>()
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (d: Buffer) => { stdout += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { stderr += d.toString() })
  const watch = setInterval(() => { for (const c of childrenOf(pid)) children.add(c) }, 5)
  const killAll = (): void => {
    for (const c of children) { try { process.kill(c, 'SIGKILL') } catch {} }
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  }
  t.teardown(killAll)
  let timedOut = false
  const limit = setTimeout(() => { timedOut = true; killAll() }, RUN_LIMIT_MS)
  const [code, signal] = await new Promise<[number | null, string | null]>((resolve) => child.once('close', (c, s) => resolve([c, s])))
  clearTimeout(limit)
  clearInterval(watch)
  if (timedOut) t.fail(`nyala ${args.join(' ')} still ran after ${RUN_LIMIT_MS} ms; killed. stdout: ${stdout} stderr: ${stderr}`)
  return { code, signal, stdout, stderr, children: [...children] }
}

async function occupy (t: Test): Promise<number> {
  const taken: NetServer = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { taken.close() })
  return (taken.address() as AddressInfo).port
}

/** A port that was free a moment ago. */
async function freePort (): Promise<number> {
  const probe = createServer()
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve))
  const port = (probe.address() as AddressInfo).port
  await new Promise<void>((resolve) => probe.close(() => resolve()))
  return port
}

/** True when nothing listens on 127.0.0.1:port (it can be bound, then is let go). */
async function isFree (port: number): Promise<boolean> {
  const probe = createServer()
  const bound = await new Promise<boolean>((resolve) => {
    probe.once('error', () => resolve(false))
    probe.listen(port, '127.0.0.1', () => resolve(true))
  })
  if (bound) await new Promise<void>((resolve) => probe.close(() => resolve()))
  return bound
}

/** One line naming the problem, exit ≠ 0, no stack, never listening, no child left. */
function assertFailedCleanly (t: Test, run: Outcome, problem: RegExp): void {
  t.not(run.code, 0, 'exits non-zero')
  t.not(run.code, null, `exits by itself (signal: ${run.signal})`)
  t.match(run.stderr, /^nyala serve: [^\n]+\n$/, `one line on stderr: ${JSON.stringify(run.stderr)}`)
  t.match(run.stderr, problem, 'naming the problem')
  t.notMatch(run.stderr, /\n\s+at /, 'no stack')
  t.notMatch(run.stdout, /listening on/, 'never listening')
  for (const c of run.children) t.notOk(isRunning(c), `child ${c} of the CLI is gone`)
}

t.test('a busy RPC port: one line, exit 1, nothing left', { skip }, async (t) => {
  const port = await occupy(t)
  const run = await nyala(t, ['serve', '--reactors', '1', '--port', String(port)])
  assertFailedCleanly(t, run, new RegExp(`^nyala serve: cannot listen on 127\\.0\\.0\\.1:${port}: address already in use \\(EADDRINUSE\\)\\n$`))
  t.equal(run.code, 1)
})

t.test('a busy metrics port: fails before serving, and the RPC port is not left open', { skip }, async (t) => {
  const metricsPort = await occupy(t)
  const rpcPort = await freePort()
  const run = await nyala(t, ['serve', '--reactors', '1', '--port', String(rpcPort), '--metrics-port', String(metricsPort)])
  assertFailedCleanly(t, run, new RegExp(`^nyala serve: metrics port 127\\.0\\.0\\.1:${metricsPort}: address already in use \\(EADDRINUSE\\)\\n$`))
  t.ok(await isFree(rpcPort), 'no RPC listener left')
})

t.test('--port 99999 is refused in one line', { skip }, async (t) => {
  const run = await nyala(t, ['serve', '--reactors', '1', '--port', '99999'])
  assertFailedCleanly(t, run, /^nyala serve: --port must be 0-65535, got 99999\n$/)
  t.equal(run.code, 2, 'a usage error')
})

t.test('--reactors 2 on a busy port: one line, and every reactor process is gone', { skip }, async (t) => {
  const port = await occupy(t)
  const run = await nyala(t, ['serve', '--reactors', '2', '--port', String(port)])
  assertFailedCleanly(t, run, new RegExp(`^nyala serve: cannot listen on 127\\.0\\.0\\.1:${port}: address already in use \\(EADDRINUSE\\)\\n$`))
})

t.test('--reactors 2 whose reactors fail before listening (their server cannot be built): one line, all gone', { skip }, async (t) => {
  const rpcPort = await freePort()
  const run = await nyala(t, ['serve', '--reactors', '2', '--port', String(rpcPort), '--max-connections', '0'])
  assertFailedCleanly(t, run, /^nyala serve: reactor \d \(pid \d+\) exited with code 1 before listening: maxConnections must be an integer of at least 1, got 0\n$/)
  t.ok(await isFree(rpcPort), 'no RPC listener left')
})

t.test('--reactors 2 with a busy metrics port: no reactor is started', { skip }, async (t) => {
  const metricsPort = await occupy(t)
  const rpcPort = await freePort()
  const run = await nyala(t, ['serve', '--reactors', '2', '--port', String(rpcPort), '--metrics-port', String(metricsPort)])
  assertFailedCleanly(t, run, /^nyala serve: metrics port 127\.0\.0\.1:\d+: address already in use \(EADDRINUSE\)\n$/)
  t.ok(await isFree(rpcPort), 'no RPC listener left')
})

t.test('--password-file and --tls-key that cannot be read, --require-tls without a certificate: one line, exit 2, nothing left', { skip }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-serve-files-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const missing = join(dir, 'missing')
  const cert = join(dir, 'cert.pem')
  writeFileSync(cert, 'not a certificate\n')
  const rpcPort = await freePort()
  const passwords = await nyala(t, ['serve', '--reactors', '2', '--port', String(rpcPort), '--password-file', missing])
  assertFailedCleanly(t, passwords, new RegExp(`^nyala serve: cannot read password file ${missing}: ENOENT`))
  t.equal(passwords.code, 2, 'a usage error')
  t.same(passwords.children, [], 'refused before any reactor is started')
  const key = await nyala(t, ['serve', '--reactors', '1', '--port', String(rpcPort), '--tls-cert', cert, '--tls-key', missing])
  assertFailedCleanly(t, key, new RegExp(`^nyala serve: --tls-key ${missing}: cannot read it \\(no such file\\)\n$`))
  t.equal(key.code, 2)
  const requireTls = await nyala(t, ['serve', '--reactors', '1', '--port', String(rpcPort), '--require-tls'])
  assertFailedCleanly(t, requireTls, /^nyala serve: --require-tls needs --tls-cert and --tls-key\n$/)
  t.equal(requireTls.code, 2)
  t.ok(await isFree(rpcPort), 'no RPC listener left')
})

t.test('the launcher: a thrown error with a code is one line, anything else shows its stack, a missing dist/ says so', async (t) => {
  // bin/nyala itself, beside stub dist/bin/cli.js files that throw.
  const dir = mkdtempSync(join(tmpdir(), 'nyala-launcher-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  mkdirSync(join(dir, 'bin'))
  copyFileSync(LAUNCHER, join(dir, 'bin', 'nyala'))
  writeFileSync(join(dir, 'package.json'), '{"type":"module"}\n')
  const runStub = async (body: string | null): Promise<Outcome> => {
    if (body !== null) {
      mkdirSync(join(dir, 'dist', 'bin'), { recursive: true })
      writeFileSync(join(dir, 'dist', 'bin', 'cli.js'), `export async function main () { ${body} }\n`)
    }
    const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, join(dir, 'bin', 'nyala'), 'serve'], { stdio: ['ignore', 'pipe', 'pipe'] })
    t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
    let stdout = ''
    let stderr = ''
    child.stdout!.on('data', (d: Buffer) => { stdout += d.toString() })
    child.stderr!.on('data', (d: Buffer) => { stderr += d.toString() })
    const limit = setTimeout(() => child.kill('SIGKILL'), RUN_LIMIT_MS)
    const [code, signal] = await new Promise<[number | null, string | null]>((resolve) => child.once('close', (c, s) => resolve([c, s])))
    clearTimeout(limit)
    return { code, signal, stdout, stderr, children: [] }
  }
  const missing = await runStub(null)
  t.equal(missing.code, 1)
  t.match(missing.stderr, /^nyala: dist\/ is not built: run npm ci[^\n]*\n$/)

  // A pending timer would keep a process alive that only set exitCode.
  const coded = await runStub("setTimeout(() => {}, 600000); throw Object.assign(new Error('cannot listen on 127.0.0.1:1: permission denied (EACCES)'), { code: 'EACCES' })")
  t.equal(coded.code, 1, 'exits at once, though a timer is pending')
  t.equal(coded.stderr, 'nyala: cannot listen on 127.0.0.1:1: permission denied (EACCES)\n')

  const bug = await runStub("throw new TypeError('x is not a function')")
  t.equal(bug.code, 1)
  t.match(bug.stderr, /^nyala: TypeError: x is not a function\n\s+at /, 'a bug keeps its stack')
})
