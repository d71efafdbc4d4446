/**
 * The byte-stream seam: what a framed connection needs of a non-blocking
 * byte stream, and nothing more. node:net with a SocketReader is the first
 * implementation (transport/net-stream.ts), any Duplex with 'data' events
 * (node:tls) the second (transport/duplex-stream.ts); a native epoll or
 * io_uring transport implements the same. docs/design.md, 'The byte-stream
 * contract', draws the call paths.
 *
 * Every call is non-blocking and made on the owner's thread. The stream
 * calls its listener only from its own I/O callbacks, never from inside a
 * call the connection made on it (a `write` that fails reports it later,
 * through `onError`), so the connection need not guard against re-entry.
 */
export interface ByteStream {
  /**
   * Where reads and events go from now on (one listener at a time: the
   * connection's, or its read gate's probe listener). Reads that arrived
   * before the first listener are handed to it first, in order.
   */
  listen: (listener: ByteStreamListener) => void
  /**
   * Writes `chunk`. The stream takes it whole: the kernel takes what it
   * takes at once, the stream keeps the rest and writes it, in order, when
   * the socket becomes writable. True: write more; false: the stream holds
   * more than it wants to (the kernel refused), so wait for `onWritable`.
   * The caller may reuse `chunk` only when the stream's `writableLength`
   * says nothing is held; use `writev` with `onWritten` to know.
   */
  write: (chunk: Buffer) => boolean
  /**
   * Optional: writes `buf[start, end)` as `write` would write a view of it,
   * without making the view. A stream that has it copies what the kernel
   * takes at once: when it returns true and `writableLength` is 0 after it,
   * it holds nothing of `buf`, and the caller may write over that range.
   */
  writeRange?: (buf: Buffer, start: number, end: number) => boolean
  /**
   * Writes `slices` in order as one gathered write (writev), as `write` does
   * one chunk. `onWritten` is called once every byte of them left the
   * process (the caller may reuse the slices then), or with the error that
   * stopped them.
   */
  writev: (slices: readonly Buffer[], onWritten?: (error: Error | null | undefined) => void) => boolean
  /** Bytes written to the stream that the kernel has not taken yet (Node's name for it: what is still to be written). */
  readonly writableLength: number
  /** Stops reading: the kernel stops polling the socket for reads (the peer's bytes wait in its buffers). */
  pauseReading: () => void
  /** Reads again after `pauseReading`. */
  resumeReading: () => void
  /** Bytes the stream has read but not delivered yet (a stream with a read buffer of its own; 0 when every read is delivered at once). */
  readonly bufferedReadBytes: number
  /** Half-closes: the held bytes go out, then FIN; `onEnded` once that was written. */
  end: (onEnded: () => void) => void
  /** Closes at once; bytes the stream holds are dropped. Idempotent. */
  close: () => void
  /** Closes at once with an RST (the peer sees ECONNRESET). */
  reset: () => void
  /** Bytes handed to the kernel so far (set-up bytes included). */
  readonly bytesWritten: number
  /**
   * Bytes the kernel has still to take from writes the stream made: falls
   * as the peer reads, during one large write too (the owner's measure of a
   * slow reader's progress).
   */
  readonly writeQueueBytes: number
  /** The TLS version bytes travel under ('TLSv1.3'), or null in plain text. */
  readonly secureProtocol: string | null
}

/** What a ByteStream reports to its connection. */
export interface ByteStreamListener {
  /**
   * Bytes read: `buf[start, end)`. `buf` belongs to the stream, which never
   * writes into that range again: a view of it stays valid for as long as
   * it is referenced.
   */
  onRead: (buf: Buffer, start: number, end: number) => void
  /** The stream wrote out what it held after a `write` returned false: the caller may write again. */
  onWritable: () => void
  /** The peer half-closed (FIN): nothing more will be read. */
  onEnd: () => void
  /** The stream failed (ECONNRESET, EPIPE, a TLS error): it closes next. */
  onError: (error: Error) => void
  /** The stream closed (either side); nothing more is reported. */
  onClose: () => void
}
