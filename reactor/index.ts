/**
 * The package's entry point (`import { ProtocolServer, Server, Client } from 'nyala'`):
 * the generic protocol server and its protocol API, KRPC's server and
 * client, multi-process serving, the error type and codes, .proto
 * loading, and the retry policies.
 */
export { ProtocolServer, type CallExecutor, type Handler, type RouteDefinition, type RouteGroupOptions, type RouteHandlers, type ServerConnectionStats, type ServerOptions, type ServerStats } from './server.js'
export { CallHead, InvalidRequest, type AnsweredCall, type AnswerSlices, type CallInfo, type Handshake, type HandshakeStep, type RefusalReason, type RouteInfo, type ServerProtocol } from '../codec/protocol.js'
export type { Framing, FrameScanner, ScanFraming } from '../codec/frame-decoder.js'
export { InboundCall, type CallContext } from './inbound-call.js'
export { Server, type AddServiceOptions, type KrpcServerOptions, type ServiceHandlers, type ThreadServiceOptions, type HandlerModule, type Handler as KrpcHandler } from './krpc/server.js'
export type { KrpcCallContext } from './krpc/call.js'
export { Client, type CallOptions, type CallResult, type Callback, type StubMethod, type ClientConnectionStats, type ClientOptions, type Endpoint, type RetryOptions, type RetryStats, type Stub, type Target } from './krpc/client.js'
export { serveReactors, reusePortSupported, type Reactors, type ReactorsOptions } from './cluster.js'
export { consoleLogger, silentLogger, type Logger } from './logger.js'
export { ErrorCode, RpcError, type RemoteStatus } from '../codec/errors.js'
export { KrpcCode, krpcCodeName, krpcError, krpcCodeOf, unsupportedFeatureFlagsOf } from '../codec/krpc/codes.js'
export { ProtoSchema, type Message, type MessageType, type MethodDef, type MethodMap, type ServiceDef } from '../codec/schema.js'
export { ExponentialBackoff, LinearBackoff, RetryBudget, type Backoff } from '../scheduling/retry.js'
