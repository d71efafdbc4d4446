/**
 * The allocator tuning of the launchers (examples/malloc-env.ts): bin/nyala
 * run as a program sets MALLOC_MMAP_THRESHOLD_ before Node starts and execs
 * Node in the same process; NYALA_MALLOC=system turns it off; a threshold
 * the user chose is kept; `node bin/nyala` still runs. The real launcher
 * runs beside a stub dist/bin/cli.js that reports its process's pid and
 * environment, each run bounded and killed by pid on timeout.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { MALLOC_OPT_OUT, MMAP_THRESHOLD_BYTES, mallocTuning, tuneForkedProcesses } from '../../examples/malloc-env.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const RUN_LIMIT_MS = 30_000
const VARIABLES = ['MALLOC_MMAP_THRESHOLD_', 'GLIBC_TUNABLES', MALLOC_OPT_OUT.name, 'NODE_OPTIONS']

interface Report { pid: number, env: Record<string, string | undefined> }

const dir = mkdtempSync(join(tmpdir(), 'nyala-launcher-env-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
mkdirSync(join(dir, 'bin'))
mkdirSync(join(dir, 'dist', 'bin'), { recursive: true })
copyFileSync(join(ROOT, 'bin', 'nyala'), join(dir, 'bin', 'nyala'))
writeFileSync(join(dir, 'package.json'), '{"type":"module"}\n')
writeFileSync(join(dir, 'dist', 'bin', 'cli.js'),
  `export async function main () { process.stdout.write(JSON.stringify({ pid: process.pid, env: { ${VARIABLES.map(v => `${v}: process.env.${v}`).join(', ')} } })); return 0 }\n`)

/** Runs the copied launcher (as a program, or with `node`) with `extra` over an environment without the variables; its report and the pid it was started as. */
async function launch (extra: Record<string, string>, how: 'program' | 'node' = 'program'): Promise<{ report: Report, pid: number, code: number | null }> {
  const env: NodeJS.ProcessEnv = { ...process.env, PATH: `${dirname(process.execPath)}:${process.env.PATH ?? ''}` }
  for (const v of VARIABLES) delete env[v]
  Object.assign(env, extra)
  const launcher = join(dir, 'bin', 'nyala')
  // tap's process tracking puts its loader into every child's NODE_OPTIONS
  // (on Node 26 it cannot load the extensionless launcher); env(1) clears it
  // and execs, so the launcher starts as a user's shell starts it, same pid.
  const command = how === 'program' ? [launcher, 'serve'] : [process.execPath, launcher, 'serve']
  const child = spawn('env', ['-u', 'NODE_OPTIONS', ...command], { env, stdio: ['ignore', 'pipe', 'pipe'] })
  const limit = setTimeout(() => { if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL') }, RUN_LIMIT_MS)
  t.teardown(() => { clearTimeout(limit); if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (d: Buffer) => { stdout += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { stderr += d.toString() })
  const code = await new Promise<number | null>((resolve) => child.once('close', (c) => resolve(c)))
  clearTimeout(limit)
  if (stderr !== '') t.comment(stderr)
  return { report: JSON.parse(stdout) as Report, pid: child.pid!, code }
}

t.test('bin/nyala as a program sets the threshold and execs Node in the same process', async (t) => {
  const { report, pid, code } = await launch({})
  t.equal(code, 0)
  t.equal(report.env.MALLOC_MMAP_THRESHOLD_, String(MMAP_THRESHOLD_BYTES), 'the shell part sets the value examples/malloc-env.ts names')
  t.equal(report.pid, pid, 'exec: the server is the process the caller started (signals and /proc/PID reach it)')
})

t.test('NYALA_MALLOC=system turns it off', async (t) => {
  const { report } = await launch({ [MALLOC_OPT_OUT.name]: MALLOC_OPT_OUT.value })
  t.equal(report.env.MALLOC_MMAP_THRESHOLD_, undefined)
})

t.test('a threshold the user chose is kept', async (t) => {
  const own = await launch({ MALLOC_MMAP_THRESHOLD_: '262144' })
  t.equal(own.report.env.MALLOC_MMAP_THRESHOLD_, '262144')
  const tunable = await launch({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536' })
  t.equal(tunable.report.env.MALLOC_MMAP_THRESHOLD_, undefined, 'GLIBC_TUNABLES names one: nothing added')
  t.equal(tunable.report.env.GLIBC_TUNABLES, 'glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536', 'and it is passed on as it was')
  const other = await launch({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' })
  t.equal(other.report.env.MALLOC_MMAP_THRESHOLD_, String(MMAP_THRESHOLD_BYTES), 'other tunables: the threshold is still set')
})

t.test('node bin/nyala runs the same file as JavaScript, without the shell part', async (t) => {
  const { report, pid, code } = await launch({}, 'node')
  t.equal(code, 0)
  t.equal(report.pid, pid)
  t.equal(report.env.MALLOC_MMAP_THRESHOLD_, undefined)
})

t.test('mallocTuning and tuneForkedProcesses: what the examples give the reactors they fork', async (t) => {
  t.same(mallocTuning({}), { MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD_BYTES) })
  t.same(mallocTuning({ [MALLOC_OPT_OUT.name]: MALLOC_OPT_OUT.value }), {})
  t.same(mallocTuning({ MALLOC_MMAP_THRESHOLD_: '1048576' }), {})
  t.same(mallocTuning({ GLIBC_TUNABLES: 'glibc.malloc.mmap_threshold=65536' }), {})
  t.same(mallocTuning({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' }), { MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD_BYTES) })
  const saved = { ...process.env }
  t.teardown(() => {
    for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name]
    Object.assign(process.env, saved)
  })
  delete process.env.MALLOC_MMAP_THRESHOLD_
  delete process.env.GLIBC_TUNABLES
  delete process.env[MALLOC_OPT_OUT.name]
  tuneForkedProcesses()
  t.equal(process.env.MALLOC_MMAP_THRESHOLD_, String(MMAP_THRESHOLD_BYTES), 'set in process.env, which forked processes inherit')
})
