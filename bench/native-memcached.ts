/**
 * The JS half of the native reactor prototype (a go/no-go measurement): memcached's binary GET
 * and SET (what memcaslap's default workload sends; other opcodes get an
 * empty success) on the native reactor prototype (bench/native-reactor/
 * reactor.c), values in a hash table over the keys' bytes (where
 * bench/raw-memcached.ts, on node:net, keys a Map by a string per request):
 *
 *   node dist/bench/native-memcached.js --port 0
 *
 * builds the addon with the system's cc (-Wall -Wextra -Werror, Node's
 * headers from /usr/include/node or the node-api-headers package) into the
 * system's temporary folder (once per source: the file is named after its
 * hash), then prints `listening on 127.0.0.1:PORT`. Each loop turn the
 * reactor hands over every ready socket's bytes in one call; this answers
 * them into the shared outbound slab and returns the (fd, offset, length)
 * entries the reactor writes. A connection's bytes that end inside a request
 * wait in a Buffer of its own for the rest. Whole requests that a full
 * outbound slab stopped wait there too, and `more[0]` asks the reactor for a
 * turn at once to serve them, since no new bytes may come to trigger one.
 * Values are at most 1 MiB (memcached's default item size); a larger SET is
 * answered "too large".
 */
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs'
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
  more: Int32Array
}
interface Addon {
  listen: (port: number, onTurn: (n: number) => number) => Reactor
  close: () => void
}

const HEADER = 24
const GET = 0x00
const SET = 0x01
const NOT_FOUND = 0x0001
const TOO_LARGE = 0x0003
// memcached's default largest item (-I 1m): the outbound slab always has room for one such answer.
const MAX_VALUE = 1 << 20
const SLAB = 4 << 20
// The reactor's out entries (MAX_ENTRIES in reactor.c): answers for one connection each per turn.
const MAX_ANSWERS = 4096

/** Builds the addon (once per source change) and loads it. */
export function loadReactor (): Addon {
  const source = fileURLToPath(new URL('../../bench/native-reactor/reactor.c', import.meta.url))
  const dir = join(tmpdir(), 'nyala-native-prototype')
  mkdirSync(dir, { recursive: true })
  // Named after the source's hash: two servers built from different sources (an A/B) never overwrite each other's addon.
  const out = join(dir, `reactor-${createHash('sha256').update(readFileSync(source)).digest('hex').slice(0, 16)}.node`)
  if (!existsSync(out)) {
    const headers = ['/usr/include/node', join(fileURLToPath(new URL('../../node_modules/node-api-headers/include', import.meta.url)))].filter((d) => existsSync(join(d, 'node_api.h')))
    if (headers.length === 0) throw new Error('no node_api.h: install Node\'s headers or the node-api-headers package')
    // Built beside its final name and renamed into it: a server starting meanwhile never loads half a file.
    const building = `${out}.${process.pid}`
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-shared', '-fPIC', ...headers.map((h) => `-I${h}`), '-o', building, source], { stdio: 'inherit' })
    renameSync(building, out)
  }
  return createRequire(import.meta.url)(out) as Addon
}

