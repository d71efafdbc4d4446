import { createServer as createHttpServer, type Server as HttpServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { availableParallelism } from 'node:os'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Registry } from 'prom-client'
import { RpcError } from '../codec/errors.js'
import { isReactorWorker, serveReactors, type Reactors } from '../reactor/cluster.js'
import { consoleLogger } from '../reactor/logger.js'
import { loadPasswordFile } from '../reactor/krpc/password-file.js'
import { Server, type KrpcServerOptions } from '../reactor/krpc/server.js'
import { ListenError } from '../reactor/server.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'
import { serverTlsFiles } from './tls-flags.js'
import { discipline, intOption } from './options.js'
import { isIoOption } from '../transport/io.js'

export const SERVE_USAGE = `  nyala serve [--host 127.0.0.1] [--port 7050] [--max-message-bytes N]
              [--negotiation-timeout-ms N] [--idle-timeout-ms N]
              [--workers 10] [--queue-length 50] [--queue edf|fifo]
              [--metrics-port P] [--threads N] [--reactors N] [--no-shared-scheduler]
              [--max-connection-age-ms N] [--busy-poll-us N] [--verbose]
              [--io auto|io_uring|epoll|node]
              [--frame-timeout-ms 60000] [--max-inbound-buffered-bytes N]
              [--max-outbound-bytes N] [--max-outbound-buffered-bytes N]
              [--max-frames-per-read N] [--max-answer-bytes-per-read N]
              [--max-connections N] [--max-negotiating-connections 1000]
              [--max-negotiation-bytes N] [--abandon-after-ms 5000]
              [--shutdown-grace-ms 30000] [--burst-limit 4096]
              [--min-frame-rate 1000] [--slow-frame-grace-ms 10000]
              [--tls-cert FILE --tls-key FILE] [--tls-ca FILE] [--require-tls]
              [--require-client-cert] [--encrypt-loopback] [--password-file FILE]
      Serves the demo service nyala.demo.CalculatorService. Prints
      "listening on HOST:PORT" once it accepts connections (the real port
      with --port 0), then "io: BACKEND" (io_uring, epoll or node: the
      transport, --io / NYALA_IO). SIGINT/SIGTERM close it gracefully: calls in flight
      are answered, then it exits 0. Calls go through an earliest-deadline-
      first queue (--queue fifo: arrival order, the old behaviour) to
      --workers concurrent handlers. --metrics-port serves Prometheus text
      at http://HOST:P/metrics. --threads N runs the handlers in N worker
      threads (docs/threads.md) instead of on the event loop.
      --reactors N serves from N processes sharing the port (default: the
      available parallelism; 1 = this process only), supervised and
      restarted with backoff; metrics are summed over them. They share one
      scheduler per service (one EDF queue, the workers of all; see
      docs/scheduling.md); --no-shared-scheduler gives each its own. Connections
      older than --max-connection-age-ms are drained and closed so clients
      rebalance. See docs/cluster.md. --busy-poll-us N keeps the event
      loop polling N µs after each read or send instead of sleeping: lower
      latency for a core spinning while busy (docs/performance.md).
      --io picks the transport of plain TCP connections: io_uring or epoll
      (the native transport), node (node:net), or auto (the default):
      io_uring, else epoll, else node; NYALA_IO overrides it. A named
      backend that cannot start is a start-up error.
      Limits per reactor against hostile or broken peers (docs/limits.md):
      a frame must arrive within --frame-timeout-ms;
      incomplete frames of all connections hold at most
      --max-inbound-buffered-bytes (256 MiB); a connection may have
      --max-outbound-bytes (100 MiB) of unsent answers, all connections
      --max-outbound-buffered-bytes (512 MiB) before the heaviest stop
      being read; one read of a connection is decoded at most
      --max-frames-per-read requests a turn, and none after those whose
      answers passed --max-answer-bytes-per-read (64 KiB), the rest waits
      for the next;
      --max-connections (default: the descriptor limit less a
      reserve) and --max-negotiating-connections bound connections; a
      negotiation frame is at most --max-negotiation-bytes (1 MiB); a
      handler still running --abandon-after-ms past its deadline gives its
      worker back; a frame in progress arriving below --min-frame-rate
      bytes/s is closed past --slow-frame-grace-ms, and at the connection
      limit makes room for a newcomer after 1 s (0 disables); SIGTERM waits at most --shutdown-grace-ms for calls and
      flushes, then closes every connection.
      Security (docs/security.md): --tls-cert and --tls-key offer TLS inside
      negotiation, as Kudu does; --tls-ca is the CA that signs client
      certificates. --require-tls refuses clients that do not offer TLS,
      --require-client-cert those without a certificate signed by --tls-ca
      (its CN becomes the user). Loopback connections authenticate with TLS,
      then stay in plain text unless --encrypt-loopback. --password-file
      checks SASL PLAIN users against a file of USER:HASH lines (scrypt
      hashes, as nyala passwd USER prints them). The files are read at
      start-up, by every reactor; one that cannot be read is an error.
`

