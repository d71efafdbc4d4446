/**
 * Password files of scrypt hashes (reactor/krpc/password-file.ts):
 * hashPassword's format; loadPasswordFile's verdicts (the right password,
 * a wrong one, an unknown user), its syntax (comments, blank lines, CRLF)
 * and its refusals, each naming the file and line (bad lines, a user listed
 * twice, parameters out of bounds, a file that cannot be read); a check
 * that leaves the event loop running; and a real Server authenticating a
 * real Client with it.
 */
import t, { type Test } from 'tap'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import { silentLogger } from '../../reactor/index.js'
import { hashPassword, loadPasswordFile } from '../../reactor/krpc/index.js'
import { CalculatorService, Probe, newClient, startServer } from '../helpers/reactor-harness.js'

t.setTimeout(120_000)

// Cheap parameters for most hashes here (1 MiB, about a millisecond); the default's cost is tried once.
const CHEAP = { ln: 10, r: 8, p: 1 }
const SALT = Buffer.alloc(16, 1).toString('base64').replace(/=+$/, '')
const KEY = Buffer.alloc(32, 2).toString('base64').replace(/=+$/, '')

function tempDir (t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-passwords-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

function writeFile (t: Test, text: string): string {
  const file = join(tempDir(t), 'users.txt')
  writeFileSync(file, text)
  return file
}

/** The RpcError loadPasswordFile throws for `text`. */
function refusal (t: Test, text: string): RpcError {
  const file = writeFile(t, text)
  try {
    loadPasswordFile(file)
  } catch (err) {
    if (err instanceof RpcError) return err
    throw err
  }
  throw new Error(`loaded: ${JSON.stringify(text)}`)
}

t.test('hashPassword: $scrypt$ln=15,r=8,p=1$SALT$KEY, a fresh salt each time', async (t) => {
  const hash = await hashPassword('secret')
  const m = /^\$scrypt\$ln=15,r=8,p=1\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)$/.exec(hash)
  t.ok(m, hash)
  t.equal(Buffer.from(m![1]!, 'base64').length, 16, '16-byte salt')
  t.equal(Buffer.from(m![2]!, 'base64').length, 32, '32-byte key')
  t.not(await hashPassword('secret'), hash, 'another salt')
  t.match(await hashPassword('secret', CHEAP), /^\$scrypt\$ln=10,r=8,p=1\$/)
  for (const params of [{ ln: 21 }, { r: 17 }, { p: 5 }, { ln: 0 }, { ln: 20, r: 16 }]) {
    await t.rejects(hashPassword('x', params), { code: ErrorCode.INVALID_ARGUMENT }, `refuses ${JSON.stringify(params)}`)
  }
})

t.test('loadPasswordFile: the right password, a wrong one, an unknown user; comments, blank lines, CRLF', async (t) => {
  const file = writeFile(t, [
    '# users of the demo',
    '',
    `alice:${await hashPassword('secret')}`,
    '   ',
    `  bob:${await hashPassword('hunter2', CHEAP)}\r`,
    '# carol:$scrypt$ln=10,r=8,p=1$x$y is commented out',
    `dave:${await hashPassword('', CHEAP)}`,
    `erin:${await hashPassword('pässwörd ✓', CHEAP)}`
  ].join('\n'))
  const check = loadPasswordFile(file)
  const verdict = check('alice', 'secret')
  t.ok(verdict instanceof Promise, 'a promise: the check runs off the event loop')
  t.equal(await verdict, true, 'alice, right password')
  t.equal(await check('alice', 'Secret'), false, 'alice, wrong password')
  t.equal(await check('alice', ''), false, 'alice, empty password')
  t.equal(await check('bob', 'hunter2'), true, 'bob (leading spaces and CRLF trimmed)')
  t.equal(await check('bob', 'secret'), false, "bob with alice's password")
  t.equal(await check('carol', 'anything'), false, 'a commented-out user is unknown')
  t.equal(await check('mallory', 'secret'), false, 'an unknown user')
  t.equal(await check('', ''), false, 'an empty user')
  t.equal(await check('dave', ''), true, 'an empty password, hashed')
  t.equal(await check('erin', 'pässwörd ✓'), true, 'UTF-8')
  t.equal(await check('erin', 'passwörd ✓'), false)
  t.equal(await check('__proto__', 'x'), false, 'no prototype lookups')
})

