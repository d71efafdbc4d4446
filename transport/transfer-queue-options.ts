// What a transfer queue takes and reports: the transfer, its options and
// counters, and the bounds' defaults (transport/transfer-queue.ts is the queue).
import type { RpcError } from '../codec/errors.js'

/** One frame to send, as slices written in order. */
export interface OutboundTransfer {
  slices: Buffer[]
  bytes: number
  /**
   * Asked just before the first byte is handed to the socket; false drops
   * the transfer unsent (its call was cancelled or timed out meanwhile).
   * From true on, the transfer is started and will be finished.
   */
  beforeWrite?: (() => boolean) | undefined
  /**
   * Called exactly once: with no error when the transfer's bytes no longer
   * refer to the caller's buffers (copied, or written by the kernel), or
   * with the reason it was dropped or aborted.
   */
  onSent?: ((error: RpcError | undefined) => void) | undefined
}

export interface TransferQueueOptions {
  /** Bound on bytes queued here plus bytes the socket still buffers; default 100 MiB. */
  maxOutboundBytes?: number | undefined
  /**
   * A batch held for the end of a read or turn is written as soon as it
   * holds this many frames (default 50), so the peer starts on them while
   * the rest are produced instead of the two sides taking turns.
   */
  batchFrames?: number | undefined
  /**
   * A frame enqueued with nothing queued goes out at the end of the current
   * microtask checkpoint instead of in the caller's stack: still in the same
   * event-loop turn, before any I/O wait, but together with the frames the
   * other continuations of that checkpoint produce (a client whose
   * responses resumed many awaiting callers). Default false.
   */
  coalesceMicrotasks?: boolean | undefined
  /** Called each time the queue starts waiting for 'drain' (the kernel buffer is full), and for each MiB it grows while waiting. */
  onBackedUp?: (() => void) | undefined
  /**
   * Called when a frame passes `maxOutboundBytes` even after the queued
   * frames were written (the kernel left more than the bound): the owner
   * stops reading the peer's requests until it has taken enough, and the
   * frame is taken; frames are then taken up to `OVER_BOUND_FACTOR` times
   * the bound (the answers to requests already read), refused past it.
   * Without it, a frame past the bound is refused.
   */
  onOverBound?: (() => void) | undefined
}

/** Counters a connection exposes, as Kudu's `DumpConnections` does. */
export interface TransferQueueStats {
  /** Transfers waiting in the queue now. */
  queuedTransfers: number
  /** Queue entries now: a run of frames encoded in place is one entry, however many frames it holds. */
  queuedEntries: number
  /** Bytes waiting in the queue now (not yet handed to the socket). */
  queuedBytes: number
  /** Bytes handed to the socket that the kernel has not taken yet. */
  socketBufferedBytes: number
  /** Lone frames written at once. */
  immediateWrites: number
  /** Writes that carried several frames. */
  batchedWrites: number
  /** Frames sent in batched writes. */
  batchedFrames: number
  /**
   * Writes after which the socket still buffered bytes: the kernel did not
   * take everything at once, so Node keeps the rest and libuv finishes it
   * when the socket becomes writable (one EAGAIN episode: an epoll_ctl pair).
   */
  partialWrites: number
  /** Times `write()` reported a full kernel buffer and the queue waited for 'drain'. */
  drainWaits: number
  /** Transfers dropped before their first byte (cancelled, timed out, closed). */
  dropped: number
}

export const DEFAULT_MAX_OUTBOUND_BYTES = 100 * 1024 * 1024
/** With `onOverBound`, how far past `maxOutboundBytes` the answers to requests already read may take a connection while it is not read: twice the bound. */
export const OVER_BOUND_FACTOR = 2
/**
 * Frames per batch write: more frames a write means fewer syscalls (each
 * write also wakes the peer: ~15-20 us of CPU on this VM), fewer means more
 * overlap between the two sides. Measured with 100 Add calls pipelined on
 * one connection, client and server on 2 cores, alternating builds:
 * - before the client's GC fix: unbounded 297-311 k calls/s, 32 frames
 *   345-372 k, 16 frames 298-342 k;
 * - after it: unbounded 178-320 k, 16 worse than 32; 50 against 32 lowered
 *   the server's CPU per call in 5 of 5 pairs (writes per call fall by a
 *   third), 50 against 64 was faster in 4 of 5 pairs (at 100 outstanding,
 *   two batches of 50 keep both sides busy; 64 + 36 does not).
 */
export const DEFAULT_BATCH_FRAMES = 50
