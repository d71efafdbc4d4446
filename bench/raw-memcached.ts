/**
 * The Node ceiling for bench/memcached.ts: a minimal node:net server for
 * memcached's binary GET and SET (the only opcodes memcaslap's default
 * workload sends; anything else is answered with an empty success), values
 * in a Map, no limits, no expiry, no CAS, no framework:
 *
 *   node dist/bench/raw-memcached.js --port 0
 *
 * prints `listening on 127.0.0.1:PORT`. Every read's answers leave in one
 * write, as in bench/raw-echo.ts. It is what a Node server costs per
 * one-request round trip with the least work, beside which the example's
 * and real memcached's figures read.
 */
import { serveRaw, serveRawFromCommandLine } from './raw-server.js'

const HEADER = 24
const GET = 0x00
const SET = 0x01
const NOT_FOUND = 0x0001

export function startRawMemcached (port: number, host = '127.0.0.1'): Promise<{ port: number, close: () => Promise<void> }> {
  const store = new Map<string, Buffer>()
  return serveRaw((data, out) => {
    let at = 0
    while (data.length - at >= HEADER) {
      const body = data.readUInt32BE(at + 8)
      if (data.length - at < HEADER + body) break
      const opcode = data[at + 1]!
      const keyBytes = data.readUInt16BE(at + 2)
      const extras = data[at + 4]!
      const keyAt = at + HEADER + extras
      const key = data.toString('latin1', keyAt, keyAt + keyBytes)
      let answer: Buffer
      if (opcode === SET) {
        store.set(key, Buffer.from(data.subarray(keyAt + keyBytes, at + HEADER + body)))
        answer = Buffer.alloc(HEADER)
        answer.writeUInt32BE(1, 20) // a CAS
      } else if (opcode === GET) {
        const value = store.get(key)
        answer = Buffer.alloc(HEADER + (value === undefined ? 0 : 4 + value.length))
        if (value === undefined) {
          answer.writeUInt16BE(NOT_FOUND, 6)
        } else {
          answer[4] = 4 // flags
          answer.writeUInt32BE(4 + value.length, 8)
          value.copy(answer, HEADER + 4)
        }
      } else {
        answer = Buffer.alloc(HEADER)
      }
      answer[0] = 0x81
      answer[1] = opcode
      data.copy(answer, 12, at + 12, at + 16) // opaque
      out.push(answer)
      at += HEADER + body
    }
    return at
  }, port, host)
}

if (import.meta.url === `file://${process.argv[1]}`) await serveRawFromCommandLine((port) => startRawMemcached(port))
