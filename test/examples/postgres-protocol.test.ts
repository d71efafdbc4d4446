/**
 * Raw protocol v3 exchanges with the postgres example and a real
 * PostgreSQL 15, diffed message by message: bad input (garbage first
 * bytes, bad lengths, unknown message types, data pipelined after an
 * SSLRequest), the extended protocol's skip to Sync after an error,
 * Describe, portals, and a CancelRequest interrupting a pg_sleep. Also the
 * session order: a pipelined INSERT behind a pg_sleep runs after it, and
 * sleeping sessions hold up no other.
 */
import t from 'tap'
import { realPostgres, realPostgresMissing } from '../helpers/real-postgres.js'
import { startExample } from '../helpers/postgres-example.js'
import { postgresServer } from '../../examples/postgres/main.js'
import { message, packet, query, RawConnection, SSL_REQUEST, startup, sync } from '../helpers/pg-raw.js'

const missing = realPostgresMissing() ?? false

const i16 = (n: number): Buffer => { const b = Buffer.alloc(2); b.writeInt16BE(n); return b }
const i32 = (n: number): Buffer => { const b = Buffer.alloc(4); b.writeInt32BE(n); return b }
const cstr = (s: string): Buffer => Buffer.from(`${s}\0`)
const parseMsg = (name: string, sql: string, oids: number[] = []): Buffer => message('P', Buffer.concat([cstr(name), cstr(sql), i16(oids.length), ...oids.map(i32)]))
const bind = (portal: string, statement: string, params: Array<Buffer | null>, paramFormats: number[] = [], resultFormats: number[] = []): Buffer => message('B', Buffer.concat([
  cstr(portal), cstr(statement), i16(paramFormats.length), ...paramFormats.map(i16), i16(params.length),
  ...params.map(p => p === null ? i32(-1) : Buffer.concat([i32(p.length), p])), i16(resultFormats.length), ...resultFormats.map(i16)
]))
const describe = (what: 'S' | 'P', name: string): Buffer => message('D', Buffer.concat([Buffer.from(what), cstr(name)]))
const execute = (portal: string, maxRows = 0): Buffer => message('E', Buffer.concat([cstr(portal), i32(maxRows)]))
const close = (what: 'S' | 'P', name: string): Buffer => message('C', Buffer.concat([Buffer.from(what), cstr(name)]))
const readyCount = (n: number) => (messages: string[]): boolean => messages.filter(m => m.startsWith('Z ')).length >= n

// `answered`: the first buffer's answer is awaited before the rest is sent, as a client does
// after an SSLRequest. Without it, whether the bytes behind the SSLRequest are already in the
// server's buffer when it answers depends on timing, and both servers judge by that.
interface Case { name: string, send: Buffer[], wait?: (messages: string[]) => boolean, answered?: boolean }

