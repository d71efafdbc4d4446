/**
 * The thread side of the worker-thread handler mode (docs/threads.md; the main side
 * is `thread-pool.ts`). Each `worker_threads` thread imports the handler
 * module once, then handles the calls posted to it (one at a time, unless
 * `callsPerThread` > 1 and the handlers are async): it decodes the request bytes
 * with the method's request type, runs the handler with a `CallContext` of
 * its own, encodes the response and posts the bytes back, transferring their
 * ArrayBuffers rather than copying them where it owns them.
 *
 * Nothing here runs when the file is merely imported (the main side imports
 * its types only): the thread starts only under `workerData.nyalaThread`.
 */
import { isMainThread, parentPort, workerData, type MessagePort } from 'node:worker_threads'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcCodeOf } from '../../codec/krpc/codes.js'
import type { Message, MethodDef, ServiceDef } from '../../codec/protobuf/schema.js'
import type { KrpcCallContext } from './call.js'
import { CallTable } from '../call-table.js'

/** What the main side tells a new thread. */
export interface ThreadWorkerData {
  nyalaThread: true
  /** URL of the handler module. */
  module: string
  /** Export holding the handler object. */
  handlersExport: string
  /** Export holding the ServiceDef; undefined: the export whose `fullName` is `service`. */
  serviceExport: string | undefined
  /** `package.Service`. */
  service: string
  /** Method names of the main side's ServiceDef; each needs a handler here. */
  methods: string[]
  /** The thread's worker index, for messages. */
  index: number
}

/**
 * One call, main → thread. The request body PB and its sidecars are
 * contiguous in `buf`: the message at `at` (`len` bytes), then sidecar i of
 * `sidecars[i]` bytes each. `buf` is transferred, never shared.
 */
export interface ThreadCallMessage {
  seq: number
  method: string
  buf: ArrayBuffer
  at: number
  len: number
  sidecars: number[] | null
  /** Milliseconds left until the call's deadline when it was posted (Infinity: none). */
  remainingMs: number
  callId: number
  user: string
  remoteAddress: string
}

/** The main side gave up on a call (connection closed, server stopping): abort its signal. */
export interface ThreadCancelMessage {
  cancel: number
  code: string
  message: string
}

/** thread → main. */
export type ThreadReply =
  | { seq: number, body: Uint8Array, sidecars: Uint8Array[] | undefined, error?: undefined }
  | { seq: number, error: { message: string, krpcCode: number } }
  // The handler gave up at the call's deadline (it threw or rejected with its signal's reason): a timeout, not a failure.
  | { seq: number, gaveUp: string, error?: undefined }

export type ThreadStatus = { ready: true } | { failed: string }

type Handler = (request: Message, ctx: KrpcCallContext) => unknown

interface Method {
  def: MethodDef<Message, Message>
  handler: Handler
}

/**
 * Bytes at or above this size are worth transferring; below it a copy costs
 * less than reasoning about who else might hold the buffer (Node's 8 KiB
 * Buffer pool hands out slices under 4 KiB, and those must never move).
 */
const TRANSFER_MIN_BYTES = 4096

/** True when `view` is the whole of an ArrayBuffer that is ours to move. */
function ownsWholeBuffer (view: Uint8Array): boolean {
  return view.byteOffset === 0 && view.byteLength === view.buffer.byteLength &&
    view.byteLength >= TRANSFER_MIN_BYTES && view.buffer instanceof ArrayBuffer
}

/** `view`'s bytes in an ArrayBuffer of their own (structured clone would copy the whole underlying buffer). */
function exactCopy (view: Uint8Array): Uint8Array<ArrayBuffer> {
  const copy = new Uint8Array(view.byteLength)
  copy.set(view)
  return copy
}

function stripCodePrefix (message: string): string {
  return message.replace(/^[A-Z_]+: /, '')
}

/** A handler's context inside the thread. */
class ThreadContext implements KrpcCallContext {
  readonly service: string
  readonly method: string
  readonly callId: number
  readonly user: string
  readonly remoteAddress: string
  /** On this thread's `performance.now()` clock. */
  readonly deadline: number
  readonly sidecars: readonly Buffer[]
  responseSidecars: Uint8Array[] | undefined
  /** KRPC keeps no protocol state per connection (and a thread could not share it). */
  readonly connectionState: unknown = undefined
  #controller: AbortController | null = null
  #timer: ReturnType<typeof setTimeout> | null = null
  #abortReason: RpcError | null = null
  #finished = false

