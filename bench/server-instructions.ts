/**
 * Instructions the KRPC server executes per pipelined call, counted by
 * valgrind's callgrind: a figure that a busy or stolen core does not move,
 * for bisecting a range of commits where CPU-time pairs drown in the VM's
 * phases.
 *
 *   node dist/bench/server-instructions.js [--tree DIR] [--batches 1000]
 *       [--batch 100] [--warmup-batches 2000] [--payload-bytes 0] [--keep DIR]
 *       [--node-flag FLAG]...
 *
 * Starts `DIR/bin/nyala serve --reactors 1` (default: this tree) under
 * `valgrind --tool=callgrind --instr-atstart=no`, then calls it from this
 * tree's client in lockstep: `--batch` `Add` calls written in one turn,
 * the next batch once all are answered, so every tree's server sees the
 * same reads of the same frames whatever its speed. After the warm-up
 * (instrumentation off: the JIT settles) it switches instrumentation on,
 * runs `--batches` batches, dumps the counts and prints one JSON line:
 * `{ tree, calls, instructions, perCall }`. The client is the same for
 * every tree measured, so only the server's code differs. Callgrind runs
 * the server about 50 times slower; GC still varies a little from run to
 * run (about 1 %), so compare trees with a few runs each.
 */
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Client } from '../reactor/krpc/client.js'
import { CalculatorService } from '../examples/calculator/index.js'

const { values } = parseArgs({
  options: {
    tree: { type: 'string' },
    batches: { type: 'string', default: '1000' },
    batch: { type: 'string', default: '100' },
    'warmup-batches': { type: 'string', default: '2000' },
    'payload-bytes': { type: 'string', default: '0' },
    keep: { type: 'string' },
    'node-flag': { type: 'string', multiple: true, default: [] }
  }
})
const root = resolve(fileURLToPath(new URL('../..', import.meta.url)))
const tree = resolve(values.tree ?? root)
const batches = Number(values.batches)
const batch = Number(values.batch)
const warmup = Number(values['warmup-batches'])
const payload = Number(values['payload-bytes'])

const out = mkdtempSync(join(tmpdir(), 'nyala-callgrind-'))
const server = spawn('valgrind', [
  '--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${join(out, 'callgrind.out.%p')}`,
  process.execPath, ...values['node-flag'], join(tree, 'bin', 'nyala'), 'serve', '--host', '127.0.0.1', '--port', '0', '--reactors', '1'
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

function listening (): Promise<number> {
  return new Promise((resolve, reject) => {
    let text = ''
    const timer = setTimeout(() => reject(new Error(`server not listening after 120 s: ${text}`)), 120_000)
    const onData = (d: Buffer): void => {
      text += d.toString()
      const m = /listening on [^\s:]+:(\d+)/.exec(text)
      if (m !== null) { clearTimeout(timer); resolve(Number(m[1])) }
    }
    server.stdout.on('data', onData)
    server.stderr.on('data', onData)
    server.once('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}): ${text}`)) })
  })
}

async function main (): Promise<void> {
  const port = await listening()
  const client = new Client({ endpoint: `127.0.0.1:${port}` })
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
  let instructions = 0
  for (const name of readdirSync(out)) {
    const text = readFileSync(join(out, name), 'utf8')
    for (const m of text.matchAll(/^totals:\s+(\d+)/gm)) instructions += Number(m[1])
  }
  const calls = batches * batch
  process.stdout.write(JSON.stringify({ tree, calls, instructions, perCall: Math.round(instructions / calls) }) + '\n')
}

main().then(() => process.exit(0), (err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`)
  process.exit(1)
})
