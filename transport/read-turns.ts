import { ReadStop, type ReadGate } from './read-gate.js'

/** Frames of one connection decoded per read before the rest waits for the next turn (`ConnectionOptions.maxFramesPerRead`). */
export const DEFAULT_MAX_FRAMES_PER_READ = 64

/** Bytes a read's requests may queue on their connection before the rest of the read waits for the next turn (`ConnectionOptions.maxAnswerBytesPerRead`). */
export const DEFAULT_MAX_ANSWER_BYTES_PER_READ = 64 * 1024

/**
 * A connection's budget per read: at most `maxFramesPerRead` frames of one
 * read are decoded in one event-loop turn, and no frame after the one whose
 * handling took the bytes the connection queued since the read began
 * (answers, streamed parts, pushes) to `maxAnswerBytesPerRead`. Past either
 * the decoder stops, the rest of the read is kept aside in the read gate
 * (counted in the inbound budget), reading stops (`ReadStop.Turn`), and it
 * resumes on the next turn (`setImmediate`), rest first: one peer
 * pipelining thousands of small requests in a read, or requests that each
 * ask for many answers (a SUBSCRIBE of 100 channels is 100 replies), cannot
 * hold the loop from the others. Nothing is dropped and the order is kept.
 * The connection's output is a running total it is handed (its transfer
 * queue's `outputBytes`): no call per frame.
 */
export class ReadTurns {
  readonly #gate: ReadGate
  readonly #maxFrames: number
  readonly #maxOutput: number
  #left = 0
  /** The connection's output total past which the read's budget is spent. */
  #outputEnd = 0
  #spent = false
  #scheduled = false
  /** Ending: every frame is decoded at once (flushNow). */
  #unbounded = false
  readonly #nextTurn = (): void => {
    this.#scheduled = false
    if (!this.#gate.isClosed) this.#gate.start(ReadStop.Turn)
  }

  constructor (gate: ReadGate, maxFramesPerRead: number | undefined, maxAnswerBytesPerRead?: number) {
    const max = maxFramesPerRead ?? DEFAULT_MAX_FRAMES_PER_READ
    if (!(max >= 1)) throw new RangeError(`maxFramesPerRead must be at least 1, got ${String(maxFramesPerRead)}`)
    const maxOutput = maxAnswerBytesPerRead ?? DEFAULT_MAX_ANSWER_BYTES_PER_READ
    if (!(maxOutput >= 1)) throw new RangeError(`maxAnswerBytesPerRead must be at least 1, got ${String(maxAnswerBytesPerRead)}`)
    this.#gate = gate
    this.#maxFrames = max
    this.#maxOutput = maxOutput
  }

  /** A read starts, the connection's output total at `output`: its budget is whole. */
  startRead (output: number): void {
    this.#left = this.#maxFrames
    this.#outputEnd = output + this.#maxOutput
    this.#spent = false
  }

  /** One frame of the read was delivered, the connection's output total now at `output`; false: the budget is spent, the decoder stops after it. */
  frame (output: number): boolean {
    if ((--this.#left > 0 && output < this.#outputEnd) || this.#unbounded) return true
    this.#spent = true
    return false
  }

  /** True when the decoder stopped because the budget was spent (not because the owner stopped it). */
  get spent (): boolean {
    return this.#spent
  }

  /** The budget stopped the decoder after `consumed` bytes of `chunk`: the rest waits for the next turn (nothing when there is none). */
  keepRest (chunk: Buffer, consumed: number): void {
    this.#spent = false
    if (consumed >= chunk.length) return
    this.#gate.stop(ReadStop.Turn)
    this.#gate.keep([chunk.subarray(consumed)])
    if (!this.#scheduled) {
      this.#scheduled = true
      setImmediate(this.#nextTurn)
    }
  }

  /**
   * The connection is ending (a server's drained shutdown): the rest that
   * waits for its turn was read already, so it is decoded now, whole, and
   * its requests are answered (refused) before the end instead of being
   * dropped with the connection. Nothing happens while another reason
   * holds reading.
   */
  flushNow (): void {
    this.#unbounded = true
    if (this.#gate.has(ReadStop.Turn) && !this.#gate.isClosed) this.#gate.start(ReadStop.Turn)
  }

  /** True while a read's rest waits for its turn (the rest of a set-up's bytes then waits behind it). */
  get waiting (): boolean {
    return this.#gate.has(ReadStop.Turn)
  }
}
