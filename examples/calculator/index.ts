/**
 * `nyala/demo`: the calculator service of Kudu's RPC tests
 * (`nyala.demo.CalculatorService` of `calculator.proto`), which `nyala
 * serve`, `nyala call` and `nyala bench` run: its message shapes, its
 * schema and service, and its handlers.
 *
 * @module nyala/demo
 */
import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import { ProtoSchema, assetPath } from '../../codec/protobuf/schema.js'
import type { ServiceHandlers } from '../../reactor/krpc/server.js'

/** `AddRequestPB`: two numbers to add. */
export interface AddRequest {
  /** The first addend (uint32). */
  x: number
  /** The second addend (uint32). */
  y: number
}
/** `AddResponsePB`: the sum. */
export interface AddResponse {
  /** `x + y`, wrapped to uint32. */
  result: number
}
/** `SleepRequestPB`: how long the handler waits before it answers. */
export interface SleepRequest {
  /** How long to wait, in microseconds. */
  sleep_micros: number
  /** Answer with an application error instead of an empty response once the wait ends. */
  return_app_error?: boolean
}
/** `SleepResponsePB`: empty. */
export type SleepResponse = Record<string, never>
/** `EchoRequestPB`: a string to send back. */
export interface EchoRequest {
  /** The string the response carries back. */
  data: string
}
/** `EchoResponsePB`: the request's string. */
export interface EchoResponse {
  /** The request's `data`, unchanged. */
  data: string
}
/** `PushStringsRequestPB`: which of the request's sidecars to measure. */
export interface PushStringsRequest {
  /** Indexes into the request's sidecars (none: an empty answer). */
  sidecar_indexes?: number[]
}
/** `PushStringsResponsePB`: size and CRC-32 of each sidecar named, in the request's order. */
export interface PushStringsResponse {
  /** Each named sidecar's length in bytes. */
  sizes: number[]
  /** Each named sidecar's CRC-32 (zlib's). */
  crcs: number[]
}
/** `EchoSidecarsRequestPB`: empty; the request's sidecars are the payload. */
export type EchoSidecarsRequest = Record<string, never>
/** `EchoSidecarsResponsePB`: the request's sidecars come back, in order, as the response's. */
export interface EchoSidecarsResponse {
  /** The response's sidecar index of each echoed sidecar. */
  sidecar_indexes: number[]
}

// A type alias, not an interface, so that it fits MethodMap's index signature.
/** The methods of `nyala.demo.CalculatorService`, each with its request and response shape, for typed stubs and handlers. */
export type CalculatorMethods = {
  /** Adds `x` and `y`. */
  Add: {
    /** The two addends. */
    request: AddRequest
    /** Their sum. */
    response: AddResponse
  }
  /** Waits `sleep_micros`, then answers (or fails, with `return_app_error`). */
  Sleep: {
    /** How long to wait. */
    request: SleepRequest
    /** Empty. */
    response: SleepResponse
  }
  /** Sends `data` back. */
  Echo: {
    /** The string. */
    request: EchoRequest
    /** The same string. */
    response: EchoResponse
  }
  /** Measures the request's sidecars named by index. */
  PushStrings: {
    /** Which sidecars. */
    request: PushStringsRequest
    /** Their sizes and CRCs. */
    response: PushStringsResponse
  }
  /** Sends the request's sidecars back as the response's. */
  EchoSidecars: {
    /** Empty (the sidecars are the payload). */
    request: EchoSidecarsRequest
    /** The echoed sidecars' indexes. */
    response: EchoSidecarsResponse
  }
}

/** Path of `calculator.proto` (also for `nyala call --proto`). */
export const CALCULATOR_PROTO = assetPath(import.meta.url, 'calculator.proto')

/** The parsed `calculator.proto`: the demo schema. */
export const calculatorSchema = ProtoSchema.load(CALCULATOR_PROTO)
/** `nyala.demo.CalculatorService`, typed by {@link CalculatorMethods}: give it to `server.addService` and `client.service`. */
export const CalculatorService = calculatorSchema.service<CalculatorMethods>('nyala.demo.CalculatorService')

const CRC_TABLE = (() => {
  const table = new Uint32Array(256)
  for (let n = 0; n < 256; n++) {
    let c = n
    for (let k = 0; k < 8; k++) c = (c & 1) !== 0 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
    table[n] = c >>> 0
  }
  return table
})()

/** zlib's CRC-32 of `data`. */
export function crc32 (data: Uint8Array): number {
  let crc = 0xffffffff
  for (let i = 0; i < data.length; i++) crc = CRC_TABLE[(crc ^ data[i]!) & 0xff]! ^ (crc >>> 8)
  return (crc ^ 0xffffffff) >>> 0
}

/** The demo handlers of nyala.demo.CalculatorService, modelled on the calculator service of Kudu's RPC tests. */
export const calculatorHandlers: ServiceHandlers<CalculatorMethods> = {
  Add: (request) => ({ result: (request.x + request.y) >>> 0 }),

  // Waits without blocking the event loop; the call holds its slot
  // meanwhile, but no longer than the call lives: at its deadline, or when
  // its connection closes, the signal ends the wait.
  Sleep: (request, ctx) => new Promise<SleepResponse>((resolve, reject) => {
    const signal = ctx.signal
    if (signal.aborted) {
      reject(signal.reason)
      return
    }
    const onAbort = (): void => {
      clearTimeout(timer)
      reject(signal.reason)
    }
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort)
      if (request.return_app_error === true) reject(new Error('Got some error'))
      else resolve({})
    }, request.sleep_micros / 1000)
    signal.addEventListener('abort', onAbort, { once: true })
  }),

  Echo: (request) => ({ data: request.data }),

  PushStrings: (request, ctx) => {
    const sizes: number[] = []
    const crcs: number[] = []
    for (const index of request.sidecar_indexes ?? []) {
      const sidecar = ctx.sidecars[index]
      if (sidecar === undefined) {
        throw krpcError(KrpcCode.ERROR_INVALID_REQUEST, `no sidecar at index ${index}`)
      }
      sizes.push(sidecar.length)
      crcs.push(crc32(sidecar))
    }
    return { sizes, crcs }
  },

  EchoSidecars: (_request, ctx) => {
    const indexes: number[] = []
    for (const sidecar of ctx.sidecars) indexes.push(ctx.addSidecar(sidecar))
    return { sidecar_indexes: indexes }
  }
}
