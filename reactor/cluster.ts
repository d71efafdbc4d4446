/**
 * Reactors in cluster processes: one `Server` per process, N
 * processes sharing one listening port, supervised by the `node:cluster`
 * primary. Kudu runs N reactor threads in one process (docs/design.md,
 * 'Reactors'); a
 * Node process has one event loop, so a reactor here is a process that owns
 * its connections, its service queues and its workers.
 *
 * The same script runs in the primary and in every reactor: the primary's
 * `serveReactors` forks the reactors and resolves with a `Reactors` handle;
 * a reactor's `serveReactors` builds the server, listens, answers the
 * primary's requests (usage, metrics, close) and never resolves.
 *
 * Distribution: Node 20 has no `reusePort`, so the primary accepts and hands
 * connections to the reactors round-robin (`SCHED_RR`). On Node ≥ 22.12 on
 * Linux each reactor binds the port itself with `SO_REUSEPORT` and the
 * kernel spreads connections. See docs/cluster.md.
 */
import cluster, { type Worker } from 'node:cluster'
import { AggregatorRegistry, Counter, Gauge, Registry } from 'prom-client'
import { ErrorCode, RpcError } from '../codec/errors.js'
import type { IoBackend } from '../transport/io.js'
import { ListenError, type ServesReactor as Server } from './server.js'
import { resolveLogger, type Logger } from './logger.js'
import { isEvalFlag, reactorExecArgv } from './reactor-exec-argv.js'
import { ENV_DISTRIBUTION, ENV_PORT, ENV_SHARED, ENV_SLOT, runReactor, type FromReactor, type ToReactor } from './cluster-reactor.js'
import { ClusterBroker } from './cluster-broker.js'
import { SCHED_MESSAGE } from './cluster-tokens.js'

/** Options of `serveReactors`: the processes, the address they share, and their supervision. */
export interface ReactorsOptions {
  /** Reactor processes; 1 serves in this process, without forking (the embedded default). */
  reactors: number
  /** The address every reactor listens on (an IP or a name, as `Server.listen` takes it). */
  host: string
  /** 0 picks a free port; every reactor then serves that one port. */
  port: number
  /** Called in each reactor process to make its server, services registered. */
  build: () => Server | Promise<Server>
  /**
   * Connections older than this (±10 % jitter) are drained and closed: calls
   * in flight are answered, later calls on them are refused with
   * FATAL_SERVER_SHUTTING_DOWN (which clients retry on a new connection), so
   * long-lived clients rebalance across reactors. Default: no limit.
   */
  maxConnectionAgeMs?: number
  /** Shutdown grace per reactor (`Server.close`); default 30 s. */
  graceMs?: number
  /** Delay before restarting a reactor that died: `baseMs × 2^(deaths − 1)`, at most `maxMs`. Default 100 ms .. 10 s. */
  restartBackoff?: {
    /** The first restart's delay, in ms. */
    baseMs: number
    /** The longest delay, in ms. */
    maxMs: number
  }
  /** Script the reactor processes run; default `process.argv[1]`. It must call `serveReactors` with the same options. */
  exec?: string
  /** Arguments of that script; default `process.argv.slice(2)`. */
  args?: string[]
  /** Node options of the reactor processes; default this process's `execArgv` minus `--eval`/`--print`/`--input-type`. */
  execArgv?: string[]
  /** Forces a distribution; default `reusePort` where supported (Node ≥ 22.12 on Linux), else `round-robin`. */
  distribution?: 'round-robin' | 'reusePort'
  /** Supervision events (a reactor died, restarts), with fields; default: warnings and errors on stderr; `null` silences them. */
  logger?: Logger | null
  /** One scheduler per service shared by all reactors (docs/scheduling.md, 'Several reactors: one scheduler'); default true, false: one each. */
  sharedScheduler?: boolean
}

