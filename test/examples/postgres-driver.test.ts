/**
 * The `pg` npm driver against the postgres example and a real PostgreSQL
 * 15, the outcomes diffed: parameterized queries (extended protocol),
 * named prepared statements, binary results, row-limited portals
 * (PortalSuspended), errors and the skip to Sync after them, transactions,
 * SCRAM-SHA-256. Only what must differ is normalized: error fields naming
 * PostgreSQL's source files, and the table OIDs of result columns.
 */
import t from 'tap'
import pg from 'pg'
import { realPostgres, realPostgresMissing } from '../helpers/real-postgres.js'
import { startExample } from '../helpers/postgres-example.js'

const missing = realPostgresMissing() ?? false

type Step = string | pg.QueryConfig
const STEPS: Step[] = [
  'SELECT 1 AS one',
  { text: 'SELECT $1::int + 1 AS n, $2::text AS t', values: [41, 'hello'] },
  { text: 'SELECT $1::int8 AS big', values: ['9007199254740993'] },
  { text: 'INSERT INTO kv (k, v) VALUES ($1, $2)', values: ['a', '1'] },
  { text: 'INSERT INTO kv (k, v) VALUES ($1, $2)', values: ['b', '2'] },
  { text: 'INSERT INTO kv (k, v) VALUES ($1, $2)', values: ['a', 'dup'] },
  { text: 'SELECT v FROM kv WHERE k = $1', values: ['a'] },
  { name: 'by-key', text: 'SELECT k, v FROM kv WHERE k = $1', values: ['b'] },
  { name: 'by-key', text: 'SELECT k, v FROM kv WHERE k = $1', values: ['a'] },
  { text: 'SELECT $1::int AS n', values: ['not a number'] },
  { text: 'SELECT $1::int + 1 AS n, 40 + 2 AS m, $2::int8 AS big, $3::text AS t, NULL::int AS none', values: [1, 2, 'x'], binary: true } as pg.QueryConfig,
  { text: 'SELECT k, v FROM kv ORDER BY k', rows: 1 } as pg.QueryConfig,
  'BEGIN',
  { text: 'UPDATE kv SET v = $1 WHERE k = $2', values: ['changed', 'a'] },
  { text: 'SELECT v FROM kv WHERE k = $1', values: ['a'] },
  'SELECT \'boom\'::int',
  'SELECT 1',
  'ROLLBACK',
  { text: 'SELECT v FROM kv WHERE k = $1', values: ['a'] },
  'BEGIN',
  { text: 'DELETE FROM kv WHERE k = $1', values: ['a'] },
  'COMMIT',
  'SELECT k, v FROM kv ORDER BY k',
  { text: 'SELECT $1 AS untyped', values: ['text by default'] },
  'SELECT 1; SELECT 2',
  { text: 'SELECT 1; SELECT 2', values: [] },
  'nonsense here',
  { text: 'SELECT pg_sleep($1)', values: [0.01] },
  'DELETE FROM kv'
]

function outcome (result: pg.QueryResult | pg.QueryResult[]): unknown {
  const one = (r: pg.QueryResult): unknown => ({
    command: r.command,
    rowCount: r.rowCount,
    rows: r.rows,
    fields: r.fields.map(f => ({ name: f.name, dataTypeID: f.dataTypeID, format: f.format }))
  })
  return Array.isArray(result) ? result.map(one) : one(result)
}

function failure (error: unknown): unknown {
  const e = error as pg.DatabaseError
  return { error: { severity: e.severity, code: e.code, message: e.message, detail: e.detail, position: e.position } }
}

async function transcript (port: number, user = 'test', password?: string): Promise<unknown[]> {
  const client = new pg.Client({ host: '127.0.0.1', port, user, database: user === 'scram' ? 'scram' : 'test', password })
  await client.connect()
  const out: unknown[] = []
  try {
    for (const step of STEPS) {
      try {
        out.push(outcome(await client.query(step as pg.QueryConfig)))
      } catch (error) {
        out.push(failure(error))
      }
    }
  } finally {
    await client.end()
  }
  return out
}

t.test('the pg driver gets what a real PostgreSQL 15 gives', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  const expected = await transcript(real.port)
  const actual = await transcript(ours)
  t.equal(actual.length, STEPS.length)
  for (let i = 0; i < STEPS.length; i++) t.same(actual[i], expected[i], JSON.stringify(STEPS[i]))
})

t.test('SCRAM-SHA-256 through the pg driver', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  for (const port of [real.port, ours]) {
    const ok = new pg.Client({ host: '127.0.0.1', port, user: 'scram', database: 'scram', password: 'secret' })
    await ok.connect()
    t.same((await ok.query('SELECT 1 AS n')).rows, [{ n: 1 }])
    await ok.end()
  }
  const refused: unknown[] = []
  for (const port of [real.port, ours]) {
    const bad = new pg.Client({ host: '127.0.0.1', port, user: 'scram', database: 'scram', password: 'nope' })
    refused.push(await bad.connect().then(() => 'connected', failure))
    await bad.end().catch(() => {})
  }
  t.same(refused[1], refused[0])
  t.match(refused[1], { error: { code: '28P01' } })
})
