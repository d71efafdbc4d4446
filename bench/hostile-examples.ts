/**
 * Hostile peers against the examples (memcached and redis), run by
 * bench/hostile.ts beside its KRPC scenarios (`node dist/bench/hostile.js
 * --only stat-nonreaders,...`). Each scenario starts the example as a child
 * (`node dist/examples/NAME/main.js --port 0 --host 127.0.0.1`), reads its
 * `listening on HOST:PORT` line, attacks it from raw sockets on 127.0.0.1
 * while good clients keep calling it (one request at a time, each answered
 * within 1 s or counted as missed), samples its RSS every 50 ms from
 * /proc/PID/status, and measures RSS again 30 s after the attack ended.
 * Every loop is bounded in count and time; every socket is destroyed and
 * the child killed by its PID when the scenario ends, failed or not.
 * `HOSTILE_EXAMPLE_FLAGS` (words split on spaces) are added to every
 * example's command line: a limit set otherwise than by default
 * (`HOSTILE_EXAMPLE_FLAGS='--max-answer-bytes-per-read 262144'`).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? '../' : '../../', import.meta.url))
const MiB = 1024 * 1024
/** The server's outbound budget (`maxOutboundBufferedBytes`'s default). */
const OUTBOUND_BUDGET_BYTES = 512 * MiB
/** What a Node process holds beyond the bytes it buffers: heap, code, slabs. */
const SLACK_BYTES = 150 * MiB
const AFTER_MS = 30_000

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const now = (): number => performance.now()
const mib = (bytes: number): string => (bytes / MiB).toFixed(1)

/** What a scenario of this file reports through (bench/hostile.ts's Run). */
export interface ExampleRun {
  command: string
  figure: (name: string, value: string | number) => void
  check: (name: string, target: string, measured: string, pass: boolean) => void
  /** Runs `cleanup` when the scenario ends, failed or not. */
  own: (cleanup: () => Promise<void> | void) => void
}

/** A scenario of this file, in bench/hostile.ts's shape. */
export interface ExampleScenario {
  name: string
  summary: string
  timeoutMs: number
  run: (run: ExampleRun) => Promise<void>
}

interface ExampleProc { pid: number, port: number, exited: () => boolean, kill: () => Promise<void> }

/** Starts `examples/NAME/main.js` on a free loopback port (under `ulimit -n` when asked). */
async function startExample (run: ExampleRun, name: string, flags: readonly string[] = [], ulimit?: number): Promise<ExampleProc> {
  const script = join(ROOT, 'dist', 'examples', name, 'main.js')
  const extra = (process.env.HOSTILE_EXAMPLE_FLAGS ?? '').split(' ').filter(w => w.length > 0)
  const args = [script, '--port', '0', '--host', '127.0.0.1', ...flags, ...extra]
  const shown = `node dist/examples/${name}/main.js ${args.slice(1).join(' ')}`
  run.command = ulimit === undefined ? shown : `bash -c 'ulimit -n ${ulimit} && exec ${shown}'`
  const child: ChildProcess = ulimit === undefined
    ? spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn('bash', ['-c', `ulimit -n ${ulimit} && exec "$0" "$@"`, process.execPath, ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  const pid = child.pid
  if (pid === undefined) throw new Error(`could not start ${run.command}`)
  let exited = false
  const exit = new Promise<void>((resolve) => child.once('exit', () => { exited = true; resolve() }))
  const kill = async (): Promise<void> => {
    if (exited) return
    try { process.kill(pid, 'SIGKILL') } catch {}
    await Promise.race([exit, sleep(5000)])
  }
  run.own(kill)
  child.stderr!.resume()
  const port = await new Promise<number>((resolve, reject) => {
    let text = ''
    const timer = setTimeout(() => reject(new Error(`${run.command}: no "listening on" line within 20 s`)), 20_000)
    child.stdout!.setEncoding('utf8')
    child.stdout!.on('data', (chunk: string) => {
      text = (text + chunk).slice(-4096)
      const m = /listening on \S+:(\d+)/.exec(text)
      if (m !== null) { clearTimeout(timer); resolve(Number(m[1])) }
    })
    void exit.then(() => { clearTimeout(timer); reject(new Error(`${run.command} exited before listening`)) })
  })
  return { pid, port, exited: () => exited, kill }
}

/** VmRSS and VmHWM of `pid` in bytes (0 once gone). */
function memoryOf (pid: number): { rss: number, hwm: number } {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8')
    const kib = (key: string): number => Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0) * 1024
    return { rss: kib('VmRSS'), hwm: kib('VmHWM') }
  } catch {
    return { rss: 0, hwm: 0 }
  }
}