/** The serving processes, seen from the primary (or from the one process with `reactors: 1`). */
export interface Reactors {
  /** Where the reactors listen: the address bound, once the first reactor listens (the port chosen for port 0). */
  readonly address: {
    /** The address bound. */
    host: string
    /** The port bound. */
    port: number
  }
  /** The transport the reactors serve on (`io_uring`, `epoll` or `node`): the first listening reactor's, as its server's `stats().io` says. */
  readonly io: 'io_uring' | 'epoll' | 'node'
  /** How connections reach the reactors: `single` with `reactors: 1` (this process serves). */
  readonly distribution: 'round-robin' | 'reusePort' | 'single'
  /** Every process serving: the primary first in cluster mode, then the reactors that listen (not one still starting). */
  pids (): number[]
  /** `process.resourceUsage()` of every serving process, the primary included, in `pids()` order. */
  resourceUsage (): Promise<NodeJS.ResourceUsage[]>
  /** Like `resourceUsage`, each entry with its pid (a reactor may die between two calls). */
  processUsage (): Promise<ProcessUsage[]>
  /** Prometheus text, summed over the reactors, plus the supervisor's own metrics. */
  metricsText (): Promise<string>
  /** Graceful: every reactor drains (calls in flight and queued are answered), then exits. */
  close (): Promise<void>
}

/** One serving process's resource usage (`Reactors.processUsage`). */
export interface ProcessUsage {
  /** The process's id. */
  pid: number
  /** Its `process.resourceUsage()`. */
  usage: NodeJS.ResourceUsage
}

const DEFAULT_BACKOFF = { baseMs: 100, maxMs: 10_000 }
/** A reactor that ran this long (or `maxMs`, if longer) before dying restarts after `baseMs` again. */
const STABLE_AFTER_MS = 10_000
/** A reactor still alive this long after its grace period is killed. */
const CLOSE_KILL_AFTER_MS = 10_000
/** How long the primary waits for a reactor's answer to a usage or metrics request. */
const REQUEST_TIMEOUT_MS = 5000

/** True in a reactor process forked by `serveReactors`. */
export function isReactorWorker (): boolean {
  return cluster.isWorker && process.env[ENV_SLOT] !== undefined
}

/** True when `server.listen({ reusePort })` spreads connections over processes: Node ≥ 22.12 (or ≥ 23.1) on Linux. */
export function reusePortSupported (version = process.versions.node, platform: string = process.platform): boolean {
  const [major = 0, minor = 0] = version.split('.').map(Number)
  const recent = major >= 24 || (major === 23 && minor >= 1) || (major === 22 && minor >= 12)
  return recent && platform === 'linux'
}

/**
 * Serves `build()`'s server on `host:port` in `reactors` processes. In the
 * primary, resolves once every reactor listens. If one fails to start, it
 * rejects once every reactor it forked has exited (and, in one process,
 * the server is closed): with a `ListenError` (`code` EADDRINUSE, ...,
 * `host`, `port`) when the port could not be bound, RPC_ERR_INVALID_ARGUMENT
 * for a port outside 0-65535, else an Error naming the reactor and why. In a
 * reactor process, builds and listens, and the promise never settles: the
 * process exits when the primary closes it.
 */
export function serveReactors (options: ReactorsOptions): Promise<Reactors> {
  if (isReactorWorker()) return runReactor(options)
  if (!Number.isInteger(options.reactors) || options.reactors < 1) {
    return Promise.reject(new RangeError(`reactors must be an integer >= 1, got ${options.reactors}`))
  }
  if (!Number.isInteger(options.port) || options.port < 0 || options.port > 65535) {
    return Promise.reject(new RpcError(ErrorCode.INVALID_ARGUMENT, `port must be an integer 0-65535, got ${options.port}`))
  }
  if (options.reactors === 1) return serveInProcess(options)
  if (!cluster.isPrimary) return Promise.reject(new Error('serveReactors with reactors > 1 must run in a cluster primary'))
  return new ClusterReactors(options).start()
}

