/**
 * `nyala/krpc`: Apache Kudu's RPC protocol, byte for byte. The KRPC server
 * (`KrpcServer`: services of protobuf `ServiceDef`s, negotiation with
 * SASL and TLS, worker threads) and client (`KrpcClient`: typed stubs,
 * retries, balancing), their options and stats, the KRPC error codes,
 * .proto loading, and the handler and stub types. The generic server and
 * client, errors, the clock and multi-process serving come from `nyala`.
 *
 * ```ts
 * import { KrpcServer, KrpcClient, ProtoSchema } from 'nyala/krpc'
 * ```
 *
 * @module nyala/krpc
 */
export { KrpcServer, SERVER_FEATURES, type AddServiceOptions, type Handler, type KrpcServerOptions, type ServiceHandlers, type ThreadServiceOptions, type HandlerModule, type ThreadPoolStats } from './server.js'
export type { KrpcCallContext } from './call.js'
export { Client as KrpcClient, type CallOptions, type CallResult, type Callback, type StubMethod, type ClientConnectionStats, type ClientOptions, type ClientTlsOptions, type Endpoint, type RetryOptions, type RetryStats, type Stub, type Target } from './client.js'
export type { Authenticator } from '../../codec/krpc/server-negotiation.js'
export { hashPassword, loadPasswordFile, type PasswordCheckLimits } from './password-file.js'
export { KrpcCode, krpcCodeName, krpcError, krpcCodeOf, unsupportedFeatureFlagsOf } from '../../codec/krpc/codes.js'
export { ProtoSchema, type Int64Mode, type Message, type MessageType, type MethodDef, type MethodMap, type SchemaOptions, type ScratchBytes, type ServiceDef } from '../../codec/protobuf/schema.js'
