import type { ByteStream, ByteStreamListener } from './byte-stream.js'

/** What probe reads of a paused connection set aside before they stop (`FramedConnection.probeRead`): 64 KiB, one read's worth. */
export const PROBE_BYTES = 64 * 1024

/**
 * Why a connection's reading is stopped: one bit each, kept apart, so that
 * reading resumes only when no reason holds it any more.
 */
export const ReadStop = {
  /** The server's outbound budget (`FramedConnection.pauseReading`). */
  Paused: 1,
  /** The application (`FramedConnection.holdReading`: a broker holding back a publisher). */
  Held: 2,
  /** The connection's own unsent bytes passed `maxOutboundBytes` (what the kernel left of them). */
  Suspended: 4,
  /** An asynchronous set-up step runs: the bytes after its frame may be another stream's (TLS). */
  SetUp: 8,
  /** The read's budget is spent (`maxFramesPerRead`, `maxAnswerBytesPerRead`): the rest of it is kept aside for the next turn. */
  Turn: 16
} as const

/** One reason reading is stopped (`ReadStop`). */
export type ReadStop = typeof ReadStop[keyof typeof ReadStop]

/** What the read gate needs of its connection. */
export interface ReadGateHost {
  /** The connection's listener: reads go to it while no probe is armed, and set-aside bytes through its `onRead`. */
  readonly listener: ByteStreamListener
  /** True when the connection takes no probe now: closed, ending, or in set-up. */
  readonly probeRefused: boolean
  readonly isClosed: boolean
  /** Tells the inbound budget what the connection holds now (`asideBytes` included). */
  reportHeld: () => void
  /** Decodes a chunk that was read already and kept aside (`keep`): not counted as a read again. */
  decodeKept: (chunk: Buffer) => void
}

/**
 * Every reason a connection's stream is not read, and the probe read of a
 * stopped one. The stream reads again only when no reason holds it; what a
 * probe set aside is delivered first (and may stop reading again).
 */
export class ReadGate {
  #stream: ByteStream
  readonly #host: ReadGateHost
  #reasons = 0
  /** A probe read is armed: the stream reads, and what it reads is set aside while reading is stopped. */
  #probing = false
  /** What probe reads set aside, delivered first when reading resumes; null: nothing. */
  #probed: Buffer[] | null = null
  #probedBytes = 0
  #probeListener: ByteStreamListener | null = null
  /** Chunks read and kept aside (the rest of a read past its frame budget), decoded before anything probed; null: none. */
  #kept: Buffer[] | null = null
  #keptBytes = 0
  /**
   * The read's budget alone holds reading, and the stream was not paused
   * for it: the rest of the read waits for the next turn, which comes before
   * the stream is polled again (`setImmediate` runs right after the poll
   * that read), so pausing and resuming the stream (a readStop, and Node's
   * resume machinery) would buy nothing. A read that does come first (a
   * stream that reads again at once: a full buffer, a TLS record of several
   * chunks) is kept behind the rest (`keepLate`), and the stream paused then.
   */
  #lazyTurn = false
  /** The gate paused the stream and has not resumed it since. */
  #streamPaused = false
  /** The peer's end, come while `lazyTurn`: it follows what waits for the turn (`keepEnd`); null: none. */
  #endKept: (() => void) | null = null

  constructor (stream: ByteStream, host: ReadGateHost) {
    this.#stream = stream
    this.#host = host
  }

  /** The stream frames travel on (the socket's, or the secure channel a set-up switched to). */
  get stream (): ByteStream {
    return this.#stream
  }