async function serveInProcess (options: ReactorsOptions): Promise<Reactors> {
  const server = await options.build()
  if (options.maxConnectionAgeMs !== undefined) server.setMaxConnectionAgeMs(options.maxConnectionAgeMs)
  let bound: Awaited<ReturnType<Server['listen']>>
  try {
    bound = await server.listen(options.port, options.host)
  } catch (err) {
    // Nothing may stay behind (worker threads, timers): the caller gets the error alone.
    await server.close({ graceMs: 0 }).catch(() => {})
    throw err
  }
  const supervisor = supervisorMetrics(() => 1)
  let closing: Promise<void> | null = null
  const usage = (): ProcessUsage[] => [{ pid: process.pid, usage: process.resourceUsage() }]
  return {
    address: { host: bound.address, port: bound.port },
    io: server.stats().io,
    distribution: 'single',
    pids: () => [process.pid],
    resourceUsage: async () => usage().map(u => u.usage),
    processUsage: async () => usage(),
    metricsText: async () => {
      const metrics = [await server.metrics.registry.getMetricsAsJSON(), await supervisor.registry.getMetricsAsJSON()]
      return await AggregatorRegistry.aggregate(metrics).metrics()
    },
    close: () => {
      closing ??= server.close(options.graceMs === undefined ? {} : { graceMs: options.graceMs })
      return closing
    }
  }
}

// ---------------------------------------------------------------------------
// The primary: forks, supervises and closes the reactors.

interface Slot {
  readonly index: number
  worker: Worker | null
  startedAt: number
  /** Deaths since the reactor last ran stably; sets the next restart delay. */
  deaths: number
  restartTimer: NodeJS.Timeout | null
  /** Last failure the reactor reported before exiting. */
  failure: string | null
  /** That failure, when it was a listen that could not bind. */
  listenFailure: { code: string, host: string, port: number, message: string } | null
  listening: boolean
  /** The port the reactor was told to listen on (0 or the real one). */
  port: number
  /** The reactor is closing because it got a port of its own; fork it again on the real one. */
  moving: boolean
}

interface Pending { resolve: (reply: FromReactor | null) => void, timer: NodeJS.Timeout, worker: Worker }

class ClusterReactors implements Reactors {
  readonly distribution: 'round-robin' | 'reusePort'
  readonly #options: ReactorsOptions
  readonly #log: Logger
  readonly #backoff: { baseMs: number, maxMs: number }
  readonly #slots: Slot[] = []
  readonly #pending = new Map<number, Pending>()
  readonly #supervisor = supervisorMetrics(() => this.#slots.filter(s => s.worker !== null).length)
  /** The scheduler the reactors share (null: each has its own), and the reactors by cluster worker id for its answers. */
  readonly #broker: ClusterBroker | null
  readonly #byId = new Map<number, Worker>()
  #address: { host: string, port: number } | null = null
  #io: IoBackend = 'node'
  #nextId = 1
  #started: { resolve: () => void, reject: (err: Error) => void } | null = null
  #closing: Promise<void> | null = null
  #closed: (() => void) | null = null

  constructor (options: ReactorsOptions) {
    this.#options = options
    this.#log = resolveLogger(options.logger)
    this.#backoff = options.restartBackoff ?? DEFAULT_BACKOFF
    this.distribution = options.distribution ?? (reusePortSupported() ? 'reusePort' : 'round-robin')
    const toReactor = (reactor: number, message: ToReactor): void => {
      const worker = this.#byId.get(reactor)
      if (worker !== undefined) send(worker, message)
    }
    this.#broker = options.sharedScheduler === false ? null : new ClusterBroker(toReactor)
  }

  get io (): IoBackend {
    return this.#io
  }

  get address (): { host: string, port: number } {
    return this.#address ?? { host: this.#options.host, port: this.#options.port }
  }

