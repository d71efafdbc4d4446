/**
 * The package's entry point (`import { ProtocolServer, Server, Client } from 'nyala'`):
 * the generic protocol server and its protocol API, KRPC's server and
 * client, multi-process serving, the error type and codes, .proto
 * loading, the retry policies, the clock, and every type their options and
 * results name (test/public-types.test.ts checks that none is missing).
 */
export { ProtocolServer, type CallExecutor, type Handler, type RouteDefinition, type RouteGroupOptions, type RouteHandlers, type ServerConnectionStats, type ServerOptions, type ServerStats } from './server.js'
export type { CallEndObserver, CallOutcome, EndedCall, Filter } from './filters.js'
export { ConnectionGroup } from './connection-group.js'
export type { WriteWatermarks } from './connection-handle.js'
export type { PushOutputLimitOptions } from './push-output-limit.js'
export { CallHead, InvalidRequest, type AnsweredCall, type AnswerSlices, type CallInfo, type ConnectionHandle, type Handshake, type HandshakeStep, type RefusalReason, type RouteInfo, type SecureChannel, type ServerProtocol, type TlsEngine, type TlsEngineStep } from '../codec/protocol.js'
export type { Framing, FrameScanner, ScanFraming } from '../codec/frame-decoder.js'
export { InboundCall, type CallConstructor, type CallContext, type CallPeer, type CallRoute } from './inbound-call.js'
export type { HistogramSnapshot, LimitCounters, MethodMetrics, MethodSnapshot, ServerMetrics, ServiceSnapshot } from './metrics.js'
export type { ConnectionStats } from '../transport/connection.js'
export type { TransferQueueStats } from '../transport/transfer-queue.js'
export { Server, type AddServiceOptions, type KrpcServerOptions, type ServiceHandlers, type ThreadServiceOptions, type HandlerModule, type ThreadPoolStats, type Handler as KrpcHandler } from './krpc/server.js'
export type { Authenticator } from '../codec/krpc/negotiation.js'
export { hashPassword, loadPasswordFile } from './krpc/password-file.js'
export type { KrpcCallContext } from './krpc/call.js'
export { Client, type CallOptions, type CallResult, type Callback, type StubMethod, type ClientConnectionStats, type ClientOptions, type ClientTlsOptions, type Endpoint, type RetryOptions, type RetryStats, type Stub, type Target } from './krpc/client.js'
export type { BalancePolicy } from './balancer.js'
export { ProtocolClient, type ConnectionCloseInfo, type ClientInterceptor, type ComposedProtocolClient, type ProtocolPushOptions, type PushInfo, type ClientEndpoint, type ProtocolCallOptions, type ProtocolClientConnectionStats, type ProtocolClientOptions, type ProtocolClientStats, type ProtocolRetryOptions } from './protocol-client.js'
export type { AnswerKind, AnswerPart, ClientMatching, ClientProtocol } from '../codec/client-protocol.js'
export { serveReactors, reusePortSupported, type ProcessUsage, type Reactors, type ReactorsOptions } from './cluster.js'
export { consoleLogger, silentLogger, type ConsoleLoggerOptions, type LogFields, type Logger, type LogLevel } from './logger.js'
export { ListenError } from './server.js'
export { ErrorCode, RpcError, type RemoteStatus, type RpcErrorOptions } from '../codec/errors.js'
export { KrpcCode, krpcCodeName, krpcError, krpcCodeOf, unsupportedFeatureFlagsOf } from '../codec/krpc/codes.js'
export { ProtoSchema, type Message, type MessageType, type MethodDef, type MethodMap, type ScratchBytes, type ServiceDef } from '../codec/schema.js'
export { ExponentialBackoff, LinearBackoff, RetryBudget, type Backoff, type ExponentialBackoffOptions, type Jitter, type LinearBackoffOptions, type RetryBudgetOptions, type RetryBudgetStats } from '../scheduling/retry.js'
export { realClock, type Clock, type TimerHandle } from '../scheduling/clock.js'
export type { QueueDiscipline } from '../scheduling/service-queue.js'
export { simpleClientProtocol, simpleProtocol, type SimpleCall, type SimpleClientProtocolOptions, type SimpleFrame, type SimpleProtocolOptions } from '../codec/simple-protocol.js'
export { lengthField, lines, type FramePayload, type LengthFieldFraming, type LengthFieldOptions, type LineFraming, type LinesOptions, type PayloadFraming } from '../codec/framings.js'
