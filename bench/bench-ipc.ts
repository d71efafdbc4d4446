/**
 * What the processes of `nyala bench` say to each other over their IPC
 * channels, and how they are started.
 *
 * - The bench process (bin/bench.ts, bench/rpc-bench.ts) only orchestrates.
 * - One server process per system and run (`bench-server.ts`, or `nyala
 *   serve` itself). It speaks the serve IPC contract: it sends
 *   `nyala:listening` once it accepts connections and answers `nyala:usage`
 *   with `process.resourceUsage()` of every server process (all reactors).
 * - One to `availableParallelism()` load processes (`bench-load.ts`), each
 *   owning some of the client connections.
 */
import { fork, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'

/**
 * The systems `--against` names. `nyala` calls as rpc-bench does: sync mode
 * awaits each call's promise (SyncRequest), async mode re-issues each chain's
 * call from the last one's callback (AsyncRequest, the stub's callback
 * form). `nyala-promise` awaits promises in both modes (the same server).
 * `nyala-tls` is `nyala` with every call encrypted: KRPC's TLS inside
 * negotiation, `encryptLoopback` on the server and its clients.
 */
export const SYSTEMS = ['nyala', 'nyala-promise', 'nyala-tls', 'raw', 'grpc'] as const
export type System = typeof SYSTEMS[number]

/** The server a system's runs use. */
export function serverOf (system: System): 'nyala' | 'raw' | 'grpc' {
  return system === 'nyala-promise' || system === 'nyala-tls' ? 'nyala' : system
}

/** `nyala serve`'s IPC contract: sent once the server accepts connections. */
export interface ListeningMessage { type: 'nyala:listening', host: string, port: number, pids: number[] }
/** `nyala serve`'s IPC contract: a request for the server processes' resource usage. */
export interface UsageRequest { type: 'nyala:usage', id: number }
/** `nyala serve`'s IPC contract: the answer, one `ResourceUsage` per pid, in the same order. */
export interface UsageAnswer { type: 'nyala:usage', id: number, usage: NodeJS.ResourceUsage[], pids: number[] }

/** What a load process is asked to do (bench → load). */
export interface LoadPlan {
  type: 'plan'
  system: System
  host: string
  port: number
  /** Outstanding calls on each of this process's connections (one entry per connection). */
  chains: number[]
  /** Request payload bytes: 0 means `Add` (raw: an 8-byte frame, the size of Add's body). */
  payloadBytes: number
  /** Timeout of each call, where the system has one (as rpc-bench's 10 s). */
  callTimeoutMs: number
  /** nyala's client busy-polling window in µs; 0: off. */
  busyPollUs: number
  /** How a nyala load calls: awaiting the stub's promise, or through its callback form. */
  api: 'promise' | 'callback'
  /** nyala-tls: the CA (PEM) the server's certificate is checked against; the connections are encrypted. null: plain. */
  tlsCa: string | null
}

/** The measured window, in epoch milliseconds (`performance.timeOrigin + performance.now()`), and the go signal. */
export interface LoadGo { type: 'go', startAt: number, endAt: number }

/** load → bench: connections are up and one call on each was answered. */
export interface LoadReady { type: 'ready' }

/** load → bench: the run is over. */
export interface LoadDone {
  type: 'done'
  /** Calls answered inside the window. */
  calls: number
  /** Calls that failed (any time). */
  errors: number
  firstError: string | null
  /** HdrHistogram, compressed base64, of the window's calls (µs). */
  latencies: string
  /** The load process's CPU time inside the window, µs. */
  userCpuUs: number
  systemCpuUs: number
}

/** load → bench: it could not run. */
export interface LoadFailed { type: 'failed', error: string }

/** Epoch milliseconds with sub-millisecond resolution, comparable across processes of one machine. */
export function epochNow (): number {
  return performance.timeOrigin + performance.now()
}

/**
 * Forks `name` (a module beside this one: `.ts` when running from sources
 * under a TypeScript loader, `.js` from dist/) with an IPC channel. Only the
 * loader flags of this process are passed on (`-e` and its script are not);
 * `extraExecArgv` adds others (e.g. `--cpu-prof`).
 */
export function forkSibling (name: string, args: readonly string[], extraExecArgv: readonly string[] = []): ChildProcess {
  const extension = import.meta.url.endsWith('.ts') ? '.ts' : '.js'
  const path = fileURLToPath(new URL(`./${name}${extension}`, import.meta.url))
  const loaders = process.execArgv.filter((arg) => /^--(import|loader|experimental-loader|require)=/.test(arg) || arg === '--enable-source-maps')
  return fork(path, [...args], { execArgv: [...loaders, ...extraExecArgv], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
}

/** Resolves with the first message from `child` that `accept` takes; rejects if the child exits first. */
export function nextMessage<T> (child: ChildProcess, accept: (message: unknown) => message is T, what: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (message: unknown): void => {
      if (!accept(message)) return
      cleanup()
      resolve(message)
    }
    const onExit = (code: number | null, signal: string | null): void => {
      cleanup()
      reject(new Error(`${what}: the process exited (${signal ?? `code ${code}`}) before answering`))
    }
    const cleanup = (): void => {
      child.off('message', onMessage)
      child.off('exit', onExit)
    }
    child.on('message', onMessage)
    child.once('exit', onExit)
  })
}

/** A type guard for messages of one `type`. */
export function ofType<T extends { type: string }> (type: T['type']): (message: unknown) => message is T {
  return (message: unknown): message is T => typeof message === 'object' && message !== null && (message as { type?: unknown }).type === type
}
