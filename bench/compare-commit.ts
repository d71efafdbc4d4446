/**
 * The hot-path guard: the server CPU per call of this working tree against a
 * given commit, in alternating pairs with the order flipped every pair.
 *
 *   npm run bench:compare -- --base REV [--head REV] [--pairs 8] [--mode async|sync]
 *       [--payload-bytes B] [--run-seconds 2] [--max-ratio R] [--json]
 *       [-- EXTRA nyala bench FLAGS]
 *
 * REV is checked out once into a detached git worktree under the system's
 * temporary folder (kept for the next run; `git worktree prune` forgets it
 * after it is deleted), given this tree's node_modules when the lock files
 * agree (else `npm ci` there), and built with this tree's tsc. This tree is
 * built too. Each pair then runs `nyala bench --against nyala --json` once
 * from each tree, the working tree first in even pairs and the base first in
 * odd ones, and divides the working tree's server user+sys CPU µs per call by
 * the base's. A slow phase of the VM then spoils one pair, not the verdict:
 * the report is the median per-pair ratio and how many pairs the working tree
 * won (ratio < 1). --head REV measures that commit, in a worktree of its own,
 * instead of the working tree (for bisecting a range). With --max-ratio the exit code is 1 when the median is
 * above it, so a change that costs the server CPU per call can be stopped
 * before it lands (docs/performance.md).
 *
 * Default workload, as issue-sized measurements were made: async mode, one
 * client connection with 100 calls outstanding, one server reactor, `Add`;
 * sync mode: 16 connections with one call each. Never run two benchmarks at
 * once on a 2-core machine.
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, readFileSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { median } from './welch.js'

interface BenchRow {
  system: string
  reqsPerSec: number
  userCpuUsPerReq: number
  sysCpuUsPerReq: number
  clientCpuUsPerReq: number
}

/** One tree's figures in one pair. */
interface Sample {
  serverCpuUs: number
  serverUserUs: number
  reqsPerSec: number
  clientCpuUs: number
}

export interface PairResult {
  first: 'work' | 'base'
  work: Sample
  base: Sample
  /** work / base server user+sys CPU per call. */
  ratio: number
}

export interface CompareSummary {
  base: string
  pairs: PairResult[]
  /** Median of the per-pair ratios of server CPU per call (user+sys). */
  medianRatio: number
  /** The same for server user CPU alone. */
  medianUserRatio: number
  /** The same for calls/s (above 1: the working tree is faster). */
  medianReqsRatio: number
  /** The same for the load's client CPU per call (both trees' clients are their own). */
  medianClientRatio: number
  /** Pairs in which the working tree's server spent less CPU per call. */
  won: number
}

const git = (cwd: string, ...args: string[]): string => execFileSync('git', args, { cwd, encoding: 'utf8' }).trim()

/** Summarises pairs: median ratios and how many the working tree won. */
export function summarise (base: string, pairs: PairResult[]): CompareSummary {
  return {
    base,
    pairs,
    medianRatio: median(pairs.map((p) => p.ratio)),
    medianUserRatio: median(pairs.map((p) => p.work.serverUserUs / p.base.serverUserUs)),
    medianReqsRatio: median(pairs.map((p) => p.work.reqsPerSec / p.base.reqsPerSec)),
    medianClientRatio: median(pairs.map((p) => p.work.clientCpuUs / p.base.clientCpuUs)),
    won: pairs.filter((p) => p.ratio < 1).length
  }
}

/** Checks REV out into a kept worktree with dependencies and dist/ built; returns its folder. */
function prepareBase (root: string, rev: string): string {
  const sha = git(root, 'rev-parse', '--verify', `${rev}^{commit}`)
  const dir = join(tmpdir(), 'nyala-compare', sha.slice(0, 12))
  if (!existsSync(join(dir, 'package.json'))) {
    git(root, 'worktree', 'prune')
    git(root, 'worktree', 'add', '--detach', dir, sha)
  }
  if (!existsSync(join(dir, 'node_modules'))) {
    const sameLock = existsSync(join(dir, 'package-lock.json')) &&
      readFileSync(join(dir, 'package-lock.json'), 'utf8') === readFileSync(join(root, 'package-lock.json'), 'utf8')
    if (sameLock) symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'), 'dir')
    else execFileSync('npm', ['ci', '--no-audit', '--no-fund', '--ignore-scripts'], { cwd: dir, stdio: 'ignore' })
  }
  if (!existsSync(join(dir, 'dist', 'bin'))) build(root, dir)
  return dir
}

function build (root: string, dir: string): void {
  execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(dir, 'tsconfig.json')], { cwd: dir, stdio: 'inherit' })
}

