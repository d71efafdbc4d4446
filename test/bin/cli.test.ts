/**
 * The `nyala` command line, run as a child process from the TypeScript
 * sources (through the same loader tap uses): serve with scheduling flags
 * and a metrics endpoint, call, fairness --json, and bad flags. The usage
 * cases, which start nothing, run in one child process (`usage`): a child
 * per case cost two to five seconds each and brought the file near tap's
 * per-file timeout on a loaded machine.
 */
import t from 'tap'
import { Client } from '../../reactor/krpc/client.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { cliCases, runCli, waitForOutput, type CliRun } from '../helpers/cli-cases.js'

// Several processes start here through the TypeScript loader.
t.setTimeout(300_000)

const nyala = (args: string[]): CliRun => runCli(args)
const waitFor = waitForOutput

t.test('serve with scheduling flags and --metrics-port; call; SIGTERM exits 0', async t => {
  // One reactor: the gauges below are per process (test/krpc/cluster.test.ts sums several).
  const server = nyala(['serve', '--reactors', '1', '--port', '0', '--metrics-port', '0', '--workers', '2', '--queue-length', '5', '--queue', 'fifo', '--busy-poll-us', '50'])
  t.teardown(() => { if (server.child.exitCode === null) server.child.kill('SIGKILL') })
  const [, endpoint] = await waitFor(server, /listening on (127\.0\.0\.1:\d+)/)
  const [, io] = await waitFor(server, /listening on 127\.0\.0\.1:\d+\nio: (\S+)\n/)
  t.ok(['io_uring', 'epoll', 'node'].includes(io!), `the transport, on the line after: io: ${io}`)
  if (process.env.NYALA_IO !== undefined && process.env.NYALA_IO !== '' && process.env.NYALA_IO !== 'auto') t.equal(io, process.env.NYALA_IO)
  const [, metricsUrl] = await waitFor(server, /metrics on (http:\/\/\S+)/)

  const call = nyala(['call', endpoint!, 'nyala.demo.CalculatorService.Add', '{"x":1,"y":2}'])
  t.equal(await call.exit, 0, call.stderr())
  t.equal(call.stdout(), '{"result": 3}\n')

  const client = new Client({ endpoint })
  t.teardown(() => client.close())
  const calc = client.service(CalculatorService)
  for (let i = 0; i < 4; i++) t.same(await calc.Add({ x: i, y: 1 }), { result: i + 1 })

  const metrics = await (await fetch(metricsUrl!)).text()
  t.match(metrics, /nyala_calls_handled_total\{service="nyala\.demo\.CalculatorService",method="Add"\} 5/)
  t.match(metrics, /nyala_service_workers\{service="nyala\.demo\.CalculatorService"\} 2/)
  t.match(metrics, /nyala_rpc_incoming_queue_time_seconds_count\{service="nyala\.demo\.CalculatorService",method="Add"\} 5/)
  t.equal((await fetch(metricsUrl!.replace('/metrics', '/other'))).status, 404)

  client.close()
  server.child.kill('SIGTERM')
  t.equal(await server.exit, 0)
})

t.test('fairness --json prints the documented shape', async t => {
  const run = nyala(['fairness', '--json', '--run-seconds', '0.4', '--clients', '4', '--workers', '1', '--queue-length', '1', '--sleep-ms', '5', '--deadline-ms', '1000'])
  t.equal(await run.exit, 0, run.stderr())
  const result = JSON.parse(run.stdout()) as Record<string, unknown>
  t.equal((result.successes as number[]).length, 4)
  t.ok((result.successes as number[]).every((n) => Number.isInteger(n) && n >= 0))
  t.type(result.tooBusy, 'number')
  t.type(result.otherErrors, 'number')
  t.ok((result.jain as number) > 0 && (result.jain as number) <= 1)
  t.same(Object.keys(result.latencyMs as object).sort(), ['p50', 'p99', 'p999', 'p9999'])
})

t.test('fairness --reactors 2 runs the clients against nyala serve --reactors 2, sharing one scheduler', async t => {
  const run = nyala(['fairness', '--json', '--reactors', '2', '--run-seconds', '0.4', '--clients', '4', '--workers', '1', '--queue-length', '1', '--sleep-ms', '5', '--deadline-ms', '1000'])
  t.equal(await run.exit, 0, run.stderr())
  const result = JSON.parse(run.stdout()) as Record<string, unknown>
  t.equal(result.reactors, 2)
  t.equal(result.sharedScheduler, true)
  t.equal((result.successes as number[]).length, 4)
  t.ok((result.successes as number[]).reduce((a, b) => a + b, 0) > 0, 'calls were served')
  t.type(result.tooBusy, 'number')
})

t.test('fairness with two queues prints one row each, in one run', async t => {
  const run = nyala(['fairness', '--json', '--queue', 'edf,fifo', '--run-seconds', '0.2', '--clients', '2', '--workers', '1', '--queue-length', '1', '--sleep-ms', '2'])
  t.equal(await run.exit, 0, run.stderr())
  const rows = JSON.parse(run.stdout()) as Array<{ queue: string }>
  t.same(rows.map((r) => r.queue), ['edf', 'fifo'])
})

t.test('bad flags exit non-zero with a message, in a real process', async t => {
  const run = nyala(['serve', '--queue', 'lifo', '--port', '0'])
  t.equal(await run.exit, 2)
  t.match(run.stderr(), /--queue must be edf or fifo/)
})

t.test('usage: unknown flags and bad values, COMMAND --help, Object.prototype names', async t => {
  const bad = [['bench', '--bogus'], ['serve', '--port'], ['serve', '--workers', 'many'], ['fairness', '--clients', 'x', '--json']]
  const help = ['serve', 'bench', 'call', 'trace', 'fairness']
  const notCommands = ['constructor', 'toString', '__proto__']
  const outcomes = await cliCases(t, [...bad, ...help.map((command) => [command, '--help']), ...notCommands.map((command) => [command])])
  t.equal(outcomes.length, bad.length + help.length + notCommands.length)

  t.test('unknown flags and bad values are usage errors: one line, exit 2, no stack', async t => {
    for (const [i, args] of bad.entries()) {
      const run = outcomes[i]!
      t.equal(run.code, 2, args.join(' '))
      t.match(run.stderr, new RegExp(`^nyala ${args[0]}: `), args.join(' '))
      t.notMatch(run.stderr, /\n\s+at /, `${args.join(' ')}: no stack trace`)
    }
  })

  t.test('COMMAND --help prints that command\'s usage only and exits 0', async t => {
    for (const [i, command] of help.entries()) {
      const run = outcomes[bad.length + i]!
      t.equal(run.code, 0, command)
      t.match(run.stdout, new RegExp(`^Usage:\n  nyala ${command} `), command)
      for (const other of help.filter((c) => c !== command)) t.notMatch(run.stdout, new RegExp(`^  nyala ${other} `, 'm'), `${command} --help leaves out ${other}`)
    }
  })

  t.test('names of Object.prototype are not commands', async t => {
    for (const [i, command] of notCommands.entries()) {
      const run = outcomes[bad.length + help.length + i]!
      t.equal(run.code, 2, command)
      t.match(run.stderr, new RegExp(`unknown command '${command}'`))
    }
  })
})
