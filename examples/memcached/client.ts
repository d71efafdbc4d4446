/**
 * A memcached client speaking the binary protocol, on nyala's generic
 * `ProtocolClient`: answers are matched to requests by the header's opaque
 * (the client's per-connection id), so they may come in any order, and
 * the quiet commands (GETQ, SETQ, …) send nothing on success: such a call
 * settles when the answer to a later request on its connection arrives
 * (the client sends a NOOP after them when nothing else follows in the
 * same turn), or with its error when the server sends one.
 *
 *   const mc = new MemcachedClient({ endpoint: '127.0.0.1:11211', connectionsPerEndpoint: 4 })
 *   await mc.set('k', 'v', { flags: 7, expiry: 60 })
 *   const item = await mc.get('k') // { value: <Buffer 76>, flags: 7, cas: 1n } or null
 *
 * STAT is a streamed answer (one packet per statistic, then an empty one):
 * `stats(group?)` gathers it into a Map.
 *
 * Errors the server answers reject with an RpcError of code RPC_ERR_REMOTE
 * whose `remote` is { protocol: 'memcached', code: the status,
 * name: KEY_EEXISTS, NOT_STORED, … }; a miss is not an error where the
 * command has a natural "nothing" (get: null, delete and touch: false).
 */
import type { AnswerPart, ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { ProtocolClient, type ProtocolCallOptions, type ProtocolClientOptions } from '../../reactor/index.js'
import { HEADER_BYTES, Opcode, ResponseStatus } from './protocol.js'

const REQUEST_MAGIC = 0x80
const RESPONSE_MAGIC = 0x81
const EMPTY = Buffer.alloc(0)
/** Values above this go out as their own slice (writev, no copy). */
const SLICE_VALUE_BYTES = 16 * 1024
const NO_EXPIRY_CREATE = 0xffffffff

const STATUS_NAME: ReadonlyMap<number, string> = new Map(Object.entries(ResponseStatus).map(([name, code]) => [code, name]))

// Commands whose answer says "no such key" as a result, not an error.
const MISS_IS_RESULT: ReadonlySet<number> = new Set([Opcode.GET, Opcode.GETQ, Opcode.GETK, Opcode.GETKQ, Opcode.DELETE, Opcode.TOUCH, Opcode.GAT])
// Quiet commands: no answer on success (quiet gets: on a miss); errors are answered.
const QUIET: ReadonlySet<number> = new Set([Opcode.GETQ, Opcode.GETKQ, Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ, Opcode.DELETEQ,
  Opcode.INCREMENTQ, Opcode.DECREMENTQ, Opcode.APPENDQ, Opcode.PREPENDQ, Opcode.FLUSHQ])
// Safe to send again after a lost connection: they change nothing (STAT
// reset zeroes counters, which twice is as once). A streamed STAT is not
// repeated once part of it has come, whatever this says.
const IDEMPOTENT: ReadonlySet<number> = new Set([Opcode.GET, Opcode.GETQ, Opcode.GETK, Opcode.GETKQ, Opcode.NOOP, Opcode.VERSION, Opcode.STAT])

/** One request. `extras` says which extras the opcode carries. */
export class MemcachedCommand {
  readonly opcode: number
  readonly key: Buffer
  readonly value: Buffer
  readonly flags: number
  readonly exptime: number
  readonly cas: bigint
  readonly delta: bigint
  readonly initial: bigint
  /** FLUSH: a delay was given (4 bytes of extras). */
  readonly hasDelay: boolean

  constructor (opcode: number, key: Buffer = EMPTY, value: Buffer = EMPTY, options: { flags?: number, exptime?: number, cas?: bigint, delta?: bigint, initial?: bigint, hasDelay?: boolean } = {}) {
    this.opcode = opcode
    this.key = key
    this.value = value
    this.flags = options.flags ?? 0
    this.exptime = options.exptime ?? 0
    this.cas = options.cas ?? 0n
    this.delta = options.delta ?? 0n
    this.initial = options.initial ?? 0n
    this.hasDelay = options.hasDelay ?? false
  }
}

/** A successful answer (or a miss, for the commands where one is a result). */
export class MemcachedAnswer {
  readonly status: number
  readonly cas: bigint
  /** The item's flags (extras of get hits); 0 when none. */
  readonly flags: number
  /** The answer's value: a view of the received frame. */
  readonly value: Buffer

  constructor (status: number, cas: bigint, flags: number, value: Buffer) {
    this.status = status
    this.cas = cas
    this.flags = flags
    this.value = value
  }
}

/** What a quiet command that got no answer settles with. */
const SILENT = new MemcachedAnswer(-1, 0n, 0, EMPTY)

function extrasBytesOf (command: MemcachedCommand): number {
  switch (command.opcode) {
    case Opcode.SET: case Opcode.SETQ: case Opcode.ADD: case Opcode.ADDQ: case Opcode.REPLACE: case Opcode.REPLACEQ:
      return 8
    case Opcode.INCREMENT: case Opcode.INCREMENTQ: case Opcode.DECREMENT: case Opcode.DECREMENTQ:
      return 20
    case Opcode.TOUCH: case Opcode.GAT: case Opcode.GATQ:
      return 4
    case Opcode.FLUSH: case Opcode.FLUSHQ:
      return command.hasDelay ? 4 : 0
    default:
      return 0
  }
}

// The header and extras of `command` at out[at]; returns where the key goes.
function writeHead (command: MemcachedCommand, id: number, out: Buffer, at: number): number {
  const extras = extrasBytesOf(command)
  out[at] = REQUEST_MAGIC
  out[at + 1] = command.opcode
  out.writeUInt16BE(command.key.length, at + 2)
  out[at + 4] = extras
  out[at + 5] = 0
  out.writeUInt16BE(0, at + 6)
  out.writeUInt32BE(extras + command.key.length + command.value.length, at + 8)
  out.writeUInt32BE(id, at + 12)
  out.writeBigUInt64BE(command.cas, at + 16)
  let p = at + HEADER_BYTES
  switch (extras) {
    case 8:
      out.writeUInt32BE(command.flags >>> 0, p)
      out.writeUInt32BE(command.exptime >>> 0, p + 4)
      break
    case 20:
      out.writeBigUInt64BE(command.delta, p)
      out.writeBigUInt64BE(command.initial, p + 8)
      out.writeUInt32BE(command.exptime >>> 0, p + 16)
      break
    case 4:
      out.writeUInt32BE(command.exptime >>> 0, p)
      break
  }
  p += extras
  command.key.copy(out, p)
  return p + command.key.length
}

/** The binary protocol, client side. */
export function memcachedClientProtocol (): ClientProtocol<MemcachedCommand, MemcachedAnswer> {
  return {
    name: 'memcached',
    framing: {
      prefixBytes: HEADER_BYTES,
      frameBytes: (buf, offset) => buf[offset] !== RESPONSE_MAGIC
        ? new RpcError(ErrorCode.MALFORMED_FRAME, `bad magic 0x${buf[offset]!.toString(16)}: not a memcached binary response`)
        : HEADER_BYTES + buf.readUInt32BE(offset + 8)
    },
    matching: 'id',
    encode (command, id, out): void {
      const headBytes = HEADER_BYTES + extrasBytesOf(command) + command.key.length
      const value = command.value
      if (value.length > SLICE_VALUE_BYTES) {
        // A large value goes out as it is, without a copy.
        const at = out.reserve(headBytes)
        writeHead(command, id, out.buffer, at)
        out.append(value)
        return
      }
      const at = out.reserve(headBytes + value.length)
      const buf = out.buffer
      value.copy(buf, writeHead(command, id, buf, at))
    },
    answerId: (buf, start) => buf.readUInt32BE(start + 12),
    answerOf: (command) => command.opcode === Opcode.STAT ? 'stream' : QUIET.has(command.opcode) ? 'maybe' : 'yes',
    silentResult: () => SILENT,
    flushRequest: () => new MemcachedCommand(Opcode.NOOP),
    // Answered in order after what the server is still working on: its answer, or any other, proves the server alive.
    ping: () => new MemcachedCommand(Opcode.NOOP),
    decodeAnswer (command, buf, start, end): MemcachedAnswer | RpcError {
      const extras = buf[start + 4]!
      const keyBytes = buf.readUInt16BE(start + 2)
      const status = buf.readUInt16BE(start + 6)
      if (HEADER_BYTES + extras + keyBytes > end - start) return bodyTooShort()
      const cas = buf.readBigUInt64BE(start + 16)
      const value = buf.subarray(start + HEADER_BYTES + extras + keyBytes, end)
      if (status === ResponseStatus.SUCCESS || (status === ResponseStatus.KEY_ENOENT && MISS_IS_RESULT.has(command.opcode))) {
        const flags = extras >= 4 ? buf.readUInt32BE(start + HEADER_BYTES) : 0
        return new MemcachedAnswer(status, cas, flags, value)
      }
      return remoteError(status, value)
    },
    // STAT: a packet per statistic (its name in the key, its value in the
    // value), then one with no key, which ends the answer; an error (an
    // unknown group: KEY_ENOENT) is a single packet.
    decodePart (_command, buf, start, end): AnswerPart | RpcError {
      const extras = buf[start + 4]!
      const keyBytes = buf.readUInt16BE(start + 2)
      const status = buf.readUInt16BE(start + 6)
      const keyStart = start + HEADER_BYTES + extras
      if (keyStart + keyBytes > end) return bodyTooShort()
      if (status !== ResponseStatus.SUCCESS) return remoteError(status, buf.subarray(keyStart + keyBytes, end))
      if (keyBytes === 0) return STAT_END
      return { value: [buf.toString('latin1', keyStart, keyStart + keyBytes), buf.toString('latin1', keyStart + keyBytes, end)], last: false }
    },
    retryable: (error, command) => error.remote !== undefined
      ? error.remote.code === ResponseStatus.EBUSY || error.remote.code === ResponseStatus.ETMPFAIL
      : IDEMPOTENT.has(command.opcode)
  }
}

const STAT_END: AnswerPart = Object.freeze({ value: undefined, last: true })

function bodyTooShort (): RpcError {
  return new RpcError(ErrorCode.MALFORMED_FRAME, 'memcached answer whose extras and key are longer than its body')
}

function remoteError (status: number, value: Buffer): RpcError {
  const name = STATUS_NAME.get(status) ?? `0x${status.toString(16)}`
  return new RpcError(ErrorCode.REMOTE, value.toString('latin1') || name, { remote: { protocol: 'memcached', code: status, name, fatal: false } })
}

/** An item as `get` returns it. */
export interface MemcachedItem {
  value: Buffer
  flags: number
  cas: bigint
}

export interface StoreOptions {
  flags?: number
  /** Seconds (up to 30 days), or a Unix time; 0: never. */
  expiry?: number
  /** Store only if the item's CAS is still this. */
  cas?: bigint
}

export interface CounterOptions {
  /** The value of a key created by this command; without it a missing key fails with KEY_ENOENT. */
  initial?: bigint | number
  /** The expiry of a key created. */
  expiry?: number
}

/** `ProtocolClientOptions`: with `tls` (node:tls connection options: ca, cert, key, servername) every connection is TLS. */
export type MemcachedClientOptions = ProtocolClientOptions

type Key = string | Buffer
type Value = string | Uint8Array

function keyOf (key: Key): Buffer {
  return typeof key === 'string' ? Buffer.from(key) : key
}

function valueOf (value: Value): Buffer {
  return typeof value === 'string' ? Buffer.from(value) : Buffer.isBuffer(value) ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength)
}

