/**
 * A mutation fuzzer for nyala's KRPC server and client.
 *
 *   node dist/bench/fuzz.js --mutants N [--seed S] [--json] [--concurrency C]
 *       [--client-share F] [--in-process] [--max-seconds T] [--found-bugs LIST]
 *   node dist/bench/fuzz.js --replay-episode I [--seed S] [--found-bugs LIST]
 *
 * Server side: a real `Server` with the demo CalculatorService (in a child
 * process by default, so its crashes show as exits and its peak RSS is its
 * own) takes raw loopback connections. Each connection (an "episode") sends
 * the handshake, sometimes mutated (noise before or inside negotiation, bad
 * preambles, wrong steps, refused credentials), then batches of request
 * frames of Add, Echo, PushStrings and EchoSidecars, most of them mutated:
 * bit flips, truncations, insertions, lying length prefixes and varints,
 * random header protobufs, bad sidecar offsets, splices and noise. A model
 * built from the codec (`ServerModel`) reads the same bytes as the server
 * would and predicts what must come back: each negotiation answer byte for
 * byte, exactly one answer per accepted call (with the right result or
 * error code), and whether the connection must be closed. The server may
 * only differ where the model says it is waiting for bytes (a partial
 * frame or an unfinished negotiation: a limit or a deadline may close it).
 * Everything else is a failure, reported with the seed, the episode and the
 * bytes written, which `--replay-episode` sends again alone.
 *
 * Client side: real `Client`s call a fake server that negotiates (sometimes
 * with noise or mutated answers) and answers each call with a mutated
 * response frame: wrong call ids, lying lengths, bad sidecar offsets, error
 * frames with any code, duplicates, noise, splits, delays, no answer,
 * closes. Every call must settle exactly once, never before it returned
 * (callback form), and by its deadline plus a grace period.
 *
 * A mutant is one mutated input: a mutated frame or noise burst sent to the
 * server, a mutated handshake, or a mutated answer (or negotiation) of the
 * fake server. Each episode's bytes depend only on the seed and its index;
 * the client side's answers depend on the seed, the connection and the
 * calls that arrive (so on timing).
 *
 * Inputs that found product bugs stay in the mix (`--found-bugs`, default
 * `all`; a comma-separated list, or '' to leave them out): method names
 * that are Object.prototype keys (`toString`, `constructor`, ...: the
 * server threw out of its read callback and died), and calls pipelined
 * behind credentials the asynchronous authenticator refuses, with no
 * ConnectionContext (they reached their handlers). Both are fixed and
 * have regression tests in test/reactor/hostile.test.ts.
 */
import { fork, type ChildProcess } from 'node:child_process'
import { connect, createServer, type Server as NetServer, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { RpcError } from '../codec/errors.js'
import { KrpcCode, krpcCodeName } from '../codec/krpc/codes.js'
import { FrameDecoder } from '../codec/frame-decoder.js'
import {
  CONNECTION_CONTEXT_CALL_ID, ErrorStatusType, KRPC_PREAMBLE, MAX_SIDECARS, NEGOTIATE_CALL_ID, encodeErrorFrame, encodeRemoteMethod,
  encodeRequestFrame, encodeResponseFrame, headerSchema, krpcFraming, parseRequestFrame, parseResponseFrame,
  type RequestFrame, type ResponseFrame
} from '../codec/krpc/frames.js'
import { ClientNegotiation, PREAMBLE_BYTES, ServerNegotiation, checkPreamble, type NegotiationStep } from '../codec/krpc/negotiation.js'
import { varintBytes, writeInt32 } from '../codec/varint.js'
import { Client, type ClientOptions } from '../reactor/krpc/client.js'
import { Server, type ServerStats } from '../reactor/krpc/server.js'
import type { CallContext } from '../reactor/inbound-call.js'
import type { ServiceDef } from '../codec/schema.js'
import { CalculatorService, calculatorHandlers, crc32 } from '../examples/calculator/index.js'

// ---------------------------------------------------------------------------
// Options and results.

export interface FuzzOptions {
  /** Mutants to send in all (server and client side). */
  mutants: number
  seed?: number
  /** Share of the mutants that go to the client side (answers of the fake server); default 0.3. */
  clientShare?: number
  /** Server-side connections (episodes) at once; default 32. */
  concurrency?: number
  /** Client-side calls outstanding at once; default 64. */
  clientConcurrency?: number
  /** `child` (default): the server runs in a child process; `in-process`: in this one. */
  server?: 'child' | 'in-process'
  /** Node flags of the server child (default: this process's, so a TypeScript loader carries over). */
  execArgv?: string[]
  /** Adds inputs that hit the product bugs already known (see the file's comment). */
  foundBugs?: readonly FoundBug[]
  /** Stops early (reported, not a failure) after this long; default 3600 s. */
  maxSeconds?: number
  /** Progress lines (default: none). */
  log?: (line: string) => void
}

/** One failure: what went wrong and how to send the same bytes again. */
export interface FuzzFailure {
  kind: string
  detail: string
  seed: number
  /** Server side: the episode (`--replay-episode`) and its batch. */
  episode?: number
  batch?: number
  /** Client side: the fake server's connection. */
  connection?: number
  /** Bytes written on the connection (hex, at most 8 KiB of them). */
  bytesHex?: string
}

export interface ServerReport {
  stats: ServerStats
  /** Calls that reached a handler on a connection that never finished negotiation. */
  unauthenticatedCalls: number
  maxRssKiB: number
  rssBytes: number
  /** User + system CPU time of the server's process, ms. */
  cpuMs: number
}

export interface FuzzResult {
  seed: number
  mutants: { total: number, serverFrames: number, negotiation: number, client: number }
  server: {
    mode: 'child' | 'in-process'
    episodes: number
    batches: number
    /** Calls the model predicted an answer for, and how many got exactly one. */
    callsPredicted: number
    callsAnsweredOnce: number
    /** Answers never sent because the connection closed for a bad frame of the same read (which the server may do). */
    answersDroppedAtClose: number
    /** Connections the server closed where the model said it must (bad frame, refused negotiation or preamble). */
    closedAsPredicted: number
    /** Connections the server closed while the model waited for bytes (a limit or deadline; allowed). */
    closedWhileWaiting: number
    /** Bad frames the server counted (stats().badFrames), and the model's count. */
    badFramesClosed: number
    badFramesModel: number
    callsReceived: number
    callsReceivedModel: number
    unauthenticatedCalls: number
    probes: { ok: number, failed: number }
    /** A normal Add was answered after the run. */
    answersAfterRun: boolean
    /** Open connections and calls in flight on the server at the end. */
    connectionsOpenAtEnd: number
    callsInFlightAtEnd: number
  }
  client: {
    calls: number
    settledOnce: number
    settledTwice: number
    settledBeforeReturn: number
    neverSettled: number
    outcomes: Record<string, number>
    fakeConnections: number
    /** Fake-server connections closed because the client was left waiting inside a frame (a lying length). */
    stalledClosed: number
    /** Clients closed (and replaced) with calls pending during the run. */
    clientsClosed: number
    /** The fuzzed clients' calls to the real server after the run. */
    stillWork: boolean
  }
  crashes: { count: number, details: string[] }
  failures: FuzzFailure[]
  failureCount: number
  rss: { serverPeakKiB: number, fuzzerPeakKiB: number, serverEndBytes: number }
  /** CPU time (user + system) of the server's process and of this one, ms (the same process in-process). */
  cpuMs: { server: number, fuzzer: number }
  openSocketsAtEnd: number
  stoppedEarly: boolean
  wallMs: number
}

/** Product bugs the fuzzer found (fixed), whose inputs `foundBugs` keeps in the mix (see the file's comment). */
export const FOUND_BUGS = ['prototype-names', 'refused-auth-pipelining'] as const
export type FoundBug = typeof FOUND_BUGS[number]

const HOST = '127.0.0.1'
/** The fuzzed server's largest frame: lying prefixes above it are refused at the prefix, below it they wait for bytes. */
export const FUZZ_MAX_MESSAGE_BYTES = 1024 * 1024
/** The fuzzed clients' largest inbound frame. */
const CLIENT_MAX_MESSAGE_BYTES = 256 * 1024
const CLIENT_TIMEOUT_MS = 250
/** Time a batch may take to be answered (and closed, if it must) before that is a failure. */
const BATCH_TIMEOUT_MS = 20_000
/** Grace past a call's deadline before it counts as never settled. */
const SETTLE_GRACE_MS = 5000
const MAX_FAILURES_KEPT = 20
const MAX_HEX_BYTES = 8192

const SERVICE = CalculatorService.fullName
const M = CalculatorService.methods
const NegotiateType = headerSchema.type<{
  step: number, supported_features?: number[], token?: Uint8Array, sasl_mechanisms?: Array<{ mechanism: string }>,
  authn_types?: Array<{ sasl?: object, token?: object, certificate?: object, jwt?: object }>
}>('kudu.rpc.NegotiatePB')

// ---------------------------------------------------------------------------
// A seeded PRNG (mulberry32) and a hash to derive one per episode.

/** mulberry32: small, fast, and the same sequence for the same seed on every run. */
export class Rng {
  #a: number

  constructor (seed: number) {
    this.#a = seed >>> 0
  }

  u32 (): number {
    this.#a = (this.#a + 0x6d2b79f5) >>> 0
    let x = this.#a
    x = Math.imul(x ^ (x >>> 15), x | 1)
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61)
    return (x ^ (x >>> 14)) >>> 0
  }

  float (): number {
    return this.u32() / 4294967296
  }

  /** An integer in [0, n). */
  int (n: number): number {
    return Math.floor(this.float() * n)
  }

  /** An integer in [lo, hi]. */
  range (lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1)
  }

  chance (p: number): boolean {
    return this.float() < p
  }

  pick<T> (items: readonly T[]): T {
    return items[this.int(items.length)]!
  }

  bytes (n: number): Buffer {
    const out = Buffer.allocUnsafe(n)
    for (let i = 0; i < n; i += 4) {
      const v = this.u32()
      out[i] = v
      if (i + 1 < n) out[i + 1] = v >>> 8
      if (i + 2 < n) out[i + 2] = v >>> 16
      if (i + 3 < n) out[i + 3] = v >>> 24
    }
    return out
  }
}

/** A 32-bit hash of a few integers (murmur3's finalizer over a running mix). */
export function mix (...parts: number[]): number {
  let h = 0x9e3779b9
  for (const p of parts) {
    h = Math.imul(h ^ (p >>> 0), 0x85ebca6b)
    h ^= h >>> 13
    h = Math.imul(h, 0xc2b2ae35)
    h ^= h >>> 16
  }
  return h >>> 0
}

/** Picks by weight: `[[weight, value], ...]`. */
class Weighted<T> {
  readonly #items: ReadonlyArray<readonly [number, T]>
  readonly #total: number

  constructor (items: ReadonlyArray<readonly [number, T]>) {
    this.#items = items
    this.#total = items.reduce((sum, [w]) => sum + w, 0)
  }

  pick (rng: Rng): T {
    let r = rng.float() * this.#total
    for (const [w, value] of this.#items) {
      if (r < w) return value
      r -= w
    }
    return this.#items[this.#items.length - 1]![1]
  }
}

// ---------------------------------------------------------------------------
// Protobuf and frame writing, free enough to write what no encoder would.

class Pb {
  readonly out: number[] = []

  /** A varint of a non-negative integer up to 2^53. */
  varint (value: number): this {
    let v = value
    while (v >= 0x80) {
      this.out.push((v % 128) | 0x80)
      v = Math.floor(v / 128)
    }
    this.out.push(v)
    return this
  }

  /** A proto int32: negative values take 10 bytes. */
  int32 (value: number): this {
    if (value >= 0) return this.varint(value)
    const b = Buffer.alloc(10)
    const end = writeInt32(b, 0, value)
    for (let i = 0; i < end; i++) this.out.push(b[i]!)
    return this
  }

  tag (field: number, wireType: number): this {
    return this.varint(field * 8 + wireType)
  }

  len (bytes: Uint8Array): this {
    this.varint(bytes.length)
    return this.raw(bytes)
  }

  raw (bytes: Uint8Array | readonly number[]): this {
    for (let i = 0; i < bytes.length; i++) this.out.push(bytes[i]!)
    return this
  }

  buffer (): Buffer {
    return Buffer.from(this.out)
  }
}

function u32be (n: number): Buffer {
  const b = Buffer.alloc(4)
  b.writeUInt32BE(n >>> 0)
  return b
}

function varintBuf (value: number): Buffer {
  return new Pb().varint(value).buffer()
}

/** `[u32 length][varint header length][header][varint body length][body][sidecars]`, the lengths true. */
function frameOf (header: Uint8Array, body: Uint8Array, sidecars: readonly Uint8Array[] = []): Buffer {
  let bodyBytes = body.length
  for (const s of sidecars) bodyBytes += s.length
  const total = varintBytes(header.length) + header.length + varintBytes(bodyBytes) + bodyBytes
  return Buffer.concat([u32be(total), varintBuf(header.length), header, varintBuf(bodyBytes), body, ...sidecars])
}

function join (slices: readonly Buffer[]): Buffer {
  return slices.length === 1 ? slices[0]! : Buffer.concat(slices)
}

/** Rewrites the length prefix to what follows it (a frame whose inside may still lie). */
function fixPrefix (frame: Buffer): Buffer {
  if (frame.length >= 4) frame.writeUInt32BE(frame.length - 4, 0)
  return frame
}

/** `frame` with its length prefix set to `value` (a frame shorter than a prefix gets one in front). */
function withPrefix (frame: Buffer, value: number): Buffer {
  const f = frame.length >= 4 ? frame : Buffer.concat([Buffer.alloc(4), frame])
  f.writeUInt32BE(Math.min(0xffffffff, Math.max(0, Math.floor(value))), 0)
  return f
}

interface Layout { headerStart: number, headerEnd: number, bodyStart: number }

/** Where the parts of a well-formed frame lie; null when its lengths do not add up. */
function layoutOf (frame: Buffer): Layout | null {
  if (frame.length < 6) return null
  const h = readVarint(frame, 4)
  if (h === null) return null
  const headerEnd = h.next + h.value
  const b = readVarint(frame, headerEnd)
  if (b === null) return null
  return { headerStart: h.next, headerEnd, bodyStart: b.next }
}

function readVarint (buf: Buffer, at: number): { value: number, next: number } | null {
  let value = 0
  let mul = 1
  for (let i = 0; i < 5 && at < buf.length; i++) {
    const byte = buf[at++]!
    value += (byte & 0x7f) * mul
    if (byte < 0x80) return { value, next: at }
    mul *= 128
  }
  return null
}

/** A KRPC request as the generator means it, before any mutation. */
interface RequestSpec {
  callId: number
  service: string
  method: string
  timeoutMs: number
  flags: number[]
  body: Uint8Array
  sidecars: Uint8Array[]
}

