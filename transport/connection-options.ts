import type { Socket } from 'node:net'
import type { RpcError } from '../codec/errors.js'
import type { AnyFraming } from '../codec/frame-decoder.js'
import type { BusyPoller } from './busy-poll.js'
import type { InboundBudget } from './inbound-budget.js'
import type { TransferQueueStats } from './transfer-queue.js'

/** What a connection reports to its owner (the reactor's server or client). */
export interface ConnectionHandler {
  /**
   * A whole frame after set-up: `buf[start, end)`, length prefix included.
   * `buf` is the read chunk (or a buffer the frame was assembled in); views
   * of it stay valid as long as they are referenced, but the bytes outside
   * the range belong to other frames. Return false to stop reading.
   */
  onFrame: (buf: Buffer, start: number, end: number) => boolean | undefined | void
  /**
   * The framing refused the stream after set-up. Return true to take it
   * over: the connection reads nothing more and the handler ends it (after
   * answering, say); false or absent: the connection is destroyed with `error`.
   */
  onFramingError?: (error: RpcError) => boolean
  /** The connection closed; `error` says why (undefined: closed by us without error). Called once. */
  onClose: (error: RpcError | undefined) => void
}

export interface ConnectionOptions {
  framing: AnyFraming
  /** Largest inbound frame accepted; checked as soon as its length prefix arrives. */
  maxFrameBytes?: number | undefined
  /**
   * Bound on outbound bytes queued or buffered, judged on what the kernel
   * did not take: past it `send` and `writeFrame` return false. With
   * `onReadingSuspended`, past it the connection reads nothing more until
   * the peer has taken enough to bring it back under (`isReadingSuspended`),
   * and the answers to requests already read are still taken, up to twice
   * the bound.
   */
  maxOutboundBytes?: number | undefined
  /**
   * A frame sent with nothing queued waits for the end of the current
   * microtask checkpoint (the same event-loop turn) to go out with the
   * frames sent by the other continuations of that checkpoint, e.g. the
   * callers resumed by one read's responses. Default true; see
   * TransferQueueOptions.coalesceMicrotasks.
   */
  coalesceMicrotasks?: boolean | undefined
  /** The node:net socket under the stream: what a handshake step's `upgrade` switches to TLS (KRPC's TLS inside negotiation). */
  socket?: Socket | undefined
  /** How the stream's reads arrive, for `stats()`; default 'onread' (slabs the stream owns). */
  readPath?: 'onread' | 'data' | undefined
  /**
   * Frames decoded from one read before the rest of it waits for the next
   * event-loop turn (reading stops meanwhile, the rest kept aside and
   * counted in `inboundBudget`): one peer pipelining thousands of small
   * requests in a read cannot hold the loop from the others. Default
   * `DEFAULT_MAX_FRAMES_PER_READ` (64).
   */
  maxFramesPerRead?: number | undefined
  /**
   * Bytes the frames of one read may queue on the connection (answers,
   * streamed parts, pushes to it) before the rest of the read waits for
   * the next event-loop turn, as past `maxFramesPerRead`; the frame that
   * passes it is handled whole. Requests that each ask for many answers
   * (a SUBSCRIBE of 100 channels) are then counted by what they produce, not
   * as one frame each. Default `DEFAULT_MAX_ANSWER_BYTES_PER_READ` (64 KiB).
   */
  maxAnswerBytesPerRead?: number | undefined
  /** Touched on every read and send, so the owner's event loop keeps polling a while (see BusyPoller); none by default. */
  busyPoller?: BusyPoller | undefined
  /** The reactor-wide budget for bytes held in incomplete inbound frames; none by default. */
  inboundBudget?: InboundBudget | undefined
  /** Called when the transfer queue starts waiting for 'drain' (the peer reads slower than we send). */
  onBackedUp?: (() => void) | undefined
  /**
   * With it, past `maxOutboundBytes` the connection stops reading instead of
   * refusing sends (see `maxOutboundBytes`), and this is called when it does
   * (`isReadingSuspended`): the owner judges whether the peer still takes
   * any. Without it, a send past the bound returns false.
   */
  onReadingSuspended?: (() => void) | undefined
}

/** Counters of one connection. */
export interface ConnectionStats extends TransferQueueStats {
  /** Bytes read from the socket so far. */
  bytesRead: number
  /** Frames received so far, set-up frames included. */
  framesRead: number
  /** Bytes handed to the kernel (set-up frames included). */
  bytesWritten: number
  /** How reads arrive: into slabs the stream owns (`onread`, the fast path) or as 'data' events. */
  readPath: 'onread' | 'data'
  /** The TLS version frames travel under ('TLSv1.3'), or null in plain text (KRPC on loopback after TLS that only authenticated, too). */
  tls: string | null
}
