/**
 * Shared set-up for the reactor end-to-end tests: a real Server with the
 * demo CalculatorService (or instrumented handlers), a Client, outcome
 * tallies, and a probe that reports what handlers saw.
 *
 * Nothing here sleeps on the wall clock: tests await events (a handler
 * started, a socket closed) and move FakeClocks by hand.
 */
import { RpcError } from '../../codec/errors.js'
import { krpcCodeName } from '../../codec/krpc/codes.js'
import type { Test } from 'tap'
import { Client, type ClientOptions } from '../../reactor/krpc/client.js'
import { Server, type AddServiceOptions, type KrpcServerOptions as ServerOptions, type ServiceHandlers } from '../../reactor/krpc/server.js'
import type { KrpcCallContext as CallContext } from '../../reactor/krpc/call.js'
import { FakeClock } from '../../scheduling/clock.js'
import type { ServiceDef } from '../../codec/protobuf/schema.js'
import { CalculatorService, calculatorHandlers, crc32, type CalculatorMethods, type SleepResponse } from '../../examples/calculator/index.js'

export { CalculatorService, calculatorHandlers, crc32 }
export type { CalculatorMethods }

/**
 * CalculatorService as the untyped ServiceDef that `Client.call` takes
 * (a `ServiceDef<CalculatorMethods>` is not assignable to `ServiceDef`).
 */
export const calculatorDef = CalculatorService as unknown as ServiceDef

export interface Running {
  server: Server
  port: number
  endpoint: string
}

export interface StartOptions extends ServerOptions {
  handlers?: ServiceHandlers<CalculatorMethods>
  serviceOptions?: AddServiceOptions
  /** Skip registering CalculatorService. */
  noService?: boolean
}

/**
 * Starts a server on 127.0.0.1 with an ephemeral port and closes it at the
 * end of the test. Teardown uses a zero grace period so a test that leaves
 * a handler hanging does not hold the suite; with a FakeClock the grace
 * timer is fired by advancing it by 0.
 */
export async function startServer (t: Test, options: StartOptions = {}): Promise<Running> {
  const { handlers, serviceOptions, noService, ...serverOptions } = options
  const server = new Server(serverOptions)
  if (noService !== true) server.addService(CalculatorService, handlers ?? calculatorHandlers, serviceOptions)
  const { port } = await server.listen(0)
  t.teardown(() => closeServer(server, serverOptions.clock))
  return { server, port, endpoint: `127.0.0.1:${port}` }
}

/** Closes `server` without waiting for a grace period. */
export async function closeServer (server: Server, clock?: unknown): Promise<void> {
  const closing = server.close({ graceMs: 0 })
  if (clock instanceof FakeClock) clock.advance(0)
  await closing
}

/** A client that is closed at the end of the test. */
export function newClient (t: Test, options: ClientOptions = {}): Client {
  const client = new Client(options)
  t.teardown(() => client.close())
  return client
}

/**
 * How one call settled: `OK`, a local code (`RPC_ERR_DEADLINE_EXCEEDED`), or
 * `REMOTE:<name>` for a server error. Anything that is not an RpcError is
 * reported as `THROWN:<message>` so a test sees it in the tally.
 */
export type Outcome = string

function outcomeOf (error: unknown): Outcome {
  if (error instanceof RpcError) return error.remote?.code !== undefined ? `REMOTE:${krpcCodeName(error.remote?.code)}` : error.code
  return `THROWN:${error instanceof Error ? error.message : String(error)}`
}

/** The RpcError a call failed with; throws if it succeeded or failed otherwise. */
export async function rejection (promise: Promise<unknown>): Promise<RpcError> {
  try {
    await promise
  } catch (error) {
    if (error instanceof RpcError) return error
    throw error
  }
  throw new Error('expected the call to fail')
}

export function settle (promise: Promise<unknown>): Promise<Outcome> {
  return promise.then(() => 'OK', outcomeOf)
}

/** Counts of each outcome, e.g. `{ OK: 3, RPC_ERR_CANCELLED: 2 }`. */
export function tally (outcomes: readonly Outcome[]): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const o of outcomes) counts[o] = (counts[o] ?? 0) + 1
  return counts
}