function item (answer: MemcachedAnswer): MemcachedItem | null {
  if (answer.status !== ResponseStatus.SUCCESS) return null
  // A copy: the answer's view pins the whole read chunk.
  return { value: Buffer.from(answer.value), flags: answer.flags, cas: answer.cas }
}

/** memcached's commands over a `ProtocolClient` (see the module comment). */
export class MemcachedClient {
  readonly client: ProtocolClient<MemcachedCommand, MemcachedAnswer>

  constructor (options: MemcachedClientOptions) {
    this.client = new ProtocolClient(memcachedClientProtocol(), options)
  }

  /** The item, or null on a miss. */
  async get (key: Key, options?: ProtocolCallOptions): Promise<MemcachedItem | null> {
    return item(await this.client.call(new MemcachedCommand(Opcode.GET, keyOf(key)), options))
  }

  /** GETQ: the item, or null on a miss (settled when a later answer proves the miss). */
  async getq (key: Key, options?: ProtocolCallOptions): Promise<MemcachedItem | null> {
    const answer = await this.client.call(new MemcachedCommand(Opcode.GETQ, keyOf(key)), options)
    return answer === SILENT ? null : item(answer)
  }

  /** Stores the value; resolves with the new CAS. */
  set (key: Key, value: Value, options: StoreOptions = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return this.#store(Opcode.SET, key, value, options, call)
  }