  start (): Promise<Reactors> {
    const evaluated = process.execArgv.some(isEvalFlag)
    const exec = this.#options.exec ?? (evaluated ? undefined : process.argv[1])
    if (exec === undefined) {
      return Promise.reject(new Error('serveReactors: this process runs --eval code or has no script; pass `exec`, the script the reactor processes run'))
    }
    // Round-robin must be chosen before the first fork; cluster freezes it then.
    if (this.distribution === 'round-robin') cluster.schedulingPolicy = cluster.SCHED_RR
    cluster.setupPrimary({
      exec,
      args: this.#options.args ?? (evaluated ? [] : process.argv.slice(2)),
      execArgv: this.#options.execArgv ?? reactorExecArgv(process.execArgv)
    })
    const started = new Promise<void>((resolve, reject) => { this.#started = { resolve, reject } })
    for (let index = 0; index < this.#options.reactors; index++) {
      this.#slots.push({ index, worker: null, startedAt: 0, deaths: 0, restartTimer: null, failure: null, listenFailure: null, listening: false, port: this.#options.port, moving: false })
    }
    // With reusePort and port 0, the first reactor picks the port the others join.
    const first = this.distribution === 'reusePort' && this.#options.port === 0 ? [this.#slots[0]!] : this.#slots
    for (const slot of first) this.#fork(slot)
    return started.then(() => this)
  }

  pids (): number[] {
    return [process.pid, ...this.#live().map(worker => worker.process.pid!)]
  }

  async resourceUsage (): Promise<NodeJS.ResourceUsage[]> {
    return (await this.processUsage()).map(u => u.usage)
  }

  async processUsage (): Promise<ProcessUsage[]> {
    const own: ProcessUsage = { pid: process.pid, usage: process.resourceUsage() }
    const replies = await Promise.all(this.#live().map(async (worker) => {
      const reply = await this.#request(worker, 'nyala:reactor-usage')
      return reply?.type === 'nyala:reactor-usage' ? { pid: worker.process.pid!, usage: reply.usage } : null
    }))
    return [own, ...replies.filter((u): u is ProcessUsage => u !== null)]
  }

  async metricsText (): Promise<string> {
    const replies = await Promise.all(this.#live().map(worker => this.#request(worker, 'nyala:reactor-metrics')))
    const metrics: object[][] = [await this.#supervisor.registry.getMetricsAsJSON()]
    for (const reply of replies) if (reply?.type === 'nyala:reactor-metrics') metrics.push(reply.metrics)
    return await AggregatorRegistry.aggregate(metrics).metrics()
  }

  close (): Promise<void> {
    if (this.#closing !== null) return this.#closing
    if (this.#started !== null) {
      this.#started.reject(new Error('the reactors were closed before all of them listened'))
      this.#started = null
    }
    this.#closing = new Promise<void>((resolve) => {
      this.#closed = resolve
      const killAfterMs = (this.#options.graceMs ?? 30_000) + CLOSE_KILL_AFTER_MS
      for (const slot of this.#slots) {
        if (slot.restartTimer !== null) clearTimeout(slot.restartTimer)
        slot.restartTimer = null
        const worker = slot.worker
        if (worker === null) continue
        send(worker, { type: 'nyala:reactor-close' })
        setTimeout(() => {
          if (slot.worker !== worker) return
          this.#log.error(`reactor ${slot.index} (pid ${worker.process.pid}) still runs ${killAfterMs} ms after close; killing it`, { reactor: slot.index, pid: worker.process.pid, killAfterMs })
          worker.process.kill('SIGKILL')
        }, killAfterMs).unref()
      }
      this.#maybeClosed()
    })
    return this.#closing
  }

  #live (): Worker[] {
    const workers: Worker[] = []
    for (const slot of this.#slots) if (slot.worker !== null && slot.listening) workers.push(slot.worker)
    return workers
  }

  #fork (slot: Slot, port = this.#listenPort()): void {
    slot.restartTimer = null
    slot.failure = null
    slot.listenFailure = null
    slot.listening = false
    slot.moving = false
    slot.port = port
    const worker = cluster.fork({ [ENV_SLOT]: String(slot.index), [ENV_DISTRIBUTION]: this.distribution, [ENV_PORT]: String(port), [ENV_SHARED]: this.#broker === null ? '0' : '1' })
    slot.worker = worker
    this.#byId.set(worker.id, worker)
    slot.startedAt = Date.now()
    worker.on('message', (message: FromReactor) => this.#onReactorMessage(slot, worker, message))
    // IPC errors (a channel closed under a send) surface as the exit below.
    worker.on('error', (err: NodeJS.ErrnoException) => this.#log.warn(`reactor ${slot.index} (pid ${worker.process.pid}): ${err.message}`, { reactor: slot.index, pid: worker.process.pid, code: err.code }))
    worker.once('exit', (code: number | null, signal: string | null) => this.#onReactorExit(slot, worker, code, signal))
    this.#log.info(`reactor ${slot.index} (pid ${worker.process.pid}) started, listening on port ${port}`, { reactor: slot.index, pid: worker.process.pid, port })
  }

  // The port a new reactor listens on. With reusePort, the real one. With
  // round-robin, the one the live reactors asked for: the primary shares one
  // handle per requested address, so a reactor asking for port 0 again joins
  // them; once none is alive that handle is gone and the real port is bound anew.
  // A reactor forked while the last one in the handle was dying may find the
  // handle gone when it asks; it then gets a new port and is moved (below).
  #listenPort (): number {
    if (this.#address === null) return this.#options.port
    if (this.distribution === 'reusePort') return this.#address.port
    const alive = this.#slots.find(s => s.worker !== null && !s.moving)
    return alive === undefined ? this.#address.port : alive.port
  }

  #onReactorMessage (slot: Slot, worker: Worker, message: FromReactor): void {
    switch (message?.type) {
      case SCHED_MESSAGE:
        this.#broker?.receive(worker.id, message.ops)
        return
      case 'nyala:reactor-listening': {
        if (this.#address !== null && message.port !== this.#address.port && this.#closing === null) {
          // Round-robin with port 0: the primary's handle for port 0 closed
          // with the last reactor in it before this one asked, so this one got
          // a port of its own that no client knows. Move it to the real port.
          this.#log.warn(`reactor ${slot.index} (pid ${worker.process.pid}) got port ${message.port}, not ${this.#address.port}; restarting it on ${this.#address.port}`,
            { reactor: slot.index, pid: worker.process.pid, port: message.port, wantedPort: this.#address.port })
          slot.moving = true
          send(worker, { type: 'nyala:reactor-close' })
          return
        }
        slot.listening = true
        if (this.#address === null) this.#io = message.io
        this.#address ??= { host: message.host, port: message.port }
        this.#log.info(`reactor ${slot.index} (pid ${worker.process.pid}) listening on ${message.host}:${message.port}`, { reactor: slot.index, pid: worker.process.pid, host: message.host, port: message.port })
        if (this.#closing !== null) {
          send(worker, { type: 'nyala:reactor-close' })
          return
        }
        if (this.#started !== null) {
          // reusePort with port 0: the first reactor's port is known now.
          for (const other of this.#slots) if (other.worker === null && other.restartTimer === null && other.deaths === 0) this.#fork(other)
          if (this.#slots.every(s => s.listening)) {
            const started = this.#started
            this.#started = null
            started.resolve()
          }
        }
        return
      }
      case 'nyala:reactor-failed':
        slot.failure = message.message
        slot.listenFailure = message.listen ?? null
        return
      case 'nyala:reactor-usage':
      case 'nyala:reactor-metrics': {
        const pending = this.#pending.get(message.id)
        if (pending === undefined) return
        this.#pending.delete(message.id)
        clearTimeout(pending.timer)
        pending.resolve(message)
      }
    }
  }

  #onReactorExit (slot: Slot, worker: Worker, code: number | null, signal: string | null): void {
    this.#byId.delete(worker.id)
    this.#broker?.leave(worker.id) // what it held of the shared scheduler is reclaimed
    if (slot.worker !== worker) return
    slot.worker = null
    slot.listening = false
    for (const [id, pending] of this.#pending) {
      if (pending.worker !== worker) continue
      this.#pending.delete(id)
      clearTimeout(pending.timer)
      pending.resolve(null)
    }
    const how = signal !== null ? `was killed by ${signal}` : `exited with code ${code}`
    const why = slot.failure === null ? '' : `: ${slot.failure}`
    if (this.#closing !== null) {
      this.#log.info(`reactor ${slot.index} (pid ${worker.process.pid}) ${how}`, { reactor: slot.index, pid: worker.process.pid, exitCode: code, signal })
      this.#maybeClosed()
      return
    }
    if (slot.moving && this.#address !== null) {
      this.#fork(slot, this.#address.port)
      return
    }
    if (this.#started !== null) {
      // Still starting: a reactor that cannot start (port in use, build threw)
      // fails the start, once every other reactor has exited too.
      const started = this.#started
      this.#started = null
      const failure = slot.listenFailure
      const error = failure !== null
        ? new ListenError(Object.assign(new Error(failure.message), { code: failure.code }), failure.host, failure.port)
        : new Error(`reactor ${slot.index} (pid ${worker.process.pid}) ${how} before listening${why}`)
      this.#log.info(`reactor ${slot.index} (pid ${worker.process.pid}) ${how} before listening${why}; closing the others`,
        { reactor: slot.index, pid: worker.process.pid, exitCode: code, signal, ...(failure === null ? {} : { code: failure.code }) })
      this.close().then(() => started.reject(error), () => started.reject(error))
      return
    }
    const ranMs = Date.now() - slot.startedAt
    if (ranMs >= Math.max(STABLE_AFTER_MS, this.#backoff.maxMs)) slot.deaths = 0
    slot.deaths++
    const delayMs = restartDelayMs(slot.deaths, this.#backoff)
    this.#supervisor.restarts.inc()
    this.#log.warn(`reactor ${slot.index} (pid ${worker.process.pid}) ${how} after ${ranMs} ms${why}; restarting it in ${delayMs} ms`,
      { reactor: slot.index, pid: worker.process.pid, exitCode: code, signal, ranMs, restartInMs: delayMs, deaths: slot.deaths, ...(slot.failure === null ? {} : { failure: slot.failure }) })
    slot.restartTimer = setTimeout(() => this.#fork(slot), delayMs)
  }

  #maybeClosed (): void {
    if (this.#closed === null) return
    if (this.#slots.some(s => s.worker !== null)) return
    const closed = this.#closed
    this.#closed = null
    this.#broker?.close()
    closed()
  }

  #request (worker: Worker, type: 'nyala:reactor-usage' | 'nyala:reactor-metrics'): Promise<FromReactor | null> {
    const id = this.#nextId++
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id)
        resolve(null)
      }, REQUEST_TIMEOUT_MS)
      this.#pending.set(id, { resolve, timer, worker })
      send(worker, { type, id })
    })
  }
}

/**
 * Delay before the restart that follows a reactor's `deaths`-th death in a
 * row: `baseMs`, doubling per death, at most `maxMs`. Deaths in a row are
 * counted until a reactor runs for `max(10 s, maxMs)`.
 */
export { reactorExecArgv } from './reactor-exec-argv.js'

export function restartDelayMs (deaths: number, backoff: { baseMs: number, maxMs: number }): number {
  return Math.min(backoff.maxMs, backoff.baseMs * 2 ** Math.max(0, deaths - 1))
}

function send (worker: Worker, message: ToReactor): void {
  if (!worker.isConnected()) return
  // With a callback, a send on a closing channel reports to it instead of throwing.
  worker.send(message, undefined, () => {})
}

interface SupervisorMetrics { registry: Registry, restarts: Counter }

// The primary's own metrics, merged into the reactors' sums.
function supervisorMetrics (reactors: () => number): SupervisorMetrics {
  const registry = new Registry()
  const restarts = new Counter({ name: 'nyala_reactor_restarts_total', help: 'Reactor processes restarted after they died.', registers: [registry] })
  // eslint-disable-next-line no-new -- registered on `registry`, read when scraped
  new Gauge({ name: 'nyala_reactors', help: 'Reactor processes running.', registers: [registry], collect () { this.set(reactors()) } })
  return { registry, restarts }
}