/**
 * Wraps a promise so a test can read whether it has settled and how many
 * times its callbacks ran (a promise settles once; this proves the client
 * also did not leak a second rejection somewhere else).
 */
export function track<T> (promise: Promise<T>): { settled: () => boolean, outcome: () => Outcome | undefined, done: Promise<Outcome> } {
  let outcome: Outcome | undefined
  const done = settle(promise).then((o) => { outcome = o; return o })
  return { settled: () => outcome !== undefined, outcome: () => outcome, done }
}

/** Lets pending I/O callbacks and immediates run `n` times. */
export async function turns (n = 1): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise<void>((resolve) => setImmediate(resolve))
}

/** What a probed handler saw of one call. */
export interface SeenCall {
  method: string
  callId: number
  deadline: number
  remainingMs: number
  user: string
  sidecars: number
}

/**
 * The demo handlers, instrumented: each call is recorded, `started(method, n)`
 * resolves once `n` calls of `method` have reached their handler, and Sleep
 * also ends (with an error) when its signal aborts, so a test that walks away
 * from a sleeping call does not leave a timer behind for long.
 */
export class Probe {
  readonly calls: SeenCall[] = []
  readonly #waiters: Array<{ method: string, n: number, resolve: () => void }> = []
  /** Per-call hooks, by method: run after recording, before the demo handler. */
  readonly hooks: Partial<Record<keyof CalculatorMethods, (ctx: CallContext) => void>> = {}

  count (method: string): number {
    return this.calls.filter(c => c.method === method).length
  }

  started (method: string, n = 1): Promise<void> {
    if (this.count(method) >= n) return Promise.resolve()
    return new Promise((resolve) => this.#waiters.push({ method, n, resolve }))
  }

  #record (method: keyof CalculatorMethods, ctx: CallContext): void {
    this.calls.push({
      method,
      callId: ctx.callId,
      deadline: ctx.deadline,
      remainingMs: ctx.remainingMs(),
      user: ctx.user,
      sidecars: ctx.sidecars.length
    })
    this.hooks[method]?.(ctx)
    for (let i = this.#waiters.length - 1; i >= 0; i--) {
      const w = this.#waiters[i]!
      if (w.method === method && this.count(method) >= w.n) {
        this.#waiters.splice(i, 1)
        w.resolve()
      }
    }
  }

  handlers (): ServiceHandlers<CalculatorMethods> {
    return {
      Add: (req, ctx) => { this.#record('Add', ctx); return calculatorHandlers.Add(req, ctx) },
      Echo: (req, ctx) => { this.#record('Echo', ctx); return calculatorHandlers.Echo(req, ctx) },
      PushStrings: (req, ctx) => { this.#record('PushStrings', ctx); return calculatorHandlers.PushStrings(req, ctx) },
      EchoSidecars: (req, ctx) => { this.#record('EchoSidecars', ctx); return calculatorHandlers.EchoSidecars(req, ctx) },
      Sleep: (req, ctx) => {
        this.#record('Sleep', ctx)
        return new Promise<SleepResponse>((resolve, reject) => {
          const signal = ctx.signal
          const onAbort = (): void => { clearTimeout(timer); reject(signal.reason) }
          const timer = setTimeout(() => {
            signal.removeEventListener('abort', onAbort)
            if (req.return_app_error === true) reject(new Error('Got some error'))
            else resolve({})
          }, req.sleep_micros / 1000)
          if (signal.aborted) onAbort()
          else signal.addEventListener('abort', onAbort, { once: true })
        })
      }
    }
  }
}

/** A byte pattern that differs at every offset mod 251, so a shifted or truncated copy has another CRC. */
export function pattern (size: number, seed = 0): Buffer {
  const out = Buffer.allocUnsafe(size)
  for (let i = 0; i < size; i++) out[i] = (i + seed) % 251
  return out
}

/** A small deterministic PRNG (mulberry32), so "random" cancellation points repeat run to run. */
export function prng (seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let x = a
    x = Math.imul(x ^ (x >>> 15), x | 1)
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61)
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296
  }
}

