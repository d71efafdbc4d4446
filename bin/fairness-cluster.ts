/**
 * The server side of `nyala fairness --reactors N` (N > 1): the calculator
 * service served by N reactor processes (`serveReactors`), sharing one
 * scheduler unless `--no-shared-scheduler`. This process is their primary
 * (and the broker of the shared scheduler) and runs the clients too; the
 * reactors run bin/fairness-reactor (.ts from the sources, .js from dist/)
 * with the options as one JSON argument.
 */
import { fileURLToPath } from 'node:url'
import { serveReactors } from '../reactor/cluster.js'
import { Server } from '../reactor/krpc/server.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'
import { CalculatorService, calculatorHandlers } from '../examples/calculator/index.js'

/** What the reactors are built with. */
export interface FairnessServerOptions {
  reactors: number
  workers: number
  queueLength: number
  queue: QueueDiscipline
  sharedScheduler: boolean
}

/** A running fairness server. */
export interface FairnessServer {
  port: number
  /** ERROR_SERVER_TOO_BUSY answers to Sleep so far (refused, evicted, expired in the queue), over every reactor. */
  tooBusy: () => Promise<number>
  close: () => Promise<void>
}

const REACTOR_ENTRY = fileURLToPath(new URL(`./fairness-reactor${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url))

function build (options: FairnessServerOptions): Server {
  return new Server({ workers: options.workers, queueLength: options.queueLength, queue: options.queue })
    .addService(CalculatorService, calculatorHandlers)
}

/** In a reactor process: serves (never resolves). In the primary: resolves once every reactor listens. */
export async function serveFairness (options: FairnessServerOptions): Promise<FairnessServer> {
  const reactors = await serveReactors({
    reactors: options.reactors,
    host: '127.0.0.1',
    port: 0,
    graceMs: 0,
    build: () => build(options),
    exec: REACTOR_ENTRY,
    args: [JSON.stringify(options)],
    sharedScheduler: options.sharedScheduler,
    logger: null
  })
  return {
    port: reactors.address.port,
    tooBusy: async () => {
      const text = await reactors.metricsText()
      let sum = 0
      for (const name of ['nyala_rpcs_queue_overflow_total', 'nyala_rpcs_evicted_total', 'nyala_rpcs_timed_out_in_queue_total']) {
        const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes('method="Sleep"'))
        if (line !== undefined) sum += Number(line.slice(line.lastIndexOf(' ') + 1)) || 0
      }
      return sum
    },
    close: () => reactors.close()
  }
}
