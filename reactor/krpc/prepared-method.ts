import { ErrorCode, RpcError } from '../../codec/errors.js'
import { encodeRemoteMethod } from '../../codec/krpc/encode-frame.js'
import { requestHeaderTail, wireTimeout } from '../../codec/krpc/write-frame.js'
import type { Message, MethodDef, ServiceDef } from '../../codec/protobuf/schema.js'

/** A method of a service as calls to it need it: resolved once, not per call. */
export class PreparedMethod {
  readonly service: string
  readonly methodDef: MethodDef<Message, Message>
  /** The encoded `remote_method` header field. */
  readonly remoteMethod: Buffer
  /** The request header after call_id for wire timeout `tailTimeout` (the last one used): encoded once, not per call. */
  tail: Buffer
  tailTimeout: number
  // The timeoutMs `tailForMs` last made `tail` for (NaN: none yet).
  #tailMs = NaN
  /** The protocol data of a stub's call without sidecars or flags (it resolves with the response alone): one for every such call. */
  readonly stubCall: KrpcCall
  /** The same for `Client.call` (it resolves with a `CallResult`). */
  readonly resultCall: KrpcCall

  constructor (service: string, methodDef: MethodDef<Message, Message>) {
    this.service = service
    this.methodDef = methodDef
    this.remoteMethod = encodeRemoteMethod(service, methodDef.name)
    this.tailTimeout = 0
    this.tail = requestHeaderTail(this.remoteMethod, 0)
    this.stubCall = new KrpcCall(this, true)
    this.resultCall = new KrpcCall(this, false)
  }

  tailFor (timeout: number): Buffer {
    if (timeout !== this.tailTimeout) {
      this.tail = requestHeaderTail(this.remoteMethod, timeout)
      this.tailTimeout = timeout
      this.#tailMs = NaN
    }
    return this.tail
  }

  /**
   * `tailFor(wireTimeout(timeoutMs))`, with the last `timeoutMs` asked
   * remembered: calls with the same timeout (most) skip the rounding and
   * clamping, each of which was a call on the client's path.
   */
  tailForMs (timeoutMs: number): Buffer {
    if (timeoutMs === this.#tailMs) return this.tail
    const tail = this.tailFor(wireTimeout(timeoutMs))
    this.#tailMs = timeoutMs
    return tail
  }
}

/**
 * A KRPC call's protocol data: its method, whether it resolves with the
 * response alone (stubs) or with a `CallResult`, and its sidecars and
 * required feature flags. Calls without sidecars or flags share their
 * method's two (`PreparedMethod.stubCall`, `resultCall`).
 */
export class KrpcCall {
  readonly method: PreparedMethod
  readonly responseOnly: boolean
  readonly sidecars: readonly Uint8Array[] | undefined
  readonly requiredFeatureFlags: readonly number[] | undefined
  /** Encoded as a frame of its own (`encodeRequestFrame`): sidecars, or required feature flags. */
  readonly slow: boolean

  constructor (method: PreparedMethod, responseOnly: boolean, sidecars?: readonly Uint8Array[], requiredFeatureFlags?: readonly number[]) {
    this.method = method
    this.responseOnly = responseOnly
    this.sidecars = sidecars !== undefined && sidecars.length > 0 ? sidecars : undefined
    this.requiredFeatureFlags = requiredFeatureFlags !== undefined && requiredFeatureFlags.length > 0 ? requiredFeatureFlags : undefined
    this.slow = this.sidecars !== undefined || this.requiredFeatureFlags !== undefined
  }
}

/** A client's prepared methods, by definition and service name. */
export type PreparedMethods = Map<MethodDef<Message, Message>, Map<string, PreparedMethod>>

// A method of a service, resolved with its encoded remote_method (cached per definition and service name).
export function preparedMethod (methods: PreparedMethods, def: ServiceDef, name: string): PreparedMethod | undefined {
  const defs = def.methods as Record<string, MethodDef<Message, Message> | undefined>
  const methodDef = Object.hasOwn(defs, name) ? defs[name] : undefined
  if (methodDef === undefined) return undefined
  let byService = methods.get(methodDef)
  if (byService === undefined) {
    byService = new Map()
    methods.set(methodDef, byService)
  }
  let prepared = byService.get(def.fullName)
  if (prepared === undefined) {
    prepared = new PreparedMethod(def.fullName, methodDef)
    byService.set(def.fullName, prepared)
  }
  return prepared
}

export function noSuchMethod (def: ServiceDef, method: string): RpcError {
  return new RpcError(ErrorCode.INVALID_ARGUMENT, `${def.fullName} has no method ${method}`)
}
