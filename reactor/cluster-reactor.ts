/**
 * The reactor side of reactor/cluster.ts: what a `node:cluster` worker
 * forked by `serveReactors` runs, and the messages it exchanges with the
 * primary over IPC. A reactor builds its server, listens (through the
 * primary's round-robin handle, or on its own SO_REUSEPORT socket), answers
 * usage and metrics requests, and drains and exits when the primary asks,
 * when it gets SIGTERM or SIGINT, or when the primary is gone.
 */
import type { IoBackend } from '../transport/io.js'
import { ListenError, type ServesReactor as Server } from './server.js'
import { installSharedScheduling, SCHED_MESSAGE, type FromBroker, type SharedScheduling, type ToBroker } from './cluster-tokens.js'

// Environment of a reactor process, set by the primary.
export const ENV_SLOT = 'NYALA_REACTOR'
export const ENV_DISTRIBUTION = 'NYALA_REACTOR_DISTRIBUTION'
export const ENV_PORT = 'NYALA_REACTOR_PORT'
/** '1': the reactors share one scheduler per service (reactor/cluster-tokens.ts). */
export const ENV_SHARED = 'NYALA_REACTOR_SHARED_SCHEDULER'

export type ToReactor =
  | { type: 'nyala:reactor-usage', id: number }
  | { type: 'nyala:reactor-metrics', id: number }
  | { type: 'nyala:reactor-close' }
  | { type: typeof SCHED_MESSAGE, ops: FromBroker[] }

export type FromReactor =
  | { type: 'nyala:reactor-listening', host: string, port: number, io: IoBackend }
  | { type: 'nyala:reactor-failed', message: string, listen?: { code: string, host: string, port: number, message: string } }
  | { type: 'nyala:reactor-usage', id: number, usage: NodeJS.ResourceUsage }
  | { type: 'nyala:reactor-metrics', id: number, metrics: object[] }
  | { type: typeof SCHED_MESSAGE, ops: ToBroker[] }

/**
 * What a reactor reads of `serveReactors`' options (`ReactorsOptions` in
 * reactor/cluster.ts, which documents them); the rest is the primary's.
 */
export interface ReactorOptions {
  /** The address to listen on. */
  host: string
  /** The port to listen on, unless the primary names the one it bound (`ENV_PORT`). */
  port: number
  /** Makes this reactor's server. */
  build: () => Server | Promise<Server>
  /** Passed to the server's `setMaxConnectionAgeMs`; default: no limit. */
  maxConnectionAgeMs?: number
  /** The server's shutdown grace (`close({ graceMs })`). */
  graceMs?: number
}

/** Runs in a reactor process: builds and listens, answers the primary, drains and exits when asked; never resolves. */
export function runReactor (options: ReactorOptions): Promise<never> {
  const distribution = process.env[ENV_DISTRIBUTION] === 'reusePort' ? 'reusePort' : 'round-robin'
  const port = Number(process.env[ENV_PORT] ?? options.port)
  let server: Server | null = null
  let listening = false
  let closing = false
  const send = (message: FromReactor, then?: () => void): void => {
    if (process.send === undefined || !process.connected) {
      then?.()
      return
    }
    process.send(message, undefined, {}, () => then?.())
  }
  // Drains and exits; a reactor that is not listening yet has no calls to drain.
  const close = (): void => {
    if (closing) return
    closing = true
    if (server === null || !listening) process.exit(0)
    server.close(options.graceMs === undefined ? {} : { graceMs: options.graceMs }).then(() => process.exit(0), () => process.exit(1))
  }
  // Set up before build(): the server's service pools join the shared scheduler as they are made.
  let scheduling: SharedScheduling | null = null
  if (process.env[ENV_SHARED] === '1') scheduling = installSharedScheduling((ops) => send({ type: SCHED_MESSAGE, ops }))
  process.on('message', (message: ToReactor) => {
    switch (message?.type) {
      case SCHED_MESSAGE:
        scheduling?.receive(message.ops)
        break
      case 'nyala:reactor-usage':
        send({ type: 'nyala:reactor-usage', id: message.id, usage: process.resourceUsage() })
        break
      case 'nyala:reactor-metrics':
        if (server === null) send({ type: 'nyala:reactor-metrics', id: message.id, metrics: [] })
        else {
          server.metrics.registry.getMetricsAsJSON().then(
            (metrics) => send({ type: 'nyala:reactor-metrics', id: message.id, metrics }),
            () => send({ type: 'nyala:reactor-metrics', id: message.id, metrics: [] }))
        }
        break
      case 'nyala:reactor-close':
        close()
        break
    }
  })
  // A signal to the process group (Ctrl-C) reaches the reactors too; the
  // primary's own close request then finds them draining already. A primary
  // that died leaves its reactors without a channel: they drain and exit.
  process.on('SIGTERM', close)
  process.on('SIGINT', close)
  process.on('disconnect', () => {
    scheduling?.lost()
    close()
  })

  const start = async (): Promise<void> => {
    server = await options.build()
    if (options.maxConnectionAgeMs !== undefined) server.setMaxConnectionAgeMs(options.maxConnectionAgeMs)
    const bound = await server.listen(port, options.host, { reusePort: distribution === 'reusePort' })
    listening = true
    send({ type: 'nyala:reactor-listening', host: bound.address, port: bound.port, io: server.stats().io })
  }
  start().catch((err: unknown) => {
    const message = err instanceof Error ? err.message : String(err)
    // A listen that could not bind goes back whole, so the primary rejects with the same ListenError.
    const cause = err instanceof ListenError ? err.cause as Error | undefined : undefined
    const listen = err instanceof ListenError ? { code: err.code, host: err.host, port: err.port, message: cause?.message ?? err.message } : undefined
    send({ type: 'nyala:reactor-failed', message, ...(listen === undefined ? {} : { listen }) }, () => process.exit(1))
  })
  return new Promise<never>(() => {})
}