const remoteMethods = new Map<string, Buffer>()

function remoteMethodOf (service: string, method: string): Buffer {
  const key = `${service}\u0000${method}`
  let bytes = remoteMethods.get(key)
  if (bytes === undefined) {
    bytes = encodeRemoteMethod(service, method)
    if (remoteMethods.size < 256) remoteMethods.set(key, bytes)
  }
  return bytes
}

/** The frame nyala's client would write for `spec` (the codec's encoder). */
function encodeSpec (spec: RequestSpec): Buffer {
  return join(encodeRequestFrame({
    callId: spec.callId,
    remoteMethod: remoteMethodOf(spec.service, spec.method),
    timeoutMs: spec.timeoutMs,
    requiredFeatureFlags: spec.flags.length > 0 ? spec.flags : undefined,
    sidecars: spec.sidecars.length > 0 ? spec.sidecars : undefined
  }, spec.body))
}

/** As `encodeSpec`, by hand, with the sidecar offsets given (packed or not). */
function encodeSpecWithOffsets (spec: RequestSpec, offsets: readonly number[], packed: boolean): Buffer {
  const w = new Pb().tag(3, 0).int32(spec.callId).raw(remoteMethodOf(spec.service, spec.method))
  if (spec.timeoutMs > 0) w.tag(10, 0).varint(spec.timeoutMs)
  for (const f of spec.flags) w.tag(11, 0).varint(f)
  if (packed) {
    const inner = new Pb()
    for (const o of offsets) inner.varint(o)
    w.tag(16, 2).len(inner.buffer())
  } else {
    for (const o of offsets) w.tag(16, 0).varint(o)
  }
  return frameOf(w.buffer(), spec.body, spec.sidecars)
}

// ---------------------------------------------------------------------------
// The server-side generator: valid requests, then mutants of them.

const METHODS = ['Add', 'Echo', 'PushStrings', 'EchoSidecars', 'Sleep'] as const
const ODD_METHODS = ['', 'add', 'Add ', 'Nope', 'A'.repeat(300), '\u0000', 'é', 'Sleep\u0000', 'EchoSidecar', 'PushStrings2']
/** Object.prototype keys: a known bug (the server looks methods up in plain objects). */
const PROTOTYPE_NAMES = ['toString', '__proto__', 'constructor', 'hasOwnProperty', 'valueOf', 'isPrototypeOf']
const ODD_SERVICES = ['', 'nyala.demo.CalculatorServic', `${SERVICE} `, 'kudu.rpc.Nope', 'x'.repeat(300), 'nyala.demo']
const INTERESTING_INT32 = [0, 1, -1, -3, -33, 0x7fffffff, -0x80000000, 127, 128, 16383, 16384]
const INTERESTING_U32 = [0, 1, 0x7f, 0x80, 0x3fff, 0x4000, 0x7fffffff, 0x80000000, 0xffffffff, FUZZ_MAX_MESSAGE_BYTES, FUZZ_MAX_MESSAGE_BYTES + 1]
const INTERESTING_BYTES = [0x00, 0x01, 0x7f, 0x80, 0xff, 0x08, 0x10, 0x18, 0x32, 0x50, 0x80, 0x0a, 0x12]

type MutationOp = 'bitflip' | 'byte' | 'truncate' | 'truncateFixed' | 'insert' | 'delete' | 'lyingPrefix' | 'headerLen' | 'bodyLen' |
'overlong' | 'headerField' | 'sidecarOffsets' | 'randomHeader' | 'randomBody' | 'splice' | 'noise' | 'zeroPrefix' | 'duplicateField'

const REQUEST_OPS = new Weighted<MutationOp>([
  [14, 'bitflip'], [6, 'byte'], [6, 'truncate'], [6, 'truncateFixed'], [6, 'insert'], [5, 'delete'], [8, 'lyingPrefix'],
  [6, 'headerLen'], [6, 'bodyLen'], [3, 'overlong'], [10, 'headerField'], [8, 'sidecarOffsets'], [8, 'randomHeader'],
  [6, 'randomBody'], [4, 'splice'], [3, 'noise'], [1, 'zeroPrefix'], [3, 'duplicateField']
])

const BYTE_OPS = new Weighted<MutationOp>([
  [10, 'bitflip'], [5, 'byte'], [4, 'truncate'], [4, 'truncateFixed'], [4, 'insert'], [4, 'delete'], [5, 'lyingPrefix'], [3, 'headerLen'], [3, 'bodyLen']
])

const KINDS = new Weighted<string>([[40, 'Add'], [18, 'Echo'], [14, 'PushStrings'], [15, 'EchoSidecars'], [5, 'Sleep'], [8, 'odd']])

/** Makes the requests and mutants of one episode from its Rng (and a shared pool of random bytes). */
class RequestGen {
  readonly rng: Rng
  readonly #pool: Buffer
  readonly #foundBugs: ReadonlySet<FoundBug>

  constructor (rng: Rng, pool: Buffer, foundBugs: ReadonlySet<FoundBug>) {
    this.rng = rng
    this.#pool = pool
    this.#foundBugs = foundBugs
  }

  poolBytes (n: number): Buffer {
    const at = this.rng.int(this.#pool.length - n)
    return this.#pool.subarray(at, at + n)
  }

  text (): string {
    const rng = this.rng
    switch (rng.int(5)) {
      case 0: return ''
      case 1: return 'é€𝄞 ñ'.repeat(rng.range(1, 20))
      case 2: return 'x'.repeat(rng.range(200, 2000))
      default: return this.poolBytes(rng.range(1, 60)).toString('latin1')
    }
  }

  sidecars (max: number, maxBytes: number): Uint8Array[] {
    const n = this.rng.int(max + 1)
    const out: Uint8Array[] = []
    for (let i = 0; i < n; i++) out.push(this.poolBytes(this.rng.int(maxBytes + 1)))
    return out
  }

  spec (callId: number): RequestSpec {
    const rng = this.rng
    const kind = KINDS.pick(rng)
    let method = kind
    let service = SERVICE
    let body: Uint8Array
    let sidecars: Uint8Array[] = []
    switch (kind) {
      case 'Add':
        body = M.Add.requestType.encode({ x: rng.chance(0.2) ? rng.pick(INTERESTING_U32) : rng.u32(), y: rng.u32() })
        break
      case 'Echo':
        body = M.Echo.requestType.encode({ data: this.text() })
        break
      case 'PushStrings': {
        sidecars = this.sidecars(4, 3000)
        const indexes: number[] = []
        for (let i = rng.int(sidecars.length + 2); i > 0; i--) indexes.push(rng.chance(0.9) ? rng.int(sidecars.length + 1) : rng.u32())
        body = M.PushStrings.requestType.encode({ sidecar_indexes: indexes })
        break
      }
      case 'EchoSidecars':
        sidecars = this.sidecars(3, rng.chance(0.1) ? 40_000 : 2000)
        body = M.EchoSidecars.requestType.encode({})
        break
      case 'Sleep':
        body = M.Sleep.requestType.encode({ sleep_micros: rng.u32(), return_app_error: rng.chance(0.5) })
        break
      default:
        // A method or service the server does not have, with some body.
        method = rng.chance(0.7) ? rng.pick(ODD_METHODS) : rng.pick(METHODS)
        if (method === 'Add' || rng.chance(0.3)) service = rng.pick(ODD_SERVICES)
        body = this.poolBytes(rng.int(20))
    }
    const timeoutMs = rng.chance(0.5) ? 0 : rng.range(1000, 120_000)
    const flags = rng.chance(0.03) ? [rng.chance(0.5) ? 1 : rng.u32()] : []
    return { callId, service, method, timeoutMs, flags, body, sidecars }
  }

  clean (callId: number): Buffer {
    return encodeSpec(this.spec(callId))
  }

  /** One mutated request frame (or noise in its place). */
  mutant (callId: number): Buffer {
    const rng = this.rng
    const spec = this.spec(callId)
    let out = this.#apply(REQUEST_OPS.pick(rng), spec)
    if (rng.chance(0.2)) out = this.#apply(BYTE_OPS.pick(rng), spec, out)
    return out
  }

  #apply (op: MutationOp, spec: RequestSpec, frame?: Buffer): Buffer {
    const rng = this.rng
    const base = (): Buffer => frame ?? encodeSpec(spec)
    switch (op) {
      case 'bitflip': {
        const f = Buffer.from(base())
        for (let k = rng.range(1, 4); k > 0; k--) {
          // Half of the flips land in the prefix and header, where they matter most.
          const at = rng.chance(0.5) ? rng.int(Math.min(f.length, 24)) : rng.int(f.length)
          f[at]! ^= 1 << rng.int(8)
        }
        return f
      }
      case 'byte': {
        const f = Buffer.from(base())
        f[rng.int(Math.min(f.length, rng.chance(0.5) ? 24 : f.length))] = rng.chance(0.6) ? rng.pick(INTERESTING_BYTES) : rng.int(256)
        return f
      }
      case 'truncate': {
        const f = base()
        return Buffer.from(f.subarray(0, rng.int(f.length)))
      }
      case 'truncateFixed': {
        const f = base()
        return fixPrefix(Buffer.from(f.subarray(0, rng.range(Math.min(5, f.length), f.length - 1))))
      }
      case 'insert': {
        const f = base()
        const at = rng.int(f.length + 1)
        const out = Buffer.concat([f.subarray(0, at), rng.bytes(rng.range(1, 32)), f.subarray(at)])
        return rng.chance(0.5) ? fixPrefix(out) : out
      }
      case 'delete': {
        const f = base()
        const at = rng.int(f.length)
        const out = Buffer.concat([f.subarray(0, at), f.subarray(Math.min(f.length, at + rng.range(1, 16)))])
        return rng.chance(0.5) ? fixPrefix(out) : out
      }
      case 'lyingPrefix': {
        const f = Buffer.from(base())
        const actual = f.length - 4
        const choice = rng.int(4)
        const value = choice === 0
          ? actual + rng.pick([-8, -4, -3, -2, -1, 1, 2, 3, 4, 8, 100, 4096])
          : choice === 1 ? rng.pick(INTERESTING_U32) : choice === 2 ? rng.int(FUZZ_MAX_MESSAGE_BYTES * 2) : rng.u32()
        return withPrefix(f, value)
      }
      case 'headerLen':
      case 'bodyLen': {
        const f = base()
        const layout = layoutOf(f)
        if (layout === null) return this.#apply('bitflip', spec, f)
        const [at, end, actual] = op === 'headerLen'
          ? [4, layout.headerStart, layout.headerEnd - layout.headerStart]
          : [layout.headerEnd, layout.bodyStart, f.length - layout.bodyStart]
        const out = Buffer.concat([f.subarray(0, at), this.#lyingVarint(actual), f.subarray(end)])
        return rng.chance(0.7) ? fixPrefix(out) : out
      }
      case 'overlong': {
        // The same lengths in more bytes than needed (still valid varints up to 5 bytes).
        const f = base()
        const layout = layoutOf(f)
        if (layout === null) return this.#apply('bitflip', spec, f)
        const longer = (value: number): Buffer => {
          const bytes = [...varintBuf(value)]
          // Up to 5 bytes in all (a sixth makes it malformed, which is fine too).
          for (let extra = rng.range(1, Math.max(1, 5 - bytes.length)); extra > 0; extra--) {
            bytes[bytes.length - 1]! |= 0x80
            bytes.push(0)
          }
          return Buffer.from(bytes)
        }
        return fixPrefix(Buffer.concat([f.subarray(0, 4), longer(layout.headerEnd - layout.headerStart),
          f.subarray(layout.headerStart, layout.headerEnd), longer(f.length - layout.bodyStart), f.subarray(layout.bodyStart)]))
      }
      case 'headerField':
        return this.#headerField(spec)
      case 'sidecarOffsets':
        return this.#sidecarOffsets(spec)
      case 'randomHeader': {
        const body = rng.chance(0.6) ? spec.body : this.poolBytes(rng.int(64))
        return frameOf(this.#randomHeader(spec.callId), body, rng.chance(0.3) ? spec.sidecars : [])
      }
      case 'randomBody': {
        const body = rng.chance(0.2) ? new Uint8Array(0) : rng.chance(0.5) ? this.poolBytes(rng.int(80)) : this.spec(spec.callId).body
        return encodeSpec({ ...spec, body })
      }
      case 'splice': {
        const a = base()
        const b = encodeSpec(this.spec(spec.callId + 1))
        const out = Buffer.concat([a.subarray(0, rng.int(a.length)), b.subarray(rng.int(b.length))])
        return rng.chance(0.5) ? fixPrefix(out) : out
      }
      case 'noise': {
        const n = rng.range(1, 48)
        // Sometimes noise that starts like a small frame.
        return rng.chance(0.3) ? Buffer.concat([u32be(rng.int(n + 8)), rng.bytes(n)]) : rng.bytes(n)
      }
      case 'zeroPrefix':
        return Buffer.from([0, 0, 0, 0])
      case 'duplicateField': {
        // A header field given twice: singular fields take the last value.
        const w = new Pb().tag(3, 0).int32(spec.callId).raw(remoteMethodOf(spec.service, spec.method))
        const which = rng.int(3)
        if (which === 0) w.tag(3, 0).int32(rng.chance(0.5) ? rng.pick(INTERESTING_INT32) : spec.callId + 1)
        else if (which === 1) w.raw(remoteMethodOf(rng.chance(0.5) ? SERVICE : rng.pick(ODD_SERVICES), rng.pick(METHODS)))
        else w.tag(10, 0).varint(rng.u32()).tag(10, 0).varint(rng.chance(0.5) ? 0 : rng.u32())
        return frameOf(w.buffer(), spec.body, [])
      }
    }
  }

  /** A byte-level mutant of a handshake frame. */
  mutateFrameBytes (frame: Buffer): Buffer {
    const rng = this.rng
    const f = Buffer.from(frame)
    switch (rng.int(6)) {
      case 0:
        for (let k = rng.range(1, 3); k > 0; k--) f[rng.int(f.length)]! ^= 1 << rng.int(8)
        return f
      case 1:
        return Buffer.from(f.subarray(0, rng.int(f.length)))
      case 2:
        return withPrefix(f, f.length - 4 + rng.pick([-2, -1, 1, 2, 1000, FUZZ_MAX_MESSAGE_BYTES + 1]))
      case 3: {
        const at = rng.int(f.length)
        return fixPrefix(Buffer.concat([f.subarray(0, at), rng.bytes(rng.range(1, 8)), f.subarray(at)]))
      }
      case 4: {
        const layout = layoutOf(f)
        if (layout === null) return f
        f[layout.headerStart + rng.int(Math.max(1, layout.headerEnd - layout.headerStart))]! ^= 1 << rng.int(8)
        return f
      }
      default: {
        const layout = layoutOf(f)
        if (layout === null) return f
        return fixPrefix(Buffer.concat([f.subarray(0, layout.bodyStart), rng.bytes(rng.int(24))]))
      }
    }
  }

  // A varint standing for `actual`, that lies or is malformed.
  #lyingVarint (actual: number): Buffer {
    const rng = this.rng
    switch (rng.int(7)) {
      case 0: return varintBuf(Math.max(0, actual + rng.pick([-3, -2, -1, 1, 2, 3, 16])))
      case 1: return varintBuf(0)
      case 2: return varintBuf(rng.pick(INTERESTING_U32))
      case 3: return Buffer.from([0xff, 0xff, 0xff, 0xff, 0x1f]) // a fifth byte over 4 bits
      case 4: return Buffer.from([0x80, 0x80, 0x80, 0x80, 0x80, 0x01]) // six bytes
      case 5: return Buffer.from([0x80 | (actual & 0x7f)]) // continuation bit, then the header's first byte
      default: return varintBuf(rng.u32())
    }
  }

  // One header field given an odd value, written by hand in the usual order.
  #headerField (spec: RequestSpec): Buffer {
    const rng = this.rng
    let callId = spec.callId
    let remote: Buffer | null = remoteMethodOf(spec.service, spec.method)
    let timeout: number | null = spec.timeoutMs > 0 ? spec.timeoutMs : null
    let flags = spec.flags
    let extra: Buffer | null = null
    switch (rng.int(8)) {
      case 0: callId = rng.pick(INTERESTING_INT32); break
      case 1: remote = null; break
      case 2: remote = new Pb().tag(6, 2).len(this.#randomRemoteMethod()).buffer(); break
      case 3: timeout = rng.chance(0.5) ? rng.pick([0, 1, 2, 0xffffffff]) : rng.u32() * 2 ** 20 + rng.u32(); break
      case 4: flags = Array.from({ length: rng.range(1, 4) }, () => rng.chance(0.5) ? rng.int(4) : rng.u32()); break
      case 5: extra = this.#unknownField(); break
      case 6: extra = this.#requestId(); break
      default: callId = rng.u32() | 0
    }
    const w = new Pb().tag(3, 0).int32(callId)
    if (remote !== null) w.raw(remote)
    if (timeout !== null) w.tag(10, 0).varint(timeout)
    if (flags.length > 0 && rng.chance(0.5)) w.tag(11, 2).len(new Pb().raw(flags.flatMap(f => new Pb().varint(f).out)).buffer())
    else for (const f of flags) w.tag(11, 0).varint(f)
    if (extra !== null) w.raw(extra)
    const offsets = spec.sidecars.length > 0 ? sidecarOffsetsOf(spec) : []
    for (const o of offsets) w.tag(16, 0).varint(o)
    return frameOf(w.buffer(), spec.body, spec.sidecars)
  }

  #sidecarOffsets (spec: RequestSpec): Buffer {
    const rng = this.rng
    if (spec.sidecars.length === 0) {
      spec = { ...spec, method: rng.chance(0.5) ? 'PushStrings' : 'EchoSidecars', sidecars: this.sidecars(3, 500) }
      if (spec.sidecars.length === 0) spec.sidecars = [this.poolBytes(rng.int(100))]
      spec.body = spec.method === 'PushStrings' ? M.PushStrings.requestType.encode({ sidecar_indexes: [0] }) : M.EchoSidecars.requestType.encode({})
    }
    let offsets = sidecarOffsetsOf(spec)
    let bodyEnd = spec.body.length
    for (const s of spec.sidecars) bodyEnd += s.length
    const i = rng.int(offsets.length)
    switch (rng.int(10)) {
      case 0: offsets[i] = bodyEnd + rng.range(1, 1000); break
      case 1: if (i > 0) offsets[i] = offsets[i - 1]! - 1; else offsets[i] = bodyEnd + 1; break
      case 2: offsets[0] = rng.int(spec.body.length + 1); break // inside the message: valid, a shorter message
      case 3: offsets[i] = rng.pick([0xffffffff, 0x80000000, 0x7fffffff]); break
      case 4: offsets = Array.from({ length: MAX_SIDECARS + 1 }, () => bodyEnd); break
      case 5: offsets = Array.from({ length: rng.chance(0.5) ? MAX_SIDECARS : rng.range(2, 50) }, () => bodyEnd); break // empty sidecars at the end: valid
      case 6: offsets = [...offsets, ...offsets]; break
      case 7: offsets.reverse(); break
      case 8: return encodeSpecWithOffsets(spec, offsets, true) // packed: valid
      default: offsets = []; break // sidecar bytes, but no offsets: part of the message
    }
    return encodeSpecWithOffsets(spec, offsets, rng.chance(0.3))
  }

  #randomRemoteMethod (): Buffer {
    const rng = this.rng
    const w = new Pb()
    const methodNames = this.#foundBugs.has('prototype-names') && rng.chance(0.3) ? PROTOTYPE_NAMES : rng.chance(0.5) ? METHODS : ODD_METHODS
    const service = rng.chance(0.7) ? SERVICE : rng.pick(ODD_SERVICES)
    const fields: Array<() => void> = []
    if (rng.chance(0.9)) fields.push(() => w.tag(1, 2).len(Buffer.from(service)))
    if (rng.chance(0.9)) fields.push(() => w.tag(2, 2).len(rng.chance(0.1) ? Buffer.from([0xff, 0xfe, 0x41]) : Buffer.from(rng.pick(methodNames))))
    if (rng.chance(0.15)) fields.push(() => w.raw(this.#unknownField()))
    shuffle(rng, fields)
    for (const f of fields) f()
    return w.buffer()
  }

  #unknownField (): Buffer {
    const rng = this.rng
    const w = new Pb()
    const field = rng.pick([1, 2, 4, 5, 7, 8, 9, 12, 13, 14, 17, 100, 1000, 536_870_911])
    const wireType = rng.int(8)
    w.tag(field, wireType)
    switch (wireType) {
      case 0: w.varint(rng.u32() * 2 ** 20); break
      case 1: w.raw(rng.bytes(8)); break
      case 2: w.len(rng.bytes(rng.int(20))); break
      case 5: w.raw(rng.bytes(4)); break
      default: w.raw(rng.bytes(rng.int(4))) // groups and the two undefined wire types
    }
    return w.buffer()
  }

  #requestId (): Buffer {
    const rng = this.rng
    const inner = new Pb()
    if (rng.chance(0.8)) inner.tag(1, 2).len(Buffer.from('client-id'))
    for (let f = 2; f <= 4; f++) if (rng.chance(0.8)) inner.tag(f, 0).varint(rng.chance(0.5) ? rng.u32() : rng.u32() * 2 ** 21)
    return new Pb().tag(15, 2).len(rng.chance(0.2) ? rng.bytes(rng.int(16)) : inner.buffer()).buffer()
  }

