/**
 * The package's entry point (`import { ProtocolServer, ProtocolClient } from 'nyala'`):
 * the generic protocol server and client and their protocol API
 * (`ServerProtocol`, `simpleProtocol`, framings), filters, pushes and
 * connection groups, multi-process serving, the error type and codes,
 * logging, the retry policies and the clock. KRPC (Apache Kudu's RPC) has
 * its own entry, `nyala/krpc` (reactor/krpc/index.ts).
 *
 * The types a user writes by name are exported here; the rest (stats,
 * metrics snapshots, most option types) are reached from the types that use
 * them: `ReturnType<ProtocolServer['stats']>`,
 * `ConstructorParameters<typeof RetryBudget>[1]`,
 * `NonNullable<ServerOptions['idleCollection']>`. test/public-types.test.ts
 * checks that every type a public signature names is exported or reached so,
 * and typedoc.json's `intentionallyNotExported` lists the ones reached.
 *
 * @module nyala
 */
export { ProtocolServer, ListenError, type Handler, type RouteHandlers, type ServerOptions } from './server.js'
export { ProtocolClient, type ClientEndpoint, type ClientInterceptor, type ProtocolCallOptions, type ProtocolClientOptions } from './protocol-client.js'
export { simpleClientProtocol, simpleProtocol } from '../codec/simple-protocol.js'
export { lengthField, lines } from '../codec/framings.js'
export { CallHead, InvalidRequest, type AnsweredCall, type AnswerSlices, type CallInfo, type ConnectionHandle, type RefusalReason, type RouteInfo, type ServerProtocol } from '../codec/protocol.js'
export type { ClientProtocol } from '../codec/client-protocol.js'
export type { Framing, FrameScanner, ScanFraming } from '../codec/frame-decoder.js'
export type { CallOutcome, EndedCall, Filter } from './filters.js'
export type { CallContext } from './inbound-call.js'
export type { FrameSink } from '../codec/frame-sink.js'
export { ConnectionGroup } from './connection-group.js'
export type { BalancePolicy } from './balancer.js'
export { serveReactors, reusePortSupported, type Reactors, type ReactorsOptions } from './cluster.js'
export { consoleLogger, silentLogger, type LogFields, type Logger, type LogLevel } from './logger.js'
export { ErrorCode, RpcError } from '../codec/errors.js'
export { ExponentialBackoff, LinearBackoff, RetryBudget, type Backoff } from '../scheduling/retry.js'
export { realClock, type Clock, type TimerHandle } from '../scheduling/clock.js'
