// KRPC TLS against a peer that is not nyala: test/helpers/kudu-tls-peer.c,
// a C client and server written after Kudu's negotiation code (OpenSSL on
// memory BIOs for the handshake, each TLS_HANDSHAKE token what
// SSL_do_handshake left in the write BIO, then SSL_set_fd; TLS 1.3's last
// server bytes written raw before the first encrypted ones). Kudu's client
// with encryption required calls nyala's server, and nyala's client calls
// the Kudu-style server, with TLS 1.3 and 1.2, with TLS that only
// authenticates on loopback, and with certificate authentication. The peer
// is compiled with cc and OpenSSL's headers (.ci/run installs gcc and
// libssl-dev).
import t, { type Test } from 'tap'
import { execFile, spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { runCli, waitForOutput } from '../helpers/cli-cases.js'
import { CalculatorService, calculatorHandlers, newClient, startServer } from '../helpers/reactor-harness.js'
import { haveOpenssl, makeCerts, type TestCerts } from '../helpers/tls-certs.js'

const SOURCE = fileURLToPath(new URL('../helpers/kudu-tls-peer.c', import.meta.url))

function run (file: string, args: string[]): Promise<{ code: number, stdout: string, stderr: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 20_000 }, (error, stdout, stderr) => {
      resolve({ code: error === null ? 0 : typeof error.code === 'number' ? error.code : 1, stdout, stderr })
    })
  })
}

