/**
 * Instructions the KRPC client executes per call, counted by valgrind's
 * callgrind: the client-side counterpart of server-instructions.ts, a
 * figure that a busy or stolen core does not move.
 *
 *   node dist/bench/client-instructions.js [--tree DIR] [--batches 1000]
 *       [--batch 100] [--warmup-batches 2000] [--payload-bytes 0] [--keep DIR]
 *       [--node-flag FLAG]...
 *
 * Starts this tree's `bin/nyala serve --reactors 1` (not instrumented),
 * then this script again as the client under `valgrind --tool=callgrind
 * --instr-atstart=no`, with DIR's client (default: this tree's; DIR must be
 * built, dist/ in place). The client calls in lockstep, as the async
 * benchmark's chains do through the stub's callback form: `--batch` `Add`
 * calls written in one turn, the next batch once all are answered. After
 * the warm-up (instrumentation off: the JIT settles) it tells this process,
 * which switches instrumentation on; after the counted batches it is told
 * to stop, and this process dumps the counts and prints one JSON line:
 * `{ tree, calls, instructions, perCall }`. The server is the same for
 * every tree measured, so only the client's code differs. GC varies a
 * little from run to run (about 1 %): compare trees with a few runs each.
 */
import { spawn, execFileSync } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { COUNT_OPTIONS, countSettings, countedInstructions, listeningPort } from './callgrind-counts.js'

const { values } = parseArgs({
  options: {
    ...COUNT_OPTIONS,
    // Internal: this script as the instrumented client, calling `--port`.
    child: { type: 'boolean', default: false },
    port: { type: 'string' }
  }
})
const here = fileURLToPath(import.meta.url)
const root = resolve(fileURLToPath(new URL('../..', import.meta.url)))
const { tree, batches, batch, warmup, payload } = countSettings(values, root)

type Done = (error: Error | null) => void
interface Calculator {
  Add: (request: { x: number, y: number }, options: { timeoutMs: number }, callback: Done) => void
  Echo: (request: { data: string }, options: { timeoutMs: number }, callback: Done) => void
}

// The instrumented client: warm up, say so, wait for "go", count, say so, wait to be stopped.
async function child (): Promise<void> {
  const { Client } = await import(pathToFileURL(join(tree, 'dist', 'reactor', 'krpc', 'client.js')).href) as { Client: new (o: object) => { service: (d: unknown) => Calculator, close: () => void } }
  const { CalculatorService } = await import(pathToFileURL(join(tree, 'dist', 'examples', 'calculator', 'index.js')).href) as { CalculatorService: unknown }
  // Under callgrind on a loaded machine the first negotiation can take seconds: the counts start after the warm-up anyway.
  const client = new Client({ endpoint: `127.0.0.1:${values.port}`, negotiationTimeoutMs: 60_000 })
  const calc = client.service(CalculatorService)
  const data = 'x'.repeat(payload)
  const run = (): Promise<void> => new Promise((resolve, reject) => {
    let left = batch
    const done: Done = (error) => {
      if (error !== null) { reject(error); return }
      if (--left === 0) resolve()
    }
    for (let i = 0; i < batch; i++) {
      if (payload > 0) calc.Echo({ data }, { timeoutMs: 60_000 }, done)
      else calc.Add({ x: i, y: 1 }, { timeoutMs: 60_000 }, done)
    }
  })
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]()
  for (let i = 0; i < warmup; i++) await run()
  process.stdout.write('warm\n')
  await lines.next()
  for (let i = 0; i < batches; i++) await run()
  process.stdout.write('counted\n')
  await lines.next()
  client.close()
}

async function main (): Promise<void> {
  const out = mkdtempSync(join(tmpdir(), 'nyala-callgrind-'))
  const env = { ...process.env, NODE_OPTIONS: '' }
  const server = spawn(process.execPath, [join(root, 'bin', 'nyala'), 'serve', '--host', '127.0.0.1', '--port', '0', '--reactors', '1'],
    { stdio: ['ignore', 'pipe', 'pipe'], env })
  const client = spawn('valgrind', [
    '--tool=callgrind', '--instr-atstart=no', '--separate-threads=yes', `--callgrind-out-file=${join(out, 'callgrind.out.%p')}`,
    process.execPath, ...values['node-flag'], here, '--child', '--tree', tree, '--port', String(await listeningPort(server, 60)),
    '--batches', String(batches), '--batch', String(batch), '--warmup-batches', String(warmup), '--payload-bytes', String(payload)
  ], { stdio: ['pipe', 'pipe', 'inherit'], env })
  process.on('exit', () => {
    server.kill('SIGKILL')
    client.kill('SIGKILL')
    // --keep DIR leaves the dump there, as server-instructions.ts's does.
    if (values.keep !== undefined) execFileSync('cp', ['-r', `${out}/.`, values.keep])
    rmSync(out, { recursive: true, force: true })
  })
  const said = createInterface({ input: client.stdout! })[Symbol.asyncIterator]()
  const expect = async (word: string): Promise<void> => {
    const line = await said.next()
    if (line.done === true || line.value !== word) throw new Error(`the client said ${line.done === true ? 'nothing' : line.value}, not ${word}`)
  }
  await expect('warm')
  const pid = String(client.pid)
  execFileSync('callgrind_control', ['-i', 'on', pid], { stdio: 'ignore' })
  client.stdin!.write('go\n')
  await expect('counted')
  execFileSync('callgrind_control', ['-d', pid], { stdio: 'ignore' })
  execFileSync('callgrind_control', ['-i', 'off', pid], { stdio: 'ignore' })
  client.stdin!.end('stop\n')
  await once(client, 'exit')
  const { main: instructions, all } = countedInstructions(out)
  const calls = batches * batch
  process.stdout.write(JSON.stringify({ tree, calls, instructions, perCall: Math.round(instructions / calls), allThreadsPerCall: Math.round(all / calls) }) + '\n')
}

(values.child ? child() : main()).then(() => process.exit(0), (err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`)
  process.exit(1)
})