/** Samples a process's RSS every 50 ms; `stop()` gives the peak seen (VmHWM included). */
function sampleRss (pid: number): { stop: () => number } {
  let peak = 0
  const timer = setInterval(() => { peak = Math.max(peak, memoryOf(pid).rss) }, 50)
  return { stop: () => { clearInterval(timer); return Math.max(peak, memoryOf(pid).hwm) } }
}

/** Opens a loopback socket (null when the connect fails); destroyed when the scenario ends. */
function open (run: ExampleRun, port: number, timeoutMs = 5000): Promise<Socket | null> {
  return new Promise((resolve) => {
    const socket = connect({ port, host: '127.0.0.1' })
    run.own(() => { socket.destroy() })
    const timer = setTimeout(() => { socket.destroy(); resolve(null) }, timeoutMs)
    socket.once('connect', () => { clearTimeout(timer); resolve(socket) })
    // A reset by the server is an outcome the scenario counts, not a crash of the bench.
    socket.on('error', () => { clearTimeout(timer); resolve(null) })
  })
}

/** Writes `bytes`, waiting for 'drain' at most `timeoutMs`; false when the socket is gone or did not drain. */
function write (socket: Socket, bytes: Buffer, timeoutMs = 1000): Promise<boolean> {
  if (socket.destroyed) return Promise.resolve(false)
  if (socket.write(bytes)) return Promise.resolve(true)
  return new Promise((resolve) => {
    const timer = setTimeout(() => { socket.off('drain', onDrain); resolve(false) }, timeoutMs)
    const onDrain = (): void => { clearTimeout(timer); resolve(true) }
    socket.once('drain', onDrain)
  })
}

/** A peer that writes `request` over and over without reading, until `untilMs` passes or the server closes it. */
async function pipelineWithoutReading (socket: Socket, request: Buffer, untilMs: number): Promise<number> {
  socket.pause()
  const batch = Buffer.concat(Array.from({ length: Math.max(1, Math.floor(16384 / request.length)) }, () => request))
  let written = 0
  while (now() < untilMs && !socket.destroyed) {
    if (!await write(socket, batch, Math.max(1, untilMs - now()))) {
      if (socket.destroyed) break
      continue
    }
    written += batch.length
  }
  return written
}

/**
 * A good client: sends `request` every 100 ms on its own connection and
 * counts the ones whose answer (`isAnswer` says when the bytes so far hold
 * one) arrives within 1 s; reconnects when the server closes it.
 */
async function goodClient (run: ExampleRun, port: number, request: Buffer, isAnswer: (bytes: Buffer) => boolean, untilMs: number): Promise<Served> {
  let sent = 0
  let answered = 0
  const latencies: number[] = []
  let socket: Socket | null = null
  while (now() < untilMs) {
    socket ??= await open(run, port, 1000)
    if (socket === null) { sent++; await sleep(100); continue }
    const s: Socket = socket
    sent++
    const sentAt = now()
    const ok = await new Promise<boolean>((resolve) => {
      let got = Buffer.alloc(0)
      const done = (value: boolean): void => { clearTimeout(timer); s.off('data', onData); s.off('close', onClose); resolve(value) }
      const onData = (chunk: Buffer): void => { got = Buffer.concat([got, chunk]); if (isAnswer(got)) done(true) }
      const onClose = (): void => done(false)
      const timer = setTimeout(() => done(false), 1000)
      s.on('data', onData)
      s.once('close', onClose)
      s.write(request)
    })
    if (ok) { answered++; latencies.push(now() - sentAt) } else { s.destroy(); socket = null }
    await sleep(100)
  }
  socket?.destroy()
  return { sent, answered, latencies }
}

/** What the good clients got: requests sent, answered within 1 s, and the answered ones' latencies in ms. */
interface Served { sent: number, answered: number, latencies: number[] }

/** The good clients' figures summed. */
function sumServed (all: readonly Served[]): Served {
  return { sent: all.reduce((a, g) => a + g.sent, 0), answered: all.reduce((a, g) => a + g.answered, 0), latencies: all.flatMap(g => g.latencies) }
}

/** The answered requests' latency: median, 90th percentile and slowest. */
function latencyFigure (latencies: readonly number[]): string {
  if (latencies.length === 0) return 'none answered'
  const sorted = [...latencies].sort((a, b) => a - b)
  const at = (q: number): string => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!.toFixed(0)
  return `median ${at(0.5)} ms, p90 ${at(0.9)} ms, slowest ${sorted[sorted.length - 1]!.toFixed(0)} ms`
}

