/**
 * The security flags of `nyala serve` (--tls-cert, --tls-key, --tls-ca,
 * --require-tls, --require-client-cert, --encrypt-loopback,
 * --password-file) and `nyala call` (--tls, --tls-ca, --tls-cert,
 * --tls-key, --tls-servername, --tls-insecure, --require-tls), run from
 * the TypeScript sources: a flag without the flags it needs, or a file that
 * cannot be read or parsed, is one line and exit 2 before anything listens
 * or connects. Then, in plain text, `nyala serve --reactors 2
 * --password-file F` with `nyala call --user --password`: the right
 * password is answered, a wrong one is refused FATAL_UNAUTHORIZED (exit 1).
 * TLS in negotiation itself is tested elsewhere.
 */
import t, { type Test } from 'tap'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { hashPassword } from '../../reactor/krpc/password-file.js'
import { Client } from '../../reactor/krpc/client.js'
import { RpcError, ErrorCode } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { cliCases, runCli, waitForOutput, type CliRun } from '../helpers/cli-cases.js'
import { haveOpenssl, makeCerts } from '../helpers/tls-certs.js'

t.setTimeout(240_000)

const ADD = 'nyala.demo.CalculatorService.Add'

function tempDir (t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-security-flags-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

t.test('nyala serve and nyala call: security flag errors are one line, exit 2, nothing started', async (t) => {
  const dir = tempDir(t)
  // Contents that are not certificates: every case below fails before they would be used.
  const cert = join(dir, 'cert.pem')
  const key = join(dir, 'key.pem')
  const ca = join(dir, 'ca.pem')
  for (const f of [cert, key, ca]) writeFileSync(f, 'not a certificate\n')
  const missing = join(dir, 'missing.pem')
  const badPasswords = join(dir, 'bad-users.txt')
  writeFileSync(badPasswords, '# users\nalice\n')
  const base = ['serve', '--reactors', '1', '--port', '0']
  const serveCases: Array<[string[], string]> = [
    [['--tls-cert', cert], '--tls-cert and --tls-key go together'],
    [['--tls-key', key], '--tls-cert and --tls-key go together'],
    [['--tls-ca', ca], '--tls-ca needs --tls-cert and --tls-key'],
    [['--require-tls'], '--require-tls needs --tls-cert and --tls-key'],
    [['--require-client-cert', '--tls-ca', ca], '--tls-ca and --require-client-cert need --tls-cert and --tls-key'],
    [['--encrypt-loopback'], '--encrypt-loopback needs --tls-cert and --tls-key'],
    [['--tls-cert', cert, '--tls-key', key, '--require-client-cert'], '--require-client-cert needs --tls-ca (the CA that signs client certificates)'],
    [['--tls-cert', missing, '--tls-key', key], `--tls-cert ${missing}: cannot read it (no such file)`],
    [['--tls-cert', cert, '--tls-key', dir], `--tls-key ${dir}: cannot read it (is a directory)`],
    [['--tls-cert', cert, '--tls-key', key, '--tls-ca', missing], `--tls-ca ${missing}: cannot read it (no such file)`],
    [['--password-file', missing], `cannot read password file ${missing}: ENOENT: no such file or directory, open '${missing}'`],
    [['--password-file', badPasswords], `${badPasswords}:2: expected user:HASH`],
    // With two reactors: refused in this process, before any reactor is started.
    [['--reactors', '2', '--password-file', badPasswords], `${badPasswords}:2: expected user:HASH`]
  ]
  const callBase = ['call', '127.0.0.1:1', ADD, '{"x":1,"y":2}']
  const callCases: Array<[string[], string]> = [
    [['--tls-cert', cert], '--tls-cert and --tls-key go together'],
    [['--tls-key', key, '--tls'], '--tls-cert and --tls-key go together'],
    [['--tls-ca', missing], `--tls-ca ${missing}: cannot read it (no such file)`],
    [['--require-tls', '--tls-cert', cert, '--tls-key', missing], `--tls-key ${missing}: cannot read it (no such file)`],
    [['--tls-servername', ''], '--tls-servername must not be empty']
  ]
  const outcomes = await cliCases(t, [
    ...serveCases.map(([args]) => [...base, ...args]),
    ...callCases.map(([args]) => [...callBase, ...args])
  ])
  for (const [i, [args, message]] of serveCases.entries()) {
    const run = outcomes[i]!
    t.equal(run.code, 2, `serve ${args.join(' ')}: exit 2`)
    t.equal(run.stderr, `nyala serve: ${message}\n`, `serve ${args.join(' ')}: one line`)
    t.notMatch(run.stdout, /listening on/, 'never listening')
  }
  for (const [i, [args, message]] of callCases.entries()) {
    const run = outcomes[serveCases.length + i]!
    t.equal(run.code, 2, `call ${args.join(' ')}: exit 2`)
    t.equal(run.stderr, `nyala call: ${message}\n`, `call ${args.join(' ')}: one line`)
    t.equal(run.stdout, '')
  }
})

type Run = CliRun
const nyala = (t: Test, args: string[]): Run => runCli(args, t)
const waitFor = waitForOutput

t.test('nyala serve --reactors 2 --password-file F; nyala call --user --password: right password answered, wrong refused', async (t) => {
  const dir = tempDir(t)
  const file = join(dir, 'users.txt')
  writeFileSync(file, `# test users\nalice:${await hashPassword('secret', { ln: 12 })}\n`)
  const server = nyala(t, ['serve', '--reactors', '2', '--port', '0', '--password-file', file])
  const [, endpoint] = await waitFor(server, /listening on (127\.0\.0\.1:\d+)/)

  const finished = async (run: Run): Promise<Run> => { await run.exit; return run }
  const [good, wrong, unknown, none] = await Promise.all([
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}', '--user', 'alice', '--password', 'secret'])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}', '--user', 'alice', '--password', 'wrong'])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}', '--user', 'mallory', '--password', 'secret'])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}']))
  ])
  t.equal(good.child.exitCode, 0, good.stderr())
  t.equal(good.stdout(), '{"result": 3}\n')
  for (const [name, run] of [['wrong password', wrong], ['unknown user', unknown], ['no credentials', none]] as const) {
    t.equal(run.child.exitCode, 1, `${name}: exit 1`)
    t.equal(run.stdout(), '', `${name}: nothing printed`)
    t.match(run.stderr(), /^error: FATAL_UNAUTHORIZED: [^\n]*SASL PLAIN authentication failed/, `${name}: ${run.stderr()}`)
  }

  // Both reactors read the file: several connections (spread over them by the kernel) all authenticate.
  const client = new Client({ endpoint: endpoint!, user: 'alice', password: 'secret', connectionsPerEndpoint: 8, logger: null })
  t.teardown(() => client.close())
  const calc = client.service(CalculatorService)
  const results = await Promise.all(Array.from({ length: 32 }, async (_, i) => await calc.Add({ x: i, y: 1 })))
  t.same(results.map((r) => r.result), Array.from({ length: 32 }, (_, i) => i + 1))
  const refused = new Client({ endpoint: endpoint!, user: 'alice', password: 'nope', logger: null })
  t.teardown(() => refused.close())
  const error = await refused.service(CalculatorService).Add({ x: 1, y: 1 }).then(() => null, (e: unknown) => e)
  t.ok(error instanceof RpcError)
  t.equal((error as RpcError).code, ErrorCode.NEGOTIATION_FAILED)
  t.equal((error as RpcError).remote?.code, KrpcCode.FATAL_UNAUTHORIZED)
  client.close()
  refused.close()

  server.child.kill('SIGTERM')
  t.equal(await server.exit, 0, server.stderr())
})

