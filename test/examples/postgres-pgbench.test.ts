/**
 * pgbench against the postgres example, in the three query modes, with a
 * custom script (`SELECT 1;`): every transaction succeeds, as against a
 * real PostgreSQL 15 run the same way. Counts, not speeds (bench/postgres.ts
 * compares the speeds).
 */
import t from 'tap'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { realPostgres, realPostgresMissing } from '../helpers/real-postgres.js'
import { run, startExample } from '../helpers/postgres-example.js'

const missing = realPostgresMissing() ?? false

function summary (output: string): { processed: number, failed: number } {
  const processed = /number of transactions actually processed: (\d+)/.exec(output)
  const failed = /number of failed transactions: (\d+)/.exec(output)
  return { processed: processed === null ? -1 : Number(processed[1]), failed: failed === null ? -1 : Number(failed[1]) }
}

t.test('pgbench -M simple|extended|prepared -f select1.sql: no failures, as against PostgreSQL', { skip: missing, timeout: 120_000 }, async (t) => {
  const dir = mkdtempSync('/tmp/nyala-pgbench-')
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const script = join(dir, 'select1.sql')
  writeFileSync(script, 'SELECT 1;\n')
  const real = await realPostgres(t)
  const ours = await startExample(t)
  for (const mode of ['simple', 'extended', 'prepared']) {
    for (const [name, port] of [['postgres', real.port], ['example', ours]] as const) {
      // -t: a fixed count of transactions per client, so the outcome is a count, not a speed.
      const { code, output } = await run('pgbench', ['-n', '-c', '4', '-t', '500', '-M', mode, '-f', script, '-h', '127.0.0.1', '-p', String(port), '-U', 'test', 'test'])
      t.equal(code, 0, `${name} ${mode}: pgbench exits 0`)
      t.same(summary(output), { processed: 2000, failed: 0 }, `${name} ${mode}: 2000 transactions, none failed`)
    }
  }
})
