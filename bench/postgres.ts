/**
 * The postgres example against a real PostgreSQL 15, under pgbench with a
 * one-statement script (`SELECT 1;`), 4 clients, 10 s per run:
 *
 *   npx tsc -p tsconfig.json && flock /tmp/nyala-bench.lock node dist/bench/postgres.js [--rounds 3] [--seconds 10] [--modes simple,prepared] [--io auto|io_uring|epoll|node]
 *
 * It makes a fresh data directory in a temporary folder (initdb, trust,
 * run as the `postgres` user when started as root), starts
 * `postgres -p <free port> -c fsync=off` on 127.0.0.1, and
 * `node dist/examples/postgres/main.js --port 0 [--io IO]` (its transport;
 * default auto). Each round runs
 * `pgbench -n -c 4 -T <seconds> -M <mode> -f select1.sql` once against each
 * server per mode, one after the other, the order flipped every round
 * (the VM's speed drifts, so only runs close in time compare). It prints
 * each pair's tps and ratio (example / postgres), each server's CPU per
 * transaction (user + system time of all its processes, from /proc), and, per mode, the
 * median ratio and how many pairs the example won. A run with a failed
 * transaction is an error.
 *
 * Client and servers share the machine's cores: run it alone (under the
 * flock above). Bounded: each pgbench is killed after seconds + 60 s, the
 * whole bench after --max-minutes (default 15). Every process it starts is
 * stopped by PID at the end, also on error or interruption.
 */