  #randomHeader (callId: number): Buffer {
    const rng = this.rng
    const w = new Pb()
    const fields: Array<() => void> = []
    if (rng.chance(0.9)) fields.push(() => w.tag(3, 0).int32(rng.chance(0.7) ? callId : rng.pick(INTERESTING_INT32)))
    if (rng.chance(0.85)) fields.push(() => w.tag(6, 2).len(this.#randomRemoteMethod()))
    if (rng.chance(0.3)) fields.push(() => w.tag(10, 0).varint(rng.chance(0.5) ? rng.u32() : rng.u32() * 2 ** 21))
    if (rng.chance(0.1)) fields.push(() => w.tag(11, 0).varint(rng.int(4)))
    if (rng.chance(0.1)) fields.push(() => w.raw(this.#requestId()))
    if (rng.chance(0.15)) fields.push(() => w.tag(16, 0).varint(rng.int(100)))
    for (let k = rng.chance(0.25) ? rng.range(1, 3) : 0; k > 0; k--) fields.push(() => w.raw(this.#unknownField()))
    if (rng.chance(0.03)) fields.push(() => w.tag(0, rng.int(3)).varint(1))
    shuffle(rng, fields)
    for (const f of fields) f()
    return w.buffer()
  }
}

function sidecarOffsetsOf (spec: RequestSpec): number[] {
  const offsets: number[] = []
  let at = spec.body.length
  for (const s of spec.sidecars) {
    offsets.push(at)
    at += s.length
  }
  return offsets
}

function shuffle<T> (rng: Rng, items: T[]): void {
  for (let i = items.length - 1; i > 0; i--) {
    const j = rng.int(i + 1)
    const t = items[i]!
    items[i] = items[j]!
    items[j] = t
  }
}

// ---------------------------------------------------------------------------
// Handshakes: the clean one and its mutants.

/** What a client writes to set up a connection, frame by frame: preamble, NEGOTIATE, SASL_INITIATE, ConnectionContext. */
function handshakeFrames (user: string, password = ''): Buffer[] {
  const client = new ClientNegotiation({ user, password })
  const server = new ServerNegotiation()
  const [preamble, negotiate] = client.start()
  const out: Buffer[] = [join(preamble!), join(negotiate!)]
  let pending: Buffer[] = [join(negotiate!)]
  for (let guard = 0; guard < 4 && pending.length > 0; guard++) {
    const next: Buffer[] = []
    for (const frame of pending) {
      for (const reply of (server.onFrame(frame) as NegotiationStep).send ?? []) {
        for (const s of (client.onFrame(join(reply)) as NegotiationStep).send ?? []) {
          out.push(join(s))
          next.push(join(s))
        }
      }
    }
    pending = next
  }
  return out
}

const FUZZ_USER = 'fuzz'
const HTTP_STARTS = ['GET / HTTP/1.1\r\n\r\n', 'POST /rpc HTTP/1.0\r\n\r\n', 'OPTIONS * HTTP/1.1\r\n', 'PRI * HTTP/2.0\r\n\r\n']
const CLEAN_HANDSHAKE = handshakeFrames(FUZZ_USER)
const CLEAN_HANDSHAKE_BYTES = Buffer.concat(CLEAN_HANDSHAKE)
/** The fuzzed server refuses these users (with an asynchronous authenticator). */
const REFUSED_USERS = ['', 'intruder']
const REFUSED_HANDSHAKES = REFUSED_USERS.map(u => handshakeFrames(u, 'pw'))

type HandshakeOp = 'noiseBefore' | 'preambleBits' | 'preambleByte' | 'http' | 'tls' | 'frame' | 'noiseBetween' | 'omitContext' |
'omitSasl' | 'duplicateNegotiate' | 'swap' | 'refused' | 'structured' | 'truncate' | 'contextId' | 'noPreamble'

const HANDSHAKE_OPS = new Weighted<HandshakeOp>([
  [6, 'noiseBefore'], [8, 'preambleBits'], [5, 'preambleByte'], [2, 'http'], [2, 'tls'], [22, 'frame'], [8, 'noiseBetween'],
  [5, 'omitContext'], [4, 'omitSasl'], [3, 'duplicateNegotiate'], [3, 'swap'], [7, 'refused'], [12, 'structured'], [5, 'truncate'],
  [4, 'contextId'], [2, 'noPreamble']
])

/** A mutated handshake (preamble and negotiation frames). */
function handshakeMutant (gen: RequestGen, foundBugs: ReadonlySet<FoundBug>): { bytes: Buffer, pipelinedRefusal: boolean } {
  let pipelinedRefusal = false
  const rng = gen.rng
  let parts: Buffer[] = CLEAN_HANDSHAKE.map(b => Buffer.from(b))
  const op = HANDSHAKE_OPS.pick(rng)
  switch (op) {
    case 'noiseBefore': parts.unshift(rng.bytes(rng.range(1, 12))); break
    case 'preambleBits': {
      const p = parts[0]!
      for (let k = rng.range(1, 3); k > 0; k--) p[rng.int(p.length)]! ^= 1 << rng.int(8)
      break
    }
    case 'preambleByte': parts[0]![rng.int(PREAMBLE_BYTES)] = rng.pick(INTERESTING_BYTES); break
    case 'http': parts = [Buffer.from(rng.pick(HTTP_STARTS)), ...parts.slice(1)]; break
    case 'tls': parts = [Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]), ...parts.slice(1)]; break
    case 'frame': {
      const i = rng.range(1, parts.length - 1)
      parts[i] = gen.mutateFrameBytes(parts[i]!)
      break
    }
    case 'noiseBetween': {
      const i = rng.range(1, parts.length)
      parts.splice(i, 0, rng.chance(0.5) ? rng.bytes(rng.range(1, 24)) : frameOf(rng.bytes(rng.int(12)), rng.bytes(rng.int(24))))
      break
    }
    case 'omitContext': parts.pop(); break
    case 'omitSasl': parts.splice(2, 1); break
    case 'duplicateNegotiate': parts.splice(2, 0, parts[1]!); break
    case 'swap': [parts[1], parts[2]] = [parts[2]!, parts[1]!]; break
    case 'refused': {
      parts = REFUSED_HANDSHAKES[rng.int(REFUSED_HANDSHAKES.length)]!.map(b => Buffer.from(b))
      // Known bug: calls pipelined after credentials the (asynchronous) authenticator refuses, with no ConnectionContext, run.
      if (foundBugs.has('refused-auth-pipelining') && rng.chance(0.5)) {
        parts.pop()
        pipelinedRefusal = true
      }
      break
    }
    case 'structured': {
      const i = rng.chance(0.5) ? 1 : 2
      parts[i] = join(encodeRequestFrame({ callId: rng.chance(0.9) ? NEGOTIATE_CALL_ID : rng.pick(INTERESTING_INT32) }, structuredNegotiate(gen, i === 1)))
      break
    }
    case 'truncate': {
      const all = Buffer.concat(parts)
      parts = [all.subarray(0, rng.int(all.length))]
      break
    }
    case 'contextId': {
      const ctx = parts[3]!
      const layout = layoutOf(ctx)!
      const header = new Pb().tag(3, 0).int32(rng.pick([0, 5, NEGOTIATE_CALL_ID, -4, 0x7fffffff])).buffer()
      parts[3] = frameOf(header, ctx.subarray(layout.bodyStart))
      break
    }
    case 'noPreamble': parts.shift(); break
  }
  return { bytes: Buffer.concat(parts), pipelinedRefusal }
}

/** A NegotiatePB body: the step the server waits for, or not, with odd fields. */
function structuredNegotiate (gen: RequestGen, first: boolean): Buffer {
  const rng = gen.rng
  const steps = [0, 1, 2, 3, 4, 5, 6, 7, 999]
  const message: Parameters<typeof NegotiateType.encode>[0] = { step: rng.chance(0.6) ? (first ? 1 : 2) : rng.pick(steps) }
  if (rng.chance(0.5)) message.supported_features = Array.from({ length: rng.int(4) }, () => rng.chance(0.5) ? rng.int(4) : rng.u32())
  if (rng.chance(0.5)) message.authn_types = rng.pick([[], [{ token: {} }], [{ certificate: {} }], [{ sasl: {} }, { jwt: {} }], [{ sasl: {} }]])
  if (rng.chance(0.6)) message.sasl_mechanisms = rng.pick([[], [{ mechanism: 'GSSAPI' }], [{ mechanism: 'PLAIN' }], [{ mechanism: '' }], [{ mechanism: 'plain' }]])
  if (rng.chance(0.6)) {
    message.token = rng.pick([
      Buffer.from('\u0000fuzz\u0000pw'), Buffer.from('no nul at all'), Buffer.from('a\u0000b'), Buffer.alloc(0),
      Buffer.concat([Buffer.from([0]), Buffer.from('u'.repeat(3000)), Buffer.from([0])]), Buffer.from('authz\u0000fuzz\u0000')
    ])
  }
  if (rng.chance(0.1)) {
    // No step at all (required): written by hand, as no encoder would.
    return new Pb().tag(1, 0).varint(1).buffer()
  }
  const body = Buffer.from(NegotiateType.encode(message))
  return rng.chance(0.1) ? Buffer.concat([body, gen.poolBytes(rng.int(8))]) : body
}

// ---------------------------------------------------------------------------
// The model: what the server must do with a byte stream.

/** One frame the server must send: a negotiation answer (exact bytes) or the answer to a call. */
interface Expect {
  callId: number
  what: string
  /** A call with a deadline may also be refused as ERROR_SERVER_TOO_BUSY (expired before it ran). */
  allowBusy: boolean
  check: (frame: ResponseFrame) => string | null
}

function modelAuthenticate (user: string): boolean {
  return !REFUSED_USERS.includes(user)
}

/**
 * Reads a client's byte stream as nyala's server does, with the codec's own
 * pieces (preamble check, frame decoder, negotiation state machine, request
 * parser): what must come back, and whether the connection must close.
 */
class ServerModel {
  phase: 'preamble' | 'negotiating' | 'ready' | 'closed' = 'preamble'
  closeReason = ''
  accepted = 0
  badFrames = 0
  #preamble: Buffer = Buffer.alloc(0)
  readonly #decoder = new FrameDecoder(krpcFraming, FUZZ_MAX_MESSAGE_BYTES)
  readonly #negotiation = new ServerNegotiation({ authenticate: (user) => { this.#authenticated = true; return modelAuthenticate(user) } })
  #authenticated = false
  #expected: Expect[] = []

  /** True while the server is legitimately waiting for bytes (so a limit or deadline may close it). */
  get waiting (): boolean {
    return this.phase === 'preamble' || this.phase === 'negotiating' || this.#decoder.hasPartialFrame
  }

  get closed (): boolean {
    return this.phase === 'closed'
  }

  /** The frames the server must send for the bytes fed since the last call. */
  takeExpected (): Expect[] {
    const out = this.#expected
    this.#expected = []
    return out
  }

  /**
   * Feeds a handshake up to the frame that asks the authenticator, and
   * answers how many bytes that took (-1: none asks it; all were fed). The
   * fuzzed server's authenticator is asynchronous: frames behind that step
   * in the same read wait for it, while a bad length prefix later in the
   * read closes the connection at once, before them. So the episode writes
   * the handshake up to there alone, and the rest once it is answered.
   */
  feedUntilAuthenticated (bytes: Buffer): number {
    for (let i = 0; i < bytes.length; i++) {
      this.feed(bytes.subarray(i, i + 1))
      if (this.#authenticated) return i + 1
    }
    return -1
  }

  feed (bytes: Buffer): void {
    if (this.phase === 'closed') return
    let chunk = bytes
    if (this.phase === 'preamble') {
      const take = Math.min(PREAMBLE_BYTES - this.#preamble.length, chunk.length)
      this.#preamble = Buffer.concat([this.#preamble, chunk.subarray(0, take)])
      chunk = chunk.subarray(take)
      if (this.#preamble.length < PREAMBLE_BYTES) return
      const verdict = checkPreamble(this.#preamble)
      if (verdict !== null) return this.#close(`bad preamble: ${verdict.message}`)
      this.phase = 'negotiating'
    }
    if (chunk.length === 0) return
    const error = this.#decoder.pushRanges(chunk, (buf, start, end) => this.#frame(buf.subarray(start, end)))
    // (#frame may have closed it meanwhile.)
    if (error !== null && !this.closed) {
      if (error.code === 'RPC_ERR_MALFORMED_FRAME') this.badFrames++
      this.#close(`decoder: ${error.message}`)
    }
  }

  #close (reason: string): void {
    this.phase = 'closed'
    this.closeReason = reason
    this.#decoder.stop()
  }

  #frame (frame: Buffer): boolean {
    if (this.phase === 'negotiating') {
      const step = this.#negotiation.onFrame(frame) as NegotiationStep
      for (const s of step.send ?? []) {
        const bytes = join(s)
        this.#expected.push({
          callId: NEGOTIATE_CALL_ID,
          what: 'negotiation answer',
          allowBusy: false,
          check: (f) => f.frame.equals(bytes) ? null : `negotiation answer differs: got ${hex(f.frame, 64)}, expected ${hex(bytes, 64)}`
        })
      }
      if (step.error !== undefined) {
        // A negotiation frame whose lengths do not add up is a bad frame too, to the server's books.
        if (step.error.code === 'RPC_ERR_MALFORMED_FRAME') this.badFrames++
        this.#close(`negotiation refused: ${step.error.message}`)
        return false
      }
      if (step.done !== undefined) this.phase = 'ready'
      return true
    }
    const parsed = parseRequestFrame(frame)
    if (parsed instanceof RpcError) return this.#bad(parsed.message)
    const callId = parsed.header.call_id
    if (callId < 0) return this.#bad(`call id ${callId}`)
    if (parsed.header.remote_method === undefined) return this.#bad('no remote_method')
    this.accepted++
    this.#expected.push(predict(parsed))
    return true
  }

  #bad (reason: string): false {
    this.badFrames++
    this.#close(`bad frame: ${reason}`)
    return false
  }
}

function errorCodeOf (f: ResponseFrame): number | string {
  if (f.header.is_error !== true) return 'not an error'
  const status = ErrorStatusType.decode(f.message)
  if (status instanceof RpcError) return `unparseable ErrorStatusPB: ${status.message}`
  return status.code ?? 'no code'
}

function expectError (callId: number, code: number, allowBusy: boolean, what: string): Expect {
  return {
    callId,
    what,
    allowBusy,
    check: (f) => {
      const got = errorCodeOf(f)
      if (got === code || (allowBusy && got === KrpcCode.ERROR_SERVER_TOO_BUSY)) return null
      return `${what}: expected ${krpcCodeName(code)}, got ${typeof got === 'number' ? krpcCodeName(got) : got}`
    }
  }
}

function expectOk (callId: number, allowBusy: boolean, what: string, checkBody: (f: ResponseFrame) => string | null): Expect {
  return {
    callId,
    what,
    allowBusy,
    check: (f) => {
      if (f.header.is_error === true) {
        const got = errorCodeOf(f)
        if (allowBusy && got === KrpcCode.ERROR_SERVER_TOO_BUSY) return null
        return `${what}: expected success, got ${typeof got === 'number' ? krpcCodeName(got) : got}`
      }
      return checkBody(f)
    }
  }
}

/** The answer the fuzzed server must give to an accepted call (see `fuzzHandlers`). */
function predict (p: RequestFrame): Expect {
  const h = p.header
  const callId = h.call_id
  const allowBusy = (h.timeout_millis ?? 0) > 0
  const rm = h.remote_method!
  const what = `call ${callId} ${rm.service_name.slice(0, 40)}.${rm.method_name.slice(0, 40)}`
  if (rm.service_name !== SERVICE) return expectError(callId, KrpcCode.ERROR_NO_SUCH_SERVICE, allowBusy, what)
  const name = rm.method_name
  if (!Object.hasOwn(M, name)) return expectError(callId, KrpcCode.ERROR_NO_SUCH_METHOD, allowBusy, what)
  if ((h.required_feature_flags ?? []).length > 0) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
  const start = p.messageStart
  const end = p.messageEnd
  switch (name as keyof typeof M) {
    case 'Add': {
      const req = M.Add.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      const result = (req.x + req.y) >>> 0
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.Add.responseType.decode(f.message)
        return !(res instanceof RpcError) && res.result === result ? null : `${what}: wrong result ${JSON.stringify(res)}, expected ${result}`
      })
    }
    case 'Echo': {
      const req = M.Echo.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      const data = req.data
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.Echo.responseType.decode(f.message)
        return !(res instanceof RpcError) && res.data === data ? null : `${what}: wrong echo`
      })
    }
    case 'PushStrings': {
      const req = M.PushStrings.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      const sizes: number[] = []
      const crcs: number[] = []
      for (const i of req.sidecar_indexes ?? []) {
        const s = p.sidecars[i]
        if (s === undefined) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
        sizes.push(s.length)
        crcs.push(crc32(s))
      }
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.PushStrings.responseType.decode(f.message)
        if (res instanceof RpcError) return `${what}: ${res.message}`
        return sameNumbers(res.sizes, sizes) && sameNumbers(res.crcs, crcs) ? null : `${what}: wrong sizes or CRCs`
      })
    }
    case 'EchoSidecars': {
      const req = M.EchoSidecars.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      // Hashes, not views: a view would keep the whole read buffer.
      const sent = p.sidecars.map(s => `${s.length}:${crc32(s)}`)
      return expectOk(callId, allowBusy, what, (f) => {
        const res = M.EchoSidecars.responseType.decode(f.message)
        if (res instanceof RpcError) return `${what}: ${res.message}`
        const got = f.sidecars.map(s => `${s.length}:${crc32(s)}`)
        return got.length === sent.length && got.every((g, i) => g === sent[i]) && sameNumbers(res.sidecar_indexes, sent.map((_, i) => i))
          ? null
          : `${what}: sidecars not echoed (${got.length} of ${sent.length})`
      })
    }
    case 'Sleep': {
      const req = M.Sleep.requestType.decodeRange(p.frame, start, end)
      if (req instanceof RpcError) return expectError(callId, KrpcCode.ERROR_INVALID_REQUEST, allowBusy, what)
      if (req.return_app_error === true) return expectError(callId, KrpcCode.ERROR_APPLICATION, allowBusy, what)
      return expectOk(callId, allowBusy, what, () => null)
    }
  }
}

