/**
 * Hostile peers against `nyala serve`: the holes of the hostile-peer review,
 * each driven from raw sockets on 127.0.0.1 against a fresh server child,
 * with its figures and PASS/FAIL against the issue's "done when".
 *
 *   node dist/bench/hostile.js [--json] [--only NAME[,NAME]]
 *
 * Each scenario starts `./bin/nyala serve --reactors 1 --port 0 --host
 * 127.0.0.1` (default limits unless the scenario names a flag; with
 * `--metrics-port 0` where the server's limit counters are reported), reads
 * `listening on HOST:PORT` from its stdout, and measures the server's memory
 * from /proc/PID/status (VmRSS now, VmHWM peak; also sampled every 50 ms)
 * and, where it says so, the bytes it read from /proc/PID/io (rchar). The
 * KRPC bytes are built from the codec: the handshake by running the client
 * and server negotiation state machines against each other, the calls with
 * the frame encoders. Every loop is bounded in count and time, every
 * scenario has an overall timeout, and the server child is killed by its
 * PID and every socket closed after each scenario, failed or not. Exits 1
 * when any scenario fails.
 *
 * Scenarios: stalled-partial, big-partials, connection-flood, slow-readers,
 * shutdown-nonreader, stuck-sleeps, long-username, tiny-answers, large-reply
 * (this one against a real redis-server on a free loopback port, not nyala);
 * and against the examples (bench/hostile-examples.ts): stat-nonreaders,
 * subscribe-nonreaders, idle-subscribers-at-cap, tiny-pushes.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync, readdirSync } from 'node:fs'
import { get } from 'node:http'
import { once } from 'node:events'
import { connect, createServer, type Socket } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { KrpcCode, krpcCodeName } from '../codec/krpc/codes.js'
import { FrameDecoder, DEFAULT_MAX_MESSAGE_BYTES } from '../codec/frame-decoder.js'
import { encodeRemoteMethod, encodeRequestFrame } from '../codec/krpc/encode-frame.js'
import { ErrorStatusType, NEGOTIATE_CALL_ID, headerSchema, krpcFraming } from '../codec/krpc/frames.js'
import { parseResponseFrame, type ResponseFrame } from '../codec/krpc/parsed-frame.js'
import { requestFrameBytes, requestHeaderTail, writeRequestFrameHead } from '../codec/krpc/write-frame.js'
import { ClientNegotiation, clientHandshakeBytes } from '../codec/krpc/client-negotiation.js'
import { Client } from '../reactor/krpc/client.js'
import { CalculatorService } from '../examples/calculator/index.js'
import { EXAMPLE_SCENARIOS } from './hostile-examples.js'
import { RedisArrayReply, RedisClient, RedisCommand, redisClientProtocol } from '../examples/redis/client.js'
import { ProtocolClient } from '../reactor/index.js'

const ROOT = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? '../' : '../../', import.meta.url))
const NYALA = join(ROOT, 'bin', 'nyala')
const MiB = 1024 * 1024
const BASE_FLAGS = ['--reactors', '1', '--port', '0', '--host', '127.0.0.1']

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
/** As `sleep`, for the losing side of a race: its timer does not keep the process alive. */
const within = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms).unref())
const now = (): number => performance.now()
const mib = (bytes: number): string => (bytes / MiB).toFixed(1)
const ms = (value: number): string => `${Math.round(value)} ms`

// ---------------------------------------------------------------------------
// KRPC bytes, from the codec.

function joinSlices (frames: ReadonlyArray<Buffer | readonly Buffer[]>): Buffer {
  const parts: Buffer[] = []
  for (const f of frames) {
    if (Buffer.isBuffer(f)) parts.push(f)
    else parts.push(...f)
  }
  return Buffer.concat(parts)
}

const HANDSHAKE = clientHandshakeBytes({ user: 'hostile' })
const SERVICE = CalculatorService.fullName
const ADD_METHOD = encodeRemoteMethod(SERVICE, 'Add')
const SLEEP_METHOD = encodeRemoteMethod(SERVICE, 'Sleep')
const ECHO_METHOD = encodeRemoteMethod(SERVICE, 'Echo')
const NegotiateType = headerSchema.type<{ step: number, token?: Uint8Array, sasl_mechanisms?: Array<{ mechanism: string }> }>('kudu.rpc.NegotiatePB')

function addFrame (callId: number, x = 1, y = 2, timeoutMs?: number): Buffer {
  return joinSlices(encodeRequestFrame({ callId, remoteMethod: ADD_METHOD, timeoutMs }, CalculatorService.methods.Add.requestType.encode({ x, y })))
}

function sleepFrame (callId: number, sleepMicros: number, timeoutMs: number): Buffer {
  return joinSlices(encodeRequestFrame({ callId, remoteMethod: SLEEP_METHOD, timeoutMs },
    CalculatorService.methods.Sleep.requestType.encode({ sleep_micros: sleepMicros })))
}

/** Echo calls of about 1 MiB: one shared body PB, and a small head (prefix and header) per call. */
class EchoFrames {
  readonly body: Buffer
  readonly #tail = requestHeaderTail(ECHO_METHOD, 0)

  constructor (dataBytes: number) {
    this.body = Buffer.from(CalculatorService.methods.Echo.requestType.encode({ data: 'x'.repeat(dataBytes) }))
  }

  head (callId: number): Buffer {
    const frameBytes = requestFrameBytes(callId, this.#tail, this.body.length)
    const head = Buffer.allocUnsafe(frameBytes - this.body.length)
    const at = writeRequestFrameHead(head, 0, callId, this.#tail, this.body.length)
    if (at !== head.length) throw new Error('echo head size mismatch')
    return head
  }

  get frameBytes (): number {
    return this.body.length + this.head(1).length
  }
}

/** The KRPC error code of an error frame, or undefined. */
function errorCodeOf (frame: ResponseFrame): number | undefined {
  if (frame.header.is_error !== true) return undefined
  const status = ErrorStatusType.decode(frame.message)
  return status instanceof RpcError ? -1 : status.code ?? KrpcCode.FATAL_UNKNOWN
}

// ---------------------------------------------------------------------------
// The server child and what /proc says of it.

interface ServerProc {
  readonly pid: number
  readonly port: number
  readonly endpoint: string
  readonly metricsPort: number | null
  readonly command: string
  readonly exit: Promise<{ code: number | null, signal: NodeJS.Signals | null, at: number }>
  readonly exited: () => boolean
  /** The last lines the server wrote to stderr (at most 200). */
  readonly log: string[]
}

async function startServer (flags: readonly string[], options: { ulimit?: number, metrics?: boolean } = {}): Promise<ServerProc> {
  const args = ['serve', ...BASE_FLAGS, ...(options.metrics === true ? ['--metrics-port', '0'] : []), ...flags]
  const shown = `./bin/nyala ${args.join(' ')}`
  const command = options.ulimit === undefined ? shown : `bash -c 'ulimit -n ${options.ulimit} && exec ${shown}'`
  const child: ChildProcess = options.ulimit === undefined
    ? spawn(NYALA, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn('bash', ['-c', `ulimit -n ${options.ulimit} && exec "$0" "$@"`, NYALA, ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  const pid = child.pid
  if (pid === undefined) throw new Error(`could not start ${command}`)
  let exited = false
  const exit = new Promise<{ code: number | null, signal: NodeJS.Signals | null, at: number }>((resolve) => {
    child.once('exit', (code, signal) => {
      exited = true
      resolve({ code, signal, at: now() })
    })
  })
  const log: string[] = []
  let errText = ''
  child.stderr!.setEncoding('utf8')
  child.stderr!.on('data', (chunk: string) => {
    errText += chunk
    const lines = errText.split('\n')
    errText = lines.pop() ?? ''
    for (const line of lines) {
      log.push(line)
      if (log.length > 200) log.shift()
    }
  })
  let outText = ''
  const ready = new Promise<{ port: number, metricsPort: number | null }>((resolve, reject) => {
    let port = -1
    const timer = setTimeout(() => reject(new Error(`${command}: no "listening on" line within 20 s`)), 20_000)
    child.stdout!.setEncoding('utf8')
    child.stdout!.on('data', (chunk: string) => {
      outText = (outText + chunk).slice(-4096)
      const listening = /listening on \S+:(\d+)/.exec(outText)
      if (listening !== null) port = Number(listening[1])
      const metrics = /metrics on http:\/\/\S+:(\d+)\/metrics/.exec(outText)
      if (port >= 0 && (options.metrics !== true || metrics !== null)) {
        clearTimeout(timer)
        resolve({ port, metricsPort: metrics === null ? null : Number(metrics[1]) })
      }
    })
    void exit.then(({ code, signal }) => {
      clearTimeout(timer)
      reject(new Error(`${command} exited (${code ?? signal}) before listening: ${log.slice(-5).join(' | ')}`))
    })
  })
  const proc: ServerProc = {
    pid, port: -1, endpoint: '', metricsPort: null, command, exit, exited: () => exited, log
  }
  try {
    const { port, metricsPort } = await ready
    return { ...proc, port, endpoint: `127.0.0.1:${port}`, metricsPort }
  } catch (err) {
    await killServer(proc)
    throw err
  }
}

/** Kills the server child by its PID (SIGKILL) unless it has exited; waits for its exit (at most 5 s). */
async function killServer (server: ServerProc): Promise<void> {
  if (server.exited()) return
  try {
    process.kill(server.pid, 'SIGKILL')
  } catch {}
  await Promise.race([server.exit, within(5000)])
}

interface Memory { rss: number, hwm: number }

/** VmRSS and VmHWM of `pid`, in bytes; null once it is gone. */
function memoryOf (pid: number): Memory | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8')
    const rss = /^VmRSS:\s+(\d+) kB/m.exec(status)
    const hwm = /^VmHWM:\s+(\d+) kB/m.exec(status)
    if (rss === null || hwm === null) return null
    return { rss: Number(rss[1]) * 1024, hwm: Number(hwm[1]) * 1024 }
  } catch {
    return null
  }
}

/** Bytes `pid` has read through read syscalls (rchar of /proc/PID/io); null when not readable. */
function bytesReadBy (pid: number): number | null {
  try {
    const match = /^rchar:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))
    return match === null ? null : Number(match[1])
  } catch {
    return null
  }
}

function openFilesLimit (pid: number): string {
  try {
    const match = /^Max open files\s+(\S+)\s+(\S+)/m.exec(readFileSync(`/proc/${pid}/limits`, 'utf8'))
    return match === null ? '?' : `${match[1]} (hard ${match[2]})`
  } catch {
    return '?'
  }
}

function openFiles (pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length
  } catch {
    return -1
  }
}

