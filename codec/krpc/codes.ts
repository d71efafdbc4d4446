import { ErrorCode, RpcError, type RemoteStatus } from '../errors.js'

/** KRPC's `RpcErrorCodePB` values. */
export const KrpcCode = {
  /** The handler failed (it threw, or was abandoned past its deadline). */
  ERROR_APPLICATION: 1,
  /** The service has no such method. */
  ERROR_NO_SUCH_METHOD: 2,
  /** The server has no such service. */
  ERROR_NO_SUCH_SERVICE: 3,
  /** The service queue was full, the call was evicted by an earlier deadline, or it waited past its deadline: retry elsewhere or later. */
  ERROR_SERVER_TOO_BUSY: 4,
  /** The request did not parse, or needs a feature the server lacks (`unsupportedFeatureFlagsOf`). */
  ERROR_INVALID_REQUEST: 5,
  /** Exactly-once: the request's sequence number is older than the server still remembers. */
  ERROR_REQUEST_STALE: 6,
  /** The server is not ready to serve yet (still starting). */
  ERROR_UNAVAILABLE: 7,
  /** A fatal error with no more specific code (Kudu: an unknown queue status). */
  FATAL_UNKNOWN: 10,
  /** The server is shutting down: new calls during `close()`, and calls still queued when its grace period ends. */
  FATAL_SERVER_SHUTTING_DOWN: 11,
  /** The call's `RequestHeader` did not parse: the connection is closed. */
  FATAL_INVALID_RPC_HEADER: 12,
  /** The request frame could not be read: the connection is closed. */
  FATAL_DESERIALIZING_REQUEST: 13,
  /** Defined by KRPC but never sent (a bad version closes the connection without an error frame). */
  FATAL_VERSION_MISMATCH: 14,
  /** Negotiation refused the credentials (or no more password checks could run): the connection is closed. */
  FATAL_UNAUTHORIZED: 15,
  /** Token authentication failed: fetch a new token and reconnect. */
  FATAL_INVALID_AUTHENTICATION_TOKEN: 16,
  /** The authorization token is invalid or expired; a call-level error, unlike the other codes from 10 on. */
  ERROR_INVALID_AUTHORIZATION_TOKEN: 17,
  /** JWT authentication failed. */
  FATAL_INVALID_JWT: 18
} as const
/** One of the {@link KrpcCode} numbers; from 10 on (but 17) the connection is closed after it. */
export type KrpcCode = typeof KrpcCode[keyof typeof KrpcCode]

const KRPC_NAMES = new Map<number, string>(Object.entries(KrpcCode).map(([name, value]) => [value, name]))

/** The name of a KRPC error code (`ERROR_SERVER_TOO_BUSY`), or `UNKNOWN_<n>`. */
export function krpcCodeName (code: number): string {
  return KRPC_NAMES.get(code) ?? `UNKNOWN_${code}`
}

/** The `RemoteStatus` of a KRPC `ErrorStatusPB`. */
export function krpcStatus (code: number, unsupportedFeatureFlags?: readonly number[]): RemoteStatus {
  const status = { protocol: 'krpc', code, name: krpcCodeName(code), fatal: code >= 10 && code !== KrpcCode.ERROR_INVALID_AUTHORIZATION_TOKEN }
  return unsupportedFeatureFlags !== undefined && unsupportedFeatureFlags.length > 0 ? { ...status, detail: [...unsupportedFeatureFlags] } : status
}

/**
 * A KRPC remote error: what the client rejects with for an error frame,
 * and what a handler throws to answer with a code of its choice
 * (`throw krpcError(KrpcCode.ERROR_INVALID_REQUEST, 'bad x')`).
 */
export function krpcError (code: number, message: string, unsupportedFeatureFlags?: readonly number[]): RpcError {
  return new RpcError(ErrorCode.REMOTE, message, { remote: krpcStatus(code, unsupportedFeatureFlags) })
}

/** The KRPC code of an error, when it carries one. */
export function krpcCodeOf (error: unknown): number | undefined {
  return error instanceof RpcError && error.remote?.protocol === 'krpc' ? error.remote.code : undefined
}

/** The feature flags a KRPC server did not support (ERROR_INVALID_REQUEST), if it named any. */
export function unsupportedFeatureFlagsOf (error: RpcError): number[] | undefined {
  return error.remote?.protocol === 'krpc' ? error.remote.detail as number[] | undefined : undefined
}
