/**
 * Throw-away certificates for the TLS tests, made with the `openssl`
 * command in a temporary directory: a CA, a server certificate for
 * localhost and 127.0.0.1 signed by it, a client certificate (CN alice)
 * signed by it, and a second CA that signed only a client certificate
 * (CN mallory), and a server certificate for localhost that expired in
 * 2020. No key is
 * kept in the repository; `remove()` deletes the directory.
 */
import type { Test } from 'tap'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export interface TestCerts {
  dir: string
  /** File paths, for command-line tools. */
  files: { ca: string, serverCert: string, serverKey: string, clientCert: string, clientKey: string, otherCa: string }
  ca: Buffer
  serverCert: Buffer
  serverKey: Buffer
  clientCert: Buffer
  clientKey: Buffer
  /** A CA that signed neither certificate. */
  otherCa: Buffer
  /** A client certificate (CN mallory) signed by the other CA, and its key. */
  otherClientCert: Buffer
  otherClientKey: Buffer
  /** A client certificate signed by the CA whose subject has no CN, and its key. */
  namelessClientCert: Buffer
  namelessClientKey: Buffer
  /** The server's key certified for January 2020 only (expired), by the CA. */
  expiredServerCert: Buffer
  remove: () => void
}

/** True when the `openssl` command runs. */
export function haveOpenssl (): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

/** Runs `tests` with throw-away certificates (removed at the end), or skips the file when openssl is missing. */
export function withCerts (t: Test, tests: (certs: TestCerts) => void): void {
  if (!haveOpenssl()) {
    t.plan(0, 'skip: the openssl command is missing (apt-get install openssl)')
    return
  }
  const certs = makeCerts()
  t.teardown(() => certs.remove())
  tests(certs)
}

export function makeCerts (): TestCerts {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-tls-'))
  const at = (name: string): string => join(dir, name)
  const openssl = (...args: string[]): void => { execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' }) }
  try {
    const ca = (name: string): void => openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.crt`, '-days', '2', '-subj', `/CN=nyala test ${name}`)
    ca('ca')
    ca('other-ca')
    const leaf = (name: string, cn: string, ext: string, signer = 'ca'): void => {
      openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', cn === '' ? '/O=nyala test' : `/CN=${cn}`)
      writeFileSync(at(`${name}.ext`), `${ext}\n`)
      openssl('x509', '-req', '-in', `${name}.csr`, '-CA', `${signer}.crt`, '-CAkey', `${signer}.key`, '-CAcreateserial', '-out', `${name}.crt`, '-days', '2', '-extfile', `${name}.ext`)
    }
    leaf('server', 'localhost', 'subjectAltName=DNS:localhost,IP:127.0.0.1')
    leaf('client', 'alice', 'extendedKeyUsage=clientAuth')
    leaf('other-client', 'mallory', 'extendedKeyUsage=clientAuth', 'other-ca')
    leaf('nameless-client', '', 'extendedKeyUsage=clientAuth')
    // `openssl ca` can date a certificate in the past; `x509 -req` cannot.
    writeFileSync(at('index.txt'), '')
    writeFileSync(at('serial'), '1000\n')
    writeFileSync(at('ca.cnf'), '[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nserial = serial\nnew_certs_dir = .\ndefault_md = sha256\npolicy = any\ncopy_extensions = copy\n[any]\ncommonName = supplied\n')
    openssl('ca', '-config', 'ca.cnf', '-batch', '-notext', '-cert', 'ca.crt', '-keyfile', 'ca.key', '-startdate', '20200101000000Z', '-enddate', '20200102000000Z', '-in', 'server.csr', '-out', 'expired.crt')
  } catch (err) {
    rmSync(dir, { recursive: true, force: true })
    throw err
  }
  const files = { ca: at('ca.crt'), serverCert: at('server.crt'), serverKey: at('server.key'), clientCert: at('client.crt'), clientKey: at('client.key'), otherCa: at('other-ca.crt') }
  return {
    dir,
    files,
    ca: readFileSync(files.ca),
    serverCert: readFileSync(files.serverCert),
    serverKey: readFileSync(files.serverKey),
    clientCert: readFileSync(files.clientCert),
    clientKey: readFileSync(files.clientKey),
    otherCa: readFileSync(files.otherCa),
    otherClientCert: readFileSync(at('other-client.crt')),
    otherClientKey: readFileSync(at('other-client.key')),
    expiredServerCert: readFileSync(at('expired.crt')),
    namelessClientCert: readFileSync(at('nameless-client.crt')),
    namelessClientKey: readFileSync(at('nameless-client.key')),
    remove: () => rmSync(dir, { recursive: true, force: true })
  }
}
