/**
 * A Redis server speaking RESP2, on nyala's generic protocol server:
 *
 *   node dist/examples/redis/main.js [--port 6379] [--host 127.0.0.1]
 *     [--reactors 1] [--maxmemory-mb 64] [--request-timeout-ms 1000]
 *     [--proto-max-bulk-len BYTES] [--max-message-mb 50] [--max-arguments 1048576]
 *     [--max-answer-bytes-per-read 65536]
 *     [--client-output-buffer-limit-pubsub HARD SOFT SECONDS] [--shutdown-grace-ms 30000]
 *     [--tls-cert FILE --tls-key FILE [--tls-ca FILE] [--tls-require-client-cert]]
 *     [--io auto|io_uring|epoll|node]
 *
 * With `--tls-cert`, every connection is TLS (`redis-cli --tls --cacert CA`);
 * `--tls-require-client-cert` asks for a client certificate signed by
 * `--tls-ca` (see docs/security.md).
 *
 * `--client-output-buffer-limit-pubsub 32mb 8mb 60` (the default) is
 * Redis's `client-output-buffer-limit pubsub`: a connection that receives
 * Pub/Sub messages and has more than HARD bytes unsent is closed at once,
 * one above SOFT for SECONDS without a break is closed then; 0 turns a
 * limit off. Sizes take Redis's units (b, k, kb, m, mb, g, gb). The three
 * values may also be given as one argument ("32mb 8mb 60").
 *
 * `--max-answer-bytes-per-read` is the server's `maxAnswerBytesPerRead`
 * (docs/limits.md): once the commands of one read have queued that many
 * reply bytes on their connection, the rest of the read waits for the next
 * event-loop turn, so a client pipelining commands with many replies each
 * (SUBSCRIBE of 100 channels) lets the other clients be served in between.
 *
 * SIGINT/SIGTERM stop it as `nyala serve` does: commands in flight and
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
 * has its own keyspace: with `--reactors` above 1 a key set through one
 * connection is not seen through a connection that landed on another
 * reactor, so more than one reactor suits only clients that shard by
 * connection (or benchmarks that do not read back). The same holds for
 * Pub/Sub: a message reaches the subscribers of its publisher's reactor.
 */
import type { TlsOptions } from 'node:tls'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { ProtocolServer, serveReactors } from '../../reactor/index.js'
import { redisHandlers } from './handlers.js'
import { PubSub } from './pubsub.js'
import { DEFAULT_MAX_ARGUMENTS, DEFAULT_MAX_FRAME_BYTES, DEFAULT_PROTO_MAX_BULK_LEN, respLimits, respProtocol } from './resp.js'
import { RedisStore } from './store.js'
import { tuneForkedProcesses } from '../malloc-env.js'
import { TLS_FLAG_OPTIONS, tlsFromFlags } from '../../bin/tls-flags.js'
import { IO_FLAG_OPTIONS, ioFromFlags } from '../../bin/io-flag.js'
import type { IoOption } from '../../transport/io.js'

export interface RedisServerOptions {
  /** The keyspace's memory limit in estimated bytes (see store.ts); default 64 MiB. */
  maxMemoryBytes?: number
  /** Time budget of a request from its arrival (RESP carries none): it orders the queue and expires requests that waited too long. Default 1000 ms. */
  requestTimeoutMs?: number
  /** The largest bulk string; default 512 MiB, never above `maxMessageBytes` (less 4 KiB). */
  protoMaxBulkLen?: number
  /** The largest request frame; default 50 MiB. */
  maxMessageBytes?: number
  /** The most elements of one command, its name included; default 1M (see resp.ts DEFAULT_MAX_ARGUMENTS). */
  maxArguments?: number
  /** The keyspace's clock in ms (tests); default Date.now. */
  now?: () => number
  /** The expiry sweep's period; 0: none. Default 100 ms. */
  sweepIntervalMs?: number
  /** TLS from the first byte (`ServerOptions.tls`); default none. */
  tls?: TlsOptions
  /** The transport (`ServerOptions.io`); default auto. */
  io?: IoOption | undefined
  /**
   * Redis's `client-output-buffer-limit pubsub` (the server's
   * `pushOutputLimit`): a connection that receives messages and has more
   * than `hardBytes` unsent is closed at once; one above `softBytes` for
   * `softMs` without a break is closed then. Default 32 MiB, 8 MiB,
   * 60 000 ms; 0 turns a limit off.
   */
  pubsubOutputLimit?: { hardBytes?: number, softBytes?: number, softMs?: number }
  /** Reply bytes the commands of one read may queue before the rest of the read waits for the next turn (`ServerOptions.maxAnswerBytesPerRead`); default 64 KiB. */
  maxAnswerBytesPerRead?: number | undefined
}

