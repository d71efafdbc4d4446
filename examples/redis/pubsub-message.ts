import type { FrameSink } from '../../reactor/index.js'
import { EncodedPush } from './resp.js'

// A channel's `message` push as PUBLISH sends it to the channel's subscribers (pubsub.ts).

/** A channel's message up to this size is copied into the push as it is encoded; a larger one is appended as it is. */
export const COPIED_MESSAGE_BYTES = 1024

/**
 * A `message` push, laid out straight into the push's sink: the channel's
 * head (`*3 message <channel> $`), the message's length, the message.
 * `message` is read only while the push is encoded (the PUBLISH's own
 * bytes, in place).
 */
export class ChannelMessage extends EncodedPush {
  readonly head: Buffer
  readonly message: Buffer
  constructor (head: Buffer, message: Buffer) {
    super([])
    this.head = head
    this.message = message
  }

  override get slices (): Uint8Array[] {
    const out = Buffer.allocUnsafe(this.bytes)
    this.#write(out, 0)
    return [out]
  }

  override encode (out: FrameSink): void {
    const at = out.reserve(this.bytes)
    this.#write(out.buffer, at)
  }

  get bytes (): number {
    const length = this.message.length
    return this.head.length + digitsOf(length) + length + 4
  }

  #write (buf: Buffer, at: number): void {
    const head = this.head
    const message = this.message
    const length = message.length
    buf.set(head, at)
    at += head.length
    if (length >= 1000) {
      at += latin1Write.call(buf, String(length), at)
    } else {
      if (length >= 100) buf[at++] = 0x30 + Math.floor(length / 100)
      if (length >= 10) buf[at++] = 0x30 + Math.floor(length / 10) % 10
      buf[at++] = 0x30 + length % 10
    }
    buf[at++] = 0x0d
    buf[at++] = 0x0a
    at = copySmall(message, buf, at)
    buf[at++] = 0x0d
    buf[at] = 0x0a
  }
}

function digitsOf (length: number): number {
  return length < 10 ? 1 : length < 100 ? 2 : length < 1000 ? 3 : String(length).length
}

/** Copies `from` into `to` at `at`; where it ends. A short one byte by byte (a typed array's `set` costs more than a few bytes' loop). */
function copySmall (from: Buffer, to: Buffer, at: number): number {
  const length = from.length
  if (length > 16) {
    to.set(from, at)
    return at + length
  }
  for (let i = 0; i < length; i++) to[at + i] = from[i]!
  return at + length
}

// Buffer's own latin1 writer, without `write`'s argument checks (as resp.ts uses it).
const latin1Write = (Buffer.prototype as unknown as { latin1Write: (s: string, at: number) => number }).latin1Write
