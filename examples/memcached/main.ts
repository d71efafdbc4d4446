/**
 * A memcached server speaking the binary protocol, on nyala's generic
 * protocol server:
 *
 *   node dist/examples/memcached/main.js [--port 11211] [--host 127.0.0.1]
 *     [--reactors 1] [--memory-mb 64] [--request-timeout-ms 1000]
 *     [--shutdown-grace-ms 30000]
 *     [--tls-cert FILE --tls-key FILE [--tls-ca FILE] [--tls-require-client-cert]]
 *     [--io auto|io_uring|epoll|node]
 *
 * With `--tls-cert`, every connection is TLS; `--tls-require-client-cert`
 * asks for a client certificate signed by `--tls-ca` (see docs/security.md).
 *
 * SIGINT/SIGTERM stop it as `nyala serve` does: requests in flight and
 * queued are answered, then it exits 0, within `--shutdown-grace-ms`
 * whatever the peers do (a peer not reading its answers is closed then).
 *
 * Large buffers go back to the system once freed (RSS falls after an
 * attack) when glibc's mmap threshold is set: this script sets
 * MALLOC_MMAP_THRESHOLD_=131072 for the reactor processes it forks; one
 * process (`--reactors 1`) gets it from its caller's environment
 * (NYALA_MALLOC=system: neither; see examples/malloc-env.ts). Each process
 * also runs a full collection once it is idle after it grew, so the
 * buffers are freed (the server's idleCollection, reactor/idle-collection.ts;
 * NYALA_IDLE_GC=0 turns it off).
 *
 * Prints `listening on HOST:PORT` once it serves, then `io: BACKEND` (the transport). Every reactor process
 * has its own cache: with `--reactors` above 1 a key set through one
 * connection is not seen through a connection that landed on another
 * reactor, so more than one reactor suits only clients that shard by
 * connection (or benchmarks that do not read back).
 */
import type { TlsOptions } from 'node:tls'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { ProtocolServer, serveReactors } from '../../reactor/index.js'
import { memcachedHandlers } from './handlers.js'
import { memcachedProtocol } from './protocol.js'
import { MemcachedStore } from './store.js'
import { tuneForkedProcesses } from '../malloc-env.js'
import { TLS_FLAG_OPTIONS, tlsFromFlags } from '../../bin/tls-flags.js'
import { IO_FLAG_OPTIONS, ioFromFlags } from '../../bin/io-flag.js'
import type { IoOption } from '../../transport/io.js'

export interface MemcachedServerOptions {
  /** The cache's memory limit in bytes; default 64 MiB. */
  memoryBytes?: number
  /** Time budget of a request from its arrival (the protocol carries none): it orders the queue and expires requests that waited too long (answered Busy). Default 1000 ms. */
  requestTimeoutMs?: number
  /** TLS from the first byte (`ServerOptions.tls`); default none. */
  tls?: TlsOptions
  /** The transport (`ServerOptions.io`); default auto. */
  io?: IoOption | undefined
}

/** One server and its cache, the commands registered as the routes of the group `memcached`. */
export function memcachedServer (options: MemcachedServerOptions = {}): ProtocolServer {
  const store = new MemcachedStore({ memoryBytes: options.memoryBytes })
  const server = new ProtocolServer(memcachedProtocol({ maxItemBytes: store.maxItemBytes }), {
    requestTimeoutMs: options.requestTimeoutMs ?? 1000,
    // memcached keeps idle connections open (its idle_timeout is 0): client pools hold them between bursts.
    idleTimeoutMs: 0,
    tls: options.tls,
    io: options.io
  })
  // The handlers are synchronous: the group's default workers and queue suffice.
  server.addRoutes('memcached', memcachedHandlers(store, {
    // STAT's curr_connections and total_connections.
    connections: () => { const stats = server.stats(); return { open: stats.connectionsOpen, accepted: stats.connectionsAccepted } }
  }))
  return server
}

function positiveInteger (name: string, text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback
  const value = Number(text)
  if (!Number.isInteger(value) || value < 0) throw new RangeError(`--${name} must be a non-negative integer, got ${text}`)
  return value
}

async function main (argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: {
      port: { type: 'string' },
      host: { type: 'string' },
      reactors: { type: 'string' },
      'memory-mb': { type: 'string' },
      'request-timeout-ms': { type: 'string' },
      'shutdown-grace-ms': { type: 'string' },
      ...TLS_FLAG_OPTIONS,
      ...IO_FLAG_OPTIONS
    },
    strict: true
  })
  const port = positiveInteger('port', values.port, 11211)
  const host = values.host ?? '127.0.0.1'
  const reactors = positiveInteger('reactors', values.reactors, 1)
  const memoryBytes = positiveInteger('memory-mb', values['memory-mb'], 64) * 1024 * 1024
  const requestTimeoutMs = positiveInteger('request-timeout-ms', values['request-timeout-ms'], 1000)
  const graceMs = positiveInteger('shutdown-grace-ms', values['shutdown-grace-ms'], 30_000)
  const tls = tlsFromFlags(values)
  const io = ioFromFlags(values)
  // The reactor processes forked for --reactors above 1 start with the allocator tuning (see ../malloc-env.ts);
  // each one's server collects once it is idle after it grew (its idleCollection option, on by default).
  tuneForkedProcesses()
  const served = await serveReactors({ reactors, host, port, graceMs, build: () => memcachedServer({ memoryBytes, requestTimeoutMs, tls, io }) })
  if (reactors > 1) console.error(`warning: ${reactors} reactors, ${reactors} separate caches (see examples/memcached/main.ts)`)
  console.log(`listening on ${served.address.host}:${served.address.port}`)
  console.log(`io: ${served.io}`)
  const close = (): void => { served.close().then(() => process.exit(0), () => process.exit(1)) }
  process.once('SIGINT', close)
  process.once('SIGTERM', close)
}

// Run as a script (also in each reactor process serveReactors forks), not when imported.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err)
    process.exit(1)
  })
}