/** What a server gives its Pub/Sub connections by default, as Redis's `client-output-buffer-limit pubsub 32mb 8mb 60`. */
export const DEFAULT_PUBSUB_OUTPUT_LIMIT = { hardBytes: 32 * 1024 * 1024, softBytes: 8 * 1024 * 1024, softMs: 60_000 } as const

/** One server, its keyspace and its Pub/Sub channels, the commands registered as the routes of the group `redis`. */
export function redisServer (options: RedisServerOptions = {}): ProtocolServer & { readonly store: RedisStore, readonly pubsub: PubSub } {
  const store = new RedisStore({ maxMemoryBytes: options.maxMemoryBytes, now: options.now, sweepIntervalMs: options.sweepIntervalMs })
  const pubsub = new PubSub()
  const maxFrameBytes = options.maxMessageBytes ?? DEFAULT_MAX_FRAME_BYTES
  const limits = respLimits({ protoMaxBulkLen: options.protoMaxBulkLen, maxFrameBytes })
  const server = new ProtocolServer(respProtocol({ protoMaxBulkLen: options.protoMaxBulkLen, maxFrameBytes, maxArguments: options.maxArguments }), {
    requestTimeoutMs: options.requestTimeoutMs ?? 1000,
    maxMessageBytes: limits.maxFrameBytes,
    // Redis keeps idle connections open (its timeout is 0): client pools hold them between bursts.
    idleTimeoutMs: 0,
    tls: options.tls,
    io: options.io,
    pushOutputLimit: { ...DEFAULT_PUBSUB_OUTPUT_LIMIT, ...options.pubsubOutputLimit },
    maxAnswerBytesPerRead: options.maxAnswerBytesPerRead
  })
  let port = 0
  server.addRoutes('redis', redisHandlers(store, {
    port: () => port,
    connectedClients: () => server.stats().connectionsOpen,
    protoMaxBulkLen: limits.maxBulk,
    pubsub
  }))
  const listen = server.listen.bind(server)
  server.listen = async (...args: Parameters<typeof server.listen>) => {
    const address = await listen(...args)
    port = address.port
    return address
  }
  const close = server.close.bind(server)
  server.close = async (...args: Parameters<typeof server.close>) => {
    store.close()
    return close(...args)
  }
  return Object.assign(server, { store, pubsub })
}

/** A size as Redis reads one in its configuration (memtoull): digits and an optional unit, k = 1000, kb = 1024, and so on. */
export function parseMemory (text: string): number | null {
  const match = /^(\d+)(b|k|kb|m|mb|g|gb)?$/i.exec(text)
  if (match === null) return null
  const units: Record<string, number> = { b: 1, k: 1000, kb: 1024, m: 1000 ** 2, mb: 1024 ** 2, g: 1000 ** 3, gb: 1024 ** 3 }
  const bytes = Number(match[1]) * units[(match[2] ?? 'b').toLowerCase()]!
  return Number.isSafeInteger(bytes) ? bytes : null
}

const PUBSUB_LIMIT_FLAG = '--client-output-buffer-limit-pubsub'

/**
 * Takes `--client-output-buffer-limit-pubsub HARD SOFT SECONDS` (three
 * arguments, or one with the three in it, or `=` and that one) out of
 * `argv`: the rest, and the limit in `pushOutputLimit`'s terms.
 */
