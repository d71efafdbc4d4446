import { createHash, createHmac, pbkdf2Sync, randomBytes, timingSafeEqual } from 'node:crypto'

/**
 * SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL runs it
 * (src/backend/libpq/auth-scram.c): the server keeps each user's salt,
 * iteration count, StoredKey and ServerKey, never the password; no
 * channel binding (the server offers SCRAM-SHA-256 only, so clients send
 * the GS2 header `n,,`, or `y,,` over TLS).
 */

const ITERATIONS = 4096

/** What the server stores of a password (pg_authid's SCRAM secret). */
export interface ScramSecret {
  salt: Buffer
  iterations: number
  storedKey: Buffer
  serverKey: Buffer
}

const hmac = (key: Buffer, text: string): Buffer => createHmac('sha256', key).update(text).digest()
const sha256 = (data: Buffer): Buffer => createHash('sha256').update(data).digest()

/** The secret of a password, with a fresh salt (PBKDF2 runs once, here, not per connection). */
export function scramSecret (password: string, iterations = ITERATIONS): ScramSecret {
  const salt = randomBytes(16)
  const salted = pbkdf2Sync(password.normalize('NFKC'), salt, iterations, 32, 'sha256')
  return { salt, iterations, storedKey: sha256(hmac(salted, 'Client Key')), serverKey: hmac(salted, 'Server Key') }
}

/** A SCRAM exchange's failure: a malformed message (08P01) or a wrong password (28P01). */
export class ScramError {
  readonly code: string
  readonly message: string
  readonly detail: string | undefined
  constructor (code: string, message: string, detail?: string) {
    this.code = code
    this.message = message
    this.detail = detail
  }
}

function attributes (message: string): Map<string, string> {
  const out = new Map<string, string>()
  for (const part of message.split(',')) {
    if (part.length < 2 || part[1] !== '=') continue
    out.set(part[0]!, part.slice(2))
  }
  return out
}

/** One connection's SCRAM exchange, server side. `secret` null: an unknown user, who fails at the proof as PostgreSQL's mock does. */
export class ScramExchange {
  readonly #secret: ScramSecret | null
  #clientFirstBare = ''
  #serverFirst = ''
  #nonce = ''
  #gs2Header = ''

  constructor (secret: ScramSecret | null) {
    this.#secret = secret
  }

  /** The client-first-message; returns the server-first-message. */
  first (message: string): string | ScramError {
    // gs2-header: a channel-binding flag (n or y; p= is refused: none is offered), an optional authzid, then the bare message.
    const flagEnd = message.indexOf(',')
    const authzEnd = flagEnd < 0 ? -1 : message.indexOf(',', flagEnd + 1)
    const flag = message.slice(0, flagEnd)
    if (message.startsWith('p=')) return new ScramError('08P01', 'malformed SCRAM message', 'The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.')
    if (authzEnd < 0 || (flag !== 'n' && flag !== 'y')) return new ScramError('08P01', 'malformed SCRAM message', `Unexpected channel-binding flag "${message[0] ?? ''}".`)
    this.#gs2Header = message.slice(0, authzEnd + 1)
    this.#clientFirstBare = message.slice(authzEnd + 1)
    const attrs = attributes(this.#clientFirstBare)
    const clientNonce = attrs.get('r')
    if (clientNonce === undefined || clientNonce.length === 0) return new ScramError('08P01', 'malformed SCRAM message', 'Could not parse client nonce.')
    this.#nonce = clientNonce + randomBytes(18).toString('base64')
    const salt = this.#secret?.salt ?? randomBytes(16)
    const iterations = this.#secret?.iterations ?? ITERATIONS
    this.#serverFirst = `r=${this.#nonce},s=${salt.toString('base64')},i=${iterations}`
    return this.#serverFirst
  }

  /** The client-final-message; returns the server-final-message (`v=...`) once the proof holds. */
  final (message: string, user: string): string | ScramError {
    const proofAt = message.lastIndexOf(',p=')
    if (proofAt < 0) return new ScramError('08P01', 'malformed SCRAM message', 'Could not find proof in client-final-message.')
    const withoutProof = message.slice(0, proofAt)
    const attrs = attributes(withoutProof)
    if (attrs.get('c') !== Buffer.from(this.#gs2Header).toString('base64')) {
      return new ScramError('08P01', 'SCRAM channel binding check failed')
    }
    if (attrs.get('r') !== this.#nonce) return new ScramError('08P01', 'invalid SCRAM response', 'Nonce does not match.')
    const proof = Buffer.from(message.slice(proofAt + 3), 'base64')
    const failed = new ScramError('28P01', `password authentication failed for user "${user}"`)
    const secret = this.#secret
    if (secret === null || proof.length !== 32) return failed
    const authMessage = `${this.#clientFirstBare},${this.#serverFirst},${withoutProof}`
    const signature = hmac(secret.storedKey, authMessage)
    const clientKey = Buffer.alloc(32)
    for (let i = 0; i < 32; i++) clientKey[i] = proof[i]! ^ signature[i]!
    if (!timingSafeEqual(sha256(clientKey), secret.storedKey)) return failed
    return `v=${hmac(secret.serverKey, authMessage).toString('base64')}`
  }
}
