import { ErrorCode, RpcError } from '../codec/errors.js'
import { encodeToSlices } from '../codec/frame-sink.js'
import type { AnsweredCall, AnswerSlices, ServerProtocol } from '../codec/protocol.js'
import type { FramedConnection } from '../transport/framed-connection.js'
import type { Logger } from './logger.js'

/** A call id the connection may take. */
export const ID_OK = 0
/** A call id that is not an integer of 32 bits (signed or not). */
export const ID_NOT_32_BIT = 1
/** A call id already in flight on the connection (and the protocol does not allow repeats). */
export const ID_IN_FLIGHT = 2
/**
 * What `AnswerOrder.checkId` found: a number, not a message, so that the
 * message is built only for a refused id. Returning the message from the
 * check cost ~1,400 instructions a call: TurboFan turned the id into a
 * string ahead of the branch on every call, and the scavenger then copied
 * those strings out of the number-string cache (bench/server-instructions.ts).
 */
export type IdCheck = typeof ID_OK | typeof ID_NOT_32_BIT | typeof ID_IN_FLIGHT

/** A call as the answer order sees it: what the protocol encodes its answer from, and its place. */
export interface OrderedCall extends AnsweredCall {
  /** Its place in its connection's order (in-order protocols); -1 for protocols that match by id. */
  readonly seq: number
  /** It asked to close the connection after its answer. */
  readonly closeAfter: boolean
  /** Its handler was abandoned: its parts are dropped. */
  readonly abandoned: boolean
}

/** What the answer order needs of a connection's calls in flight (the `ConnectionRecord`'s table). */
export interface InFlightTable {
  readonly size: number
  has: (key: number) => boolean
  delete: (key: number) => boolean
}

/**
 * One connection's answers, as its answer order keeps them: the way back
 * from each of its calls to the connection (a call's `owner`: its streamed
 * parts, its closing), and for in-order protocols the answers that are
 * ready but wait for an earlier one. Made with the connection; the
 * `AnswerOrder` of the server acts on it.
 */
export class ConnectionAnswers {
  readonly connection: FramedConnection
  readonly remoteAddress: string
  /** The connection's calls in flight (its `ConnectionRecord.inFlight`). */
  readonly inFlight: InFlightTable
  readonly order: AnswerOrder
  /** A call asked to close the connection after its answer: no request after it is read. */
  closing = false
  // In-order protocols: every request takes the next `seq`; answers leave
  // in `seq` order. An answer ready before its turn waits in #held (by
  // seq: its bytes, or null for a request with no answer) and counts in
  // heldBytes, which the connection's outbound bound also limits.
  nextSeq = 0
  sendSeq = 0
  heldBytes = 0
  /** The seq after which the connection closes (a call asked); -1: none. */
  closeAfterSeq = -1
  /** Protocols matched by id: the protocolError answer that goes out once the calls in flight are answered. */
  lastWords: Uint8Array[] | null = null
  #held: Map<number, AnswerSlices> | null = null
  // Parts of streamed answers (`ctx.write`) whose request's turn has not come, by seq, in writing order.
  #parts: Map<number, Uint8Array[][]> | null = null

  constructor (order: AnswerOrder, connection: FramedConnection, remoteAddress: string, inFlight: InFlightTable) {
    this.order = order
    this.connection = connection
    this.remoteAddress = remoteAddress
    this.inFlight = inFlight
  }