/** Serves memcached's binary GET and SET on the native reactor prototype; `port` 0 picks a free one. */
export function startNativeMemcached (port: number): { port: number, close: () => void } {
  const addon = loadReactor()
  // The store: open addressing over murmur3 of the key's bytes, read 4 at a time through DataViews where the
  // request lies, so a request makes no string (a Map keyed by a latin1 string per request spent ~1,700
  // instructions on it, ~800 of them in V8's string hash). Keys live in one arena; no delete (memcaslap sends none).
  let mask = (1 << 14) - 1
  let count = 0
  let hashes = new Int32Array(mask + 1) // 0: an empty slot (hashKey never returns 0)
  let keyAts = new Int32Array(mask + 1)
  let keyLengths = new Int32Array(mask + 1)
  let values: Array<Buffer | undefined> = new Array<Buffer | undefined>(mask + 1).fill(undefined)
  let arena = new Uint8Array(1 << 20)
  let arenaView = new DataView(arena.buffer)
  let arenaUsed = 0
  const hashKey = (view: DataView, at: number, length: number): number => {
    let h = 0
    let i = at
    const end = at + length
    for (; i + 4 <= end; i += 4) {
      let k = Math.imul(view.getInt32(i, true), 0xcc9e2d51)
      k = k << 15 | k >>> 17
      h ^= Math.imul(k, 0x1b873593)
      h = h << 13 | h >>> 19
      h = (Math.imul(h, 5) + 0xe6546b64) | 0
    }
    if (i < end) {
      let k = 0
      for (let shift = 0; i < end; i++, shift += 8) k |= view.getUint8(i) << shift
      k = Math.imul(k, 0xcc9e2d51)
      k = k << 15 | k >>> 17
      h ^= Math.imul(k, 0x1b873593)
    }
    h ^= length
    h ^= h >>> 16
    h = Math.imul(h, 0x85ebca6b)
    h ^= h >>> 13
    h = Math.imul(h, 0xc2b2ae35)
    h ^= h >>> 16
    return h === 0 ? 1 : h
  }
  // The slot holding the key view[at, at + length), or -1 - (the empty slot where it would go).
  const findKey = (view: DataView, at: number, length: number, hash: number): number => {
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const h = hashes[i]!
      if (h === 0) return -1 - i
      if (h !== hash || keyLengths[i] !== length) continue
      const from = keyAts[i]!
      let k = 0
      while (k + 4 <= length && arenaView.getInt32(from + k, true) === view.getInt32(at + k, true)) k += 4
      if (k + 4 <= length) continue
      while (k < length && arena[from + k] === view.getUint8(at + k)) k++
      if (k === length) return i
    }
  }
  const grow = (): void => {
    const old = { hashes, keyAts, keyLengths, values }
    mask = 2 * mask + 1
    hashes = new Int32Array(mask + 1)
    keyAts = new Int32Array(mask + 1)
    keyLengths = new Int32Array(mask + 1)
    values = new Array<Buffer | undefined>(mask + 1).fill(undefined)
    for (let j = 0; j < old.hashes.length; j++) {
      const hash = old.hashes[j]!
      if (hash === 0) continue
      let i = hash & mask
      while (hashes[i] !== 0) i = (i + 1) & mask
      hashes[i] = hash
      keyAts[i] = old.keyAts[j]!
      keyLengths[i] = old.keyLengths[j]!
      values[i] = old.values[j]
    }
  }
  const getValue = (view: DataView, at: number, length: number): Buffer | undefined => {
    const slot = findKey(view, at, length, hashKey(view, at, length))
    return slot < 0 ? undefined : values[slot]
  }
  const setValue = (data: Buffer, view: DataView, keyAt: number, keyLength: number, valueAt: number, valueEnd: number): void => {
    const hash = hashKey(view, keyAt, keyLength)
    let slot = findKey(view, keyAt, keyLength, hash)
    if (slot >= 0) {
      // A key set again with a value of the same size (what memcaslap sends) keeps its Buffer: no allocation, no garbage.
      const old = values[slot]!
      if (old.length === valueEnd - valueAt) old.set(data.subarray(valueAt, valueEnd))
      else values[slot] = Buffer.from(data.subarray(valueAt, valueEnd))
      return
    }
    if (2 * (count + 1) > mask + 1) { grow(); slot = findKey(view, keyAt, keyLength, hash) }
    if (arenaUsed + keyLength > arena.length) {
      const bigger = new Uint8Array(2 * arena.length + keyLength)
      bigger.set(arena.subarray(0, arenaUsed))
      arena = bigger
      arenaView = new DataView(arena.buffer)
    }
    arena.set(data.subarray(keyAt, keyAt + keyLength), arenaUsed)
    const i = -1 - slot
    hashes[i] = hash
    keyAts[i] = arenaUsed
    keyLengths[i] = keyLength
    values[i] = Buffer.from(data.subarray(valueAt, valueEnd))
    arenaUsed += keyLength
    count++
  }
  // A connection's bytes not answered yet: the start of a request, or whole requests a full outbound slab left for the next turn.
  const partial = new Map<number, Buffer>()
  // The connections whose `partial` holds whole requests: served again next turn even if nothing more arrives.
  const stalled = new Set<number>()
  let r: Reactor
  let slab: Buffer = Buffer.alloc(0)
  let slabView: DataView = new DataView(new ArrayBuffer(0))
  let written = 0
  let answers = 0

  // Answers the whole requests in data[at, end) into the outbound slab as one entry; keeps the rest in `partial`.
  const serve = (fd: number, data: Buffer, view: DataView, at: number, end: number): void => {
    const outbound = r.outbound
    const start = written
    while (end - at >= HEADER) {
      const body = (data[at + 8]! << 24 | data[at + 9]! << 16 | data[at + 10]! << 8 | data[at + 11]!) >>> 0
      if (end - at < HEADER + body) break
      // Room for the largest answer (a GET of the largest value) and for this entry; a full slab or entry list leaves the rest for the next turn.
      if (SLAB - written < HEADER + 4 + MAX_VALUE || (written === start && answers === MAX_ANSWERS)) { stalled.add(fd); break }
      const opcode = data[at + 1]!
      const keyBytes = data[at + 2]! << 8 | data[at + 3]!
      const extras = data[at + 4]!
      const keyAt = at + HEADER + extras
      // The header byte by byte: fill() and set(subarray()) are each a builtin call and an object per answer.
      outbound[written] = 0x81
      outbound[written + 1] = opcode
      for (let k = 2; k < 12; k++) outbound[written + k] = 0
      outbound[written + 12] = data[at + 12]! // opaque
      outbound[written + 13] = data[at + 13]!
      outbound[written + 14] = data[at + 14]!
      outbound[written + 15] = data[at + 15]!
      for (let k = 16; k < HEADER; k++) outbound[written + k] = 0
      if (opcode === SET) {
        const valueAt = keyAt + keyBytes
        const valueEnd = at + HEADER + body
        if (valueEnd - valueAt > MAX_VALUE) {
          outbound[written + 7] = TOO_LARGE
        } else {
          setValue(data, view, keyAt, keyBytes, valueAt, valueEnd)
          outbound[written + 23] = 1 // a CAS
        }
        written += HEADER
      } else if (opcode === GET) {
        const value = getValue(view, keyAt, keyBytes)
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
      const outEntries = r.out
      outEntries[3 * answers] = fd
      outEntries[3 * answers + 1] = start
      outEntries[3 * answers + 2] = written - start
      answers++
    }
  }

  const onTurn = (n: number): number => {
    written = 0
    answers = 0
    const entries = r.entries
    if (stalled.size > 0) {
      // A connection closed this turn may have lent its fd to one accepted since: its leftovers go, not to the newcomer.
      for (let i = 0; i < n; i++) if (entries[3 * i + 2]! < 0) { partial.delete(entries[3 * i]!); stalled.delete(entries[3 * i]!) }
      // Oldest bytes first: a stalled connection's requests go before anything it sent since.
      const again = [...stalled]
      stalled.clear()
      for (const fd of again) {
        const rest = partial.get(fd)
        if (rest === undefined) continue
        partial.delete(fd)
        serve(fd, rest, new DataView(rest.buffer, rest.byteOffset, rest.length), 0, rest.length)
      }
    }
    for (let i = 0; i < n; i++) {
      const fd = entries[3 * i]!
      const offset = entries[3 * i + 1]!
      const length = entries[3 * i + 2]!
      if (length < 0) { partial.delete(fd); stalled.delete(fd); continue }
      // Parsed in place in the slab (one Buffer over it, made once); only a connection with bytes left over gets a Buffer of its own.
      const before = partial.size === 0 ? undefined : partial.get(fd)
      if (before === undefined) {
        serve(fd, slab, slabView, offset, offset + length)
      } else {
        partial.delete(fd)
        const data = Buffer.concat([before, slab.subarray(offset, offset + length)])
        serve(fd, data, new DataView(data.buffer, data.byteOffset, data.length), 0, data.length)
      }
    }
    r.more[0] = stalled.size > 0 ? 1 : 0
    return answers
  }
  r = addon.listen(port, onTurn)
  slab = Buffer.from(r.inbound.buffer, r.inbound.byteOffset, r.inbound.length)
  slabView = new DataView(r.inbound.buffer, r.inbound.byteOffset, r.inbound.length)
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