/** The highest VmRSS seen, sampled every 50 ms until stopped. */
class RssSampler {
  peak = 0
  readonly #timer: NodeJS.Timeout
  readonly #pid: number

  constructor (pid: number) {
    this.#pid = pid
    this.sample()
    this.#timer = setInterval(() => this.sample(), 50)
  }

  sample (): void {
    const m = memoryOf(this.#pid)
    if (m !== null && m.rss > this.peak) this.peak = m.rss
  }

  /** The peak: the sampled maximum, or VmHWM when it saw more (a peak between samples). */
  stop (): number {
    clearInterval(this.#timer)
    this.sample()
    return this.peak
  }
}

/** A Prometheus text scrape of the server's metrics port: each series by its full name and labels; null when it failed. */
function scrapeMetrics (server: ServerProc, timeoutMs = 3000): Promise<Map<string, number> | null> {
  const port = server.metricsPort
  if (port === null) return Promise.resolve(null)
  return new Promise((resolve) => {
    const timer = setTimeout(() => { request.destroy(); resolve(null) }, timeoutMs)
    const request = get({ host: '127.0.0.1', port, path: '/metrics', agent: false }, (response) => {
      let text = ''
      response.setEncoding('utf8')
      response.on('data', (chunk: string) => { if (text.length < 4 * MiB) text += chunk })
      response.on('error', () => { clearTimeout(timer); resolve(null) })
      response.on('end', () => {
        clearTimeout(timer)
        const values = new Map<string, number>()
        for (const line of text.split('\n')) {
          const match = /^([A-Za-z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)/.exec(line)
          if (match === null) continue
          const value = Number(match[2])
          if (Number.isFinite(value)) values.set(match[1]!, value)
        }
        resolve(values)
      })
    })
    request.on('error', () => { clearTimeout(timer); resolve(null) })
  })
}

/** The sum of the series of metric `name` whose labels contain every string of `labels`, as text ('?' when not scraped). */
function counter (metrics: Map<string, number> | null, name: string, ...labels: string[]): string {
  if (metrics === null) return '?'
  let sum = 0
  let found = false
  for (const [series, value] of metrics) {
    if (series !== name && !series.startsWith(`${name}{`)) continue
    if (!labels.every(l => series.includes(l))) continue
    sum += value
    found = true
  }
  return found ? String(sum) : '?'
}

/** Send and receive queues of a TCP socket, in bytes. */
interface TcpQueues { tx: number, rx: number }

/** The queues of every loopback TCP socket now (/proc/net/tcp), by `localPort>remotePort`; empty when unreadable. */
function tcpTable (): Map<string, TcpQueues> {
  const table = new Map<string, TcpQueues>()
  try {
    for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n')) {
      const fields = line.trim().split(/\s+/)
      const local = fields[1]?.split(':')[1]
      const remote = fields[2]?.split(':')[1]
      const queues = fields[4]?.split(':')
      if (local === undefined || remote === undefined || queues?.length !== 2) continue
      table.set(`${parseInt(local, 16)}>${parseInt(remote, 16)}`, { tx: parseInt(queues[0]!, 16), rx: parseInt(queues[1]!, 16) })
    }
  } catch {}
  return table
}

/** The queues of the socket from `localPort` to `remotePort`, or null. */
function tcpQueues (localPort: number, remotePort: number, table = tcpTable()): TcpQueues | null {
  return table.get(`${localPort}>${remotePort}`) ?? null
}

// ---------------------------------------------------------------------------
// A raw peer: a socket that writes what a scenario builds and parses what
// the server answers (unless paused: a peer that does not read).

class RawPeer {
  readonly socket: Socket
  readonly frames: ResponseFrame[] = []
  openedAt = now()
  connectedAt = -1
  /** When the connection ended, and how ('end', an error code, or 'local' when this side closed it). */
  closedAt = -1
  closeCause = ''
  bytesIn = 0
  bytesOut = 0
  readonly closed: Promise<void>
  readonly #decoder = new FrameDecoder(krpcFraming)
  #waiters: Array<() => void> = []
  #local = false

  constructor (port: number, registry: Set<RawPeer>) {
    registry.add(this)
    this.socket = connect({ host: '127.0.0.1', port })
    this.socket.once('connect', () => {
      this.connectedAt = now()
      this.#wake()
    })
    this.socket.on('data', (chunk: Buffer) => {
      this.bytesIn += chunk.length
      this.#decoder.push(chunk, (frame) => {
        const parsed = parseResponseFrame(Buffer.from(frame))
        if (!(parsed instanceof RpcError)) this.frames.push(parsed)
      })
      this.#wake()
    })
    this.socket.on('end', () => {
      this.#mark('end')
      this.socket.destroy()
    })
    this.socket.on('error', (err: NodeJS.ErrnoException) => this.#mark(err.code ?? err.message))
    this.closed = new Promise((resolve) => this.socket.once('close', () => {
      this.#mark('close')
      registry.delete(this)
      resolve()
    }))
  }

  /** Closed, and not by this side. */
  get closedByServer (): boolean {
    return this.closedAt >= 0 && this.closeCause !== 'local'
  }

  get localPort (): number {
    return this.socket.localPort ?? 0
  }

  #mark (cause: string): void {
    if (this.closedAt < 0) {
      this.closedAt = now()
      this.closeCause = this.#local ? 'local' : cause
    }
    this.#wake()
  }