function sameNumbers (a: readonly number[] | undefined, b: readonly number[]): boolean {
  const x = a ?? []
  return x.length === b.length && x.every((v, i) => v === b[i])
}

function hex (b: Uint8Array, max = MAX_HEX_BYTES): string {
  const s = Buffer.from(b.buffer, b.byteOffset, Math.min(b.length, max)).toString('hex')
  return b.length > max ? `${s}… (${b.length} bytes)` : s
}

// ---------------------------------------------------------------------------
// The fuzzed server: the demo service, run in this process or a child.

/**
 * The demo handlers, but Sleep answers at once (a mutated sleep_micros would
 * hold a worker for up to 71 minutes), and a call that reaches a handler on
 * a connection that never finished negotiation is counted (its user is '',
 * a user the authenticator refuses).
 */
function fuzzHandlers (counters: { unauthenticated: number }): typeof calculatorHandlers {
  const seen = (ctx: CallContext): void => { if (ctx.user === '') counters.unauthenticated++ }
  return {
    Add: (req, ctx) => { seen(ctx); return calculatorHandlers.Add(req, ctx) },
    Echo: (req, ctx) => { seen(ctx); return calculatorHandlers.Echo(req, ctx) },
    PushStrings: (req, ctx) => { seen(ctx); return calculatorHandlers.PushStrings(req, ctx) },
    EchoSidecars: (req, ctx) => { seen(ctx); return calculatorHandlers.EchoSidecars(req, ctx) },
    Sleep: (req, ctx) => {
      seen(ctx)
      if (req.return_app_error === true) throw new Error('Got some error')
      return {}
    }
  }
}

function buildFuzzServer (counters: { unauthenticated: number }): Server {
  return new Server({
    maxMessageBytes: FUZZ_MAX_MESSAGE_BYTES,
    // Asynchronous, so negotiation takes the server's async path.
    authenticate: async (user) => modelAuthenticate(user)
  }).addService(CalculatorService, fuzzHandlers(counters))
}

function reportOf (server: Server, counters: { unauthenticated: number }): ServerReport {
  const cpu = process.cpuUsage()
  return {
    stats: server.stats(),
    unauthenticatedCalls: counters.unauthenticated,
    maxRssKiB: process.resourceUsage().maxRSS,
    rssBytes: process.memoryUsage().rss,
    cpuMs: Math.round((cpu.user + cpu.system) / 1000)
  }
}

interface ServerHandle {
  port: number
  report: () => Promise<ServerReport>
  close: () => Promise<ServerReport>
  /** Set when the server crashed (child exit or message). */
  crashed: string | null
  /** Called once when the server crashes. */
  onCrash: (() => void) | null
}

async function startInProcess (): Promise<ServerHandle> {
  const counters = { unauthenticated: 0 }
  const server = buildFuzzServer(counters)
  const { port } = await server.listen(0, HOST)
  return {
    port,
    crashed: null,
    onCrash: null,
    report: async () => reportOf(server, counters),
    close: async () => {
      await server.close({ graceMs: 0 })
      return reportOf(server, counters)
    }
  }
}

type ChildMessage = { type: 'listening', port: number } | { type: 'report', id: number, report: ServerReport } | { type: 'crash', error: string }

