/**
 * Opens one connection of the client engine: the socket and its connect
 * deadline, the protocol's set-up (handshake) and the session it gives, the
 * liveness pings, and the connection's readiness, which the balancer hears of.
 */
import type { ClientHandshake } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { HandshakeStep } from '../../codec/protocol.js'
import type { Clock } from '../../scheduling/clock.js'
import type { Slot } from '../balancer.js'
import { ConnectionLiveness, type LivenessOptions } from '../connection-liveness.js'
import { onAnswer, type AnswerOwner } from './answers.js'
import type { CallConnection, PendingCall } from './pending-call.js'
import { PeerConnection, type PeerOwner, type PeerSettings } from './peer-connection.js'
import type { Target } from './targets.js'

/** What opening a connection needs of the client engine that owns it. */
export interface ConnectionOwner<Req, Res> extends PeerOwner<PendingCall<Req, Res>>, AnswerOwner<Req, Res> {
  /** Fails the call (unless it has settled). */
  readonly fail: (call: PendingCall<Req, Res>, error: RpcError) => void
  readonly clock: Clock
  /** Open connections by slot key: the new one joins them. */
  readonly connections: Map<string, CallConnection<Req, Res>>
  /** The connection closed: every call on it fails with `error`. */
  connectionClosed: (cc: CallConnection<Req, Res>, error: RpcError) => void
  /** Writes an internal call of `request` on `cc` (a ping), without a caller or a deadline. */
  writeInternal: (cc: CallConnection<Req, Res>, request: Req) => void
}

/** How the engine's connections are opened, and the counters of their liveness checks. */
export interface ConnectionSetup {
  /** What every connection is opened with. */
  readonly settings: PeerSettings
  /** Deadline of a connection's connect and handshake. */
  readonly connectTimeoutMs: number
  /** The liveness pings' options; null: off (or the protocol has no `ping`). */
  readonly liveness: LivenessOptions | null
  /** Pings sent, and connections closed because nothing came back. */
  readonly health: { pings: number, unresponsive: number }
}

/** Opens a connection to `slot` of `target` and adds it to the owner's connections; it is ready once connected and set up. */
export function openConnection<Req, Res> (owner: ConnectionOwner<Req, Res>, setup: ConnectionSetup, target: Target, slot: Slot): CallConnection<Req, Res> {
  const protocol = owner.protocol
  const clock = owner.clock
  const tls = setup.settings.tls !== undefined
  const handshake: ClientHandshake<unknown> | undefined = protocol.handshake?.(`${slot.address.host}:${slot.address.port}`, slot.address.host)
  const cc = new PeerConnection<PendingCall<Req, Res>>(owner, slot, target.balancer, setup.settings, owner.inOrder, protocol.maxId ?? 0xffffffff, handshake?.failure !== undefined)
  const key = cc.endpoint
  const connection = cc.connection
  owner.connections.set(slot.key, cc)
  if (setup.liveness !== null) cc.liveness = livenessOf(owner, setup, cc)
  connection.attach({
    onFrame: (buf, start, end) => onAnswer(owner, cc, buf, start, end),
    onClose: (error) => owner.connectionClosed(cc, cc.closeReason(error, handshake))
  })
  const connectMs = setup.connectTimeoutMs
  cc.connectTimer = clock.setTimer(() => {
    cc.connectTimer = null
    if (cc.ready) return
    cc.setupTimedOut = true
    const setupName = protocol.setupName ?? `${protocol.name} set-up`
    // With a handshake, the deadline is the set-up's, whether or not the
    // 'connect' event has come yet (the peer may have accepted already).
    connection.destroy(cc.connected || handshake !== undefined
      ? new RpcError(ErrorCode.NEGOTIATION_FAILED, `${setupName} with ${key} timed out after ${connectMs} ms`)
      : new RpcError(ErrorCode.CONNECT_FAILED, `cannot connect to ${key}: timed out after ${connectMs} ms`))
  }, connectMs)
  cc.socket.once(tls ? 'secureConnect' : 'connect', () => {
    cc.connected = true
    if (handshake === undefined) ready(clock, cc)
  })
  if (handshake !== undefined) {
    // The session is known at the step that finishes the handshake: the
    // requests held for it are written then, before the promise settles.
    const onFrame = handshake.onFrame
    const record = (step: HandshakeStep<unknown>): HandshakeStep<unknown> => {
      if (step.done !== undefined) cc.session = step.done
      return step
    }
    connection.handshake<unknown>({
      ...handshake,
      onFrame: (frame, pipelined) => {
        const step = onFrame(frame, pipelined)
        return step instanceof Promise ? step.then(record) : record(step)
      }
    }).then((session) => {
      cc.session = session
      ready(clock, cc)
      // The peer's protocol answered (a TCP connect alone proves nothing): a host being probed is alive.
      if (!cc.closed) cc.balancer.heardFrom(cc.slot)
    }, () => {})
  }
  return cc
}

// The silence check of `cc`: its ping is an internal call whose answer (like any frame) proves the peer alive.
function livenessOf<Req, Res> (owner: ConnectionOwner<Req, Res>, setup: ConnectionSetup, cc: CallConnection<Req, Res>): ConnectionLiveness {
  const health = setup.health
  return new ConnectionLiveness(owner.clock, setup.liveness!, {
    ping: () => {
      if (cc.closed || !cc.ready) return
      health.pings++
      owner.writeInternal(cc, owner.protocol.ping!())
    },
    dead: (silentMs) => {
      health.unresponsive++
      cc.balancer.unresponsive(cc.slot)
      cc.connection.destroy(new RpcError(ErrorCode.CONNECTION_CLOSED, `connection to ${cc.endpoint} closed: nothing read for ${Math.round(silentMs)} ms, not even an answer to a ping`))
    }
  })
}

// `cc` is connected and set up: its calls may be written, and its host counts as up.
function ready<Req, Res> (clock: Clock, cc: CallConnection<Req, Res>): void {
  if (cc.closed) return
  cc.ready = true
  if (cc.connectTimer !== null) clock.clearTimer(cc.connectTimer)
  cc.connectTimer = null
  cc.balancer.succeeded(cc.slot)
}
