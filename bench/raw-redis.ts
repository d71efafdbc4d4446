/**
 * The Node ceiling for bench/redis.ts: a minimal node:net server for the
 * RESP arrays redis-benchmark's SET and GET tests send (and PING, CONFIG
 * GET answered with an empty array, which redis-benchmark asks first),
 * values in a Map, every read's answers in one write, no limits, no
 * inline commands, no framework:
 *
 *   node dist/bench/raw-redis.js --port 0
 *
 * prints `listening on 127.0.0.1:PORT`. It is what the least Node code
 * costs per pipelined request, beside which the example's and real
 * redis-server's figures read.
 */
import { serveRaw, serveRawFromCommandLine } from './raw-server.js'

const CR = 0x0d
const OK = Buffer.from('+OK\r\n')
const PONG = Buffer.from('+PONG\r\n')
const NIL = Buffer.from('$-1\r\n')
const EMPTY = Buffer.from('*0\r\n')

// The number at buf[at..] up to CR, and where its line ends (after LF); null: not all here.
function lineNumber (buf: Buffer, at: number): [number, number] | null {
  let n = 0
  let i = at
  while (i < buf.length && buf[i] !== CR) n = n * 10 + buf[i++]! - 48
  return i + 1 < buf.length ? [n, i + 2] : null
}

export function startRawRedis (port: number, host = '127.0.0.1'): Promise<{ port: number, close: () => Promise<void> }> {
  const store = new Map<string, Buffer>()
  return serveRaw((data, out) => {
    let at = 0
    for (;;) {
      // *N\r\n then N times $len\r\n<bytes>\r\n
      if (at >= data.length || data[at] !== 0x2a) break
      const count = lineNumber(data, at + 1)
      if (count === null) break
      let p = count[1]
      const args: Array<[number, number]> = []
      let whole = true
      for (let i = 0; i < count[0]; i++) {
        const len = p < data.length ? lineNumber(data, p + 1) : null
        if (len === null || len[1] + len[0] + 2 > data.length) { whole = false; break }
        args.push([len[1], len[1] + len[0]])
        p = len[1] + len[0] + 2
      }
      if (!whole) break
      at = p
      const [n0, n1] = args[0]!
      const name = data.toString('latin1', n0, n1).toUpperCase()
      if (name === 'SET') {
        store.set(data.toString('latin1', args[1]![0], args[1]![1]), Buffer.from(data.subarray(args[2]![0], args[2]![1])))
        out.push(OK)
      } else if (name === 'GET') {
        const value = store.get(data.toString('latin1', args[1]![0], args[1]![1]))
        out.push(value === undefined ? NIL : Buffer.concat([Buffer.from(`$${value.length}\r\n`), value, Buffer.from('\r\n')]))
      } else if (name === 'PING') {
        out.push(PONG)
      } else {
        out.push(EMPTY)
      }
    }
    return at
  }, port, host)
}

if (import.meta.url === `file://${process.argv[1]}`) await serveRawFromCommandLine((port) => startRawRedis(port))