async function startChild (execArgv: string[]): Promise<ServerHandle> {
  const child: ChildProcess = fork(fileURLToPath(import.meta.url), ['--server-child'], { execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  let nextId = 0
  const waiting = new Map<number, { resolve: (r: ServerReport) => void, reject: (e: Error) => void }>()
  let lastReport: ServerReport | null = null
  let exited = false
  const exit = new Promise<void>((resolve) => child.once('exit', (code, signal) => {
    exited = true
    if (handle.crashed === null && (code !== 0 || signal !== null)) {
      handle.crashed = `server child exited with ${signal ?? code}`
      handle.onCrash?.()
    }
    for (const w of waiting.values()) w.reject(new Error(`server child gone: ${handle.crashed ?? 'exited'}`))
    waiting.clear()
    resolve()
  }))
  const ask = (type: 'report' | 'close'): Promise<ServerReport> => new Promise((resolve, reject) => {
    if (exited || !child.connected) { reject(new Error(`server child gone: ${handle.crashed ?? 'disconnected'}`)); return }
    const id = type === 'close' ? -1 : nextId++
    waiting.set(id, { resolve, reject })
    child.send({ type, id })
  })
  const handle: ServerHandle = {
    port: 0,
    crashed: null,
    onCrash: null,
    report: () => ask('report'),
    close: async () => {
      const report = await ask('close').catch(() => lastReport)
      await exit
      if (report === null) throw new Error(`server child gone: ${handle.crashed ?? 'no report'}`)
      return report
    }
  }
  const listening = new Promise<number>((resolve, reject) => {
    child.on('message', (m: ChildMessage) => {
      if (m.type === 'listening') resolve(m.port)
      else if (m.type === 'crash') {
        if (handle.crashed === null) {
          handle.crashed = m.error
          handle.onCrash?.()
        }
      }
      else {
        lastReport = m.report
        const w = waiting.get(m.id)
        waiting.delete(m.id)
        w?.resolve(m.report)
      }
    })
    void exit.then(() => reject(new Error(`server child exited before listening: ${handle.crashed ?? ''}`)))
  })
  handle.port = await listening
  return handle
}

async function serverChild (): Promise<void> {
  const counters = { unauthenticated: 0 }
  process.on('uncaughtException', (err) => {
    process.send?.({ type: 'crash', error: err.stack ?? String(err) }, () => process.exit(70))
  })
  const server = buildFuzzServer(counters)
  const { port } = await server.listen(0, HOST)
  process.on('message', (m: { type: string, id?: number }) => {
    if (m.type === 'report') {
      process.send!({ type: 'report', id: m.id, report: reportOf(server, counters) })
    } else if (m.type === 'close') {
      void server.close({ graceMs: 0 }).then(() => {
        process.send!({ type: 'report', id: -1, report: reportOf(server, counters) }, () => process.exit(0))
      })
    }
  })
  process.on('disconnect', () => process.exit(0))
  process.send!({ type: 'listening', port })
}

// ---------------------------------------------------------------------------
// Server side: episodes of raw connections.

/** One raw connection to the server: writes bytes, reads frames, matches them to what the model expects. */
class RawConn {
  readonly socket: Socket
  readonly written: Buffer[] = []
  writtenBytes = 0
  closed = false
  /** Predicted frames not received yet, by call id. */
  readonly pending = new Map<number, Expect[]>()
  pendingCount = 0
  /** Calls (not negotiation frames) answered as predicted, once each. */
  callsAnsweredOnce = 0
  readonly problems: string[] = []
  readonly #decoder = new FrameDecoder(krpcFraming, 64 * 1024 * 1024)
  #wake: (() => void) | null = null

  constructor (port: number, sockets: Set<Socket>) {
    this.socket = connect({ host: HOST, port, noDelay: true })
    sockets.add(this.socket)
    this.socket.on('error', () => {})
    this.socket.on('data', (chunk: Buffer) => {
      const error = this.#decoder.pushRanges(chunk, (buf, start, end) => { this.#frame(buf.subarray(start, end)) })
      if (error !== null) this.problems.push(`server sent an undecodable stream: ${error.message}`)
      this.#poke()
    })
    this.socket.on('close', () => {
      this.closed = true
      sockets.delete(this.socket)
      this.#poke()
    })
  }

  expect (items: readonly Expect[]): void {
    for (const e of items) {
      let list = this.pending.get(e.callId)
      if (list === undefined) this.pending.set(e.callId, list = [])
      list.push(e)
      this.pendingCount++
    }
  }

  write (bytes: Buffer): void {
    this.written.push(bytes)
    this.writtenBytes += bytes.length
    if (!this.closed) this.socket.write(bytes)
  }

  /** Resolves once `done()` holds or the connection closed, or false after `ms`. */
  async until (done: () => boolean, ms: number): Promise<boolean> {
    const deadline = Date.now() + ms
    while (!done() && !this.closed) {
      const left = deadline - Date.now()
      if (left <= 0) return false
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => { this.#wake = null; resolve() }, Math.min(left, 1000))
        this.#wake = () => { clearTimeout(timer); this.#wake = null; resolve() }
      })
    }
    return true
  }

  #poke (): void {
    this.#wake?.()
  }

  #frame (frame: Buffer): void {
    const parsed = parseResponseFrame(frame)
    if (parsed instanceof RpcError) {
      this.problems.push(`server sent a malformed frame: ${parsed.message}: ${hex(frame, 64)}`)
      return
    }
    const list = this.pending.get(parsed.header.call_id)
    const expected = list?.shift()
    if (expected === undefined) {
      this.problems.push(`unexpected frame for call id ${parsed.header.call_id} (${parsed.header.is_error === true ? 'error' : 'success'}): ${hex(frame, 64)}`)
      return
    }
    if (list!.length === 0) this.pending.delete(parsed.header.call_id)
    this.pendingCount--
    if (expected.callId >= 0) this.callsAnsweredOnce++
    const wrong = expected.check(parsed)
    if (wrong !== null) this.problems.push(wrong)
  }
}

/** The server side of a run: episodes, probes, and the tallies. */
class ServerSide {
  readonly #seed: number
  readonly #port: number
  readonly #pool: Buffer
  readonly #foundBugs: ReadonlySet<FoundBug>
  readonly #fail: (f: FuzzFailure) => void
  readonly sockets = new Set<Socket>()
  mutantsFrames = 0
  mutantsNegotiation = 0
  episodes = 0
  batches = 0
  callsPredicted = 0
  callsAnsweredOnce = 0
  answersDroppedAtClose = 0
  closedAsPredicted = 0
  closedWhileWaiting = 0
  badFramesModel = 0
  callsAccepted = 0
  stopped = false
  /** Episodes running now (the suspects when the server crashes). */
  readonly inFlight = new Set<number>()
  /** Episodes that sent calls behind a refused SASL step (`refused-auth-pipelining`). */
  readonly refusalEpisodes: number[] = []

  constructor (seed: number, port: number, pool: Buffer, foundBugs: ReadonlySet<FoundBug>, fail: (f: FuzzFailure) => void) {
    this.#seed = seed
    this.#port = port
    this.#pool = pool
    this.#foundBugs = foundBugs
    this.#fail = fail
  }

  get mutants (): number {
    return this.mutantsFrames + this.mutantsNegotiation
  }

  /** Runs episodes `concurrency` at a time until `target` mutants were sent (or `stop()`). */
  async run (target: number, concurrency: number): Promise<void> {
    let next = 0
    const worker = async (): Promise<void> => {
      while (!this.stopped && this.mutants < target) {
        const index = next++
        try {
          await this.episode(index)
        } catch (err) {
          this.#fail({ kind: 'fuzzer error', detail: (err as Error).stack ?? String(err), seed: this.#seed, episode: index })
        }
      }
    }
    await Promise.all(Array.from({ length: concurrency }, worker))
  }

  stop (): void {
    this.stopped = true
  }

  /** Runs episode `index` (one connection: a handshake, then batches of frames, each checked against the model); resolves with the bytes it wrote. */
  async episode (index: number, trace?: (line: string) => void): Promise<Buffer> {
    this.inFlight.add(index)
    try {
      return await this.#episode(index, trace)
    } finally {
      this.inFlight.delete(index)
    }
  }

