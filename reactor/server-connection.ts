import type { RpcError } from '../codec/errors.js'
import type { AnswerSlices, ConnectionHandle } from '../codec/protocol.js'
import type { Connection } from '../transport/connection.js'
import type { AdmissionCandidate } from './admission.js'
import { CallTable } from './call-table.js'
import type { CallPeer, InboundCall, PartSink } from './inbound-call.js'

/**
 * A connection's public handle as the server holds it (a
 * `ServerConnectionHandle`, which holds the ServerConnection in turn): handed
 * out as `ctx.connection`, and told when the connection closes.
 */
export interface ServerHandle extends ConnectionHandle {
  /** The connection closed: the handle lets go of it. */
  connectionClosed: (error: RpcError | undefined) => void
}

/** Where the parts of streamed answers are encoded and sent (the server's call dispatch). */
export interface PartWriter {
  writePart: (sc: ServerConnection, call: InboundCall, part: unknown) => boolean
}

/**
 * The server's state of one open connection: its calls in flight, its
 * set-up, its place in the idle, frame and age scans, and, for in-order
 * protocols, the answers that are ready but wait for an earlier one.
 */
export class ServerConnection implements AdmissionCandidate, PartSink {
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
  /** The protocol's own state for this connection (`ServerProtocol.connectionState`); set once, at accept. */
  state: unknown
  /** Its public handle (`ctx.connection`), made at accept. */
  handle: ServerHandle | null = null
  /** Something was pushed to it (`ConnectionHandle.send`, a group): the push output limits apply. */
  pushed = false
  /** Since when its unsent bytes have been over the soft push limit; -1: not over it. */
  softSince = -1

  // In-order protocols: every request takes the next `seq`; answers leave
  // in `seq` order. An answer ready before its turn waits in #held (by
  // seq: its bytes, or null for a request with no answer) and counts in
  // heldBytes, which the connection's outbound bound also limits.
  nextSeq = 0
  sendSeq = 0
  #held: Map<number, AnswerSlices> | null = null
  // Parts of streamed answers (`ctx.write`) whose request's turn has not come, by seq, in writing order.
  #parts: Map<number, Uint8Array[][]> | null = null
  heldBytes = 0
  /** The seq after which the connection closes (a call asked); -1: none. */
  closeAfterSeq = -1
  /** Protocols matched by id: the protocolError answer that goes out once the calls in flight are answered. */
  lastWords: Uint8Array[] | null = null

  readonly #writer: PartWriter

  constructor (connection: Connection, remoteAddress: string, now: number, writer: PartWriter) {
    this.connection = connection
    this.#writer = writer
    this.remoteAddress = remoteAddress
    this.lastActiveAt = now
    this.state = undefined
    this.peer = NO_PEER
  }

  writePart (call: InboundCall, part: unknown): boolean {
    return this.#writer.writePart(this, call, part)
  }

  /** Who its calls come from, from now on (at accept, and when set-up or TLS names the user). */
  setPeer (user: string, connection: CallPeer['connection']): void {
    this.peer = Object.freeze({ user, remoteAddress: this.remoteAddress, state: this.state, connection })
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

  /** Keeps a part of the streamed answer of `seq` until its turn comes; counted as held answers are. */
  holdPart (seq: number, slices: Uint8Array[]): void {
    const parts = (this.#parts ??= new Map())
    const list = parts.get(seq)
    if (list === undefined) parts.set(seq, [slices])
    else list.push(slices)
    this.heldBytes += heldBytesOf(slices)
  }

  /** The held parts of the request whose turn it is now, in writing order; undefined when none. */
  takeParts (): Uint8Array[][] | undefined {
    const parts = this.#parts
    if (parts === null || parts.size === 0) return undefined
    const list = parts.get(this.sendSeq)
    if (list === undefined) return undefined
    parts.delete(this.sendSeq)
    for (const slices of list) this.heldBytes -= heldBytesOf(slices)
    return list
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

const NO_PEER: CallPeer = Object.freeze({ user: '', remoteAddress: '', state: undefined, connection: undefined })

/** What one held answer costs at least: its map entry and slot. */
const HELD_ENTRY_BYTES = 64

function heldBytesOf (slices: AnswerSlices): number {
  let bytes = HELD_ENTRY_BYTES
  if (slices !== null) for (const slice of slices) bytes += slice.length
  return bytes
}
