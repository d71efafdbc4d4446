/**
 * psql against the postgres example and against a real PostgreSQL 15, the
 * transcripts diffed: queries, errors (with their LINE and caret),
 * transactions, several -c statements in one session, SCRAM logins.
 */
import t from 'tap'
import { realPostgres, realPostgresMissing } from '../helpers/real-postgres.js'
import { psql, startExample } from '../helpers/postgres-example.js'

// Each entry is one psql invocation: its -c commands, in order, in one session.
const SESSIONS: string[][] = [
  ['SELECT 1'],
  ['SELECT 1 AS one, \'x\' AS two, 2 + 3 AS five'],
  ['SELECT \'abc\'::text, 42::int, \'7\'::int + 1, 1::int8 + 2'],
  ['SELECT \'12\'::int4 + 30::integer AS n, 5::bigint'],
  ['SELECT \'x\'::int'],
  ['SELECT 2147483647 + 1'],
  ['SELECT NULL'],
  ['SELECT 1; SELECT 2'],
  ['INSERT INTO kv (k, v) VALUES (\'a\', \'1\'), (\'b\', \'2\')'],
  ['INSERT INTO kv (k, v) VALUES (\'a\', \'dup\')'],
  ['SELECT k, v FROM kv ORDER BY k', 'SELECT v FROM kv WHERE k = \'b\'', 'SELECT v FROM kv WHERE k = \'zzz\''],
  ['UPDATE kv SET v = \'bb\' WHERE k = \'b\'', 'UPDATE kv SET v = \'bb\' WHERE k = \'nope\''],
  ['BEGIN; INSERT INTO kv VALUES (\'c\', \'3\'); SELECT k, v FROM kv ORDER BY k; ROLLBACK', 'SELECT k, v FROM kv ORDER BY k'],
  ['BEGIN', 'INSERT INTO kv VALUES (\'c\', \'3\')', 'SELECT k, v FROM kv ORDER BY k', 'COMMIT', 'SELECT k, v FROM kv ORDER BY k'],
  ['BEGIN', 'SELECT \'x\'::int', 'SELECT 1', 'COMMIT'],
  ['BEGIN; SELECT \'x\'::int; SELECT 1; COMMIT'],
  ['COMMIT', 'ROLLBACK', 'BEGIN; BEGIN; COMMIT'],
  ['INSERT INTO kv VALUES (\'d\', \'4\'); SELECT \'bad\'::int', 'SELECT v FROM kv WHERE k = \'d\''],
  ['foo', 'SELECT 1 +', 'INSERT INTO nowhere', 'select 1 as "Mixed Case"'],
  ['SELECT pg_sleep(0.05)', 'SELECT pg_sleep(0.01) AS slept, 1 AS n'],
  ['INSERT INTO kv VALUES (NULL, \'x\')'],
  ['DELETE FROM kv WHERE k = \'a\'', 'DELETE FROM kv', 'SELECT k, v FROM kv ORDER BY k'],
  [';', ''],
  ['SELECT 1', 'SELECT \'one\' AS a', 'INSERT INTO kv VALUES (\'p\', \'q\')', 'SELECT * FROM kv', 'DELETE FROM kv']
]

const missing = realPostgresMissing() ?? false

t.test('psql transcripts match a real PostgreSQL 15', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  for (const commands of SESSIONS) {
    const expected = await psql(real.port, commands)
    const actual = await psql(ours, commands)
    t.equal(actual, expected, commands.join(' | '))
  }
  // Expanded and unaligned output, and ON_ERROR_STOP: psql's own rendering over the same answers.
  for (const extra of [['-x'], ['-A', '-t'], ['-v', 'ON_ERROR_STOP=1']]) {
    const commands = ['SELECT 1 AS a, \'b\' AS b', 'foo', 'SELECT 2']
    t.equal(await psql(ours, commands, 'test', undefined, extra), await psql(real.port, commands, 'test', undefined, extra), extra.join(' '))
  }
})

t.test('SCRAM-SHA-256 logins through psql match a real PostgreSQL 15', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  const good = ['SELECT 1 AS logged_in']
  t.equal(await psql(ours, good, 'scram', 'secret'), await psql(real.port, good, 'scram', 'secret'), 'right password')
  const wrong = (await psql(ours, good, 'scram', 'wrong')).replaceAll(String(ours), 'PORT')
  t.equal(wrong, (await psql(real.port, good, 'scram', 'wrong')).replaceAll(String(real.port), 'PORT'), 'wrong password')
  t.match(wrong, /password authentication failed for user "scram"/)
})
