import type { Socket } from 'node:net'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { FrameDecoder, isScanFraming, type AnyFraming, type Deframer } from '../codec/frame-decoder.js'
import { ScanDecoder } from '../codec/scan-decoder.js'
import type { Handshake, HandshakeStep, SecureChannel } from '../codec/protocol.js'
import type { ByteStream } from './byte-stream.js'
import { ChannelStream } from './channel-stream.js'
import type { ConnectionCounters } from './connection-counters.js'
import type { ConnectionEnd } from './connection-end.js'
import type { HeldBytes } from './held-bytes.js'
import { ReadStop, type ReadGate } from './read-gate.js'
import type { TransferQueue } from './transfer-queue.js'

/**
 * The parts of its connection a set-up works with, each the owner of its
 * own state: it reads whether the connection is closed or ending, ends it,
 * stops its reading, switches its stream and counts its frames.
 */
export interface SetUpParts {
  /** The node:net socket under the stream, for a step's `upgrade`; null when there is none (a test's stream). */
  readonly socket: Socket | null
  /** Closed or ending; a refused peer's reply goes out before the end (`endAfterFlush`), a broken framing's queue too (`flushAndDestroy`). */
  readonly end: ConnectionEnd
  /** Stopped (`ReadStop.SetUp`) while an asynchronous step runs; reads from the secure channel a step switched to. */
  readonly gate: ReadGate
  /** Held until the set-up is done (set-up frames bypass it); writes to the secure channel a step switched to. */
  readonly queue: TransferQueue
  /** Set-up frames are counted with the others. */
  readonly counters: ConnectionCounters
  /** The inbound budget's count, this set-up's partial frame included. */
  readonly held: HeldBytes
}

/** The error a set-up that closed the connection on purpose (`HandshakeStep.close`) ends with: not a failure. */
export const SET_UP_CLOSED = 'the set-up closed the connection'

function setupFailed (err: unknown): HandshakeStep<unknown> {
  return { error: new RpcError(ErrorCode.NEGOTIATION_FAILED, `set-up failed: ${(err as Error).message}`, { cause: err }) }
}

/**
 * One connection's set-up: the client preamble, the handshake frames (with
 * a decoder of their own, under the handshake's frame limit), a switch to a
 * secure channel (TLS inside the negotiation), and the bytes read while an
 * asynchronous step runs, held until it is applied (the step may change
 * what they are: TLS records, not frames). It ends with the stream frames
 * travel on and the bytes read past its last frame (`done`), as a
 * WebSocket server's upgrade hands over its socket and head; only then
 * does the framed connection decode them. The promise settles with the
 * handshake's result, or rejects with its error or the connection's close
 * reason.
 */
