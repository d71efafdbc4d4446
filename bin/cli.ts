import { createServer as createHttpServer, type Server as HttpServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { availableParallelism } from 'node:os'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Registry } from 'prom-client'
import { RpcError } from '../codec/errors.js'
import { ProtoSchema, type ServiceDef } from '../codec/schema.js'
import { Client } from '../reactor/krpc/client.js'
import { serveReactors, type Reactors } from '../reactor/cluster.js'
import { consoleLogger } from '../reactor/logger.js'
import { Server } from '../reactor/krpc/server.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { CALCULATOR_PROTO, CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'
import { bench } from './bench.js'
import { DEFAULT_FAIRNESS, formatFairness, runFairness, type FairnessResult } from './fairness.js'
import { trace } from './trace.js'

const HELP = `nyala: raw-TCP binary RPC servers for Node.js that speak Apache Kudu's KRPC

Usage:
  nyala serve [--host 127.0.0.1] [--port 7050] [--max-message-bytes N]
              [--negotiation-timeout-ms N] [--idle-timeout-ms N]
              [--workers 10] [--queue-length 50] [--queue edf|fifo]
              [--metrics-port P] [--threads N] [--reactors N]
              [--max-connection-age-ms N] [--busy-poll-us N] [--verbose]
              [--frame-timeout-ms 60000] [--max-inbound-buffered-bytes N]
              [--max-outbound-bytes N] [--max-outbound-buffered-bytes N]
              [--max-connections N] [--max-negotiating-connections 1000]
              [--max-negotiation-bytes N] [--abandon-after-ms 5000]
              [--shutdown-grace-ms 30000] [--burst-limit 4096]
      Serves the demo service nyala.demo.CalculatorService. Prints
      "listening on HOST:PORT" once it accepts connections (the real port
      with --port 0). SIGINT/SIGTERM close it gracefully: calls in flight
      are answered, then it exits 0. Calls go through an earliest-deadline-
      first queue (--queue fifo: arrival order, the old behaviour) to
      --workers concurrent handlers. --metrics-port serves Prometheus text
      at http://HOST:P/metrics. --threads N runs the handlers in N worker
      threads (docs/threads.md) instead of on the event loop.
      --reactors N serves from N processes sharing the port (default: the
      available parallelism; 1 = this process only), supervised and
      restarted with backoff; metrics are summed over them. Connections
      older than --max-connection-age-ms are drained and closed so clients
      rebalance. See docs/cluster.md. --busy-poll-us N keeps the event
      loop polling N µs after each read or send instead of sleeping: lower
      latency for a core spinning while busy (docs/performance.md).
      Limits per reactor against hostile or broken peers (README, "Limits
      and hostile peers"): a frame must arrive within --frame-timeout-ms;
      incomplete frames of all connections hold at most
      --max-inbound-buffered-bytes (256 MiB); a connection may have
      --max-outbound-bytes (100 MiB) of unsent answers, all connections
      --max-outbound-buffered-bytes (512 MiB) before the heaviest stop
      being read; --max-connections (default: the descriptor limit less a
      reserve) and --max-negotiating-connections bound connections; a
      negotiation frame is at most --max-negotiation-bytes (1 MiB); a
      handler still running --abandon-after-ms past its deadline gives its
      worker back; SIGTERM waits at most --shutdown-grace-ms for calls and
      flushes, then closes every connection.

  nyala call HOST:PORT SERVICE.METHOD 'JSON' [--timeout-ms N] [--proto FILE]
              [--user NAME] [--password PW]
      Calls one method, like grpcurl: the JSON request is encoded with the
      .proto (default: the demo service's), the response printed as JSON.
      On failure prints the error code and message and exits 1.
      Example: nyala call 127.0.0.1:7050 nyala.demo.CalculatorService.Add '{"x":1,"y":2}'

  nyala fairness [--queue edf|fifo|edf,fifo] [--clients 18] [--workers 3]
              [--queue-length 10] [--sleep-ms 100] [--deadline-ms 8000]
              [--run-seconds 5] [--backoff exp|linear|exp,linear] [--json]
      Seed 000's fairness test: an in-process server with few workers and
      more clients than it can serve, each looping on Sleep with retries
      that keep the deadline. Prints per-client successes, min/average,
      Jain's index, TOO_BUSY answers and latency percentiles, one block per
      queue x backoff combination, all in the same run.

  nyala trace [--mode sync|async|transfer] [--calls N] [--depth D]
              [--payload-bytes B] [--sidecar-bytes B] [--system nyala|raw]
              [--tracer strace|perf] [--no-timing] [--json]
      The server's syscalls per RPC: runs one server process under
      strace -f -c, drives N calls at depth D (sync: 1; async: 64) from this
      process, subtracts a run with zero calls, and prints epoll_ctl,
      epoll_wait, read, write, futex, other and total per RPC, the raw
      counts, bytes per write and the connections' transfer-queue counters.
      --mode transfer: synchronous EchoSidecars with one 8 MiB sidecar
      (--sidecar-bytes), reported in MiB/s. An untraced run first times the
      calls (--no-timing skips it). Needs strace (apt-get install strace)
      or, with --tracer perf, perf trace. See docs/tracing.md.

  nyala bench [--mode sync|async] [--client-threads 16]
              [--async-call-concurrency 60] [--worker-threads W]
              [--server-reactors 1] [--run-seconds 1] [--warmup-seconds W]
              [--payload-bytes 0] [--against nyala,nyala-promise,raw,grpc]
              [--load-processes P] [--busy-poll-us U] [--json]
              [--repeat K [--compare 'FLAGS A' 'FLAGS B']]
              [--server-cpu-prof DIR] [--load-cpu-prof DIR]
      Kudu's rpc-bench for nyala, side by side with a raw node:net echo and
      grpc-js (a devDependency), one system after the other in one run
      (default --against nyala,raw; in async mode nyala,nyala-promise,raw).
      Sync: N client connections with one call outstanding each. Async: C
      calls outstanding over N connections.
      nyala calls as rpc-bench does: sync awaits each call's promise, async
      re-issues each chain from the last call's callback (the stub's
      callback form, as the raw and grpc loads do); nyala-promise awaits
      promises in both modes.
      Server and load run in separate processes (one load process per
      connection, at most one per core). One row per system: Reqs/sec,
      server user/sys CPU us and context switches per request (all server
      processes), client CPU us per request, p50/p99/p99.9 latency us.
      Each window follows a warm-up (default: half the window, 0.1 to 3
      s). --payload-bytes B calls Echo with B bytes instead of Add. --json
      prints the rows as a JSON array. --repeat K runs K times and reports
      medians; with --compare it runs configurations A and B alternately,
      K times each, and prints Welch's t-test on Reqs/sec with the 95 %
      confidence interval of A - B. --server-cpu-prof DIR writes the
      servers' V8 CPU profiles (.cpuprofile) to DIR, --load-cpu-prof DIR
      the load processes' (the clients'). --busy-poll-us U turns on
      nyala's busy polling (U µs) on its server and its clients.

  nyala help
      This text.
`

