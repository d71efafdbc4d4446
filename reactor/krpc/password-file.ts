/**
 * SASL PLAIN users checked against a password file of scrypt hashes.
 *
 * A line is `user:HASH`, HASH in a PHC-like form
 * `$scrypt$ln=15,r=8,p=1$<salt>$<key>` (salt and key in base64, without
 * padding as PHC writes it; padded base64 is read too). `hashPassword` makes
 * one (`nyala passwd USER` prints the line). Blank lines and lines starting
 * with `#` are ignored.
 */
import { randomBytes, scrypt, timingSafeEqual, type ScryptOptions } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Authenticator } from '../../codec/krpc/server-negotiation.js'

/** scrypt's cost parameters: N = 2^ln, block size r, parallelism p. */
interface ScryptParams { ln: number, r: number, p: number }

interface StoredHash extends ScryptParams { salt: Buffer, key: Buffer }

const DEFAULT_PARAMS: ScryptParams = { ln: 15, r: 8, p: 1 }
const SALT_BYTES = 16
const KEY_BYTES = 32

/**
 * The parameters a file may ask for: a hash outside them is refused at
 * load, so that no line makes one check take gigabytes or minutes. scrypt
 * needs about 128·N·r bytes; together at most 256 MiB (the default, 32 MiB).
 */
const LIMITS = { ln: { min: 1, max: 20 }, r: { min: 1, max: 16 }, p: { min: 1, max: 4 }, memoryBytes: 256 * 1024 * 1024 }
const SALT_LIMITS = { min: 8, max: 64 }
const KEY_LIMITS = { min: 16, max: 64 }

function memoryOf (params: ScryptParams): number {
  return 128 * (2 ** params.ln) * params.r
}

function scryptOptions (params: ScryptParams): ScryptOptions {
  // Node refuses anything over maxmem (default 32 MiB, which the default parameters need exactly); leave room.
  return { N: 2 ** params.ln, r: params.r, p: params.p, maxmem: memoryOf(params) + 128 * params.r * params.p + 16 * 1024 * 1024 }
}

/** scrypt on libuv's thread pool: never blocks the event loop. */
async function derive (password: string, salt: Buffer, length: number, params: ScryptParams): Promise<Buffer> {
  return await new Promise<Buffer>((resolve, reject) => {
    scrypt(password, salt, length, scryptOptions(params), (err, key) => { if (err !== null) reject(err); else resolve(key) })
  })
}

const b64 = (bytes: Buffer): string => bytes.toString('base64').replace(/=+$/, '')

/** Why `params` are refused, or null. */
function outOfBounds (params: ScryptParams): string | null {
  for (const name of ['ln', 'r', 'p'] as const) {
    const { min, max } = LIMITS[name]
    if (!Number.isInteger(params[name]) || params[name] < min || params[name] > max) return `${name}=${params[name]} is out of bounds (${min} to ${max})`
  }
  if (memoryOf(params) > LIMITS.memoryBytes) return `ln=${params.ln},r=${params.r} needs ${memoryOf(params) / 1024 / 1024} MiB per check (at most ${LIMITS.memoryBytes / 1024 / 1024} MiB)`
  return null
}

/**
 * A self-describing scrypt hash of `password`:
 * `$scrypt$ln=15,r=8,p=1$<salt base64>$<key base64>`, a 16-byte random salt
 * and a 32-byte key. `params` changes the cost (within the bounds a
 * password file accepts); the default needs 32 MiB and tens of ms.
 */
export async function hashPassword (password: string, params: { ln?: number, r?: number, p?: number } = {}): Promise<string> {
  const chosen = { ...DEFAULT_PARAMS, ...params }
  const problem = outOfBounds(chosen)
  if (problem !== null) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `hashPassword: ${problem}`)
  const salt = randomBytes(SALT_BYTES)
  const key = await derive(password, salt, KEY_BYTES, chosen)
  return `$scrypt$ln=${chosen.ln},r=${chosen.r},p=${chosen.p}$${b64(salt)}$${b64(key)}`
}

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/

function decodeBase64 (text: string, what: string, limits: { min: number, max: number }): Buffer {
  if (!BASE64.test(text)) throw new Error(`the ${what} is not base64`)
  const bytes = Buffer.from(text, 'base64')
  // Buffer.from skips what it cannot read: a round trip says it read it all.
  if (b64(bytes) !== text.replace(/=+$/, '')) throw new Error(`the ${what} is not base64`)
  if (bytes.length < limits.min || bytes.length > limits.max) throw new Error(`the ${what} has ${bytes.length} bytes (${limits.min} to ${limits.max})`)
  return bytes
}