  constructor (service: string, m: ThreadCallMessage, sidecars: readonly Buffer[]) {
    this.service = service
    this.method = m.method
    this.callId = m.callId
    this.user = m.user
    this.remoteAddress = m.remoteAddress
    this.deadline = performance.now() + m.remainingMs
    this.sidecars = sidecars
  }

  /** The connection lives in the reactor's main thread: a handler here cannot push to it. */
  get connection (): never {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a handler in a worker thread cannot reach its connection (ctx.connection)')
  }

  write (): never {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a handler in a worker thread cannot stream its answer (ctx.write)')
  }

  remainingMs (): number {
    return Math.max(0, this.deadline - performance.now())
  }

  /** A thread cannot close the connection: the main thread owns it. */
  closeConnection (): void {
    throw new RpcError(ErrorCode.NOT_SUPPORTED, 'closeConnection() is not available in a worker thread')
  }

  // Made only for handlers that look at it, as on the main side.
  get signal (): AbortSignal {
    if (this.#controller === null) {
      this.#controller = new AbortController()
      if (this.#abortReason !== null) {
        this.#controller.abort(this.#abortReason)
      } else if (!this.#finished && Number.isFinite(this.deadline)) {
        this.#timer = setTimeout(() => {
          this.#timer = null
          this.abort(new RpcError(ErrorCode.DEADLINE_EXCEEDED, 'the call passed its deadline'))
        }, Math.max(0, this.deadline - performance.now()))
        this.#timer.unref()
      }
    }
    return this.#controller.signal
  }

  addSidecar (data: Uint8Array): number {
    this.responseSidecars ??= []
    this.responseSidecars.push(data)
    return this.responseSidecars.length - 1
  }

  /** True when `err` is the reason this call's signal aborted with (the handler gave up for it). */
  isAbortReason (err: unknown): boolean {
    return err !== null && err === this.#abortReason
  }

  abort (reason: RpcError): void {
    if (this.#abortReason !== null) return
    this.#abortReason = reason
    this.#controller?.abort(reason)
  }

  finish (): void {
    this.#finished = true
    if (this.#timer !== null) {
      clearTimeout(this.#timer)
      this.#timer = null
    }
  }
}

async function load (data: ThreadWorkerData): Promise<Map<string, Method>> {
  const mod = await import(data.module) as Record<string, unknown>
  const handlers = mod[data.handlersExport] as Record<string, unknown> | undefined
  if (handlers === null || typeof handlers !== 'object') {
    throw new Error(`${data.module} has no export '${data.handlersExport}' holding the handlers (exports: ${Object.keys(mod).join(', ')})`)
  }
  const isDef = (v: unknown): v is ServiceDef =>
    v !== null && typeof v === 'object' && typeof (v as ServiceDef).fullName === 'string' && typeof (v as ServiceDef).methods === 'object'
  let def: unknown
  if (data.serviceExport !== undefined) {
    def = mod[data.serviceExport]
    if (!isDef(def)) throw new Error(`${data.module}: export '${data.serviceExport}' is not a ServiceDef`)
    if (def.fullName !== data.service) throw new Error(`${data.module}: export '${data.serviceExport}' is ${def.fullName}, not ${data.service}`)
  } else {
    def = Object.values(mod).find(v => isDef(v) && v.fullName === data.service)
    if (!isDef(def)) throw new Error(`${data.module} exports no ServiceDef of ${data.service} (export it, or name it with serviceExport)`)
  }
  const methods = new Map<string, Method>()
  for (const name of data.methods) {
    const methodDef = (def.methods as Record<string, MethodDef<Message, Message> | undefined>)[name]
    if (methodDef === undefined) throw new Error(`${data.module}: ${data.service} has no method ${name} in the thread's ServiceDef`)
    const handler = handlers[name]
    if (typeof handler !== 'function') throw new Error(`no handler for ${data.service}.${name} in export '${data.handlersExport}' of ${data.module}`)
    methods.set(name, { def: methodDef, handler: handler as Handler })
  }
  return methods
}

function isThenable (value: unknown): value is PromiseLike<unknown> {
  return value !== null && typeof value === 'object' && typeof (value as { then?: unknown }).then === 'function'
}

function serve (port: MessagePort, data: ThreadWorkerData): void {
  const service = data.service
  let methods: Map<string, Method> | null = null
  let backlog: ThreadCallMessage[] | null = []
  /** Calls being handled, by seq (more than one with callsPerThread > 1 and async handlers). */
  const current = new CallTable<ThreadContext>()

  const fail = (seq: number, message: string, krpcCode: number): void => {
    port.postMessage({ seq, error: { message, krpcCode } } satisfies ThreadReply)
  }

  const failed = (seq: number, ctx: ThreadContext, err: unknown): void => {
    ctx.finish()
    current.delete(seq)
    if (err instanceof RpcError && err.code === ErrorCode.DEADLINE_EXCEEDED && ctx.isAbortReason(err)) {
      port.postMessage({ seq, gaveUp: err.message } satisfies ThreadReply)
      return
    }
    const code = krpcCodeOf(err)
    if (typeof code === 'number') fail(seq, stripCodePrefix((err as Error).message), code)
    else fail(seq, err instanceof Error ? err.message : String(err), KrpcCode.ERROR_APPLICATION)
  }

  const succeeded = (seq: number, ctx: ThreadContext, method: Method, requestBuf: ArrayBuffer, response: unknown): void => {
    ctx.finish()
    current.delete(seq)
    let body: Uint8Array
    try {
      body = method.def.responseType.encode(response as Message)
    } catch (err) {
      fail(seq, `handler of ${service}.${method.def.name} returned an invalid response: ${(err as Error).message}`, KrpcCode.ERROR_APPLICATION)
      return
    }
    const transfer: ArrayBuffer[] = []
    if (ownsWholeBuffer(body)) transfer.push(body.buffer as ArrayBuffer)
    else body = exactCopy(body)
    let sidecars = ctx.responseSidecars
    try {
      if (sidecars !== undefined) {
        sidecars = sidecars.map((s) => {
          // Views of the request (an echo) travel back with its buffer, which
          // this call owns; anything else may be the handler's own and is copied.
          if (s.buffer === requestBuf) {
            if (!transfer.includes(requestBuf)) transfer.push(requestBuf)
            return s
          }
          const copy = exactCopy(s)
          transfer.push(copy.buffer)
          return copy
        })
      }
      port.postMessage({ seq, body, sidecars } satisfies ThreadReply, transfer)
    } catch (err) {
      fail(seq, `handler of ${service}.${method.def.name} returned invalid sidecars: ${(err as Error).message}`, KrpcCode.ERROR_APPLICATION)
    }
  }

  const handle = (m: ThreadCallMessage): void => {
    const seq = m.seq
    const method = methods!.get(m.method)
    if (method === undefined) {
      fail(seq, `call on service ${service} received with an invalid method name: ${m.method}`, KrpcCode.ERROR_NO_SUCH_METHOD)
      return
    }
    const buf = m.buf
    const message = Buffer.from(buf, m.at, m.len)
    let sidecars: Buffer[] = []
    if (m.sidecars !== null) {
      let at = m.at + m.len
      sidecars = m.sidecars.map((length) => {
        const s = Buffer.from(buf, at, length)
        at += length
        return s
      })
    }
    const request = method.def.requestType.decode(message)
    if (request instanceof RpcError) {
      fail(seq, `invalid parameter for call ${service}.${m.method}: ${request.message}`, KrpcCode.ERROR_INVALID_REQUEST)
      return
    }
    const ctx = new ThreadContext(service, m, sidecars)
    current.set(seq, ctx)
    let result: unknown
    try {
      result = method.handler(request, ctx)
    } catch (err) {
      failed(seq, ctx, err)
      return
    }
    if (isThenable(result)) {
      result.then((response) => succeeded(seq, ctx, method, buf, response), (err: unknown) => failed(seq, ctx, err))
    } else {
      succeeded(seq, ctx, method, buf, result)
    }
  }

  port.on('message', (m: ThreadCallMessage | ThreadCancelMessage) => {
    if ('cancel' in m) {
      current.get(m.cancel)?.abort(new RpcError(m.code as ErrorCode, m.message))
      return
    }
    if (backlog !== null) backlog.push(m)
    else handle(m)
  })

  load(data).then((loaded) => {
    methods = loaded
    port.postMessage({ ready: true } satisfies ThreadStatus)
    const waiting = backlog!
    backlog = null
    for (const m of waiting) handle(m)
  }, (err: unknown) => {
    // The main side terminates the thread when it reads this.
    port.postMessage({ failed: err instanceof Error ? err.message : String(err) } satisfies ThreadStatus)
  })
}

if (!isMainThread && parentPort !== null && (workerData as Partial<ThreadWorkerData> | null)?.nyalaThread === true) {
  serve(parentPort, workerData as ThreadWorkerData)
}
