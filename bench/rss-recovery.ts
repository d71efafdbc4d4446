/**
 * Memory after an attack: does the server's RSS come back down once the
 * hostile peers are gone?
 *
 *   node dist/bench/rss-recovery.js [--servers krpc,memcached,redis]
 *     [--attacks slow-readers,partial-frames] [--variants on,off] [--rounds 1]
 *     [--variant NAME=ENV=VALUE[;ENV=VALUE]]... [--json]
 *
 * For each server (`nyala serve --reactors 1`, the memcached example, the
 * Redis example, each a fresh child started through its launcher on
 * 127.0.0.1 port 0), each attack and each variant in turn (the variants
 * alternate within a round, so a drift of the machine falls on both), it
 * reads VmRSS from /proc/PID/status before the attack, samples it every
 * 50 ms during it (the peak: that or VmHWM), closes every attacking socket,
 * and reads it again 5, 10, 20 and 30 s later, with the descriptors the
 * server has open before and at the end (connections it still holds). The target: RSS within
 * 2 × its level before the attack 30 s after the attack ends.
 *
 * The variants: `on` is the servers' default remedy: the allocator tuning
 * of examples/malloc-env.ts (bin/nyala sets it; the examples in one
 * process get it from their environment, as here) and the idle collection
 * of reactor/idle-collection.ts; `off` is neither (NYALA_MALLOC=system,
 * NYALA_IDLE_GC=0);
 * `--variant NAME=ENV=VALUE;ENV=VALUE` adds one with those variables on top
 * of `off` (to try another remedy).
 *
 * The attacks, each bounded in count and time (15 s of sending at most):
 * - slow-readers: 20 connections that never read pipeline requests whose
 *   answers are about 1 MiB (KRPC Echo, memcached GET, Redis GET of a 1 MiB
 *   value set first), 200 each at most, until the kernel took them all or
 *   the 15 s passed;
 * - partial-frames: connections that stop inside large frames: 30 × 40 MiB
 *   of a 50 MiB frame (KRPC; Redis: of a 45 MiB SET, its largest bulk being
 *   the frame limit less 4 KiB), 150 × 2 MiB less one byte of a
 *   2 MiB frame (memcached, whose frames are at most twice its item size).
 *
 * Every server child is killed by its PID after its measurement, failed or
 * not. Exits 1 when any measurement misses the target.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync, readdirSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { FrameDecoder } from '../codec/frame-decoder.js'
import { encodeRemoteMethod } from '../codec/krpc/encode-frame.js'
import { krpcFraming } from '../codec/krpc/frames.js'
import { requestFrameBytes, requestHeaderTail, writeRequestFrameHead } from '../codec/krpc/write-frame.js'
import { clientHandshakeBytes } from '../codec/krpc/client-negotiation.js'
import { CalculatorService } from '../examples/calculator/index.js'
import { IDLE_COLLECTION_OPT_OUT as IDLE_GC_OPT_OUT } from '../reactor/idle-collection.js'
import { MALLOC_OPT_OUT, mallocTuning } from '../examples/malloc-env.js'

const ROOT = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? '../' : '../../', import.meta.url))
const MiB = 1024 * 1024
const AFTER_S = [5, 10, 20, 30] as const

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const within = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms).unref())
const now = (): number => performance.now()
const mib = (bytes: number): string => (bytes / MiB).toFixed(1)

type ServerName = 'krpc' | 'memcached' | 'redis'
type AttackName = 'slow-readers' | 'partial-frames'

const COMMANDS: Record<ServerName, string[]> = {
  krpc: ['serve', '--reactors', '1', '--port', '0', '--host', '127.0.0.1'],
  memcached: [join(ROOT, 'dist', 'examples', 'memcached', 'main.js'), '--port', '0', '--host', '127.0.0.1'],
  redis: [join(ROOT, 'dist', 'examples', 'redis', 'main.js'), '--port', '0', '--host', '127.0.0.1']
}

// ---------------------------------------------------------------------------
// The server child.

interface Child { pid: number, port: number, proc: ChildProcess, exit: Promise<void> }

async function startServer (server: ServerName, env: NodeJS.ProcessEnv): Promise<Child> {
  // The launcher run as a program (its shell part applies the tuning), the examples with Node.
  const proc = server === 'krpc'
    ? spawn(join(ROOT, 'bin', 'nyala'), COMMANDS[server], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(process.execPath, COMMANDS[server], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
  if (proc.pid === undefined) throw new Error(`could not start ${server}`)
  const exit = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
  let out = ''
  let err = ''
  proc.stderr!.setEncoding('utf8')
  proc.stderr!.on('data', (chunk: string) => { err = (err + chunk).slice(-2000) })
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${server}: no "listening on" line within 20 s`)), 20_000)
    proc.stdout!.setEncoding('utf8')
    proc.stdout!.on('data', (chunk: string) => {
      out = (out + chunk).slice(-4096)
      const m = /listening on \S+:(\d+)/.exec(out)
      if (m !== null) { clearTimeout(timer); resolve(Number(m[1])) }
    })
    void exit.then(() => { clearTimeout(timer); reject(new Error(`${server} exited before listening: ${err}`)) })
  }).catch(async (e: unknown) => { await killServer({ pid: proc.pid!, port: 0, proc, exit }); throw e })
  return { pid: proc.pid, port, proc, exit }
}

async function killServer (child: Child): Promise<void> {
  if (child.proc.exitCode !== null || child.proc.signalCode !== null) return
  try { process.kill(child.pid, 'SIGKILL') } catch {}
  await Promise.race([child.exit, within(5000)])
}

/** The descriptors `pid` has open (its listening and client sockets among them); -1 once it is gone. */
function openFiles (pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length
  } catch {
    return -1
  }
}

