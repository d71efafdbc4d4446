/**
 * Byte helpers shared by the codec and transport tests.
 */

/**
 * Bytes from a transcript line: hex pairs separated by spaces or `|`, and
 * `"quoted"` ASCII strings, as docs/wire-format.md's annotated example writes them.
 */
export function hex (text: string): Buffer {
  const out: number[] = []
  const tokens = text.match(/"[^"]*"|[0-9a-fA-F]{2}|\|/g) ?? []
  for (const token of tokens) {
    if (token === '|') continue
    if (token.startsWith('"')) {
      for (const byte of Buffer.from(token.slice(1, -1), 'latin1')) out.push(byte)
    } else {
      out.push(parseInt(token, 16))
    }
  }
  return Buffer.from(out)
}

/** Lower-case spaced hex, for readable assertion diffs. */
export function toHex (bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('hex').replace(/(..)(?!$)/g, '$1 ')
}

/** The slices of one encoded frame joined into one buffer. */
export function joinSlices (slices: readonly Uint8Array[]): Buffer {
  return Buffer.concat(slices.map(s => Buffer.from(s.buffer, s.byteOffset, s.length)))
}

/** The frames of a `NegotiationStep.send` or `ClientNegotiation.start()` list, each joined. */
export function joinFrames (frames: readonly (readonly Uint8Array[])[] | undefined): Buffer[] {
  return (frames ?? []).map(joinSlices)
}

/** A memcached binary request header (magic 0x80): opcode, key and extras lengths, total body length, opaque. */
export function memcachedHeader (opcode: number, key: number, extras: number, body: number, opaque = 0): Buffer {
  const b = Buffer.alloc(24)
  b[0] = 0x80
  b[1] = opcode
  b.writeUInt16BE(key, 2)
  b[4] = extras
  b.writeUInt32BE(body, 8)
  b.writeUInt32BE(opaque, 12)
  return b
}