/** The checks every scenario shares: peak RSS within `boundBytes` above the level before, good clients served, RSS 30 s after. */
async function judge (run: ExampleRun, proc: ExampleProc, before: number, peak: number, boundBytes: number, boundText: string, good: Served): Promise<void> {
  run.figure('server RSS before', `${mib(before)} MiB`)
  run.figure('server peak RSS', `${mib(peak)} MiB (rise ${mib(peak - before)} MiB)`)
  run.check('server peak RSS', `≤ before + ${boundText}`, `rise ${mib(peak - before)} MiB`, peak - before <= boundBytes)
  const share = good.sent === 0 ? 0 : good.answered / good.sent
  run.figure('good answers within 1 s, latency', latencyFigure(good.latencies))
  run.check('good requests answered within 1 s', '≥ 90 %', `${good.answered} of ${good.sent} (${(100 * share).toFixed(1)} %)`, share >= 0.9)
  await sleep(AFTER_MS)
  const after = proc.exited() ? 0 : memoryOf(proc.pid).rss
  run.check(`server RSS ${AFTER_MS / 1000} s after the attack`, '≤ 2 × before', `${mib(after)} MiB (${(after / before).toFixed(2)} ×)`, !proc.exited() && after <= 2 * before)
}

// memcached's binary protocol: a 24-byte request header (magic 0x80, opcode, key length, extras, body length, opaque).
function memcachedRequest (opcode: number, key = ''): Buffer {
  const k = Buffer.from(key)
  const header = Buffer.alloc(24)
  header[0] = 0x80
  header[1] = opcode
  header.writeUInt16BE(k.length, 2)
  header.writeUInt32BE(k.length, 8)
  return Buffer.concat([header, k])
}
const MC_GET = 0x00
const MC_STAT = 0x10
/** A whole memcached response is there: 24 bytes of header and its body. */
const memcachedAnswered = (bytes: Buffer): boolean => bytes.length >= 24 && bytes.length >= 24 + bytes.readUInt32BE(8)

const resp = (...words: string[]): Buffer => Buffer.from(`*${words.length}\r\n${words.map(w => `$${Buffer.byteLength(w)}\r\n${w}\r\n`).join('')}`)
const respAnswered = (bytes: Buffer): boolean => bytes.includes('\r\n')

/** Attackers pipelining one request without reading, and good clients, for `seconds`; then the shared checks. */
async function nonReaders (run: ExampleRun, example: string, attackers: number, attack: Buffer, good: Buffer, isAnswer: (bytes: Buffer) => boolean, seconds = 20): Promise<void> {
  const proc = await startExample(run, example)
  await sleep(500)
  const before = memoryOf(proc.pid).rss
  const sampler = sampleRss(proc.pid)
  const until = now() + seconds * 1000
  const sockets = (await Promise.all(Array.from({ length: attackers }, () => open(run, proc.port)))).filter((s): s is Socket => s !== null)
  const goods = Promise.all([0, 1, 2].map(() => goodClient(run, proc.port, good, isAnswer, until)))
  const written = await Promise.all(sockets.map(s => pipelineWithoutReading(s, attack, until)))
  const served = sumServed(await goods)
  const closed = sockets.filter(s => s.destroyed || s.readableEnded).length
  for (const s of sockets) s.destroy()
  const peak = sampler.stop()
  run.figure('attackers', `${sockets.length} connected; ${mib(written.reduce((a, b) => a + b, 0))} MiB of requests written in ${seconds} s; ${closed} closed by the server`)
  await judge(run, proc, before, peak, OUTBOUND_BUDGET_BYTES + SLACK_BYTES, `512 MiB budget + ${mib(SLACK_BYTES)} MiB`, served)
}

async function statNonreaders (run: ExampleRun): Promise<void> {
  await nonReaders(run, 'memcached', 10, memcachedRequest(MC_STAT), memcachedRequest(MC_GET, 'k'), memcachedAnswered)
}

async function subscribeNonreaders (run: ExampleRun): Promise<void> {
  const channels = Array.from({ length: 100 }, (_, i) => `c${i}`)
  await nonReaders(run, 'redis', 20, resp('SUBSCRIBE', ...channels), resp('PING'), respAnswered)
}

/** 50 non-reading subscribers of one channel, a publisher pipelining tiny messages to it, good clients beside. */
async function tinyPushes (run: ExampleRun): Promise<void> {
  const proc = await startExample(run, 'redis')
  await sleep(500)
  const before = memoryOf(proc.pid).rss
  const subscribers = (await Promise.all(Array.from({ length: 50 }, () => open(run, proc.port)))).filter((s): s is Socket => s !== null)
  for (const s of subscribers) s.write(resp('SUBSCRIBE', 'tiny'))
  await sleep(500)
  for (const s of subscribers) s.pause()
  const sampler = sampleRss(proc.pid)
  const until = now() + 20_000
  const publisher = await open(run, proc.port)
  if (publisher === null) throw new Error('the publisher could not connect')
  publisher.resume()
  const goods = Promise.all([0, 1, 2].map(() => goodClient(run, proc.port, resp('PING'), respAnswered, until)))
  const written = await pipelineWithoutReadingFrom(publisher, resp('PUBLISH', 'tiny', 'x'.repeat(16)), until)
  const served = sumServed(await goods)
  const closed = subscribers.filter(s => s.destroyed || s.readableEnded).length
  for (const s of subscribers) s.destroy()
  publisher.destroy()
  const peak = sampler.stop()
  run.figure('non-reading subscribers', `${subscribers.length}; ${closed} closed by the server; publisher wrote ${mib(written)} MiB of PUBLISH`)
  await judge(run, proc, before, peak, OUTBOUND_BUDGET_BYTES + SLACK_BYTES, `512 MiB budget + ${mib(SLACK_BYTES)} MiB`, served)
}