  /** Reads come from `stream` from now on, to the connection's listener (a set-up that switched to TLS; no probe is armed in set-up). */
  switchStream (stream: ByteStream): void {
    this.#stream = stream
    stream.listen(this.#host.listener)
  }

  /** The connection closed: nothing is read or released any more. */
  get isClosed (): boolean {
    return this.#host.isClosed
  }

  /** True while some reason holds reading. */
  get stopped (): boolean {
    return this.#reasons !== 0
  }

  /** True while `reason` holds reading. */
  has (reason: ReadStop): boolean {
    return (this.#reasons & reason) !== 0
  }

  /** Stops reading for `reason` (nothing when it holds reading already). */
  stop (reason: ReadStop): void {
    if ((this.#reasons & reason) !== 0) return
    if (reason === ReadStop.Turn && this.#reasons === 0 && !this.#probing && !this.#streamPaused) {
      this.#reasons = reason
      this.#lazyTurn = true
      return
    }
    this.#reasons |= reason
    this.#lazyTurn = false
    this.#pause()
  }

  /** True while only the read's budget holds reading and the stream was not paused for it: a read now is kept (`keepLate`), not decoded. */
  get lazyTurn (): boolean {
    return this.#lazyTurn
  }

  /** A read came while `lazyTurn`: kept behind what waits for the turn, and the stream paused now. */
  keepLate (chunk: Buffer): void {
    this.#lazyTurn = false
    this.#pause()
    this.keep([chunk])
  }

  /** The peer's end came while `lazyTurn`: `onEnd` runs once what waits for the turn was decoded (a paused stream would have held it back). */
  keepEnd (onEnd: () => void): void {
    this.#lazyTurn = false
    this.#endKept = onEnd
  }

  /** The connection's unsent bytes passed its bound: nothing more is read until the peer takes enough (`ReadStop.Suspended`). False: closed, or suspended already. */
  suspend (): boolean {
    if (this.#host.isClosed || (this.#reasons & ReadStop.Suspended) !== 0) return false
    this.stop(ReadStop.Suspended)
    return true
  }

  /** Ends `reason`; the stream reads again once no other reason holds it. */
  start (reason: ReadStop): void {
    if ((this.#reasons & reason) === 0) return
    this.#reasons &= ~reason
    if (this.#reasons !== 0) return
    if (this.#probing) this.#disarm()
    // What was kept, then what a probe read set aside, comes first (and may stop reading again).
    if (this.#kept !== null && !this.#releaseKept()) return
    if (this.#probed !== null && !this.#releaseProbed()) return
    const end = this.#endKept
    if (end !== null) {
      // Nothing more comes: the peer's end follows what it sent before it.
      this.#endKept = null
      end()
      return
    }
    // A turn that never paused the stream has nothing to resume.
    if (this.#lazyTurn) this.#lazyTurn = false
    else this.#resume()
  }

  /**
   * Keeps `chunks` (read already, not decoded) aside, after what is kept
   * already and before anything a probe set aside: they are decoded first
   * when reading resumes. Counted in `asideBytes`. The caller stops
   * reading for its reason.
   */
  keep (chunks: Buffer[]): void {
    if (chunks.length === 0) return
    this.#kept = this.#kept === null ? chunks : this.#kept.concat(chunks)
    for (let i = 0; i < chunks.length; i++) this.#keptBytes += chunks[i]!.length
    this.#host.reportHeld()
  }

  /** Bytes kept aside (`keep`) or set aside by probe reads while reading is stopped (counted in the inbound budget). */
  get asideBytes (): number {
    return this.#keptBytes + this.#probedBytes
  }

  /**
   * While reading is stopped, reads on, to learn whether the peer has gone:
   * a stopped stream is not polled for reading (libuv's readStop), so its
   * peer's FIN or RST goes unseen, and the connection, its partial frame
   * with it, stays until a timeout. The stream reads on: the end or an
   * error closes the connection at once; bytes are set aside, counted in
   * the inbound budget, and delivered first when reading resumes. Once
   * `PROBE_BYTES` are aside, reading stops again (so at most one read more:
   * under 128 KiB per stopped connection, more only what a stream with a
   * read buffer of its own had buffered already) and there is no further
   * probe until reading resumes: a peer that sent that much before it closed
   * is seen only then. False when there is nothing to probe (reading,
   * closed, in set-up, or enough set aside).
   */
  probe (): boolean {
    if (this.#reasons === 0 || this.#probedBytes >= PROBE_BYTES || this.#host.probeRefused) return false
    // The probe resumes the stream itself: a later start resumes it too.
    this.#lazyTurn = false
    if (!this.#probing) {
      this.#probing = true
      const host = this.#host.listener
      this.#probeListener ??= { ...host, onRead: (buf, start, end) => this.#onProbe(buf, start, end) }
      this.#stream.listen(this.#probeListener)
    }
    // Again for an armed probe: a stop since then (holdReading) stopped its read.
    this.#resume()
    return true
  }

  /** Drops what is kept and what probes set aside (the connection closed). */
  clear (): void {
    this.#lazyTurn = false
    this.#endKept = null
    this.#kept = null
    this.#keptBytes = 0
    this.#probed = null
    this.#probedBytes = 0
  }

  #onProbe (buf: Buffer, start: number, end: number): void {
    if (this.#host.isClosed) return
    const chunk = start === 0 && end === buf.length ? buf : buf.subarray(start, end)
    const probed = this.#probed ??= []
    probed.push(chunk)
    this.#probedBytes += chunk.length
    const stopped = this.#reasons !== 0
    // Under PROBE_BYTES the probe stays armed: the peer's end may follow
    // what it sent, in a later read. A stream with a read buffer of its own
    // also hands on what it had buffered: all of it, its end may be behind it.
    if (stopped && (this.#probedBytes < PROBE_BYTES || this.#stream.bufferedReadBytes > 0)) {
      this.#host.reportHeld()
      return
    }
    this.#disarm()
    if (stopped) {
      this.#pause()
      this.#host.reportHeld()
      return
    }
    // Reading resumed while the probe waited: the bytes go on now.
    this.#releaseProbed()
  }

  #pause (): void {
    this.#streamPaused = true
    this.#stream.pauseReading()
  }

  #resume (): void {
    this.#streamPaused = false
    this.#stream.resumeReading()
  }

  // Reads go to the connection again.
  #disarm (): void {
    this.#probing = false
    this.#stream.listen(this.#host.listener)
  }

  // Decodes what was kept; false when that stopped reading again (or closed the connection).
  #releaseKept (): boolean {
    const kept = this.#kept!
    this.#kept = null
    this.#keptBytes = 0
    for (let i = 0; i < kept.length; i++) {
      if (this.#host.isClosed) return false
      if (this.#reasons !== 0) {
        // A frame (or the budget again) stopped reading: the rest stays kept, after what that kept.
        this.keep(kept.slice(i))
        return false
      }
      this.#host.decodeKept(kept[i]!)
    }
    this.#host.reportHeld()
    return !this.#host.isClosed && this.#reasons === 0
  }

  // Delivers what probe reads set aside; false when that stopped reading again (or closed the connection).
  #releaseProbed (): boolean {
    const probed = this.#probed!
    this.#probed = null
    this.#probedBytes = 0
    const onRead = this.#host.listener.onRead
    for (let i = 0; i < probed.length; i++) {
      if (this.#host.isClosed) return false
      if (this.#reasons !== 0) {
        // A frame stopped reading again: the rest stays aside.
        const rest = probed.slice(i)
        this.#probed = rest
        for (const chunk of rest) this.#probedBytes += chunk.length
        this.#host.reportHeld()
        return false
      }
      const chunk = probed[i]!
      onRead(chunk, 0, chunk.length)
    }
    this.#host.reportHeld()
    return !this.#host.isClosed && this.#reasons === 0
  }
}
