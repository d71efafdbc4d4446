import { ErrorCode, RpcError } from '../codec/errors.js'
import type { AnswerSlices } from '../codec/protocol.js'
import type { InboundCall } from './inbound-call.js'
import type { Logger } from './logger.js'
import type { ServerConnection } from './server-connection.js'

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

/**
 * When a connection's answers may leave, and what that means for keys,
 * held answers and closing: a protocol's `ordering`, as one object per
 * server. `InOrderAnswers` sends them in request order, holding those that
 * finish early; `ByIdAnswers` sends each as it is ready, matched by id.
 * The call dispatch asks it instead of branching on the ordering.
 */
export interface AnswerOrder {
  /** The frame's place in its connection's order, taken now (-1: its answers are not ordered and its id is its key). */
  place: (sc: ServerConnection) => number
  /** Whether the frame's call id can be taken: `ID_OK`, or why not (`ID_NOT_32_BIT`, `ID_IN_FLIGHT`). */
  checkId: (sc: ServerConnection, callId: number) => IdCheck
  /** The call's key in its connection's in-flight table: its place, or its id. */
  key: (seq: number, callId: number) => number
  /** The call's answer may be written now (else it is held, encoded, for its turn). */
  inTurn: (sc: ServerConnection, call: InboundCall) => boolean
  /** A call's answer was written in its turn: the answers held behind it follow. */
  answered: (sc: ServerConnection, call: InboundCall) => void
  /** Sends an answer the server made, or holds it until its turn; null: close once the answers before it have gone. */
  emit: (sc: ServerConnection, seq: number, slices: AnswerSlices) => void
  /** One part of a streamed answer: sent in the call's turn, else held until it comes. */
  writePart: (sc: ServerConnection, call: InboundCall, slices: Uint8Array[]) => void
  /** A call that asked to close its connection was answered: it ends once the requests before it are answered too. */
  closeAfter: (sc: ServerConnection) => void
  /** A call left its connection's in-flight table. */
  released: (sc: ServerConnection, call: InboundCall) => void
  /** The protocol's last words for a stream it cannot read on, after the answers before them; false (stop reading). */
  lastWords: (sc: ServerConnection, answer: Uint8Array[]) => false
}

/** Writes a connection's answers, and closes one whose unsent bytes pass its bound. */
export class AnswerWriter {
  readonly #log: Logger

  constructor (log: Logger) {
    this.#log = log
  }

  /** Queues `slices` on the connection. */
  send (sc: ServerConnection, slices: Uint8Array[]): void {
    let bytes = 0
    for (const slice of slices) bytes += slice.length
    if (!sc.connection.send({ slices: slices as Buffer[], bytes })) this.overBound(sc)
  }

  /** Held answers count against the connection's outbound bound. */
  afterHold (sc: ServerConnection): void {
    if (sc.connection.outboundBytes + sc.heldBytes > sc.connection.maxOutboundBytes) this.overBound(sc)
  }

  /** The peer reads slower than its answers are produced: closed. */
  overBound (sc: ServerConnection): void {
    if (sc.connection.isClosed) return
    this.#log.warn(`closing ${sc.remoteAddress}: it reads responses slower than they are produced (outbound bound exceeded)`)
    sc.connection.destroy(new RpcError(ErrorCode.QUEUE_FULL, 'outbound bytes over the connection bound'))
  }
}

/** `'in-order'` protocols: answers leave in request order; one that finishes early waits, encoded, for its turn. */
export class InOrderAnswers implements AnswerOrder {
  readonly #writer: AnswerWriter

  constructor (writer: AnswerWriter) {
    this.#writer = writer
  }

  place (sc: ServerConnection): number {
    return sc.nextSeq++
  }

  // In order, ids are not keys: any is taken.
  checkId (): IdCheck {
    return ID_OK
  }

  // The in-flight table takes 32-bit keys: a seq wraps there (2^32 requests would have to be in flight to collide).
  key (seq: number): number {
    return seq | 0
  }

  inTurn (sc: ServerConnection, call: InboundCall): boolean {
    return call.seq === sc.sendSeq
  }

  answered (sc: ServerConnection): void {
    this.#advance(sc)
  }