const CASES: Case[] = [
  { name: 'garbage first bytes (an HTTP request)', send: [Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n')] },
  { name: 'a start-up length below 8', send: [Buffer.from([0, 0, 0, 4, 0, 0, 0, 0])] },
  { name: 'a start-up length above 10000', send: [Buffer.from([0, 0, 0x30, 0, 0, 3, 0, 0])] },
  { name: 'data pipelined after SSLRequest (CVE-2021-23214)', send: [Buffer.concat([SSL_REQUEST, startup()])] },
  { name: 'SSLRequest, then a start-up', send: [SSL_REQUEST, startup(), query('SELECT 1')], wait: readyCount(2), answered: true },
  { name: 'protocol 2.0', send: [startup('test', 'test', 0x20000)] },
  { name: 'protocol 4.0', send: [startup('test', 'test', 0x40000)] },
  { name: 'no user', send: [startup('')] },
  { name: 'an unknown message type', send: [startup(), message('y', 'abc')] },
  { name: 'a message length below 4', send: [startup(), Buffer.from([0x51, 0, 0, 0, 2])] },
  { name: 'Terminate', send: [startup(), message('X')] },
  { name: 'several statements in one Query, one failing', send: [startup(), query('SELECT 1 AS a; SELECT \'x\'::int; SELECT 2'), query('SELECT 3')], wait: readyCount(3) },
  { name: 'an empty Query', send: [startup(), query('')], wait: readyCount(2) },
  {
    name: 'skip to Sync after an extended error',
    send: [startup(), bind('', 'nope', []), execute(''), query('SELECT 9'), sync(), parseMsg('', 'SELECT 1 AS x'), bind('', '', []), execute(''), sync()],
    wait: readyCount(3)
  },
  {
    name: 'named statements and portals, Describe, binary parameters and results',
    send: [startup(), parseMsg('s1', 'SELECT $1::int + 1 AS n, $2::text AS t, $3::int8 AS b', [23, 25, 20]), describe('S', 's1'),
      bind('p1', 's1', [i32(41), Buffer.from('hi'), Buffer.from('0000000000000007', 'hex')], [1, 1, 1], [1]), describe('P', 'p1'), execute('p1'),
      bind('p2', 's1', [Buffer.from('1'), Buffer.from('x'), Buffer.from('5')], [0], [0, 1, 1]), execute('p2'),
      close('P', 'p1'), close('S', 's1'), close('S', 'never'), bind('', 's1', []), sync()],
    wait: readyCount(2)
  },
  {
    name: 'one statement described and run in binary, text and the default formats again; negative and non-ASCII values',
    send: [startup(), parseMsg('f', 'SELECT $1::int AS n, \'é日\' AS t, $2 AS s'),
      bind('a', 'f', [Buffer.from('-5'), Buffer.from('ü')], [], [1]), describe('P', 'a'), execute('a'),
      bind('b', 'f', [Buffer.from('-2147483648'), Buffer.from('')], [], [0]), describe('P', 'b'), execute('b'),
      bind('', 'f', [Buffer.from('3'), null]), describe('P', ''), execute(''), describe('S', 'f'), bind('', 'f', [Buffer.from('4'), Buffer.from('z')], [], [1]), describe('P', ''), execute(''), sync()],
    wait: readyCount(2)
  },
  {
    name: 'parameter types inferred, NoData, row limits',
    send: [startup(), parseMsg('ins', 'INSERT INTO kv (k, v) VALUES ($1, $2)'), describe('S', 'ins'), bind('', 'ins', [Buffer.from('r1'), Buffer.from('1')]), execute(''),
      bind('', 'ins', [Buffer.from('r2'), Buffer.from('2')]), execute(''), sync(),
      parseMsg('all', 'SELECT k, v FROM kv ORDER BY k'), bind('c', 'all', []), execute('c', 1), execute('c', 1), execute('c', 1), sync(),
      query('DELETE FROM kv')],
    wait: readyCount(4)
  },
  {
    name: 'errors in Parse and Bind',
    send: [startup(), parseMsg('', 'SELEC 1'), sync(), parseMsg('two', 'SELECT 1; SELECT 2'), sync(), parseMsg('d', 'SELECT 1'), parseMsg('d', 'SELECT 2'), sync(),
      bind('', 'd', [Buffer.from('x')]), sync(), parseMsg('i', 'SELECT $1::int'), bind('', 'i', [Buffer.from('12')], [1]), sync(), bind('', 'i', [Buffer.from('z')]), sync()],
    wait: readyCount(7)
  },
  {
    // Each batch in one write: the example reads the messages up to a Sync or Flush as one call (a group).
    name: 'extended batches in one write: Describe, Flush, an error skipping to Sync, the next batch, a Query behind',
    send: [startup(), Buffer.concat([
      parseMsg('', 'SELECT $1::int AS n'), bind('', '', [Buffer.from('7')]), describe('P', ''), execute(''), message('H'),
      parseMsg('', 'SELECT \'x\'::int'), bind('', '', []), execute(''), describe('S', ''), sync(),
      parseMsg('s', 'SELECT 2 AS two'), describe('S', 's'), bind('', 's', []), execute(''), close('S', 's'), sync(), query('SELECT 3'),
      bind('', 'nope', []), execute(''), sync(), sync()])],
    wait: readyCount(6)
  },
  {
    name: 'transaction status through the extended protocol',
    send: [startup(), parseMsg('', 'BEGIN'), bind('', '', []), execute(''), sync(), parseMsg('', 'SELECT \'q\'::int'), bind('', '', []), execute(''), sync(),
      parseMsg('', 'SELECT 1'), sync(), parseMsg('', 'ROLLBACK'), bind('', '', []), execute(''), sync()],
    wait: readyCount(5)
  }
]

async function exchange (port: number, c: Case): Promise<{ messages: string[], closed: boolean }> {
  const conn = new RawConnection(port)
  await conn.ready()
  const send = [...c.send]
  if (c.answered === true) {
    conn.write(send.shift()!)
    await conn.until((messages) => messages.length > 0, 3000)
  }
  for (const bytes of send) conn.write(bytes)
  const messages = await conn.until(c.wait ?? (() => false), c.wait === undefined ? 1500 : 5000)
  const closed = conn.socket.readableEnded || conn.socket.destroyed
  conn.end()
  return { messages, closed }
}

t.test('raw exchanges answered as a real PostgreSQL 15 answers them', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  for (const c of CASES) {
    const expected = await exchange(real.port, c)
    const actual = await exchange(ours, c)
    t.same(actual, expected, c.name)
  }
})

async function startedConnection (port: number): Promise<{ conn: RawConnection, pid: number, secret: number }> {
  const conn = new RawConnection(port)
  await conn.ready()
  conn.write(startup())
  await conn.until(readyCount(1))
  const at = conn.received.indexOf(Buffer.from([0x4b, 0, 0, 0, 12]))
  return { conn, pid: conn.received.readInt32BE(at + 5), secret: conn.received.readInt32BE(at + 9) }
}

t.test('CancelRequest interrupts a running pg_sleep, as PostgreSQL does', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  const outcomes: string[][] = []
  for (const port of [real.port, ours]) {
    const { conn, pid, secret } = await startedConnection(port)
    conn.received = Buffer.alloc(0)
    conn.write(query('SELECT pg_sleep(30)'), query('SELECT 1 AS after'))
    await new Promise(resolve => setTimeout(resolve, 300))
    // A wrong key cancels nothing; the right one cancels the sleep.
    for (const key of [secret ^ 1, secret]) {
      const canceller = new RawConnection(port)
      await canceller.ready()
      canceller.write(packet(80877102, Buffer.concat([i32(pid), i32(key)])))
      await canceller.closed
      t.equal(canceller.received.length, 0, 'the cancel connection closes without a reply')
      if (key !== secret) await new Promise(resolve => setTimeout(resolve, 200))
    }
    outcomes.push(await conn.until(readyCount(2), 10_000))
    conn.end()
  }
  t.same(outcomes[1], outcomes[0])
  t.match(outcomes[1]![1], /C=57014 M=canceling statement due to user request/)
})

