/**
 * The package's entry point (`import { Server, Client } from 'nyala'`): the
 * server and client, multi-process serving, the error type and codes,
 * .proto loading, and the retry policies. Deeper modules stay importable
 * by path (`nyala/dist/reactor/server.js`).
 */
export { Server, type AddServiceOptions, type Handler, type ServerConnectionStats, type ServerOptions, type ServerStats, type ServiceHandlers, type ThreadServiceOptions, type HandlerModule } from './server.js'
export { Client, type CallOptions, type CallResult, type Callback, type StubMethod, type ClientConnectionStats, type ClientOptions, type Endpoint, type RetryOptions, type RetryStats, type Stub, type Target } from './client.js'
export type { CallContext } from './inbound-call.js'
export { serveReactors, reusePortSupported, type Reactors, type ReactorsOptions } from './cluster.js'
export { consoleLogger, silentLogger, type Logger } from './logger.js'
export { ErrorCode, KrpcCode, RpcError, krpcCodeName } from '../codec/errors.js'
export { ProtoSchema, type Message, type MessageType, type MethodDef, type MethodMap, type ServiceDef } from '../codec/schema.js'
export { ExponentialBackoff, LinearBackoff, RetryBudget, type Backoff } from '../scheduling/retry.js'