export async function serve (args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '7050' },
      'max-message-bytes': { type: 'string' },
      'negotiation-timeout-ms': { type: 'string' },
      'idle-timeout-ms': { type: 'string' },
      workers: { type: 'string' },
      'queue-length': { type: 'string' },
      queue: { type: 'string' },
      'metrics-port': { type: 'string' },
      threads: { type: 'string' },
      reactors: { type: 'string' },
      'no-shared-scheduler': { type: 'boolean', default: false },
      'max-connection-age-ms': { type: 'string' },
      'busy-poll-us': { type: 'string' },
      io: { type: 'string' },
      'frame-timeout-ms': { type: 'string' },
      'max-inbound-buffered-bytes': { type: 'string' },
      'max-outbound-bytes': { type: 'string' },
      'max-frames-per-read': { type: 'string' },
      'max-answer-bytes-per-read': { type: 'string' },
      'max-outbound-buffered-bytes': { type: 'string' },
      'max-connections': { type: 'string' },
      'max-negotiating-connections': { type: 'string' },
      'max-negotiation-bytes': { type: 'string' },
      'abandon-after-ms': { type: 'string' },
      'shutdown-grace-ms': { type: 'string' },
      'burst-limit': { type: 'string' },
      'min-frame-rate': { type: 'string' },
      'slow-frame-grace-ms': { type: 'string' },
      'tls-cert': { type: 'string' },
      'tls-key': { type: 'string' },
      'tls-ca': { type: 'string' },
      'require-tls': { type: 'boolean', default: false },
      'require-client-cert': { type: 'boolean', default: false },
      'encrypt-loopback': { type: 'boolean', default: false },
      'password-file': { type: 'string' },
      verbose: { type: 'boolean', default: false }
    },
    strict: true
  })
  const options: ConstructorParameters<typeof Server>[0] = { logger: consoleLogger(values.verbose) }
  const limitFlags = {
    frameTimeoutMs: 'frame-timeout-ms',
    maxInboundBufferedBytes: 'max-inbound-buffered-bytes',
    maxOutboundBytes: 'max-outbound-bytes',
    maxFramesPerRead: 'max-frames-per-read',
    maxAnswerBytesPerRead: 'max-answer-bytes-per-read',
    maxOutboundBufferedBytes: 'max-outbound-buffered-bytes',
    maxConnections: 'max-connections',
    maxNegotiatingConnections: 'max-negotiating-connections',
    maxNegotiationBytes: 'max-negotiation-bytes',
    abandonAfterMs: 'abandon-after-ms',
    burstLimit: 'burst-limit',
    minFrameBytesPerSecond: 'min-frame-rate',
    slowFrameGraceMs: 'slow-frame-grace-ms'
  } as const
  for (const [option, flag] of Object.entries(limitFlags) as Array<[keyof typeof limitFlags, typeof limitFlags[keyof typeof limitFlags]]>) {
    const value = intOption(values[flag], flag)
    if (value !== undefined) options[option] = value
  }
  const shutdownGraceMs = intOption(values['shutdown-grace-ms'], 'shutdown-grace-ms')
  const maxMessageBytes = intOption(values['max-message-bytes'], 'max-message-bytes')
  const negotiationTimeoutMs = intOption(values['negotiation-timeout-ms'], 'negotiation-timeout-ms')
  const idleTimeoutMs = intOption(values['idle-timeout-ms'], 'idle-timeout-ms')
  if (maxMessageBytes !== undefined) options.maxMessageBytes = maxMessageBytes
  if (negotiationTimeoutMs !== undefined) options.negotiationTimeoutMs = negotiationTimeoutMs
  if (idleTimeoutMs !== undefined) options.idleTimeoutMs = idleTimeoutMs
  const workers = intOption(values.workers, 'workers')
  const queueLength = intOption(values['queue-length'], 'queue-length')
  if (workers !== undefined) options.workers = workers
  if (queueLength !== undefined) options.queueLength = queueLength
  if (values.queue !== undefined) options.queue = discipline(values.queue)
  if (values.io !== undefined) {
    if (!isIoOption(values.io)) {
      process.stderr.write(`nyala serve: --io must be auto, io_uring, epoll or node, got ${values.io}\n`)
      return 2
    }
    options.io = values.io
  }
  const busyPollUs = intOption(values['busy-poll-us'], 'busy-poll-us')
  if (busyPollUs !== undefined) options.busyPollUs = busyPollUs
  const threads = intOption(values.threads, 'threads')
  const build = (): Server => threads === undefined
    ? new Server(options).addService(CalculatorService, calculatorHandlers)
    : new Server(options).addService(CalculatorService, { module: new URL('../examples/calculator/index.js', import.meta.url), export: 'calculatorHandlers' }, { threads })
  const reactorCount = intOption(values.reactors, 'reactors', availableParallelism())!
  if (reactorCount < 1) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--reactors must be at least 1, got ${reactorCount}`)
  const maxConnectionAgeMs = intOption(values['max-connection-age-ms'], 'max-connection-age-ms')
  // A port out of range is the user's error, said in one line (no usage hint: the flag exists).
  const port = intOption(values.port, 'port', 7050)!
  const metricsPort = intOption(values['metrics-port'], 'metrics-port')
  for (const [flag, value] of [['port', port], ['metrics-port', metricsPort]] as const) {
    if (value !== undefined && (value < 0 || value > 65535)) {
      process.stderr.write(`nyala serve: --${flag} must be 0-65535, got ${value}\n`)
      return 2
    }
  }
  // TLS and the password file, read now (in each reactor process too: it
  // parses the same arguments): a file that cannot be read or a flag without
  // the flags it needs is one line and exit 2, before anything listens.
  try {
    Object.assign(options, securityOptions(values))
  } catch (err) {
    if (!(err instanceof RangeError) && !(err instanceof RpcError && err.code === 'RPC_ERR_INVALID_ARGUMENT')) throw err
    process.stderr.write(`nyala serve: ${err.message.replace(/\s*\n\s*/g, ' ')}\n`)
    return 2
  }
  // Start-up: the metrics listener first (so a busy metrics port fails
  // before any reactor is forked), then the reactors. A failure closes what
  // was started and is one line on stderr: no stack, no half-alive server.
  // Reactor processes run this too: they serve no metrics, and for them
  // serveReactors never resolves.
  let reactors: Reactors | null = null
  let metricsServer: HttpServer | null = null
  try {
    if (metricsPort !== undefined && !isReactorWorker()) metricsServer = await serveMetrics(() => reactors, values.host, metricsPort)
    reactors = await serveReactors({
      reactors: reactorCount,
      host: values.host,
      port,
      build,
      ...(maxConnectionAgeMs === undefined ? {} : { maxConnectionAgeMs }),
      ...(values['no-shared-scheduler'] ? { sharedScheduler: false } : {}),
      ...(shutdownGraceMs === undefined ? {} : { graceMs: shutdownGraceMs }),
      exec: REACTOR_ENTRY,
      args: ['serve', ...args],
      logger: consoleLogger(values.verbose)
    })
  } catch (err) {
    if (metricsServer !== null) await new Promise<void>((resolve) => metricsServer!.close(() => resolve()))
    const message = err instanceof Error ? err.message : String(err)
    process.stderr.write(`nyala serve: ${message.replace(/\s*\n\s*/g, ' ')}\n`)
    return 1
  }
  const address = reactors.address
  const shown = address.host.includes(':') ? `[${address.host}]` : address.host
  process.stdout.write(`listening on ${shown}:${address.port}\n`)
  // Which transport serves, on a line of its own: scripts match `listening on HOST:PORT` alone.
  process.stdout.write(`io: ${reactors.io}\n`)
  if (metricsServer !== null) process.stdout.write(`metrics on http://${shown}:${(metricsServer.address() as AddressInfo).port}/metrics\n`)
  if (process.env.npm_lifecycle_event === 'start') {
    process.stdout.write(`try: ./bin/nyala call ${shown}:${address.port} nyala.demo.CalculatorService.Add '{"x":1,"y":2}'\n`)
  }
  const stopIpc = answerIpc(reactors)
  return await new Promise<number>((resolve) => {
    let stopping = false
    const stop = (signal: string): void => {
      if (stopping) return
      stopping = true
      process.stderr.write(`${signal}: closing; calls in flight are answered first\n`)
      metricsServer?.close()
      stopIpc()
      reactors!.close().then(() => resolve(0), () => resolve(1))
    }
    process.once('SIGINT', () => stop('SIGINT'))
    process.once('SIGTERM', () => stop('SIGTERM'))
  })
}

