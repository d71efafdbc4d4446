import { ErrorCode, RpcError } from '../codec/errors.js'
import type { Deframer } from '../codec/frame-decoder.js'
import type { ConnectionHandler } from './connection-options.js'
import type { ReadGate } from './read-gate.js'
import type { TransferQueue } from './transfer-queue.js'

/** The parts of a framed connection its end touches. */
export interface EndingParts {
  readonly decoder: Deframer
  /** Its reading, and the stream frames travel on now (set-up may switch it). */
  readonly gate: ReadGate
  readonly queue: TransferQueue
  /** Takes the set-up still running (the connection forgets it), to be aborted with the close's reason; null: none runs. */
  takeSetUp: () => { abort: (error: RpcError | undefined) => void } | null
  /** Tells the inbound budget what the connection holds now. */
  reportHeld: () => void
  /** The owner's `onClose`, once. */
  closed: (error: RpcError | undefined) => void
}

/**
 * How a framed connection ends, and whether it has: open, ending (its last
 * frames flush, nothing more is read or queued), closed. The four ways in:
 * `destroy`, `reset` (an RST), `flushAndDestroy` (what is queued goes to
 * the kernel first) and `endAfterFlush` (a half-close once all is written);
 * and what a broken framing ends in (`framingError`).
 */
export class ConnectionEnd {
  /** Closed: nothing is read, queued or delivered any more. */
  closed = false
  /** Ending (`endAfterFlush`): no frame is delivered any more, though the stream still flushes. */
  ending = false
  #endingError: RpcError | undefined
  readonly #parts: EndingParts

  constructor (parts: EndingParts) {
    this.#parts = parts
  }

  /** Closes the connection. Queued transfers are dropped; the handler's `onClose` runs once. */
  destroy (error?: RpcError): void {
    if (this.closed) return
    this.closed = true
    // Ending for a reason (a refused negotiation): the peer's close that follows is not the reason.
    if (this.#endingError !== undefined) error = this.#endingError
    const parts = this.#parts
    parts.decoder.stop()
    parts.gate.clear()
    const setup = parts.takeSetUp()
    parts.reportHeld()
    parts.queue.close(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed'))
    parts.gate.stream.close()
    setup?.abort(error)
    parts.closed(error)
  }

  /** Closes the connection with an RST (the peer sees ECONNRESET), as `destroy` otherwise. */
  reset (error?: RpcError): void {
    if (this.closed) return
    this.#parts.gate.stream.reset()
    this.destroy(error)
  }

  /**
   * Hands the queued frames to the stream (the kernel takes what fits and
   * sends it even after the close), then destroys the connection at once.
   */
  flushAndDestroy (error?: RpcError): void {
    if (this.closed) return
    this.#parts.queue.flushNow()
    this.destroy(error)
  }

  /**
   * Reads no more frames (the rest of the current read and later reads are
   * dropped), without ending the socket: answers already due still go out.
   */
  stopReading (): void {
    if (this.closed) return
    this.#parts.decoder.stop()
    this.#parts.reportHeld()
  }

  /** The stream's framing broke: `handler` may take it over (reading stops, it ends the connection itself); else the connection goes. */
  framingError (error: RpcError, handler: ConnectionHandler | null): void {
    if (this.closed) return
    if (handler?.onFramingError !== undefined && !this.ending && handler.onFramingError(error)) {
      this.stopReading()
      return
    }
    // The answers to the frames before the bad bytes (queued while this read
    // was handled) still go out, as for a frame the owner refuses.
    this.flushAndDestroy(error)
  }

  /** Writes the queued frames, then ends the stream (after a fatal error reply, or a server's drained shutdown). */
  endAfterFlush (error?: RpcError): void {
    if (this.closed || this.ending) return
    this.ending = true
    this.#endingError = error
    const parts = this.#parts
    parts.decoder.stop()
    parts.reportHeld()
    parts.queue.flushNow()
    // Nothing may follow the end: later sends are dropped, not written after it.
    parts.queue.close(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection ending'))
    parts.gate.stream.end(() => this.destroy(error))
  }
}
