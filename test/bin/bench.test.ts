/**
 * `nyala bench`: Welch's t-test against R / scipy, latency histograms merged
 * across load processes, the chain layout, and the bench smoke: a very short
 * `nyala bench --json` run from the TypeScript sources whose output shape
 * (never its rates) is checked.
 */
import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { regularizedIncompleteBeta, studentTCdf, studentTQuantile, welchTest } from '../../bench/welch.js'
import { createLatencyHistogram, encodeLatencies, mergeLatencies, recordLatency, summarizeLatencies } from '../../bench/latency.js'
import { chainsPerConnection, computeRun } from '../../bench/rpc-bench.js'
import { DEFAULT_CONFIG, applyConfig, describeConfig, formatReport, medianRow, parseCompareFlags, takeCompare } from '../../bin/bench.js'
import type { LoadDone } from '../../bench/bench-ipc.js'

// The smoke run forks a server and load processes per system, each compiling
// the TypeScript sources through the loader: about 20 s on a quiet 2-core
// machine, over a minute beside other test files.
t.setTimeout(300_000)

const CLI = fileURLToPath(new URL('../../bin/cli.ts', import.meta.url))
// Only the TypeScript loader: coverage and mocking hooks stay in this process.
const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))

function close (t: Test, actual: number, expected: number, relative: number, what: string): void {
  t.ok(Math.abs(actual - expected) <= relative * Math.abs(expected), `${what}: ${actual} ≈ ${expected}`)
}

t.test('Student t quantiles match R qt() / scipy t.ppf', async t => {
  // qt(0.975, df) in R; scipy.stats.t.ppf gives the same digits.
  close(t, studentTQuantile(0.975, 1), 12.706204736174694, 1e-9, 'qt(0.975, 1)')
  close(t, studentTQuantile(0.975, 2.5), 3.5746548420036817, 1e-9, 'qt(0.975, 2.5)')
  close(t, studentTQuantile(0.975, 10), 2.228138851986274, 1e-9, 'qt(0.975, 10)')
  close(t, studentTQuantile(0.975, 12.065), 2.1775116531357637, 1e-9, 'qt(0.975, 12.065)')
  close(t, studentTQuantile(0.995, 113.94), 2.619668429140868, 1e-9, 'qt(0.995, 113.94)')
  close(t, studentTQuantile(0.9, 3), 1.637744353696209, 1e-9, 'qt(0.9, 3)')
  close(t, studentTQuantile(0.025, 10), -2.228138851986274, 1e-9, 'qt(0.025, 10)')
  t.equal(studentTQuantile(0.5, 7), 0)
  close(t, studentTCdf(2.228138851986274, 10), 0.975, 1e-12, 'pt(qt(0.975, 10), 10)')
  close(t, studentTCdf(-1, 1), 0.25, 1e-12, 'pt(-1, 1) (Cauchy)')
  close(t, regularizedIncompleteBeta(0.3, 2, 3), 0.3483, 1e-12, 'I_0.3(2, 3)')
  t.throws(() => studentTQuantile(1, 3))
})

t.test('Welch\'s t-test matches scipy.stats.ttest_ind(equal_var=False) and R t.test', async t => {
  // Two rpc-bench-like samples of 10 runs (a change's before and after).
  const before = [25100.2, 25410.7, 24987.1, 25600.3, 25322.9, 25190.4, 25455.0, 25071.8, 25530.6, 25268.2]
  const after = [27010.5, 27450.2, 26890.7, 27600.1, 27220.4, 27105.9, 27380.3, 26950.0, 27490.8, 27250.1]
  let r = welchTest(before, after)
  close(t, r.t, -19.24024223550432, 1e-9, 't')
  close(t, r.df, 17.52551985707892, 1e-9, 'df')
  close(t, r.p, 3.150720900680719e-13, 1e-5, 'p')
  close(t, r.low, -2153.557610071724, 1e-9, 'CI low')
  close(t, r.high, -1728.8023899282769, 1e-9, 'CI high')
  close(t, r.difference, r.meanA - r.meanB, 1e-15, 'difference')

  // Unequal sizes and variances.
  r = welchTest([1.0, 2.0, 3.0, 4.0], [2.5, 3.5, 9.0, 4.5, 6.0, 7.5])
  close(t, r.t, -2.5058072087536707, 1e-9, 't')
  close(t, r.df, 7.7645576707726764, 1e-9, 'df')
  close(t, r.p, 0.03745784181411205, 1e-8, 'p')
  close(t, r.low, -5.775431732155379, 1e-9, 'CI low')
  close(t, r.high, -0.2245682678446208, 1e-8, 'CI high')

  r = welchTest([375830, 380112, 371004, 377777, 369000], [384573, 390001, 381234])
  close(t, r.t, -3.197398138411528, 1e-9, 't')
  close(t, r.df, 4.5261955477528355, 1e-9, 'df')
  close(t, r.p, 0.027691909774988772, 1e-8, 'p')
  close(t, r.low, -19259.68661367151, 1e-9, 'CI low')
  close(t, r.high, -1789.7800529951637, 1e-9, 'CI high')

  const constant = welchTest([5, 5], [5, 5])
  t.equal(constant.p, 1)
  t.throws(() => welchTest([1], [1, 2]), RangeError)
})