/** The Server options of the TLS and password-file flags, their files read; throws RangeError or RpcError (INVALID_ARGUMENT). */
function securityOptions (values: {
  'tls-cert'?: string, 'tls-key'?: string, 'tls-ca'?: string, 'require-tls'?: boolean,
  'require-client-cert'?: boolean, 'encrypt-loopback'?: boolean, 'password-file'?: string
}): Pick<KrpcServerOptions, 'tls' | 'requireTls' | 'requireClientCert' | 'encryptLoopback' | 'authenticate'> {
  const needTls = (['require-tls', 'require-client-cert', 'encrypt-loopback'] as const).filter((flag) => values[flag] === true).map((flag) => `--${flag}`)
  const tls = serverTlsFiles(values, needTls, values['require-client-cert'] === true ? '--require-client-cert' : undefined)
  const options: Pick<KrpcServerOptions, 'tls' | 'requireTls' | 'requireClientCert' | 'encryptLoopback' | 'authenticate'> = {}
  if (tls !== undefined) options.tls = tls
  if (values['require-tls'] === true) options.requireTls = true
  if (values['require-client-cert'] === true) options.requireClientCert = true
  if (values['encrypt-loopback'] === true) options.encryptLoopback = true
  if (values['password-file'] !== undefined) options.authenticate = loadPasswordFile(values['password-file'])
  return options
}

