/**
 * `nyala trace`: the strace -c and perf trace -s parsers on captured
 * output, the message when strace is missing, and (when strace can trace
 * here) a short synchronous run from the TypeScript sources whose counts,
 * never timings, are checked: no epoll_ctl per RPC in steady state, and at
 * least one read and one write per synchronous RPC.
 */
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { CATEGORIES, availableIo, categorize, parsePerfTraceSummary, parsePlan, parseStraceSummary, trace, tracerProblem, type TraceReport, type TraceReports } from '../../bin/trace.js'

// Servers run under strace -f, which costs a context switch per system call: slow on a loaded machine.
t.setTimeout(300_000)

const CLI = fileURLToPath(new URL('../../bin/cli.ts', import.meta.url))
// Only the TypeScript loader: coverage and mocking hooks stay in this process.
const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))

function nyala (args: string[]): Promise<{ code: number | null, stdout: string, stderr: string }> {
  const script = `import(${JSON.stringify(CLI)}).then((cli) => cli.main(${JSON.stringify(args)})).then((code) => { process.exitCode = code }, (err) => { console.error(err); process.exitCode = 1 })`
  const child = spawn(process.execPath, [...LOADER, '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString() })
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
  return new Promise((resolve) => child.once('close', (code) => resolve({ code, stdout, stderr })))
}

// strace 6.1, `strace -f -c` of node with a worker thread (rows cut).
const STRACE_SAMPLE = `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ------------------
 67.54    0.239229        1883       127         2 futex
 27.32    0.096754        3583        27           epoll_pwait
  2.40    0.008484          68       124           munmap
  0.34    0.001190          11       101           read
  0.09    0.000308          44         7           clone3
  0.07    0.000259           8        32         2 openat
  0.04    0.000125           4        26        13 fcntl
  0.01    0.000027           9         3           epoll_ctl
  0.01    0.000020           6         3           write
  0.00    0.000010           5         2           writev
  0.00    0.000000           0         1           sched_getaffinity
------ ----------- ----------- --------- --------- ------------------
100.00    0.354209         304       453        17 total
`

// perf 6.1, `perf trace -s` of the same: one table per thread (rows cut).
const PERF_SAMPLE = `
 Summary of events:

 node (1402), 1368 events, 57.7%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   epoll_pwait           20      0   208.956     0.009    10.448   104.596     58.19%
   read                  88      0    33.370     0.009     0.379     2.634     21.82%
   futex                 57      0     2.151     0.008     0.038     0.499     27.94%
   sched_getaffinity        1      0     0.016     0.016     0.016     0.016      0.00%

 node (1403), 46 events, 1.9%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   epoll_pwait            1      0   366.136   366.136   366.136   366.136      0.00%
   epoll_ctl              2      0     0.025     0.009     0.013     0.016     29.39%
   read                   1      3     0.051     0.051     0.051     0.051      0.00%
`

t.test('parses strace -c output, with and without an errors column', async t => {
  const errors = {}
  const counts = parseStraceSummary(STRACE_SAMPLE, errors)
  t.same(counts, { futex: 127, epoll_pwait: 27, munmap: 124, read: 101, clone3: 7, openat: 32, fcntl: 26, epoll_ctl: 3, write: 3, writev: 2, sched_getaffinity: 1 })
  t.same(errors, { futex: 2, openat: 2, fcntl: 13 })
  t.same(categorize(counts), { epoll_ctl: 3, epoll_wait: 27, io_uring_enter: 0, read: 101, write: 5, futex: 127, other: 190, total: 453 })
  t.same(parseStraceSummary('strace: exec: No such file or directory\n'), {}, 'no table, no counts')
  t.same(categorize({ io_uring_enter: 40, epoll_pwait: 2, futex: 1 }), { epoll_ctl: 0, epoll_wait: 2, io_uring_enter: 40, read: 0, write: 0, futex: 1, other: 0, total: 43 }, 'io_uring_enter is a syscall, in its own group')
})

t.test('parses perf trace -s output, summing the threads', async t => {
  const errors = {}
  const counts = parsePerfTraceSummary(PERF_SAMPLE, errors)
  t.same(errors, { read: 3 })
  t.same(counts, { epoll_pwait: 21, read: 89, futex: 57, sched_getaffinity: 1, epoll_ctl: 2 })
  t.same(categorize(counts), { epoll_ctl: 2, epoll_wait: 21, io_uring_enter: 0, read: 89, write: 0, futex: 57, other: 1, total: 170 })
})

// Runs `trace` in this process with stdout and stderr captured.
async function traceHere (args: string[]): Promise<{ code: number, stdout: string, stderr: string }> {
  let stdout = ''
  let stderr = ''
  const out = process.stdout.write
  const err = process.stderr.write
  process.stdout.write = ((chunk: string) => { stdout += chunk; return true }) as typeof process.stdout.write
  process.stderr.write = ((chunk: string) => { stderr += chunk; return true }) as typeof process.stderr.write
  try {
    return { code: await trace(args), stdout, stderr }
  } finally {
    process.stdout.write = out
    process.stderr.write = err
  }
}

t.test('without strace: says so, how to install it, exits non-zero', async t => {
  const problem = tracerProblem('strace', '/nonexistent')
  t.match(problem, /strace is not installed/)
  t.match(problem, /apt-get install strace/)
  const path = process.env.PATH
  process.env.PATH = '/nonexistent'
  t.teardown(() => { process.env.PATH = path })
  const run = await traceHere(['--calls', '10'])
  t.equal(run.code, 1)
  t.match(run.stderr, /strace is not installed[^]*apt-get install strace/)
  t.equal(run.stdout, '')
})

t.test('flags', async t => {
  t.match(parsePlan([]), { plan: { mode: 'sync', depth: 1, calls: 20_000, sidecarBytes: undefined, tracer: 'strace', system: 'nyala', timing: true }, io: 'all' })
  t.match(parsePlan(['--io', 'io_uring']), { plan: { io: 'io_uring' }, io: 'io_uring' })
  t.throws(() => parsePlan(['--io', 'kqueue']), /--io must be all, node, epoll or io_uring/)
  t.throws(() => parsePlan(['--system', 'raw', '--io', 'epoll']), /--system raw is a node:net echo/)
  t.same(availableIo('node'), { backends: ['node'], unavailable: {} }, 'node:net is always there')
  t.match(parsePlan(['--mode', 'async']).plan, { depth: 64 })
  t.match(parsePlan(['--depth', '16']).plan, { mode: 'async', depth: 16 })
  t.match(parsePlan(['--mode', 'transfer']).plan, { depth: 1, sidecarBytes: 8 * 1024 * 1024 })
  t.match(parsePlan(['--sidecar-bytes', '64K', '--no-timing', '--json']), { plan: { mode: 'sync', sidecarBytes: 65536, timing: false }, json: true })
  t.throws(() => parsePlan(['--mode', 'sync', '--depth', '8']), /--mode sync is synchronous/)
  t.throws(() => parsePlan(['--calls', '0']), /--calls must be an integer >= 1/)
  t.throws(() => parsePlan(['--tracer', 'dtrace']), /--tracer must be strace or perf/)
  const run = await traceHere(['--system', 'grpc'])
  t.equal(run.code, 2)
  t.match(run.stderr, /--system must be/)
})

const straceWorks = spawnSync('strace', ['-f', '-c', '-o', '/dev/null', '--', 'true']).status === 0

t.test('nyala trace --io node --json --calls 500: the shape, and no epoll_ctl per RPC', { skip: straceWorks ? false : 'strace is not installed or cannot trace here' }, async t => {
  // 500 calls: from sources the TypeScript loader's own file reads differ by up to ~200 between two runs on a loaded machine.
  const run = await nyala(['trace', '--io', 'node', '--json', '--calls', '500', '--no-timing'])
  t.equal(run.code, 0, run.stderr)
  const report = JSON.parse(run.stdout) as TraceReport
  t.equal(report.calls, 500)
  t.same(Object.keys(report.perRpc), [...CATEGORIES])
  for (const c of CATEGORIES) t.type(report.perRpc[c], 'number', `perRpc.${c}`)
  t.equal(report.mode, 'sync')
  t.equal(report.depth, 1)
  t.equal(report.io, 'node', 'the server listened on node:net')
  // Counts, not timings: steady state arms no epoll watcher per call...
  t.ok(report.perRpc.epoll_ctl <= 0.01, `epoll_ctl per RPC ${report.perRpc.epoll_ctl} <= 0.01`)
  // ...and each of the 501 synchronous calls needed a read and a write of
  // its own. (Per RPC, read and write are 1 give or take a few dozen
  // syscalls over 500 calls: from sources, the TypeScript loader's heap
  // keeps V8's threads busier in one run than in the other.)
  t.ok(report.raw.calls.read - report.raw.zeroCalls.read >= 250, 'most of the difference is the calls\' reads')
  t.ok(report.raw.calls.read >= 501 && report.raw.calls.write >= 501, 'a read and a write per call at least')
  // Not the totals: V8's and libuv's threads (futex, madvise, ...) vary by hundreds between
  // two runs of the same process, and on Node 26 once outweighed the ~400 reads and writes of the 200 calls.
  t.ok(report.raw.calls.read + report.raw.calls.write > report.raw.zeroCalls.read + report.raw.zeroCalls.write + 500, 'the calls\' reads and writes are in the difference')
  const server = report.connections.server!
  t.equal(server.length, 1, 'one server connection, counted at SIGTERM')
  t.ok(server[0]!.framesRead >= 501, 'the 500 calls and the warm-up call were read')
  t.equal(server[0]!.immediateWrites + server[0]!.batchedFrames, 501, 'one response each, sent through the transfer queue')
  t.equal(server[0]!.drainWaits, 0)
  t.equal(report.connections.client!.length, 1)
  t.equal(report.callsPerSec, null, '--no-timing: no untraced run')
})

t.test('nyala trace --io all: every transport that starts here, each server on it, io_uring\'s work counted as io_uring_enter', { skip: straceWorks ? false : 'strace is not installed or cannot trace here' }, async t => {
  const { backends, unavailable } = availableIo('all')
  const run = await nyala(['trace', '--json', '--calls', '200', '--no-timing'])
  t.equal(run.code, 0, run.stderr)
  const reports = JSON.parse(run.stdout) as TraceReports
  t.same(reports.backends.map((r) => r.io), backends, `traced ${backends.join(', ')}${Object.keys(unavailable).length > 0 ? `; not ${Object.keys(unavailable).join(', ')}` : ''}`)
  t.same(Object.keys(reports.unavailable), Object.keys(unavailable))
  for (const report of reports.backends) {
    const server = report.connections.server!
    t.equal(server.length, 1, `${report.io}: one server connection`)
    t.ok(server[0]!.framesRead >= 201, `${report.io}: the 200 calls and the warm-up call were read`)
    if (report.io === 'io_uring') {
      // Reads and sends are done inside io_uring_enter, which only the server's ring calls: the calls' enters are in the difference.
      // (Not the read group: the TypeScript loader's file reads vary by ~200 between two runs.)
      t.ok(report.raw.calls.io_uring_enter - report.raw.zeroCalls.io_uring_enter >= 100, `io_uring: the calls' io_uring_enter in the difference (${report.perRpc.io_uring_enter} per RPC)`)
    } else {
      t.ok(report.raw.calls.read >= 201 && report.raw.calls.write >= 201, `${report.io}: a read and a write per call at least`)
    }
  }
  const text = await nyala(['trace', '--calls', '50', '--no-timing'])
  t.equal(text.code, 0, text.stderr)
  t.match(text.stdout, /server syscalls per RPC by transport/, 'the text report ends with the transports side by side')
  for (const io of backends) t.match(text.stdout, new RegExp(`^  ${io} +\\d`, 'm'), `a line for ${io}`)
})
