import { RpcError } from '../codec/errors.js'
import type { QueueDiscipline } from '../scheduling/service-queue.js'

/** A usage error: the CLI prints its message on one line and exits 2. */
export function usageError (message: string): RpcError {
  return new RpcError('RPC_ERR_INVALID_ARGUMENT', message)
}

// Errors node:util's parseArgs throws for unknown options, missing values and stray arguments, and our own option checks.
export function isUsageError (err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return (typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS_')) ||
    (err instanceof RpcError && err.code === 'RPC_ERR_INVALID_ARGUMENT')
}

export function intOption (value: string | undefined, name: string, fallback?: number): number | undefined {
  if (value === undefined) return fallback
  const n = Number(value)
  if (!Number.isInteger(n)) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--${name} must be an integer, got '${value}'`)
  return n
}


export function discipline (value: string): QueueDiscipline {
  if (value !== 'edf' && value !== 'fifo') throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `--queue must be edf or fifo, got '${value}'`)
  return value
}

