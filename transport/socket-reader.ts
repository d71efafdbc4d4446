/**
 * Reads of one socket delivered through Node's `onread` option (`net.connect`
 * takes it) instead of the stream's 'data' events. That skips, per read, the
 * Readable machinery (push, addChunk, emit, the maybeReadMore tick) and the
 * buffer Node allocates for each read: measured here, a synchronous client
 * round trip costs ~10 % less client CPU. Accepted server sockets cannot be
 * given `onread` on Node 20, so servers keep 'data'.
 *
 * Node reads into the buffer `onread.buffer()` returns. Each read gets the
 * next free part of a slab, never reused: a chunk (and the frames, sidecars
 * and `bytes` fields that are views of it) stays valid for as long as it is
 * referenced, as with 'data' events. The price: each open connection holds
 * its current slab (128 KiB: Node reads into at most 64 KiB at a time, and
 * the part waiting for the next read must be its own), about what the
 * kernel buffers of a TCP socket take; and a view kept alive keeps its whole
 * slab alive, as a pooled `Buffer.allocUnsafe` keeps its pool. Clients open
 * few connections; servers (many) keep Node's 'data' path anyway.
 */
export class SocketReader {
  #slab: Buffer = Buffer.allocUnsafeSlow(SLAB_BYTES)
  #at = 0
  #sink: ((chunk: Buffer) => void) | null = null
  #early: Buffer[] = []

  /** Pass as `net.connect({ onread })`. */
  readonly onread = {
    buffer: (): Buffer => this.#next(),
    // true: keep reading (false would stop the socket's reads).
    callback: (nread: number, buf: Uint8Array): boolean => { this.#deliver(nread, buf as Buffer); return true }
  }

  /** Where chunks go from now on (the connection's read handler); chunks read before are handed on first. */
  attach (sink: (chunk: Buffer) => void): void {
    this.#sink = sink
    const early = this.#early
    this.#early = []
    for (const chunk of early) sink(chunk)
  }

  // The buffer for the next read: the rest of the slab, or a new slab when
  // less than one read's worth is left.
  #next (): Buffer {
    if (SLAB_BYTES - this.#at < READ_BYTES) {
      this.#slab = Buffer.allocUnsafeSlow(SLAB_BYTES)
      this.#at = 0
    }
    return this.#slab.subarray(this.#at, this.#at + READ_BYTES)
  }

  #deliver (nread: number, buf: Buffer): void {
    // The bytes read now belong to this chunk: the next read starts after them.
    this.#at += nread
    const chunk = buf.subarray(0, nread)
    if (this.#sink === null) this.#early.push(chunk)
    else this.#sink(chunk)
  }
}

/** Bytes offered to each read: libuv's usual 64 KiB. */
const READ_BYTES = 64 * 1024
const SLAB_BYTES = 2 * READ_BYTES
