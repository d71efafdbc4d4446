import { Socket } from 'node:net'

/**
 * Reads of one socket delivered through Node's `onread` option instead of
 * the stream's 'data' events. That skips, per read, the Readable machinery
 * (push, addChunk, emit, the maybeReadMore tick) and the 64 KiB buffer Node
 * allocates (and shrinks) for each read: measured here, a synchronous round
 * trip costs ~10 % less CPU on the side that reads this way. Clients pass
 * `onread` to `net.connect`; a server hands its accepted sockets to
 * `readThrough` (Node 20 takes no `onread` for accepted sockets).
 *
 * Node reads into the buffer `onread.buffer()` returns, called once per
 * read. Each read gets the free rest of a slab, never reused: a chunk (and
 * the frames, sidecars and `bytes` fields that are views of it) stays valid
 * for as long as it is referenced, as with 'data' events. Slabs follow the
 * traffic: each is sized for about four reads like the last one, from
 * 4 KiB (synchronous small calls: one allocation per ~35 calls) to 128 KiB
 * (reads that keep filling their buffer, i.e. more was waiting, grow to
 * 64 KiB). A connection holds its current slab between reads: 4 KiB after
 * small calls, more only after large reads and until its next read. A view
 * kept alive keeps its whole slab alive, as a pooled `Buffer.allocUnsafe`
 * keeps its pool, except that a small read in a large slab the reader is
 * leaving gets a copy, so a small kept view cannot pin 128 KiB.
 */
export class SocketReader {
  #slab: Buffer = EMPTY
  #at = 0
  /** Bytes the next read should have room for, from the last read, and the slab size for such reads. */
  #want = MIN_WANT
  #slabFor = slabSizeFor(MIN_WANT)
  #sink: ReadSink | null = null
  #early: Buffer[] = []

  /** Pass as `net.connect({ onread })`. */
  readonly onread = {
    buffer: (): Buffer => this.#next(),
    // true: keep reading (false would stop the socket's reads).
    callback: (nread: number, buf: Uint8Array): boolean => { this.#deliver(nread, buf as Buffer); return true }
  }

  /**
   * Where chunks go from now on (the stream's listener): each as
   * `(chunk, 0, chunk.length)`; chunks read before are handed on first.
   */
  attach (sink: ReadSink): void {
    this.#sink = sink
    const early = this.#early
    this.#early = []
    for (const chunk of early) sink(chunk, 0, chunk.length)
  }

  /** Bytes of the slab the next read goes into (what an idle connection holds). */
  get slabBytes (): number {
    return this.#slab.length
  }

  // The buffer for the next read: the rest of the current slab while it has
  // room for what the last read suggests, else a new slab sized for about
  // four such reads (4 KiB to 128 KiB). A slab far larger than that is left
  // too, so a connection back to small reads stops holding a large one.
  #next (): Buffer {
    if (this.#slab.length - this.#at < this.#want || this.#oversized()) {
      this.#slab = Buffer.allocUnsafeSlow(this.#slabFor)
      this.#at = 0
    }
    // At most libuv's usual 64 KiB per read, as with 'data' events.
    return this.#slab.subarray(this.#at, this.#at + Math.min(this.#slab.length - this.#at, LARGE_WANT))
  }

  #oversized (): boolean {
    return this.#slab.length > 4 * this.#slabFor
  }

  #deliver (nread: number, buf: Buffer): void {
    // The bytes read now belong to this chunk: the next read starts after them.
    this.#at += nread
    // A full buffer means more was waiting: room for twice as much next
    // (growing read by read up to 64 KiB, within one event: libuv reads again
    // while reads fill their buffer); else room for twice this read.
    this.#want = nread === buf.length ? Math.min(LARGE_WANT, 2 * nread) : Math.max(MIN_WANT, 2 * nread)
    this.#slabFor = slabSizeFor(this.#want)
    let chunk = buf.subarray(0, nread)
    // A small read in a large slab that the next read leaves (reads are small
    // again) would keep the whole slab alive for as long as a view of it
    // lives: it gets a buffer of its own instead (once per such change).
    if (nread <= COPY_BYTES && this.#oversized()) chunk = Buffer.from(chunk)
    if (this.#sink === null) this.#early.push(chunk)
    else this.#sink(chunk, 0, chunk.length)
  }
}

/** Takes one read: `buf[start, end)` (a SocketReader hands whole chunks: `start` 0, `end` their length). */
export type ReadSink = (buf: Buffer, start: number, end: number) => void

function slabSizeFor (want: number): number {
  let size = MIN_SLAB
  while (size < 4 * want && size < MAX_SLAB) size *= 2
  return size
}

/**
 * Moves an accepted socket's handle to a new socket that reads through
 * `reader`. The server must be created with `pauseOnConnect: true`, so that
 * nothing was read yet. Node 20 has no public way to give an accepted socket
 * `onread`; this uses what Node's own `child_process` handle passing uses
 * (`new Socket({ handle })`) plus the socket's `_handle` and `_server`. When
 * any of that is missing the socket is resumed and returned as it is (the
 * caller then reads 'data' events): check `result !== socket`.
 */
export function readThrough (socket: Socket, reader: SocketReader): Socket {
  const internals = socket as unknown as { _handle?: { useUserBuffer?: unknown, reading?: unknown } | null, _server?: unknown }
  const handle = internals._handle
  // Only a socket nothing was read from yet (pauseOnConnect) can change hands
  // without losing bytes.
  if (handle == null || typeof handle.useUserBuffer !== 'function' || handle.reading === true ||
    socket.readableLength > 0 || socket.destroyed || !('_server' in internals)) {
    socket.resume()
    return socket
  }
  const moved = new Socket({
    handle, onread: reader.onread, readable: true, writable: true, allowHalfOpen: socket.allowHalfOpen, noDelay: true
  } as unknown as ConstructorParameters<typeof Socket>[0])
  const movedInternals = moved as unknown as { _handle?: unknown, _server?: unknown, server?: unknown }
  if (movedInternals._handle !== handle) {
    // The constructor ignored the handle (a Node without it): nothing moved.
    moved.destroy()
    socket.resume()
    return socket
  }
  // The server counts the connection once: the new socket is the one that
  // closes (and tells the server), the old one is dropped unread.
  movedInternals._server = internals._server
  movedInternals.server = internals._server
  internals._handle = null
  internals._server = null
  return moved
}

const EMPTY = Buffer.alloc(0)
/** Room asked for after a read that did not fill its buffer: twice that read, at least 512 bytes. */
const MIN_WANT = 512
/** The most a read asks for: libuv's usual 64 KiB. */
const LARGE_WANT = 64 * 1024
/** Small reads that would pin a large slab alone are copied up to this size. */
const COPY_BYTES = 4 * 1024
const MIN_SLAB = 4 * 1024
const MAX_SLAB = 128 * 1024