/**
 * The script a reactor process of `nyala serve --reactors N` runs: beside
 * this file, `.ts` from the sources (the parent's loader flags are passed on)
 * or `.js` from dist/. It runs `main` with the same arguments.
 */
const REACTOR_ENTRY = fileURLToPath(new URL(`./serve-reactor${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url))

/**
 * With an IPC channel (started by child_process.fork, as `nyala bench`
 * does): reports `{ type: 'nyala:listening', host, port, pids }` and answers
 * `{ type: 'nyala:usage', id }` with every serving process's resource usage.
 * Returns a function that stops answering (and lets the channel go).
 */
function answerIpc (reactors: Reactors): () => void {
  if (process.send === undefined) return () => {}
  const send = (message: object): void => {
    if (process.connected) process.send!(message, undefined, {}, () => {})
  }
  const onMessage = (message: { type?: unknown, id?: unknown }): void => {
    if (message?.type !== 'nyala:usage') return
    reactors.processUsage().then((usages) => {
      send({ type: 'nyala:usage', id: message.id, usage: usages.map(u => u.usage), pids: usages.map(u => u.pid) })
    }, () => {})
  }
  process.on('message', onMessage)
  send({ type: 'nyala:listening', host: reactors.address.host, port: reactors.address.port, pids: reactors.pids() })
  return () => { process.off('message', onMessage) }
}

/**
 * Serves `GET /metrics` (Prometheus text format), summed over the reactors
 * (503 until they listen). Rejects with a `ListenError` whose message names
 * the metrics port when it cannot be bound.
 */
async function serveMetrics (served: () => Reactors | null, host: string, port: number): Promise<HttpServer> {
  const http = createHttpServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '/').split('?')[0] !== '/metrics') {
      res.writeHead(404).end('not found: try /metrics\n')
      return
    }
    const reactors = served()
    if (reactors === null) {
      res.writeHead(503).end('starting\n')
      return
    }
    reactors.metricsText().then((text) => {
      res.writeHead(200, { 'content-type': Registry.PROMETHEUS_CONTENT_TYPE }).end(text)
    }, (err: Error) => {
      res.writeHead(500).end(`${err.message}\n`)
    })
  })
  await new Promise<void>((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => {
      const error = new ListenError(err, host, port)
      error.message = error.message.replace(/^cannot listen on /, 'metrics port ')
      reject(error)
    }
    http.once('error', onError)
    http.listen(port, host, () => { http.off('error', onError); resolve() })
  })
  return http
}