function memoryOf (pid: number): { rss: number, hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const kb = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? Number.NaN) * 1024
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') }
}

// ---------------------------------------------------------------------------
// Attacking sockets: bounded writes, never a read once paused.

class Peer {
  readonly socket: Socket
  closed = false
  received = 0
  readonly #onData: Array<(chunk: Buffer) => void> = []

  constructor (port: number, peers: Peer[]) {
    peers.push(this)
    this.socket = connect({ host: '127.0.0.1', port })
    this.socket.on('data', (chunk: Buffer) => {
      this.received += chunk.length
      for (const f of this.#onData) f(chunk)
    })
    this.socket.on('error', () => {})
    this.socket.once('close', () => { this.closed = true })
  }

  onData (f: (chunk: Buffer) => void): void { this.#onData.push(f) }

  /** Resolves true once the kernel took `chunks`, false when the connection ended or the clock passed `deadline` (performance.now). */
  write (chunks: readonly Uint8Array[], deadline: number): Promise<boolean> {
    if (this.closed || this.socket.destroyed) return Promise.resolve(false)
    return new Promise((resolve) => {
      const settle = (ok: boolean): void => {
        clearTimeout(timer)
        this.socket.off('close', onClose)
        resolve(ok)
      }
      const onClose = (): void => settle(false)
      const timer = setTimeout(() => settle(false), Math.max(0, deadline - now()))
      this.socket.once('close', onClose)
      this.socket.cork()
      chunks.forEach((c, i) => this.socket.write(c, i < chunks.length - 1 ? undefined : (err) => settle(err == null)))
      this.socket.uncork()
    })
  }
}

/** A KRPC connection negotiated (the whole handshake written, two answers read) within 5 s, or null. */
async function krpcPeer (port: number, peers: Peer[]): Promise<Peer | null> {
  const peer = new Peer(port, peers)
  const decoder = new FrameDecoder(krpcFraming)
  let frames = 0
  const negotiated = new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), 5000)
    peer.onData((chunk) => {
      decoder.push(chunk, () => { frames++ })
      if (frames >= 2) { clearTimeout(timer); resolve(true) }
    })
  })
  await peer.write([clientHandshakeBytes({ user: 'rss' })], now() + 5000)
  return await negotiated ? peer : null
}

