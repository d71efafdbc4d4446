import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import protobuf from 'protobufjs'
import { ErrorCode, RpcError } from '../errors.js'
import { flatCodec } from './flat-codec.js'
import { DEFAULT_INT64_MODE, INT64_MODES, int64Reader, usePlainMessages, wireForm, withoutDefaults, type Int64Mode } from './plain-messages.js'
import { requestValidator } from './validate.js'

/** A decoded message: a plain object keyed by the .proto field names. */
export type Message = Record<string, unknown>

/**
 * One protobuf message type, wrapped so that nothing outside `codec/` needs
 * protobufjs. `decode` reports bad bytes as a returned error.
 */
export interface MessageType<T = Message> {
  /** Full name, e.g. `nyala.demo.AddRequestPB`. */
  readonly fullName: string
  /** Encodes a message; throws RPC_ERR_INVALID_ARGUMENT when it lacks a required field or has a wrong type. */
  encode: (message: T) => Uint8Array
  /**
   * As `encode`, into a scratch buffer the codec reuses: the bytes are valid
   * only until the next encode on this thread, so copy them at once (as the
   * frame encoders do). Spares a writer and a buffer per message.
   */
  encodeScratch: (message: T) => Uint8Array
  /**
   * As `encodeScratch`, without even a view: the bytes are
   * `scratch.bytes[0, scratch.length)` of the shared object returned, valid
   * only until the next encode on this thread.
   */
  encodeToScratch: (message: T) => ScratchBytes
  /**
   * For a flat type (codec/protobuf/flat-codec.ts): reads the fields of `message`
   * once, checks them as `verify` does and answers the bytes it encodes
   * to; `writeFlat` then writes them straight into a frame. -1 when the
   * type or this message is not for the fast path, invalid messages
   * included: use `encodeToScratch`, which verifies and throws.
   */
  flatLength: (message: T) => number
  /**
   * Writes the message this type's last `flatLength` call measured (call
   * it right after, with no other encoding in between) at `out[at]`,
   * exactly that many bytes; returns the offset after them. Runs no user
   * code.
   */
  writeFlat: (out: Uint8Array, at: number) => number
  /** Decodes bytes; a parse failure or a missing required field is returned as an error naming the fields. */
  decode: (bytes: Uint8Array) => T | RpcError
  /** As `decode`, of `bytes[start, end)`, without making a view of them. */
  decodeRange: (bytes: Uint8Array, start: number, end: number) => T | RpcError
  /** Converts plain JSON (as typed on a command line) into a message. */
  fromJSON: (json: unknown) => T
  /** Converts a message into JSON-friendly plain data. */
  toJSON: (message: T) => Record<string, unknown>
  /** The problem with `message` that would stop it encoding, or null. */
  verify: (message: T) => string | null
  /**
   * The first problem that makes `message` an invalid request of this type
   * (`field: problem`, a dotted path for nested fields), or null: missing
   * required fields, unknown fields, wrong types, out-of-range numbers
   * (codec/protobuf/validate.ts). `nyala call` checks its JSON with it.
   */
  validateRequest: (message: unknown) => string | null
  /**
   * What the client encodes for a request: `message` itself, a converted
   * copy when it holds enums by name or bytes as base64, or for a type of
   * singular scalars the fields as read (an object reused by the next call:
   * encode it at once). Throws RPC_ERR_INVALID_ARGUMENT naming the problem
   * that `validateRequest` finds.
   */
  prepareRequest: (message: T) => T
}

/** Request and response types of each method: what a typed stub is built from. */
export type MethodMap = Record<string, {
  /** The method's request message type. */
  request: unknown
  /** The method's response message type. */
  response: unknown
}>

/** One RPC method of a service. */
export interface MethodDef<Req = Message, Res = Message> {
  /** The method's name in its service, as in the .proto file. */
  readonly name: string
  /** The type of its request message. */
  readonly requestType: MessageType<Req>
  /** The type of its response message. */
  readonly responseType: MessageType<Res>
}