export class SetUp<T> {
  /** Settles when the set-up is done, failed, or the connection closed under it. */
  readonly promise: Promise<T>
  readonly #parts: SetUpParts
  readonly #end: ConnectionEnd
  /** The set-up succeeded: regular frames flow, and `rest` (read past the last set-up frame) is the first of them. Called before the promise settles. */
  readonly #done: (rest: Buffer[]) => void
  readonly #handshake: Handshake<T>
  #decoder: Deframer
  /** A step switched the framing: frames after its own are read with this one. */
  #nextFraming: AnyFraming | null = null
  // What the peer sent behind a frame already (`onFrame`'s `pipelined`):
  // bytes fed to the decoder less those of the frames it gave, plus held
  // chunks not fed yet.
  #bytesIn = 0
  #bytesFramed = 0
  #heldUndecoded = 0
  #resolve!: (value: T) => void
  #reject!: (error: RpcError) => void
  #state: 'running' | 'done' | 'failed' = 'running'
  #handedOver = false
  // A method, not a comparison: the state changes inside the handshake's callbacks, behind TypeScript's narrowing.
  #isDone (): boolean {
    return this.#state === 'done'
  }
  #stream: ByteStream
  #channel: ChannelStream | null = null
  #preamble: Buffer | null = null
  // Bytes read while an asynchronous step runs, handled once it is applied.
  #held: Buffer[] | null = null
  #holdRest = false
  // The held bytes are the socket's (read before the stream switched), not the secure channel's.
  #heldRaw = false
  readonly #onFrame = (buf: Buffer, start: number, end: number): boolean => this.#frame(buf, start, end)

  constructor (handshake: Handshake<T>, decoder: Deframer, parts: SetUpParts, done: (rest: Buffer[]) => void) {
    this.#handshake = handshake
    this.#stream = parts.gate.stream
    // A set-up framing of its own (PostgreSQL's untyped start-up packets), under the same frame limit.
    this.#decoder = handshake.framing === undefined ? decoder : deframerOf(handshake.framing, decoder.maxFrameBytes)
    this.#parts = parts
    this.#end = parts.end
    this.#done = done
    this.promise = new Promise<T>((resolve, reject) => {
      this.#resolve = resolve
      this.#reject = reject
    })
    if ((handshake.preambleBytes ?? 0) > 0) this.#preamble = Buffer.alloc(0)
  }

  /** Writes the handshake's first frames (a client's), if it has any. */
  start (): void {
    const first = this.#handshake.start?.()
    if (first !== undefined) this.#write(first)
  }

  /** True while part of a set-up frame has arrived and the rest has not. */
  get hasPartialFrame (): boolean {
    return this.#decoder.hasPartialFrame
  }

  /** Bytes received of the set-up frame being received. */
  get partialFrameBytes (): number {
    return this.#decoder.bufferedBytes
  }

  /** Bytes this set-up holds: its decoder's partial frame. */
  get heldBytes (): number {
    return this.#decoder.heldBytes
  }

  /** True while an asynchronous step holds the bytes read after its frame. */
  get isHolding (): boolean {
    return this.#held !== null
  }

  /** Bytes read from the stream while the set-up runs: `buf[start, end)`. */
  input (buf: Buffer, start: number, end: number): void {
    if (this.#state !== 'running') return
    let chunk = start === 0 && end === buf.length ? buf : buf.subarray(start, end)
    if (this.#held !== null) {
      this.#held.push(chunk)
      return
    }
    if (this.#preamble !== null) {
      chunk = this.#takePreamble(chunk)
      if (chunk.length === 0 || this.#end.closed) return
    }
    const rest = this.#decode(chunk)
    if (this.#isDone()) this.#finish(rest === null ? [] : [rest])
  }

  /** The connection closed during set-up: the handshake is aborted and the promise rejects with `error`. */
  abort (error: RpcError | undefined): void {
    this.#held = null
    if (this.#state !== 'running') return
    this.#state = 'failed'
    this.#decoder.stop()
    this.#handshake.abort?.()
    this.#reject(error ?? new RpcError(ErrorCode.CONNECTION_CLOSED, 'connection closed during set-up'))
  }

  // Decodes set-up frames; returns what follows the last one when the set-up ended in `chunk` (else null).
  #decode (chunk: Buffer): Buffer | null {
    this.#bytesIn += chunk.length
    // An asynchronous step switched the framing: its held bytes are read with the new one.
    this.#switchFraming()
    let error = this.#decoder.pushRanges(chunk, this.#onFrame)
    // A step switched the framing: the rest of the chunk is read with the new one.
    while (this.#nextFraming !== null && this.#state === 'running' && !this.#holdRest && !this.#end.closed) {
      const rest = chunk.subarray(this.#decoder.consumed)
      this.#switchFraming()
      chunk = rest
      error = this.#decoder.pushRanges(rest, this.#onFrame)
    }
    if (this.#holdRest) {
      // An asynchronous step stopped the decoding: the rest waits for it.
      this.#holdRest = false
      const rest = chunk.subarray(this.#decoder.consumed)
      this.#bytesIn -= rest.length
      if (rest.length > 0) this.#held?.push(rest)
    } else if (this.#isDone()) {
      // The set-up ended in this chunk: the rest is the first regular bytes.
      const rest = chunk.subarray(this.#decoder.consumed)
      return rest.length > 0 ? rest : null
    }
    // The set-up's framing broke: the connection goes (what it queued still goes out).
    if (error !== null && this.#state === 'running' && !this.#end.closed) this.#end.flushAndDestroy(error)
    else if (!this.#end.closed) this.#parts.held.report(this.heldBytes)
    return null
  }

  // Hands the stream over to the framed connection, once.
  #finish (rest: Buffer[]): void {
    if (this.#handedOver) return
    this.#handedOver = true
    this.#done(rest)
  }

  // Collects the client preamble (server side) before any frame.
  #takePreamble (chunk: Buffer): Buffer {
    const need = this.#handshake.preambleBytes ?? 0
    const have = this.#preamble!
    const take = Math.min(need - have.length, chunk.length)
    const collected = have.length === 0 && take === need ? chunk.subarray(0, take) : Buffer.concat([have, chunk.subarray(0, take)])
    if (collected.length < need) {
      // Wait for the rest; a peer that never sends it meets the set-up deadline.
      this.#preamble = collected
      return chunk.subarray(chunk.length)
    }
    this.#preamble = null
    const verdict = this.#handshake.checkPreamble?.(collected) ?? null
    if (verdict !== null) {
      // A bad preamble is closed without a reply.
      this.#end.destroy(verdict)
      return chunk.subarray(chunk.length)
    }
    return chunk.subarray(take)
  }

  // Frames from now on are read with the framing a step gave (the decoder stopped between frames).
  #switchFraming (): void {
    const framing = this.#nextFraming
    if (framing === null) return
    this.#nextFraming = null
    const maxFrameBytes = this.#decoder.maxFrameBytes
    this.#decoder.stop()
    this.#decoder = deframerOf(framing, maxFrameBytes)
  }

  #frame (buf: Buffer, start: number, end: number): boolean {
    if (this.#state !== 'running' || this.#end.closed || this.#end.ending) return false
    this.#parts.counters.framesRead++
    this.#bytesFramed += end - start
    const pipelined = this.#bytesIn - this.#bytesFramed + this.#heldUndecoded
    // A synchronous step runs now, so that a handshake that ends in this
    // read lets the frames after it through at once. An asynchronous one
    // (an authenticator, a TLS step) holds every byte after its frame until
    // it is applied: the step may change what those bytes are.
    let step: HandshakeStep<T> | Promise<HandshakeStep<T>>
    try {
      step = this.#handshake.onFrame(Buffer.from(buf.subarray(start, end)), pipelined)
    } catch (err) {
      step = setupFailed(err) as HandshakeStep<T>
    }
    // A step that switches the stream is applied as an asynchronous one is: the rest of the chunk is the new stream's.
    if (!(step instanceof Promise) && step.upgrade === undefined) {
      this.#apply(step)
      // A new framing reads the next frame: this decoder stops here (#decode goes on with the new one).
      if (this.#nextFraming !== null) return false
      return this.#state === 'running' && !this.#end.closed
    }
    this.#held = []
    this.#holdRest = true
    this.#heldRaw = this.#channel === null
    this.#parts.gate.stop(ReadStop.SetUp)
    const apply = (s: HandshakeStep<T>): void => {
      this.#apply(s)
      this.#releaseHeld()
    }
    if (step instanceof Promise) step.then(apply, (err: unknown) => apply(setupFailed(err) as HandshakeStep<T>))
    else queueMicrotask(() => apply(step))
    return false
  }

  #apply (step: HandshakeStep<T>): void {
    if (this.#end.closed || this.#state !== 'running') return
    if (step.send !== undefined) this.#write(step.send)
    if (step.upgrade !== undefined) {
      try {
        const socket = this.#parts.socket
        if (socket === null) throw new Error('no socket to switch to a secure channel')
        this.#upgrade(step.upgrade(socket))
      } catch (err) {
        this.#end.destroy(setupFailed(err).error!)
        return
      }
    }
    // Through the new stream: the first frames it carries, a refusal too.
    if (step.sendUpgraded !== undefined) this.#write(step.sendUpgraded)
    if (step.error !== undefined) {
      this.#state = 'failed'
      this.#reject(step.error)
      this.#end.endAfterFlush(step.error)
      return
    }
    if (step.close === true) {
      // Done with the peer, without a failure (PostgreSQL's CancelRequest): what was sent goes out, then the end.
      const closed = new RpcError(ErrorCode.CONNECTION_CLOSED, SET_UP_CLOSED)
      this.#state = 'failed'
      this.#reject(closed)
      this.#end.endAfterFlush(closed)
      return
    }
    if (step.framing !== undefined && step.done === undefined) this.#nextFraming = step.framing
    if (step.done !== undefined) {
      this.#state = 'done'
      this.#resolve(step.done)
    }
  }

  // Handles the bytes held while a step ran (or feeds them to the secure channel it opened).
  #releaseHeld (): void {
    const held = this.#held
    this.#held = null
    if (held === null || this.#end.closed) return
    this.#parts.gate.start(ReadStop.SetUp)
    if (this.#heldRaw && this.#channel !== null) {
      // Done already: what the channel decrypts from here on is regular bytes.
      if (this.#isDone()) this.#finish([])
      // The socket's bytes, read before the switch: the channel's input,
      // all of them (what it decrypts meets any new hold on its own).
      for (const chunk of held) this.#channel.input(chunk)
      return
    }
    let undecoded = 0
    for (const chunk of held) undecoded += chunk.length
    for (let i = 0; i < held.length; i++) {
      // Bytes of the chunks after this one count as pipelined behind its frames.
      undecoded -= held[i]!.length
      this.#heldUndecoded = undecoded
      if (this.#end.closed || this.#end.ending || this.#state === 'failed') return
      if (this.#isDone()) {
        this.#finish(held.slice(i))
        return
      }
      if (this.#held !== null) {
        // Another asynchronous step began: the rest waits for it.
        for (let j = i; j < held.length; j++) (this.#held as Buffer[]).push(held[j]!)
        return
      }
      const rest = this.#decode(held[i]!)
      this.#heldUndecoded = 0
      if (this.#isDone()) {
        const out = rest === null ? [] : [rest]
        for (let j = i + 1; j < held.length; j++) out.push(held[j]!)
        this.#finish(out)
        return
      }
    }
    if (this.#isDone()) this.#finish([])
  }

  // From now on frames travel on the channel's stream (TLS over the socket).
  #upgrade (channel: SecureChannel): void {
    const stream = new ChannelStream(channel, this.#stream)
    this.#channel = stream
    this.#stream = stream
    this.#parts.queue.switchSink(stream)
    this.#parts.gate.switchStream(stream)
  }

  // Set-up frames bypass the (held) transfer queue.
  #write (frames: Buffer[][]): void {
    const slices: Buffer[] = []
    for (const frame of frames) for (const slice of frame) slices.push(slice)
    this.#stream.write(slices.length === 1 ? slices[0]! : Buffer.concat(slices))
  }
}

/** A decoder for `framing` (a length field or a scan) under `maxFrameBytes` (undefined: the decoder's default). */
export function deframerOf (framing: AnyFraming, maxFrameBytes: number | undefined): Deframer {
  return isScanFraming(framing) ? new ScanDecoder(framing, maxFrameBytes) : new FrameDecoder(framing, maxFrameBytes)
}
