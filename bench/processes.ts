/**
 * The process helpers the benches beside real servers share (redis.ts,
 * memcached.ts, memcached-client.ts): a free port, starting a process and
 * waiting until a line or a probe says it is ready, bounded runs of a load
 * tool, CPU ticks and children from /proc, stopping every process started
 * here by PID, and the median. Linux only (/proc).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { readFileSync, readdirSync } from 'node:fs'
import { connect, createServer } from 'node:net'
import { fileURLToPath } from 'node:url'

export const HOST = '127.0.0.1'
export const CLOCK_TICKS = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100

// Every process started through this module and not yet stopped or reaped.
const started: ChildProcess[] = []

export function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, HOST, () => {
      const address = server.address()
      server.close(() => typeof address === 'object' && address !== null ? resolve(address.port) : reject(new Error('no port')))
    })
  })
}

// Starts a process and resolves once `ready` says so (given what it printed so far), rejecting if it exits or times out.
export function startProcess (command: string, args: string[], ready: (text: string) => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<ChildProcess> {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  started.push(child)
  let text = ''
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command} not ready after ${timeoutMs} ms: ${text}`)), timeoutMs)
    let done = false
    const check = async (): Promise<void> => {
      if (!done && await ready(text)) {
        done = true
        clearTimeout(timer)
        resolve(child)
      }
    }
    const onData = (d: Buffer): void => {
      text += d.toString()
      void check()
    }
    child.stdout!.on('data', onData)
    child.stderr!.on('data', onData)
    child.once('error', (err) => { clearTimeout(timer); reject(err) })
    child.once('exit', (code, signal) => { clearTimeout(timer); if (!done) reject(new Error(`${command} exited (${code ?? signal}): ${text}`)) })
    void check()
  })
}

export function portOpen (port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, HOST)
    socket.once('connect', () => { socket.destroy(); resolve(true) })
    socket.once('error', () => resolve(false))
  })
}

// A `ready` probe for startProcess, for servers that print nothing: true once `port` accepts, false after `attempts` tries `intervalMs` apart.
export function portProbe (port: number, attempts = 100, intervalMs = 50): () => Promise<boolean> {
  return async () => {
    for (let i = 0; i < attempts; i++) {
      if (await portOpen(port)) return true
      await new Promise((resolve) => setTimeout(resolve, intervalMs))
    }
    return false
  }
}

// `memcached -t 1 -U 0 -l 127.0.0.1 -p <free port>`, with `-u root` when run as root (which memcached requires).
export async function startMemcached (attempts = 100, intervalMs = 50): Promise<{ child: ChildProcess, port: number }> {
  const port = await freePort()
  const user = process.getuid?.() === 0 ? ['-u', 'root'] : []
  const child = await startProcess('memcached', [...user, '-t', '1', '-U', '0', '-l', HOST, '-p', String(port)], portProbe(port, attempts, intervalMs))
  return { child, port }
}

// A Node script that prints `listening on HOST:PORT` once it serves.
export async function startNode (args: string[]): Promise<{ child: ChildProcess, port: number }> {
  let port = 0
  const child = await startProcess(process.execPath, args, (text) => {
    const m = /listening on [\d.]+:(\d+)/.exec(text)
    if (m !== null) port = Number(m[1])
    return m !== null
  }, 30_000)
  return { child, port }
}

// Runs a load tool to its exit, SIGKILLed after `limitMs`: its exit code and all it printed (stdout and stderr).
export async function runBounded (command: string, args: string[], limitMs: number): Promise<{ code: number | null, out: string }> {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  started.push(child)
  let out = ''
  child.stdout!.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { out += d.toString() })
  const killer = setTimeout(() => { if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL') }, limitMs)
  try {
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject)
      child.once('exit', (c) => resolve(c))
    })
    started.splice(started.indexOf(child), 1)
    return { code, out }
  } finally {
    clearTimeout(killer)
  }
}

// Every process's pid and its /proc/PID/stat fields from the state on:
// state(3) ppid(4) ... utime(14) stime(15), numbered from 1, so ppid is fields[1].
function* procStats (): Generator<{ pid: number, fields: string[] }> {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    let stat: string
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'latin1')
    } catch {
      continue // gone meanwhile
    }
    // The command name is in parentheses and may hold spaces: split after it.
    yield { pid: Number(entry), fields: stat.slice(stat.lastIndexOf(')') + 2).split(' ') }
  }
}

// CPU ticks (utime + stime) of a process and of its live children.
export function cpuTicks (pid: number): number {
  let ticks = 0
  for (const { pid: p, fields } of procStats()) {
    if (p === pid || Number(fields[1]) === pid) ticks += Number(fields[11]) + Number(fields[12])
  }
  return ticks
}

// The live children of a process (the reactor processes an example forks).
export function childrenOf (pid: number): number[] {
  const children: number[] = []
  for (const { pid: p, fields } of procStats()) if (Number(fields[1]) === pid) children.push(p)
  return children
}

// SIGTERM first (an example drains and exits, taking its reactors along),
// then SIGKILL to whatever of them (and of their children) is left after 2 s.
export async function stopAll (): Promise<void> {
  const pids: number[] = []
  for (const child of started) {
    if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) continue
    pids.push(...childrenOf(child.pid), child.pid)
    try { process.kill(child.pid, 'SIGTERM') } catch { /* already gone */ }
  }
  started.length = 0
  const alive = (pid: number): boolean => {
    try { process.kill(pid, 0); return true } catch { return false }
  }
  for (let i = 0; i < 40 && pids.some(alive); i++) await new Promise((resolve) => setTimeout(resolve, 50))
  for (const pid of pids) {
    try { process.kill(pid, 'SIGKILL') } catch { /* already gone */ }
  }
}

export function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/**
 * Runs a bench's `main` when its module is the program (`url`: its
 * `import.meta.url`): SIGINT and a failure stop every process it started,
 * and a failure prints its message and sets exit code 1.
 */
export function runAsProgram (url: string, main: () => Promise<void>): void {
  if (process.argv[1] !== fileURLToPath(url)) return
  process.once('SIGINT', () => { void stopAll().then(() => process.exit(130)) })
  main().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err)
    process.exitCode = 1
  })
}
