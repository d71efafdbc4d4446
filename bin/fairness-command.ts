import { parseArgs } from 'node:util'
import { RpcError } from '../codec/errors.js'
import { DEFAULT_FAIRNESS, formatFairness, runFairness, type FairnessResult } from './fairness.js'
import { discipline, intOption } from './options.js'

export const FAIRNESS_USAGE = `  nyala fairness [--queue edf|fifo|edf,fifo] [--clients 18] [--workers 3]
              [--queue-length 10] [--sleep-ms 100] [--deadline-ms 8000]
              [--run-seconds 5] [--backoff exp|linear|exp,linear] [--json]
              [--reactors 1] [--no-shared-scheduler]
      A fairness test (docs/scheduling.md): a server with few workers and
      more clients than it can serve, each looping on Sleep with retries
      that keep the deadline. Prints per-client successes, min/average,
      Jain's index, TOO_BUSY answers and latency percentiles, one block per
      queue x backoff combination, all in the same run. --reactors N (N > 1)
      serves from N reactor processes, each with --workers and
      --queue-length, sharing one scheduler (--no-shared-scheduler: one
      each); --clients then defaults to 18 x N.
`

export async function fairness (args: string[]): Promise<number> {
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
      reactors: { type: 'string' },
      'no-shared-scheduler': { type: 'boolean', default: false },
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
  const reactors = intOption(values.reactors, 'reactors', d.reactors)!
  if (reactors < 1) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--reactors must be at least 1, got ${reactors}`)
  const base = {
    reactors,
    sharedScheduler: !values['no-shared-scheduler'],
    clients: intOption(values.clients, 'clients', d.clients * reactors)!,
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

