import type { RpcError } from '../../codec/errors.js'
import type { Message, MethodMap, ServiceDef } from '../../codec/protobuf/schema.js'
import type { ClientTarget as Target } from '../client/targets.js'
import { deliver, type Callback } from '../client/pending-call.js'
import type { CallResult } from './client-protocol.js'
import { preparedMethod, type PreparedMethod, type PreparedMethods } from './prepared-method.js'

/** Per-call options. */
export interface CallOptions {
  /**
   * Time allowed for the whole call: connect, negotiation, send and
   * response. Default: the client's `defaultTimeoutMs`. Sent as the
   * request's `timeout_millis`; the client's own deadline runs from the end
   * of the microtask checkpoint the call is made in (docs/scheduling.md).
   */
  timeoutMs?: number
  /** Cancels the call. */
  signal?: AbortSignal
  /** Request sidecars, sent after the message without copying. */
  sidecars?: readonly Uint8Array[]
  /** Application feature flags the server must support. */
  requiredFeatureFlags?: readonly number[]
  /**
   * The method may run more than once with the same effect: with retries on,
   * the call is retried even after a failure that may have happened after
   * the server started it (a connection lost once the request was sent).
   */
  idempotent?: boolean
  /** false: no retries for this call, whatever the client's policy. */
  retry?: boolean
}

/**
 * One method of a stub. Called without a callback it returns a promise of
 * the response. Called with one it returns nothing and calls it once the
 * call ends: no promise and no await, for callers that issue the next call
 * from the last one's completion (rpc-bench's async chains). A callback that
 * throws does not disturb the client: the exception is rethrown from a
 * `setImmediate` callback, as an uncaught exception.
 */
export interface StubMethod<Req, Res> {
  (request: Req, options?: CallOptions): Promise<Res>
  (request: Req, callback: Callback<Res>): void
  (request: Req, options: CallOptions | undefined, callback: Callback<Res>): void
}

/** A typed stub: one method per method of the service, each with a promise and a callback form. */
export type Stub<M extends MethodMap> = {
  [K in keyof M & string]: StubMethod<M[K]['request'], M[K]['response']>
}

// What a call resolves with: a CallResult, or the response alone for stubs (`responseOnly`).
export type AnyResolve = (result: CallResult<Message> | Message) => void

/**
 * Starts a call without retries (the client's `#start`): settled through
 * `callback` when not null (a callback-form call), else through resolve
 * and reject, with the response alone when `responseOnly`.
 */
export type StartCall = (endpoint: Target, method: PreparedMethod, request: Message, options: CallOptions,
  resolve: AnyResolve, reject: (error: RpcError, sent: boolean) => void, responseOnly: boolean, callback: Callback<Message> | null) => void

/** The client a stub calls through when it retries. */
export interface StubClient {
  call: (endpoint: Target, def: ServiceDef, method: string, request: Message, options: CallOptions) => Promise<CallResult<Message>>
}

const NO_OPTIONS: CallOptions = {}
const responseOf = (result: CallResult<Message>): Message => result.response
const unusedResolve: AnyResolve = () => {}
const unusedReject = (): void => {}

/**
 * A typed stub for `def` at `target` (`Client.service`). With `retries`,
 * calls go through `client.call`, which retries them; the others start at
 * once through `start`.
 */
export function serviceStub<M extends MethodMap> (def: ServiceDef<M>, target: Target, methods: PreparedMethods,
  client: StubClient, start: StartCall, retries: boolean): Stub<M> {
  const stub: Record<string, (request: unknown, options?: CallOptions | Callback<Message>, callback?: Callback<Message>) => Promise<unknown> | undefined> = {}
  for (const name of Object.keys(def.methods)) {
    // Resolved once per stub: its definition and its encoded remote_method.
    const method = preparedMethod(methods, def, name)!
    stub[name] = (request: unknown, options?: CallOptions | Callback<Message>, callback?: Callback<Message>) => {
      if (typeof options === 'function') {
        callback = options
        options = undefined
      }
      const opts = options ?? NO_OPTIONS
      if (callback !== undefined) {
        if (typeof callback !== 'function') throw new TypeError(`${def.fullName}.${name}: the callback must be a function`)
        // A callback-form call. Its callback never runs before this returns: a
        // call that fails while it starts (client closed, bad request, queue
        // full) is settled from setImmediate, so a chain that re-issues from
        // its callback cannot recurse.
        if (retries && opts.retry !== false) {
          const cb = callback
          client.call(target, def, name, request as Message, opts).then((result) => deliver(cb, null, result.response), (error: RpcError) => deliver(cb, error, undefined))
        } else {
          start(target, method, request as Message, opts, unusedResolve, unusedReject, true, callback)
        }
        return undefined
      }
      if (retries && opts.retry !== false) return client.call(target, def, name, request as Message, opts).then(responseOf)
      // The common path: one promise per call, resolved with the response itself.
      return new Promise((resolve, reject) => {
        start(target, method, request as Message, opts, resolve as AnyResolve, reject, true, null)
      })
    }
  }
  return stub as unknown as Stub<M>
}