const dir = mkdtempSync(join(tmpdir(), 'nyala-kudu-peer-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
const peer = join(dir, 'kudu-tls-peer')
const built = await run('cc', ['-O1', '-o', peer, SOURCE, '-lssl', '-lcrypto'])
if (built.code !== 0 || !haveOpenssl()) {
  t.plan(0, `skip: cannot build the peer (cc with OpenSSL's headers: apt-get install gcc libssl-dev): ${built.stderr.split('\n')[0] ?? ''}`)
} else {
  const certs = makeCerts()
  t.teardown(() => certs.remove())
  tests(certs)
}

function tests (certs: TestCerts): void {
  const f = certs.files
  const users: string[] = []
  const handlers = { ...calculatorHandlers, Add: (req: { x: number, y: number }, ctx: { user: string }) => { users.push(ctx.user); return { result: req.x + req.y } } }

  t.test('Kudu\'s client with encryption required calls nyala serve', async t => {
    const { port } = await startServer(t, { idleTimeoutMs: 0, logger: null, handlers: handlers as never, tls: { cert: certs.serverCert, key: certs.serverKey, ca: certs.ca }, requireTls: true })
    const cases: Array<[string, string[], string, string]> = [
      ['TLS 1.3', [], 'tls=TLSv1.3', 'kudu'],
      ['TLS 1.2', ['--tls12'], 'tls=TLSv1.2', 'kudu'],
      ['server certificate checked', ['--ca', f.ca], 'tls=TLSv1.3', 'kudu'],
      ['loopback: TLS only authenticates', ['--loopback'], 'tls=plain', 'kudu'],
      ['certificate authentication', ['--cert-authn', '--cert', f.clientCert, '--key', f.clientKey, '--ca', f.ca], 'tls=TLSv1.3', 'alice'],
      ['certificate authentication, TLS 1.2', ['--cert-authn', '--cert', f.clientCert, '--key', f.clientKey, '--tls12'], 'tls=TLSv1.2', 'alice'],
      ['SASL PLAIN user', ['--user', 'kudu-user', '--password', 'pw'], 'tls=TLSv1.3', 'kudu-user']
    ]
    for (const [name, args, tls, user] of cases) {
      users.length = 0
      const r = await run(peer, ['client', '127.0.0.1', String(port), ...args])
      t.equal(r.code, 0, `${name}: ${r.stderr}`)
      t.equal(r.stdout, `result=42 ${tls}\n`, name)
      t.same(users, [user], `${name}: ctx.user`)
    }
  })

  t.test('a client that sends SASL, the context and a call in one TLS record, to an asynchronous authenticator', async t => {
    // The authenticator's step holds what TLS decrypted after SASL_INITIATE until it is answered.
    const { port } = await startServer(t, {
      idleTimeoutMs: 0,
      logger: null,
      handlers: handlers as never,
      tls: { cert: certs.serverCert, key: certs.serverKey },
      authenticate: async (user, password) => { await new Promise(resolve => setTimeout(resolve, 5)); return user === 'kudu' && password === 'pw' }
    })
    for (const args of [[], ['--tls12'], ['--loopback']]) {
      users.length = 0
      const r = await run(peer, ['client', '127.0.0.1', String(port), '--pipeline', '--password', 'pw', ...args])
      t.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`)
      t.match(r.stdout, /^result=42 /)
      t.same(users, ['kudu'])
    }
    users.length = 0
    const wrong = await run(peer, ['client', '127.0.0.1', String(port), '--pipeline', '--password', 'nope'])
    t.equal(wrong.code, 1)
    t.match(wrong.stderr, /server refused negotiation: .*SASL PLAIN authentication failed/, 'refused, in the server\'s words, through TLS')
    t.same(users, [], 'no call ran')
  })

  t.test('Kudu\'s client with encryption required calls `nyala serve --tls-cert --tls-key --require-tls --reactors 2`', async t => {
    const server = runCli(['serve', '--reactors', '2', '--port', '0', '--tls-cert', f.serverCert, '--tls-key', f.serverKey, '--require-tls'], t)
    const [, endpoint] = await waitForOutput(server, /listening on (127\.0\.0\.1:\d+)/)
    const port = endpoint!.split(':')[1]!
    // Connections spread over both reactors; each one negotiates TLS.
    const runs = await Promise.all(Array.from({ length: 6 }, async (_, i) => await run(peer, ['client', '127.0.0.1', port, ...(i % 2 === 0 ? [] : ['--tls12'])])))
    t.same(runs.map(r => `${r.code} ${r.stdout.trim()}`), runs.map((_, i) => `0 result=42 tls=${i % 2 === 0 ? 'TLSv1.3' : 'TLSv1.2'}`), runs.map(r => r.stderr).join(''))
    server.child.kill('SIGTERM')
    t.equal(await server.exit, 0, server.stderr())
  })

  t.test('Kudu\'s client requiring TLS gives up on a nyala server without it', async t => {
    const { port } = await startServer(t, { idleTimeoutMs: 0, logger: null, handlers: handlers as never })
    const r = await run(peer, ['client', '127.0.0.1', String(port)])
    t.equal(r.code, 1)
    t.match(r.stderr, /server does not support required TLS encryption/)
  })

  async function kuduServer (t: Test, args: string[]): Promise<{ endpoint: string, done: Promise<string> }> {
    const child = spawn(peer, ['server', '0', '--cert', f.serverCert, '--key', f.serverKey, ...args])
    t.teardown(() => { if (child.exitCode === null) child.kill() })
    let out = ''
    let err = ''
    child.stderr.on('data', (c: Buffer) => { err += c.toString() })
    const done = new Promise<string>((resolve) => child.on('exit', () => resolve(out + err)))
    const endpoint = await new Promise<string>((resolve, reject) => {
      child.stdout.on('data', (c: Buffer) => {
        out += c.toString()
        const m = /listening on (127\.0\.0\.1:\d+)/.exec(out)
        if (m !== null) resolve(m[1]!)
      })
      child.on('exit', () => reject(new Error(`the peer exited: ${err}`)))
    })
    return { endpoint, done }
  }

  t.test('nyala\'s client calls a Kudu server with encryption required', async t => {
    const cases: Array<[string, string[], object, string]> = [
      ['TLS 1.3', [], { tls: { ca: certs.ca }, encryptLoopback: true, requireTls: true, user: 'zed' }, 'user=zed tls=TLSv1.3'],
      ['TLS 1.2', ['--tls12'], { tls: { ca: certs.ca }, encryptLoopback: true, requireTls: true, user: 'zed' }, 'user=zed tls=TLSv1.2'],
      ['loopback: TLS only authenticates', ['--loopback'], { tls: { ca: certs.ca }, requireTls: true, user: 'zed' }, 'user=zed tls=plain'],
      ['certificate authentication', ['--cert-authn', '--ca', f.ca], { tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey }, encryptLoopback: true }, 'user=alice tls=TLSv1.3'],
      ['certificate authentication, TLS 1.2', ['--cert-authn', '--ca', f.ca, '--tls12'], { tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey }, encryptLoopback: true }, 'user=alice tls=TLSv1.2']
    ]
    for (const [name, args, options, said] of cases) {
      const server = await kuduServer(t, args)
      const client = newClient(t, { endpoint: server.endpoint, retry: false, logger: null, ...options })
      t.same(await client.service(CalculatorService).Add({ x: 40, y: 2 }), { result: 42 }, name)
      client.close()
      t.equal((await server.done).trim().split('\n').pop(), said, `${name}: what the server saw`)
    }
  })
}
