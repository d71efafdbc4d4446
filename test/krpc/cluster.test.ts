/**
 * Reactors in cluster processes (reactor/cluster.ts): real processes over
 * loopback port 0. test/helpers/cluster-server.ts is the primary and, re-run
 * by node:cluster, every reactor; `nyala serve` is run from the TypeScript
 * sources with `--eval` (as test/bin/cli.test.ts does) and, when dist/ is
 * fresh, through the bin/nyala shim. Every process is ended by its pid.
 * Nothing here asserts a duration: waits poll for a state.
 */
import t, { type Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync, readFileSync, statSync } from 'node:fs'
import { createServer, type AddressInfo } from 'node:net'
import { availableParallelism } from 'node:os'
import { fileURLToPath } from 'node:url'
import { RpcError } from '../../codec/errors.js'
import { Client } from '../../reactor/krpc/client.js'
import { reactorExecArgv, restartDelayMs, reusePortSupported, serveReactors } from '../../reactor/cluster.js'
import { Server } from '../../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'
import { ReactorService, reactorHandlers } from '../helpers/reactor-service.js'

// About fifteen Node processes start here through the TypeScript loader.
t.setTimeout(300_000)

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const HELPER = fileURLToPath(new URL('../helpers/cluster-server.ts', import.meta.url))
const CLI = fileURLToPath(new URL('../../bin/cli.ts', import.meta.url))
// Only the TypeScript loader: coverage and mocking hooks stay in this process.
const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))
const ADD = 'nyala_calls_handled_total{service="nyala.demo.CalculatorService",method="Add"}'

interface Run {
  child: ChildProcess
  stdout: () => string
  stderr: () => string
  exit: Promise<number | null>
  messages: Array<Record<string, unknown>>
}

/** Starts `node ARGS` with piped output (and an IPC channel with `ipc`); SIGKILLs it and every pid in `pids` at teardown. */
function start (t: Test, args: string[], options: { ipc?: boolean, pids?: Set<number>, bare?: boolean } = {}): Run {
  const stdio = ['ignore', 'pipe', 'pipe', ...(options.ipc === true ? ['ipc' as const] : [])] as const
  // bare: as a user runs it, without tap's coverage hooks. tap's spawn wrapper puts them in
  // NODE_OPTIONS; env(1) takes them out again just before it execs node (same pid).
  const child = options.bare === true
    ? spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, ...args], { cwd: ROOT, stdio: [...stdio] })
    : spawn(process.execPath, args, { cwd: ROOT, stdio: [...stdio] })
  let out = ''
  let err = ''
  child.stdout!.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { err += d.toString() })
  const messages: Array<Record<string, unknown>> = []
  child.on('message', (m: Record<string, unknown>) => messages.push(m))
  const exit = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    for (const pid of options.pids ?? []) if (isAlive(pid)) process.kill(pid, 'SIGKILL')
  })
  return { child, stdout: () => out, stderr: () => err, exit, messages }
}

function cli (t: Test, args: string[], options: { ipc?: boolean, pids?: Set<number> } = {}): Run {
  const script = `import(${JSON.stringify(CLI)}).then((cli) => cli.main(${JSON.stringify(args)})).then((code) => { process.exitCode = code }, (err) => { console.error(err); process.exitCode = 1 })`
  return start(t, [...LOADER, '--input-type=module', '-e', script], options)
}