export function takePubsubLimit (argv: readonly string[]): { rest: string[], limit?: { hardBytes: number, softBytes: number, softMs: number } } {
  const rest: string[] = []
  let limit: { hardBytes: number, softBytes: number, softMs: number } | undefined
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    let values: string[]
    if (arg === PUBSUB_LIMIT_FLAG) {
      const next = argv[i + 1] ?? ''
      values = next.trim().includes(' ') ? next.trim().split(/\s+/) : argv.slice(i + 1, i + 4)
      i += next.trim().includes(' ') ? 1 : 3
    } else if (arg.startsWith(`${PUBSUB_LIMIT_FLAG}=`)) {
      values = arg.slice(PUBSUB_LIMIT_FLAG.length + 1).trim().split(/\s+/)
    } else {
      rest.push(arg)
      continue
    }
    const [hard, soft, seconds] = values.map(v => v ?? '')
    const hardBytes = parseMemory(hard ?? '')
    const softBytes = parseMemory(soft ?? '')
    const softSeconds = /^\d+$/.test(seconds ?? '') ? Number(seconds) : null
    if (values.length !== 3 || hardBytes === null || softBytes === null || softSeconds === null || !Number.isSafeInteger(softSeconds * 1000)) {
      throw new RangeError(`${PUBSUB_LIMIT_FLAG} takes HARD SOFT SECONDS (sizes as 32mb, 8mb, 1024), got ${JSON.stringify(values.join(' '))}`)
    }
    limit = { hardBytes, softBytes, softMs: softSeconds * 1000 }
  }
  return { rest, limit }
}

function nonNegativeInteger (name: string, text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback
  const value = Number(text)
  if (!Number.isInteger(value) || value < 0) throw new RangeError(`--${name} must be a non-negative integer, got ${text}`)
  return value
}

async function main (argv: string[]): Promise<void> {
  const { rest, limit: pubsubOutputLimit } = takePubsubLimit(argv)
  const { values } = parseArgs({
    args: rest,
    options: {
      port: { type: 'string' },
      host: { type: 'string' },
      reactors: { type: 'string' },
      'maxmemory-mb': { type: 'string' },
      'request-timeout-ms': { type: 'string' },
      'proto-max-bulk-len': { type: 'string' },
      'max-message-mb': { type: 'string' },
      'max-arguments': { type: 'string' },
      'max-answer-bytes-per-read': { type: 'string' },
      'shutdown-grace-ms': { type: 'string' },
      ...TLS_FLAG_OPTIONS,
      ...IO_FLAG_OPTIONS
    },
    strict: true
  })
  const port = nonNegativeInteger('port', values.port, 6379)
  const host = values.host ?? '127.0.0.1'
  const reactors = nonNegativeInteger('reactors', values.reactors, 1)
  const maxMemoryBytes = nonNegativeInteger('maxmemory-mb', values['maxmemory-mb'], 64) * 1024 * 1024
  const requestTimeoutMs = nonNegativeInteger('request-timeout-ms', values['request-timeout-ms'], 1000)
  const protoMaxBulkLen = nonNegativeInteger('proto-max-bulk-len', values['proto-max-bulk-len'], DEFAULT_PROTO_MAX_BULK_LEN)
  const maxMessageBytes = nonNegativeInteger('max-message-mb', values['max-message-mb'], DEFAULT_MAX_FRAME_BYTES / 1024 / 1024) * 1024 * 1024
  const maxArguments = nonNegativeInteger('max-arguments', values['max-arguments'], DEFAULT_MAX_ARGUMENTS)
  const graceMs = nonNegativeInteger('shutdown-grace-ms', values['shutdown-grace-ms'], 30_000)
  const answerBytes = values['max-answer-bytes-per-read']
  const maxAnswerBytesPerRead = answerBytes === undefined ? undefined : nonNegativeInteger('max-answer-bytes-per-read', answerBytes, 0)
  const tls = tlsFromFlags(values)
  const io = ioFromFlags(values)
  // The reactor processes forked for --reactors above 1 start with the allocator tuning (see ../malloc-env.ts);
  // each one's server collects once it is idle after it grew (its idleCollection option, on by default).
  tuneForkedProcesses()
  const served = await serveReactors({
    reactors, host, port, graceMs, build: () => redisServer({ maxMemoryBytes, requestTimeoutMs, protoMaxBulkLen, maxMessageBytes, maxArguments, tls, pubsubOutputLimit, io, maxAnswerBytesPerRead })
  })
  if (reactors > 1) console.error(`warning: ${reactors} reactors, ${reactors} separate keyspaces (see examples/redis/main.ts)`)
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