t.test('latency histograms merge exactly across load processes', async t => {
  const one = createLatencyHistogram()
  const two = createLatencyHistogram()
  const all = createLatencyHistogram()
  for (let i = 1; i <= 900; i++) { recordLatency(one, i); recordLatency(all, i) }
  for (let i = 0; i < 100; i++) { recordLatency(two, 5000 + i); recordLatency(all, 5000 + i) }
  recordLatency(two, 0.2) // clamped to 1 µs
  recordLatency(all, 0.2)
  const merged = mergeLatencies([encodeLatencies(one), encodeLatencies(two)])
  t.equal(merged.totalCount, 1001)
  const summary = summarizeLatencies(merged)
  t.same(summary, summarizeLatencies(all))
  t.equal(summary.count, 1001)
  // Half the calls took ≤ 500 µs; the slowest 10 % came from the second process only.
  t.ok(Math.abs(summary.p50Us - 500) <= 1, `p50 ${summary.p50Us}`)
  t.ok(summary.p99Us >= 5000 && summary.p99Us <= 5100, `p99 ${summary.p99Us}`)
  t.ok(summary.p999Us >= summary.p99Us)
  t.ok(Number.isNaN(summarizeLatencies(mergeLatencies([])).p50Us), 'no calls: NaN percentiles')
})

t.test('chains per connection and a row from load results and server usage', async t => {
  t.same(chainsPerConnection({ mode: 'sync', clientThreads: 3, asyncCallConcurrency: 60 }), [1, 1, 1])
  t.same(chainsPerConnection({ mode: 'async', clientThreads: 4, asyncCallConcurrency: 10 }), [3, 3, 2, 2])
  t.same(chainsPerConnection({ mode: 'async', clientThreads: 4, asyncCallConcurrency: 2 }), [1, 1])
  const h = createLatencyHistogram()
  recordLatency(h, 100)
  const done = (calls: number): LoadDone => ({ type: 'done', calls, errors: 0, firstError: null, latencies: encodeLatencies(h), userCpuUs: 300, systemCpuUs: 100 })
  const usage = (user: number, sys: number, vol: number, invol: number): NodeJS.ResourceUsage =>
    ({ ...process.resourceUsage(), userCPUTime: user, systemCPUTime: sys, voluntaryContextSwitches: vol, involuntaryContextSwitches: invol })
  const before = new Map([[1, usage(0, 0, 0, 0)], [2, usage(1000, 1000, 10, 10)]])
  const after = new Map([[1, usage(1000, 500, 100, 0)], [2, usage(2000, 1500, 60, 10)], [3, usage(9e9, 9e9, 9e9, 9e9)]])
  const run = computeRun('nyala', { mode: 'sync' }, [done(60), done(40)], before, after, 2)
  t.equal(run.row.reqsPerSec, 50)
  t.equal(run.row.userCpuUsPerReq, 20) // (1000 + 1000) / 100; pid 3 was not there at the start
  t.equal(run.row.sysCpuUsPerReq, 10)
  t.equal(run.row.ctxSwPerReq, 1.5)
  t.equal(run.row.clientCpuUsPerReq, 8)
  t.equal(run.row.p50Us, 100)
})

