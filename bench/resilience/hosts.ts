/**
 * The suite's processes: a server per host, each started in its host's
 * namespace (`ip netns exec` execs, so the child's PID is the server's own
 * and `kill -9`/SIGSTOP reach it), and the delaying proxy. Every process started is remembered until it has exited,
 * so that `stopAll` (also run on SIGINT and on failure) leaves none.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import type { HostNet } from './netns.js'

const HERE = fileURLToPath(new URL('.', import.meta.url))
const START_TIMEOUT_MS = 10_000

/** One process of the suite's, started in a namespace. */
export interface Proc {
  readonly child: ChildProcess
  readonly pid: number
  exited: boolean
  exitCode: number | null
  signal: NodeJS.Signals | null
}

const live = new Set<Proc>()

/** Starts `script` (a file of this folder, compiled) under `node` in `ns`; resolves once it prints `listening on`. */
export async function startIn (ns: string, script: string, args: readonly string[]): Promise<Proc> {
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, `${HERE}${script}`, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  const proc: Proc = { child, pid: child.pid ?? -1, exited: false, exitCode: null, signal: null }
  live.add(proc)
  child.once('exit', (code, signal) => {
    proc.exited = true
    proc.exitCode = code
    proc.signal = signal
    live.delete(proc)
  })
  let stderr = ''
  child.stderr!.on('data', (d: Buffer) => { if (stderr.length < 4096) stderr += d.toString() })
  await new Promise<void>((resolve, reject) => {
    let out = ''
    const timer = setTimeout(() => reject(new Error(`${script} in ${ns} did not listen within ${START_TIMEOUT_MS} ms: ${stderr}`)), START_TIMEOUT_MS)
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString()
      if (out.includes('listening on')) { clearTimeout(timer); resolve() }
    })
    child.once('exit', (code, signal) => { clearTimeout(timer); reject(new Error(`${script} in ${ns} exited (${code ?? signal}) before listening: ${stderr}`)) })
  })
  // Keep reading so that the pipe never fills.
  child.stdout!.resume()
  return proc
}

/** Sends `signal` to a process of the suite's, if it is still running. */
export function signal (proc: Proc, sig: NodeJS.Signals): void {
  if (!proc.exited) {
    try { process.kill(proc.pid, sig) } catch {}
  }
}

/** Waits until `proc` exits, at most `ms`; true if it did. */
export async function exited (proc: Proc, ms: number): Promise<boolean> {
  if (proc.exited) return true
  return await new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), ms)
    proc.child.once('exit', () => { clearTimeout(timer); resolve(true) })
  })
}

/** Ends `proc`: SIGCONT (a stopped one), SIGTERM, then SIGKILL after `graceMs`. True if it exited on SIGTERM. */
export async function stop (proc: Proc, graceMs = 3000): Promise<boolean> {
  if (proc.exited) return true
  signal(proc, 'SIGCONT')
  signal(proc, 'SIGTERM')
  if (await exited(proc, graceMs)) return true
  signal(proc, 'SIGKILL')
  await exited(proc, 2000)
  return false
}

/** Ends every process of the suite's still running (by PID, each one started here). */
export async function stopAll (): Promise<void> {
  await Promise.all([...live].map(async (p) => await stop(p, 1000)))
}

/** Kills every process still running at once, synchronously: for the exit path. */
export function killAllNow (): void {
  for (const p of live) {
    try { process.kill(p.pid, 'SIGKILL') } catch {}
  }
}

/** A host's server. */
export interface HostProcs {
  readonly net: HostNet
  server: Proc
}

/** The server of `protocol` on `net`'s address and `port`, logging non-idempotent executions to `log`. */
export async function startHost (protocol: 'krpc' | 'memcached', net: HostNet, port: number, log: string): Promise<HostProcs> {
  const script = protocol === 'krpc' ? 'host-krpc.js' : 'host-memcached.js'
  const server = await startIn(net.ns, script, ['--name', `h${net.index}`, '--host', net.address, '--port', String(port), '--log', log])
  return { net, server }
}

/** The delaying proxy (delay-proxy.ts) on `net`'s address and `port`, to the host's server on `target`; not delaying until SIGUSR1. */
export async function startProxy (net: HostNet, port: number, target: number): Promise<Proc> {
  return await startIn(net.ns, 'delay-proxy.js', ['--listen', `${net.address}:${port}`, '--target', `${net.address}:${target}`, '--delay-ms', '200'])
}
