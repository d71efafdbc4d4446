import type { TlsOptions } from 'node:tls'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Clock } from '../scheduling/clock.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import type { ConnectionStats } from '../transport/framed-connection.js'
import type { IdleCollectionOptions } from './idle-collection.js'
import type { Logger } from './logger.js'
import type { LimitCounters } from './metrics.js'
import type { IoOption } from '../transport/io.js'

// The server's options: their types, defaults and checks. The server
// (reactor/server.ts) reads them; the KRPC server passes them through.

/**
 * The slow-consumer rule for connections that receive pushes, as Redis's
 * `client-output-buffer-limit pubsub 32mb 8mb 60`: a connection whose
 * unsent bytes pass the hard limit is closed at once; one that stays above
 * the soft limit for `softMs` without a break is closed then. So N
 * subscribers that stop reading cost at most N × the hard limit, and a
 * burst above the soft limit that drains in time costs nothing.
 */
export interface PushOutputLimitOptions {
  /** Unsent bytes past which a connection that received pushes is closed at once; default 32 MiB; 0: no hard limit. */
  hardBytes?: number
  /** Unsent bytes above which it may stay only `softMs`; default 8 MiB; 0: no soft limit. */
  softBytes?: number
  /** How long it may stay above `softBytes`; default 60 000 ms. */
  softMs?: number
}

