import type { ConnectionHandle } from '../../codec/protocol.js'
import type { CallContext, InboundCall } from '../inbound-call.js'

/** What a KRPC handler sees of its call: the generic context, plus sidecars. */
export interface KrpcCallContext extends CallContext {
  /** The request's sidecars (views of the received frame; do not write to them). */
  readonly sidecars: readonly Buffer[]
  /** Adds a sidecar to the response; returns its index, to be named in the response message. */
  addSidecar: (data: Uint8Array) => number
}

/**
 * KRPC's per-call data (the generic call's `data`, made by the protocol's
 * `decodeHead`): the request's sidecars and the response's. It is also
 * the context a KRPC handler gets: the generic call's members, read
 * through from `call`, which the server's route sets just before the
 * handler runs. One object per call, and no subclass of the generic call.
 */
export class KrpcCallData implements KrpcCallContext {
  readonly sidecars: readonly Buffer[]
  /** Sidecars the handler added to its response; undefined while none. */
  responseSidecars: Uint8Array[] | undefined
  /** The generic call this data belongs to; set when its handler starts. Internal. */
  call: InboundCall<KrpcCallData> | null

  /** The header's timeout_millis (0: none): the client's own deadline, which it enforces itself. */
  readonly clientTimeoutMs: number

  constructor (sidecars: readonly Buffer[], clientTimeoutMs: number) {
    this.sidecars = sidecars
    this.clientTimeoutMs = clientTimeoutMs
    this.responseSidecars = undefined
    this.call = null
  }

  addSidecar (data: Uint8Array): number {
    this.responseSidecars ??= []
    this.responseSidecars.push(data)
    return this.responseSidecars.length - 1
  }

  get service (): string { return this.call!.service }
  get method (): string { return this.call!.method }
  get callId (): number { return this.call!.callId }
  get user (): string { return this.call!.user }
  get remoteAddress (): string { return this.call!.remoteAddress }
  get deadline (): number { return this.call!.deadline }
  get signal (): AbortSignal { return this.call!.signal }
  get connectionState (): unknown { return this.call!.connectionState }
  get connection (): ConnectionHandle { return this.call!.connection }
  remainingMs (): number { return this.call!.remainingMs() }
  closeConnection (): void { this.call!.closeConnection() }
  write (part: unknown): boolean { return this.call!.write(part) }
}