/** A hash string as `hashPassword` writes it; throws an Error saying what is wrong. */
function parseHash (text: string): StoredHash {
  const parts = text.split('$')
  if (parts.length !== 5 || parts[0] !== '' || parts[1] !== 'scrypt') throw new Error('expected $scrypt$ln=L,r=R,p=P$SALT$KEY')
  const m = /^ln=(\d{1,3}),r=(\d{1,3}),p=(\d{1,3})$/.exec(parts[2]!)
  if (m === null) throw new Error(`expected the parameters as ln=L,r=R,p=P, got '${parts[2]}'`)
  const params = { ln: Number(m[1]), r: Number(m[2]), p: Number(m[3]) }
  const problem = outOfBounds(params)
  if (problem !== null) throw new Error(problem)
  return { ...params, salt: decodeBase64(parts[3]!, 'salt', SALT_LIMITS), key: decodeBase64(parts[4]!, 'key', KEY_LIMITS) }
}

/** Bounds of a password file's checks (`loadPasswordFile`). */
export interface PasswordCheckLimits {
  /** Checks running at once (each on a libuv thread-pool thread); default 4, the pool's default size. */
  maxRunning?: number
  /** Checks waiting for one of those; default 64. A check over it is refused at once (FATAL_UNAUTHORIZED). */
  maxWaiting?: number
}

/**
 * Reads the password file at `path` now (synchronously: it is meant for
 * start-up) and returns an `Authenticator` for `KrpcServerOptions.authenticate`.
 * A line is `user:HASH`; blank lines and `#` comments are skipped. A line
 * that is not, a hash outside the accepted parameters, a user listed twice
 * or a file that cannot be read throws an RpcError (RPC_ERR_INVALID_ARGUMENT)
 * naming the file (and line).
 *
 * Each check runs scrypt on libuv's thread pool, compares with
 * `timingSafeEqual`, and for an unknown user runs scrypt all the same
 * (against a dummy hash with the parameters of the file's first entry), so
 * its time does not say which users exist. The file is not re-read: restart
 * to change it.
 */
export function loadPasswordFile (path: string, limits: PasswordCheckLimits = {}): Authenticator {
  const maxRunning = limits.maxRunning ?? 4
  const maxWaiting = limits.maxWaiting ?? 64
  for (const [name, value] of [['maxRunning', maxRunning], ['maxWaiting', maxWaiting]] as const) {
    if (!Number.isSafeInteger(value) || value < (name === 'maxRunning' ? 1 : 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be a whole number${name === 'maxRunning' ? ' of at least 1' : ''}, got ${value}`)
  }
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot read password file ${path}: ${(err as Error).message}`, { cause: err })
  }
  const users = new Map<string, StoredHash>()
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.replace(/\r$/, '').trim()
    if (line === '' || line.startsWith('#')) continue
    const bad = (why: string): RpcError => new RpcError(ErrorCode.INVALID_ARGUMENT, `${path}:${i + 1}: ${why}`)
    const colon = line.indexOf(':')
    if (colon < 0) throw bad('expected user:HASH')
    const user = line.slice(0, colon)
    if (user === '') throw bad('the user name is empty')
    if (users.has(user)) throw bad(`user '${user}' is listed twice`)
    try {
      users.set(user, parseHash(line.slice(colon + 1)))
    } catch (err) {
      throw bad(`user '${user}': ${(err as Error).message}`)
    }
  }
  const first = users.values().next().value
  const dummy: StoredHash = first === undefined
    ? { ...DEFAULT_PARAMS, salt: randomBytes(SALT_BYTES), key: randomBytes(KEY_BYTES) }
    : { ln: first.ln, r: first.r, p: first.p, salt: randomBytes(first.salt.length), key: randomBytes(first.key.length) }
  // A flood of attempts waits here, not in the thread pool (which file
  // system and DNS work share): at most maxRunning derive at once, at most
  // maxWaiting wait, the rest are refused.
  let running = 0
  const waiting: Array<() => void> = []
  return async (user: string, password: string): Promise<boolean> => {
    if (running >= maxRunning) {
      if (waiting.length >= maxWaiting) return false
      await new Promise<void>((resolve) => waiting.push(resolve))
    } else {
      running++
    }
    try {
      const stored = users.get(user)
      const against = stored ?? dummy
      const key = await derive(password, against.salt, against.key.length, against)
      return timingSafeEqual(key, against.key) && stored !== undefined
    } finally {
      // The slot passes to the next waiting check, or is freed.
      const next = waiting.shift()
      if (next !== undefined) next()
      else running--
    }
  }
}
