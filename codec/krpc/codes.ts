import { ErrorCode, RpcError, type RemoteStatus } from '../errors.js'

/** KRPC's `RpcErrorCodePB` values. */
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
