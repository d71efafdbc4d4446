import type { RpcError } from '../codec/errors.js'
import type { ConnectionHandle } from '../codec/protocol.js'
import type { FramedConnection } from '../transport/framed-connection.js'
import type { FrameCandidate } from './admission.js'
import { ConnectionAnswers, type AnswerOrder } from './answer-order.js'
import { CallTable } from './call-table.js'
import { ScanRecord } from './connection-scan.js'
import type { CallPeer, InboundCall } from './inbound-call.js'
import { PushRecord } from './push-output-limit.js'
import type { SessionQueue, SessionReads } from './session-order.js'

/**
 * A connection's public handle as the server holds it (a
 * `ServerConnectionHandle`, which holds the ConnectionRecord in turn): handed
 * out as `ctx.connection`, and told when the connection closes.
 */
export interface ServerHandle extends ConnectionHandle, SessionReads {
  /** The connection closed: the handle lets go of it. */
  connectionClosed: (error: RpcError | undefined) => void
}

/**
 * The server's state of one open connection: who it is (address, peer,
 * protocol state, handle), its calls in flight and whether its set-up is
 * done. What each concern keeps per connection hangs on it as a record of
 * that concern's own: `answers` (the answer order: places, held answers,
 * closing), `scan` (activity, the frame in progress, age) and `push` (the
 * push output limit).
 */
export class ConnectionRecord implements FrameCandidate {
  readonly connection: FramedConnection
  readonly remoteAddress: string
  /** Calls in flight, by call id (protocols that match by id) or by `seq` (in-order protocols). */
  readonly inFlight = new CallTable<InboundCall>()
  /** Its answers and the way back to it from its calls (answer-order.ts). */
  readonly answers: ConnectionAnswers
  /** What the periodic scan follows of it (connection-scan.ts). */
  readonly scan: ScanRecord
  /** What the push output limit follows of it (push-output-limit.ts). */
  readonly push = new PushRecord()
  /** Its sequential calls (session-order.ts), once it has had one; null before. */
  sequence: SessionQueue | null = null
  /** Closed by a bad frame (already counted). */
  badFrame = false
  /** When the connection closed; -1 while open. */
  closedAt = -1
  /** Who its calls come from: a small object of its own, so a kept call context does not keep the connection. */
  peer: CallPeer
  /** The protocol's own state for this connection (`ServerProtocol.connectionState`); set once, at accept. */
  state: unknown
  /** Its public handle (`ctx.connection`), made at accept. */
  handle: ServerHandle | null = null
  /** `framesRead` when the set-up was done (the set-up's own frames); -1 until then. */
  #framesAtReady = -1

  constructor (connection: FramedConnection, remoteAddress: string, now: number, order: AnswerOrder) {
    this.connection = connection
    this.remoteAddress = remoteAddress
    this.answers = new ConnectionAnswers(order, connection, remoteAddress, this.inFlight)
    this.scan = new ScanRecord(now)
    this.state = undefined
    this.peer = NO_PEER
  }

  /** The set-up is done (or there is none). */
  get ready (): boolean {
    return this.#framesAtReady >= 0
  }

  /** Marks the set-up done (once): the frames read so far were the set-up's. */
  markReady (): void {
    if (this.#framesAtReady < 0) this.#framesAtReady = this.connection.framesRead
  }

  /** It has sent a request frame since its set-up (admission closes silent openers first). */
  get spoke (): boolean {
    return this.#framesAtReady >= 0 && this.connection.framesRead > this.#framesAtReady
  }

  /** A session (a group member, or marked by its protocol): never closed for a newcomer at the connection limit. */
  get session (): boolean {
    return this.handle?.isSession ?? false
  }

  /** Who its calls come from, from now on (at accept, and when set-up or TLS names the user). */
  setPeer (user: string, connection: CallPeer['connection']): void {
    this.peer = Object.freeze({ user, remoteAddress: this.remoteAddress, state: this.state, connection })
  }

  /** Set up, nothing in flight or unsent, and no activity since the last idle scan. */
  get quiet (): boolean {
    return this.ready && this.inFlight.size === 0 && !this.connection.isBusy && this.connection.activity === this.scan.lastActivity
  }

  get idleSince (): number {
    return this.scan.lastActiveAt
  }
}

const NO_PEER: CallPeer = Object.freeze({ user: '', remoteAddress: '', state: undefined, connection: undefined })
