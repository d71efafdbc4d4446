/**
 * The server side of `nyala fairness --reactors N` (N > 1): `nyala serve
 * --reactors N` in a process of its own, as users run it (its primary keeps
 * the shared scheduler and does nothing else), with the fairness run's
 * workers, queue length and discipline. Started from the entry its reactors
 * run (bin/serve-reactor, .ts from the sources with this process's loaders,
 * .js from dist/), which is `nyala serve` outside a cluster worker.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import { reactorExecArgv } from '../reactor/cluster.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'

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

const SERVE_ENTRY = fileURLToPath(new URL(`./serve-reactor${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url))
const START_TIMEOUT_MS = 60_000

export async function serveFairness (options: FairnessServerOptions): Promise<FairnessServer> {
  const args = ['serve', '--host', '127.0.0.1', '--port', '0', '--metrics-port', '0', '--reactors', String(options.reactors),
    '--workers', String(options.workers), '--queue-length', String(options.queueLength), '--queue', options.queue,
    '--shutdown-grace-ms', '0', ...(options.sharedScheduler ? [] : ['--no-shared-scheduler'])]
  const child = spawn(process.execPath, [...reactorExecArgv(process.execArgv), SERVE_ENTRY, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  const exited = once(child, 'exit')
  let out = ''
  let err = ''
  child.stderr.on('data', (d: Buffer) => { err += d.toString() })
  const started = await new Promise<{ port: number, metrics: string } | null>((resolve) => {
    const timer = setTimeout(() => resolve(null), START_TIMEOUT_MS)
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const port = /listening on \S+:(\d+)/.exec(out)?.[1]
      const metrics = /metrics on (\S+)/.exec(out)?.[1]
      if (port !== undefined && metrics !== undefined) {
        clearTimeout(timer)
        resolve({ port: Number(port), metrics })
      }
    })
    child.once('exit', () => { clearTimeout(timer); resolve(null) })
  })
  const close = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM')
      const kill = setTimeout(() => child.kill('SIGKILL'), 15_000)
      await exited
      clearTimeout(kill)
    }
  }
  if (started === null) {
    await close()
    throw new Error(`nyala serve --reactors ${options.reactors} did not start: ${err.trim().split('\n').slice(-3).join(' ')}`)
  }
  return {
    port: started.port,
    tooBusy: async () => {
      const text = await (await fetch(started.metrics)).text()
      let sum = 0
      for (const name of ['nyala_rpcs_queue_overflow_total', 'nyala_rpcs_evicted_total', 'nyala_rpcs_timed_out_in_queue_total']) {
        const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes('method="Sleep"'))
        if (line !== undefined) sum += Number(line.slice(line.lastIndexOf(' ') + 1)) || 0
      }
      return sum
    },
    close
  }
}
