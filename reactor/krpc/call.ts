import type { Message, MethodDef } from '../../codec/schema.js'
import { InboundCall, type CallContext } from '../inbound-call.js'
import type { KrpcRouteSpec } from './protocol.js'

/** What a KRPC handler sees of its call: the generic context, plus sidecars. */
export interface KrpcCallContext extends CallContext {
  /** The request's sidecars (views of the received frame; do not write to them). */
  readonly sidecars: readonly Buffer[]
  /** Adds a sidecar to the response; returns its index, to be named in the response message. */
  addSidecar: (data: Uint8Array) => number
}

const NO_SIDECARS: readonly Buffer[] = Object.freeze([])

/** A KRPC call: its per-call data is the request's sidecars; the response may carry its own. */
export class KrpcCall extends InboundCall implements KrpcCallContext {
  responseSidecars: Uint8Array[] | undefined

  get sidecars (): readonly Buffer[] {
    return (this.data as readonly Buffer[] | undefined) ?? NO_SIDECARS
  }

  get methodDef (): MethodDef<Message, Message> {
    return (this.route.spec as KrpcRouteSpec).methodDef
  }

  addSidecar (data: Uint8Array): number {
    this.responseSidecars ??= []
    this.responseSidecars.push(data)
    return this.responseSidecars.length - 1
  }
}