const ECHO_METHOD = encodeRemoteMethod(CalculatorService.fullName, 'Echo')
const ECHO_TAIL = requestHeaderTail(ECHO_METHOD, 0)
const ECHO_BODY = Buffer.from(CalculatorService.methods.Echo.requestType.encode({ data: 'x'.repeat(MiB - 64) }))

function echoHead (callId: number): Buffer {
  const head = Buffer.allocUnsafe(requestFrameBytes(callId, ECHO_TAIL, ECHO_BODY.length) - ECHO_BODY.length)
  writeRequestFrameHead(head, 0, callId, ECHO_TAIL, ECHO_BODY.length)
  return head
}

function memcachedRequest (opcode: number, key: string, extras: Buffer, value: Buffer): Buffer {
  const header = Buffer.alloc(24)
  header[0] = 0x80
  header[1] = opcode
  header.writeUInt16BE(key.length, 2)
  header[4] = extras.length
  header.writeUInt32BE(extras.length + key.length + value.length, 8)
  return Buffer.concat([header, extras, Buffer.from(key), value])
}

const BIG_VALUE = Buffer.alloc(MiB - 4096, 0x61)

/** What one request that answers about 1 MiB is, per protocol (after `prepare` ran once). */
const SLOW_READERS: Record<ServerName, { prepare: (port: number, peers: Peer[]) => Promise<void>, open: (port: number, peers: Peer[]) => Promise<Peer | null>, request: (i: number) => Uint8Array[] }> = {
  krpc: {
    prepare: async () => {},
    open: krpcPeer,
    request: (i) => [echoHead(i + 1), ECHO_BODY]
  },
  memcached: {
    prepare: async (port, peers) => {
      const peer = new Peer(port, peers)
      const stored = new Promise<Buffer>((resolve) => peer.onData(resolve))
      await peer.write([memcachedRequest(0x01, 'big', Buffer.alloc(8), BIG_VALUE)], now() + 5000)
      const answer = await Promise.race([stored, sleep(5000).then(() => Buffer.alloc(0))])
      peer.socket.destroy()
      if (answer.length < 24 || answer.readUInt16BE(6) !== 0) throw new Error('memcached did not store the 1 MiB value')
    },
    open: async (port, peers) => new Peer(port, peers),
    request: () => [memcachedRequest(0x00, 'big', Buffer.alloc(0), Buffer.alloc(0))]
  },
  redis: {
    prepare: async (port, peers) => {
      const peer = new Peer(port, peers)
      const stored = new Promise<Buffer>((resolve) => peer.onData(resolve))
      await peer.write([Buffer.from(`*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$${BIG_VALUE.length}\r\n`), BIG_VALUE, Buffer.from('\r\n')], now() + 5000)
      const answer = await Promise.race([stored, sleep(5000).then(() => Buffer.alloc(0))])
      peer.socket.destroy()
      if (!answer.toString('latin1').startsWith('+OK')) throw new Error('redis did not store the 1 MiB value')
    },
    open: async (port, peers) => new Peer(port, peers),
    request: () => [Buffer.from('*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n')]
  }
}

/** The body of a memcached SET whose frame is just under the largest one the example accepts (2 MiB). */
const MEMCACHED_PARTIAL_BODY = 2 * MiB - 64

/** A connection, the start of one large frame on it, and how many bytes of the frame to send. */
const PARTIAL_FRAMES: Record<ServerName, { connections: number, send: number, open: (port: number, peers: Peer[]) => Promise<Peer | null>, head: () => Buffer }> = {
  krpc: {
    connections: 30,
    send: 40 * MiB,
    open: krpcPeer,
    head: () => { const b = Buffer.alloc(4); b.writeUInt32BE(50 * MiB - 4, 0); return b }
  },
  memcached: {
    connections: 150,
    send: MEMCACHED_PARTIAL_BODY - 8 - 3 - 1,
    open: async (port, peers) => new Peer(port, peers),
    head: () => {
      const head = memcachedRequest(0x01, 'big', Buffer.alloc(8), Buffer.alloc(0))
      head.writeUInt32BE(MEMCACHED_PARTIAL_BODY, 8)
      return head
    }
  },
  redis: {
    connections: 30,
    send: 40 * MiB,
    open: async (port, peers) => new Peer(port, peers),
    head: () => Buffer.from(`*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$${45 * MiB}\r\n`)
  }
}

