/**
 * RESP2 for the tests' raw sockets, independent of the redis example's own
 * encoder and scanner: commands as arrays of bulk strings, and a reply
 * parser.
 */

/** A command as RESP: an array of bulk strings (strings taken as latin1). */
export function encodeCommand (args: (string | Buffer)[]): Buffer {
  return Buffer.concat([
    Buffer.from(`*${args.length}\r\n`, 'latin1'),
    ...args.flatMap(a => {
      const b = typeof a === 'string' ? Buffer.from(a, 'latin1') : a
      return [Buffer.from(`$${b.length}\r\n`, 'latin1'), b, Buffer.from('\r\n', 'latin1')]
    })
  ])
}

/** A parsed reply: simple strings, integers, bulks (`Bulk`), nil, arrays and errors. */
export type RespReply<Bulk = Buffer> = string | number | Bulk | null | RespReply<Bulk>[] | { error: string }

/** One RESP reply at `at` and where the next one starts, or null when cut short; bulks as Buffers, or as latin1 strings with `'latin1'`. */
export function parseReply (buf: Buffer, at: number): [RespReply, number] | null
export function parseReply (buf: Buffer, at: number, bulks: 'latin1'): [RespReply<string>, number] | null
export function parseReply (buf: Buffer, at: number, bulks?: 'latin1'): [RespReply<Buffer | string>, number] | null {
  if (at >= buf.length) return null
  const cr = buf.indexOf('\r\n', at)
  if (cr < 0) return null
  const line = buf.toString('latin1', at + 1, cr)
  const next = cr + 2
  switch (buf[at]) {
    case 0x2b: return [line, next]
    case 0x2d: return [{ error: line }, next]
    case 0x3a: return [Number(line), next]
    case 0x24: {
      const n = Number(line)
      if (n < 0) return [null, next]
      if (buf.length < next + n + 2) return null
      return [bulks === 'latin1' ? buf.toString('latin1', next, next + n) : buf.subarray(next, next + n), next + n + 2]
    }
    case 0x2a: {
      const n = Number(line)
      if (n < 0) return [null, next]
      const items: RespReply<Buffer | string>[] = []
      let p = next
      for (let i = 0; i < n; i++) {
        const r = bulks === 'latin1' ? parseReply(buf, p, bulks) : parseReply(buf, p)
        if (r === null) return null
        items.push(r[0])
        p = r[1]
      }
      return [items, p]
    }
    default: throw new Error(`not a RESP reply at ${at}: ${JSON.stringify(buf.toString('latin1', at, at + 20))}`)
  }
}
