import type { BusyPoller } from './busy-poll.js'

/**
 * A framed connection's activity counters, and the busy poller it touches
 * on every read and send. The owner compares them between idle scans and
 * against its frame deadline, so the connection needs no clock.
 */
export class ConnectionCounters {
  /** Bytes read from the stream so far. */
  bytesRead = 0
  /** Reads handled so far: frames delivered under the same count came in the same read. */
  reads = 0
  /** Frames received so far (set-up frames included): a partial frame seen under the same count is the same frame. */
  framesRead = 0
  /** Moves on every read, every send and every 'drain' (the peer took bytes we had queued). */
  activity = 0
  /** Times the stream drained (the kernel took everything it buffered). */
  drains = 0
  readonly #poller: BusyPoller | null

  constructor (poller: BusyPoller | null) {
    this.#poller = poller
  }

  /** A read of `bytes` bytes. */
  read (bytes: number): void {
    this.bytesRead += bytes
    this.reads++
    this.activity++
    this.#poller?.touch()
  }

  /** A frame was handed to the transfer queue. */
  sent (): void {
    this.activity++
    this.#poller?.touch()
  }

  /** The stream took what it held: the peer read what we sent. */
  drained (): void {
    this.activity++
    this.drains++
  }
}