/** A service from a .proto file; `M` types its methods for stubs and handlers. */
export interface ServiceDef<M extends MethodMap = MethodMap> {
  /** The name on the wire: `package.Service`. */
  readonly fullName: string
  /** Its methods, by name. */
  readonly methods: { readonly [K in keyof M & string]: MethodDef<M[K]['request'], M[K]['response']> }
}

type PbType = protobuf.Type

/** Where `encodeToScratch` left a message's bytes: `bytes[0, length)`. One shared object. */
export interface ScratchBytes {
  /** The codec's scratch buffer; only its first `length` bytes are the message. */
  bytes: Uint8Array
  /** How many bytes of `bytes` the message took. */
  length: number
}

const EMPTY_BYTES = new Uint8Array(0)
const EMPTY_BUFFER = Buffer.alloc(0)
const scratch: ScratchBytes = { bytes: EMPTY_BYTES, length: 0 }

// The reader `decodeRange` reuses for Buffers (decoding never calls out of
// the codec, so one is enough); a BufferReader, as protobufjs picks for them.
// One per int64 mode: its 64-bit reads answer bigints, strings or numbers (codec/protobuf/plain-messages.ts).
const rangeReaders: Record<Int64Mode, protobuf.Reader> = { bigint: int64Reader('bigint'), string: int64Reader('string'), number: int64Reader('number') }

const NONE_MISSING: string[] = []

// The required fields `instance` lacks; a shared empty array when none (the
// check runs on every encode, so the common answer allocates nothing).
function requiredFieldsMissing (required: readonly protobuf.Field[], instance: unknown): string[] {
  if (instance === null || typeof instance !== 'object') return NONE_MISSING
  let missing: string[] | null = null
  for (let i = 0; i < required.length; i++) {
    const name = required[i]!.name
    if (!Object.prototype.hasOwnProperty.call(instance, name) || (instance as Record<string, unknown>)[name] == null) (missing ??= []).push(name)
  }
  return missing ?? NONE_MISSING
}

// The writer `encodeScratch` reuses; replaced after a message that grew it
// past this size, so one large message does not pin its buffer forever.
const SCRATCH_KEEP_BYTES = 64 * 1024
let scratchWriter: protobuf.Writer | null = null