/** Runs the CLI; resolves with the exit code (serve resolves when the server has closed). */
export async function main (argv: string[]): Promise<number> {
  const [command, ...rest] = argv
  const run = command !== undefined && Object.hasOwn(COMMANDS, command) ? COMMANDS[command] : undefined
  if (run !== undefined) {
    if (rest.includes('--help') || rest.includes('-h')) {
      process.stdout.write(HELP)
      return 0
    }
    try {
      return await run(rest)
    } catch (err) {
      // A mistyped flag or value is the user's error: one line and the exit code of a usage error, no stack.
      if (!isUsageError(err)) throw err
      process.stderr.write(`nyala ${command}: ${(err as Error).message}\n(nyala help lists the options)\n`)
      return 2
    }
  }
  switch (command) {
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(HELP)
      return 0
    default:
      process.stderr.write(`nyala: unknown command '${command}'\n\n${HELP}`)
      return 2
  }
}

const COMMANDS: Record<string, ((args: string[]) => Promise<number>) | undefined> = { serve, call, fairness, bench, trace }

// Errors node:util's parseArgs throws for unknown options, missing values and stray arguments, and our own option checks.
function isUsageError (err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return (typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS_')) ||
    (err instanceof RpcError && err.code === 'RPC_ERR_INVALID_ARGUMENT')
}

function intOption (value: string | undefined, name: string, fallback?: number): number | undefined {
  if (value === undefined) return fallback
  const n = Number(value)
  if (!Number.isInteger(n)) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--${name} must be an integer, got '${value}'`)
  return n
}

async function serve (args: string[]): Promise<number> {
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
      'max-connection-age-ms': { type: 'string' },
      'busy-poll-us': { type: 'string' },
      'frame-timeout-ms': { type: 'string' },
      'max-inbound-buffered-bytes': { type: 'string' },
      'max-outbound-bytes': { type: 'string' },
      'max-outbound-buffered-bytes': { type: 'string' },
      'max-connections': { type: 'string' },
      'max-negotiating-connections': { type: 'string' },
      'max-negotiation-bytes': { type: 'string' },
      'abandon-after-ms': { type: 'string' },
      'shutdown-grace-ms': { type: 'string' },
      'burst-limit': { type: 'string' },
      verbose: { type: 'boolean', default: false }
    },
    strict: true
  })
  const options: ConstructorParameters<typeof Server>[0] = { logger: consoleLogger(values.verbose) }
  const limitFlags = {
    frameTimeoutMs: 'frame-timeout-ms',
    maxInboundBufferedBytes: 'max-inbound-buffered-bytes',
    maxOutboundBytes: 'max-outbound-bytes',
    maxOutboundBufferedBytes: 'max-outbound-buffered-bytes',
    maxConnections: 'max-connections',
    maxNegotiatingConnections: 'max-negotiating-connections',
    maxNegotiationBytes: 'max-negotiation-bytes',
    abandonAfterMs: 'abandon-after-ms',
    burstLimit: 'burst-limit'
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
  const busyPollUs = intOption(values['busy-poll-us'], 'busy-poll-us')
  if (busyPollUs !== undefined) options.busyPollUs = busyPollUs
  const threads = intOption(values.threads, 'threads')
  const build = (): Server => threads === undefined
    ? new Server(options).addService(CalculatorService, calculatorHandlers)
    : new Server(options).addService(CalculatorService, { module: new URL('../examples/calculator/index.js', import.meta.url), export: 'calculatorHandlers' }, { threads })
  const reactorCount = intOption(values.reactors, 'reactors', availableParallelism())!
  if (reactorCount < 1) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--reactors must be at least 1, got ${reactorCount}`)
  const maxConnectionAgeMs = intOption(values['max-connection-age-ms'], 'max-connection-age-ms')
  // In a reactor process (a cluster worker running REACTOR_ENTRY) this never resolves.
  const reactors = await serveReactors({
    reactors: reactorCount,
    host: values.host,
    port: intOption(values.port, 'port', 7050)!,
    build,
    ...(maxConnectionAgeMs === undefined ? {} : { maxConnectionAgeMs }),
    ...(shutdownGraceMs === undefined ? {} : { graceMs: shutdownGraceMs }),
    exec: REACTOR_ENTRY,
    args: ['serve', ...args],
    logger: consoleLogger(values.verbose)
  })
  const address = reactors.address
  const shown = address.host.includes(':') ? `[${address.host}]` : address.host
  const metricsPort = intOption(values['metrics-port'], 'metrics-port')
  const metricsServer = metricsPort === undefined ? null : await serveMetrics(reactors, values.host, metricsPort)
  process.stdout.write(`listening on ${shown}:${address.port}\n`)
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
      reactors.close().then(() => resolve(0), () => resolve(1))
    }
    process.once('SIGINT', () => stop('SIGINT'))
    process.once('SIGTERM', () => stop('SIGTERM'))
  })
}

