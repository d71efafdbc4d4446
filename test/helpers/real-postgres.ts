/**
 * A real PostgreSQL 15 for the tests that compare the postgres example with
 * it: a fresh data directory in a temporary folder, a free loopback port,
 * trust for the user `test` and SCRAM-SHA-256 for `scram` (password
 * `secret`), and the example's table `kv` created. Run as the `postgres`
 * user when the test runs as root (PostgreSQL refuses root). The test's
 * teardown stops it by its PID and removes the folder.
 */
import type { Test } from 'tap'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { userInfo } from 'node:os'
import { join } from 'node:path'
import { freePort, stopChild, waitForPort } from './real-servers.js'

export const PG_BIN = '/usr/lib/postgresql/15/bin'

/** Why the real server cannot run here, or null when it can. */
export function realPostgresMissing (): string | null {
  if (!existsSync(join(PG_BIN, 'postgres')) || !existsSync(join(PG_BIN, 'initdb'))) return `no PostgreSQL 15 server binaries under ${PG_BIN} (apt-get install postgresql)`
  if (spawnSync('psql', ['--version']).status !== 0) return 'no psql (apt-get install postgresql-client)'
  if (userInfo().uid === 0 && spawnSync('id', ['-u', 'postgres']).status !== 0) return 'running as root and there is no postgres user to run the server as'
  return null
}

function runAs (): { uid?: number, gid?: number } {
  if (userInfo().uid !== 0) return {}
  const uid = Number(spawnSync('id', ['-u', 'postgres']).stdout.toString().trim())
  const gid = Number(spawnSync('id', ['-g', 'postgres']).stdout.toString().trim())
  return { uid, gid }
}

/** Starts a real PostgreSQL; resolves with its port once it accepts connections and `kv` exists. */
export async function realPostgres (t: Test): Promise<{ child: ChildProcess, port: number }> {
  const dir = mkdtempSync('/tmp/nyala-pg-')
  const ids = runAs()
  if (ids.uid !== undefined) chownSync(dir, ids.uid, ids.gid!)
  t.teardown(() => { rmSync(dir, { recursive: true, force: true }) })
  const data = join(dir, 'data')
  const pwfile = join(dir, 'pw')
  writeFileSync(pwfile, 'secret\n')
  if (ids.uid !== undefined) chownSync(pwfile, ids.uid, ids.gid!)
  const init = spawnSync(join(PG_BIN, 'initdb'), ['-D', data, '-U', 'test', '--auth=trust', '--no-locale', '-E', 'UTF8', '--no-sync'], { ...ids, cwd: dir })
  if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr.toString()}`)
  // test: trust; scram: SCRAM-SHA-256.
  writeFileSync(join(data, 'pg_hba.conf'), 'host all scram 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\nlocal all all trust\n')
  const port = await freePort()
  const child = spawn(join(PG_BIN, 'postgres'), ['-D', data, '-p', String(port), '-h', '127.0.0.1', '-k', dir, '-c', 'fsync=off', '-c', 'TimeZone=UTC', '-c', 'max_connections=100'], { ...ids, cwd: dir, stdio: 'ignore' })
  t.teardown(async () => { await stopChild(child) })
  await waitForPort(port, child, 'postgres', 1000, 20)
  // Accepting connections is not ready: wait until a query goes through.
  for (let i = 0; ; i++) {
    const ready = spawnSync('psql', ['-X', '-h', '127.0.0.1', '-p', String(port), '-U', 'test', '-d', 'postgres', '-c', 'SELECT 1'])
    if (ready.status === 0) break
    if (i > 200) throw new Error(`postgres did not become ready: ${ready.stderr.toString()}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  const setup = spawnSync('psql', ['-X', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1', '-p', String(port), '-U', 'test', '-d', 'postgres',
    '-c', "SET password_encryption = 'scram-sha-256'; CREATE ROLE scram LOGIN SUPERUSER PASSWORD 'secret'", '-c', 'CREATE DATABASE test', '-c', 'CREATE DATABASE scram'])
  if (setup.status !== 0) throw new Error(`setting up postgres failed: ${setup.stderr.toString()}`)
  for (const db of ['test', 'scram']) {
    const table = spawnSync('psql', ['-X', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1', '-p', String(port), '-U', 'test', '-d', db, '-c', 'CREATE TABLE kv (k text PRIMARY KEY, v text)'])
    if (table.status !== 0) throw new Error(`creating kv failed: ${table.stderr.toString()}`)
  }
  return { child, port }
}
