import type { RefusalReason } from '../codec/protocol.js'
import type { CallContext } from './inbound-call.js'

/**
 * A route's implementation: the answer, or a promise of it; a throw is
 * answered as the refusal `failed`. `State` is the protocol's connection
 * state (`ctx.connectionState`). Declared as a method's type, so that a
 * route may take a narrower request than the protocol's union (memcached's
 * GET handler a `GetRequest`); a handler whose request or answer has nothing
 * in common with the protocol's still fails to compile.
 */
export type Handler<Req, Res, State = unknown> = {
  /** Answers `request` (what the protocol's `decodeRequest` made of the body); `ctx` is the call's context. */
  bivariant (request: Req, ctx: CallContext<State>): Res | Promise<Res>
}['bivariant']

/**
 * Wraps the handlers of a server (`server.use`) or of a group
 * (`addRoutes(..., { filters })`): authentication, logging, metrics, rate
 * limits. It gets the request and the call's context, and `next`, the
 * rest of the chain; it returns an answer of its own, or what
 * `next(request, ctx)` returns (maybe with another request). Filters are
 * composed once, when they or the routes are registered: there is no
 * per-call closure, and a chain of synchronous filters around a
 * synchronous handler stays synchronous (its answer goes out in the same
 * turn). A filter that throws is answered as its handler's throw would be.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Filter<Req = any, Res = any, State = any> = (request: Req, ctx: CallContext<State>, next: Handler<Req, Res, State>) => Res | Promise<Res>

/** `filters` around `handler`, the first outermost. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function composeFilters (filters: readonly Filter[], handler: Handler<any, any>): Handler<any, any> {
  let composed = handler
  for (let i = filters.length - 1; i >= 0; i--) {
    const filter = filters[i]!
    const next = composed
    composed = (request, ctx) => filter(request, ctx, next)
  }
  return composed
}

/**
 * How a call ended, as `onCallEnd` observers see it: `ok` (its handler's
 * answer was queued), a refusal the server answered itself (busy,
 * expired, invalid, ... see `RefusalReason`; `failed` when the handler or
 * a filter threw), or `closed` (the connection closed before the answer
 * could be sent).
 */
export interface CallOutcome {
  /** How it ended: `ok`, `closed`, or the refusal's reason. */
  readonly reason: 'ok' | 'closed' | RefusalReason
  /** Why, for refusals; '' for `ok`. */
  readonly message: string
  /** The handler's error (`failed`), or the protocol's detail (`invalid`). */
  readonly detail?: unknown
}

/** What an `onCallEnd` observer sees of a call (also of a request refused before it became a call). */
export interface EndedCall {
  /** The route's group, as the request named it. */
  readonly service: string
  /** The route within the group, as the request named it. */
  readonly method: string
  /** The request's id (in-order protocols: usually 0). */
  readonly callId: number
  /** The peer's identity from the connection's set-up; '' without one. */
  readonly user: string
  /** `ip:port` of the peer. */
  readonly remoteAddress: string
  /** When its frame arrived, on the server's clock (ms). */
  readonly receivedAt: number
}

/** Sees every call end, once: answered, refused (before or after it was queued) or dropped with its connection. Must not throw (a throw is ignored). */
export type CallEndObserver = (call: EndedCall, outcome: CallOutcome) => void