/** Options of a `ProtocolServer` (KRPC's `KrpcServer` takes them too): limits, timeouts, scheduling, TLS and logging; each has a default. */
export interface ServerOptions {
  /** Largest inbound frame, checked as early as the framing allows; default: the protocol's `maxFrameBytes`, else 50 MiB. */
  maxMessageBytes?: number
  /** Deadline for a new connection's set-up (the protocol's handshake, KRPC negotiation); default 3000 ms. */
  negotiationTimeoutMs?: number
  /**
   * Time budget of a request whose frame carries none (memcached, RESP;
   * KRPC without timeout_millis), from the moment its frame arrived: it
   * orders the queue (earliest deadline first) and expires the request
   * there. Default 0: no deadline.
   */
  requestTimeoutMs?: number
  /** Idle connections are closed after this long, never while a call is in flight; default 65000 ms; 0 or less disables. */
  idleTimeoutMs?: number
  /**
   * A frame that has started arriving must be complete within this long
   * (default 60 000 ms; 0 or less disables): a peer that trickles a large
   * frame byte by byte cannot hold its buffer forever. One that stops
   * sending inside a frame is idle and meets `idleTimeoutMs` first.
   */
  frameTimeoutMs?: number
  /**
   * The slowest a frame in progress may arrive, in bytes per second
   * (default 1000; 0 disables): a peer that trickles a frame (slowloris)
   * is never idle, yet holds a connection for the whole `frameTimeoutMs`.
   * A frame that has been arriving for more than `slowFrameGraceMs` with
   * fewer than this many bytes per second past the grace is closed by the
   * idle scan; at `maxConnections`, one that has after only 1 s makes room
   * for a newcomer (as an idle connection does). Time the server is not
   * reading the connection (the outbound budget, `pauseReading`) does not count.
   */
  minFrameBytesPerSecond?: number
  /** How long a frame in progress may take before `minFrameBytesPerSecond` closes it; default 10 000 ms. */
  slowFrameGraceMs?: number
  /**
   * Budget for bytes held in incomplete inbound frames over all connections
   * of this server (default 256 MiB): past it, the connection holding the
   * largest incomplete frame is closed (FRAME_TOO_LARGE).
   */
  maxInboundBufferedBytes?: number
  /**
   * Bound on a connection's unsent response bytes (default 100 MiB),
   * judged on what the kernel did not take. Past it the connection is not
   * read until its peer has taken enough; answers to requests already read
   * are still queued, up to twice the bound. Past twice the bound, or when
   * the peer takes nothing for 500 ms (`SUSPENDED_GRACE_MS`), it is closed
   * (QUEUE_FULL): a client that reads slower than it asks is disconnected.
   */
  maxOutboundBytes?: number
  /**
   * Requests decoded from one read of a connection before the rest of that
   * read waits for the next event-loop turn (default 64): a peer that
   * pipelines thousands of small requests in one read cannot hold the loop
   * from the other connections. Reading that connection stops meanwhile;
   * the rest is kept aside, counted in `maxInboundBufferedBytes`.
   */
  maxFramesPerRead?: number
  /**
   * Bytes the requests of one read may queue on their connection (answers,
   * streamed parts, pushes to it) before the rest of that read waits for
   * the next event-loop turn, as past `maxFramesPerRead` (default 64 KiB;
   * the request that passes it is answered whole): a request that asks for
   * many answers (a SUBSCRIBE of 100 channels is 100 replies) counts by what
   * it produces, so a connection that makes much output per request yields
   * to the others sooner.
   */
  maxAnswerBytesPerRead?: number
  /**
   * The slow-consumer limits of connections that have received a push
   * (`ConnectionHandle.send`, `ConnectionGroup.send`), as Redis's
   * `client-output-buffer-limit pubsub`: past `hardBytes` unsent bytes
   * (default 32 MiB) the connection is closed at once; above `softBytes`
   * (default 8 MiB) for `softMs` (default 60 000 ms) without a break, it
   * is closed then. 0 turns either limit off. Closes are counted
   * (`pushHardLimitClosed`, `pushSoftLimitClosed`) and logged, rate-limited.
   */
  pushOutputLimit?: PushOutputLimitOptions
  /** When `ConnectionHandle.writable` turns false (past `highBytes` unsent, default 64 KiB) and true again with a `'drain'` event (at `lowBytes`, default 32 KiB). */
  writeWatermarks?: WriteWatermarks
  /**
   * Budget for unsent response bytes over all connections (default 512 MiB):
   * while over it, the server stops reading requests from the connections
   * holding the most unsent bytes, and reads again once below it.
   */
  maxOutboundBufferedBytes?: number
  /**
   * Connections this server keeps open (default: the process's descriptor
   * limit less a reserve; 960 under `ulimit -n 1024`). A newcomer at the
   * limit closes the connection idle longest (≥ 1 s, nothing in flight), or
   * is refused at once when none is.
   */
  maxConnections?: number
  /**
   * Connections still negotiating (default 1000, at most half of
   * `maxConnections`); past it the oldest negotiating one is closed for the
   * newcomer. At `maxConnections` with no idle connection, the oldest
   * negotiating one makes room too.
   */
  maxNegotiatingConnections?: number
  /** Largest set-up frame (default 1 MiB), checked as early as the framing allows. */
  maxNegotiationBytes?: number
  /**
   * A handler still running this long after its call's deadline, or after
   * its connection closed, gives its worker back (default 5000 ms; 0
   * disables): its result is dropped and it is counted as abandoned. Per
   * group with `RouteGroupOptions.abandonAfterMs`. In-loop handlers only
   * (a call on an executor, such as a worker thread, holds it until done).
   */
  abandonAfterMs?: number
  /** Abandoned handlers still running, per group, past which no more are abandoned (their workers stay held, so the group answers busy); default 100. */
  maxAbandonedHandlers?: number
  /**
   * Connections older than this (±10 % jitter) are retired, so long-lived
   * clients rebalance across reactors (gRPC's MAX_CONNECTION_AGE): calls in
   * flight are answered, calls arriving later are refused `shutdown` (KRPC:
   * FATAL_SERVER_SHUTTING_DOWN, which clients retry on a new connection), and the connection closes once
   * it is quiet. Default: no limit. See docs/cluster.md.
   */
  maxConnectionAgeMs?: number
  /** Until `markReady()`, requests for unknown groups are refused `unavailable` instead of `no-service`; default true (ready at once). */
  ready?: boolean
  /**
   * `pool` (default): each group's calls go through its deadline-ordered
   * queue to LIFO-parked workers. `direct`: every handler
   * runs at once, unbounded (for comparison; no queue, never busy).
   */
  scheduler?: 'pool' | 'direct'
  /** Workers (concurrent handlers) per group; default 10 (sequential groups: `maxConnections`, see `RouteGroupOptions.execution`). */
  workers?: number
  /**
   * Sequential execution: the calls one connection may have waiting for
   * its previous one (default 256). Past it the connection is not read
   * (its pipelined bytes wait in the kernel) until half have run.
   */
  sessionQueueLength?: number
  /** Bound of each group's queue; default 50. */
  queueLength?: number
  /** `edf` (default): earliest deadline first, a full queue evicts the latest deadline. `fifo`: arrival order, a full queue refuses the newcomer. */
  queue?: QueueDiscipline
  /**
   * Calls per group held back while a burst is absorbed (default 4096):
   * past it, newcomers are judged by the queue at once (busy or
   * eviction). See docs/scheduling.md.
   */
  burstLimit?: number
  /**
   * Busy polling: after a connection reads or sends, keep the event loop
   * polling this many microseconds instead of sleeping, so the next request
   * needs no wake-up. Lowers latency and raises calls/s (most on VMs, where
   * wake-ups are dear) at the price of spinning a core while busy. Off (0)
   * by default. See docs/performance.md.
   */
  busyPollUs?: number
  /**
   * The transport of plain TCP connections: `io_uring` or `epoll` (the
   * native transport, transport/native/), `node` (node:net), or `auto`
   * (the default): io_uring, else epoll, else node:net, said in one log
   * line (a warning with the reason when it fell back). A native backend asked for by name that
   * cannot start is a start-up error (`listen` rejects). The environment
   * variable NYALA_IO overrides it. With `tls`, connections use node:tls
   * (`auto` means `node` then). `stats().io` says which is in use.
   */
  io?: IoOption
  /**
   * A full garbage collection once the process is idle after it grew, so
   * that an attack's buffers are freed (reactor/idle-collection.ts): run
   * while the server listens, stopped by `close()`. Default on, with
   * `IDLE_COLLECTION_DEFAULTS` (every 5000 ms; idle below 0.05 event-loop
   * utilization; RSS 64 MiB above where the last collection left it);
   * `false` turns it off, as NYALA_IDLE_GC=0 in the environment does for
   * every server.
   */
  idleCollection?: IdleCollectionOptions | false
  /** The clock of every deadline, timeout and metric timestamp; default `realClock` (tests pass a `FakeClock`). */
  clock?: Clock
  /**
   * TLS from the first byte: every accepted connection runs a TLS handshake
   * (`node:tls`, these options: cert, key, ca, requestCert,
   * rejectUnauthorized, ...) before the protocol sees a byte; the protocol
   * reads and writes plaintext frames as without it. Connections in their
   * TLS handshake count as negotiating (`maxNegotiatingConnections`,
   * `maxConnections`). With `requestCert` and `rejectUnauthorized`, a
   * handler's `ctx.user` is the client certificate's subject CN (unless
   * the protocol's set-up names a user). See docs/security.md.
   */
  tls?: TlsOptions
  /** Deadline of a connection's TLS handshake (with `tls`), on the server's clock; default 10 000 ms. */
  tlsHandshakeTimeoutMs?: number
  /**
   * Where the server reports refused, evicted and broken connections and
   * listener errors, with structured fields. Default: warnings and errors
   * on stderr (`NYALA_LOG_LEVEL` sets the level); `null` silences it.
   * See docs/logging.md.
   */
  logger?: Logger | null
}

