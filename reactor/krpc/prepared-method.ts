import { ErrorCode, RpcError } from '../../codec/errors.js'
import { encodeRemoteMethod, requestHeaderTail } from '../../codec/krpc/frames.js'
import type { Message, MethodDef, ServiceDef } from '../../codec/schema.js'

/** A method of a service as calls to it need it: resolved once, not per call. */
export class PreparedMethod {
  readonly service: string
  readonly methodDef: MethodDef<Message, Message>
  /** The encoded `remote_method` header field. */
  readonly remoteMethod: Buffer
  /** The request header after call_id for wire timeout `tailTimeout` (the last one used): encoded once, not per call. */
  tail: Buffer
  tailTimeout: number

  constructor (service: string, methodDef: MethodDef<Message, Message>) {
    this.service = service
    this.methodDef = methodDef
    this.remoteMethod = encodeRemoteMethod(service, methodDef.name)
    this.tailTimeout = 0
    this.tail = requestHeaderTail(this.remoteMethod, 0)
  }

  tailFor (timeout: number): Buffer {
    if (timeout !== this.tailTimeout) {
      this.tail = requestHeaderTail(this.remoteMethod, timeout)
      this.tailTimeout = timeout
    }
    return this.tail
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
