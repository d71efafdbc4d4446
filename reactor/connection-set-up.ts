// The protocol's set-up of a new connection (`ServerProtocol.handshake`),
// the phase between accept (and TLS) and the first request: its frames go
// to the handshake under `maxNegotiationBytes`, within
// `negotiationTimeoutMs`; `done` names the peer and lets requests flow,
// `error` refuses it (logged, rate-limited), `close` ends it without a
// failure (PostgreSQL's CancelRequest: nothing logged).
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Handshake } from '../transport/framed-connection.js'
import { SET_UP_CLOSED } from '../transport/set-up.js'
import type { ConnectionRecord } from './connection-record.js'
import type { RateLimitedLog } from './logger.js'
import type { ServerContext } from './server-context.js'
import { DEFAULT_MAX_NEGOTIATION_BYTES } from './server-options.js'

/** Runs the protocol's set-up on each new connection (none: ready at once). */
export class ConnectionSetUp {
  readonly #ctx: ServerContext<ConnectionRecord>
  /** The connections in set-up (admission's), oldest first. */
  readonly #negotiating: Set<ConnectionRecord>
  // Peers choose how often this happens: rate-limited.
  readonly #logFailed: RateLimitedLog

  constructor (ctx: ServerContext<ConnectionRecord>, negotiating: Set<ConnectionRecord>) {
    this.#ctx = ctx
    this.#negotiating = negotiating
    this.#logFailed = ctx.rateLimitedLog()
  }

  /** Starts the set-up of `sc` (after its TLS handshake, if any). */
  start (sc: ConnectionRecord, remoteAddress: string): void {
    const ctx = this.#ctx
    const options = ctx.options
    const connection = sc.connection
    const setUp = ctx.protocol.handshake
    if (setUp === undefined) {
      sc.markReady()
      return
    }
    this.#negotiating.add(sc)
    const protocolHandshake = setUp(remoteAddress, sc.handle!)
    const handshake: Handshake<{ user?: string }> = {
      ...protocolHandshake,
      maxFrameBytes: Math.min(protocolHandshake.maxFrameBytes ?? Infinity, options.maxNegotiationBytes ?? DEFAULT_MAX_NEGOTIATION_BYTES),
      onFrame: (frame, pipelined) => {
        const step = protocolHandshake.onFrame(frame, pipelined)
        const record = (s: Awaited<typeof step>): typeof s => {
          if (s.done !== undefined) {
            sc.markReady()
            sc.setPeer(s.done.user ?? sc.peer.user, sc.handle!)
            this.#negotiating.delete(sc)
          }
          return s
        }
        return step instanceof Promise ? step.then(record) : record(step)
      }
    }
    const timer = ctx.clock.setTimer(() => {
      connection.destroy(new RpcError(ErrorCode.NEGOTIATION_FAILED, `negotiation with ${remoteAddress} timed out after ${options.negotiationTimeoutMs} ms`))
    }, options.negotiationTimeoutMs)
    connection.handshake(handshake).then(() => {
      ctx.clock.clearTimer(timer)
    }, (error: RpcError) => {
      ctx.clock.clearTimer(timer)
      // Closed by the set-up on purpose: no failure.
      if (error.message === SET_UP_CLOSED) return
      const fields = { protocol: ctx.protocol.name, remote: remoteAddress, code: error.code }
      // A peer that hangs up before set-up (a port probe, a health check) is no fault of anyone's.
      if (error.code === ErrorCode.CONNECTION_CLOSED) ctx.log.info(`negotiation with ${remoteAddress} failed: ${error.message}`, fields)
      else this.#logFailed.log(ctx.warn, () => `negotiation with ${remoteAddress} failed: ${error.message}`, () => fields)
    })
  }
}