t.test('a check leaves the event loop running (scrypt on the thread pool)', async (t) => {
  const check = loadPasswordFile(writeFile(t, `alice:${await hashPassword('secret')}\n`))
  let ticks = 0
  let done = false
  const spin = (): void => { if (!done) { ticks++; setImmediate(spin) } }
  setImmediate(spin)
  const ok = await check('alice', 'secret')
  done = true
  t.equal(ok, true)
  t.ok(ticks > 0, `the loop turned ${ticks} times during one check`)
})

t.test('an unknown user is checked against a dummy hash of the same cost (its time says nothing)', async (t) => {
  // Not a timing measurement (that would be flaky): with the file's only
  // hash at ln=15, an unknown user's check takes the same tens of
  // milliseconds as a known one's, not microseconds.
  const check = loadPasswordFile(writeFile(t, `alice:${await hashPassword('secret')}\n`))
  await check('alice', 'warm-up')
  let started = process.hrtime.bigint()
  await check('alice', 'wrong')
  const known = Number(process.hrtime.bigint() - started) / 1e6
  started = process.hrtime.bigint()
  t.equal(await check('nobody', 'wrong'), false)
  const unknown = Number(process.hrtime.bigint() - started) / 1e6
  t.ok(unknown > known / 10, `unknown user ${unknown.toFixed(1)} ms, known ${known.toFixed(1)} ms`)
})

t.test('checks are bounded: maxRunning at once, maxWaiting waiting, the rest refused at once', async (t) => {
  const file = writeFile(t, `alice:${await hashPassword('secret', CHEAP)}\n`)
  const check = loadPasswordFile(file, { maxRunning: 2, maxWaiting: 3 })
  // 2 run, 3 wait, 5 are refused without a derivation; every one settles.
  const verdicts = await Promise.all(Array.from({ length: 10 }, async () => await check('alice', 'secret')))
  t.same([verdicts.filter(v => v).length, verdicts.filter(v => !v).length], [5, 5])
  t.same(verdicts.slice(5), [false, false, false, false, false], 'the ones over the bound')
  t.equal(await check('alice', 'secret'), true, 'the slots were given back')
  t.throws(() => loadPasswordFile(file, { maxRunning: 0 }), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => loadPasswordFile(file, { maxWaiting: -1 }), { code: ErrorCode.INVALID_ARGUMENT })
})

t.test('bad lines are refused with the file and line number', async (t) => {
  const good = `$scrypt$ln=10,r=8,p=1$${SALT}$${KEY}`
  const cases: Array<[string, number, RegExp]> = [
    ['alice', 1, /expected user:HASH/],
    [`# c\n\n:${good}`, 3, /the user name is empty/],
    [`alice:${good}\nbob:plaintext`, 2, /user 'bob': expected \$scrypt\$ln=L,r=R,p=P\$SALT\$KEY/],
    [`alice:$argon2id$v=19$m=65536,t=3,p=4$${SALT}$${KEY}`, 1, /expected \$scrypt\$/],
    [`alice:$scrypt$ln=10,r=8$${SALT}$${KEY}`, 1, /expected the parameters as ln=L,r=R,p=P, got 'ln=10,r=8'/],
    [`alice:$scrypt$N=1024,r=8,p=1$${SALT}$${KEY}`, 1, /expected the parameters/],
    [`alice:$scrypt$ln=10,r=8,p=1$${SALT}$${KEY}$extra`, 1, /expected \$scrypt\$/],
    [`alice:$scrypt$ln=10,r=8,p=1$not*base64$${KEY}`, 1, /the salt is not base64/],
    [`alice:$scrypt$ln=10,r=8,p=1$${SALT}$`, 1, /expected \$scrypt\$|the key is not base64/],
    [`alice:$scrypt$ln=10,r=8,p=1$AAAA$${KEY}`, 1, /the salt has 3 bytes \(8 to 64\)/],
    [`alice:$scrypt$ln=10,r=8,p=1$${SALT}$AAAAAAAA`, 1, /the key has 6 bytes \(16 to 64\)/],
    [`alice:${good}\nbob:${good}\n\nalice:${good}`, 4, /user 'alice' is listed twice/]
  ]
  for (const [text, line, problem] of cases) {
    const file = writeFile(t, text)
    const error = t.throws(() => loadPasswordFile(file), `refused: ${JSON.stringify(text)}`) as RpcError
    t.ok(error instanceof RpcError, 'an RpcError')
    t.equal(error.code, ErrorCode.INVALID_ARGUMENT)
    t.ok(error.message.startsWith(`${file}:${line}: `), `names ${file}:${line}: ${error.message}`)
    t.match(error.message, problem)
  }
})

