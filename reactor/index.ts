/**
 * The package's entry point (`import { ProtocolServer, ProtocolClient } from 'nyala'`):
 * the generic protocol server and client and their protocol API
 * (`ServerProtocol`, `simpleProtocol`, framings), filters, pushes and
 * connection groups, multi-process serving, the error type and codes,
 * logging, the retry policies and the clock, and every type their options
 * and results name (test/public-types.test.ts checks that none is
 * missing). KRPC (Apache Kudu's RPC) has its own entry, `nyala/krpc`
 * (reactor/krpc/index.ts); its names are re-exported here for one release,
 * deprecated.
 *
 * @module nyala
 */
export { ProtocolServer, ListenError, type CallExecutor, type Handler, type RouteDefinition, type RouteGroupOptions, type RouteHandlers, type ServerConnectionStats, type ServerLimits, type ServerOptions, type ServerStats, type ServesReactor } from './server.js'
export { ProtocolClient, type ConnectionCloseInfo, type ClientInterceptor, type ComposedProtocolClient, type ProtocolPushOptions, type PushInfo, type ClientEndpoint, type ProtocolCallOptions, type ProtocolClientConnectionStats, type ProtocolClientOptions, type ProtocolClientStats, type ProtocolRetryOptions } from './protocol-client.js'
export { simpleClientProtocol, simpleProtocol, type SimpleCall, type SimpleClientProtocolOptions, type SimpleFrame, type SimpleProtocolOptions } from '../codec/simple-protocol.js'
export { lengthField, lines, type FramePayload, type LengthFieldFraming, type LengthFieldOptions, type LineFraming, type LinesOptions, type PayloadFraming } from '../codec/framings.js'
export { CallHead, InvalidRequest, type AnsweredCall, type AnswerSlices, type CallInfo, type ConnectionHandle, type Handshake, type HandshakeStep, type RefusalReason, type RouteInfo, type SecureChannel, type ServerProtocol, type TlsEngine, type TlsEngineStep } from '../codec/protocol.js'
export type { AnswerKind, AnswerPart, ClientHandshake, ClientMatching, ClientProtocol } from '../codec/client-protocol.js'
export type { Framing, FrameScanner, ScanFraming } from '../codec/frame-decoder.js'
export type { FrameSink } from '../codec/frame-sink.js'
export type { CallEndObserver, CallOutcome, EndedCall, Filter } from './filters.js'
export { InboundCall, type CallContext, type CallPeer, type CallRoute } from './inbound-call.js'
export { ConnectionGroup } from './connection-group.js'
export type { WriteWatermarks } from './connection-handle.js'
export type { PushOutputLimitOptions } from './push-output-limit.js'
export type { IdleCollectionOptions } from './idle-collection.js'
export type { HistogramSnapshot, LatencyHistogram, LimitCounters, MethodMetrics, MethodSnapshot, ServerMetrics, ServiceGauges, ServiceSnapshot } from './metrics.js'
export type { ConnectionStats } from '../transport/connection.js'
export type { TransferQueueStats } from '../transport/transfer-queue.js'
export type { BalancePolicy } from './balancer.js'
export type { ClientTarget } from './client/targets.js'
export type { ClientHealthStats, EngineConnectionStats } from './client/engine.js'
export type { LivenessOptions } from './connection-liveness.js'
export type { OutlierEjectionOptions, OutlierEjectionStats } from '../scheduling/outlier-ejection.js'
export { serveReactors, reusePortSupported, type ProcessUsage, type Reactors, type ReactorsOptions } from './cluster.js'
export { consoleLogger, silentLogger, type ConsoleLoggerOptions, type LogFields, type Logger, type LogLevel } from './logger.js'
export { ErrorCode, RpcError, type RemoteStatus, type RpcErrorOptions } from '../codec/errors.js'
export { ExponentialBackoff, LinearBackoff, RetryBudget, type Backoff, type ExponentialBackoffOptions, type Jitter, type LinearBackoffOptions, type RetryBudgetOptions, type RetryBudgetStats } from '../scheduling/retry.js'
export { realClock, type Clock, type TimerHandle } from '../scheduling/clock.js'
export type { QueueDiscipline } from '../scheduling/service-queue.js'

// KRPC, for one release: import these from `nyala/krpc` (as KrpcServer and KrpcClient).
/** @deprecated Import `KrpcServer` from `nyala/krpc`; this re-export goes in the next release. */
export { Server } from './krpc/server.js'
/** @deprecated Import `KrpcClient` from `nyala/krpc`; this re-export goes in the next release. */
export { Client } from './krpc/client.js'
/** @deprecated Import these from `nyala/krpc`; these re-exports go in the next release. */
export type { AddServiceOptions, KrpcServerOptions, ServiceHandlers, ThreadServiceOptions, HandlerModule, ThreadPoolStats, Handler as KrpcHandler } from './krpc/server.js'
/** @deprecated Import these from `nyala/krpc`; these re-exports go in the next release. */
export type { CallOptions, CallResult, Callback, StubMethod, ClientConnectionStats, ClientOptions, ClientTlsOptions, Endpoint, RetryOptions, RetryStats, Stub, Target } from './krpc/client.js'
/** @deprecated Import from `nyala/krpc`. */
export type { KrpcCallContext } from './krpc/call.js'
/** @deprecated Import from `nyala/krpc`. */
export type { Authenticator } from '../codec/krpc/negotiation.js'
/** @deprecated Import these from `nyala/krpc`; these re-exports go in the next release. */
export { hashPassword, loadPasswordFile } from './krpc/password-file.js'
/** @deprecated Import these from `nyala/krpc`; these re-exports go in the next release. */
export { KrpcCode, krpcCodeName, krpcError, krpcCodeOf, unsupportedFeatureFlagsOf } from '../codec/krpc/codes.js'
/** @deprecated Import these from `nyala/krpc`; these re-exports go in the next release. */
export { ProtoSchema, type Message, type MessageType, type MethodDef, type MethodMap, type ScratchBytes, type ServiceDef } from '../codec/protobuf/schema.js'
