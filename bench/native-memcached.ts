/**
 * The JS half of the native reactor prototype (a go/no-go measurement): memcached's binary GET
 * and SET (what memcaslap's default workload sends; other opcodes get an
 * empty success) on the native reactor prototype (bench/native-reactor/
 * reactor.c), values in a Map, as bench/raw-memcached.ts does on node:net:
 *
 *   node dist/bench/native-memcached.js --port 0
 *
 * builds the addon with the system's cc (-Wall -Wextra -Werror, Node's
 * headers from /usr/include/node or the node-api-headers package) into the
 * system's temporary folder, then prints `listening on 127.0.0.1:PORT`.
 * Each loop turn the reactor hands over every ready socket's bytes in one
 * call; this answers them into the shared outbound slab and returns the
 * (fd, offset, length) entries the reactor writes. A connection's bytes
 * that end inside a request wait in a Buffer of its own for the rest.
 */
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

interface Reactor {
  port: number
  inbound: Uint8Array
  outbound: Uint8Array
  entries: Int32Array
  out: Int32Array
}
interface Addon {
  listen: (port: number, onTurn: (n: number) => number) => Reactor
  close: () => void
}

const HEADER = 24
const GET = 0x00
const SET = 0x01
const NOT_FOUND = 0x0001
const SLAB = 4 << 20

/** Builds the addon (once per source change) and loads it. */
export function loadReactor (): Addon {
  const source = fileURLToPath(new URL('../../bench/native-reactor/reactor.c', import.meta.url))
  const dir = join(tmpdir(), 'nyala-native-prototype')
  mkdirSync(dir, { recursive: true })
  const out = join(dir, 'reactor.node')
  const headers = ['/usr/include/node', join(fileURLToPath(new URL('../../node_modules/node-api-headers/include', import.meta.url)))].filter((d) => existsSync(join(d, 'node_api.h')))
  if (headers.length === 0) throw new Error('no node_api.h: install Node\'s headers or the node-api-headers package')
  execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-shared', '-fPIC', ...headers.map((h) => `-I${h}`), '-o', out, source], { stdio: 'inherit' })
  return createRequire(import.meta.url)(out) as Addon
}

export function startNativeMemcached (port: number): { port: number, close: () => void } {
  const addon = loadReactor()
  const store = new Map<string, Buffer>()
  const partial = new Map<number, Buffer>()
  let r: Reactor
  let slab: Buffer = Buffer.alloc(0)
  const onTurn = (n: number): number => {
    const entries = r.entries
    const outEntries = r.out
    const outbound = r.outbound
    let written = 0
    let answers = 0
    for (let i = 0; i < n; i++) {
      const fd = entries[3 * i]!
      const offset = entries[3 * i + 1]!
      const length = entries[3 * i + 2]!
      if (length < 0) { partial.delete(fd); continue }
      // Parsed in place in the slab (one Buffer over it, made once); only a connection with a partial request gets a Buffer of its own.
      let data = slab
      let at = offset
      let end = offset + length
      const before = partial.get(fd)
      if (before !== undefined) {
        data = Buffer.concat([before, slab.subarray(offset, end)])
        partial.delete(fd)
        at = 0
        end = data.length
      }
      const start = written
      while (end - at >= HEADER) {
        const body = (data[at + 8]! << 24 | data[at + 9]! << 16 | data[at + 10]! << 8 | data[at + 11]!) >>> 0
        if (end - at < HEADER + body) break
        // Room for the largest answer (a GET of this size); a turn over the slab stops here and keeps the rest.
        if (SLAB - written < HEADER + 4 + (1 << 20)) break
        const opcode = data[at + 1]!
        const keyBytes = data[at + 2]! << 8 | data[at + 3]!
        const extras = data[at + 4]!
        const keyAt = at + HEADER + extras
        const key = data.toString('latin1', keyAt, keyAt + keyBytes)
        outbound.fill(0, written, written + HEADER)
        outbound[written] = 0x81
        outbound[written + 1] = opcode
        outbound.set(data.subarray(at + 12, at + 16), written + 12) // opaque
        if (opcode === SET) {
          store.set(key, Buffer.from(data.subarray(keyAt + keyBytes, at + HEADER + body)))
          outbound[written + 23] = 1 // a CAS
          written += HEADER
        } else if (opcode === GET) {
          const value = store.get(key)
          if (value === undefined) {
            outbound[written + 7] = NOT_FOUND
            written += HEADER
          } else {
            const total = 4 + value.length
            outbound[written + 4] = 4 // flags
            outbound[written + 8] = total >>> 24; outbound[written + 9] = total >>> 16 & 255; outbound[written + 10] = total >>> 8 & 255; outbound[written + 11] = total & 255
            outbound.set(value, written + HEADER + 4)
            written += HEADER + total
          }
        } else {
          written += HEADER
        }
        at += HEADER + body
      }
      if (at < end) partial.set(fd, Buffer.from(data.subarray(at, end)))
      if (written > start) {
        outEntries[3 * answers] = fd
        outEntries[3 * answers + 1] = start
        outEntries[3 * answers + 2] = written - start
        answers++
      }
    }
    return answers
  }
  r = addon.listen(port, onTurn)
  slab = Buffer.from(r.inbound.buffer, r.inbound.byteOffset, r.inbound.length)
  return { port: r.port, close: () => addon.close() }
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { values } = parseArgs({ options: { port: { type: 'string', default: '0' } } })
  const server = startNativeMemcached(Number(values.port))
  process.stdout.write(`listening on 127.0.0.1:${server.port}\n`)
  const stop = (): void => { server.close(); process.exit(0) }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}
