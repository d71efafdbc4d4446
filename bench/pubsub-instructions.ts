/**
 * Instructions the redis example executes per delivered Pub/Sub message,
 * counted by valgrind's callgrind (steady on a busy machine, unlike CPU
 * time): the fan-out path's guard.
 *
 *   node dist/bench/pubsub-instructions.js [--tree DIR] [--io node] [--subscribers 20]
 *       [--batch 16] [--batches 300] [--warmup-batches 1000] [--keep DIR]
 *       [--node-flag FLAG]...
 *
 * Starts `DIR/dist/examples/redis/main.js --port 0 --reactors 1 --io IO`
 * (default: this tree, node:net) under `valgrind --tool=callgrind
 * --instr-atstart=no`, subscribes `--subscribers` connections of this
 * process to `ch`, then publishes in lockstep from one more connection:
 * `--batch` PUBLISH commands in one write, the next batch once every
 * subscriber has every message and the publisher every reply, so every
 * tree sees the same reads. After the warm-up (instrumentation off) it
 * switches instrumentation on, runs `--batches` batches, dumps and prints
 * one JSON line: `{ tree, io, messages, instructions, perMessage,
 * allThreadsPerMessage }` (messages delivered = batches x batch x
 * subscribers; the main thread's count, and every thread's). Compare trees
 * with a few runs each, alternating.
 */
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { countedInstructions, listeningPort } from './callgrind-counts.js'

const { values } = parseArgs({
  options: {
    tree: { type: 'string' },
    io: { type: 'string', default: 'node' },
    subscribers: { type: 'string', default: '20' },
    batch: { type: 'string', default: '16' },
    batches: { type: 'string', default: '300' },
    'warmup-batches': { type: 'string', default: '1000' },
    keep: { type: 'string' },
    'node-flag': { type: 'string', multiple: true, default: [] as string[] }
  }
})
const root = resolve(fileURLToPath(new URL('../..', import.meta.url)))
const tree = resolve(values.tree ?? root)
const subscribers = Number(values.subscribers)
const batch = Number(values.batch)
const batches = Number(values.batches)
const warmup = Number(values['warmup-batches'])
const MESSAGE_BYTES = Buffer.byteLength('*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nmsg\r\n')
const SUBSCRIBED_BYTES = Buffer.byteLength('*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n')
const PUBLISH = Buffer.from('*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$3\r\nmsg\r\n'.repeat(batch), 'latin1')
const REPLY_BYTES = Buffer.byteLength(`:${subscribers}\r\n`)

const out = mkdtempSync(join(tmpdir(), 'nyala-callgrind-'))
const server = spawn('valgrind', [
  '--tool=callgrind', '--instr-atstart=no', '--separate-threads=yes', `--callgrind-out-file=${join(out, 'callgrind.out.%p')}`,
  process.execPath, ...values['node-flag'], join(tree, 'dist', 'examples', 'redis', 'main.js'), '--port', '0', '--reactors', '1', '--io', values.io!
], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } })

const sockets: Socket[] = []
let stopped = false
const stop = (): void => {
  if (stopped) return
  stopped = true
  for (const socket of sockets) socket.destroy()
  server.kill('SIGKILL')
}
// --keep DIR leaves the callgrind dump there (callgrind_annotate names Node's
// C++ and builtins; JIT code is '???', which --node-flag=--perf-basic-prof
// names in /tmp/perf-PID.map).
process.on('exit', () => {
  stop()
  if (values.keep !== undefined) execFileSync('cp', ['-r', `${out}/.`, values.keep])
  rmSync(out, { recursive: true, force: true })
})

// Bytes received by all subscribers and by the publisher; `check` runs on each arrival.
let delivered = 0
let replied = 0
let check = (): void => {}

function open (port: number, onData: (n: number) => void): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => resolve(socket))
    sockets.push(socket)
    socket.once('error', reject)
    socket.on('data', (d: Buffer) => { onData(d.length); check() })
  })
}

function until (done: () => boolean): Promise<void> {
  return new Promise((resolve) => {
    check = () => { if (done()) { check = () => {}; resolve() } }
    check()
  })
}

async function main (): Promise<void> {
  const port = await listeningPort(server, 600)
  for (let i = 0; i < subscribers; i++) {
    const socket = await open(port, (n) => { delivered += n })
    socket.write('*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n')
  }
  await until(() => delivered === subscribers * SUBSCRIBED_BYTES)
  const publisher = await open(port, (n) => { replied += n })
  const run = async (): Promise<void> => {
    delivered = 0
    replied = 0
    publisher.write(PUBLISH)
    await until(() => delivered === batch * subscribers * MESSAGE_BYTES && replied === batch * REPLY_BYTES)
  }
  for (let i = 0; i < warmup; i++) await run()
  const pid = String(server.pid)
  execFileSync('callgrind_control', ['-i', 'on', pid], { stdio: 'ignore' })
  for (let i = 0; i < batches; i++) await run()
  execFileSync('callgrind_control', ['-d', pid], { stdio: 'ignore' })
  stop()
  const { main: instructions, all } = countedInstructions(out)
  const messages = batches * batch * subscribers
  process.stdout.write(JSON.stringify({ tree, io: values.io, messages, instructions, perMessage: Math.round(instructions / messages), allThreadsPerMessage: Math.round(all / messages) }) + '\n')
}

main().then(() => process.exit(0), (err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`)
  process.exit(1)
})
