import type { Clock, TimerHandle } from '../scheduling/clock.js'

/** What the budget needs of a connection. */
export interface OutboundBudgetMember {
  /** Bytes queued or in the socket's buffer that the peer has not taken. */
  readonly outboundBytes: number
  /** True while its transfer queue waits for 'drain'. */
  readonly isBackedUp: boolean
  readonly isClosed: boolean
  readonly isReadingPaused: boolean
  pauseReading: () => void
  resumeReading: () => void
}

/** The default reactor-wide budget for unsent response bytes: 512 MiB. */
export const DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES = 512 * 1024 * 1024
/** How often the budget is checked while some connection is backed up. */
export const OUTBOUND_CHECK_MS = 50

/**
 * One reactor's budget for response bytes its peers have not read yet.
 * Each connection already has its own bound (closed past it); this one
 * bounds their sum. Only connections whose transfer queue waits for
 * 'drain' hold more than a socket buffer's worth, so only those are
 * watched: from the moment they back up (and again for each MiB their
 * queue grows while backed up), and by a timer every `OUTBOUND_CHECK_MS`
 * until none is backed up. While the sum is over the budget, the reactor
 * stops reading from every backed-up connection, heaviest first: their
 * clients' new requests wait in the clients' own buffers (TCP
 * backpressure), so the sum can grow only by the answers to calls already
 * read. Connections that keep up (not backed up) are read as before. Once
 * the sum is below the budget every paused connection reads again, and so
 * does a paused connection that drained (its peer read what it was owed).
 */
export class OutboundBudget {
  readonly maxBytes: number
  readonly #clock: Clock
  readonly #watched = new Set<OutboundBudgetMember>()
  readonly #onPause: ((member: OutboundBudgetMember, totalBytes: number) => void) | undefined
  #timer: TimerHandle | null = null
  #pauses = 0
  #over = false
  /** A check runs; `#again`: a connection was watched meanwhile, so it runs once more. */
  #checking = false
  #again = false
  readonly #check = (): void => {
    this.#timer = null
    this.check()
  }

  constructor (maxBytes: number, clock: Clock, onPause?: (member: OutboundBudgetMember, totalBytes: number) => void) {
    this.maxBytes = maxBytes
    this.#clock = clock
    this.#onPause = onPause
  }

  /** Times a connection was paused because the budget was exceeded. */
  get pauses (): number {
    return this.#pauses
  }

  /** The backed-up connections' unsent bytes were over the budget at the last check (made at least every `OUTBOUND_CHECK_MS` while any is backed up). */
  get isOver (): boolean {
    return this.#over
  }

  /** `member` started waiting for 'drain'. */
  watch (member: OutboundBudgetMember): void {
    this.#watched.add(member)
    this.check()
  }

  /**
   * Sums the watched connections' unsent bytes, pauses or resumes reading,
   * and keeps checking while any is backed up. A resumed connection may
   * decode what it had read already at once and back up again (`watch`
   * from inside the check): that check runs once this one is done, so the
   * connection is watched, and paused when over, whatever the order.
   */
  check (): void {
    if (this.#checking) {
      this.#again = true
      return
    }
    this.#checking = true
    try {
      do {
        this.#again = false
        this.#checkOnce()
      } while (this.#again)
    } finally {
      this.#checking = false
    }
  }

  #checkOnce (): void {
    let total = 0
    for (const member of this.#watched) {
      if (member.isClosed) {
        this.#watched.delete(member)
        continue
      }
      if (!member.isBackedUp) {
        // It drained: it holds no more than a socket buffer, so it reads
        // again (forgotten first: reading may back it up and watch it anew).
        this.#watched.delete(member)
        if (member.isReadingPaused) member.resumeReading()
        continue
      }
      total += member.outboundBytes
    }
    this.#over = total > this.maxBytes
    if (total > this.maxBytes) this.#pauseHeaviest(total)
    else if (total < this.maxBytes) {
      for (const member of this.#watched) if (member.isReadingPaused) member.resumeReading()
    }
    if (this.#watched.size > 0 && this.#timer === null) this.#timer = this.#clock.setTimer(this.#check, OUTBOUND_CHECK_MS)
  }

  /** Stops the timer (the server is closing). */
  stop (): void {
    if (this.#timer !== null) this.#clock.clearTimer(this.#timer)
    this.#timer = null
    this.#watched.clear()
    this.#over = false
  }

  #pauseHeaviest (total: number): void {
    const reading = [...this.#watched].filter(m => !m.isReadingPaused).sort((a, b) => b.outboundBytes - a.outboundBytes)
    for (const member of reading) {
      member.pauseReading()
      this.#pauses++
      this.#onPause?.(member, total)
    }
  }
}