import type { ChildProcess } from 'node:child_process'
import { spawnSync } from 'node:child_process'
import { chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { loadavg, userInfo } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { CLOCK_TICKS, HOST, childrenOf, freePort, median, portProbe, runBounded, startNode, startProcess, stopAll } from './processes.js'

const EXAMPLE = fileURLToPath(new URL('../examples/postgres/main.js', import.meta.url))
const PG_BIN = '/usr/lib/postgresql/15/bin'

// As root, PostgreSQL runs as the postgres user: setpriv execs it in place, so its PID is the server's.
function asPostgres (command: string, args: string[]): [string, string[]] {
  if (userInfo().uid !== 0) return [command, args]
  return ['setpriv', ['--reuid=postgres', '--regid=postgres', '--init-groups', command, ...args]]
}

async function startPostgres (dir: string): Promise<{ child: ChildProcess, port: number }> {
  if (userInfo().uid === 0) {
    const ids = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' })
    const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' })
    chownSync(dir, Number(ids.stdout.trim()), Number(gid.stdout.trim()))
  }
  const data = join(dir, 'data')
  const [initdb, initArgs] = asPostgres(join(PG_BIN, 'initdb'), ['-D', data, '-U', 'test', '--auth=trust', '--no-locale', '-E', 'UTF8', '--no-sync'])
  const init = spawnSync(initdb, initArgs, { cwd: dir, encoding: 'utf8' })
  if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr}`)
  const port = await freePort()
  const [postgres, args] = asPostgres(join(PG_BIN, 'postgres'), ['-D', data, '-p', String(port), '-h', HOST, '-k', dir, '-c', 'fsync=off', '-c', 'max_connections=20'])
  const child = await startProcess(postgres, args, portProbe(port, 200, 50), 20_000)
  for (let i = 0; ; i++) {
    const ready = spawnSync('psql', ['-X', '-h', HOST, '-p', String(port), '-U', 'test', '-d', 'postgres', '-c', 'CREATE DATABASE test'])
    if (ready.status === 0) break
    if (i > 100) throw new Error('postgres did not become ready')
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  return { child, port }
}

// CPU ticks of a server: its own, its live children's, and those of the children it reaped (PostgreSQL's backends end with their connection).
function serverTicks (pid: number): number {
  const fields = (p: number): string[] => { const stat = readFileSync(`/proc/${p}/stat`, 'latin1'); return stat.slice(stat.lastIndexOf(')') + 2).split(' ') }
  const own = fields(pid)
  let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14])
  for (const child of childrenOf(pid)) {
    try { const f = fields(child); ticks += Number(f[11]) + Number(f[12]) } catch { /* gone meanwhile: reaped, counted above next time */ }
  }
  return ticks
}

// One pgbench run: its tps, and the server's CPU per transaction (µs; user + system, all its processes).
async function pgbench (port: number, pid: number, mode: string, seconds: number, script: string): Promise<{ tps: number, cpuUs: number }> {
  const args = ['-n', '-c', '4', '-T', String(seconds), '-M', mode, '-f', script, '-h', HOST, '-p', String(port), '-U', 'test', 'test']
  const before = serverTicks(pid)
  const { code, out } = await runBounded('pgbench', args, (seconds + 60) * 1000)
  // The backends' exit and reaping: a moment after pgbench's.
  await new Promise(resolve => setTimeout(resolve, 300))
  const ticks = serverTicks(pid) - before
  const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(out)
  const failed = /number of failed transactions: (\d+)/.exec(out)
  const done = /number of transactions actually processed: (\d+)/.exec(out)
  if (code !== 0 || tps === null || failed === null || failed[1] !== '0' || done === null) throw new Error(`pgbench ${args.join(' ')} failed (exit ${code}): ${out.slice(-500)}`)
  return { tps: Number(tps[1]), cpuUs: ticks * (1e6 / CLOCK_TICKS) / Number(done[1]) }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      seconds: { type: 'string', default: '10' },
      modes: { type: 'string', default: 'simple,prepared' },
      io: { type: 'string' },
      'max-minutes': { type: 'string', default: '15' }
    },
    strict: true
  })
  const rounds = Number(values.rounds)
  const seconds = Number(values.seconds)
  const maxMinutes = Number(values['max-minutes'])
  const modes = values.modes.split(',')
  if (![rounds, seconds, maxMinutes].every(n => Number.isInteger(n) && n >= 1) || modes.some(m => !['simple', 'extended', 'prepared'].includes(m))) {
    throw new RangeError('--rounds, --seconds and --max-minutes take positive integers; --modes a list of simple, extended, prepared')
  }
  const dir = mkdtempSync('/tmp/nyala-bench-pg-')
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    void stopAll().then(() => { rmSync(dir, { recursive: true, force: true }); process.exit(2) })
  }, maxMinutes * 60_000)
  try {
    const script = join(dir, 'select1.sql')
    writeFileSync(script, 'SELECT 1;\n')
    const postgres = await startPostgres(dir)
    const example = await startNode([EXAMPLE, '--port', '0', ...(values.io === undefined ? [] : ['--io', values.io])])
    console.log(`pgbench -n -c 4 -T ${seconds} -M MODE -f select1.sql (SELECT 1;); ${rounds} rounds; postgres pid ${postgres.child.pid}, example pid ${example.child.pid} (--io ${values.io ?? 'auto'}); ratio = example / postgres; load average ${loadavg().map(n => n.toFixed(2)).join(' ')}`)
    console.log('mode      round   postgres tps    example tps   ratio   server CPU µs/transaction: postgres example')
    const summary: string[] = []
    const ratios = new Map<string, number[]>()
    for (let round = 0; round < rounds; round++) {
      const exampleFirst = round % 2 === 1
      for (const mode of modes) {
        const tps: { postgres?: number, example?: number } = {}
        const cpu: { postgres?: number, example?: number } = {}
        for (const which of exampleFirst ? ['example', 'postgres'] as const : ['postgres', 'example'] as const) {
          const server = which === 'postgres' ? postgres : example
          const run = await pgbench(server.port, server.child.pid!, mode, seconds, script)
          tps[which] = run.tps
          cpu[which] = run.cpuUs
        }
        const ratio = tps.example! / tps.postgres!
        ratios.set(mode, [...(ratios.get(mode) ?? []), ratio])
        console.log(`${mode.padEnd(9)} ${String(round + 1).padStart(5)}  ${tps.postgres!.toFixed(0).padStart(13)}  ${tps.example!.toFixed(0).padStart(13)}   ${ratio.toFixed(3)}   ${cpu.postgres!.toFixed(1).padStart(6)} ${cpu.example!.toFixed(1).padStart(6)}${exampleFirst ? '  (example first)' : ''}`)
      }
    }
    for (const [mode, values] of ratios) {
      summary.push(`${mode}: median ratio ${median(values).toFixed(3)} over ${values.length} pairs, example ahead in ${values.filter(r => r > 1).length}`)
    }
    for (const line of summary) console.log(line)
  } finally {
    clearTimeout(deadline)
    await stopAll()
    rmSync(dir, { recursive: true, force: true })
  }
}

// Interrupted: still take the servers down.
process.once('SIGINT', () => { void stopAll().then(() => process.exit(130)) })

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err)
  process.exitCode = 1
})
