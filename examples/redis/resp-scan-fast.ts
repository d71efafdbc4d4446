/**
 * The common case of `RespScanner.scan` (resp.ts) in one tight pass: a
 * request that is a whole, well-formed array of bulk strings
 * (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`), all of it within the bytes given, as
 * clients send almost every request and as a pipelined burst holds all but
 * its last.
 *
 * It reads nothing into the scanner's state: it answers the frame's size,
 * or 0 for anything else (an incomplete frame, `*0`, a sign, a leading
 * zero, a length over its limit, a byte where a digit, a CR or a `$` must
 * be), and the scanner then reads the frame from its first byte with its
 * states, which find the same size, or the need for more bytes, or the
 * protocol error at its first bad byte. So it decides nothing the general
 * scan would decide otherwise: it only accepts what that scan accepts, with
 * the same size (the byte after each CR, and the two after a bulk's data,
 * are skipped unread, as there).
 */

const CR = 0x0d
const DOLLAR = 0x24
const ZERO = 0x30
const NINE = 0x39

/**
 * The size of the array frame that starts at `buf[start]` (a `*`) and ends
 * by `end`, if it is whole and well formed: at most `maxArguments` bulks of
 * at most `maxBulk` bytes each. 0 otherwise: then the general scan decides.
 */
export function scanWholeArray (buf: Buffer, start: number, end: number, maxArguments: number, maxBulk: number): number {
  // The count: digits up to a CR, the first one not 0 (so at least 1; `*0`,
  // `*-1` and a leading zero go to the general scan).
  let p = start + 1
  if (p >= end) return 0
  let c = buf[p]!
  if (c <= ZERO || c > NINE) return 0
  let count = 0
  for (;;) {
    count = count * 10 + (c - ZERO)
    if (count > maxArguments) return 0
    if (++p >= end) return 0
    c = buf[p]!
    if (c === CR) break
    if (c < ZERO || c > NINE) return 0
  }
  p += 2 // the CR and the byte after it

  for (; count > 0; count--) {
    // `$`, then the length: `0`, or digits the first of which is not 0.
    if (p >= end || buf[p] !== DOLLAR) return 0
    if (++p >= end) return 0
    c = buf[p]!
    if (c < ZERO || c > NINE) return 0
    let length = c - ZERO
    if (++p >= end) return 0
    c = buf[p]!
    if (length === 0 && c !== CR) return 0 // a leading zero
    while (c !== CR) {
      if (c < ZERO || c > NINE) return 0
      length = length * 10 + (c - ZERO)
      if (length > maxBulk) return 0
      if (++p >= end) return 0
      c = buf[p]!
    }
    if (length > maxBulk) return 0
    // The CR and the byte after it, the data, and the two bytes after the data.
    p += length + 4
    if (p > end) return 0
  }
  return p - start
}