async function slowReaders (server: ServerName, port: number, peers: Peer[]): Promise<string> {
  const kind = SLOW_READERS[server]
  await kind.prepare(port, peers)
  const opened = await Promise.all(Array.from({ length: 20 }, () => kind.open(port, peers)))
  const ok = opened.filter((p): p is Peer => p !== null)
  for (const p of ok) p.socket.pause()
  const start = now()
  const deadline = start + 15_000
  let written = 0
  await Promise.all(ok.map(async (peer) => {
    for (let i = 0; i < 200; i++) {
      if (!await peer.write(kind.request(i), deadline)) return
      written++
    }
  }))
  return `${ok.length} non-reading connections, ${written} requests written in ${Math.round(now() - start)} ms`
}

async function partialFrames (server: ServerName, port: number, peers: Peer[]): Promise<string> {
  const kind = PARTIAL_FRAMES[server]
  const opened = await Promise.all(Array.from({ length: kind.connections }, () => kind.open(port, peers)))
  const ok = opened.filter((p): p is Peer => p !== null)
  const chunk = Buffer.alloc(Math.min(MiB, kind.send), 0x42)
  const start = now()
  const deadline = start + 15_000
  let bytes = 0
  await Promise.all(ok.map(async (peer) => {
    if (!await peer.write([kind.head()], deadline)) return
    for (let sent = 0; sent < kind.send;) {
      const piece = chunk.subarray(0, Math.min(chunk.length, kind.send - sent))
      if (!await peer.write([piece], deadline)) return
      sent += piece.length
      bytes += piece.length
    }
  }))
  return `${ok.length} connections, ${mib(bytes)} MiB of partial frames sent in ${Math.round(now() - start)} ms`
}

const ATTACKS: Record<AttackName, (server: ServerName, port: number, peers: Peer[]) => Promise<string>> = {
  'slow-readers': slowReaders,
  'partial-frames': partialFrames
}

// ---------------------------------------------------------------------------
// One measurement.

interface Row { server: ServerName, attack: AttackName, variant: string, before: number, peak: number, after: number[], fdsBefore: number, fdsAfter: number, pass: boolean, note: string }

async function measure (server: ServerName, attack: AttackName, variant: string, env: NodeJS.ProcessEnv): Promise<Row> {
  const child = await startServer(server, env)
  const peers: Peer[] = []
  try {
    await sleep(2000)
    const before = memoryOf(child.pid).rss
    const fdsBefore = openFiles(child.pid)
    let peak = before
    const sampler = setInterval(() => { try { peak = Math.max(peak, memoryOf(child.pid).rss) } catch {} }, 50)
    let note: string
    try {
      note = await Promise.race([ATTACKS[attack](server, child.port, peers), sleep(40_000).then(() => 'attack cut at 40 s')])
      await sleep(1000)
    } finally {
      clearInterval(sampler)
    }
    peak = Math.max(peak, memoryOf(child.pid).hwm)
    for (const p of peers) p.socket.destroy()
    const ended = now()
    const after: number[] = []
    for (const s of AFTER_S) {
      await sleep(Math.max(0, ended + s * 1000 - now()))
      after.push(memoryOf(child.pid).rss)
    }
    return { server, attack, variant, before, peak, after, fdsBefore, fdsAfter: openFiles(child.pid), pass: after[after.length - 1]! <= 2 * before, note }
  } finally {
    for (const p of peers) p.socket.destroy()
    await killServer(child)
  }
}

