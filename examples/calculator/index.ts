import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import { ProtoSchema, assetPath } from '../../codec/schema.js'
import type { ServiceHandlers } from '../../reactor/krpc/server.js'

/** Message shapes of `calculator.proto`, for typed stubs and handlers. */
export interface AddRequest { x: number, y: number }
export interface AddResponse { result: number }
export interface SleepRequest { sleep_micros: number, return_app_error?: boolean }
export type SleepResponse = Record<string, never>
export interface EchoRequest { data: string }
export interface EchoResponse { data: string }
export interface PushStringsRequest { sidecar_indexes?: number[] }
export interface PushStringsResponse { sizes: number[], crcs: number[] }
export type EchoSidecarsRequest = Record<string, never>
export interface EchoSidecarsResponse { sidecar_indexes: number[] }

// A type alias, not an interface, so that it fits MethodMap's index signature.
export type CalculatorMethods = {
  Add: { request: AddRequest, response: AddResponse }
  Sleep: { request: SleepRequest, response: SleepResponse }
  Echo: { request: EchoRequest, response: EchoResponse }
  PushStrings: { request: PushStringsRequest, response: PushStringsResponse }
  EchoSidecars: { request: EchoSidecarsRequest, response: EchoSidecarsResponse }
}

/** Path of `calculator.proto` (also for `nyala call --proto`). */
export const CALCULATOR_PROTO = assetPath(import.meta.url, 'calculator.proto')

/** The demo schema and service `nyala.demo.CalculatorService`. */
export const calculatorSchema = ProtoSchema.load(CALCULATOR_PROTO)
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
