// The real redis-cli (redis-tools) drives the redis example through a
// scripted session, one command per line on stdin; the same script runs
// against a real redis-server, which is the judge: both outputs must be
// the same, byte for byte. redis-cli asks `COMMAND DOCS` first, so the
// session also shows that it starts without errors. Skipped, saying so,
// when redis-cli or redis-server is missing.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { startListening } from '../helpers/listening-child.js'
import { realRedis, stopChild } from '../helpers/real-servers.js'

const which = (tool: string): string => spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim()
const cli = which('redis-cli')
const redisServer = which('redis-server')
const main = fileURLToPath(new URL('../../examples/redis/main.ts', import.meta.url))

// Deterministic on both servers: no KEYS or SMEMBERS of several members
// (hash-table order), no INFO, HELLO or CLIENT ID (server-specific), TTLs
// long enough that no second passes between SET and TTL.
const SCRIPT = `PING
PING "hello world"
ECHO 'it\\'s'
SET greeting hello
GET greeting
SET greeting world NX
SET greeting again XX GET
GETSET greeting last
APPEND greeting !
STRLEN greeting
GET missing
SET counter 41
INCR counter
INCRBY counter 100
DECR counter
DECRBY counter 40
INCR greeting
INCRBY counter 1.5
MSET a 1 b 2 c 3
MGET a b missing c
EXISTS a b missing
DEL a b missing
TYPE c
TYPE missing
SET session abc EX 1000
TTL session
PTTL missing
TTL c
EXPIRE c 500
TTL c
PERSIST c
TTL c
EXPIRE c 100 NX
EXPIRE c 200 XX
RPUSH list a b c
LPUSH list z
LRANGE list 0 -1
LRANGE list 1 -2
LLEN list
LPOP list
RPOP list 2
LPOP missing
LPUSH greeting x
SADD set one
SADD set one
SCARD set
SMEMBERS set
SPOP set
SPOP set
SCARD set
HSET hash name redis kind store
HSET hash name nyala
HGET hash name
HGET hash missing
HGETALL hash
HDEL hash kind missing
HGETALL hash
ZADD scores 1 alice 2.5 bob 0.1 carol
ZADD scores CH 3 alice
ZADD scores nan dave
ZCARD scores
ZRANGE scores 0 -1 WITHSCORES
ZRANGE scores 0 0 REV
ZPOPMIN scores
ZPOPMIN scores 5
ZCARD scores
SELECT 0
SELECT 3
CLIENT SETNAME tester
CLIENT GETNAME
CONFIG GET appendonly
NOSUCHCOMMAND with args
GET
SET k v EX notanumber
SET k v BADOPTION
HSET hash field
DBSIZE
FLUSHDB
DBSIZE
`

function session (port: number, flags: string[]): { stdout: string, stderr: string, status: number | null } {
  const run = spawnSync(cli, ['-p', String(port), ...flags], { input: SCRIPT, encoding: 'latin1', timeout: 30_000 })
  return { stdout: run.stdout, stderr: run.stderr, status: run.status }
}

const missing = cli === '' ? 'redis-cli is not installed (apt-get install redis-tools)' : redisServer === '' ? 'redis-server is not installed (apt-get install redis-server)' : false

t.test('a redis-cli session: the example answers as redis-server does', { skip: missing, timeout: 120_000 }, async (t) => {
  const { child: example, port } = await startListening(t, main, ['--port', '0'])
  const { child: real, port: realPort } = await realRedis(t, redisServer, ['--databases', '1'])

  for (const flags of [['--no-raw'], ['--raw']]) {
    const mine = session(port, flags)
    const theirs = session(realPort, flags)
    t.equal(theirs.status, 0, `redis-cli ${flags.join(' ')} against redis-server exits 0`)
    t.equal(mine.status, 0, `redis-cli ${flags.join(' ')} against the example exits 0`)
    t.equal(mine.stderr, '', 'nothing on stderr (COMMAND DOCS answered)')
    t.ok(theirs.stdout.split('\n').length > 80, 'the session ran')
    t.equal(mine.stdout, theirs.stdout, `redis-cli ${flags.join(' ')}: the same output`)
  }
  // Spot checks of what the judge said, so a change in both would show.
  const formatted = session(port, ['--no-raw']).stdout
  t.match(formatted, /\(error\) WRONGTYPE Operation against a key holding the wrong kind of value/)
  t.match(formatted, /\(error\) ERR unknown command 'NOSUCHCOMMAND', with args beginning with: 'with' 'args' /)
  t.match(formatted, /"0.10000000000000001"/)

  t.equal(await stopChild(example), 0, 'the example drains and exits 0 on SIGTERM')
  await stopChild(real)
})