  async #episode (index: number, trace?: (line: string) => void): Promise<Buffer> {
    this.episodes++
    const rng = new Rng(mix(this.#seed, 0x5e7, index))
    const gen = new RequestGen(rng, this.#pool, this.#foundBugs)
    const model = new ServerModel()
    const conn = new RawConn(this.#port, this.sockets)
    const fail = (kind: string, detail: string, batch: number): void => {
      this.#fail({ kind, detail, seed: this.#seed, episode: index, batch, bytesHex: hex(Buffer.concat(conn.written)) })
    }
    let handshake: Buffer = CLEAN_HANDSHAKE_BYTES
    let pipelinedRefusal = false
    if (rng.chance(0.15)) {
      const mutant = handshakeMutant(gen, this.#foundBugs)
      handshake = mutant.bytes
      pipelinedRefusal = mutant.pipelinedRefusal
      // The calls that ride behind the refusal: the model ignores them, as the server must.
      if (pipelinedRefusal && this.refusalEpisodes.length < 20) this.refusalEpisodes.push(index)
      if (pipelinedRefusal) handshake = Buffer.concat([handshake, ...Array.from({ length: rng.range(1, 4) }, (_, i) => gen.clean(1000 + i))])
      this.mutantsNegotiation++
    }
    let pieces: Buffer[] = [handshake]
    // With known bugs on, calls may ride in the read of a refused SASL step (see ServerModel.feedUntilAuthenticated).
    const authAt = pipelinedRefusal ? -1 : model.feedUntilAuthenticated(handshake)
    if (authAt < 0) {
      if (pipelinedRefusal) model.feed(handshake)
    } else {
      conn.write(handshake.subarray(0, authAt))
      const answers = model.takeExpected()
      conn.expect(answers)
      await conn.until(() => conn.pendingCount === 0, BATCH_TIMEOUT_MS)
      for (const p of conn.problems.splice(0)) fail('wrong answer', p, -1)
      if (conn.pendingCount > 0 && !conn.closed) {
        fail('missing answers', `negotiation answers not received in ${BATCH_TIMEOUT_MS} ms`, -1)
        conn.socket.destroy()
        return Buffer.concat(conn.written)
      }
      model.feed(handshake.subarray(authAt))
      pieces = [handshake.subarray(authAt)]
    }
    const batches = rng.range(1, 4)
    // Most episodes mutate most frames; some few, so that connections live long with many calls on them.
    const mutationRate = rng.pick([0.75, 0.75, 0.75, 0.4, 0.1])
    let callId = 0
    let pieceExpect = model.takeExpected()
    batches: for (let batch = 0; batch < batches; batch++) {
      this.batches++
      // Each piece with the frames the server must send for it.
      const parts: Array<{ bytes: Buffer[], expect: Expect[], waiting: boolean, closes: boolean }> = [{ bytes: [], expect: [], waiting: false, closes: false }]
      const add = (bytes: Buffer, expect: Expect[]): void => {
        const part = parts[parts.length - 1]!
        part.bytes.push(bytes)
        part.expect.push(...expect)
      }
      for (const piece of pieces) add(piece, pieceExpect)
      pieces = []
      pieceExpect = []
      // Most of the time the piece that breaks the connection goes in a write of its own, once the
      // answers before it have come back: answers of the read that carries a bad frame are dropped
      // with the connection (which the server may do), and would go unchecked.
      const splitFatal = rng.chance(0.7)
      const frames = rng.range(1, 24)
      for (let k = 0; k < frames && !model.closed; k++) {
        let bytes: Buffer
        if (rng.chance(mutationRate)) {
          bytes = gen.mutant(callId++)
          this.mutantsFrames++
        } else {
          bytes = gen.clean(callId++)
        }
        const waiting = model.waiting
        model.feed(bytes)
        if (model.closed && splitFatal && parts[0]!.bytes.length > 0) {
          parts[0]!.waiting = waiting
          parts.push({ bytes: [], expect: [], waiting: false, closes: true })
        }
        add(bytes, model.takeExpected())
      }
      const last = parts[parts.length - 1]!
      last.closes = model.closed
      last.waiting = model.waiting
      last.expect.push(...model.takeExpected())
      for (const part of parts) {
        const verdict = await this.#sendPart(conn, part.bytes, part.expect, part.closes, part.waiting, rng, (kind, detail) => fail(kind, detail, batch), trace)
        if (verdict === 'stop') break batches
      }
      if (model.closed) break
    }
    this.callsAnsweredOnce += conn.callsAnsweredOnce
    this.badFramesModel += model.badFrames
    this.callsAccepted += model.accepted
    if (!conn.closed) {
      if (!model.closed && !model.waiting && rng.chance(0.03)) {
        // A graceful end: the server must close its side too.
        conn.socket.end()
        if (!await conn.until(() => false, BATCH_TIMEOUT_MS)) fail('not closed', 'the server kept a connection its peer ended', batches)
      }
      conn.socket.destroy()
    }
    trace?.(`episode ${index}: ${conn.writtenBytes} bytes written; model ${model.phase}${model.closeReason === '' ? '' : ` (${model.closeReason})`}`)
    return Buffer.concat(conn.written)
  }

  // Writes one part (in pieces, now and then), waits for its answers (and the close it must
  // cause), and judges: 'stop' when the connection is gone or a failure was found.
  async #sendPart (conn: RawConn, bytes: Buffer[], expected: Expect[], mustClose: boolean, waiting: boolean, rng: Rng,
    fail: (kind: string, detail: string) => void, trace?: (line: string) => void): Promise<'go' | 'stop'> {
    const data = Buffer.concat(bytes)
    if (data.length === 0 && expected.length === 0 && !mustClose) return 'go'
    // Expected before written: answers may come back between the pieces of a split write.
    this.callsPredicted += expected.filter(e => e.callId >= 0).length
    conn.expect(expected)
    if (rng.chance(0.1) && data.length > 1) {
      // In pieces, each in its own event-loop turn: frames and preambles split anywhere.
      const cuts = Array.from({ length: rng.range(1, 5) }, () => rng.range(1, data.length - 1)).sort((a, b) => a - b)
      let at = 0
      for (const cut of [...cuts, data.length]) {
        if (cut <= at) continue
        conn.write(data.subarray(at, cut))
        at = cut
        await new Promise<void>((resolve) => setImmediate(resolve))
      }
    } else {
      conn.write(data)
    }
    const settled = await conn.until(() => conn.pendingCount === 0 && (!mustClose || conn.closed), BATCH_TIMEOUT_MS)
    trace?.(`wrote ${data.length} bytes: ${expected.length} frames expected, ${conn.pendingCount} missing; must close ${mustClose}, model waiting ${waiting}; ` +
      `${conn.closed ? 'closed by the server' : 'open'}`)
    for (const p of conn.problems.splice(0)) fail('wrong answer', p)
    if (!settled) {
      if (conn.pendingCount > 0) fail('missing answers', `${conn.pendingCount} predicted frames not received in ${BATCH_TIMEOUT_MS} ms: ${whatPending(conn)}`)
      else fail('not closed', 'the server kept a connection that must be closed')
      return 'stop'
    }
    if (!conn.closed) return 'go'
    const pending = [...conn.pending.values()].reduce((n, l) => n + l.filter(e => e.callId >= 0).length, 0)
    if (mustClose) {
      this.closedAsPredicted++
      // Answers of the read that carried the bad frame may be dropped with the connection (as in Kudu).
      this.answersDroppedAtClose += pending
    } else if (waiting) {
      this.closedWhileWaiting++
      this.answersDroppedAtClose += pending
    } else {
      fail('unexpected close', `the server closed a connection the model keeps open (${conn.pendingCount} answers missing: ${whatPending(conn)})`)
    }
    return 'stop'
  }
}

function whatPending (conn: RawConn): string {
  return [...conn.pending.values()].flat().slice(0, 3).map(e => e.what).join('; ')
}

// ---------------------------------------------------------------------------
// Client side: a fake server that answers real clients with mutants.

type AnswerOp = 'clean' | 'bitflip' | 'byte' | 'truncate' | 'truncateFixed' | 'insert' | 'delete' | 'lyingPrefix' | 'headerLen' |
'bodyLen' | 'randomHeader' | 'sidecarOffsets' | 'wrongCallId' | 'duplicate' | 'errorStatus' | 'badBody' | 'noAnswer' | 'noise' |
'closeAfter' | 'closeInstead' | 'split' | 'delayed' | 'late' | 'pause'

const ANSWER_OPS = new Weighted<AnswerOp>([
  [22, 'clean'], [12, 'bitflip'], [4, 'byte'], [3, 'truncate'], [3, 'truncateFixed'], [3, 'insert'], [3, 'delete'], [5, 'lyingPrefix'],
  [3, 'headerLen'], [3, 'bodyLen'], [7, 'randomHeader'], [5, 'sidecarOffsets'], [6, 'wrongCallId'], [3, 'duplicate'],
  [7, 'errorStatus'], [4, 'badBody'], [1, 'noAnswer'], [2, 'noise'], [1, 'closeAfter'], [0.5, 'closeInstead'], [2, 'split'],
  [2, 'delayed'], [0.5, 'late'], [1, 'pause']
])

type NegotiationOp = 'stall' | 'close' | 'noiseFirst' | 'mutateNegotiate' | 'mutateSuccess' | 'errorFrame' | 'noPlain' | 'earlyAnswer' |
'successFirst' | 'tokenAuthn' | 'noFeatures'
const NEGOTIATION_OPS: readonly NegotiationOp[] = [
  'stall', 'close', 'noiseFirst', 'mutateNegotiate', 'mutateSuccess', 'errorFrame', 'noPlain', 'earlyAnswer', 'successFirst', 'tokenAuthn',
  'noFeatures'
]

/** A NEGOTIATE answer offering `mechanism` and `authn`. */
function negotiateAnswer (mechanism: string, authn: { sasl?: object, token?: object }, features?: number[]): Buffer {
  return join(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({
    step: 1, sasl_mechanisms: [{ mechanism }], authn_types: [authn], ...(features === undefined ? {} : { supported_features: features })
  })))
}

/** One connection of the fake server. */
class FakeConn {
  readonly index: number
  readonly socket: Socket
  readonly #rng: Rng
  readonly #side: ClientSide
  #preamble: Buffer | null = Buffer.alloc(0)
  readonly #decoder = new FrameDecoder(krpcFraming, FUZZ_MAX_MESSAGE_BYTES)
  readonly #negotiation = new ServerNegotiation()
  #negotiated = false
  readonly #negotiationOp: NegotiationOp | null
  #negotiationFrames = 0
  /** Our own output as the client reads it: when it stops inside a frame, the connection is closed after a while. */
  readonly #tracker = new FrameDecoder(krpcFraming, CLIENT_MAX_MESSAGE_BYTES)
  #trackerBroken = false
  #stallTimer: NodeJS.Timeout | null = null
  readonly #timers = new Set<NodeJS.Timeout>()
  readonly #recent: number[] = []
  /** The last writes, for a failure's report. */
  readonly #log: Buffer[] = []
  closed = false

  constructor (index: number, socket: Socket, seed: number, side: ClientSide) {
    this.index = index
    this.socket = socket
    this.#rng = new Rng(mix(seed, 0xc11e, index))
    this.#side = side
    this.#negotiationOp = this.#rng.chance(0.1) ? this.#rng.pick(NEGOTIATION_OPS) : null
    if (this.#negotiationOp !== null) side.mutants++
    socket.setNoDelay(true)
    socket.on('error', () => {})
    socket.on('data', (chunk: Buffer) => this.#onData(chunk))
    socket.on('close', () => {
      this.closed = true
      for (const t of this.#timers) clearTimeout(t)
      this.#timers.clear()
      if (this.#stallTimer !== null) clearTimeout(this.#stallTimer)
    })
  }

  recentHex (): string {
    return hex(Buffer.concat(this.#log))
  }

  // Closed, or destroyed here a moment ago ('close' comes later).
  get #gone (): boolean {
    return this.closed || this.socket.destroyed
  }

  #onData (chunk: Buffer): void {
    if (this.#gone) return
    if (this.#preamble !== null) {
      const take = Math.min(PREAMBLE_BYTES - this.#preamble.length, chunk.length)
      this.#preamble = Buffer.concat([this.#preamble, chunk.subarray(0, take)])
      chunk = chunk.subarray(take)
      if (this.#preamble.length < PREAMBLE_BYTES) return
      if (!this.#preamble.equals(KRPC_PREAMBLE)) this.#side.fail('client sent a bad preamble', hex(this.#preamble), this)
      this.#preamble = null
    }
    const error = this.#decoder.pushRanges(chunk, (buf, start, end) => {
      this.#frame(Buffer.from(buf.subarray(start, end)))
      return !this.#gone
    })
    if (error !== null) this.#side.fail('client sent an undecodable stream', error.message, this)
  }

  #frame (frame: Buffer): void {
    if (!this.#negotiated) {
      this.#negotiationFrame(frame)
      return
    }
    const parsed = parseRequestFrame(frame)
    if (parsed instanceof RpcError) {
      this.#side.fail('client sent a malformed request', `${parsed.message}: ${hex(frame, 128)}`, this)
      return
    }
    this.#answer(parsed)
  }

  #negotiationFrame (frame: Buffer): void {
    const rng = this.#rng
    const step = this.#negotiation.onFrame(frame) as NegotiationStep
    const first = this.#negotiationFrames++ === 0
    let send = (step.send ?? []).map(join)
    const op = this.#negotiationOp
    if (op !== null && (first || op === 'mutateSuccess')) {
      switch (op) {
        case 'stall': send = []; break
        case 'close': this.socket.destroy(); return
        case 'noiseFirst': if (first) send = [rng.bytes(rng.range(1, 16)), ...send]; break
        case 'mutateNegotiate': if (first) send = send.map(f => mutateAnswerBytes(rng, f)); break
        case 'mutateSuccess': if (!first && step.done === undefined) send = send.map(f => mutateAnswerBytes(rng, f)); break
        case 'errorFrame': send = [join(encodeErrorFrame(NEGOTIATE_CALL_ID, rng.pick([KrpcCode.FATAL_UNAUTHORIZED, KrpcCode.FATAL_VERSION_MISMATCH, 0, 99, 1]), 'no'))]; break
        case 'noPlain': send = [negotiateAnswer('GSSAPI', { sasl: {} })]; break
        case 'earlyAnswer': send = [join(encodeResponseFrame(0, false, M.Add.responseType.encode({ result: 1 }))), ...send]; break
        case 'successFirst': send = [join(encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, NegotiateType.encode({ step: 0 })))]; break
        case 'tokenAuthn': send = [negotiateAnswer('PLAIN', { token: {} })]; break
        // An old server: no application feature flags (calls that need them fail without being sent).
        case 'noFeatures': send = [negotiateAnswer('PLAIN', { sasl: {} }, [])]; break
      }
    }
    for (const f of send) this.#send(f)
    if (step.done !== undefined) this.#negotiated = true
    if (step.error !== undefined) this.socket.destroy()
  }

  // The answer the demo service would give.
  #cleanAnswer (p: RequestFrame): Buffer {
    const name = p.header.remote_method?.method_name ?? ''
    const callId = p.header.call_id
    const bytes = p.frame
    switch (name) {
      case 'Add': {
        const req = M.Add.requestType.decodeRange(bytes, p.messageStart, p.messageEnd)
        if (req instanceof RpcError) break
        return join(encodeResponseFrame(callId, false, M.Add.responseType.encode({ result: (req.x + req.y) >>> 0 })))
      }
      case 'Echo': {
        const req = M.Echo.requestType.decodeRange(bytes, p.messageStart, p.messageEnd)
        if (req instanceof RpcError) break
        return join(encodeResponseFrame(callId, false, M.Echo.responseType.encode({ data: req.data })))
      }
      case 'PushStrings': {
        const req = M.PushStrings.requestType.decodeRange(bytes, p.messageStart, p.messageEnd)
        if (req instanceof RpcError) break
        const picked = (req.sidecar_indexes ?? []).map(i => p.sidecars[i])
        if (picked.some(s => s === undefined)) return join(encodeErrorFrame(callId, KrpcCode.ERROR_INVALID_REQUEST, 'no such sidecar'))
        return join(encodeResponseFrame(callId, false, M.PushStrings.responseType.encode({ sizes: picked.map(s => s!.length), crcs: picked.map(s => crc32(s!)) })))
      }
      case 'EchoSidecars':
        return join(encodeResponseFrame(callId, false, M.EchoSidecars.responseType.encode({ sidecar_indexes: p.sidecars.map((_, i) => i) }), p.sidecars))
    }
    return join(encodeErrorFrame(callId, KrpcCode.ERROR_NO_SUCH_METHOD, `no method ${name}`))
  }

  #answer (p: RequestFrame): void {
    const rng = this.#rng
    const side = this.#side
    const callId = p.header.call_id
    this.#recent.push(callId)
    if (this.#recent.length > 16) this.#recent.shift()
    const clean = this.#cleanAnswer(p)
    const op = ANSWER_OPS.pick(rng)
    if (op !== 'clean') side.mutants++
    const later = (ms: number, f: () => void): void => {
      if (this.#gone) return
      const t = setTimeout(() => { this.#timers.delete(t); if (!this.#gone) f() }, ms)
      this.#timers.add(t)
    }
    switch (op) {
      case 'clean': this.#send(clean); return
      case 'noAnswer': return
      case 'duplicate': this.#send(clean); this.#send(clean); return
      case 'closeAfter': this.#send(clean); if (rng.chance(0.5)) this.socket.end(); else this.socket.destroy(); return
      case 'closeInstead': this.socket.destroy(); return
      case 'noise': this.#send(rng.bytes(rng.range(1, 32))); if (rng.chance(0.5)) this.#send(clean); return
      case 'split': {
        const f = rng.chance(0.7) ? clean : mutateAnswerBytes(rng, clean)
        let at = 0
        const step = (): void => {
          const n = Math.min(f.length - at, rng.range(1, 8))
          this.#send(f.subarray(at, at + n))
          at += n
          if (at < f.length) later(0, step)
        }
        step()
        return
      }
      case 'delayed': later(rng.int(30), () => this.#send(clean)); return
      case 'late': later(CLIENT_TIMEOUT_MS + rng.int(100), () => this.#send(clean)); return
      case 'pause':
        // Stop reading a while: the client's writes back up (large sidecars wait mid-send, deadlines pass).
        this.socket.pause()
        later(rng.range(10, CLIENT_TIMEOUT_MS), () => { this.socket.resume(); this.#send(clean) })
        return
      case 'wrongCallId': {
        const other = rng.pick([callId + 1, callId - 1, rng.pick(this.#recent), rng.u32() | 0, -1, NEGOTIATE_CALL_ID, CONNECTION_CONTEXT_CALL_ID, 0x7fffffff])
        const layout = layoutOf(clean)
        const body = layout === null ? new Uint8Array(0) : clean.subarray(layout.bodyStart)
        this.#send(frameOf(new Pb().tag(1, 0).int32(other).tag(2, 0).varint(0).buffer(), body))
        if (rng.chance(0.5)) this.#send(clean)
        return
      }
      case 'randomHeader': {
        const layout = layoutOf(clean)
        const body = layout === null ? new Uint8Array(0) : clean.subarray(layout.bodyStart)
        this.#send(frameOf(randomResponseHeader(rng, callId, this.#recent), rng.chance(0.7) ? body : rng.bytes(rng.int(40))))
        return
      }
      case 'sidecarOffsets': {
        const layout = layoutOf(clean)
        const tail = layout === null ? rng.bytes(8) : clean.subarray(layout.bodyStart)
        const w = new Pb().tag(1, 0).int32(callId).tag(2, 0).varint(0)
        const n = rng.chance(0.05) ? MAX_SIDECARS + 1 : rng.range(1, 4)
        for (let i = 0; i < n; i++) w.tag(3, 0).varint(rng.chance(0.5) ? rng.int(tail.length + 3) : rng.pick(INTERESTING_U32))
        this.#send(frameOf(w.buffer(), tail))
        return
      }
      case 'errorStatus': {
        const code = rng.pick([...Object.values(KrpcCode), 0, 99, 0x7fffffff])
        if (rng.chance(0.8)) {
          this.#send(join(encodeErrorFrame(callId, code, rng.chance(0.5) ? 'fuzzed error' : 'x'.repeat(rng.int(3000)), rng.chance(0.2) ? [rng.u32()] : undefined)))
        } else {
          this.#send(join(encodeResponseFrame(callId, true, rng.bytes(rng.int(30)))))
        }
        return
      }
      case 'badBody':
        this.#send(join(encodeResponseFrame(callId, false, rng.chance(0.3) ? new Uint8Array(0) : rng.bytes(rng.int(40)))))
        return
      default:
        this.#send(mutateAnswerBytes(rng, clean, op))
    }
  }

  #send (bytes: Buffer): void {
    if (this.#gone) return
    this.#log.push(bytes)
    if (this.#log.length > 32) this.#log.shift()
    this.socket.write(bytes)
    if (this.#trackerBroken) return
    // After the handshake the client reads frames; the preamble is ours to skip (none from a server).
    const error = this.#tracker.pushRanges(bytes, () => {})
    if (error !== null) {
      this.#trackerBroken = true
      return
    }
    if (this.#tracker.hasPartialFrame && this.#stallTimer === null) {
      // A lying length leaves the client waiting inside a frame: close the connection if nothing completes it soon.
      this.#stallTimer = setTimeout(() => {
        this.#stallTimer = null
        if (this.#tracker.hasPartialFrame) {
          this.#side.stalledClosed++
          this.socket.destroy()
        }
      }, 60)
    }
  }
}

function randomResponseHeader (rng: Rng, callId: number, recent: readonly number[]): Buffer {
  const w = new Pb()
  const fields: Array<() => void> = []
  if (rng.chance(0.9)) fields.push(() => w.tag(1, 0).int32(rng.chance(0.7) ? callId : rng.chance(0.5) ? rng.pick(recent) : rng.pick(INTERESTING_INT32)))
  if (rng.chance(0.7)) fields.push(() => w.tag(2, 0).varint(rng.pick([0, 1, 2, 0xffffffff, 2 ** 40])))
  if (rng.chance(0.2)) fields.push(() => w.tag(3, 0).varint(rng.int(64)))
  if (rng.chance(0.2)) fields.push(() => w.tag(rng.pick([4, 5, 15, 100]), rng.int(8)).raw(rng.bytes(rng.int(6))))
  if (rng.chance(0.05)) fields.push(() => w.tag(0, 0).varint(0))
  shuffle(rng, fields)
  for (const f of fields) f()
  return w.buffer()
}

/** A byte-level mutant of an answer frame. */
function mutateAnswerBytes (rng: Rng, frame: Buffer, given?: AnswerOp): Buffer {
  const f = Buffer.from(frame)
  const op = given ?? rng.pick(['bitflip', 'byte', 'truncate', 'truncateFixed', 'insert', 'delete', 'lyingPrefix', 'headerLen', 'bodyLen'] as const)
  switch (op) {
    case 'bitflip':
      for (let k = rng.range(1, 4); k > 0; k--) f[rng.chance(0.6) ? rng.int(Math.min(f.length, 16)) : rng.int(f.length)]! ^= 1 << rng.int(8)
      return f
    case 'byte':
      f[rng.int(Math.min(f.length, 16))] = rng.pick(INTERESTING_BYTES)
      return f
    case 'truncate': return f.subarray(0, rng.int(f.length))
    case 'truncateFixed': return fixPrefix(Buffer.from(f.subarray(0, rng.range(Math.min(5, f.length), f.length - 1))))
    case 'insert': {
      const at = rng.int(f.length + 1)
      const out = Buffer.concat([f.subarray(0, at), rng.bytes(rng.range(1, 16)), f.subarray(at)])
      return rng.chance(0.5) ? fixPrefix(out) : out
    }
    case 'delete': {
      const at = rng.int(f.length)
      const out = Buffer.concat([f.subarray(0, at), f.subarray(Math.min(f.length, at + rng.range(1, 8)))])
      return rng.chance(0.5) ? fixPrefix(out) : out
    }
    case 'lyingPrefix':
      return withPrefix(f, rng.chance(0.6) ? f.length - 4 + rng.pick([-3, -2, -1, 1, 2, 3, 64]) : rng.pick([0, 1, CLIENT_MAX_MESSAGE_BYTES, CLIENT_MAX_MESSAGE_BYTES + 1, 0xffffffff, rng.u32()]))
    case 'headerLen':
    case 'bodyLen': {
      const layout = layoutOf(f)
      if (layout === null) return f
      const [at, end, actual] = op === 'headerLen'
        ? [4, layout.headerStart, layout.headerEnd - layout.headerStart]
        : [layout.headerEnd, layout.bodyStart, f.length - layout.bodyStart]
      const lie = rng.chance(0.7) ? varintBuf(Math.max(0, actual + rng.pick([-2, -1, 1, 2, 50]))) : Buffer.from([0xff, 0xff, 0xff, 0xff, 0x7f])
      const out = Buffer.concat([f.subarray(0, at), lie, f.subarray(end)])
      return rng.chance(0.7) ? fixPrefix(out) : out
    }
    default: return f
  }
}

interface CallRecord { deadline: number, reported: boolean }

/** The client side of a run: the fake server, the fuzzed clients and their calls. */
class ClientSide {
  readonly #seed: number
  readonly #failSink: (f: FuzzFailure) => void
  readonly #net: NetServer
  readonly conns = new Set<FakeConn>()
  #connections = 0
  mutants = 0
  stalledClosed = 0
  calls = 0
  settledOnce = 0
  settledTwice = 0
  settledBeforeReturn = 0
  neverSettled = 0
  readonly outcomes: Record<string, number> = {}
  readonly #settles: number[] = []
  readonly #pending = new Map<number, CallRecord>()
  #clients: Client[] = []
  #clientOptions: ClientOptions[] = []
  clientsClosed = 0
  /** Calls `finish` made to the real server. */
  realServerCalls = 0
  #rng: Rng
  #port = 0
  #stopping = false
  #watch: NodeJS.Timeout | null = null
  #drained: (() => void) | null = null

  constructor (seed: number, fail: (f: FuzzFailure) => void) {
    this.#seed = seed
    this.#failSink = fail
    this.#rng = new Rng(mix(seed, 0xca11))
    this.#net = createServer({ noDelay: true }, (socket) => {
      const conn = new FakeConn(this.#connections++, socket, this.#seed, this)
      this.conns.add(conn)
      socket.once('close', () => this.conns.delete(conn))
    })
  }

  get fakeConnections (): number {
    return this.#connections
  }

  fail (kind: string, detail: string, conn?: FakeConn): void {
    const f: FuzzFailure = { kind, detail, seed: this.#seed }
    if (conn !== undefined) {
      f.connection = conn.index
      f.bytesHex = conn.recentHex()
    }
    this.#failSink(f)
  }

  async start (): Promise<void> {
    await new Promise<void>((resolve) => this.#net.listen(0, HOST, resolve))
    this.#port = (this.#net.address() as { port: number }).port
    const endpoint = `${HOST}:${this.#port}`
    const base: ClientOptions = { endpoint, defaultTimeoutMs: CLIENT_TIMEOUT_MS, negotiationTimeoutMs: CLIENT_TIMEOUT_MS, maxMessageBytes: CLIENT_MAX_MESSAGE_BYTES }
    this.#clientOptions = [
      base,
      { ...base, retry: {} },
      { ...base, connectionsPerEndpoint: 2 },
      { ...base, maxMessageBytes: 4096 },
      { ...base, maxOutboundBytes: 128 * 1024 }
    ]
    this.#clients = this.#clientOptions.map(o => new Client(o))
  }

  // Now and then a client is closed with calls pending (they must settle with CLIENT_CLOSED) and replaced.
  #replaceClient (): void {
    const i = this.#rng.int(this.#clients.length)
    const old = this.#clients[i]!
    this.#clients[i] = new Client(this.#clientOptions[i]!)
    old.close()
    this.clientsClosed++
  }

  /** Keeps `concurrency` calls outstanding until `target` mutants were answered (or `stop()`). */
  async run (target: number, concurrency: number): Promise<void> {
    if (target <= 0) return
    this.#watch = setInterval(() => this.#checkStuck(), 1000)
    const done = new Promise<void>((resolve) => { this.#drained = resolve })
    const guard = target * 4 + 1000
    const next = (): void => {
      if (this.#stopping || this.mutants >= target || this.calls >= guard) {
        this.#stopping = true
        if (this.#pending.size === 0) this.#drained?.()
        return
      }
      this.#issue(next)
    }
    for (let i = 0; i < concurrency; i++) next()
    await done
    clearInterval(this.#watch)
    this.#watch = null
  }

  stop (): void {
    this.#stopping = true
    if (this.#pending.size === 0) this.#drained?.()
  }

  // Starts one call; `then` runs once it settled.
  #issue (then: () => void): void {
    const rng = this.#rng
    const id = this.calls++
    if (id % 2000 === 1999) this.#replaceClient()
    const client = rng.pick(this.#clients)
    const calc = client.service(CalculatorService)
    const timeoutMs = rng.chance(0.05) ? rng.range(1, 5) : CLIENT_TIMEOUT_MS
    const options: { timeoutMs: number, signal?: AbortSignal, sidecars?: Uint8Array[], requiredFeatureFlags?: number[] } = { timeoutMs }
    if (rng.chance(0.03)) options.requiredFeatureFlags = [rng.int(4)]
    if (rng.chance(0.05)) {
      const controller = new AbortController()
      options.signal = controller.signal
      setTimeout(() => controller.abort(), rng.int(20))
    }
    // A retried call may run up to its deadline, then a negotiation timer, before it fails.
    this.#pending.set(id, { deadline: Date.now() + timeoutMs + CLIENT_TIMEOUT_MS, reported: false })
    let returned = false
    const settle = (outcome: string): void => {
      const n = (this.#settles[id] = (this.#settles[id] ?? 0) + 1)
      if (n === 1) {
        this.#pending.delete(id)
        this.settledOnce++
        this.outcomes[outcome] = (this.outcomes[outcome] ?? 0) + 1
        if (!returned) {
          this.settledBeforeReturn++
          this.fail('settled before return', `call ${id} settled (${outcome}) before the call that made it returned`)
        }
      } else {
        this.settledOnce--
        this.settledTwice++
        this.fail('settled twice', `call ${id} settled ${n} times (last: ${outcome})`)
        return
      }
      if (this.#stopping && this.#pending.size === 0) this.#drained?.()
      then()
    }
    const onResult = (error: RpcError | null): void => settle(error === null ? 'OK' : outcomeOf(error))
    const form = rng.int(2)
    const method = rng.int(100)
    if (method < 55) {
      const request = { x: rng.u32(), y: rng.u32() }
      if (form === 0) calc.Add(request, options, (e) => onResult(e))
      else calc.Add(request, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    } else if (method < 70) {
      const request = { data: 'y'.repeat(rng.int(100)) }
      if (form === 0) calc.Echo(request, options, (e) => onResult(e))
      else calc.Echo(request, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    } else if (method < 80) {
      // Now and then a sidecar too large to copy into the frame: it is written as its own slice.
      options.sidecars = [Buffer.alloc(rng.chance(0.05) ? rng.range(64 * 1024, 400 * 1024) : rng.int(200), 7), Buffer.alloc(rng.int(50), 9)]
      const request = { sidecar_indexes: [0, 1] }
      if (form === 0) calc.PushStrings(request, options, (e) => onResult(e))
      else calc.PushStrings(request, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    } else {
      options.sidecars = Array.from({ length: rng.int(3) }, () => Buffer.alloc(rng.int(300), 5))
      // The result form: the response's sidecars come with it.
      client.call(`${HOST}:${this.#port}`, CalculatorService as unknown as ServiceDef, 'EchoSidecars', {}, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    }
    returned = true
  }

  #checkStuck (): void {
    const now = Date.now()
    for (const [id, record] of this.#pending) {
      if (record.reported || now < record.deadline + SETTLE_GRACE_MS) continue
      record.reported = true
      this.fail('never settled', `call ${id} still pending ${now - record.deadline} ms after its deadline`)
    }
  }

  /** Waits for every call to settle (failing those that do not in time), then checks each client still calls a real server. */
  async finish (realEndpoint: string | null): Promise<boolean> {
    const deadline = Date.now() + CLIENT_TIMEOUT_MS * 2 + SETTLE_GRACE_MS
    while (this.#pending.size > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20))
    for (const [id] of this.#pending) {
      this.neverSettled++
      this.fail('never settled', `call ${id} never settled`)
    }
    this.#pending.clear()
    for (const [i, client] of this.#clients.entries()) {
      if (client.pendingCalls > 0) this.fail('client leak', `client ${i} still holds ${client.pendingCalls} calls after every call settled`)
    }
    if (realEndpoint === null) return false
    let works = true
    for (const [i, client] of this.#clients.entries()) {
      this.realServerCalls++
      try {
        const res = await client.service(CalculatorService, realEndpoint).Add({ x: 40, y: i }, { timeoutMs: 10_000 })
        if (res.result !== 40 + i) works = false
      } catch (err) {
        works = false
        this.fail('client broken after the run', `client ${i}: ${(err as Error).message}`)
      }
    }
    return works
  }

  async close (): Promise<void> {
    for (const client of this.#clients) client.close()
    for (const conn of this.conns) conn.socket.destroy()
    await new Promise<void>((resolve) => this.#net.close(() => resolve()))
  }
}

function outcomeOf (error: unknown): string {
  if (error instanceof RpcError) return error.remote?.code !== undefined ? `REMOTE:${krpcCodeName(error.remote?.code)}` : error.code
  return `THROWN:${error instanceof Error ? error.message : String(error)}`
}

// ---------------------------------------------------------------------------
// A run.

/** Runs the fuzzer; resolves with the tallies (failures included, never thrown). */
export async function runFuzz (options: FuzzOptions): Promise<FuzzResult> {
  const started = Date.now()
  const seed = (options.seed ?? 1) >>> 0
  const log = options.log ?? (() => {})
  const clientShare = Math.min(1, Math.max(0, options.clientShare ?? 0.3))
  const clientTarget = Math.round(options.mutants * clientShare)
  const serverTarget = options.mutants - clientTarget
  const mode = options.server ?? 'child'
  const failures: FuzzFailure[] = []
  let failureCount = 0
  // Set when the server crashed: what follows (refused connections) is not news.
  let crashSuspects: number[] | null = null
  const fail = (f: FuzzFailure): void => {
    if (crashSuspects !== null && f.kind !== 'server crash') return
    failureCount++
    if (failures.length < MAX_FAILURES_KEPT) failures.push(f)
    if (failureCount <= 5) log(`FAILURE ${f.kind}: ${f.detail}${f.episode === undefined ? '' : ` (seed ${f.seed}, episode ${f.episode}, batch ${f.batch})`}`)
  }
  const crashes: string[] = []
  let onServerCrash = (): void => {}
  const onUncaught = (err: unknown): void => {
    crashes.push(`${mode === 'in-process' ? 'fuzzer process (server in it)' : 'fuzzer process'}: ${(err as Error)?.stack ?? String(err)}`)
    if (mode === 'in-process') onServerCrash()
  }
  const onRejection = (err: unknown): void => { crashes.push(`fuzzer process, unhandled rejection: ${(err as Error)?.stack ?? String(err)}`) }
  process.on('uncaughtException', onUncaught)
  process.on('unhandledRejection', onRejection)

  const server = mode === 'child' ? await startChild(options.execArgv ?? process.execArgv) : await startInProcess()
  const endpoint = `${HOST}:${server.port}`
  const pool = new Rng(mix(seed, 0x9001)).bytes(1 << 18)
  const serverSide = new ServerSide(seed, server.port, pool, new Set(options.foundBugs ?? FOUND_BUGS), fail)
  const clientSide = new ClientSide(seed, fail)
  await clientSide.start()
  onServerCrash = () => {
    if (crashSuspects !== null) return
    crashSuspects = [...serverSide.inFlight].sort((a, b) => a - b)
    serverSide.stop()
    clientSide.stop()
  }
  server.onCrash = onServerCrash

  // A good client keeps calling the server through the run.
  const probeClient = new Client({ endpoint })
  const probes = { ok: 0, failed: 0 }
  let probeCalls = 0
  let probing = true
  const probeLoop = (async () => {
    for (let i = 0; probing; i++) {
      probeCalls++
      try {
        const res = await probeClient.service(CalculatorService).Add({ x: i, y: 1 }, { timeoutMs: 15_000 })
        if (res.result === i + 1) probes.ok++
        else { probes.failed++; fail({ kind: 'probe', detail: `wrong Add result ${res.result}`, seed }) }
      } catch (err) {
        probes.failed++
        fail({ kind: 'probe', detail: `a normal Add failed during the run: ${(err as Error).message}`, seed })
      }
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
  })()

  let stoppedEarly = false
  const maxMs = (options.maxSeconds ?? 3600) * 1000
  const watchdog = setInterval(() => {
    if (server.crashed !== null || crashes.length > 0 || Date.now() - started > maxMs) {
      if (server.crashed === null && crashes.length === 0) stoppedEarly = true
      serverSide.stop()
      clientSide.stop()
    }
  }, 250)
  // Progress, with both processes' RSS: memory that keeps growing over a long run is a leak.
  const progress = setInterval(() => {
    const total = serverSide.mutants + clientSide.mutants
    void server.report().catch(() => null).then((r) => {
      log(`${total.toLocaleString('en-US')} mutants (server ${serverSide.mutants.toLocaleString('en-US')}, client ${clientSide.mutants.toLocaleString('en-US')}), ` +
        `${serverSide.episodes.toLocaleString('en-US')} episodes, ${clientSide.calls.toLocaleString('en-US')} client calls, failures ${failureCount}, ` +
        `RSS server ${r === null ? '?' : mib(r.rssBytes / 1024)} fuzzer ${mib(process.memoryUsage().rss / 1024)}, ${Math.round((Date.now() - started) / 1000)} s`)
    })
  }, 10_000)

  await Promise.all([serverSide.run(serverTarget, options.concurrency ?? 32), clientSide.run(clientTarget, options.clientConcurrency ?? 64)])
  clearInterval(watchdog)
  clearInterval(progress)
  probing = false
  await probeLoop

  const crashed = (): boolean => crashSuspects !== null
  const stillWork = await clientSide.finish(crashed() ? null : endpoint)
  let finalOk = false
  if (!crashed()) {
    // The server still answers a normal Add after the run.
    const after = new Client({ endpoint })
    try {
      finalOk = (await after.service(CalculatorService).Add({ x: 40, y: 2 }, { timeoutMs: 15_000 })).result === 42
    } catch (err) {
      fail({ kind: 'probe', detail: `Add after the run failed: ${(err as Error).message}`, seed })
    }
    after.close()
    if (!finalOk) probes.failed++
    else probes.ok++
  }
  probeClient.close()
  await clientSide.close()
  for (const s of serverSide.sockets) s.destroy()

  // Closed connections reach the server's books a moment after they close here.
  let report: ServerReport | null = null
  for (let i = 0; i < 100 && !crashed(); i++) {
    report = await server.report().catch(() => null)
    if (report === null || (report.stats.connectionsOpen === 0 && report.stats.callsInFlight === 0)) break
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const final = await server.close().catch(() => report)
  if (report !== null && (report.stats.connectionsOpen !== 0 || report.stats.callsInFlight !== 0)) {
    fail({ kind: 'server leak', detail: `${report.stats.connectionsOpen} connections and ${report.stats.callsInFlight} calls left open on the server after every peer closed`, seed })
  }
  const serverCalls = report?.stats.callsReceived ?? 0
  // The probes, the Add after the run, and the fuzzed clients' calls to the real server.
  const extraCalls = probeCalls + 1 + clientSide.realServerCalls
  if (report !== null && !crashed() && serverCalls !== serverSide.callsAccepted + extraCalls) {
    fail({ kind: 'call count', detail: `the server received ${serverCalls} calls; the model accepted ${serverSide.callsAccepted} (+${extraCalls} normal calls)`, seed })
  }
  if ((report?.unauthenticatedCalls ?? 0) > 0) {
    const episodes = serverSide.refusalEpisodes.length > 0 ? `; episodes with calls behind a refused SASL step: ${serverSide.refusalEpisodes.join(', ')}` : ''
    fail({ kind: 'unauthenticated calls', detail: `${report!.unauthenticatedCalls} calls reached a handler on connections whose negotiation failed${episodes}`, seed })
  }
  if (server.crashed !== null) crashes.push(`server: ${server.crashed}`)
  if (crashSuspects !== null) {
    // Which episode did it: each one running at the crash, alone, against a fresh server.
    const suspects: number[] = crashSuspects
    crashSuspects = null
    const found = await locateCrash(seed, suspects, options, log)
    if (found !== null) fail(found)
    crashSuspects = suspects
  }
  // Give socket handles a turn to go.
  await new Promise((resolve) => setImmediate(resolve))
  process.off('uncaughtException', onUncaught)
  process.off('unhandledRejection', onRejection)
  const openSocketsAtEnd = serverSide.sockets.size + clientSide.conns.size
  const fuzzerPeak = process.resourceUsage().maxRSS
  const clientMutants = clientSide.mutants
  return {
    seed,
    mutants: { total: serverSide.mutants + clientMutants, serverFrames: serverSide.mutantsFrames, negotiation: serverSide.mutantsNegotiation, client: clientMutants },
    server: {
      mode,
      episodes: serverSide.episodes,
      batches: serverSide.batches,
      callsPredicted: serverSide.callsPredicted,
      callsAnsweredOnce: serverSide.callsAnsweredOnce,
      answersDroppedAtClose: serverSide.answersDroppedAtClose,
      closedAsPredicted: serverSide.closedAsPredicted,
      closedWhileWaiting: serverSide.closedWhileWaiting,
      badFramesClosed: final?.stats.badFrames ?? 0,
      badFramesModel: serverSide.badFramesModel,
      callsReceived: serverCalls,
      callsReceivedModel: serverSide.callsAccepted + extraCalls,
      unauthenticatedCalls: final?.unauthenticatedCalls ?? 0,
      probes,
      answersAfterRun: finalOk,
      connectionsOpenAtEnd: report?.stats.connectionsOpen ?? -1,
      callsInFlightAtEnd: report?.stats.callsInFlight ?? -1
    },
    client: {
      calls: clientSide.calls,
      settledOnce: clientSide.settledOnce,
      settledTwice: clientSide.settledTwice,
      settledBeforeReturn: clientSide.settledBeforeReturn,
      neverSettled: clientSide.neverSettled,
      outcomes: clientSide.outcomes,
      fakeConnections: clientSide.fakeConnections,
      stalledClosed: clientSide.stalledClosed,
      clientsClosed: clientSide.clientsClosed,
      stillWork
    },
    crashes: { count: crashes.length, details: crashes.slice(0, 5) },
    failures,
    failureCount,
    rss: { serverPeakKiB: final?.maxRssKiB ?? 0, fuzzerPeakKiB: fuzzerPeak, serverEndBytes: final?.rssBytes ?? 0 },
    cpuMs: { server: final?.cpuMs ?? 0, fuzzer: Math.round((process.cpuUsage().user + process.cpuUsage().system) / 1000) },
    openSocketsAtEnd,
    stoppedEarly,
    wallMs: Date.now() - started
  }
}

/** Replays each suspect episode alone against a fresh server; the first that crashes it, with its bytes. */
async function locateCrash (seed: number, suspects: readonly number[], options: FuzzOptions, log: (line: string) => void): Promise<FuzzFailure | null> {
  const pool = new Rng(mix(seed, 0x9001)).bytes(1 << 18)
  for (const index of suspects.slice(0, 64)) {
    const server = options.server === 'in-process' ? await startInProcess() : await startChild(options.execArgv ?? process.execArgv)
    let bytes = ''
    let thrown: string | null = null
    const onUncaught = (err: unknown): void => { thrown = (err as Error)?.stack ?? String(err) }
    if (options.server === 'in-process') process.on('uncaughtException', onUncaught)
    const side = new ServerSide(seed, server.port, pool, new Set(options.foundBugs ?? FOUND_BUGS), (f) => { bytes = f.bytesHex ?? bytes })
    await side.episode(index).catch(() => {})
    await new Promise((resolve) => setTimeout(resolve, 200))
    process.off('uncaughtException', onUncaught)
    const crash: string | null = server.crashed ?? thrown
    if (server.crashed === null) await server.close().catch(() => null)
    if (crash !== null) {
      log(`the server crash is episode ${index} of seed ${seed}`)
      return { kind: 'server crash', detail: `${crash.split('\n').slice(0, 3).join(' | ')}`, seed, episode: index, batch: -1, bytesHex: bytes }
    }
  }
  return { kind: 'server crash', detail: `not reproduced by any of the ${suspects.length} episodes running at the time, each alone`, seed }
}

/** Sends episode `index` of `seed` alone to a fresh server and prints what it wrote and what came back. */
export async function replayEpisode (seed: number, index: number, options: { foundBugs?: readonly FoundBug[], server?: 'child' | 'in-process' } = {}): Promise<number> {
  const failures: FuzzFailure[] = []
  const server = options.server === 'in-process' ? await startInProcess() : await startChild(process.execArgv)
  const pool = new Rng(mix(seed >>> 0, 0x9001)).bytes(1 << 18)
  const side = new ServerSide(seed >>> 0, server.port, pool, new Set(options.foundBugs ?? FOUND_BUGS), (f) => failures.push(f))
  const out = (line: string): void => { process.stdout.write(`${line}\n`) }
  const written = await side.episode(index, out)
  await new Promise((resolve) => setTimeout(resolve, 200))
  const crashed = server.crashed
  if (crashed === null) {
    const report = await server.close()
    out(`server: ${JSON.stringify(report.stats)}; unauthenticated calls ${report.unauthenticatedCalls}`)
    if (report.stats.callsReceived !== side.callsAccepted) {
      failures.push({ kind: 'call count', detail: `the server received ${report.stats.callsReceived} calls; the model accepted ${side.callsAccepted}`, seed, episode: index })
    }
    if (report.unauthenticatedCalls > 0) {
      failures.push({ kind: 'unauthenticated calls', detail: `${report.unauthenticatedCalls} calls reached a handler on a connection whose negotiation failed`, seed, episode: index })
    }
  }
  out(`bytes written (hex): ${written.toString('hex')}`)
  for (const f of failures) out(`FAILURE ${f.kind}: ${f.detail}`)
  if (failures.length === 0 && crashed === null) out('no failure')
  if (crashed !== null) out(`SERVER CRASHED: ${crashed}`)
  return failures.length > 0 || crashed !== null ? 1 : 0
}

function mib (kib: number): string {
  return `${(kib / 1024).toFixed(1)} MiB`
}

/** The report of a run, as the CLI prints it. */
export function formatResult (r: FuzzResult): string {
  const n = (x: number): string => x.toLocaleString('en-US')
  const lines = [
    `nyala fuzz: seed ${r.seed}, ${n(r.mutants.total)} mutants (server: ${n(r.mutants.serverFrames)} frames + ${n(r.mutants.negotiation)} handshakes; client: ${n(r.mutants.client)} answers), ${(r.wallMs / 1000).toFixed(1)} s${r.stoppedEarly ? ' (stopped early)' : ''}`,
    `crashes: ${r.crashes.count}${r.crashes.details.map(d => `\n  ${d}`).join('')}`,
    `server (${r.server.mode}): ${n(r.server.episodes)} connections, ${n(r.server.batches)} batches; calls answered exactly once ${n(r.server.callsAnsweredOnce)} of ${n(r.server.callsPredicted)} predicted ` +
      `(${n(r.server.answersDroppedAtClose)} dropped with a connection closed for a bad frame of the same read); a normal Add answered after the run: ${r.server.answersAfterRun ? 'yes' : 'NO'}`,
    `  closed as predicted ${n(r.server.closedAsPredicted)}, closed while waiting for bytes ${n(r.server.closedWhileWaiting)}; bad frames closed ${n(r.server.badFramesClosed)} (model ${n(r.server.badFramesModel)}); ` +
      `calls received ${n(r.server.callsReceived)} (model ${n(r.server.callsReceivedModel)}); unauthenticated calls ${n(r.server.unauthenticatedCalls)}`,
    `  normal Add probes ${n(r.server.probes.ok)} ok, ${n(r.server.probes.failed)} failed; at the end ${r.server.connectionsOpenAtEnd} connections open, ${r.server.callsInFlightAtEnd} calls in flight`,
    `client: ${n(r.client.calls)} calls over ${n(r.client.fakeConnections)} fake-server connections (${n(r.client.stalledClosed)} closed on a stalled frame), ` +
      `${n(r.client.clientsClosed)} clients closed mid-run; settled exactly once ${n(r.client.settledOnce)}, twice ${n(r.client.settledTwice)}, ` +
      `before returning ${n(r.client.settledBeforeReturn)}, never ${n(r.client.neverSettled)}; still work ${r.client.stillWork ? 'yes' : 'NO'}`,
    `  outcomes: ${Object.entries(r.client.outcomes).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${n(v)}`).join(', ')}`,
    `peak RSS: server ${mib(r.rss.serverPeakKiB)}${r.server.mode === 'in-process' ? ' (same process)' : ''}, fuzzer ${mib(r.rss.fuzzerPeakKiB)}; server RSS at the end ${mib(r.rss.serverEndBytes / 1024)}`,
    `CPU: server ${(r.cpuMs.server / 1000).toFixed(1)} s, fuzzer ${(r.cpuMs.fuzzer / 1000).toFixed(1)} s${r.server.mode === 'in-process' ? ' (one process)' : ''}`,
    `sockets open at the end: ${r.openSocketsAtEnd}`,
    `failures: ${r.failureCount}`
  ]
  for (const f of r.failures) {
    const where = f.episode !== undefined ? ` [seed ${f.seed} episode ${f.episode} batch ${f.batch}: --replay-episode ${f.episode} --seed ${f.seed}]` : f.connection !== undefined ? ` [seed ${f.seed} fake connection ${f.connection}]` : ''
    lines.push(`  ${f.kind}: ${f.detail}${where}`)
    if (f.bytesHex !== undefined) lines.push(`    bytes: ${f.bytesHex.slice(0, 600)}${f.bytesHex.length > 600 ? '…' : ''}`)
  }
  return lines.join('\n')
}

async function main (): Promise<number> {
  const { values } = parseArgs({
    options: {
      mutants: { type: 'string', default: '10000' },
      seed: { type: 'string', default: '1' },
      json: { type: 'boolean', default: false },
      concurrency: { type: 'string' },
      'client-concurrency': { type: 'string' },
      'client-share': { type: 'string' },
      'in-process': { type: 'boolean', default: false },
      'max-seconds': { type: 'string' },
      'found-bugs': { type: 'string', default: 'all' },
      'replay-episode': { type: 'string' }
    },
    strict: true
  })
  const seed = Number(values.seed)
  if (!Number.isInteger(seed)) throw new Error(`--seed must be an integer, got '${values.seed}'`)
  const names = values['found-bugs'] === 'all' ? FOUND_BUGS : values['found-bugs'].split(',').filter(b => b !== '')
  for (const b of names) if (!(FOUND_BUGS as readonly string[]).includes(b)) throw new Error(`unknown --found-bugs entry '${b}'; known: ${FOUND_BUGS.join(', ')}, all`)
  const foundBugs = names as FoundBug[]
  if (values['replay-episode'] !== undefined) {
    return await replayEpisode(seed, Number(values['replay-episode']), { foundBugs, server: values['in-process'] ? 'in-process' : 'child' })
  }
  const mutants = Number(values.mutants)
  if (!Number.isInteger(mutants) || mutants < 0) throw new Error(`--mutants must be a non-negative integer, got '${values.mutants}'`)
  const num = (v: string | undefined): number | undefined => v === undefined ? undefined : Number(v)
  const result = await runFuzz({
    mutants,
    seed,
    concurrency: num(values.concurrency),
    clientConcurrency: num(values['client-concurrency']),
    clientShare: num(values['client-share']),
    server: values['in-process'] ? 'in-process' : 'child',
    maxSeconds: num(values['max-seconds']),
    foundBugs,
    log: values.json ? undefined : (line) => process.stderr.write(`${line}\n`)
  })
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatResult(result)}\n`)
  const ok = result.crashes.count === 0 && result.failureCount === 0
  return ok ? 0 : 1
}

const entry = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]
if (process.argv[2] === '--server-child') {
  await serverChild()
} else if (entry) {
  process.exitCode = await main()
}
