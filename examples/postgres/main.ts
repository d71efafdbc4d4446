/**
 * A PostgreSQL server (protocol v3) on nyala's generic protocol server,
 * with a small in-memory engine (see docs/examples.md#postgresql):
 *
 *   node dist/examples/postgres/main.js [--port 5432] [--host 127.0.0.1]
 *     [--password SECRET] [--user NAME=SECRET ...]
 *     [--tls-cert FILE --tls-key FILE [--tls-ca FILE] [--tls-require-client-cert]]
 *     [--io auto|io_uring|epoll|node]
 *
 * A user named with `--user NAME=SECRET` authenticates with SCRAM-SHA-256;
 * every other user too with `--password` (their common password), else is
 * trusted (no password asked), as a `trust` line of pg_hba.conf. With `--tls-cert`, an SSLRequest is
 * answered `S` and the connection continues in TLS; without, `N`.
 *
 * Prints `listening on HOST:PORT` once it serves; SIGINT/SIGTERM close it.
 * One process: the table `kv` is shared by every session of it.
 */
import { IO_FLAG_OPTIONS, ioFromFlags } from '../../bin/io-flag.js'
import type { IoOption } from '../../transport/io.js'
import type { TlsOptions } from 'node:tls'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { ProtocolServer } from '../../reactor/index.js'
import { TLS_FLAG_OPTIONS, tlsFromFlags } from '../../bin/tls-flags.js'
import { scramSecret, type ScramSecret } from './auth.js'
import { KvTable } from './engine.js'
import { pgHandlers, pgProtocol } from './protocol.js'
import type { Shared } from './shared.js'

export interface PostgresServerOptions {
  /** Users and their passwords (SCRAM-SHA-256); the users not listed are trusted, unless `password` is given. */
  users?: Record<string, string> | Map<string, string>
  /** The password of every user not in `users`; absent: they are trusted. */
  password?: string
  /** TLS after an SSLRequest (answered `S`); default none (answered `N`). */
  tls?: TlsOptions
  /** The reported server_version; default '15.0 (nyala)'. */
  serverVersion?: string
  /** The largest message accepted; default 1 MiB. */
  maxMessageBytes?: number
  /** The transport of plain connections (`ServerOptions.io`); default auto. With `tls`, node:net (the upgrade after SSLRequest needs its socket). */
  io?: IoOption
}

/** One server and its in-memory table. */
export function postgresServer (options: PostgresServerOptions = {}): ProtocolServer {
  // Secrets are derived once, here (PBKDF2), never per connection.
  const entries = options.users instanceof Map ? [...options.users] : Object.entries(options.users ?? {})
  const secrets = new Map<string, ScramSecret>(entries.map(([user, password]) => [user, scramSecret(password)]))
  const everyone = options.password === undefined ? null : scramSecret(options.password)
  const shared: Shared = {
    secretFor: (user) => secrets.get(user) ?? everyone,
    serverVersion: options.serverVersion ?? '15.0 (nyala)',
    sessions: new Map(),
    table: new KvTable(),
    parsed: new Map()
  }
  // The start-up is the connection's set-up (handshake.ts); each connection switches the idle close off for
  // itself (protocol.ts), and runs its messages in order (`execution: 'sequential'`): a sleeping session holds no
  // one else up. The start-up may take a minute, PostgreSQL's authentication_timeout.
  const protocol = pgProtocol(shared, options.maxMessageBytes, options.tls)
  const server = new ProtocolServer(protocol, { io: options.io, negotiationTimeoutMs: 60_000 })
  server.addRoutes('pg', pgHandlers())
  return server
}

function port (text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback
  const value = Number(text)
  if (!Number.isInteger(value) || value < 0 || value > 65535) throw new RangeError(`--port must be a port number, got ${text}`)
  return value
}

async function main (argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: {
      port: { type: 'string' },
      host: { type: 'string' },
      password: { type: 'string' },
      user: { type: 'string', multiple: true },
      ...IO_FLAG_OPTIONS,
      ...TLS_FLAG_OPTIONS
    },
    strict: true
  })
  const io = ioFromFlags(values)
  const users = new Map<string, string>()
  for (const entry of values.user ?? []) {
    const at = entry.indexOf('=')
    if (at <= 0) throw new RangeError(`--user takes NAME=PASSWORD, got ${entry}`)
    users.set(entry.slice(0, at), entry.slice(at + 1))
  }
  const server = postgresServer({ users, password: values.password, tls: tlsFromFlags(values), io })
  const address = await server.listen(port(values.port, 5432), values.host ?? '127.0.0.1')
  console.log(`listening on ${address.address}:${address.port}`)
  console.log(`io: ${server.stats().io}`)
  const close = (): void => { server.close().then(() => process.exit(0), () => process.exit(1)) }
  process.once('SIGINT', close)
  process.once('SIGTERM', close)
}

// Run as a script, not when imported.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err)
    process.exit(1)
  })
}
