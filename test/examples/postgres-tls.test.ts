/**
 * TLS on the postgres example, judged by psql: an SSLRequest is answered
 * `S` and the session continues in TLS (sslmode=verify-ca against the
 * test CA); a client that will not encrypt is refused 28000, as a
 * `hostssl`-only PostgreSQL refuses it; a CancelRequest sent in the clear
 * still cancels; data pipelined behind an SSLRequest is refused with
 * PostgreSQL's FATAL before any TLS.
 */
import t from 'tap'
import { spawnSync } from 'node:child_process'
import pg from 'pg'
import { withCerts } from '../helpers/tls-certs.js'
import { run, startExample } from '../helpers/postgres-example.js'
import { packet, query, RawConnection, SSL_REQUEST, startup } from '../helpers/pg-raw.js'

const int32 = (n: number): Buffer => { const b = Buffer.alloc(4); b.writeInt32BE(n); return b }

const noPsql = spawnSync('psql', ['--version']).status === 0 ? false : 'psql is not installed (apt-get install postgresql-client)'

t.test('psql over TLS', { skip: noPsql, timeout: 60_000 }, (t) => {
  withCerts(t, (certs) => {
    t.test('sslmode=verify-ca queries; sslmode=disable is refused', async (t) => {
      const port = await startExample(t, { tls: { cert: certs.serverCert, key: certs.serverKey } })
      const conn = (mode: string): string => `host=127.0.0.1 port=${port} user=test dbname=test sslmode=${mode} sslrootcert=${certs.files.ca}`
      const secure = await run('psql', ['-X', conn('verify-ca'), '-c', 'SELECT 1 AS tls', '-c', 'INSERT INTO kv VALUES (\'t\', \'1\')', '-c', 'SELECT v FROM kv WHERE k = \'t\''])
      t.equal(secure.code, 0)
      t.equal(secure.output, ' tls \n-----\n   1\n(1 row)\n\nINSERT 0 1\n v \n---\n 1\n(1 row)\n\n')
      const plain = await run('psql', ['-X', conn('disable'), '-c', 'SELECT 1'])
      t.equal(plain.code, 2)
      t.match(plain.output, /FATAL: {2}no pg_hba.conf entry for host "127.0.0.1", no encryption/)
    })
    t.test('a CancelRequest in the clear cancels a sleep in a TLS session', async (t) => {
      const port = await startExample(t, { tls: { cert: certs.serverCert, key: certs.serverKey } })
      const client = new pg.Client({ host: '127.0.0.1', port, user: 'test', database: 'test', ssl: { ca: certs.ca, servername: 'localhost', checkServerIdentity: () => undefined } })
      await client.connect()
      const keys = client as unknown as { processID: number, secretKey: number }
      const sleeping = client.query('SELECT pg_sleep(30)').then(() => 'finished', (error: pg.DatabaseError) => `${error.code} ${error.message}`)
      await new Promise(resolve => setTimeout(resolve, 200))
      const canceller = new RawConnection(port)
      await canceller.ready()
      canceller.write(packet(80877102, Buffer.concat([int32(keys.processID), int32(keys.secretKey)])))
      await canceller.closed
      t.equal(canceller.received.length, 0, 'the cancel connection is closed without a reply')
      t.equal(await sleeping, '57014 canceling statement due to user request')
      t.same((await client.query('SELECT 1 AS n')).rows, [{ n: 1 }], 'the session goes on')
      await client.end()
      // A plain start-up (no SSLRequest) gets the refusal, then the close.
      const plain = new RawConnection(port)
      await plain.ready()
      plain.write(startup(), query('SELECT 1'))
      const messages = await plain.until(() => false, 1000)
      t.match(messages, [/^E S=FATAL V=FATAL C=28000/])
      plain.end()
    })
    t.test('data pipelined after an SSLRequest is refused before any TLS, as without TLS (CVE-2021-23214)', async (t) => {
      const port = await startExample(t, { tls: { cert: certs.serverCert, key: certs.serverKey } })
      const conn = new RawConnection(port)
      await conn.ready()
      conn.write(Buffer.concat([SSL_REQUEST, startup()]))
      const messages = await conn.until(() => false, 1500)
      t.equal(conn.received[0], 0x45, 'no S: the answer is the ErrorResponse')
      t.same(messages, ['E S=FATAL V=FATAL C=08P01 M=received unencrypted data after SSL request D=This could be either a client-software bug or evidence of an attempted man-in-the-middle attack.'])
      t.ok(conn.socket.readableEnded || conn.socket.destroyed, 'closed')
      conn.end()
    })
    t.end()
  })
})
