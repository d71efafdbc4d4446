/**
 * The main side of the worker-thread handler mode (docs/threads.md): N
 * `worker_threads` threads, each with the service's handler module loaded
 * (`thread-worker.ts`), serving as the N workers of the service's
 * `WorkerPool`. The pool's EDF queue, LIFO parking, direct hand-off and the
 * service pool's burst absorption therefore apply unchanged: `run(call, i)`
 * posts the call to thread i and settles when its answer is back.
 *
 * With `callsPerThread` k > 1 the pool has N·k workers and worker i posts to
 * thread i mod N (so two concurrent calls still land on two threads): a
 * thread then has up to k calls, the next one waiting in its message port
 * while it computes the current one, so it does not go to sleep and get
 * woken between calls. Waking a thread costs tens of microseconds of CPU per
 * message, more than many handlers; the price is that a call committed to a
 * busy thread waits behind its predecessors even if another thread frees up.
 *
 * Bytes cross without copying where that is safe. A request frame longer
 * than one socket read was assembled by the frame decoder in a buffer of its
 * own, so that whole buffer is transferred; a smaller frame is a view of the
 * socket's read buffer, shared with its neighbours, and its body (message
 * plus sidecars, contiguous) is copied once into a fresh buffer, which is
 * transferred. The thread transfers the encoded response (and any request
 * sidecars it echoes) back.
 */
import { existsSync } from 'node:fs'
import { isAbsolute, resolve as resolvePath } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { Worker } from 'node:worker_threads'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode } from '../../codec/krpc/codes.js'
import type { Clock } from '../../scheduling/clock.js'
import type { InboundCall } from '../inbound-call.js'
import type { KrpcCallData } from './call.js'
import { ThreadRequest } from './protocol.js'
import type { Logger } from '../logger.js'
import type { ThreadCallMessage, ThreadCancelMessage, ThreadReply, ThreadStatus, ThreadWorkerData } from './thread-worker.js'
import { CallTable } from '../call-table.js'

/** Where a thread-mode service's handlers come from. */
export interface HandlerModule {
  /** The module's URL (`new URL('./handlers.js', import.meta.url)`), or a file path (relative: to the working directory). */
  module: string | URL
  /** The export holding the handler object; default `handlers`. */
  export?: string | undefined
  /** The export holding the ServiceDef; default: the export whose `fullName` is the service's. */
  serviceExport?: string | undefined
}

/** Counters of one service's threads. */
export interface ThreadPoolStats {
  /** Threads the pool runs (the service's `threads`). */
  threads: number
  /** Calls a thread may hold at once (the pool's workers are threads x this). */
  callsPerThread: number
  /** Threads running now (not exited, not failed to load). */
  alive: number
  /** Calls in the threads now. */
  busy: number
  /** Calls answered by each thread (index = worker index); LIFO parking concentrates them on low indexes. */
  handled: number[]
  /** Threads started again after one exited or crashed. */
  restarts: number
  /** Requests whose frame buffer was moved to the thread without a copy. */
  requestsMoved: number
  /** Bytes copied out of shared read buffers for the other requests. */
  requestBytesCopied: number
}

/** A thread's answer: the encoded response, or an error to send. */
export type ThreadResult =
  | { body: Uint8Array, sidecars: Uint8Array[] | undefined, error?: undefined }
  | { error: { message: string, krpcCode: number } }

/** Read size at or under which a frame may be a view of the socket's read buffer (libuv reads at most 64 KiB). */
const SOCKET_READ_BYTES = 64 * 1024

/** A call of a thread-mode service: its request is the undecoded `ThreadRequest` (the thread decodes it). */
export type ThreadCall = InboundCall<KrpcCallData>

/** The compiled worker entry beside this file, or the TypeScript source when running from sources (its loader is inherited through execArgv). */
function workerEntry (): URL {
  const js = new URL('./thread-worker.js', import.meta.url)
  if (existsSync(fileURLToPath(js))) return js
  return new URL('./thread-worker.ts', import.meta.url)
}

/** A module reference as a URL string. */
export function moduleHref (module: string | URL): string {
  if (module instanceof URL) return module.href
  if (/^[a-z][a-z0-9+.-]*:/i.test(module) && !/^[a-z]:[\\/]/i.test(module)) return module
  return pathToFileURL(isAbsolute(module) ? module : resolvePath(module)).href
}

interface Slot {
  readonly index: number
  worker: Worker | null
  /** Loaded its module at least once. */
  loaded: boolean
  /** Why the module could not be loaded; such a thread is not restarted. */
  failed: string | null
  lastError: string | null
  seq: number
  /** Calls posted to this thread and not answered yet, by seq. */
  readonly pending: CallTable<Pending>
  handled: number
}