t.test('one session runs its messages in order; sleeping sessions hold up no other', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = await startExample(t)
  for (const port of [real.port, ours]) {
    const sleeper = await startedConnection(port)
    sleeper.conn.write(query('SELECT pg_sleep(0.5)'), query('INSERT INTO kv VALUES (\'order\', \'x\')'))
    const others = await Promise.all(Array.from({ length: 12 }, () => startedConnection(port)))
    for (const other of others) other.conn.write(query('SELECT pg_sleep(1)'))
    const watcher = await startedConnection(port)
    watcher.conn.received = Buffer.alloc(0)
    watcher.conn.write(query('SELECT v FROM kv WHERE k = \'order\''))
    const seen = await watcher.conn.until(readyCount(1))
    t.same(seen, ['T v:25:0', 'C SELECT 0', 'Z I'], `${port === ours ? 'example' : 'postgres'}: the INSERT waits for the sleep before it, and a 14th session is answered while 13 sleep`)
    await sleeper.conn.until(readyCount(3), 5000)
    watcher.conn.received = Buffer.alloc(0)
    watcher.conn.write(query('DELETE FROM kv'))
    t.same(await watcher.conn.until(readyCount(1)), ['C DELETE 1', 'Z I'])
    for (const c of [sleeper.conn, watcher.conn, ...others.map(o => o.conn)]) c.end()
  }
})

t.test('a server shutdown tells an idle session FATAL 57P01 first, as PostgreSQL\'s fast shutdown does', { skip: missing, timeout: 120_000 }, async (t) => {
  const real = await realPostgres(t)
  const ours = postgresServer()
  const port = (await ours.listen(0, '127.0.0.1')).port
  t.teardown(() => ours.close())
  const outcomes: Array<{ messages: string[], closed: boolean }> = []
  for (const [at, stop] of [[real.port, () => { real.child.kill('SIGINT') }], [port, () => { void ours.close() }]] as const) {
    const { conn } = await startedConnection(at)
    conn.received = Buffer.alloc(0)
    stop()
    const messages = await conn.until(() => false, 5000)
    outcomes.push({ messages, closed: conn.socket.readableEnded || conn.socket.destroyed })
    conn.end()
  }
  t.same(outcomes[1], outcomes[0])
  t.match(outcomes[1]!.messages[0], /S=FATAL V=FATAL C=57P01 M=terminating connection due to administrator command/)
  t.equal(outcomes[1]!.closed, true)
})

t.test('extended-query messages that arrive together up to a Sync or Flush are one call', async (t) => {
  const server = postgresServer()
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close())
  const conn = new RawConnection(port)
  t.teardown(() => conn.end())
  await conn.ready()
  conn.write(startup())
  await conn.until(readyCount(1))
  conn.write(parseMsg('s', 'SELECT 1 AS one'), sync())
  await conn.until(readyCount(2))
  const calls = (): number => server.stats().callsReceived
  let before = calls()
  // pgbench's prepared transaction.
  conn.write(bind('', 's', []), execute(''), sync())
  let messages = await conn.until(readyCount(3))
  t.equal(calls() - before, 1, 'Bind, Execute, Sync: one call')
  t.same(messages.slice(-4), ['2', 'D 31', 'C SELECT 1', 'Z I'], 'answered as three messages')
  before = calls()
  conn.write(bind('', 's', []), execute(''), message('H'), sync())
  messages = await conn.until(readyCount(4))
  t.equal(calls() - before, 2, 'Bind, Execute, Flush: one call; the Sync behind it another')
  t.same(messages.slice(-4), ['2', 'D 31', 'C SELECT 1', 'Z I'])
  before = calls()
  conn.write(query('SELECT 2'), bind('', 's', []), query('SELECT 3'))
  messages = await conn.until(readyCount(6))
  t.equal(calls() - before, 3, 'a Query is a call of its own, and a Bind without its Sync too')
})
