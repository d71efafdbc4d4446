/**
 * What the client engine takes and reports: its options (which
 * `ProtocolClientOptions` and KRPC's `ClientOptions` name), their defaults
 * and checks, and its health and connection counters.
 */
import { createSecureContext, type ConnectionOptions as TlsConnectionOptions } from 'node:tls'
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from '../../codec/frame-decoder.js'
import type { Clock } from '../../scheduling/clock.js'
import type { OutlierEjectionOptions, OutlierEjectionStats } from '../../scheduling/outlier-ejection.js'
import type { BusyPoller } from '../../transport/busy-poll.js'
import type { ConnectionStats } from '../../transport/framed-connection.js'
import type { BalancePolicy } from '../balancer.js'
import type { LivenessOptions } from '../connection-liveness.js'
import type { Logger } from '../logger.js'
import type { PeerSettings } from './peer-connection.js'
import { DEFAULT_MAX_RESOLVED_ADDRESSES } from './targets.js'

/** What every client made on the engine takes (`ProtocolClientOptions` and KRPC's `ClientOptions` name them). */
export interface ClientEngineOptions {
  /** Connections per endpoint (default 1); each call picks one by `balance`. */
  connectionsPerEndpoint?: number
  /** How a call picks its connection; default `p2c` (power of two choices on calls in flight). */
  balance?: BalancePolicy
  /** Resolve each endpoint's host name to all its addresses (DNS) and balance over them; re-resolved every 30 s. */
  resolveAll?: boolean
  /**
   * With `resolveAll`: the most addresses an endpoint's names are balanced
   * over (each gets `connectionsPerEndpoint` connections); default 32. A
   * name resolving to more gives each client a subset of this many, drawn
   * by rendezvous hashing on a seed of the client's own (as gRPC's and
   * Envoy's subsetting): different clients use different subsets, one
   * client the same subset for the same addresses, and when a resolution
   * changes the subset is drawn again, keeping the addresses still present
   * unless new ones outrank them.
   */
  maxResolvedAddresses?: number
  /** With `resolveAll`: how host names are resolved; default node:dns's `lookup(host, { all: true })` (tests pass a stub). */
  lookup?: (hostname: string) => Promise<ReadonlyArray<{
    /** One of the name's IP addresses. */
    readonly address: string
  }>>
  /** Timeout of calls that name none, covering connect, set-up and retries; default 30000 ms; 0: no deadline. */
  defaultTimeoutMs?: number
  /** Deadline of a connection's connect and handshake; default 3000 ms. A short call timeout does not shorten it. */
  connectTimeoutMs?: number
  /** Largest answer frame; default the protocol's `maxFrameBytes`, else 50 MiB. */
  maxMessageBytes?: number
  /** Bound on a connection's queued request bytes; a call over it fails with RPC_ERR_QUEUE_FULL (unsent, so retried). */
  maxOutboundBytes?: number
  /** Calls in flight per connection (awaiting an answer); a call over it fails with RPC_ERR_QUEUE_FULL. Default 100000. */
  maxInFlight?: number
  /** TLS from the first byte (`node:tls` `tls.connect` options); see `ProtocolClientOptions.tls`. */
  tls?: TlsConnectionOptions
  /** `stream` answers: the most parts one call gathers; default 100000 (see `ProtocolClientOptions`). */
  maxStreamParts?: number
  /** Busy polling after each read and send, in microseconds (as `ServerOptions.busyPollUs`); off by default. */
  busyPollUs?: number
  /**
   * Outlier ejection of each target's hosts (scheduling/outlier-ejection.ts):
   * a host whose calls time out or lose their connection
   * `consecutiveFailures` times in a row (default 5), or whose connection
   * stays silent through a ping, is skipped for 500 ms doubling up to 3 s,
   * then given one call (or ping) as a probe; at most half the hosts
   * (rounded up, never all) are out at once. On by default; false: off.
   */
  ejection?: OutlierEjectionOptions | false
  /**
   * For protocols with a `ping` (reactor/connection-liveness.ts): after
   * `pingAfterMs` (default 200) of silence while calls wait the ping goes,
   * and after `pingTimeoutMs` (default 300) more with nothing read the
   * connection is closed (RPC_ERR_CONNECTION_CLOSED; idempotent calls are
   * retried elsewhere) and its host ejected. false: off.
   */
  liveness?: LivenessOptions | false
  /** TCP keepalive on every connection, the first probe after this long idle; default 10000 ms; 0: off. */
  keepAliveMs?: number
  /** Where warnings go (rate-limited); default warnings on stderr, null: nowhere. */
  logger?: Logger | null
  /** Time for deadlines, backoffs and set-up timers; default the real clock (tests pass a `FakeClock`). */
  clock?: Clock
}