  #wake (): void {
    const waiters = this.#waiters
    this.#waiters = []
    for (const w of waiters) w()
  }

  /** Waits (at most `timeoutMs`) until `done()` holds or the connection ends; answers `done()`. */
  async waitFor (done: () => boolean, timeoutMs: number): Promise<boolean> {
    const end = now() + timeoutMs
    for (let i = 0; i < 1_000_000; i++) {
      if (done()) return true
      const left = end - now()
      if (left <= 0 || this.closedAt >= 0) return done()
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left)
        this.#waiters.push(() => { clearTimeout(timer); resolve() })
      })
    }
    return done()
  }

  connected (timeoutMs: number): Promise<boolean> {
    return this.waitFor(() => this.connectedAt >= 0, timeoutMs)
  }

  /** Writes `chunks` (corked: one writev); resolves true once the kernel took them, false if the connection ended first. */
  write (...chunks: Uint8Array[]): Promise<boolean> {
    if (this.closedAt >= 0 || this.socket.destroyed) return Promise.resolve(false)
    let bytes = 0
    for (const c of chunks) bytes += c.length
    return new Promise((resolve) => {
      let settled = false
      const settle = (ok: boolean): void => {
        if (settled) return
        settled = true
        if (ok) this.bytesOut += bytes
        resolve(ok)
      }
      void this.closed.then(() => settle(false))
      this.socket.cork()
      for (let i = 0; i < chunks.length; i++) {
        if (i < chunks.length - 1) this.socket.write(chunks[i]!)
        else this.socket.write(chunks[i]!, (err) => settle(err == null))
      }
      this.socket.uncork()
    })
  }

  /** The NEGOTIATE-call-id frames received: the NEGOTIATE answer, then SASL_SUCCESS (or an error). */
  get negotiationFrames (): ResponseFrame[] {
    return this.frames.filter(f => f.header.call_id === NEGOTIATE_CALL_ID)
  }

  /** Writes the whole handshake and waits for SASL_SUCCESS; false if refused, closed or late. */
  async negotiate (timeoutMs: number): Promise<boolean> {
    if (!await this.connected(timeoutMs)) return false
    void this.write(HANDSHAKE)
    const frames = (): ResponseFrame[] => this.negotiationFrames
    await this.waitFor(() => frames().length >= 2 || frames().some(f => f.header.is_error === true), timeoutMs)
    const got = frames()
    return this.closedAt < 0 && got.length >= 2 && !got.some(f => f.header.is_error === true)
  }

  /** Stops reading: what the server sends piles up in its buffers and the kernel's. */
  stopReading (): void {
    this.socket.pause()
  }

  destroy (): void {
    if (this.closedAt < 0) this.#local = true
    this.socket.destroy()
  }
}

// ---------------------------------------------------------------------------
// Scenarios and their reports.

interface Check { name: string, target: string, measured: string, pass: boolean }

interface ScenarioResult {
  name: string
  command: string
  pass: boolean
  seconds: number
  figures: Array<{ name: string, value: string }>
  checks: Check[]
  error?: string
}

/** What a scenario uses and reports; everything it opens is closed by `cleanup`, failed or not. */
class Run {
  readonly figures: Array<{ name: string, value: string }> = []
  readonly checks: Check[] = []
  readonly peers = new Set<RawPeer>()
  readonly clients = new Set<Client>()
  readonly servers: ServerProc[] = []
  readonly #owned: Array<() => Promise<void> | void> = []
  command = ''
  readonly #print: (line: string) => void

  constructor (print: (line: string) => void) {
    this.#print = print
  }

  async server (flags: readonly string[] = [], options: { ulimit?: number, metrics?: boolean } = {}): Promise<ServerProc> {
    const server = await startServer(flags, options)
    this.servers.push(server)
    this.command = server.command
    this.#print(`  server: ${server.command} (pid ${server.pid}, ${server.endpoint})`)
    return server
  }

  peer (port: number): RawPeer {
    return new RawPeer(port, this.peers)
  }

  client (endpoint: string, options: { user?: string } = {}): Client {
    const client = new Client({ endpoint, ...options })
    this.clients.add(client)
    return client
  }

  figure (name: string, value: string | number): void {
    const text = String(value)
    this.figures.push({ name, value: text })
    this.#print(`  ${name}: ${text}`)
  }

  check (name: string, target: string, measured: string, pass: boolean): void {
    this.checks.push({ name, target, measured, pass })
    this.#print(`  ${pass ? 'PASS' : 'FAIL'} ${name}: ${measured} (target: ${target})`)
  }

  /** Runs `cleanup` when the scenario ends (the example scenarios' children and sockets). */
  own (cleanup: () => Promise<void> | void): void {
    this.#owned.push(cleanup)
  }

  async cleanup (): Promise<void> {
    for (const cleanup of this.#owned.splice(0)) await cleanup()
    for (const peer of [...this.peers]) peer.destroy()
    for (const client of this.clients) client.close()
    this.clients.clear()
    for (const server of this.servers) await killServer(server)
    // Let the sockets' close events run.
    const pending = [...this.peers].map(p => p.closed)
    await Promise.race([Promise.all(pending), within(2000)])
  }
}

interface Scenario {
  name: string
  summary: string
  timeoutMs: number
  run: (run: Run) => Promise<void>
}

/** Opens `count` peers, `wave` at a time, each negotiated (or failed) before the next wave. */
async function openNegotiated (run: Run, port: number, count: number, wave: number, timeoutMs: number): Promise<{ ok: RawPeer[], failed: RawPeer[] }> {
  const ok: RawPeer[] = []
  const failed: RawPeer[] = []
  for (let start = 0; start < count; start += wave) {
    const batch: RawPeer[] = []
    for (let i = start; i < Math.min(count, start + wave); i++) batch.push(run.peer(port))
    const results = await Promise.all(batch.map(p => p.negotiate(timeoutMs)))
    results.forEach((good, i) => (good ? ok : failed).push(batch[i]!))
  }
  return { ok, failed }
}

/** One call of a good client: its outcome and latency. */
async function goodAdd (run: Run, endpoint: string, timeoutMs: number, options: { user?: string } = {}): Promise<{ ok: boolean, ms: number, outcome: string, error: RpcError | null }> {
  const client = run.client(endpoint, options)
  const start = now()
  try {
    const response = await client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs })
    const ok = response.result === 3
    return { ok, ms: now() - start, outcome: ok ? 'answered {result: 3}' : `wrong answer ${JSON.stringify(response)}`, error: null }
  } catch (err) {
    const error = err instanceof RpcError ? err : new RpcError(ErrorCode.INVALID_RESPONSE, String(err))
    const krpc = error.remote?.code === undefined ? '' : ` krpcCode ${error.remote?.code} (${krpcCodeName(error.remote?.code)})`
    return { ok: false, ms: now() - start, outcome: `${error.code}${krpc}: ${error.message}`, error }
  } finally {
    client.close()
    run.clients.delete(client)
  }
}

function memoryFigure (run: Run, name: string, m: Memory | null): Memory {
  const value = m ?? { rss: Number.NaN, hwm: Number.NaN }
  run.figure(name, `VmRSS ${mib(value.rss)} MiB, VmHWM ${mib(value.hwm)} MiB`)
  return value
}

