/**
 * Error codes and the one error class of nyala.
 *
 * Two families, as in Kudu's FATAL_* / ERROR_*: a connection-fatal error
 * (malformed or oversized frame, peer reset, closed) destroys the connection
 * and fails every call pending on it; a call-level error (deadline, cancelled,
 * remote error) fails one call and leaves the connection up.
 */

/** KRPC's `RpcErrorCodePB` values (wire-contract §3). */
export const KrpcCode = {
  ERROR_APPLICATION: 1,
  ERROR_NO_SUCH_METHOD: 2,
  ERROR_NO_SUCH_SERVICE: 3,
  ERROR_SERVER_TOO_BUSY: 4,
  ERROR_INVALID_REQUEST: 5,
  ERROR_REQUEST_STALE: 6,
  ERROR_UNAVAILABLE: 7,
  FATAL_UNKNOWN: 10,
  FATAL_SERVER_SHUTTING_DOWN: 11,
  FATAL_INVALID_RPC_HEADER: 12,
  FATAL_DESERIALIZING_REQUEST: 13,
  FATAL_VERSION_MISMATCH: 14,
  FATAL_UNAUTHORIZED: 15,
  FATAL_INVALID_AUTHENTICATION_TOKEN: 16,
  ERROR_INVALID_AUTHORIZATION_TOKEN: 17,
  FATAL_INVALID_JWT: 18
} as const
export type KrpcCode = typeof KrpcCode[keyof typeof KrpcCode]

const KRPC_NAMES = new Map<number, string>(Object.entries(KrpcCode).map(([name, value]) => [value, name]))

/** The name of a KRPC error code (`ERROR_SERVER_TOO_BUSY`), or `UNKNOWN_<n>`. */
export function krpcCodeName (code: number): string {
  return KRPC_NAMES.get(code) ?? `UNKNOWN_${code}`
}

/** Stable local error codes; public API, each documented in the README. */
export const ErrorCode = {
  /** The server answered with an error frame; `krpcCode` holds its code. */
  REMOTE: 'RPC_ERR_REMOTE',
  DEADLINE_EXCEEDED: 'RPC_ERR_DEADLINE_EXCEEDED',
  CANCELLED: 'RPC_ERR_CANCELLED',
  CONNECTION_CLOSED: 'RPC_ERR_CONNECTION_CLOSED',
  CONNECT_FAILED: 'RPC_ERR_CONNECT_FAILED',
  NEGOTIATION_FAILED: 'RPC_ERR_NEGOTIATION_FAILED',
  FRAME_TOO_LARGE: 'RPC_ERR_FRAME_TOO_LARGE',
  MALFORMED_FRAME: 'RPC_ERR_MALFORMED_FRAME',
  INVALID_RESPONSE: 'RPC_ERR_INVALID_RESPONSE',
  INVALID_ARGUMENT: 'RPC_ERR_INVALID_ARGUMENT',
  QUEUE_FULL: 'RPC_ERR_QUEUE_FULL',
  CLIENT_CLOSED: 'RPC_ERR_CLIENT_CLOSED',
  NOT_SUPPORTED: 'RPC_ERR_NOT_SUPPORTED'
} as const
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

export interface RpcErrorOptions extends ErrorOptions {
  /** The KRPC code of a remote error. */
  krpcCode?: number
  /** Feature flags the server did not support (ERROR_INVALID_REQUEST). */
  unsupportedFeatureFlags?: number[]
}

/**
 * The error every failed call rejects with. Tests and callers branch on
 * `code` (and `krpcCode` for remote errors), never on the message.
 */
export class RpcError extends Error {
  readonly code: ErrorCode
  /** The server's `RpcErrorCodePB` when `code` is `RPC_ERR_REMOTE`. */
  readonly krpcCode: number | undefined
  readonly unsupportedFeatureFlags: number[] | undefined

  constructor (code: ErrorCode, message: string, options?: RpcErrorOptions) {
    super(message, options)
    this.name = 'RpcError'
    this.code = code
    this.krpcCode = options?.krpcCode
    this.unsupportedFeatureFlags = options?.unsupportedFeatureFlags
  }

  /** The KRPC code's name for a remote error (`ERROR_SERVER_TOO_BUSY`), else the local code. */
  get codeName (): string {
    return this.krpcCode === undefined ? this.code : krpcCodeName(this.krpcCode)
  }

  /** True when the connection that raised this error must not be reused. */
  get fatal (): boolean {
    if (this.krpcCode !== undefined) return this.krpcCode >= 10 && this.krpcCode !== KrpcCode.ERROR_INVALID_AUTHORIZATION_TOKEN
    return CONNECTION_FATAL.has(this.code)
  }
}

/** A remote error, as the client sees an `ErrorStatusPB`. */
export function remoteError (krpcCode: number, message: string, unsupportedFeatureFlags?: number[]): RpcError {
  const options: RpcErrorOptions = { krpcCode }
  if (unsupportedFeatureFlags !== undefined && unsupportedFeatureFlags.length > 0) options.unsupportedFeatureFlags = unsupportedFeatureFlags
  return new RpcError(ErrorCode.REMOTE, message, options)
}
