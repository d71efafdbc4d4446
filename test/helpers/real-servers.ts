/**
 * Real servers (memcached, redis-server) for the tests that compare the
 * examples with them: a free 127.0.0.1 port, waiting until a port accepts,
 * and starting a server there that the test's teardown stops by its PID.
 */
import type { Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { connect, createServer } from 'node:net'

export function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer()
    probe.once('error', reject)
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number }
      probe.close(() => resolve(port))
    })
  })
}

/** Polls until `port` on 127.0.0.1 accepts (`attempts` tries `intervalMs` apart); throws if `child` exits first or the tries run out. */
export async function waitForPort (port: number, child: ChildProcess, name: string, attempts = 400, intervalMs = 10): Promise<void> {
  for (let i = 0; i < attempts; i++) {
    if (child.exitCode !== null) throw new Error(`${name} exited with ${child.exitCode}`)
    const ok = await new Promise<boolean>((resolve) => {
      const socket = connect(port, '127.0.0.1')
      socket.once('connect', () => { socket.destroy(); resolve(true) })
      socket.once('error', () => resolve(false))
    })
    if (ok) return
    await new Promise(resolve => setTimeout(resolve, intervalMs))
  }
  throw new Error(`${name} did not listen on ${port}`)
}

/** Stops `child` with SIGTERM (unless it is gone already) and resolves with its exit code. */
export async function stopChild (child: ChildProcess): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) return child.exitCode
  child.kill('SIGTERM')
  const [code] = await once(child, 'exit') as [number | null]
  return code
}

/** Starts `command args(port)` on a free port, stopped at the test's end, and resolves once the port accepts. */
export async function startReal (t: Test, command: string, args: (port: number) => string[]): Promise<{ child: ChildProcess, port: number }> {
  const port = await freePort()
  const child = spawn(command, args(port), { stdio: 'ignore' })
  t.teardown(async () => { await stopChild(child) })
  await waitForPort(port, child, command)
  return { child, port }
}

/** redis-server on 127.0.0.1, nothing persisted, with `extra` arguments (as `--databases 1`). */
export function realRedis (t: Test, command: string, extra: string[] = []): Promise<{ child: ChildProcess, port: number }> {
  return startReal(t, command, (port) => ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...extra])
}

/** memcached on 127.0.0.1, one thread, no UDP; with `-u root` when run as root, which memcached requires. */
export function realMemcached (t: Test, command: string): Promise<{ child: ChildProcess, port: number }> {
  return startReal(t, command, (port) => ['-t', '1', '-U', '0', '-l', '127.0.0.1', '-p', String(port), ...(process.getuid?.() === 0 ? ['-u', 'root'] : [])])
}