/** Like pipelineWithoutReading, but the publisher reads (and drops) its answers, as a real publisher does. */
async function pipelineWithoutReadingFrom (socket: Socket, request: Buffer, untilMs: number): Promise<number> {
  socket.on('data', () => {})
  const batch = Buffer.concat(Array.from({ length: Math.floor(16384 / request.length) }, () => request))
  let written = 0
  while (now() < untilMs && !socket.destroyed) {
    if (await write(socket, batch, Math.max(1, untilMs - now()))) written += batch.length
  }
  return written
}

/**
 * Under `ulimit -n 1024`: 50 reading subscribers of a quiet channel and a
 * publisher (which sends one PING), then 1,500 silent connections; after 5 s the publisher sends
 * 8 messages. Counts the subscribers the server closed and the messages
 * they received.
 */
async function idleSubscribersAtCap (run: ExampleRun): Promise<void> {
  const proc = await startExample(run, 'redis', [], 1024)
  const subscribers = (await Promise.all(Array.from({ length: 50 }, () => open(run, proc.port)))).filter((s): s is Socket => s !== null)
  const received = new Map<Socket, number>()
  for (const s of subscribers) {
    received.set(s, 0)
    s.on('data', (chunk: Buffer) => { received.set(s, received.get(s)! + countOf(chunk, 'message\r\n')) })
    s.write(resp('SUBSCRIBE', 'quiet'))
  }
  const publisher = await open(run, proc.port)
  if (publisher === null) throw new Error('the publisher could not connect')
  // The publisher has spoken (a PING) before the flood: a connection that never did is what a
  // server at its cap closes first, and a real publisher has used its connection.
  let pong = false
  publisher.on('data', (chunk: Buffer) => { if (chunk.includes('PONG')) pong = true })
  publisher.write(resp('PING'))
  await sleep(1500)
  if (!pong) throw new Error('the publisher got no PONG')
  let silent = 0
  for (let wave = 0; wave < 15; wave++) {
    const opened = await Promise.all(Array.from({ length: 100 }, () => open(run, proc.port, 2000)))
    silent += opened.filter(s => s !== null).length
  }
  await sleep(5000)
  for (let i = 0; i < 8; i++) publisher.write(resp('PUBLISH', 'quiet', `m${i}`))
  await sleep(1000)
  const evicted = subscribers.filter(s => s.destroyed || s.readableEnded).length
  const delivered = [...received.values()].reduce((a, b) => a + b, 0)
  run.figure('silent connections opened', `${silent} of 1500`)
  run.check('idle subscribers closed by the server', '0 of 50', `${evicted} of ${subscribers.length}`, evicted === 0 && subscribers.length === 50)
  run.check('messages delivered', `${8 * 50} (8 to each of 50)`, `${delivered}`, delivered === 8 * 50)
}

/** Occurrences of `needle` in `chunk` (a message's type word; chunks may split one, which this probe accepts). */
function countOf (chunk: Buffer, needle: string): number {
  let n = 0
  for (let at = chunk.indexOf(needle); at >= 0; at = chunk.indexOf(needle, at + needle.length)) n++
  return n
}

/** The example scenarios, in bench/hostile.ts's order. */
export const EXAMPLE_SCENARIOS: readonly ExampleScenario[] = [
  { name: 'stat-nonreaders', summary: 'memcached example: 10 non-reading clients pipelining STAT, 3 good clients', timeoutMs: 120_000, run: statNonreaders },
  { name: 'subscribe-nonreaders', summary: 'redis example: 20 non-reading clients pipelining SUBSCRIBE c0 … c99, 3 good clients', timeoutMs: 120_000, run: subscribeNonreaders },
  { name: 'idle-subscribers-at-cap', summary: 'redis example under ulimit -n 1024: 50 quiet subscribers, then 1,500 silent connections', timeoutMs: 120_000, run: idleSubscribersAtCap },
  { name: 'tiny-pushes', summary: 'redis example: tiny PUBLISH to 50 non-reading subscribers, 3 good clients', timeoutMs: 120_000, run: tinyPushes }
]