  /** Stores only if the key is absent (else KEY_EEXISTS). */
  add (key: Key, value: Value, options: StoreOptions = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return this.#store(Opcode.ADD, key, value, options, call)
  }

  /** Stores only if the key is present (else KEY_ENOENT). */
  replace (key: Key, value: Value, options: StoreOptions = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return this.#store(Opcode.REPLACE, key, value, options, call)
  }

  /** Appends to the present value (else NOT_STORED); resolves with the new CAS. */
  async append (key: Key, value: Value, options: { cas?: bigint } = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return (await this.client.call(new MemcachedCommand(Opcode.APPEND, keyOf(key), valueOf(value), { cas: options.cas }), call)).cas
  }

  async prepend (key: Key, value: Value, options: { cas?: bigint } = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return (await this.client.call(new MemcachedCommand(Opcode.PREPEND, keyOf(key), valueOf(value), { cas: options.cas }), call)).cas
  }

  /** True when deleted, false when there was no such key. */
  async delete (key: Key, options: { cas?: bigint } = {}, call?: ProtocolCallOptions): Promise<boolean> {
    const answer = await this.client.call(new MemcachedCommand(Opcode.DELETE, keyOf(key), EMPTY, { cas: options.cas }), call)
    return answer.status === ResponseStatus.SUCCESS
  }