function wrapType<T> (type: PbType, int64: Int64Mode): MessageType<T> {
  const rangeReader = rangeReaders[int64]
  // Bigints and decimal strings in 64-bit fields, as protobufjs encodes and verifies them (null: no such fields).
  const wire = wireForm(type)
  const fullName = type.fullName.replace(/^\./, '')
  const required = type.fieldsArray.filter((field) => field.required)
  // Checks what protobufjs would encode silently wrong (or not at all).
  // protobufjs's verify fails on an absent required field too (undefined is
  // no integer, string or message), so the success path asks only it; the
  // missing fields are looked up to name them when it failed.
  const check = (message: T): void => {
    const problem = type.verify(message as Record<string, unknown>)
    if (problem === null) return
    if (required.length > 0) {
      const missing = requiredFieldsMissing(required, message)
      if (missing.length > 0) {
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, `invalid ${fullName}: missing fields: ${missing.join(', ')}`)
      }
    }
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `invalid ${fullName}: ${problem}`)
  }
  const decodeFailure = (err: unknown): RpcError => {
    const instance = (err as { instance?: unknown }).instance
    const missing = requiredFieldsMissing(required, instance)
    const detail = missing.length > 0 ? `missing fields: ${missing.join(', ')}` : (err as Error).message
    return new RpcError(ErrorCode.INVALID_ARGUMENT, detail, { cause: err })
  }
  const encodeToScratch = (given: T): ScratchBytes => {
    const message = wire === null ? given : wire(given) as T
    check(message)
    const writer = scratchWriter ?? protobuf.Writer.create()
    scratchWriter = null
    writer.reset()
    type.encode(message as Record<string, unknown>, writer)
    // Taken out while in use: an encode that throws midway leaves no half-written writer behind.
    if (writer.buf.length <= SCRATCH_KEEP_BYTES) scratchWriter = writer
    scratch.bytes = writer.buf
    scratch.length = writer.pos
    return scratch
  }
  const flat = flatCodec<T>(type)
  // The flat path checks what verify checks; what it refuses, encodeToScratch verifies and names.
  const flatLength = flat === null ? () => -1 : flat.length
  const writeFlat = flat === null
    ? () => { throw new Error(`${fullName} is not a flat message type`) }
    : flat.write
  const flatDecode = flat === null ? null : flat.decode
  const decodeRange = (bytes: Uint8Array, start: number, end: number): T | RpcError => {
    if (flatDecode !== null) {
      const message = flatDecode(bytes, start, end)
      if (message !== undefined) return message
    }
    try {
      // A plain Uint8Array is read through a Buffer view of it, so that bytes fields decode as Buffers.
      const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
      const reader = rangeReader as protobuf.Reader & { view: DataView | null }
      reader.buf = buf
      reader.pos = start
      reader.len = end
      // protobufjs caches a DataView of its buffer for packed fixed-width
      // reads: it must never outlive the buffer it was made for.
      reader.view = null
      try {
        return type.decode(reader, end - start) as unknown as T
      } finally {
        // Not keeping the frame alive.
        reader.buf = EMPTY_BUFFER
        reader.len = 0
        reader.view = null
      }
    } catch (err) {
      return decodeFailure(err)
    }
  }
  const requests = requestValidator<T>(type)
  return {
    fullName,
    validateRequest: requests.validate,
    prepareRequest: requests.prepare,
    flatLength,
    writeFlat,
    encode (given: T): Uint8Array {
      const message = wire === null ? given : wire(given) as T
      check(message)
      return type.encode(message as Record<string, unknown>).finish()
    },
    encodeScratch (message: T): Uint8Array {
      const { bytes, length } = encodeToScratch(message)
      return bytes.subarray(0, length)
    },
    encodeToScratch,
    decode (bytes: Uint8Array): T | RpcError {
      return decodeRange(bytes, 0, bytes.length)
    },
    decodeRange,
    fromJSON (json: unknown): T {
      if (json === null || typeof json !== 'object') {
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, `${fullName} must be a JSON object`)
      }
      try {
        // Only the fields given: a proto2 peer tells an absent field from one set to its default.
        return withoutDefaults(() => type.fromObject(json as Record<string, unknown>)) as unknown as T
      } catch (err) {
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, `invalid ${fullName}: ${(err as Error).message}`, { cause: err })
      }
    },
    toJSON (message: T): Record<string, unknown> {
      return type.toObject((wire === null ? message : wire(message)) as protobuf.Message, { longs: String, enums: String, bytes: String, defaults: false, arrays: false })
    },
    verify (message: T): string | null {
      return type.verify((wire === null ? message : wire(message)) as Record<string, unknown>)
    }
  }
}

export type { Int64Mode }

/** Options of `ProtoSchema.parse`, `load` and `fromDescriptor`. */
export interface SchemaOptions {
  /**
   * How 64-bit integer fields (int64, uint64, sint64, fixed64, sfixed64)
   * decode: `'bigint'` (default: exact over the whole range, and a type of
   * its own, so that TypeScript refuses mixing it with numbers), `'string'`
   * (exact, decimal, JSON-friendly) or `'number'` (exact only up to 2^53).
   * Encoding takes any of the three whatever the mode.
   */
  int64?: Int64Mode
}

/**
 * A parsed set of .proto definitions. Field names keep the .proto's case
 * (`sleep_micros`), as on the wire and in KRPC's text formats. Decoded
 * messages are plain objects holding every field (an unset one at its
 * default; codec/protobuf/plain-messages.ts).
 */
export class ProtoSchema {
  readonly #root: protobuf.Root
  readonly #types = new Map<string, MessageType<unknown>>()
  /** How this schema's 64-bit integer fields decode. */
  readonly int64: Int64Mode

  private constructor (root: protobuf.Root, options: SchemaOptions = {}) {
    const int64 = options.int64 ?? DEFAULT_INT64_MODE
    if (!INT64_MODES.includes(int64)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `int64 must be one of ${INT64_MODES.join(', ')}, not ${String(int64)}`)
    this.#root = root
    this.int64 = int64
    root.resolveAll()
    usePlainMessages(root, int64)
  }

