/**
 * `nyala passwd USER`, run as a child process from the TypeScript sources
 * (through the same loader tap uses), the password on its stdin: it prints
 * one `USER:HASH` line that loadPasswordFile accepts and that verifies the
 * password (and no other); only the first line of stdin is the password;
 * no password, no user, two users or a user name the file cannot hold
 * are usage errors (exit 2, one line, nothing on stdout).
 */
import t, { type Test } from 'tap'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { loadPasswordFile } from '../../reactor/krpc/password-file.js'
import { cliCases, runCli, type Outcome } from '../helpers/cli-cases.js'

t.setTimeout(120_000)

/** `nyala passwd ARGS` with `input` on its stdin. */
async function passwd (t: Test, args: string[], input: string): Promise<Outcome> {
  const run = runCli(['passwd', ...args], t, input)
  const code = await run.exit
  return { code: code ?? -1, stdout: run.stdout(), stderr: run.stderr() }
}

function fileOf (t: Test, text: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-passwd-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'users.txt')
  writeFileSync(file, text)
  return file
}

t.test('nyala passwd alice: one USER:HASH line that loadPasswordFile accepts and that verifies', async (t) => {
  const [alice, bob] = await Promise.all([
    passwd(t, ['alice'], 'secret\nthe second line is not the password\n'),
    passwd(t, ['bob'], 'hunter 2\r\n')
  ])
  t.equal(alice.code, 0, alice.stderr)
  t.equal(alice.stderr, '', 'no prompt when stdin is not a terminal')
  t.match(alice.stdout, /^alice:\$scrypt\$ln=15,r=8,p=1\$[A-Za-z0-9+/]+\$[A-Za-z0-9+/]+\n$/)
  t.equal(bob.code, 0, bob.stderr)
  t.match(bob.stdout, /^bob:\$scrypt\$/)
  const check = loadPasswordFile(fileOf(t, `# appended by nyala passwd\n${alice.stdout}${bob.stdout}`))
  t.equal(await check('alice', 'secret'), true, 'alice: the first line of stdin')
  t.equal(await check('alice', 'secret\nthe second line is not the password'), false)
  t.equal(await check('alice', 'wrong'), false)
  t.equal(await check('bob', 'hunter 2'), true, 'bob: CRLF dropped, the space kept')
  t.equal(await check('bob', 'hunter 2\r'), false)
})

t.test('a password without a line end (stdin just ends) is the password', async (t) => {
  const run = await passwd(t, ['carol'], 'no newline')
  t.equal(run.code, 0, run.stderr)
  t.equal(await loadPasswordFile(fileOf(t, run.stdout))('carol', 'no newline'), true)
})

t.test('usage errors: no password, no user, two users, a name the file cannot hold', async (t) => {
  const empty = await passwd(t, ['alice'], '\n')
  t.equal(empty.code, 2)
  t.equal(empty.stdout, '')
  t.equal(empty.stderr, 'nyala passwd: no password on stdin (one line)\n')
  // With stdin ignored (/dev/null): it ends at once.
  const bad = [['passwd', 'alice'], ['passwd'], ['passwd', 'alice', 'bob'], ['passwd', 'a:b'], ['passwd', 'a b'], ['passwd', '#alice'], ['passwd', ''], ['passwd', '--bogus', 'alice']]
  const outcomes = await cliCases(t, bad)
  for (const [i, args] of bad.entries()) {
    const run = outcomes[i]!
    t.equal(run.code, 2, JSON.stringify(args))
    t.equal(run.stdout, '', `${JSON.stringify(args)}: nothing on stdout`)
    t.match(run.stderr, /^nyala passwd: [^\n]+\n/, `${JSON.stringify(args)}: ${run.stderr}`)
    t.notMatch(run.stderr, /\n\s+at /, 'no stack')
  }
  t.match(outcomes[0]!.stderr, /no password on stdin/)
  t.match(outcomes[1]!.stderr, /expected one USER/)
  t.match(outcomes[2]!.stderr, /expected one USER/)
  t.match(outcomes[3]!.stderr, /may not be empty, hold ':'/)
})