function discipline (value: string): QueueDiscipline {
  if (value !== 'edf' && value !== 'fifo') throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--queue must be edf or fifo, got '${value}'`)
  return value
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

/** Serves `GET /metrics` (Prometheus text format), summed over the reactors. */
async function serveMetrics (reactors: Reactors, host: string, port: number): Promise<HttpServer> {
  const http = createHttpServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '/').split('?')[0] !== '/metrics') {
      res.writeHead(404).end('not found: try /metrics\n')
      return
    }
    reactors.metricsText().then((text) => {
      res.writeHead(200, { 'content-type': Registry.PROMETHEUS_CONTENT_TYPE }).end(text)
    }, (err: Error) => {
      res.writeHead(500).end(`${err.message}\n`)
    })
  })
  await new Promise<void>((resolve, reject) => {
    http.once('error', reject)
    http.listen(port, host, () => { http.off('error', reject); resolve() })
  })
  return http
}

async function fairness (args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      queue: { type: 'string', default: 'edf' },
      clients: { type: 'string' },
      workers: { type: 'string' },
      'queue-length': { type: 'string' },
      'sleep-ms': { type: 'string' },
      'deadline-ms': { type: 'string' },
      'run-seconds': { type: 'string' },
      backoff: { type: 'string', default: 'exp' },
      json: { type: 'boolean', default: false }
    },
    strict: true
  })
  const d = DEFAULT_FAIRNESS
  const number = (value: string | undefined, name: string, fallback: number): number => {
    if (value === undefined) return fallback
    const n = Number(value)
    if (!(n >= 0) || !Number.isFinite(n)) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--${name} must be a number >= 0, got '${value}'`)
    return n
  }
  const base = {
    clients: intOption(values.clients, 'clients', d.clients)!,
    workers: intOption(values.workers, 'workers', d.workers)!,
    queueLength: intOption(values['queue-length'], 'queue-length', d.queueLength)!,
    sleepMs: number(values['sleep-ms'], 'sleep-ms', d.sleepMs),
    deadlineMs: number(values['deadline-ms'], 'deadline-ms', d.deadlineMs),
    runSeconds: number(values['run-seconds'], 'run-seconds', d.runSeconds)
  }
  const queues = values.queue.split(',').map(discipline)
  const backoffs = values.backoff.split(',').map((b) => {
    if (b !== 'exp' && b !== 'linear') throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--backoff must be exp or linear, got '${b}'`)
    return b
  })
  const results: FairnessResult[] = []
  for (const queue of queues) {
    for (const backoff of backoffs) {
      const result = await runFairness({ ...base, queue, backoff })
      results.push(result)
      if (!values.json) process.stdout.write(`${formatFairness(result)}\n`)
    }
  }
  if (values.json) process.stdout.write(`${JSON.stringify(results.length === 1 ? results[0] : results)}\n`)
  return 0
}

async function call (args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      'timeout-ms': { type: 'string', default: '10000' },
      proto: { type: 'string' },
      user: { type: 'string' },
      password: { type: 'string' }
    },
    allowPositionals: true,
    strict: true
  })
  const [endpoint, target, json] = positionals
  if (endpoint === undefined || target === undefined) {
    process.stderr.write(`nyala call: expected HOST:PORT SERVICE.METHOD 'JSON'\n`)
    return 2
  }
  const dot = target.lastIndexOf('.')
  const serviceName = target.slice(0, dot)
  const methodName = target.slice(dot + 1)
  const client = new Client({
    ...(values.user === undefined ? {} : { user: values.user }),
    ...(values.password === undefined ? {} : { password: values.password })
  })
  try {
    if (dot <= 0) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `expected SERVICE.METHOD, got '${target}'`)
    const schema = values.proto === undefined ? null : ProtoSchema.load(values.proto)
    const def: ServiceDef = schema === null
      ? (serviceName === CalculatorService.fullName ? CalculatorService as unknown as ServiceDef : ProtoSchema.load(CALCULATOR_PROTO).service(serviceName))
      : schema.service(serviceName)
    const method = def.methods[methodName]
    // An unknown method is still sent (the server answers ERROR_NO_SUCH_METHOD) when the
    // .proto does not know it; that needs a request type, so refuse here instead.
    if (method === undefined) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `${serviceName} has no method ${methodName} in the .proto`)
    let parsed: unknown
    try {
      parsed = JSON.parse(json ?? '{}')
    } catch (err) {
      throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `request is not valid JSON: ${(err as Error).message}`)
    }
    const request = method.requestType.fromJSON(parsed) as Record<string, unknown>
    const result = await client.call(endpoint, def, methodName, request, { timeoutMs: intOption(values['timeout-ms'], 'timeout-ms', 10000)! })
    process.stdout.write(`${formatJson(method.responseType.toJSON(result.response))}\n`)
    return 0
  } catch (err) {
    if (err instanceof RpcError) process.stderr.write(`error: ${err.codeName}: ${err.message}\n`)
    else process.stderr.write(`error: ${(err as Error).message}\n`)
    return 1
  } finally {
    client.close()
  }
}

/** JSON on one line with a space after each colon and comma: `{"result": 3}`. */
export function formatJson (value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(formatJson).join(', ')}]`
  if (value !== null && typeof value === 'object') {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${formatJson(v)}`).join(', ')}}`
  }
  return JSON.stringify(value) ?? 'null'
}