  /** Parses .proto source text. Throws RPC_ERR_INVALID_ARGUMENT on a syntax error. */
  static parse (source: string, options?: SchemaOptions): ProtoSchema {
    try {
      return new ProtoSchema(protobuf.parse(source, { keepCase: true }).root, options)
    } catch (err) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot parse .proto: ${(err as Error).message}`, { cause: err })
    }
  }

  /** Reads and parses a .proto file (its imports are resolved relative to it). */
  static load (path: string | URL, options?: SchemaOptions): ProtoSchema {
    const file = typeof path === 'string' ? path : fileURLToPath(path)
    try {
      return new ProtoSchema(new protobuf.Root().loadSync(file, { keepCase: true }), options)
    } catch (err) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot load ${file}: ${(err as Error).message}`, { cause: err })
    }
  }

  /**
   * A schema from the JSON descriptor `descriptor()` gives (protobufjs's
   * reflection JSON): what the files `nyala gen` writes embed, so that they
   * need no .proto file at run time.
   */
  static fromDescriptor (descriptor: object, options?: SchemaOptions): ProtoSchema {
    try {
      return new ProtoSchema(protobuf.Root.fromJSON(descriptor as protobuf.INamespace), options)
    } catch (err) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot read the descriptor: ${(err as Error).message}`, { cause: err })
    }
  }

  /** Every definition of this schema (imports included) as a JSON descriptor, for `fromDescriptor`. */
  descriptor (): object {
    return JSON.parse(JSON.stringify(this.#root.toJSON())) as object
  }

  /** A message type by full name; throws when there is none. */
  type<T = Message> (fullName: string): MessageType<T> {
    let wrapped = this.#types.get(fullName)
    if (wrapped === undefined) {
      const found = this.#root.lookup(fullName)
      if (!(found instanceof protobuf.Type)) {
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, `no message type ${fullName}`)
      }
      wrapped = wrapType<unknown>(found, this.int64)
      this.#types.set(fullName, wrapped)
    }
    return wrapped as MessageType<T>
  }

  /** A service by full name (`nyala.demo.CalculatorService`); throws when there is none. */
  service<M extends MethodMap = MethodMap> (fullName: string): ServiceDef<M> {
    const found = this.#root.lookup(fullName)
    if (!(found instanceof protobuf.Service)) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `no service ${fullName}`)
    }
    const methods: Record<string, MethodDef<unknown, unknown>> = {}
    for (const method of found.methodsArray) {
      method.resolve()
      if (method.resolvedRequestType === null || method.resolvedResponseType === null) {
        throw new RpcError(ErrorCode.INVALID_ARGUMENT, `cannot resolve types of ${fullName}.${method.name}`)
      }
      methods[method.name] = {
        name: method.name,
        requestType: this.type(method.resolvedRequestType.fullName.replace(/^\./, '')),
        responseType: this.type(method.resolvedResponseType.fullName.replace(/^\./, ''))
      }
    }
    return { fullName: found.fullName.replace(/^\./, ''), methods } as unknown as ServiceDef<M>
  }

  /** Full names of every service defined. */
  serviceNames (): string[] {
    const names: string[] = []
    const walk = (ns: protobuf.NamespaceBase): void => {
      for (const nested of ns.nestedArray) {
        if (nested instanceof protobuf.Service) names.push(nested.fullName.replace(/^\./, ''))
        else if (nested instanceof protobuf.Namespace) walk(nested)
      }
    }
    walk(this.#root)
    return names
  }
}

/**
 * Finds a file shipped beside the sources: `here` when running the
 * TypeScript directly, the same path outside `dist/` when running the compiled copy in
 * `dist/` (tsc does not copy .proto files).
 */
export function assetPath (moduleUrl: string, name: string): string {
  const beside = fileURLToPath(new URL(name, moduleUrl))
  if (existsSync(beside)) return beside
  // Compiled: the asset stays beside the source, at the same path outside dist/.
  const dir = fileURLToPath(new URL('.', moduleUrl))
  const at = dir.lastIndexOf('/dist/')
  return at < 0 ? beside : `${dir.slice(0, at)}/${dir.slice(at + '/dist/'.length)}${name}`
}