function parseVariant (text: string): [string, Record<string, string>] {
  const eq = text.indexOf('=')
  if (eq <= 0) throw new RangeError(`--variant takes NAME=ENV=VALUE[;ENV=VALUE], got ${text}`)
  const vars: Record<string, string> = {}
  for (const pair of text.slice(eq + 1).split(';')) {
    const i = pair.indexOf('=')
    if (i <= 0) throw new RangeError(`--variant: ${pair} is not ENV=VALUE`)
    vars[pair.slice(0, i)] = pair.slice(i + 1)
  }
  return [text.slice(0, eq), vars]
}

async function main (): Promise<number> {
  const { values } = parseArgs({
    options: {
      servers: { type: 'string', default: 'krpc,memcached,redis' },
      attacks: { type: 'string', default: 'slow-readers,partial-frames' },
      variants: { type: 'string', default: 'on,off' },
      variant: { type: 'string', multiple: true, default: [] },
      rounds: { type: 'string', default: '1' },
      json: { type: 'boolean', default: false }
    },
    strict: true
  })
  const base: NodeJS.ProcessEnv = { ...process.env }
  for (const name of ['MALLOC_ARENA_MAX', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_MMAP_THRESHOLD_', 'GLIBC_TUNABLES', MALLOC_OPT_OUT.name, IDLE_GC_OPT_OUT.name]) delete base[name]
  const off = { ...base, [MALLOC_OPT_OUT.name]: MALLOC_OPT_OUT.value, [IDLE_GC_OPT_OUT.name]: IDLE_GC_OPT_OUT.value }
  const variants = new Map<string, NodeJS.ProcessEnv>()
  for (const name of values.variants.split(',').filter(s => s !== '')) {
    // bin/nyala adds the tuning itself; the examples in one process take it from their caller.
    if (name === 'on') variants.set(name, { ...base, ...mallocTuning(base) })
    else if (name === 'off') variants.set(name, off)
    else throw new RangeError(`--variants knows on and off; add others with --variant, got ${name}`)
  }
  for (const text of values.variant) {
    const [name, vars] = parseVariant(text)
    variants.set(name, { ...off, ...vars })
  }
  const servers = values.servers.split(',') as ServerName[]
  const attacks = values.attacks.split(',') as AttackName[]
  for (const s of servers) if (!(s in COMMANDS)) throw new RangeError(`unknown server ${s}`)
  for (const a of attacks) if (!(a in ATTACKS)) throw new RangeError(`unknown attack ${a}`)
  const rounds = Number(values.rounds)
  const print = (line: string): void => { (values.json ? process.stderr : process.stdout).write(`${line}\n`) }
  print(`nyala RSS after an attack: node ${process.version}, ${new Date().toISOString()}`)
  const rows: Row[] = []
  for (let round = 0; round < rounds; round++) {
    for (const server of servers) {
      for (const attack of attacks) {
        for (const [variant, env] of variants) {
          const row = await measure(server, attack, variant, env)
          rows.push(row)
          print(`${server} ${attack} ${variant}: before ${mib(row.before)}, peak ${mib(row.peak)}, after ${row.after.map(mib).join(' / ')} MiB, descriptors ${row.fdsBefore} → ${row.fdsAfter} ${row.pass ? 'PASS' : 'FAIL'} (${row.note})`)
        }
      }
    }
  }
  print(`\n| server | attack | remedy | before MiB | peak MiB | ${AFTER_S.map(s => `+${s} s`).join(' | ')} | 30 s ≤ 2 × before | fds before → +30 s |`)
  print(`|---|---|---|---|---|${AFTER_S.map(() => '---|').join('')}---|---|`)
  for (const r of rows) print(`| ${r.server} | ${r.attack} | ${r.variant} | ${mib(r.before)} | ${mib(r.peak)} | ${r.after.map(mib).join(' | ')} | ${r.pass ? 'yes' : 'no'} | ${r.fdsBefore} → ${r.fdsAfter} |`)
  if (values.json) process.stdout.write(`${JSON.stringify({ node: process.version, date: new Date().toISOString(), rows }, null, 2)}\n`)
  return rows.every(r => r.pass) ? 0 : 1
}

main().then((code) => { process.exitCode = code }, (err: unknown) => {
  process.stderr.write(`rss-recovery: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  process.exitCode = 1
})