t.test('flags: configurations, --compare operands, medians', async t => {
  const config = applyConfig(DEFAULT_CONFIG, { mode: 'async', 'client-threads': '1', 'async-call-concurrency': '100', against: 'nyala,grpc' })
  t.equal(config.mode, 'async')
  t.same(config.against, ['nyala', 'grpc'])
  t.same(DEFAULT_CONFIG.against, ['nyala', 'raw'], 'the defaults are not changed')
  t.same(applyConfig(DEFAULT_CONFIG, { mode: 'async' }).against, ['nyala', 'nyala-promise', 'raw'], 'async: the awaiting chains beside the callback ones by default')
  t.same(applyConfig(DEFAULT_CONFIG, { mode: 'sync' }).against, ['nyala', 'raw'])
  const b = parseCompareFlags(config, '--worker-threads 2  --run-seconds 0.5 --busy-poll-us 80')
  t.equal(b.workerThreads, 2)
  t.equal(b.busyPollUs, 80)
  t.match(describeConfig(b), /busy polling 80 µs on both ends/)
  t.notMatch(describeConfig(config), /busy polling/)
  t.equal(b.runSeconds, 0.5)
  t.equal(b.mode, 'async')
  // The operands start with dashes: they are taken out before the other flags are parsed.
  t.same(takeCompare(['--json', '--compare', '--worker-threads 1', '--worker-threads 10', '--repeat', '3']),
    { rest: ['--json', '--repeat', '3'], compareFlags: ['--worker-threads 1', '--worker-threads 10'] })
  t.same(takeCompare(['--json']), { rest: ['--json'], compareFlags: null })
  t.throws(() => takeCompare(['--compare', '--mode async']), { code: 'RPC_ERR_INVALID_ARGUMENT' })
  t.throws(() => applyConfig(DEFAULT_CONFIG, { against: 'nyala,thrift' }), { code: 'RPC_ERR_INVALID_ARGUMENT' })
  t.throws(() => applyConfig(DEFAULT_CONFIG, { mode: 'batch' }), { code: 'RPC_ERR_INVALID_ARGUMENT' })
  t.throws(() => applyConfig(DEFAULT_CONFIG, { 'client-threads': '0' }), { code: 'RPC_ERR_INVALID_ARGUMENT' })
  const row = { system: 'raw' as const, mode: 'sync' as const, reqsPerSec: 1, userCpuUsPerReq: 1, sysCpuUsPerReq: 1, ctxSwPerReq: 1, clientCpuUsPerReq: 1, p50Us: 1, p99Us: 1, p999Us: 1 }
  const m = medianRow([{ ...row, reqsPerSec: 3 }, { ...row, reqsPerSec: 1 }, { ...row, reqsPerSec: 2, p50Us: 7 }])
  t.equal(m.reqsPerSec, 2)
  t.equal(m.p50Us, 1)
})

