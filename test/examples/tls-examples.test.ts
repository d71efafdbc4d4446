// The memcached and redis examples with --tls-cert/--tls-key (and
// --tls-ca, --tls-require-client-cert), run as programs: their clients
// (examples/*/client.ts) pass `tls` through, and the real redis-cli
// connects with --tls when it is installed (skipped, saying so, when not).
// Certificates are made by openssl in a temporary directory.
import t from 'tap'
import { spawnSync, execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { startListening } from '../helpers/listening-child.js'
import { stopChild } from '../helpers/real-servers.js'
import { withCerts, type TestCerts } from '../helpers/tls-certs.js'
import { RedisClient } from '../../examples/redis/client.js'
import { MemcachedClient } from '../../examples/memcached/client.js'

const redisMain = fileURLToPath(new URL('../../examples/redis/main.ts', import.meta.url))
const memcachedMain = fileURLToPath(new URL('../../examples/memcached/main.ts', import.meta.url))
const cli = spawnSync('sh', ['-c', 'command -v redis-cli'], { encoding: 'utf8' }).stdout.trim()
const cliHasTls = cli !== '' && spawnSync(cli, ['--help'], { encoding: 'utf8' }).stdout.includes('--tls')

function redisCli (args: string[]): Promise<{ code: number, out: string }> {
  return new Promise((resolve) => {
    execFile(cli, args, { timeout: 10_000 }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, out: `${stdout}${stderr}` })
    })
  })
}

withCerts(t, tests)

function tests (certs: TestCerts): void {
  const serverFlags = ['--port', '0', '--tls-cert', certs.files.serverCert, '--tls-key', certs.files.serverKey]

  t.test('redis example over TLS: RedisClient and redis-cli --tls', async t => {
    const { child, port } = await startListening(t, redisMain, serverFlags)
    t.teardown(async () => { await stopChild(child) })
    const redis = new RedisClient({ endpoint: `127.0.0.1:${port}`, tls: { ca: certs.ca } })
    t.teardown(() => redis.close())
    t.equal(await redis.set('greeting', 'hello over tls'), 'OK')
    t.equal((await redis.get('greeting'))?.toString(), 'hello over tls')
    if (!cliHasTls) {
      t.comment(cli === '' ? 'redis-cli missing: skipping its TLS check' : 'this redis-cli has no --tls: skipping its TLS check')
      return
    }
    const ping = await redisCli(['--tls', '--cacert', certs.files.ca, '-h', '127.0.0.1', '-p', String(port), 'ping'])
    t.equal(ping.out.trim(), 'PONG', 'redis-cli --tls --cacert CA ping')
    const get = await redisCli(['--tls', '--cacert', certs.files.ca, '-h', '127.0.0.1', '-p', String(port), 'get', 'greeting'])
    t.equal(get.out.trim(), 'hello over tls')
  })

  t.test('redis example with --tls-require-client-cert', async t => {
    const { child, port } = await startListening(t, redisMain, [...serverFlags, '--tls-ca', certs.files.ca, '--tls-require-client-cert'])
    t.teardown(async () => { await stopChild(child) })
    const anonymous = new RedisClient({ endpoint: `127.0.0.1:${port}`, tls: { ca: certs.ca }, retry: false })
    t.teardown(() => anonymous.close())
    const err = await anonymous.command('PING').then(() => null, (e: unknown) => e)
    t.ok(err instanceof RpcError && err.code === ErrorCode.CONNECT_FAILED, 'no client certificate: CONNECT_FAILED')
    const known = new RedisClient({ endpoint: `127.0.0.1:${port}`, tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } })
    t.teardown(() => known.close())
    t.equal(await known.command('PING'), 'PONG')
    if (cliHasTls) {
      const ping = await redisCli(['--tls', '--cacert', certs.files.ca, '--cert', certs.files.clientCert, '--key', certs.files.clientKey, '-h', '127.0.0.1', '-p', String(port), 'ping'])
      t.equal(ping.out.trim(), 'PONG', 'redis-cli with its certificate')
    }
  })

  t.test('memcached example over TLS: MemcachedClient', async t => {
    const { child, port } = await startListening(t, memcachedMain, serverFlags)
    t.teardown(async () => { await stopChild(child) })
    const mc = new MemcachedClient({ endpoint: `127.0.0.1:${port}`, tls: { ca: certs.ca } })
    t.teardown(() => mc.close())
    await mc.set('k', 'over tls')
    t.equal((await mc.get('k'))?.value.toString(), 'over tls')
  })

  t.test('half the TLS flags: the example says what is missing and exits', async t => {
    // Asynchronous, not spawnSync: on Node 26 a spawnSync'd child under tap's process hooks once
    // never returned, blocking this file until tap killed it.
    const run = await new Promise<{ code: number | null, stderr: string }>((resolve) => {
      execFile(process.execPath, [...process.execArgv.filter(a => a.includes('@tapjs/typescript')), redisMain, '--port', '0', '--tls-cert', certs.files.serverCert],
        { encoding: 'utf8', timeout: 60_000, killSignal: 'SIGKILL' },
        (err, _stdout, stderr) => resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : null, stderr }))
    })
    t.equal(run.code, 1)
    t.match(run.stderr, /--tls-cert and --tls-key go together/)
  })
}