// 1. Connections stopped inside a frame are closed at the idle timeout.
async function stalledPartial (run: Run): Promise<void> {
  const idleMs = 4000
  const periodMs = Math.min(idleMs / 4, 1000)
  const limitMs = idleMs + periodMs + 1000
  run.figure('note', `--idle-timeout-ms ${idleMs} (default 65000); the idle scan runs every idle/4 capped at 1 s: ${periodMs} ms`)
  const server = await run.server(['--idle-timeout-ms', String(idleMs)], { metrics: true })
  const before = memoryFigure(run, 'server memory before', memoryOf(server.pid))
  const sampler = new RssSampler(server.pid)
  const { ok, failed } = await openNegotiated(run, server.port, 200, 50, 5000)
  run.figure('connections negotiated', `${ok.length} of 200 (${failed.length} failed)`)
  const add = addFrame(1)
  const bigLength = DEFAULT_MAX_MESSAGE_BYTES - 4
  const bigPrefix = Buffer.alloc(4)
  bigPrefix.writeUInt32BE(bigLength, 0)
  const mebibyte = Buffer.alloc(MiB, 0x41)
  const kinds: Array<{ name: string, send: (p: RawPeer) => Promise<boolean> }> = [
    { name: '10 bytes of an Add', send: (p) => p.write(add.subarray(0, 10)) },
    { name: 'an Add but its last byte', send: (p) => p.write(add.subarray(0, add.length - 1)) },
    { name: '2 bytes of a prefix', send: (p) => p.write(bigPrefix.subarray(0, 2)) },
    { name: `a ${mib(bigLength + 4)} MiB prefix + 1 MiB`, send: async (p) => await p.write(bigPrefix) && await p.write(mebibyte) }
  ]
  const sentAt = new Map<RawPeer, number>()
  const kindOf = new Map<RawPeer, number>()
  await Promise.all(ok.map(async (peer, i) => {
    const kind = i % kinds.length
    kindOf.set(peer, kind)
    if (await kinds[kind]!.send(peer)) sentAt.set(peer, now())
  }))
  run.figure('partial frames sent', `${sentAt.size} (${kinds.map(k => k.name).join('; ')}, ${ok.length / kinds.length} each)`)
  const lastSent = Math.max(...sentAt.values())
  // Wait for every close, to the target plus 3 s (so a late close is measured, not cut off).
  const waitUntil = lastSent + limitMs + 3000
  await Promise.all(ok.map(p => p.waitFor(() => p.closedAt >= 0, Math.max(0, waitUntil - now()))))
  const peak = sampler.stop()
  const closeMs: number[] = []
  const perKind = kinds.map(() => ({ max: 0, min: Number.POSITIVE_INFINITY, closed: 0 }))
  for (const [peer, at] of sentAt) {
    if (!peer.closedByServer) continue
    const t = peer.closedAt - at
    closeMs.push(t)
    const k = perKind[kindOf.get(peer)!]!
    k.closed++
    k.max = Math.max(k.max, t)
    k.min = Math.min(k.min, t)
  }
  kinds.forEach((kind, i) => {
    const k = perKind[i]!
    run.figure(`time to close, ${kind.name}`, `${k.closed} closed, ${ms(k.min)} – ${ms(k.max)} after its last byte`)
  })
  const maxClose = closeMs.length === 0 ? Number.NaN : Math.max(...closeMs)
  const minClose = closeMs.length === 0 ? Number.NaN : Math.min(...closeMs)
  run.figure('time to close, all', `min ${ms(minClose)}, max ${ms(maxClose)}`)
  const metrics = await scrapeMetrics(server)
  run.figure('server counters', `idle closed ${counter(metrics, 'nyala_connections_idle_closed_total')}, frame timeouts ${counter(metrics, 'nyala_connections_frame_timeout_total')}`)
  const hwm = memoryOf(server.pid)
  run.figure('server memory peak', `${mib(Math.max(peak, hwm?.hwm ?? 0))} MiB (sampled VmRSS ${mib(peak)} MiB, VmHWM ${mib(hwm?.hwm ?? Number.NaN)} MiB); rise ${mib(peak - before.rss)} MiB`)
  await sleep(2000)
  memoryFigure(run, 'server memory after (2 s later)', memoryOf(server.pid))
  const allClosed = closeMs.length === 200
  run.check('every stalled connection closed by the server', `200 of 200, each within ${limitMs} ms of its last byte (idle ${idleMs} + scan ${periodMs} + 1000 slack)`,
    `${closeMs.length} of 200 closed by the server, max ${ms(maxClose)}`, allClosed && maxClose <= limitMs)
}

// 2. Many large incomplete frames: the inbound budget bounds what they hold.
async function bigPartials (run: Run): Promise<void> {
  const budget = 256 * MiB
  const slack = 150 * MiB
  const server = await run.server([], { metrics: true })
  const before = memoryFigure(run, 'server memory before', memoryOf(server.pid))
  const sampler = new RssSampler(server.pid)
  const { ok } = await openNegotiated(run, server.port, 30, 30, 5000)
  run.figure('connections negotiated', `${ok.length} of 30`)
  const frameLength = DEFAULT_MAX_MESSAGE_BYTES - 4
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(frameLength, 0)
  const chunk = Buffer.alloc(MiB, 0x42)
  const target = 40 * MiB
  const start = now()
  await Promise.all(ok.map(async (peer) => {
    if (!await peer.write(prefix)) return
    for (let sent = 0; sent < target && now() - start < 60_000; sent += chunk.length) {
      if (!await peer.write(chunk)) return
    }
  }))
  run.figure('sending', `${ms(now() - start)} for ${ok.length} × up to 40 MiB of a ${mib(frameLength + 4)} MiB frame`)
  await sleep(2000)
  const closed = ok.filter(p => p.closedByServer)
  const stalled = ok.filter(p => !p.closedByServer)
  const peak = sampler.stop()
  const sentMiB = (peers: RawPeer[]): string => peers.length === 0 ? '-' : `${mib(Math.min(...peers.map(p => p.bytesOut)))}–${mib(Math.max(...peers.map(p => p.bytesOut)))} MiB`
  run.figure('closed by the server', `${closed.length} (${closed.map(p => p.closeCause).filter((c, i, a) => a.indexOf(c) === i).join(', ') || '-'}; had sent ${sentMiB(closed)})`)
  run.figure('still open, stalled', `${stalled.length} (had sent ${sentMiB(stalled)})`)
  const metrics = await scrapeMetrics(server)
  run.figure('server counters', `inbound budget closed ${counter(metrics, 'nyala_connections_inbound_budget_closed_total')}`)
  const hwm = memoryOf(server.pid)
  const peakAll = Math.max(peak, hwm?.hwm ?? 0)
  run.figure('server memory peak', `${mib(peakAll)} MiB (sampled VmRSS ${mib(peak)} MiB, VmHWM ${mib(hwm?.hwm ?? Number.NaN)} MiB)`)
  memoryFigure(run, 'server memory with the stalled ones open', hwm)
  for (const p of stalled) p.destroy()
  await sleep(2000)
  memoryFigure(run, 'server memory after closing them (2 s later)', memoryOf(server.pid))
  const rise = peakAll - before.rss
  run.check('RSS rise', `< ${mib(budget + slack)} MiB (inbound budget 256 + 150)`, `${mib(rise)} MiB (peak ${mib(peakAll)} − before ${mib(before.rss)})`, rise < budget + slack)
}

// 3. A connection flood under ulimit -n 1024 does not lock a good client out.
async function connectionFlood (run: Run): Promise<void> {
  const server = await run.server([], { ulimit: 1024, metrics: true })
  run.figure('server descriptor limit', openFilesLimit(server.pid))
  const start = now()
  const { ok, failed } = await openNegotiated(run, server.port, 1100, 100, 5000)
  run.figure('flood', `1100 connections in ${ms(now() - start)}: ${ok.length} negotiated, ${failed.length} not`)
  const failCauses = new Map<string, number>()
  for (const p of failed) {
    const cause = p.closedByServer ? `closed by the server before negotiating (${p.closeCause})` : p.connectedAt < 0 ? 'connect failed or late' : 'negotiation late'
    failCauses.set(cause, (failCauses.get(cause) ?? 0) + 1)
  }
  for (const [cause, count] of failCauses) run.figure('  not negotiated', `${count}: ${cause}`)
  run.figure('server descriptors open after the flood', openFiles(server.pid))
  await sleep(2000)
  const evictedBefore = ok.filter(p => p.closedByServer).length
  run.figure('negotiated flood connections closed by the server so far', evictedBefore)
  const first = await goodAdd(run, server.endpoint, 5000)
  run.figure('good call 1 (new Client, Add, 5 s timeout)', `${first.outcome} in ${ms(first.ms)}`)
  await sleep(3000)
  const second = await goodAdd(run, server.endpoint, 5000)
  run.figure('good call 2, 3 s later (new Client)', `${second.outcome} in ${ms(second.ms)}`)
  await sleep(200)
  const evicted = ok.filter(p => p.closedByServer).length
  run.figure('negotiated flood connections closed by the server in all', `${evicted} (${ok.length - evicted} still open)`)
  const metrics = await scrapeMetrics(server)
  run.figure('server counters', `refused ${counter(metrics, 'nyala_connections_refused_total')}, evicted ${counter(metrics, 'nyala_connections_evicted_total')}, ` +
    `negotiating evicted ${counter(metrics, 'nyala_connections_negotiating_evicted_total')}, accept errors ${counter(metrics, 'nyala_accept_errors_total')}`)
  run.figure('server descriptors open at the end', openFiles(server.pid))
  run.check('good client after the flood', 'Add answered', first.outcome, first.ok)
  run.check('good client 3 s later', 'Add answered', second.outcome, second.ok)
}