  /** Adds `delta` to a counter; resolves with its new value. */
  incr (key: Key, delta: bigint | number = 1n, options: CounterOptions = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return this.#counter(Opcode.INCREMENT, key, delta, options, call)
  }

  /** Subtracts `delta` (stopping at 0); resolves with the new value. */
  decr (key: Key, delta: bigint | number = 1n, options: CounterOptions = {}, call?: ProtocolCallOptions): Promise<bigint> {
    return this.#counter(Opcode.DECREMENT, key, delta, options, call)
  }

  /** Sets a new expiry; false when there is no such key. */
  async touch (key: Key, expiry: number, call?: ProtocolCallOptions): Promise<boolean> {
    const answer = await this.client.call(new MemcachedCommand(Opcode.TOUCH, keyOf(key), EMPTY, { exptime: expiry }), call)
    return answer.status === ResponseStatus.SUCCESS
  }

  /** Invalidates every item, now or after `delay` seconds. */
  async flush (delay?: number, call?: ProtocolCallOptions): Promise<void> {
    await this.client.call(new MemcachedCommand(Opcode.FLUSH, EMPTY, EMPTY, { exptime: delay ?? 0, hasDelay: delay !== undefined }), call)
  }

  async version (call?: ProtocolCallOptions): Promise<string> {
    return (await this.client.call(new MemcachedCommand(Opcode.VERSION), call)).value.toString('latin1')
  }

