/**
 * Error codes and the one error class of nyala, for every protocol.
 *
 * Two families, as in Kudu's FATAL_* / ERROR_*: a connection-fatal error
 * (malformed or oversized frame, peer reset, closed) destroys the connection
 * and fails every call pending on it; a call-level error (deadline, cancelled,
 * remote error) fails one call and leaves the connection up. A remote error
 * carries the peer's own status in `remote`, as its protocol decoded it
 * (KRPC's `ErrorStatusPB`: `codec/krpc/codes.ts`).
 */

/** Stable local error codes; public API, each documented in the README. */
export const ErrorCode = {
  /** The server answered with an error; `remote` holds its status in the protocol's words. */
  REMOTE: 'RPC_ERR_REMOTE',
  /** The call's timeout passed (it covers connect, negotiation and every retry). */
  DEADLINE_EXCEEDED: 'RPC_ERR_DEADLINE_EXCEEDED',
  /** The call's `AbortSignal` fired (a frame already being written is finished first). */
  CANCELLED: 'RPC_ERR_CANCELLED',
  /** Connection-fatal: the peer closed or reset the connection with the call pending. */
  CONNECTION_CLOSED: 'RPC_ERR_CONNECTION_CLOSED',
  /** Connection-fatal: the TCP connection could not be made. */
  CONNECT_FAILED: 'RPC_ERR_CONNECT_FAILED',
  /** Connection-fatal: negotiation failed or timed out, or the peer does not speak the protocol. */
  NEGOTIATION_FAILED: 'RPC_ERR_NEGOTIATION_FAILED',
  /** Connection-fatal: a frame's length was over the receiver's maximum frame size. */
  FRAME_TOO_LARGE: 'RPC_ERR_FRAME_TOO_LARGE',
  /** Connection-fatal: the peer sent bytes that are not a valid frame. */
  MALFORMED_FRAME: 'RPC_ERR_MALFORMED_FRAME',
  /** The response did not parse or lacked required fields. */
  INVALID_RESPONSE: 'RPC_ERR_INVALID_RESPONSE',
  /** The request was invalid before sending (a missing, unknown or ill-typed field, a bad endpoint); nothing was sent. */
  INVALID_ARGUMENT: 'RPC_ERR_INVALID_ARGUMENT',
  /** A bound was reached (the connection's outbound bytes, calls in flight): the call was not sent. */
  QUEUE_FULL: 'RPC_ERR_QUEUE_FULL',
  /** The client was closed with the call pending, or before it. */
  CLIENT_CLOSED: 'RPC_ERR_CLIENT_CLOSED',
  /** The server lacks a feature the call needs. */
  NOT_SUPPORTED: 'RPC_ERR_NOT_SUPPORTED'
} as const
/** One of the {@link ErrorCode} strings (`RPC_ERR_...`). */
export type ErrorCode = typeof ErrorCode[keyof typeof ErrorCode]

// After these the byte stream can no longer be trusted or is gone, so the
// connection is torn down and every call on it fails.
const CONNECTION_FATAL: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  ErrorCode.CONNECTION_CLOSED,
  ErrorCode.CONNECT_FAILED,
  ErrorCode.NEGOTIATION_FAILED,
  ErrorCode.FRAME_TOO_LARGE,
  ErrorCode.MALFORMED_FRAME
])

/** A peer's error status, as its protocol decoded it (KRPC: `ErrorStatusPB`). */
export interface RemoteStatus {
  /** The protocol that carried it (`krpc`, `memcached`). */
  readonly protocol: string
  /** The protocol's numeric code (KRPC: `RpcErrorCodePB`, e.g. 4 for ERROR_SERVER_TOO_BUSY). */
  readonly code: number
  /** The code's name in the protocol (`ERROR_SERVER_TOO_BUSY`). */
  readonly name: string
  /** The connection that carried it must not be reused (KRPC's FATAL_* codes). */
  readonly fatal: boolean
  /** Anything else the protocol carried (KRPC: the feature flags the server did not support). */
  readonly detail?: unknown
}

/** What an {@link RpcError} carries besides its code and message: the standard `cause`, and the peer's status. */
export interface RpcErrorOptions extends ErrorOptions {
  /** The peer's status, for `code` REMOTE. */
  remote?: RemoteStatus | undefined
}

/**
 * The error every failed call rejects with. Tests and callers branch on
 * `code` (and `remote.code` for remote errors), never on the message.
 */
export class RpcError extends Error {
  /** What went wrong, one of {@link ErrorCode}: callers branch on it, never on the message. */
  readonly code: ErrorCode
  /** The peer's status when `code` is `RPC_ERR_REMOTE` (or a set-up the peer refused); else undefined. */
  readonly remote: RemoteStatus | undefined

  constructor (code: ErrorCode, message: string, options?: RpcErrorOptions) {
    super(message, options)
    this.name = 'RpcError'
    this.code = code
    this.remote = options?.remote
  }

  /** The remote status's name (`ERROR_SERVER_TOO_BUSY`), else the local code. */
  get codeName (): string {
    return this.remote === undefined ? this.code : this.remote.name
  }

  /** True when the connection that raised this error must not be reused. */
  get fatal (): boolean {
    if (this.remote !== undefined) return this.remote.fatal
    return CONNECTION_FATAL.has(this.code)
  }
}