async function until<T> (what: string, run: Run | null, probe: () => T | undefined | Promise<T | undefined>): Promise<T> {
  for (;;) {
    const value = await probe()
    if (value !== undefined) return value
    if (run !== null && run.child.exitCode !== null) throw new Error(`exited before ${what}: ${run.stderr()}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

function line (run: Run, pattern: RegExp): Promise<string> {
  return until(pattern.source, run, () => run.stdout().match(pattern)?.[1])
}

function message (run: Run, type: string, id?: number): Promise<Record<string, unknown>> {
  return until(type, run, () => run.messages.find((m) => m.type === type && (id === undefined || m.id === id)))
}

function isAlive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** The value of the sample `name{labels}` (labels as printed), or undefined. */
function sample (text: string, series: string): number | undefined {
  for (const row of text.split('\n')) {
    if (row.startsWith(`${series} `)) return Number(row.slice(series.length + 1))
  }
  return undefined
}

function clients (t: Test, endpoint: string, n: number): Client[] {
  // Retries of calls that did not run: a replacement reactor may still be
  // binding the port when a client first connects (ECONNREFUSED).
  const list = Array.from({ length: n }, () => new Client({ endpoint, retry: {} }))
  t.teardown(() => { for (const c of list) c.close() })
  return list
}

t.test('reactorExecArgv keeps loaders and drops --eval and --input-type', async t => {
  t.same(reactorExecArgv(['--import=x', '--input-type=module', '-e', 'code', '--enable-source-maps']), ['--import=x', '--enable-source-maps'])
  t.same(reactorExecArgv(['--eval=code', '-p', 'x', '--input-type', 'module', '--cpu-prof']), ['--cpu-prof'])
})

t.test('reusePort is used from Node 22.12 and 23.1 on, on Linux only', async t => {
  t.equal(reusePortSupported('20.20.2', 'linux'), false)
  t.equal(reusePortSupported('22.11.0', 'linux'), false)
  t.equal(reusePortSupported('22.12.0', 'linux'), true)
  t.equal(reusePortSupported('23.0.0', 'linux'), false)
  t.equal(reusePortSupported('23.1.0', 'linux'), true)
  t.equal(reusePortSupported('24.0.0', 'linux'), true)
  t.equal(reusePortSupported('24.0.0', 'darwin'), false)
})

t.test('restart delays double from baseMs up to maxMs', async t => {
  const backoff = { baseMs: 100, maxMs: 1000 }
  t.same([1, 2, 3, 4, 5, 9].map((deaths) => restartDelayMs(deaths, backoff)), [100, 200, 400, 800, 1000, 1000])
})

t.test('one reactor serves in this process with the same interface', async t => {
  let server: Server | null = null
  const reactors = await serveReactors({
    reactors: 1,
    host: '127.0.0.1',
    port: 0,
    maxConnectionAgeMs: 100,
    build: () => {
      server = new Server().addService(CalculatorService, calculatorHandlers).addService(ReactorService, reactorHandlers)
      return server
    }
  })
  t.teardown(() => reactors.close())
  t.equal(reactors.distribution, 'single')
  t.same(reactors.pids(), [process.pid])
  t.equal((await reactors.resourceUsage()).length, 1)
  const endpoint = `${reactors.address.host}:${reactors.address.port}`
  // Retries carry the calls refused on an aged connection over to a new one.
  const client = new Client({ endpoint, retry: {} })
  t.teardown(() => client.close())
  const calc = client.service(CalculatorService)
  let calls = 0
  let wrong = 0
  while (server!.stats().connectionsAccepted < 3) {
    if ((await calc.Add({ x: calls, y: 1 })).result !== calls + 1) wrong++
    calls++
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  t.equal(wrong, 0, `${calls} calls answered while the client's connection aged out twice`)
  t.ok((client.retryStats?.retries ?? 0) >= 2, 'calls refused on an aged connection were retried on a new one')
  const text = await reactors.metricsText()
  t.equal(sample(text, ADD), calls)
  t.equal(sample(text, 'nyala_reactors'), 1)
  await reactors.close()
})

t.test('two reactors serve; a killed one is replaced; SIGTERM drains both and exits 0', async t => {
  const pids = new Set<number>()
  // A reactor waits 500 ms before it builds and listens: the race below needs a fork that has not listened yet.
  // Round-robin, also where reusePort is supported: the primary deals new connections to the
  // reactors in turn, so "each reactor owns some of them" holds for any two; the kernel's hash would not.
  const run = start(t, [...LOADER, HELPER, '--reactors', '2', '--build-delay-ms', '500', '--distribution', 'round-robin'], { pids })
  const endpoint = await line(run, /listening on (\S+)/)
  const [primary, ...reactorPids] = (await line(run, /pids (\S+)/)).split(',').map(Number)
  const metricsUrl = await line(run, /metrics on (\S+)/)
  for (const pid of reactorPids) pids.add(pid)
  t.equal(primary, run.child.pid, 'the primary is listed first')
  t.equal(reactorPids.length, 2)
  t.match(run.stdout(), /distribution round-robin\n/)
  const scrape = async (): Promise<string> => await (await fetch(metricsUrl)).text()
  const livePids = async (): Promise<number[]> => (await (await fetch(metricsUrl.replace('/metrics', '/pids'))).text()).split(',').map(Number)

  // Calls over several connections land on both reactors.
  const first = clients(t, endpoint, 6)
  const servedBy: number[] = []
  for (const client of first) servedBy.push((await client.service(ReactorService).Pid({})).pid)
  t.same([...new Set(servedBy)].sort(), [...reactorPids].sort(), 'each reactor owns some of the connections')
  for (const [i, client] of first.entries()) {
    t.same(await client.service(CalculatorService).Add({ x: i, y: 2 }), { result: i + 2 })
    t.same(await client.service(CalculatorService).Add({ x: 2, y: i }), { result: i + 2 })
  }
  const metrics = await scrape()
  t.equal(sample(metrics, ADD), 12, 'the metrics sum both reactors\' calls')
  t.equal(sample(metrics, 'nyala_calls_handled_total{service="nyala.test.ReactorService",method="Pid"}'), 6)
  t.equal(sample(metrics, 'nyala_service_workers{service="nyala.demo.CalculatorService"}'), 20)
  t.equal(sample(metrics, 'nyala_reactors'), 2)
  t.equal(sample(metrics, 'nyala_reactor_restarts_total'), 0)

  // SIGKILL one reactor: the primary forks a replacement, clients reconnect.
  const victim = servedBy[0]!
  process.kill(victim, 'SIGKILL')
  const replaced = await until('a replacement reactor', run, async () => {
    const live = await livePids()
    return live.length === 3 && !live.includes(victim) ? live.slice(1) : undefined
  })
  for (const pid of replaced) pids.add(pid)
  t.notOk(replaced.includes(victim))
  t.match(run.stderr(), new RegExp(`reactor \\d \\(pid ${victim}\\) was killed by SIGKILL`), 'the primary logs why')
  t.equal(sample(await scrape(), 'nyala_reactor_restarts_total'), 1)
  // The victim's clients lost their connection; their next call opens a new one.
  for (const [i, client] of first.entries()) {
    let pid: number | undefined
    for (let attempt = 0; pid === undefined; attempt++) {
      try {
        pid = (await client.service(ReactorService).Pid({})).pid
      } catch (err) {
        // The close may still be on its way to a client that had the victim's connection.
        if (!(err instanceof RpcError) || servedBy[i] !== victim || attempt > 0) throw err
      }
    }
    t.ok(replaced.includes(pid), `client ${i} is served by a live reactor`)
  }

  // One dies; its replacement starts asking for port 0 as the other did; the
  // other dies before the replacement listens. The primary's handle for port
  // 0 went with it, so the replacement gets a port of its own: it is moved to
  // the real one, and the endpoint keeps serving.
  const port = endpoint.split(':')[1]
  const startedOnZero = (): number => run.stderr().match(/started, listening on port 0\n/g)?.length ?? 0
  const before = startedOnZero()
  process.kill(replaced[0]!, 'SIGKILL')
  await until('a replacement starting on port 0', run, () => startedOnZero() > before ? true : undefined)
  process.kill(replaced[1]!, 'SIGKILL')
  const moved = await until('two reactors on the endpoint\'s port', run, async () => {
    const live = (await livePids()).slice(1)
    return live.length === 2 && !live.some((pid) => replaced.includes(pid)) ? live : undefined
  })
  for (const pid of moved) pids.add(pid)
  t.match(run.stderr(), new RegExp(`got port \\d+, not ${port}; restarting it on ${port}`), 'a reactor that got another port was moved')
  const movedClients = clients(t, endpoint, 2)
  t.same((await Promise.all(movedClients.map(async (c) => (await c.service(ReactorService).Pid({})).pid))).sort(), [...moved].sort(), 'the endpoint reaches both')
  t.equal(sample(await scrape(), 'nyala_reactor_restarts_total'), 3, 'a move is not a restart')

  // Both at once: the replacements bind the same real port again.
  for (const pid of moved) process.kill(pid, 'SIGKILL')
  const fresh = await until('two replacement reactors', run, async () => {
    const live = (await livePids()).slice(1)
    return live.length === 2 && !live.some((pid) => moved.includes(pid)) ? live : undefined
  })
  for (const pid of fresh) pids.add(pid)
  const after = clients(t, endpoint, 2)
  t.same((await Promise.all(after.map(async (c) => (await c.service(ReactorService).Pid({})).pid))).sort(), [...fresh].sort(), 'the same endpoint reaches both replacements')
  t.equal(sample(await scrape(), 'nyala_reactor_restarts_total'), 5)

  // SIGTERM to the primary: calls in flight on both reactors are answered, then exit 0.
  const sleepers = clients(t, endpoint, 4)
  const sleepersBy = new Set<number>()
  for (const client of sleepers) sleepersBy.add((await client.service(ReactorService).Pid({})).pid)
  t.equal(sleepersBy.size, 2, 'the sleeping calls run on both reactors')
  const sleeps = sleepers.map((client) => client.service(CalculatorService).Sleep({ sleep_micros: 3_000_000 }))
  await until('four handlers running', run, async () => {
    const text = await scrape()
    const workers = sample(text, 'nyala_service_workers{service="nyala.demo.CalculatorService"}')!
    const idle = sample(text, 'nyala_service_idle_workers{service="nyala.demo.CalculatorService"}')!
    return workers - idle === 4 ? true : undefined
  })
  run.child.kill('SIGTERM')
  const outcomes = await Promise.allSettled(sleeps)
  t.same(outcomes.map((o) => o.status), ['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled'], 'every call in flight was answered')
  t.equal(await run.exit, 0)
  for (const pid of fresh) t.notOk(isAlive(pid), `reactor ${pid} exited`)
})

t.test('connections older than the maximum age are drained so one client reaches both reactors', async t => {
  const pids = new Set<number>()
  const run = start(t, [...LOADER, HELPER, '--reactors', '2', '--max-connection-age-ms', '150'], { pids })
  const endpoint = await line(run, /listening on (\S+)/)
  const reactorPids = (await line(run, /pids (\S+)/)).split(',').map(Number).slice(1)
  for (const pid of reactorPids) pids.add(pid)
  const client = new Client({ endpoint, retry: {} })
  t.teardown(() => client.close())
  const seen = new Set<number>()
  let calls = 0
  while (seen.size < 2) {
    seen.add((await client.service(ReactorService).Pid({})).pid)
    calls++
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  t.same([...seen].sort(), [...reactorPids].sort(), `${calls} calls on one client, all answered, reached both reactors`)
  client.close()
  run.child.kill('SIGTERM')
  t.equal(await run.exit, 0)
})

t.test('nyala serve from the sources with --eval: default reactors, IPC listening and usage, SIGTERM exits 0', async t => {
  const pids = new Set<number>()
  const run = cli(t, ['serve', '--port', '0', '--metrics-port', '0'], { ipc: true, pids })
  const listening = await message(run, 'nyala:listening')
  const listed = listening.pids as number[]
  for (const pid of listed) pids.add(pid)
  t.equal(listed.length, 1 + availableParallelism(), 'the primary and one reactor per core')
  t.equal(listed[0], run.child.pid)
  const endpoint = `${listening.host as string}:${listening.port as number}`
  t.match(run.stdout(), `listening on ${endpoint}\n`)
  t.equal(run.stdout().match(/listening on/g)!.length, 1, 'printed once, by the primary')
  const metricsUrl = await line(run, /metrics on (\S+)/)

  const list = clients(t, endpoint, 4)
  for (const [i, client] of list.entries()) t.same(await client.service(CalculatorService).Add({ x: i, y: 1 }), { result: i + 1 })
  t.equal(sample(await (await fetch(metricsUrl)).text(), ADD), 4)

  run.child.send({ type: 'nyala:usage', id: 7 })
  const usage = await message(run, 'nyala:usage', 7)
  t.same(usage.pids, listed)
  t.equal((usage.usage as NodeJS.ResourceUsage[]).length, listed.length)
  t.ok((usage.usage as NodeJS.ResourceUsage[]).every((u) => u.userCPUTime > 0 && typeof u.voluntaryContextSwitches === 'number'))

  if (existsSync('/proc')) {
    const cmdline = readFileSync(`/proc/${listed[1]}/cmdline`, 'utf8').split('\0')
    t.ok(cmdline.some((arg) => arg.includes('@tapjs/typescript')), 'a reactor runs with the primary\'s loader')
    t.ok(cmdline.some((arg) => arg.endsWith('bin/serve-reactor.ts')), 'a reactor runs the serve-reactor entry from the sources')
  }
  run.child.kill('SIGTERM')
  t.equal(await run.exit, 0)
  for (const pid of listed.slice(1)) t.notOk(isAlive(pid), `reactor ${pid} exited`)
})

t.test('nyala serve fails to start, exiting non-zero, when its port is taken', async t => {
  const taken = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { taken.close() })
  const run = cli(t, ['serve', '--reactors', '2', '--port', String((taken.address() as AddressInfo).port)])
  t.not(await run.exit, 0)
  t.match(run.stderr(), /EADDRINUSE/)
})

// The shim imports dist/: test it when dist/ was built from these sources.
const DIST_ENTRY = `${ROOT}dist/bin/serve-reactor.js`
const distFresh = existsSync(DIST_ENTRY) &&
  ['bin/cli.ts', 'bin/serve-reactor.ts', 'reactor/cluster.ts'].every((f) => statSync(`${ROOT}dist/${f.replace(/\.ts$/, '.js')}`).mtimeMs >= statSync(`${ROOT}${f}`).mtimeMs)

// npm test builds dist/ first; under CI a stale dist/ is a failure, not a skip (nothing would be tested).
if (!distFresh && process.env.CI !== undefined && process.env.CI !== '') {
  t.fail('dist/ is missing or older than the sources while CI is set: bin/nyala serve --reactors 2 from dist/ cannot run (npm test builds it)')
}

t.test('bin/nyala serve --reactors 2 from dist/', { skip: distFresh ? false : 'dist/ is missing or older than the sources: npm run build' }, async t => {
  const pids = new Set<number>()
  // Bare: on Node 26 tap's coverage hooks load the extensionless ES module bin/nyala through
  // require() and fail with ERR_REQUIRE_CYCLE_MODULE (a plain `node bin/nyala` works).
  const run = start(t, [`${ROOT}bin/nyala`, 'serve', '--reactors', '2', '--port', '0'], { ipc: true, pids, bare: true })
  const listening = await message(run, 'nyala:listening')
  const listed = listening.pids as number[]
  for (const pid of listed) pids.add(pid)
  t.equal(listed.length, 3)
  if (existsSync('/proc')) {
    t.ok(readFileSync(`/proc/${listed[1]}/cmdline`, 'utf8').split('\0').includes(DIST_ENTRY), 'a reactor runs dist/bin/serve-reactor.js')
  }
  const list = clients(t, `${listening.host as string}:${listening.port as number}`, 2)
  for (const client of list) t.same(await client.service(CalculatorService).Add({ x: 2, y: 3 }), { result: 5 })
  run.child.kill('SIGTERM')
  t.equal(await run.exit, 0)
})
