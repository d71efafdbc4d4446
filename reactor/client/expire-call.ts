/**
 * A call's deadline passing: its DEADLINE_EXCEEDED error (naming the set-up
 * when the connection was not ready), the count against its host, and the
 * retirement of an in-order connection whose answers it holds up.
 */
import type { ClientProtocol } from '../../codec/client-protocol.js'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Clock } from '../../scheduling/clock.js'
import { FINISHED, SENDING, type CallConnection, type PendingCall } from './pending-call.js'

/** What a call's deadline passing needs of the client engine. */
export interface ExpiryOwner<Req, Res> {
  readonly protocol: ClientProtocol<Req, Res>
  readonly clock: Clock
  readonly inOrder: boolean
  /** The call in errors, without its endpoint. */
  describe: (request: Req, data: unknown) => string
  /** `cc` takes no new calls; it closes once its last call settles. */
  retire: (cc: CallConnection<Req, Res>, reason?: string) => void
  /** Fails the call unless it has settled. */
  readonly fail: (call: PendingCall<Req, Res>, error: RpcError) => void
}

/** The call's deadline passed (the deadline lists call this only for calls not finished): it fails, soon. */
export function expireCall<Req, Res> (owner: ExpiryOwner<Req, Res>, call: PendingCall<Req, Res>, timeoutMs: number): void {
  // After a stall, an answer already in the socket buffer is read first.
  owner.clock.defer(() => {
    if (call.state === FINISHED) return
    const cc = call.conn
    const label = `${owner.describe(call.request, call.data)}${cc === null ? '' : ` to ${cc.endpoint}`}`
    const setupName = owner.protocol.setupName
    const message = cc === null || cc.ready
      ? `${label} timed out after ${timeoutMs} ms`
      : setupName !== undefined ? `${setupName} for ${label} timed out after ${timeoutMs} ms` : `${label} timed out after ${timeoutMs} ms (still connecting)`
    const error = new RpcError(ErrorCode.DEADLINE_EXCEEDED, message)
    // A host that lets calls time out counts as failing them (a connect that times out counts as a failed connect;
    // a host being probed has the probe's own time, so that a host just back may answer its first call late).
    if (cc !== null && cc.ready) {
      cc.balancer.callTimedOut(cc.slot)
      // In order, every answer behind this one waits for it, however long it
      // takes to come (a slow or hostile peer trickling a large one): new
      // calls go to another connection, this one closes once no call waits on it.
      if (owner.inOrder && cc.inOrder.peekFront() === call) owner.retire(cc, 'a call timed out waiting for its in-order answer')
    }
    // Mid-write, the caller's buffers are still being read: settle once the frame is out.
    if (call.state === SENDING) call.pendingError = error
    else owner.fail(call, error)
  })
}