/**
 * Where the answers to non-reading Echo clients are, per open client, from
 * /proc/net/tcp: the requests the server read are the bytes the client
 * wrote less both sockets' queues toward the server; the answers unsent in
 * the server process are those requests (one answer of `frameBytes` each)
 * less both sockets' queues toward the client (held by the kernel).
 */
function unsentAnswers (peers: readonly RawPeer[], serverPort: number, frameBytes: number): { kernel: number, waiting: number, unsent: number[] } {
  const table = tcpTable()
  let kernel = 0
  let waiting = 0
  const unsent: number[] = []
  for (const p of peers) {
    if (p.closedAt >= 0) continue
    const client = tcpQueues(p.localPort, serverPort, table)
    const side = tcpQueues(serverPort, p.localPort, table)
    if (client === null || side === null) continue
    kernel += client.rx + side.tx
    waiting += side.rx
    const requests = Math.floor((p.bytesOut - client.tx - side.rx) / frameBytes)
    unsent.push(Math.max(0, requests * frameBytes - client.rx - side.tx))
  }
  return { kernel, waiting, unsent }
}

// 4. Clients that never read: the outbound bounds hold the server's memory.
async function slowReaders (run: Run): Promise<void> {
  const server = await run.server([], { metrics: true })
  const before = memoryFigure(run, 'server memory before', memoryOf(server.pid))
  const sampler = new RssSampler(server.pid)
  const echo = new EchoFrames(MiB - 64)
  const callsEach = 200
  const { ok } = await openNegotiated(run, server.port, 20, 20, 5000)
  for (const p of ok) p.stopReading()
  run.figure('non-reading clients', `${ok.length} negotiated, then paused; each pipelines up to ${callsEach} Echo calls of ${mib(echo.frameBytes)} MiB`)
  let stop = false
  let lastProgress = now()
  const start = now()
  const written = new Map<RawPeer, number>()
  const loops = ok.map(async (peer) => {
    let n = 0
    for (let i = 0; i < callsEach && !stop; i++) {
      if (!await peer.write(echo.head(i + 1), echo.body)) break
      n++
      lastProgress = now()
    }
    written.set(peer, n)
  })
  const good = { ok: 0, failed: 0, maxMs: 0, failures: [] as string[] }
  const goodLoop = (async () => {
    for (let i = 0; i < 100 && !stop; i++) {
      const r = await goodAdd(run, server.endpoint, 2000)
      if (r.ok) good.ok++
      else {
        good.failed++
        if (good.failures.length < 3) good.failures.push(r.outcome)
      }
      good.maxMs = Math.max(good.maxMs, r.ms)
      await sleep(500)
    }
  })()
  // Until every loop ended, or none has made progress for 5 s, or 25 s.
  const all = Promise.all(loops)
  let done = false
  void all.then(() => { done = true })
  let unsentPeak = 0
  for (let i = 0; i < 300 && !done && now() - start < 25_000 && now() - lastProgress < 5000; i++) {
    await sleep(100)
    if (i % 2 === 1) unsentPeak = Math.max(unsentPeak, unsentAnswers(ok, server.port, echo.frameBytes).unsent.reduce((a, b) => a + b, 0))
  }
  const elapsed = now() - start
  const metrics = await scrapeMetrics(server)
  const during = memoryOf(server.pid)
  stop = true
  await Promise.race([goodLoop, within(3000)])
  const closed = ok.filter(p => p.closedByServer)
  run.figure('window', `${ms(elapsed)} (${done ? 'every client wrote all it would' : 'ended: no write progress for 5 s or 25 s passed'})`)
  const counts = ok.map(p => written.get(p) ?? Math.round(p.bytesOut / echo.frameBytes))
  run.figure('Echo calls written by the clients', `${counts.reduce((a, b) => a + b, 0)} in all, ${Math.min(...counts)}–${Math.max(...counts)} per client`)
  run.figure('non-reading clients closed by the server', `${closed.length} of ${ok.length}`)
  run.figure('server counters', `outbound pauses ${counter(metrics, 'nyala_connections_outbound_paused_total')}`)
  const handled = Number(counter(metrics, 'nyala_calls_handled_total', 'method="Echo"'))
  const { kernel, waiting, unsent } = unsentAnswers(ok, server.port, echo.frameBytes)
  const unsentTotal = unsent.reduce((a, b) => a + b, 0)
  run.figure('Echo answers', `${Number.isNaN(handled) ? '?' : handled} made by the server (${mib(handled * echo.frameBytes)} MiB); ` +
    `the kernel holds ${mib(kernel)} MiB of them for the open clients (their receive and the server's send queues)`)
  run.figure('requests waiting in the server\'s receive queues (kernel) for the open clients', `${mib(waiting)} MiB`)
  run.figure('answers unsent in the server process (open clients, estimated from the kernel queues)',
    `${mib(unsentTotal)} MiB in all at the end (budget 512; highest seen in 200 ms samples ${mib(Math.max(unsentPeak, unsentTotal))}), ` +
    `${unsent.length === 0 ? '-' : `${mib(Math.min(...unsent))}–${mib(Math.max(...unsent))}`} MiB per client (bound 100)`)
  memoryFigure(run, 'server memory at the end of the window', during)
  const peak = Math.max(sampler.stop(), memoryOf(server.pid)?.hwm ?? 0)
  run.figure('server peak RSS', `${mib(peak)} MiB (rise ${mib(peak - before.rss)} MiB; 2.05 GiB before the fix)`)
  run.figure('good clients during it (a new Client every 0.5 s, Add, 2 s timeout)', `${good.ok} answered, ${good.failed} failed, slowest ${ms(good.maxMs)}${good.failures.length > 0 ? `: ${good.failures.join('; ')}` : ''}`)
  for (const p of ok) p.destroy()
  await Promise.race([all, within(3000)])
  await sleep(2000)
  memoryFigure(run, 'server memory after closing them (2 s later)', memoryOf(server.pid))
  const bound = 512 * MiB + 100 * MiB + 300 * MiB
  run.check('server peak RSS', `< ${mib(bound)} MiB (512 budget + 100 per connection + 300)`, `${mib(peak)} MiB`, peak < bound)
  run.check('good client served during it', 'every Add answered (2 s timeout, one each 0.5 s)', `${good.ok} answered, ${good.failed} failed`, good.ok > 0 && good.failed === 0)
}

