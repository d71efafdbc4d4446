import { randomInt } from 'node:crypto'
import { ScramError, ScramExchange, type ScramSecret } from './auth.js'
import { CANCEL_REQUEST_CODE, MessageReader, MessageWriter, PROTOCOL_3_0, writeError, fatalV2 } from './wire.js'

/**
 * The start of a connection, as PostgreSQL's ProcessStartupPacket and
 * ClientAuthentication run it: the StartupMessage, the protocol version,
 * authentication (trust, or SCRAM-SHA-256 for users with a password), then
 * ParameterStatus, BackendKeyData and the first ReadyForQuery.
 */

/** What the sessions of one server share: the users, the cancel keys, the server's reported version. */
export interface StartupConfig {
  /** The SCRAM-SHA-256 secret of a user's password; null: the user is trusted (no password asked). */
  secretFor: (user: string) => ScramSecret | null
  serverVersion: string
  /** Sessions by process id, for CancelRequest. */
  sessions: Map<number, { secret: number, cancel: () => void }>
}

/** What a StartupMessage said. */
export interface Startup {
  user: string
  database: string
  applicationName: string
  clientEncoding: string
}

/** Where the session's start stands. */
export type StartResult =
  | { kind: 'fatal', bytes: Buffer }
  | { kind: 'auth', bytes: Buffer, startup: Startup, scram: ScramExchange }
  | { kind: 'ready', bytes: Buffer, startup: Startup }

function fatal (code: string, message: string, detail?: string): { kind: 'fatal', bytes: Buffer } {
  const out = new MessageWriter(128)
  writeError(out, { severity: 'FATAL', code, message, detail })
  return { kind: 'fatal', bytes: out.take() }
}

/** Handles a StartupMessage (or an unsupported protocol version) at `buf[start, end)`, the whole packet. */
export function startupMessage (config: StartupConfig, key: BackendKey, buf: Buffer, start: number, end: number): StartResult {
  const reader = new MessageReader(buf, start + 4, end)
  const version = reader.i32()
  const major = version >>> 16
  const minor = version & 0xffff
  if (major !== 3) {
    const message = `unsupported frontend protocol ${major}.${minor}: server supports 3.0 to 3.0`
    // Before it knows a protocol 3 client, PostgreSQL answers in protocol 2's words.
    return major < 3 ? { kind: 'fatal', bytes: fatalV2(message) } : fatal('0A000', message)
  }
  const params = new Map<string, string>()
  const unknownOptions: string[] = []
  try {
    while (reader.remaining > 0) {
      const name = reader.cstr()
      if (name === '') break
      const value = reader.cstr()
      if (name.startsWith('_pq_.')) unknownOptions.push(name)
      else params.set(name, value)
    }
  } catch {
    return fatal('08P01', 'invalid startup packet layout: expected terminator as last byte')
  }
  const user = params.get('user') ?? ''
  if (user === '') return fatal('28000', 'no PostgreSQL user name specified in startup packet')
  const startup: Startup = {
    user,
    database: params.get('database') ?? user,
    applicationName: params.get('application_name') ?? '',
    clientEncoding: normalizeEncoding(params.get('client_encoding') ?? 'UTF8')
  }
  const out = new MessageWriter(512)
  if (version !== PROTOCOL_3_0 || unknownOptions.length > 0) {
    // NegotiateProtocolVersion: the newest minor version supported, and the options not recognized.
    out.begin('v').i32(PROTOCOL_3_0).i32(unknownOptions.length)
    for (const name of unknownOptions) out.cstr(name)
    out.end()
  }
  const secret = config.secretFor(user)
  if (secret === null) return { kind: 'ready', bytes: authenticated(config, out, startup, key), startup }
  out.begin('R').i32(10).cstr('SCRAM-SHA-256').byte(0).end()
  return { kind: 'auth', bytes: out.take(), startup, scram: new ScramExchange(secret) }
}

function normalizeEncoding (name: string): string {
  const upper = name.toUpperCase().replace(/[-_]/g, '')
  return upper === 'UTF8' || upper === 'UNICODE' ? 'UTF8' : upper === 'SQLASCII' ? 'SQL_ASCII' : name.toUpperCase()
}

/** A session's process id and secret key (BackendKeyData). */
export interface BackendKey { pid: number, secret: number }

/** A fresh process id (not in use by another session) and secret key. */
export function backendKey (config: StartupConfig): BackendKey {
  for (;;) {
    const pid = randomInt(1000, 0x7fffffff)
    if (!config.sessions.has(pid)) return { pid, secret: randomInt(0, 0x7fffffff) }
  }
}

/** AuthenticationOk, the ParameterStatus messages, BackendKeyData and ReadyForQuery, after what `out` holds. */
function authenticated (config: StartupConfig, out: MessageWriter, startup: Startup, key: BackendKey): Buffer {
  out.begin('R').i32(0).end()
  const status: Array<[string, string]> = [
    ['application_name', startup.applicationName],
    ['client_encoding', startup.clientEncoding],
    ['DateStyle', 'ISO, MDY'],
    ['default_transaction_read_only', 'off'],
    ['in_hot_standby', 'off'],
    ['integer_datetimes', 'on'],
    ['IntervalStyle', 'postgres'],
    ['is_superuser', 'on'],
    ['server_encoding', 'UTF8'],
    ['server_version', config.serverVersion],
    ['session_authorization', startup.user],
    ['standard_conforming_strings', 'on'],
    ['TimeZone', 'UTC']
  ]
  for (const [name, value] of status) out.begin('S').cstr(name).cstr(value).end()
  out.begin('K').i32(key.pid).i32(key.secret).end()
  out.begin('Z').byte(0x49).end()
  return out.take()
}

/** One password message ('p') of a SCRAM exchange in progress. */
export function passwordMessage (config: StartupConfig, key: BackendKey, scram: ScramExchange, startup: Startup, first: boolean, body: Buffer): { kind: 'fatal', bytes: Buffer } | { kind: 'continue', bytes: Buffer } | { kind: 'ready', bytes: Buffer } {
  const reader = new MessageReader(body)
  const out = new MessageWriter(512)
  let answer: string | ScramError
  try {
    if (first) {
      const mechanism = reader.cstr()
      if (mechanism !== 'SCRAM-SHA-256') return fatal('08P01', 'client selected an invalid SASL authentication mechanism')
      const length = reader.i32()
      const data = length < 0 ? '' : reader.bytes(length).toString('utf8')
      answer = scram.first(data)
      if (typeof answer === 'string') {
        out.begin('R').i32(11).bytes(Buffer.from(answer)).end()
        return { kind: 'continue', bytes: out.take() }
      }
    } else {
      answer = scram.final(body.toString('utf8'), startup.user)
      if (typeof answer === 'string') {
        out.begin('R').i32(12).bytes(Buffer.from(answer)).end()
        return { kind: 'ready', bytes: authenticated(config, out, startup, key) }
      }
    }
  } catch {
    return fatal('08P01', 'malformed SASL message')
  }
  return fatal(answer.code, answer.message, answer.detail)
}

/** A CancelRequest's process id and key; null when the packet is not one. */
export function cancelTarget (buf: Buffer, start: number, end: number): { pid: number, secret: number } | null {
  if (end - start !== 16 || buf.readInt32BE(start + 4) !== CANCEL_REQUEST_CODE) return null
  return { pid: buf.readInt32BE(start + 8), secret: buf.readInt32BE(start + 12) }
}