/** Counters of one open connection of the server (`Server.connectionStats`). */
export interface ServerConnectionStats extends ConnectionStats {
  /** `ip:port` of the peer. */
  remoteAddress: string
  /** Its calls received and not answered yet (queued or running). */
  callsInFlight: number
}

/** Counters the server keeps (the limits' counters are also Prometheus counters). */
export interface ServerStats extends LimitCounters {
  /** Connections accepted since start (not those refused at `maxConnections`). */
  connectionsAccepted: number
  /** Connections open now, negotiating ones included. */
  connectionsOpen: number
  /** Requests received since start, refused ones included. */
  callsReceived: number
  /** Calls answered with their handler's response. */
  callsSucceeded: number
  /** Calls the server answered itself (`RefusalReason`: busy, expired, failed, ...). */
  callsFailed: number
  /** Calls received and not answered yet, over every connection (queued or running). */
  callsInFlight: number
  /** Connections closed for a stream the server could not read (malformed frames, duplicate ids, TLS record errors). */
  badFrames: number
  /** Connections closed because they reached `maxConnectionAgeMs`. */
  agedClosed: number
  /** Handlers abandoned after `abandonAfterMs` (their workers given back). */
  handlersAbandoned: number
  /** Abandoned handlers still running. */
  abandonedRunning: number
  /** TLS handshakes that failed (bad records, plaintext, an untrusted or missing client certificate); 0 without `tls`. */
  tlsHandshakeFailures: number
  /** TLS handshakes closed by `tlsHandshakeTimeoutMs`; 0 without `tls`. */
  tlsHandshakeTimeouts: number
  /** The transport in use (`io`), once listening: 'io_uring', 'epoll' or 'node'. */
  io: 'io_uring' | 'epoll' | 'node'
}