t.test('parameters out of bounds are refused, so no line makes a check take gigabytes', async (t) => {
  const cases: Array<[string, RegExp]> = [
    ['ln=21,r=8,p=1', /ln=21 is out of bounds \(1 to 20\)/],
    ['ln=0,r=8,p=1', /ln=0 is out of bounds/],
    ['ln=10,r=17,p=1', /r=17 is out of bounds \(1 to 16\)/],
    ['ln=10,r=0,p=1', /r=0 is out of bounds/],
    ['ln=10,r=8,p=5', /p=5 is out of bounds \(1 to 4\)/],
    ['ln=20,r=16,p=1', /needs 2048 MiB per check \(at most 256 MiB\)/],
    ['ln=18,r=16,p=4', /needs 512 MiB per check/],
    ['ln=9999,r=8,p=1', /expected the parameters/]
  ]
  for (const [params, problem] of cases) {
    const error = refusal(t, `# one user\nalice:$scrypt$${params}$${SALT}$${KEY}\n`)
    t.equal(error.code, ErrorCode.INVALID_ARGUMENT)
    t.match(error.message, /:2: user 'alice': /, error.message)
    t.match(error.message, problem)
  }
  // At the bounds: accepted (and not run here).
  for (const params of ['ln=20,r=2,p=4', 'ln=17,r=16,p=1', 'ln=1,r=1,p=1']) {
    t.doesNotThrow(() => loadPasswordFile(writeFile(t, `alice:$scrypt$${params}$${SALT}$${KEY}\n`)), params)
  }
})

t.test('a file that cannot be read, and an empty one', async (t) => {
  const missing = join(tempDir(t), 'no-such-file')
  const error = t.throws(() => loadPasswordFile(missing)) as RpcError
  t.ok(error instanceof RpcError)
  t.equal(error.code, ErrorCode.INVALID_ARGUMENT)
  t.match(error.message, `cannot read password file ${missing}`)
  t.match(error.message, /ENOENT/)
  // An empty file is no user: every check fails (still running scrypt).
  const none = loadPasswordFile(writeFile(t, '# nobody yet\n'))
  t.equal(await none('alice', ''), false)
})

t.test('a Server with authenticate: loadPasswordFile(file): the right password is served, a wrong one refused FATAL_UNAUTHORIZED', async (t) => {
  const file = writeFile(t, `alice:${await hashPassword('secret', CHEAP)}\nbob:${await hashPassword('hunter2', CHEAP)}\n`)
  const probe = new Probe()
  const running = await startServer(t, { authenticate: loadPasswordFile(file), handlers: probe.handlers(), logger: silentLogger })
  const alice = newClient(t, { endpoint: running.endpoint, user: 'alice', password: 'secret' })
  t.same(await alice.service(CalculatorService).Add({ x: 1, y: 2 }), { result: 3 })
  t.same(await alice.service(CalculatorService).Add({ x: 2, y: 2 }), { result: 4 })
  t.equal(probe.calls[0]!.user, 'alice', 'ctx.user')
  const bob = newClient(t, { endpoint: running.endpoint, user: 'bob', password: 'hunter2' })
  t.same(await bob.service(CalculatorService).Add({ x: 5, y: 1 }), { result: 6 })
  t.equal(probe.calls[2]!.user, 'bob')
  const served = running.server.stats().callsReceived

  for (const [user, password] of [['alice', 'wrong'], ['bob', 'secret'], ['mallory', 'secret'], ['alice', '']] as const) {
    const client = newClient(t, { endpoint: running.endpoint, user, password })
    const error = await client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }).then(() => null, (e: unknown) => e)
    t.ok(error instanceof RpcError, `${user}/${password}: refused`)
    const e = error as RpcError
    t.equal(e.code, ErrorCode.NEGOTIATION_FAILED, `${user}: code (${e.code}: ${e.message})`)
    t.equal(e.remote?.code, KrpcCode.FATAL_UNAUTHORIZED, `${user}: remote code`)
  }
  t.equal(running.server.stats().callsReceived, served, 'no refused call was served')
})