// 5. SIGTERM with a non-reading client holding queued answers: exit 0 within the grace.
async function shutdownNonreader (run: Run): Promise<void> {
  const graceMs = 3000
  const server = await run.server(['--shutdown-grace-ms', String(graceMs)])
  const echo = new EchoFrames(MiB - 64)
  const { ok } = await openNegotiated(run, server.port, 1, 1, 5000)
  const peer = ok[0]
  if (peer === undefined) throw new Error('the non-reading client did not negotiate')
  peer.stopReading()
  let calls = 0
  for (let i = 0; i < 20; i++) {
    if (!await peer.write(echo.head(i + 1), echo.body)) break
    calls++
  }
  await sleep(1500)
  const queues = tcpQueues(peer.localPort, server.port)
  const serverSide = tcpQueues(server.port, peer.localPort)
  const answers = calls * echo.frameBytes
  run.figure('non-reading client', `${calls} Echo calls of ${mib(echo.frameBytes)} MiB written (${mib(answers)} MiB of answers)`)
  if (queues !== null && serverSide !== null) {
    run.figure('kernel queues 1.5 s later', `client receive queue ${mib(queues.rx)} MiB, server send queue ${mib(serverSide.tx)} MiB: ` +
      `about ${mib(Math.max(0, answers - queues.rx - serverSide.tx))} MiB of answers still unsent in the server process`)
  }
  memoryFigure(run, 'server memory before SIGTERM', memoryOf(server.pid))
  // A good call in flight at SIGTERM: it should be answered before the connections end.
  const client = run.client(server.endpoint)
  const calc = client.service(CalculatorService)
  await calc.Add({ x: 1, y: 2 }, { timeoutMs: 3000 })
  const inFlight = calc.Sleep({ sleep_micros: 1_000_000 }, { timeoutMs: 5000 }).then(() => 'answered', (err: unknown) => err instanceof RpcError ? err.code : String(err))
  await sleep(100)
  const sentAt = now()
  process.kill(server.pid, 'SIGTERM')
  const exit = await Promise.race([server.exit, within(graceMs + 10_000).then(() => null)])
  const exitMs = exit === null ? Number.NaN : exit.at - sentAt
  run.figure('server exit after SIGTERM', exit === null ? `not within ${graceMs + 10_000} ms` : `${ms(exitMs)}, code ${exit.code ?? 'none'}${exit.signal === null ? '' : `, signal ${exit.signal}`}`)
  run.figure('Sleep(1 s) in flight at SIGTERM', await Promise.race([inFlight, within(3000).then(() => 'no outcome within 3 s')]))
  await peer.waitFor(() => peer.closedAt >= 0, 1000)
  run.figure('non-reading client', peer.closedByServer ? `closed by the server (${peer.closeCause})` : 'not seen closed (it does not read; its socket is closed at cleanup)')
  const tail = server.log.filter(l => l.length > 0).slice(-3)
  if (tail.length > 0) run.figure('server stderr (last lines)', tail.join(' | '))
  run.check('exit after SIGTERM', `code 0 within ${graceMs + 2000} ms`, exit === null ? 'no exit' : `code ${exit.code ?? exit.signal} after ${ms(exitMs)}`,
    exit !== null && exit.code === 0 && exitMs <= graceMs + 2000)
}

// 6. Sleeps past their deadline on a closed connection give their workers back.
async function stuckSleeps (run: Run): Promise<void> {
  const server = await run.server([], { metrics: true })
  const { ok } = await openNegotiated(run, server.port, 1, 1, 5000)
  const peer = ok[0]
  if (peer === undefined) throw new Error('the connection did not negotiate')
  const frames = []
  for (let i = 1; i <= 10; i++) frames.push(sleepFrame(i, 20_000_000, 100))
  const sentAt = now()
  await peer.write(Buffer.concat(frames))
  await sleep(Math.max(0, 300 - (now() - sentAt)))
  const answers = peer.frames.filter(f => f.header.call_id > 0)
  const codes = new Map<string, number>()
  for (const f of answers) {
    const code = errorCodeOf(f)
    const name = code === undefined ? 'success' : krpcCodeName(code)
    codes.set(name, (codes.get(name) ?? 0) + 1)
  }
  run.figure('10 × Sleep(20 s), 100 ms timeouts', `${answers.length} answers within 0.3 s${codes.size > 0 ? ` (${[...codes].map(([k, v]) => `${v} ${k}`).join(', ')})` : ''}`)
  const firstError = answers.find(f => f.header.is_error === true)
  if (firstError !== undefined) {
    const status = ErrorStatusType.decode(firstError.message)
    run.figure('  first error answer', status instanceof RpcError ? 'unparsable' : JSON.stringify(status.message))
  }
  peer.destroy()
  const closedAt = now()
  run.figure('connection closed', `at ${ms(closedAt - sentAt)}`)
  await sleep(2000)
  const metricsBefore = await scrapeMetrics(server)
  run.figure('server gauges 2 s later', `idle workers ${counter(metricsBefore, 'nyala_service_idle_workers')} of ${counter(metricsBefore, 'nyala_service_workers')}, ` +
    `handlers abandoned ${counter(metricsBefore, 'nyala_handlers_abandoned_total')}`)
  const good = await goodAdd(run, server.endpoint, 1000)
  run.figure('good Add (1 s timeout) 2 s after the close', `${good.outcome} in ${ms(good.ms)}`)
  run.check('good call after the stuck sleeps', 'Add answered within its 1 s timeout', good.outcome, good.ok)
}

// 7. A 40 MiB SASL user name is refused at the prefix; a 300-byte one FATAL_UNAUTHORIZED.
async function longUsername (run: Run): Promise<void> {
  const server = await run.server([])
  const before = memoryFigure(run, 'server memory before', memoryOf(server.pid))
  const sampler = new RssSampler(server.pid)
  const peer = run.peer(server.port)
  if (!await peer.connected(5000)) throw new Error('could not connect')
  const start = new ClientNegotiation({ user: 'hostile' }).start()
  await peer.write(joinSlices(start.map(f => joinSlices(f))))
  await peer.waitFor(() => peer.negotiationFrames.length >= 1, 3000)
  run.figure('NEGOTIATE answered', peer.negotiationFrames.length >= 1 ? 'yes' : 'no')
  const userBytes = 40 * MiB
  const token = Buffer.alloc(userBytes + 2, 0x75)
  token[0] = 0
  token[userBytes + 1] = 0
  const frame = joinSlices(encodeRequestFrame({ callId: NEGOTIATE_CALL_ID },
    NegotiateType.encode({ step: 2, token, sasl_mechanisms: [{ mechanism: 'PLAIN' }] })))
  const announced = frame.readUInt32BE(0)
  const readBefore = bytesReadBy(server.pid)
  const prefixAt = now()
  await peer.write(frame.subarray(0, 4))
  let handed = 0
  const piece = 64 * 1024
  for (let at = 4; at < frame.length && now() - prefixAt < 15_000; at += piece) {
    if (!await peer.write(frame.subarray(at, Math.min(frame.length, at + piece)))) break
    handed += Math.min(frame.length, at + piece) - at
  }
  await peer.waitFor(() => peer.closedAt >= 0, 3000)
  const readAfter = bytesReadBy(server.pid)
  const read = readBefore === null || readAfter === null ? null : readAfter - readBefore
  const peak = Math.max(sampler.stop(), memoryOf(server.pid)?.hwm ?? 0)
  run.figure('SASL_INITIATE announced', `${announced} bytes (${mib(announced)} MiB; user name ${mib(userBytes)} MiB)`)
  run.figure('connection', peer.closedByServer ? `closed by the server ${ms(peer.closedAt - prefixAt)} after the prefix (${peer.closeCause}); ${peer.negotiationFrames.filter(f => f.header.is_error === true).length} error frames` : 'not closed by the server')
  run.figure('bytes after the prefix the kernel took from the client', `${handed} (${mib(handed)} MiB; includes both sockets' kernel buffers)`)
  run.figure('bytes the server read meanwhile (rchar of /proc/PID/io)', read === null ? 'not readable' : `${read} (${mib(read)} MiB)`)
  const rise = peak - before.rss
  run.figure('server memory peak', `${mib(peak)} MiB (rise ${mib(rise)} MiB)`)
  const accepted = read ?? handed
  run.check('40 MiB user name refused', 'connection closed, ≤ ~1 MiB accepted (≤ 1.1 MiB read), RSS rise < 50 MiB',
    `${peer.closedByServer ? 'closed' : 'open'}, ${accepted} bytes ${read === null ? 'taken by the kernel' : 'read'}, rise ${mib(rise)} MiB`,
    peer.closedByServer && accepted <= 1.1 * MiB && rise < 50 * MiB)
  const long = await goodAdd(run, server.endpoint, 3000, { user: 'u'.repeat(300) })
  run.figure('Client with a 300-byte user, Add', `${long.outcome} in ${ms(long.ms)}`)
  run.check('300-byte user refused', 'RPC_ERR_NEGOTIATION_FAILED with krpcCode 15 (FATAL_UNAUTHORIZED)',
    long.error === null ? long.outcome : `${long.error.code}, krpcCode ${long.error.remote?.code ?? 'none'}`,
    long.error?.code === ErrorCode.NEGOTIATION_FAILED && long.error.remote?.code === KrpcCode.FATAL_UNAUTHORIZED)
}