/** How a client copes with hosts that fail: outlier ejection and liveness pings. */
export interface ClientHealthStats {
  /** Ejections, re-admissions, the hosts out now; null when off. */
  ejection: OutlierEjectionStats | null
  /** Liveness pings sent (`ClientProtocol.ping`). */
  pings: number
  /** Connections closed because nothing came back, not even an answer to a ping. */
  unresponsiveConnections: number
}

/** Counters of one open connection. */
export interface EngineConnectionStats extends ConnectionStats {
  /** The connection's endpoint, `host:port`. */
  endpoint: string
  /** Calls awaiting an answer on this connection. */
  pendingCalls: number
}

/** Timeout of calls that name none (`defaultTimeoutMs`). */
export const DEFAULT_TIMEOUT_MS = 30_000
/** Deadline of a connection's connect and handshake (`connectTimeoutMs`). */
export const DEFAULT_CONNECT_TIMEOUT_MS = 3000
/** Calls in flight per connection (`maxInFlight`). */
export const DEFAULT_MAX_IN_FLIGHT = 100_000
/** The most parts one `stream` call gathers (`maxStreamParts`). */
export const DEFAULT_MAX_STREAM_PARTS = 100_000
const DEFAULT_KEEPALIVE_MS = 10_000
/** Warnings of one kind are logged at most this often. */
export const LOG_INTERVAL_MS = 10_000

/** The connection settings the engine's options make, checked, and the cap on an endpoint's resolved addresses. */
export interface ConnectionOptionsOf {
  /** What every connection is opened with. */
  settings: PeerSettings
  /** `maxResolvedAddresses`, checked. */
  maxResolvedAddresses: number
}

/** Checks the connection options (`keepAliveMs`, `maxResolvedAddresses`) and makes the connections' settings. */
export function connectionOptionsOf (protocol: ClientProtocol<unknown, unknown>, options: ClientEngineOptions, busyPoller: BusyPoller | undefined): ConnectionOptionsOf {
  const tls = options.tls
  const keepAliveMs = options.keepAliveMs ?? DEFAULT_KEEPALIVE_MS
  if (!(keepAliveMs >= 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `keepAliveMs must be at least 0, got ${options.keepAliveMs}`)
  const maxResolvedAddresses = options.maxResolvedAddresses ?? DEFAULT_MAX_RESOLVED_ADDRESSES
  if (!(Number.isInteger(maxResolvedAddresses) && maxResolvedAddresses >= 1)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `maxResolvedAddresses must be an integer >= 1, got ${options.maxResolvedAddresses}`)
  const settings: PeerSettings = {
    framing: protocol.framing,
    maxFrameBytes: options.maxMessageBytes ?? protocol.maxFrameBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
    maxOutboundBytes: options.maxOutboundBytes,
    busyPoller,
    keepAliveMs,
    // Bad certificates and keys throw here, not at each connect.
    tls: tls === undefined ? undefined : { ...tls, secureContext: tls.secureContext ?? createSecureContext(tls) }
  }
  return { settings, maxResolvedAddresses }
}