t.test('nyala serve --tls-cert --tls-key --tls-ca --require-tls --encrypt-loopback; nyala call with and without TLS, and by client certificate', { skip: haveOpenssl() ? false : 'the openssl command is missing (apt-get install openssl)' }, async (t) => {
  const certs = makeCerts()
  t.teardown(() => certs.remove())
  const f = certs.files
  const server = nyala(t, ['serve', '--reactors', '1', '--port', '0', '--tls-cert', f.serverCert, '--tls-key', f.serverKey, '--tls-ca', f.ca, '--require-tls', '--encrypt-loopback'])
  const [, endpoint] = await waitFor(server, /listening on (127\.0\.0\.1:\d+)/)
  const finished = async (run: Run): Promise<Run> => { await run.exit; return run }
  const [tls, mtls, plain, wrongCa, insecure] = await Promise.all([
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}', '--tls-ca', f.ca])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":2,"y":2}', '--tls-ca', f.ca, '--tls-cert', f.clientCert, '--tls-key', f.clientKey])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}'])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":1,"y":2}', '--tls-ca', f.otherCa])),
    finished(nyala(t, ['call', endpoint!, ADD, '{"x":3,"y":2}', '--tls-insecure']))
  ])
  t.same([tls.child.exitCode, tls.stdout()], [0, '{"result": 3}\n'], `TLS: ${tls.stderr()}`)
  t.same([mtls.child.exitCode, mtls.stdout()], [0, '{"result": 4}\n'], `client certificate: ${mtls.stderr()}`)
  t.same([insecure.child.exitCode, insecure.stdout()], [0, '{"result": 5}\n'], `unchecked server certificate: ${insecure.stderr()}`)
  t.equal(plain.child.exitCode, 1)
  t.match(plain.stderr(), /FATAL_UNAUTHORIZED: [^\n]*client does not support required TLS encryption/, 'plain text refused')
  t.equal(wrongCa.child.exitCode, 1)
  t.match(wrongCa.stderr(), /TLS handshake failed/, `a server certificate from another CA is refused: ${wrongCa.stderr()}`)
  server.child.kill('SIGTERM')
  t.equal(await server.exit, 0, server.stderr())
})