/** `negotiationTimeoutMs` by default. */
export const DEFAULT_NEGOTIATION_TIMEOUT_MS = 3000
/** `tlsHandshakeTimeoutMs` by default. */
export const DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS = 10_000
/** `maxMessageBytes` by default, when the protocol names no `maxFrameBytes`. */
export const DEFAULT_MAX_MESSAGE_BYTES = 50 * 1024 * 1024
/** `idleTimeoutMs` by default. */
export const DEFAULT_IDLE_TIMEOUT_MS = 65_000
/** `frameTimeoutMs` by default. */
export const DEFAULT_FRAME_TIMEOUT_MS = 60_000
/** `maxNegotiationBytes` by default. */
export const DEFAULT_MAX_NEGOTIATION_BYTES = 1024 * 1024
/** `abandonAfterMs` by default. */
export const DEFAULT_ABANDON_AFTER_MS = 5000
/** `maxAbandonedHandlers` by default. */
export const DEFAULT_MAX_ABANDONED = 100
/** Open descriptors this close to the limit mean accept() fails (libuv keeps one in reserve). */
export const DESCRIPTOR_SLACK = 2
/**
 * How long a connection over `maxOutboundBytes` (not read meanwhile) may go
 * without its peer taking a byte of what waits before it is closed as a
 * slow consumer (QUEUE_FULL).
 */
export const SUSPENDED_GRACE_MS = 500
/** Refusals, evictions and accept errors are logged at most this often, each kind. */
export const LOG_INTERVAL_MS = 10_000
/** `workers` (per group) by default. */
export const DEFAULT_WORKERS = 10
/** `queueLength` (per group) by default. */
export const DEFAULT_QUEUE_LENGTH = 50
/**
 * A retired connection closes once it has been quiet this long: its client
 * stopped using it (the nyala client does on the first FATAL answer), so a
 * call crossing the close on the wire is unlikely.
 */
export const RETIRED_QUIET_MS = 1000
/** A retired connection whose client keeps sending (each call answered FATAL) closes this long after retirement, between calls. */
export const RETIRED_BUSY_LIMIT_MS = 5000

/** High and low watermarks of a connection's unsent bytes (`ConnectionHandle.writable`). */
export interface WriteWatermarks {
  /** Past this many unsent bytes `writable` turns false; default 64 KiB. */
  highBytes?: number
  /** At or below this many it turns true again and `'drain'` is emitted; default 32 KiB. */
  lowBytes?: number
}