// 8. Tiny pipelined answers to clients that never read: each costs its wire
// bytes in the server (not a buffer and a transfer of its own), so the
// outbound budgets bound the heap whatever the answer size.
async function tinyAnswers (run: Run): Promise<void> {
  const server = await run.server([], { metrics: true })
  const before = memoryFigure(run, 'server memory before', memoryOf(server.pid))
  const sampler = new RssSampler(server.pid)
  const clients = 10
  const callsEach = 500_000
  const batch = 1000
  const { ok } = await openNegotiated(run, server.port, clients, clients, 5000)
  for (const p of ok) p.stopReading()
  // Ids repeat batch by batch: each Add is answered (out of the in-flight table) before its id comes again.
  const frames = Buffer.concat(Array.from({ length: batch }, (_, i) => addFrame(i + 1)))
  run.figure('non-reading clients', `${ok.length} negotiated, then paused; each pipelines ${callsEach} Add calls (${Math.round(frames.length / batch)} bytes each) in batches of ${batch}`)
  const start = now()
  let lastProgress = now()
  const written = new Map<RawPeer, number>()
  await Promise.all(ok.map(async (peer) => {
    let n = 0
    for (let i = 0; i < callsEach / batch && now() - start < 60_000; i++) {
      if (!await peer.write(frames)) break
      n += batch
      lastProgress = now()
    }
    written.set(peer, n)
  }))
  // The server works through what the kernel holds: wait until its handled count stops moving (5 s at most).
  let handled = -1
  for (let i = 0; i < 50 && now() - lastProgress < 30_000; i++) {
    await sleep(100)
    const metrics = await scrapeMetrics(server)
    const count = Number(counter(metrics, 'nyala_calls_handled_total', 'method="Add"'))
    if (count === handled) break
    handled = count
  }
  const peak = Math.max(sampler.stop(), memoryOf(server.pid)?.hwm ?? 0)
  const counts = ok.map(p => written.get(p) ?? 0)
  run.figure('Add calls written by the clients', `${counts.reduce((a, b) => a + b, 0)} in all, in ${ms(now() - start)}`)
  run.figure('Add answers made by the server', `${handled}`)
  run.figure('non-reading clients closed by the server', `${ok.filter(p => p.closedByServer).length} of ${ok.length}`)
  run.figure('server peak RSS', `${mib(peak)} MiB (rise ${mib(peak - before.rss)} MiB; 481 MiB at 6326a84, before answers were encoded in place while backed up)`)
  // What the answers may hold: the outbound budget (512 MiB) is far above their bytes here, so the rise must be about those bytes.
  const answerBytes = Math.max(0, handled) * 20
  const bound = before.rss + answerBytes * 2 + 150 * MiB
  run.check('server peak RSS', `< ${mib(bound)} MiB (before + 2 x the answers' wire bytes + 150)`, `${mib(peak)} MiB`, peak < bound)
}

// 9. A 4 M-element reply: RedisClient against a real redis-server, its
// client CPU beside a raw node:net socket's receiving the same bytes (the
// reply scanner must look at each byte once, not rescan the reply per read),
// for 1 M, 2 M and 4 M elements: the reply framed only, decoded compact
// (`commandCompact`, a RedisArrayReply), and decoded into one Buffer per
// element (`command`).
async function largeReply (run: Run): Promise<void> {
  const REDIS = '/usr/bin/redis-server'
  const sizes = [1_000_000, 2_000_000, 4_000_000]
  const elements = sizes[sizes.length - 1]!
  const port = await freePort()
  const child = spawn(REDIS, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
  const redis = new RedisClient({ endpoint: `127.0.0.1:${port}`, maxMessageBytes: 64 * MiB, defaultTimeoutMs: 60_000, logger: null })
  const framed = new ProtocolClient<RedisCommand, unknown>({ ...redisClientProtocol(), decodeAnswer: () => null },
    { endpoint: `127.0.0.1:${port}`, maxMessageBytes: 64 * MiB, defaultTimeoutMs: 60_000, logger: null })
  try {
    run.command = `${REDIS} --port ${port} --bind 127.0.0.1 --save '' --appendonly no (pid ${child.pid})`
    run.figure('redis-server', run.command)
    for (let i = 0; ; i++) {
      try {
        await redis.commandWith(['PING'], { timeoutMs: 500 })
        break
      } catch (err) {
        if (i >= 50) throw err
        await sleep(100)
      }
    }
    await redis.command('DEL', 'big')
    // Values of 6 bytes: each element is 12 bytes on the wire (`$6\r\n` + value + CRLF).
    const value = (i: number): string => i.toString(36).padStart(6, '0')
    const batch = 10_000
    const pushes: Array<Promise<unknown>> = []
    for (let at = 0; at < elements; at += batch) {
      pushes.push(redis.command('RPUSH', 'big', ...Array.from({ length: batch }, (_, j) => value(at + j))))
      if (pushes.length >= 20) await Promise.all(pushes.splice(0))
    }
    await Promise.all(pushes)
    run.figure('list', `${elements} elements of 6 bytes; LRANGE 0 ${elements - 1} replies ${mib(`*${elements}\r\n`.length + elements * 12)} MiB`)
    // A full collection before each measurement, so that none pays for the garbage of the one before.
    setFlagsFromString('--expose-gc')
    const gc = runInNewContext('gc') as () => void
    const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
    const cpuOf = async (call: () => Promise<unknown>): Promise<number> => {
      gc()
      const before = process.cpuUsage()
      await call()
      const used = process.cpuUsage(before)
      return (used.user + used.system) / 1000
    }
    for (const n of sizes) {
      const last = String(n - 1)
      const command = Buffer.from(`*4\r\n$6\r\nLRANGE\r\n$3\r\nbig\r\n$1\r\n0\r\n$${last.length}\r\n${last}\r\n`, 'latin1')
      const replyBytes = `*${n}\r\n`.length + n * 12
      const lrange = new RedisCommand(['LRANGE', 'big', 0, n - 1])
      const rawCpu: number[] = []
      const framedCpu: number[] = []
      const compactCpu: number[] = []
      const clientCpu: number[] = []
      for (let round = 0; round < 3; round++) {
        rawCpu.push(await cpuOf(() => rawReceive(port, command, replyBytes)))
        // The same client machinery and reply scanner, the reply not decoded.
        framedCpu.push(await cpuOf(() => framed.call(lrange)))
        compactCpu.push(await cpuOf(async () => {
          const reply = await redis.commandCompact('LRANGE', 'big', 0, n - 1)
          if (!(reply instanceof RedisArrayReply) || reply.length !== n || reply.string(n - 1) !== value(n - 1)) throw new Error('LRANGE (compact) gave the wrong reply')
        }))
        clientCpu.push(await cpuOf(async () => {
          const reply = await redis.command('LRANGE', 'big', 0, n - 1) as Buffer[]
          if (reply.length !== n || reply[n - 1]!.toString() !== value(n - 1)) throw new Error(`LRANGE gave ${reply.length} elements`)
        }))
      }
      const raw = median(rawCpu)
      const ratio = (xs: number[]): string => `${(median(xs) / raw).toFixed(2)} x`
      const label = `${n / 1_000_000} M elements`
      run.figure(`${label}: raw socket receive CPU (3 rounds)`, rawCpu.map(ms).join(', '))
      run.figure(`${label}: ProtocolClient + reply scanner, not decoded`, `${framedCpu.map(ms).join(', ')}: ${ratio(framedCpu)}`)
      run.figure(`${label}: RedisClient.commandCompact LRANGE (a RedisArrayReply)`, `${compactCpu.map(ms).join(', ')}: ${ratio(compactCpu)}`)
      run.figure(`${label}: RedisClient.command LRANGE (one Buffer per element)`, `${clientCpu.map(ms).join(', ')}: ${ratio(clientCpu)}`)
      if (n !== elements) continue
      run.check('client CPU to receive and frame a 4 M-element reply', '<= 3 x a raw socket receiving it (medians)', `${ms(median(framedCpu))} vs ${ms(raw)}: ${ratio(framedCpu)}`, median(framedCpu) <= 3 * raw)
      run.check('client CPU for a 4 M-element reply, decoded compact', '<= 3 x a raw socket receiving it (medians)', `${ms(median(compactCpu))} vs ${ms(raw)}: ${ratio(compactCpu)}`, median(compactCpu) <= 3 * raw)
      run.figure('client CPU for a 4 M-element reply, one Buffer per element', `${ms(median(clientCpu))} vs ${ms(raw)}: ${ratio(clientCpu)} (no eager decoding can meet 3 x: an object per element)`)
    }
    run.figure('note', 'CPU of this process only (redis-server is another); the machine is shared with other work, so figures vary')
  } finally {
    await framed.close()
    await redis.close()
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await Promise.race([once(child, 'exit'), within(5000)])
    }
  }
}