/** Runs `nyala ARGS` from the TypeScript sources in a child process; resolves once it exits. */
async function runNyala (args: string[]): Promise<{ code: number | null, out: string, err: string }> {
  const script = `import(${JSON.stringify(CLI)}).then((cli) => cli.main(${JSON.stringify(args)})).then((code) => { process.exitCode = code }, (err) => { console.error(err); process.exitCode = 1 })`
  const child = spawn(process.execPath, [...LOADER, '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stdout.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr.on('data', (d: Buffer) => { err += d.toString() })
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
  return { code, out, err }
}

t.test('bench smoke: a very short nyala bench --json (nyala busy-polling) prints one row per system, and writes the CPU profiles asked for', async t => {
  const profiles = mkdtempSync(join(tmpdir(), 'nyala-bench-prof-'))
  t.teardown(() => rmSync(profiles, { recursive: true, force: true }))
  const serverDir = join(profiles, 'server')
  const loadDir = join(profiles, 'load')
  const args = ['bench', '--json', '--run-seconds', '0.5', '--warmup-seconds', '0.5', '--client-threads', '2', '--against', 'nyala,raw,grpc',
    '--server-cpu-prof', serverDir, '--load-cpu-prof', loadDir, '--busy-poll-us', '50']
  const { code, out, err } = await runNyala(args)
  t.equal(code, 0, err)
  const rows = JSON.parse(out) as Array<Record<string, unknown>>
  t.same(rows.map((r) => r.system), ['nyala', 'raw', 'grpc'])
  for (const row of rows) {
    t.same(Object.keys(row).sort(), ['clientCpuUsPerReq', 'ctxSwPerReq', 'mode', 'p50Us', 'p999Us', 'p99Us', 'reqsPerSec', 'sysCpuUsPerReq', 'system', 'userCpuUsPerReq'])
    t.equal(row.mode, 'sync')
    for (const key of ['reqsPerSec', 'userCpuUsPerReq', 'sysCpuUsPerReq', 'ctxSwPerReq', 'clientCpuUsPerReq', 'p50Us', 'p99Us', 'p999Us']) {
      t.type(row[key], 'number', `${String(row.system)}.${key} is a number`)
    }
    t.ok((row.reqsPerSec as number) > 0, `${String(row.system)} answered calls`)
    t.ok((row.p50Us as number) <= (row.p99Us as number) && (row.p99Us as number) <= (row.p999Us as number), 'percentiles in order')
  }
  const cpuProfiles = (dir: string): number => readdirSync(dir).filter((name) => name.endsWith('.cpuprofile')).length
  // One server per system; one load process per connection (2 here, at most one per core).
  t.ok(cpuProfiles(serverDir) >= 3, `server profiles: ${cpuProfiles(serverDir)}`)
  t.ok(cpuProfiles(loadDir) >= 3, `load profiles: ${cpuProfiles(loadDir)}`)
})

t.test('bench smoke, async: nyala (callback chains) and nyala-promise (awaiting chains) both answer, with the text report\'s ratios', async t => {
  const args = ['bench', '--mode', 'async', '--run-seconds', '0.5', '--warmup-seconds', '0.5', '--client-threads', '1', '--async-call-concurrency', '20', '--against', 'nyala,nyala-promise,raw']
  const { code, out, err } = await runNyala(args)
  t.equal(code, 0, err)
  for (const system of ['nyala', 'nyala-promise', 'raw']) t.match(out, new RegExp(`^${system} +[1-9][\\d,]* `, 'm'), `${system}: a row with calls`)
  t.match(out, /^nyala \/ nyala-promise: [\d.]+x Reqs\/sec/m)
  t.match(out, /^nyala \/ raw: [\d.]+x Reqs\/sec/m)
  t.match(out, /^nyala-promise \/ raw: [\d.]+x Reqs\/sec/m)
  t.notMatch(out, /call\(s\) failed/)
})

t.test('bench smoke, nyala-tls: the encrypted nyala answers, beside nyala, with its ratio to it', async t => {
  const { code, out, err } = await runNyala(['bench', '--run-seconds', '0.2', '--warmup-seconds', '0.2', '--client-threads', '1', '--against', 'nyala,nyala-tls'])
  t.equal(code, 0, err)
  for (const system of ['nyala', 'nyala-tls']) t.match(out, new RegExp(`^${system} +[1-9][\\d,]* `, 'm'), `${system}: a row with calls`)
  t.match(out, /^nyala-tls \/ nyala: [\d.]+x Reqs\/sec/m)
  t.notMatch(out, /^nyala \/ nyala-tls/m, 'the ratio is given one way only')
})

t.test('the report gives each nyala ratio as a ratio of medians and as the median of the rounds\' ratios', async t => {
  const row = (system: 'nyala' | 'nyala-promise' | 'raw', reqsPerSec: number) => ({ system, mode: 'async' as const, reqsPerSec, userCpuUsPerReq: 1, sysCpuUsPerReq: 1, ctxSwPerReq: 0, clientCpuUsPerReq: 1, p50Us: 1, p99Us: 2, p999Us: 3 })
  const run = (r: ReturnType<typeof row>) => ({ row: r, calls: 1, errors: 0, firstError: null, loadProcesses: 1, connections: 1, windowSeconds: 1 })
  // Three rounds; raw is fast in the middle one only (a phase of the machine).
  const rounds = [[row('nyala', 80), row('raw', 100)], [row('nyala', 90), row('raw', 200)], [row('nyala', 70), row('raw', 100)]]
  const runs = rounds.flat().map(run)
  const rows = [medianRow(rounds.map((r) => r[0]!)), medianRow(rounds.map((r) => r[1]!))]
  const config = applyConfig(DEFAULT_CONFIG, { mode: 'async', against: 'nyala,raw' })
  const out = formatReport(config, rows, 3, runs)
  t.match(out, /nyala \/ raw: 0\.80x Reqs\/sec, 1\.00x server CPU per request; per round: median 0\.70x \(0\.45–0\.80\)/)
})
