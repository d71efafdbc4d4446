/**
 * Instructions the KRPC server executes per pipelined call, counted by
 * valgrind's callgrind: a figure that a busy or stolen core does not move,
 * for bisecting a range of commits where CPU-time pairs drown in the VM's
 * phases.
 *
 *   node dist/bench/server-instructions.js [--tree DIR] [--batches 1000]
 *       [--batch 100] [--warmup-batches 2000] [--payload-bytes 0] [--keep DIR]
 *       [--node-flag FLAG]... [--server-flag FLAG]...
 *
 * Starts `DIR/bin/nyala serve --reactors 1` (default: this tree) under
 * `valgrind --tool=callgrind --instr-atstart=no`, then calls it from this
 * tree's client in lockstep: `--batch` `Add` calls written in one turn,
 * the next batch once all are answered, so every tree's server sees the
 * same reads of the same frames whatever its speed. After the warm-up
 * (instrumentation off: the JIT settles) it switches instrumentation on,
 * runs `--batches` batches, dumps the counts and prints one JSON line:
 * `{ tree, calls, instructions, perCall, allThreadsPerCall }`: the main
 * thread's counts (V8's compiler and GC threads vary from run to run; the
 * main thread's agree within about 0.5 %), and every thread's. The client is the same for
 * every tree measured, so only the server's code differs. Callgrind runs
 * the server about 50 times slower; GC still varies a little from run to
 * run (about 1 %), so compare trees with a few runs each.
 */
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Client } from '../reactor/krpc/client.js'
import { CalculatorService } from '../examples/calculator/index.js'
import { COUNT_OPTIONS, countSettings, countedInstructions, listeningPort } from './callgrind-counts.js'

const { values } = parseArgs({
  options: {
    ...COUNT_OPTIONS
  }
})
const root = resolve(fileURLToPath(new URL('../..', import.meta.url)))
const { tree, batches, batch, warmup, payload } = countSettings(values, root)

const out = mkdtempSync(join(tmpdir(), 'nyala-callgrind-'))
const server = spawn('valgrind', [
  '--tool=callgrind', '--instr-atstart=no', '--separate-threads=yes', `--callgrind-out-file=${join(out, 'callgrind.out.%p')}`,
  process.execPath, ...values['node-flag'], join(tree, 'bin', 'nyala'), 'serve', '--host', '127.0.0.1', '--port', '0', '--reactors', '1', ...values['server-flag']
], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } })

let stopped = false
const stop = (): void => {
  if (stopped) return
  stopped = true
  server.kill('SIGKILL')
}
// --keep DIR leaves the callgrind dump there (callgrind_annotate names Node's
// C++ and builtins; JIT code is '???', which --node-flag --perf-basic-prof
// names in /tmp/perf-PID.map).
process.on('exit', () => {
  stop()
  if (values.keep !== undefined) execFileSync('cp', ['-r', `${out}/.`, values.keep])
  rmSync(out, { recursive: true, force: true })
})

async function main (): Promise<void> {
  const port = await listeningPort(server, 600)
  // Under callgrind on a loaded machine the first negotiation can take seconds: the counts start after the warm-up anyway.
  const client = new Client({ endpoint: `127.0.0.1:${port}`, negotiationTimeoutMs: 60_000 })
  const calc = client.service(CalculatorService)
  const data = 'x'.repeat(payload)
  // One lockstep batch: `batch` calls in one turn, resolved when every one is answered.
  const run = (): Promise<void> => new Promise((resolve, reject) => {
    let left = batch
    const done = (error: Error | null): void => {
      if (error !== null) { reject(error); return }
      if (--left === 0) resolve()
    }
    for (let i = 0; i < batch; i++) {
      if (payload > 0) calc.Echo({ data }, { timeoutMs: 60_000 }, done)
      else calc.Add({ x: i, y: 1 }, { timeoutMs: 60_000 }, done)
    }
  })
  for (let i = 0; i < warmup; i++) await run()
  const pid = String(server.pid)
  execFileSync('callgrind_control', ['-i', 'on', pid], { stdio: 'ignore' })
  for (let i = 0; i < batches; i++) await run()
  execFileSync('callgrind_control', ['-d', pid], { stdio: 'ignore' })
  client.close()
  stop()
  const { main: instructions, all } = countedInstructions(out)
  const calls = batches * batch
  process.stdout.write(JSON.stringify({ tree, calls, instructions, perCall: Math.round(instructions / calls), allThreadsPerCall: Math.round(all / calls) }) + '\n')
}

main().then(() => process.exit(0), (err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`)
  process.exit(1)
})