  async noop (call?: ProtocolCallOptions): Promise<void> {
    await this.client.call(new MemcachedCommand(Opcode.NOOP), call)
  }

  /**
   * STAT: the server's statistics of `group` (none: the general ones;
   * `settings`, `items`, `slabs`, ... as the server knows them; `reset`
   * zeroes the counters and gives an empty map), by name, in the order
   * sent. A group the server does not know rejects with KEY_ENOENT.
   */
  async stats (group?: string, call?: ProtocolCallOptions): Promise<Map<string, string>> {
    const command = new MemcachedCommand(Opcode.STAT, group === undefined || group === '' ? EMPTY : Buffer.from(group, 'latin1'))
    // A stream call resolves with its parts' values: here, [name, value] pairs.
    const parts = await this.client.call(command, call) as unknown as Array<[string, string]>
    return new Map(parts)
  }

  // The quiet variants: nothing on success; an error answer rejects.
  async setq (key: Key, value: Value, options: StoreOptions = {}, call?: ProtocolCallOptions): Promise<void> {
    await this.#store(Opcode.SETQ, key, value, options, call)
  }

  async addq (key: Key, value: Value, options: StoreOptions = {}, call?: ProtocolCallOptions): Promise<void> {
    await this.#store(Opcode.ADDQ, key, value, options, call)
  }

  async replaceq (key: Key, value: Value, options: StoreOptions = {}, call?: ProtocolCallOptions): Promise<void> {
    await this.#store(Opcode.REPLACEQ, key, value, options, call)
  }

  async appendq (key: Key, value: Value, call?: ProtocolCallOptions): Promise<void> {
    await this.client.call(new MemcachedCommand(Opcode.APPENDQ, keyOf(key), valueOf(value)), call)
  }

  async prependq (key: Key, value: Value, call?: ProtocolCallOptions): Promise<void> {
    await this.client.call(new MemcachedCommand(Opcode.PREPENDQ, keyOf(key), valueOf(value)), call)
  }

  /** DELETEQ: a missing key is answered, as an error (KEY_ENOENT). */
  async deleteq (key: Key, call?: ProtocolCallOptions): Promise<void> {
    await this.client.call(new MemcachedCommand(Opcode.DELETEQ, keyOf(key)), call)
  }

  async incrq (key: Key, delta: bigint | number = 1n, options: CounterOptions = {}, call?: ProtocolCallOptions): Promise<void> {
    await this.#counter(Opcode.INCREMENTQ, key, delta, options, call)
  }

  async decrq (key: Key, delta: bigint | number = 1n, options: CounterOptions = {}, call?: ProtocolCallOptions): Promise<void> {
    await this.#counter(Opcode.DECREMENTQ, key, delta, options, call)
  }

  async flushq (call?: ProtocolCallOptions): Promise<void> {
    await this.client.call(new MemcachedCommand(Opcode.FLUSHQ), call)
  }

  /** Settles every pending call with RPC_ERR_CLIENT_CLOSED and closes the connections. */
  close (): Promise<void> {
    return this.client.close()
  }

  async #store (opcode: number, key: Key, value: Value, options: StoreOptions, call: ProtocolCallOptions | undefined): Promise<bigint> {
    const command = new MemcachedCommand(opcode, keyOf(key), valueOf(value), { flags: options.flags, exptime: options.expiry, cas: options.cas })
    return (await this.client.call(command, call)).cas
  }

  async #counter (opcode: number, key: Key, delta: bigint | number, options: CounterOptions, call: ProtocolCallOptions | undefined): Promise<bigint> {
    const command = new MemcachedCommand(opcode, keyOf(key), EMPTY, {
      delta: BigInt(delta),
      initial: BigInt(options.initial ?? 0),
      exptime: options.initial === undefined ? NO_EXPIRY_CREATE : options.expiry ?? 0
    })
    const answer = await this.client.call(command, call)
    return answer === SILENT || answer.value.length < 8 ? 0n : answer.value.readBigUInt64BE(0)
  }
}