interface Pending {
  readonly seq: number
  readonly call: ThreadCall
  readonly settle: (result: ThreadResult) => void
  /** The handler gave up at the deadline: the call's run rejects with this (see `run`). */
  readonly gaveUp: (error: RpcError) => void
}

export interface ThreadPoolOptions {
  threads: number
  /** Default 1. */
  callsPerThread?: number | undefined
  handlers: HandlerModule
  /** `package.Service` and its method names. */
  service: string
  methods: string[]
  clock: Clock
  logger: Logger
}

/** N threads running one service's handlers, up to `callsPerThread` calls per thread at a time. */
export class ThreadPool {
  /** Resolves once every thread has loaded the handler module; rejects with the first load failure. */
  readonly ready: Promise<void>
  readonly #slots: Slot[] = []
  readonly #callsPerThread: number
  readonly #entry = workerEntry()
  readonly #data: Omit<ThreadWorkerData, 'index'>
  readonly #clock: Clock
  readonly #log: Logger
  readonly #readyWaiters: Array<{ resolve: () => void, reject: (err: Error) => void }> = []
  #restarts = 0
  #moved = 0
  #copied = 0
  #closing: Promise<void> | null = null

  constructor (options: ThreadPoolOptions) {
    const { threads } = options
    if (!Number.isSafeInteger(threads) || threads < 1) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `threads must be a positive integer, got ${threads}`)
    }
    const callsPerThread = options.callsPerThread ?? 1
    if (!Number.isSafeInteger(callsPerThread) || callsPerThread < 1) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `callsPerThread must be a positive integer, got ${callsPerThread}`)
    }
    this.#callsPerThread = callsPerThread
    this.#clock = options.clock
    this.#log = options.logger
    this.#data = {
      nyalaThread: true,
      module: moduleHref(options.handlers.module),
      handlersExport: options.handlers.export ?? 'handlers',
      serviceExport: options.handlers.serviceExport,
      service: options.service,
      methods: options.methods
    }
    const loads: Array<Promise<void>> = []
    for (let index = 0; index < threads; index++) {
      const slot: Slot = { index, worker: null, loaded: false, failed: null, lastError: null, seq: 0, pending: new CallTable<Pending>(), handled: 0 }
      this.#slots.push(slot)
      loads.push(new Promise<void>((resolve, reject) => { this.#readyWaiters[index] = { resolve, reject } }))
      this.#start(slot)
    }
    this.ready = Promise.all(loads).then(() => undefined)
    // A load failure is reported through `ready` (Server.listen awaits it); never as an unhandled rejection.
    this.ready.catch(() => {})
  }

  /** The pool's workers: threads x callsPerThread. */
  get workers (): number {
    return this.#slots.length * this.#callsPerThread
  }

  stats (): ThreadPoolStats {
    let alive = 0
    let busy = 0
    for (const slot of this.#slots) {
      if (slot.worker !== null && slot.failed === null) alive++
      busy += slot.pending.size
    }
    return { threads: this.#slots.length, callsPerThread: this.#callsPerThread, alive, busy, handled: this.#slots.map(s => s.handled), restarts: this.#restarts,
      requestsMoved: this.#moved, requestBytesCopied: this.#copied
    }
  }

  /**
   * Runs `call` for pool worker `worker` on thread `worker mod threads`;
   * resolves with its answer (never rejects). The worker pool guarantees one
   * call per worker at a time.
   */
  run (call: ThreadCall, worker: number): Promise<ThreadResult> {
    const slot = this.#slots[worker % this.#slots.length]!
    // Taken once: a frame posted to a thread is moved there (its buffer detached).
    const request = call.request instanceof ThreadRequest ? call.request : null
    const frame = request?.frame ?? null
    const message = request?.message ?? null
    if (request !== null) request.frame = request.message = null
    if (slot.failed !== null || slot.worker === null || frame === null || message === null) {
      const why = slot.failed ?? (slot.worker === null ? 'the server is shutting down' : 'the request was already handled')
      return Promise.resolve({ error: { message: `cannot run ${call.service}.${call.method} in worker thread ${slot.index}: ${why}`, krpcCode: KrpcCode.ERROR_APPLICATION } })
    }
    // A 31-bit sequence: wraps after 2^31 calls, long after any of them is pending.
    const seq = slot.seq = (slot.seq + 1) & 0x7fffffff
    const sidecars = call.data.sidecars
    const start = message.byteOffset
    const last = sidecars.length > 0 ? sidecars[sidecars.length - 1]! : message
    const end = last.byteOffset + last.byteLength
    let buf: ArrayBuffer
    let at: number
    if (frame.length > SOCKET_READ_BYTES && frame.byteOffset === 0 && frame.byteLength === frame.buffer.byteLength && frame.buffer instanceof ArrayBuffer) {
      // Assembled by the frame decoder in a buffer of its own: move it.
      buf = frame.buffer
      at = start
      this.#moved++
    } else {
      // A view of a buffer shared with other frames: copy the body out (unpooled, so it can move).
      const copy = Buffer.allocUnsafeSlow(end - start)
      copy.set(frame.subarray(start - frame.byteOffset, end - frame.byteOffset))
      buf = copy.buffer as ArrayBuffer
      at = 0
      this.#copied += end - start
    }
    const m: ThreadCallMessage = {
      seq,
      method: call.method,
      buf,
      at,
      len: message.byteLength,
      sidecars: sidecars.length > 0 ? sidecars.map(s => s.byteLength) : null,
      remainingMs: call.deadline - this.#clock.now(),
      callId: call.callId,
      user: call.user,
      remoteAddress: call.remoteAddress
    }
    const result = new Promise<ThreadResult>((resolve, reject) => { slot.pending.set(seq, { seq, call, settle: resolve, gaveUp: reject }) })
    const thread = slot.worker
    call.onAbort = (reason) => {
      if (slot.pending.get(seq)?.call === call && slot.worker === thread) {
        thread.postMessage({ cancel: seq, code: reason.code, message: reason.message } satisfies ThreadCancelMessage)
      }
    }
    thread.postMessage(m, [buf])
    return result
  }

  /** Terminates every thread (a call still in one is answered with an error); resolves when all have exited. */
  close (): Promise<void> {
    this.#closing ??= Promise.all(this.#slots.map(async (slot) => {
      const worker = slot.worker
      if (worker !== null) await worker.terminate()
    })).then(() => undefined)
    return this.#closing
  }

  #start (slot: Slot): void {
    const worker = new Worker(this.#entry, { workerData: { ...this.#data, index: slot.index } satisfies ThreadWorkerData })
    // Sockets and timers keep the process alive, not idle threads.
    worker.unref()
    slot.worker = worker
    slot.loaded = false
    slot.lastError = null
    worker.on('message', (m: ThreadReply | ThreadStatus) => {
      if ('gaveUp' in m) {
        this.#gaveUp(slot, m.seq, m.gaveUp)
      } else if ('seq' in m) {
        this.#settle(slot, m.seq, m.error === undefined ? { body: m.body, sidecars: m.sidecars } : { error: m.error })
      } else if ('ready' in m) {
        slot.loaded = true
        this.#readyWaiters[slot.index]?.resolve()
      } else {
        slot.failed = `handler module failed to load: ${m.failed}`
        this.#log.error(`${this.#data.service}: worker thread ${slot.index}: ${slot.failed}`)
        this.#readyWaiters[slot.index]?.reject(new RpcError(ErrorCode.INVALID_ARGUMENT, `${this.#data.service}: ${slot.failed}`))
        void worker.terminate()
      }
    })
    worker.on('error', (err) => {
      slot.lastError = err.message
      this.#log.error(`${this.#data.service}: worker thread ${slot.index} crashed: ${err.message}`)
    })
    worker.on('exit', (code) => {
      if (slot.worker !== worker) return
      slot.worker = null
      const detail = slot.lastError ?? slot.failed ?? `exit code ${code}`
      for (const { seq, call } of slot.pending.values()) {
        this.#settle(slot, seq, { error: { message: `worker thread ${slot.index} stopped while handling ${call.service}.${call.method}: ${detail}`, krpcCode: KrpcCode.ERROR_APPLICATION } })
      }
      if (slot.failed === null && !slot.loaded) {
        slot.failed = `worker thread exited before loading the handler module: ${slot.lastError ?? `exit code ${code}`}`
        this.#readyWaiters[slot.index]?.reject(new RpcError(ErrorCode.INVALID_ARGUMENT, `${this.#data.service}: ${slot.failed}`))
      }
      if (this.#closing === null && slot.failed === null) {
        this.#restarts++
        this.#log.warn(`${this.#data.service}: restarting worker thread ${slot.index}`)
        this.#start(slot)
      }
    })
  }

  // The thread's handler gave up at the call's deadline. The run rejects
  // with the call's own abort reason (the deadline's, forwarded to the
  // thread), or else one of DEADLINE_EXCEEDED: the server then refuses the
  // call as 'timed-out', as it does a main-thread handler that gives up.
  #gaveUp (slot: Slot, seq: number, message: string): void {
    const pending = slot.pending.get(seq)
    if (pending === undefined) return
    slot.pending.delete(seq)
    pending.call.onAbort = null
    slot.handled++
    const reason = pending.call.abortReason
    pending.gaveUp(reason !== null && reason.code === ErrorCode.DEADLINE_EXCEEDED ? reason : new RpcError(ErrorCode.DEADLINE_EXCEEDED, message))
  }

  #settle (slot: Slot, seq: number, result: ThreadResult): void {
    const pending = slot.pending.get(seq)
    if (pending === undefined) return
    slot.pending.delete(seq)
    pending.call.onAbort = null
    slot.handled++
    pending.settle(result)
  }
}
