import type { AnswerSlices } from '../codec/protocol.js'
import type { Connection } from '../transport/connection.js'
import type { AdmissionCandidate } from './admission.js'
import { CallTable } from './call-table.js'
import type { CallPeer, InboundCall } from './inbound-call.js'

/**
 * The server's state of one open connection: its calls in flight, its
 * set-up, its place in the idle, frame and age scans, and, for in-order
 * protocols, the answers that are ready but wait for an earlier one.
 */
export class ServerConnection implements AdmissionCandidate {
  readonly connection: Connection
  readonly remoteAddress: string
  /** Calls in flight, by call id (protocols that match by id) or by `seq` (in-order protocols). */
  readonly inFlight = new CallTable<InboundCall>()
  /** The set-up is done (or there is none). */
  ready = false
  /** Closed by a bad frame (already counted). */
  badFrame = false
  /** A call asked to close the connection after its answer: no request after it is read. */
  closing = false
  lastActivity = -1
  lastOutbound = 0
  lastActiveAt: number
  /** The incomplete frame the idle scan saw (by `framesRead`) and since when; -1: none. */
  partialFrame = -1
  partialSince = -1
  /** When the connection closed; -1 while open. */
  closedAt = -1
  /** When the connection reaches its maximum age; Infinity without one. */
  retireAt = Number.POSITIVE_INFINITY
  /** Since when new calls are refused (the connection is past its age); -1 before. */
  retiredAt = -1
  /** Who its calls come from: a small object of its own, so a kept call context does not keep the connection. */
  peer: CallPeer
  /** The protocol's own state for this connection (`ServerProtocol.connectionState`). */
  readonly state: unknown

  // In-order protocols: every request takes the next `seq`; answers leave
  // in `seq` order. An answer ready before its turn waits in #held (by
  // seq: its bytes, or null for a request with no answer) and counts in
  // heldBytes, which the connection's outbound bound also limits.
  nextSeq = 0
  sendSeq = 0
  #held: Map<number, AnswerSlices> | null = null
  heldBytes = 0
  /** The seq after which the connection closes (a call asked); -1: none. */
  closeAfterSeq = -1
  /** Protocols matched by id: the protocolError answer that goes out once the calls in flight are answered. */
  lastWords: Uint8Array[] | null = null

  constructor (connection: Connection, remoteAddress: string, now: number, state?: unknown) {
    this.connection = connection
    this.remoteAddress = remoteAddress
    this.lastActiveAt = now
    this.state = state
    this.peer = Object.freeze({ user: '', remoteAddress, state })
  }

  /** Set up, nothing in flight or unsent, and no activity since the last idle scan. */
  get quiet (): boolean {
    return this.ready && this.inFlight.size === 0 && !this.connection.isBusy && this.connection.activity === this.lastActivity
  }

  get idleSince (): number {
    return this.lastActiveAt
  }

  /**
   * A call asked to close the connection after its answer (in order: the
   * answer of `seq`; -1 for protocols matched by id): nothing more is read
   * from now on, and no answer after it is sent.
   */
  requestClose (seq: number): void {
    this.closing = true
    if (seq >= 0 && (this.closeAfterSeq < 0 || seq < this.closeAfterSeq)) this.closeAfterSeq = seq
    this.connection.stopReading()
  }

  /**
   * Keeps the answer of `seq` until the answers before it have gone. Each
   * held answer counts at least HELD_ENTRY_BYTES, so that a peer cannot
   * park unbounded numbers of empty answers behind a slow one.
   */
  hold (seq: number, slices: AnswerSlices): void {
    (this.#held ??= new Map()).set(seq, slices)
    this.heldBytes += heldBytesOf(slices)
  }

  /** The held answer whose turn it is now, if it is ready; `undefined` when it is not. */
  takeNext (): AnswerSlices | undefined {
    const held = this.#held
    if (held === null || held.size === 0) return undefined
    const slices = held.get(this.sendSeq)
    if (slices === undefined) return undefined
    held.delete(this.sendSeq)
    this.heldBytes -= heldBytesOf(slices)
    return slices
  }
}

/** What one held answer costs at least: its map entry and slot. */
const HELD_ENTRY_BYTES = 64

function heldBytesOf (slices: AnswerSlices): number {
  let bytes = HELD_ENTRY_BYTES
  if (slices !== null) for (const slice of slices) bytes += slice.length
  return bytes
}