/** One `nyala bench` run from `dir`; the nyala row's figures. */
function runOnce (dir: string, flags: string[]): Sample {
  const out = spawnSync(process.execPath, [join(dir, 'bin', 'nyala'), 'bench', ...flags, '--against', 'nyala', '--json'], {
    cwd: dir,
    encoding: 'utf8',
    timeout: 120_000,
    maxBuffer: 16 << 20
  })
  if (out.status !== 0) throw new Error(`nyala bench in ${dir} failed (${out.status ?? out.signal}): ${out.stderr.slice(-2000)}`)
  const line = out.stdout.trim().split('\n').reverse().find((l) => l.startsWith('['))
  if (line === undefined) throw new Error(`nyala bench in ${dir} printed no JSON: ${out.stdout.slice(-2000)}`)
  const row = (JSON.parse(line) as BenchRow[]).find((r) => r.system === 'nyala')
  if (row === undefined) throw new Error(`nyala bench in ${dir} printed no nyala row`)
  return {
    serverCpuUs: row.userCpuUsPerReq + row.sysCpuUsPerReq,
    serverUserUs: row.userCpuUsPerReq,
    reqsPerSec: row.reqsPerSec,
    clientCpuUs: row.clientCpuUsPerReq
  }
}

const f2 = (n: number): string => n.toFixed(2)
const f3 = (n: number): string => n.toFixed(3)

async function main (): Promise<number> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      base: { type: 'string' },
      head: { type: 'string' },
      pairs: { type: 'string', default: '8' },
      mode: { type: 'string', default: 'async' },
      'payload-bytes': { type: 'string' },
      'run-seconds': { type: 'string', default: '2' },
      'max-ratio': { type: 'string' },
      'no-build': { type: 'boolean', default: false },
      json: { type: 'boolean', default: false }
    }
  })
  if (values.base === undefined) {
    process.stderr.write('usage: npm run bench:compare -- --base REV [--pairs 8] [--mode async|sync] [--payload-bytes B] [--run-seconds 2] [--max-ratio R] [--json] [-- FLAGS]\n')
    return 2
  }
  const pairs = Number(values.pairs)
  if (!Number.isInteger(pairs) || pairs < 1 || pairs > 100) throw new RangeError('--pairs takes a whole number from 1 to 100')
  if (values.mode !== 'async' && values.mode !== 'sync') throw new RangeError('--mode is async or sync')
  const root = resolve(fileURLToPath(new URL('../..', import.meta.url)))
  const flags = ['--mode', values.mode, '--server-reactors', '1', '--run-seconds', values['run-seconds']]
  flags.push(...(values.mode === 'async' ? ['--client-threads', '1', '--async-call-concurrency', '100'] : ['--client-threads', '16']))
  if (values['payload-bytes'] !== undefined) flags.push('--payload-bytes', values['payload-bytes'])
  flags.push(...positionals)

  // --head REV measures that commit (in a worktree of its own) instead of the working tree: for bisecting.
  const workDir = values.head === undefined ? root : prepareBase(root, values.head)
  if (values.head === undefined && !values['no-build']) build(root, root)
  const baseDir = prepareBase(root, values.base)
  const head = values.head ?? git(root, 'rev-parse', '--short', 'HEAD')
  const dirty = values.head === undefined && git(root, 'status', '--porcelain', '--untracked-files=no') !== '' ? '+changes' : ''
  const log = (s: string): void => { if (!values.json) process.stdout.write(s) }
  log(`working tree (${head}${dirty}) against ${values.base} (${baseDir}), ${pairs} pairs of: nyala bench ${flags.join(' ')}\n`)
  log('pair  first  work µs  base µs  ratio   work calls/s  base calls/s\n')

  const results: PairResult[] = []
  for (let i = 0; i < pairs; i++) {
    const first = i % 2 === 0 ? 'work' : 'base'
    let work: Sample, base: Sample
    if (first === 'work') { work = runOnce(workDir, flags); base = runOnce(baseDir, flags) } else { base = runOnce(baseDir, flags); work = runOnce(workDir, flags) }
    const pair: PairResult = { first, work, base, ratio: work.serverCpuUs / base.serverCpuUs }
    results.push(pair)
    log(`${String(i + 1).padStart(4)}  ${first.padEnd(5)}  ${f2(work.serverCpuUs).padStart(7)}  ${f2(base.serverCpuUs).padStart(7)}  ${f3(pair.ratio)}  ${Math.round(work.reqsPerSec).toString().padStart(12)}  ${Math.round(base.reqsPerSec).toString().padStart(12)}\n`)
  }
  const summary = summarise(values.base, results)
  if (values.json) process.stdout.write(JSON.stringify(summary) + '\n')
  else {
    process.stdout.write(`server CPU per call, working tree / ${values.base}: median ${f3(summary.medianRatio)} over ${pairs} pairs, ` +
      `working tree won ${summary.won} of ${pairs} (user CPU alone: ${f3(summary.medianUserRatio)}; calls/s: ${f3(summary.medianReqsRatio)}; client CPU per call: ${f3(summary.medianClientRatio)})\n`)
  }
  const max = values['max-ratio'] === undefined ? Infinity : Number(values['max-ratio'])
  if (summary.medianRatio > max) {
    process.stderr.write(`median ratio ${f3(summary.medianRatio)} is above --max-ratio ${max}\n`)
    return 1
  }
  return 0
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().then((code) => { process.exitCode = code }, (err: Error) => {
    process.stderr.write(`${err.message}\n`)
    process.exitCode = 2
  })
}
