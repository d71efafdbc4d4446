/**
 * The postgres example in the test's process on a free loopback port, and
 * the client tools run against it and a real PostgreSQL: psql and pgbench
 * (asynchronously: the example answers from this process's event loop).
 */
import type { Test } from 'tap'
import { spawn } from 'node:child_process'
import { mkdtempSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { postgresServer, type PostgresServerOptions } from '../../examples/postgres/main.js'

/** Starts the example with `options`; closed at the test's end. */
export async function startExample (t: Test, options: PostgresServerOptions = {}): Promise<number> {
  const server = postgresServer({ users: { scram: 'secret' }, ...options })
  const address = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close())
  return address.port
}

/** Runs a command; resolves with its exit code and its stdout and stderr interleaved as it wrote them (one file for both). */
export async function run (command: string, args: string[], env: Record<string, string> = {}, timeoutMs = 60_000): Promise<{ code: number | null, output: string }> {
  const dir = mkdtempSync('/tmp/nyala-pg-run-')
  const file = join(dir, 'out')
  const fd = openSync(file, 'w')
  try {
    const child = spawn(command, args, { stdio: ['ignore', fd, fd], env: { ...process.env, PGCONNECT_TIMEOUT: '10', ...env } })
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
    const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)))
    clearTimeout(timer)
    return { code, output: readFileSync(file, 'utf8') }
  } finally {
    closeSync(fd)
    rmSync(dir, { recursive: true, force: true })
  }
}

/** psql's transcript of `-c` commands (each its own -c, in one session) as user `user`. */
export async function psql (port: number, commands: string[], user = 'test', password?: string, extra: string[] = []): Promise<string> {
  const args = ['-X', '-h', '127.0.0.1', '-p', String(port), '-U', user, '-d', user === 'scram' ? 'scram' : 'test', ...extra]
  for (const command of commands) args.push('-c', command)
  const { code, output } = await run('psql', args, password === undefined ? {} : { PGPASSWORD: password })
  return `${output}exit ${code}\n`
}