/** The limits in force, defaults resolved (`limits()`, as `nyala serve` reports them). */
export interface ServerLimits {
  /** `ServerOptions.maxConnections`, resolved (by default from the descriptor limit). */
  maxConnections: number
  /** `ServerOptions.maxNegotiatingConnections`, resolved. */
  maxNegotiatingConnections: number
  /** `ServerOptions.maxInboundBufferedBytes`, resolved. */
  maxInboundBufferedBytes: number
  /** `ServerOptions.maxOutboundBufferedBytes`, resolved. */
  maxOutboundBufferedBytes: number
}

/** `value` when it is a finite number of at least 0; else INVALID_ARGUMENT naming the option. */
export function nonNegative (value: number, name: string): number {
  if (!(Number.isFinite(value) && value >= 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be a number of at least 0, got ${value}`)
  return value
}

/** `value` when it is an integer of at least 1; else INVALID_ARGUMENT naming the option. */
export function atLeastOne (value: number, name: string): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be an integer of at least 1, got ${value}`)
  return value
}

/** `writeWatermarks` resolved: integers 0 <= lowBytes <= highBytes, else INVALID_ARGUMENT. */
export function writeWatermarksOf (options: ServerOptions, defaultHigh: number, defaultLow: number): { highBytes: number, lowBytes: number } {
  const highBytes = options.writeWatermarks?.highBytes ?? defaultHigh
  const lowBytes = options.writeWatermarks?.lowBytes ?? Math.min(defaultLow, highBytes)
  if (!(Number.isSafeInteger(highBytes) && Number.isSafeInteger(lowBytes) && lowBytes >= 0 && lowBytes <= highBytes)) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `writeWatermarks needs integers 0 <= lowBytes <= highBytes, got ${lowBytes} and ${highBytes}`)
  }
  return { highBytes, lowBytes }
}

/** The group defaults the call dispatch takes from the server's options. */
export interface GroupDefaults {
  workers: number
  queueLength: number
  queue: QueueDiscipline
  abandonAfterMs: number
  maxAbandonedHandlers: number
  burstLimit: number | undefined
  requestTimeoutMs: number
}

/** The group defaults of `options`, resolved. */
export function groupDefaultsOf (options: ServerOptions): GroupDefaults {
  return {
    workers: options.workers ?? DEFAULT_WORKERS,
    queueLength: options.queueLength ?? DEFAULT_QUEUE_LENGTH,
    queue: options.queue ?? 'edf',
    abandonAfterMs: options.abandonAfterMs ?? DEFAULT_ABANDON_AFTER_MS,
    maxAbandonedHandlers: options.maxAbandonedHandlers ?? DEFAULT_MAX_ABANDONED,
    burstLimit: options.burstLimit,
    requestTimeoutMs: options.requestTimeoutMs ?? 0
  }
}

/** `maxFramesPerRead` and `maxAnswerBytesPerRead` are at least 1 (Infinity: no budget) when given, else INVALID_ARGUMENT: checked when the server is made, not at its first connection. */
export function checkReadBudgets (options: ServerOptions): void {
  for (const name of ['maxFramesPerRead', 'maxAnswerBytesPerRead'] as const) {
    const value = options[name]
    if (value !== undefined && !(value >= 1)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${name} must be at least 1, got ${String(value)}`)
  }
}

/** `tlsHandshakeTimeoutMs` resolved: a positive integer, else INVALID_ARGUMENT (checked with or without `tls`). */
export function tlsHandshakeTimeoutOf (options: ServerOptions): number {
  const ms = options.tlsHandshakeTimeoutMs
  if (ms !== undefined && !(Number.isSafeInteger(ms) && ms > 0)) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `tlsHandshakeTimeoutMs must be a positive integer, got ${ms}`)
  }
  return ms ?? DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS
}