  /** One part of `call`'s streamed answer (`ctx.write`): sent now in its turn, else held until it comes; false once the connection has closed. */
  writePart (call: OrderedCall, part: unknown): boolean {
    const slices = this.order.writer.encodePart(this, call, part)
    if (slices === null) return false
    this.order.writePart(this, call, slices)
    return !this.connection.isClosed
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

/** What one held answer costs at least: its map entry and slot. */
const HELD_ENTRY_BYTES = 64

function heldBytesOf (slices: AnswerSlices): number {
  let bytes = HELD_ENTRY_BYTES
  if (slices !== null) for (const slice of slices) bytes += slice.length
  return bytes
}

/**
 * When a connection's answers may leave, and what that means for keys,
 * held answers and closing: a protocol's `ordering`, as one object per
 * server. `InOrderAnswers` sends them in request order, holding those that
 * finish early; `ByIdAnswers` sends each as it is ready, matched by id.
 * The call dispatch asks it instead of branching on the ordering.
 */
export interface AnswerOrder {
  /** Encodes and writes the answers. */
  readonly writer: AnswerWriter
  /** The frame's place in its connection's order, taken now (-1: its answers are not ordered and its id is its key). */
  place: (a: ConnectionAnswers) => number
  /** Whether the frame's call id can be taken: `ID_OK`, or why not (`ID_NOT_32_BIT`, `ID_IN_FLIGHT`). */
  checkId: (a: ConnectionAnswers, callId: number) => IdCheck
  /** The call's key in its connection's in-flight table: its place, or its id. */
  key: (seq: number, callId: number) => number
  /** The call's answer may be written now (else it is held, encoded, for its turn). */
  inTurn: (a: ConnectionAnswers, call: OrderedCall) => boolean
  /** A call's answer was written in its turn: the answers held behind it follow. */
  answered: (a: ConnectionAnswers, call: OrderedCall) => void
  /** Sends an answer the server made, or holds it until its turn; null: close once the answers before it have gone. */
  emit: (a: ConnectionAnswers, seq: number, slices: AnswerSlices) => void
  /** One part of a streamed answer: sent in the call's turn, else held until it comes. */
  writePart: (a: ConnectionAnswers, call: OrderedCall, slices: Uint8Array[]) => void
  /** A call that asked to close its connection was answered: it ends once the requests before it are answered too. */
  closeAfter: (a: ConnectionAnswers) => void
  /** A call left its connection's in-flight table. */
  released: (a: ConnectionAnswers, call: OrderedCall) => void
  /** The protocol's last words for a stream it cannot read on, after the answers before them; false (stop reading). */
  lastWords: (a: ConnectionAnswers, answer: Uint8Array[]) => false
}

/** Encodes and writes a connection's answers, and closes one whose unsent bytes pass its bound. */
export class AnswerWriter {
  readonly #protocol: ServerProtocol
  readonly #log: Logger

  constructor (protocol: ServerProtocol, log: Logger) {
    this.#protocol = protocol
    this.#log = log
  }

  /** One part of `call`'s streamed answer, encoded (`encodePart`); null when the connection has closed or the call was abandoned. Throws when the protocol cannot stream. */
  encodePart (a: ConnectionAnswers, call: OrderedCall, part: unknown): Uint8Array[] | null {
    const encode = this.#protocol.encodePart
    if (encode === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `the ${this.#protocol.name} protocol has no encodePart: it cannot stream answers`)
    if (a.connection.isClosed || call.abandoned) return null
    return encodeToSlices(encode, this.#protocol, call, part)
  }

  /** Queues `slices` on the connection. */
  send (a: ConnectionAnswers, slices: Uint8Array[]): void {
    let bytes = 0
    for (const slice of slices) bytes += slice.length
    if (!a.connection.send({ slices: slices as Buffer[], bytes })) this.overBound(a)
  }

  /** Held answers count against the connection's outbound bound. */
  afterHold (a: ConnectionAnswers): void {
    if (a.connection.outboundBytes + a.heldBytes > a.connection.maxOutboundBytes) this.overBound(a)
  }

  /** The peer reads slower than its answers are produced: closed. */
  overBound (a: ConnectionAnswers): void {
    if (a.connection.isClosed) return
    this.#log.warn(`closing ${a.remoteAddress}: it reads responses slower than they are produced (outbound bound exceeded)`)
    a.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
  }
}

/** `'in-order'` protocols: answers leave in request order; one that finishes early waits, encoded, for its turn. */
export class InOrderAnswers implements AnswerOrder {
  readonly writer: AnswerWriter
  readonly #writer: AnswerWriter

  constructor (writer: AnswerWriter) {
    this.writer = writer
    this.#writer = writer
  }

  place (a: ConnectionAnswers): number {
    return a.nextSeq++
  }

  // In order, ids are not keys: any is taken.
  checkId (): IdCheck {
    return ID_OK
  }

  // The in-flight table takes 32-bit keys: a seq wraps there (2^32 requests would have to be in flight to collide).
  key (seq: number): number {
    return seq | 0
  }

  inTurn (a: ConnectionAnswers, call: OrderedCall): boolean {
    return call.seq === a.sendSeq
  }

  answered (a: ConnectionAnswers): void {
    this.#advance(a)
  }

  emit (a: ConnectionAnswers, seq: number, slices: AnswerSlices): void {
    if (slices === null) {
      if (seq > a.sendSeq) {
        a.requestClose(seq - 1)
        return
      }
      a.connection.endAfterFlush(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed by the protocol instead of an answer'))
      return
    }
    if (seq !== a.sendSeq) {
      a.hold(seq, slices.length === 0 ? null : slices)
      this.#writer.afterHold(a)
      return
    }
    if (slices.length > 0) this.#writer.send(a, slices)
    this.#advance(a)
  }

  writePart (a: ConnectionAnswers, call: OrderedCall, slices: Uint8Array[]): void {
    if (call.seq === a.sendSeq) {
      if (slices.length > 0) this.#writer.send(a, slices)
      return
    }
    a.holdPart(call.seq, slices)
    this.#writer.afterHold(a)
  }

  // #advance ends the connection once the closing call's turn has passed.
  closeAfter (a: ConnectionAnswers): void {
    if (a.sendSeq <= a.closeAfterSeq) return
    a.connection.endAfterFlush()
  }

  released (): void {}

  // The last words take the next place: they follow the answers before them.
  lastWords (a: ConnectionAnswers, answer: Uint8Array[]): false {
    const seq = a.nextSeq++
    a.requestClose(seq)
    this.emit(a, seq, answer)
    return false
  }

  // The answer of a.sendSeq went out: the ones held behind it follow, in
  // order, each after the parts of its streamed answer written before its turn.
  #advance (a: ConnectionAnswers): void {
    for (;;) {
      a.sendSeq++
      if (a.closeAfterSeq >= 0 && a.sendSeq > a.closeAfterSeq) {
        a.connection.endAfterFlush()
        return
      }
      if (a.heldBytes === 0) return
      const parts = a.takeParts()
      if (parts !== undefined) for (const part of parts) this.#writer.send(a, part)
      const slices = a.takeNext()
      if (slices === undefined) return
      if (slices !== null && slices.length > 0) this.#writer.send(a, slices)
    }
  }
}

/**
 * `'id'` protocols: each answer leaves as soon as it is ready, matched by
 * its id. An id already in flight closes the connection, unless the
 * protocol allows repeats (`duplicateIds: 'allow'`): then calls are keyed
 * by their place, and both are answered.
 */
export class ByIdAnswers implements AnswerOrder {
  readonly writer: AnswerWriter
  readonly #writer: AnswerWriter
  readonly #repeats: boolean

  constructor (writer: AnswerWriter, allowRepeatedIds: boolean) {
    this.writer = writer
    this.#writer = writer
    this.#repeats = allowRepeatedIds
  }

  place (a: ConnectionAnswers): number {
    return this.#repeats ? a.nextSeq++ : -1
  }

  // An id must be an integer of 32 bits, signed or not (a u32 maps one to one onto the table's keys).
  checkId (a: ConnectionAnswers, callId: number): IdCheck {
    if (!(Number.isInteger(callId) && callId >= -0x80000000 && callId <= 0xffffffff)) return ID_NOT_32_BIT
    if (!this.#repeats && a.inFlight.has(callId | 0)) return ID_IN_FLIGHT
    return ID_OK
  }

  key (seq: number, callId: number): number {
    return this.#repeats ? seq | 0 : callId | 0
  }

  inTurn (): boolean {
    return true
  }

  answered (): void {}

  emit (a: ConnectionAnswers, _seq: number, slices: AnswerSlices): void {
    if (slices === null) {
      if (a.inFlight.size > 0) {
        a.requestClose(-1)
        return
      }
      a.connection.endAfterFlush(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed by the protocol instead of an answer'))
      return
    }
    if (slices.length > 0) this.#writer.send(a, slices)
  }

  writePart (a: ConnectionAnswers, _call: OrderedCall, slices: Uint8Array[]): void {
    if (slices.length > 0) this.#writer.send(a, slices)
  }

  closeAfter (a: ConnectionAnswers): void {
    if (a.inFlight.size > 0) return
    a.connection.endAfterFlush()
  }

  // A connection asked to close waits for its last call (answered just after this).
  released (a: ConnectionAnswers, call: OrderedCall): void {
    if (a.closing && a.inFlight.size === 0 && !call.closeAfter) queueMicrotask(() => this.#endWithLastWords(a))
  }

  // The last words follow the answers of the calls still in flight (#endWithLastWords).
  lastWords (a: ConnectionAnswers, answer: Uint8Array[]): false {
    a.requestClose(-1)
    if (a.inFlight.size > 0) {
      a.lastWords = answer
      return false
    }
    if (answer.length > 0) this.#writer.send(a, answer)
    a.connection.endAfterFlush()
    return false
  }

  // A closing connection's last call was answered: its protocolError answer (if any), then the end.
  #endWithLastWords (a: ConnectionAnswers): void {
    const words = a.lastWords
    a.lastWords = null
    if (words !== null && words.length > 0 && !a.connection.isClosed) this.#writer.send(a, words)
    a.connection.endAfterFlush()
  }
}
