import type { LimitCounters } from './metrics.js'
import { RateLimitedLog, type LogFields } from './logger.js'
import { LOG_INTERVAL_MS, type ServerStats } from './server-options.js'
import type { IoBackend } from '../transport/io.js'

/** What the server reads live, beside its counters, for a `stats()` snapshot. */
export interface LiveStats {
  connectionsOpen: number
  callsInFlight: number
  inboundBudgetClosed: number
  outboundPauses: number
  abandonedRunning: number
  io: IoBackend
}

/**
 * The server's counters, one named method per event: the connections,
 * calls and limits counted since start. A bad frame is logged where it is
 * counted (a warning, at most one line per interval: peers choose how often
 * they send one). `stats()` and `limitCounters()` are the snapshots.
 * Each method is a small monomorphic one, so V8 inlines it on the paths
 * that count per call.
 */
export class ServerCounters {
  #connectionsAccepted = 0
  #callsReceived = 0
  #callsSucceeded = 0
  #callsFailed = 0
  #badFrames = 0
  #idleClosed = 0
  #agedClosed = 0
  #frameTimeouts = 0
  #connectionsRefused = 0
  #connectionsEvicted = 0
  #negotiatingEvicted = 0
  #acceptErrors = 0
  #descriptorsExhausted = 0
  #handlersAbandoned = 0
  #tlsHandshakeFailures = 0
  #tlsHandshakeTimeouts = 0
  #pushesSent = 0
  #pushHardLimitClosed = 0
  #pushSoftLimitClosed = 0
  #slowFramesClosed = 0
  readonly #protocolName: string
  readonly #warn: (message: string, fields?: LogFields) => void
  readonly #logBadData: RateLimitedLog

  constructor (protocolName: string, warn: (message: string, fields?: LogFields) => void, now: () => number) {
    this.#protocolName = protocolName
    this.#warn = warn
    this.#logBadData = new RateLimitedLog(LOG_INTERVAL_MS, now)
  }

  /** A connection was accepted (within the limits). */
  accepted (): void { this.#connectionsAccepted++ }
  /** A request frame became a call (or was refused as one). */
  callReceived (): void { this.#callsReceived++ }
  /** A call was answered with its handler's response. */
  callSucceeded (): void { this.#callsSucceeded++ }
  /** The server answered a call itself (busy, expired, failed, ...). */
  callFailed (): void { this.#callsFailed++ }

  /**
   * A connection's stream could not be read (a malformed frame, a bad id, a
   * TLS record error): counted, and logged as `received bad data from
   * <remoteAddress>: <why>`, rate-limited.
   */
  badFrame (remoteAddress: string, why: string, code: string | undefined): void {
    this.#badFrames++
    this.#logBadData.log(this.#warn, () => `received bad data from ${remoteAddress}: ${why}`, () => ({ protocol: this.#protocolName, remote: remoteAddress, code }))
  }

  /** A connection was closed after `idleTimeoutMs` without progress. */
  idleClosed (): void { this.#idleClosed++ }
  /** A connection was closed at its maximum age. */
  agedClosed (): void { this.#agedClosed++ }
  /** A connection was closed for a frame slower than `frameTimeoutMs`. */
  frameTimedOut (): void { this.#frameTimeouts++ }
  /** A connection was closed for a frame arriving below `minFrameBytesPerSecond`. */
  slowFrameClosed (): void { this.#slowFramesClosed++ }
  /** A newcomer was refused at `maxConnections`. */
  connectionRefused (): void { this.#connectionsRefused++ }
  /** A connection was closed to admit a newcomer at `maxConnections`. */
  connectionEvicted (): void { this.#connectionsEvicted++ }
  /** A negotiating connection was closed to admit a newcomer. */
  negotiatingEvicted (): void { this.#negotiatingEvicted++ }
  /** accept() failed, or a new connection's set-up threw. */
  acceptError (): void { this.#acceptErrors++ }
  /** A scan found the process at its descriptor limit. */
  descriptorsExhausted (): void { this.#descriptorsExhausted++ }
  /** A handler was abandoned (its worker given back). */
  handlerAbandoned (): void { this.#handlersAbandoned++ }
  /** A TLS handshake failed. */
  tlsHandshakeFailed (): void { this.#tlsHandshakeFailures++ }
  /** A TLS handshake ran out of `tlsHandshakeTimeoutMs`. */
  tlsHandshakeTimedOut (): void { this.#tlsHandshakeTimeouts++ }
  /** A message was pushed to a connection. */
  pushSent (): void { this.#pushesSent++ }
  /** A connection was closed by the push output limit: at once over the hard limit, or over the soft one for its period. */
  pushLimitClosed (hard: boolean): void {
    if (hard) this.#pushHardLimitClosed++
    else this.#pushSoftLimitClosed++
  }

  /** The limits' counters, as `ServerMetrics` exposes them; the budgets' two are read live. */
  limitCounters (inboundBudgetClosed: number, outboundPauses: number): LimitCounters {
    return {
      idleClosed: this.#idleClosed,
      frameTimeouts: this.#frameTimeouts,
      inboundBudgetClosed,
      outboundPauses,
      connectionsRefused: this.#connectionsRefused,
      connectionsEvicted: this.#connectionsEvicted,
      negotiatingEvicted: this.#negotiatingEvicted,
      acceptErrors: this.#acceptErrors,
      descriptorsExhausted: this.#descriptorsExhausted,
      pushesSent: this.#pushesSent,
      pushHardLimitClosed: this.#pushHardLimitClosed,
      pushSoftLimitClosed: this.#pushSoftLimitClosed,
      slowFramesClosed: this.#slowFramesClosed
    }
  }

  /** Every counter, with what the server reads live, in a new object (`ProtocolServer.stats()`). */
  stats (live: LiveStats): ServerStats {
    return {
      connectionsAccepted: this.#connectionsAccepted,
      callsReceived: this.#callsReceived,
      callsSucceeded: this.#callsSucceeded,
      callsFailed: this.#callsFailed,
      badFrames: this.#badFrames,
      idleClosed: this.#idleClosed,
      agedClosed: this.#agedClosed,
      frameTimeouts: this.#frameTimeouts,
      connectionsRefused: this.#connectionsRefused,
      connectionsEvicted: this.#connectionsEvicted,
      negotiatingEvicted: this.#negotiatingEvicted,
      acceptErrors: this.#acceptErrors,
      descriptorsExhausted: this.#descriptorsExhausted,
      handlersAbandoned: this.#handlersAbandoned,
      tlsHandshakeFailures: this.#tlsHandshakeFailures,
      tlsHandshakeTimeouts: this.#tlsHandshakeTimeouts,
      pushesSent: this.#pushesSent,
      pushHardLimitClosed: this.#pushHardLimitClosed,
      pushSoftLimitClosed: this.#pushSoftLimitClosed,
      slowFramesClosed: this.#slowFramesClosed,
      connectionsOpen: live.connectionsOpen,
      callsInFlight: live.callsInFlight,
      inboundBudgetClosed: live.inboundBudgetClosed,
      outboundPauses: live.outboundPauses,
      abandonedRunning: live.abandonedRunning,
      io: live.io
    }
  }
}