  emit (sc: ServerConnection, seq: number, slices: AnswerSlices): void {
    if (slices === null) {
      if (seq > sc.sendSeq) {
        sc.requestClose(seq - 1)
        return
      }
      sc.connection.endAfterFlush(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed by the protocol instead of an answer'))
      return
    }
    if (seq !== sc.sendSeq) {
      sc.hold(seq, slices.length === 0 ? null : slices)
      this.#writer.afterHold(sc)
      return
    }
    if (slices.length > 0) this.#writer.send(sc, slices)
    this.#advance(sc)
  }

  writePart (sc: ServerConnection, call: InboundCall, slices: Uint8Array[]): void {
    if (call.seq === sc.sendSeq) {
      if (slices.length > 0) this.#writer.send(sc, slices)
      return
    }
    sc.holdPart(call.seq, slices)
    this.#writer.afterHold(sc)
  }

  // #advance ends the connection once the closing call's turn has passed.
  closeAfter (sc: ServerConnection): void {
    if (sc.sendSeq <= sc.closeAfterSeq) return
    sc.connection.endAfterFlush()
  }

  released (): void {}

  // The last words take the next place: they follow the answers before them.
  lastWords (sc: ServerConnection, answer: Uint8Array[]): false {
    const seq = sc.nextSeq++
    sc.requestClose(seq)
    this.emit(sc, seq, answer)
    return false
  }

  // The answer of sc.sendSeq went out: the ones held behind it follow, in
  // order, each after the parts of its streamed answer written before its turn.
  #advance (sc: ServerConnection): void {
    for (;;) {
      sc.sendSeq++
      if (sc.closeAfterSeq >= 0 && sc.sendSeq > sc.closeAfterSeq) {
        sc.connection.endAfterFlush()
        return
      }
      if (sc.heldBytes === 0) return
      const parts = sc.takeParts()
      if (parts !== undefined) for (const part of parts) this.#writer.send(sc, part)
      const slices = sc.takeNext()
      if (slices === undefined) return
      if (slices !== null && slices.length > 0) this.#writer.send(sc, slices)
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
  readonly #writer: AnswerWriter
  readonly #repeats: boolean

  constructor (writer: AnswerWriter, allowRepeatedIds: boolean) {
    this.#writer = writer
    this.#repeats = allowRepeatedIds
  }

  place (sc: ServerConnection): number {
    return this.#repeats ? sc.nextSeq++ : -1
  }

  // An id must be an integer of 32 bits, signed or not (a u32 maps one to one onto the table's keys).
  checkId (sc: ServerConnection, callId: number): IdCheck {
    if (!(Number.isInteger(callId) && callId >= -0x80000000 && callId <= 0xffffffff)) return ID_NOT_32_BIT
    if (!this.#repeats && sc.inFlight.has(callId | 0)) return ID_IN_FLIGHT
    return ID_OK
  }

  key (seq: number, callId: number): number {
    return this.#repeats ? seq | 0 : callId | 0
  }

  inTurn (): boolean {
    return true
  }

  answered (): void {}

  emit (sc: ServerConnection, _seq: number, slices: AnswerSlices): void {
    if (slices === null) {
      if (sc.inFlight.size > 0) {
        sc.requestClose(-1)
        return
      }
      sc.connection.endAfterFlush(new RpcError(ErrorCode.CONNECTION_CLOSED, 'closed by the protocol instead of an answer'))
      return
    }
    if (slices.length > 0) this.#writer.send(sc, slices)
  }

  writePart (sc: ServerConnection, _call: InboundCall, slices: Uint8Array[]): void {
    if (slices.length > 0) this.#writer.send(sc, slices)
  }

  closeAfter (sc: ServerConnection): void {
    if (sc.inFlight.size > 0) return
    sc.connection.endAfterFlush()
  }

  // A connection asked to close waits for its last call (answered just after this).
  released (sc: ServerConnection, call: InboundCall): void {
    if (sc.closing && sc.inFlight.size === 0 && !call.closeAfter) queueMicrotask(() => this.#endWithLastWords(sc))
  }

  // The last words follow the answers of the calls still in flight (#endWithLastWords).
  lastWords (sc: ServerConnection, answer: Uint8Array[]): false {
    sc.requestClose(-1)
    if (sc.inFlight.size > 0) {
      sc.lastWords = answer
      return false
    }
    if (answer.length > 0) this.#writer.send(sc, answer)
    sc.connection.endAfterFlush()
    return false
  }

  // A closing connection's last call was answered: its protocolError answer (if any), then the end.
  #endWithLastWords (sc: ServerConnection): void {
    const words = sc.lastWords
    sc.lastWords = null
    if (words !== null && words.length > 0 && !sc.connection.isClosed) this.#writer.send(sc, words)
    sc.connection.endAfterFlush()
  }
}