/** A TCP port free on 127.0.0.1 now (redis-server takes no port 0). */
async function freePort (): Promise<number> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const port = (server.address() as { port: number }).port
  await new Promise((resolve) => server.close(resolve))
  return port
}

/** The CPU (ms) this process spends sending `command` on a fresh socket and receiving `bytes` bytes back, touching nothing. */
async function rawReceive (port: number, command: Buffer, bytes: number): Promise<number> {
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  const before = process.cpuUsage()
  let received = 0
  await new Promise<void>((resolve, reject) => {
    socket.on('data', (chunk: Buffer) => {
      received += chunk.length
      if (received >= bytes) resolve()
    })
    socket.once('error', reject)
    socket.once('close', () => { if (received < bytes) reject(new Error(`raw socket closed after ${received} of ${bytes} bytes`)) })
    socket.write(command)
  })
  const used = process.cpuUsage(before)
  socket.destroy()
  return (used.user + used.system) / 1000
}

const SCENARIOS: readonly Scenario[] = [
  { name: 'stalled-partial', summary: '200 connections stopped inside a frame, --idle-timeout-ms 4000', timeoutMs: 60_000, run: stalledPartial },
  { name: 'big-partials', summary: '30 connections each sending 40 MiB of a 50 MiB frame', timeoutMs: 120_000, run: bigPartials },
  { name: 'connection-flood', summary: '1,100 idle negotiated connections under ulimit -n 1024, then good clients', timeoutMs: 120_000, run: connectionFlood },
  { name: 'slow-readers', summary: '20 non-reading clients pipelining 1 MiB Echo calls', timeoutMs: 90_000, run: slowReaders },
  { name: 'shutdown-nonreader', summary: 'SIGTERM with ~20 MiB of answers queued to a client that does not read, --shutdown-grace-ms 3000', timeoutMs: 60_000, run: shutdownNonreader },
  { name: 'stuck-sleeps', summary: '10 Sleep(20 s) with 100 ms timeouts on a connection closed at 0.3 s, then a good Add', timeoutMs: 30_000, run: stuckSleeps },
  { name: 'long-username', summary: 'SASL PLAIN with a 40 MiB user name; a Client with a 300-byte user', timeoutMs: 60_000, run: longUsername },
  { name: 'tiny-answers', summary: '10 non-reading clients pipelining 500 k Add calls each', timeoutMs: 120_000, run: tinyAnswers },
  { name: 'large-reply', summary: '1 M, 2 M and 4 M-element replies: RedisClient LRANGE (compact and eager) against redis-server, its CPU beside a raw socket', timeoutMs: 300_000, run: largeReply },
  ...EXAMPLE_SCENARIOS
]

async function runScenario (scenario: Scenario, print: (line: string) => void): Promise<ScenarioResult> {
  print(`\n== ${scenario.name}: ${scenario.summary}`)
  const run = new Run(print)
  const start = now()
  let error: string | undefined
  let timer: NodeJS.Timeout | undefined
  try {
    await Promise.race([
      scenario.run(run),
      new Promise<never>((_resolve, reject) => { timer = setTimeout(() => reject(new Error(`scenario timed out after ${scenario.timeoutMs} ms`)), scenario.timeoutMs) })
    ])
  } catch (err) {
    error = err instanceof Error ? err.message : String(err)
    print(`  ERROR: ${error}`)
    const tail = run.servers.flatMap(s => s.log.slice(-5))
    if (tail.length > 0) print(`  server stderr: ${tail.join(' | ')}`)
  } finally {
    clearTimeout(timer)
    // What the server logged (its warnings name the limit that acted), then cleanup.
    for (const server of run.servers) {
      const lines = server.log.filter(l => /WARN|ERROR/.test(l))
      if (lines.length > 0) run.figure(`server warnings (${lines.length})`, lines.slice(0, 4).map(l => l.length > 240 ? `${l.slice(0, 240)}…` : l).join(' | '))
    }
    await run.cleanup()
  }
  const pass = error === undefined && run.checks.length > 0 && run.checks.every(c => c.pass)
  const seconds = (now() - start) / 1000
  print(`  => ${pass ? 'PASS' : 'FAIL'} (${seconds.toFixed(1)} s)`)
  return { name: scenario.name, command: run.command, pass, seconds, figures: run.figures, checks: run.checks, ...(error === undefined ? {} : { error }) }
}

async function main (): Promise<number> {
  const { values } = parseArgs({
    options: {
      json: { type: 'boolean', default: false },
      only: { type: 'string' }
    },
    strict: true
  })
  const names = values.only === undefined ? SCENARIOS.map(s => s.name) : values.only.split(',').map(s => s.trim()).filter(s => s.length > 0)
  const unknown = names.filter(n => !SCENARIOS.some(s => s.name === n))
  if (unknown.length > 0) {
    process.stderr.write(`unknown scenario ${unknown.join(', ')}; known: ${SCENARIOS.map(s => s.name).join(', ')}\n`)
    return 2
  }
  // Human-readable progress on stdout, or on stderr when stdout is JSON.
  const print = (line: string): void => { (values.json ? process.stderr : process.stdout).write(`${line}\n`) }
  print(`nyala hostile-peer scenarios: node ${process.version}, ${new Date().toISOString()}`)
  const results: ScenarioResult[] = []
  for (const scenario of SCENARIOS) {
    if (names.includes(scenario.name)) results.push(await runScenario(scenario, print))
  }
  print('\n| scenario | check | target | measured | result |')
  print('|---|---|---|---|---|')
  for (const r of results) {
    if (r.checks.length === 0) print(`| ${r.name} | - | - | ${r.error ?? 'no checks'} | FAIL |`)
    for (const c of r.checks) print(`| ${r.name} | ${c.name} | ${c.target} | ${c.measured} | ${c.pass ? 'PASS' : 'FAIL'} |`)
    if (r.error !== undefined && r.checks.length > 0) print(`| ${r.name} | (error) | - | ${r.error} | FAIL |`)
  }
  const failed = results.filter(r => !r.pass)
  print(`\n${results.length - failed.length} of ${results.length} scenarios passed${failed.length > 0 ? `; failed: ${failed.map(r => r.name).join(', ')}` : ''}`)
  if (values.json) process.stdout.write(`${JSON.stringify({ node: process.version, date: new Date().toISOString(), results }, null, 2)}\n`)
  return failed.length > 0 ? 1 : 0
}

main().then((code) => { process.exitCode = code }, (err: unknown) => {
  process.stderr.write(`hostile: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  process.exitCode = 1
})
