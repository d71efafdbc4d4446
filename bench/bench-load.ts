/**
 * A load process of `nyala bench` (forked by bench/rpc-bench.ts). It gets a
 * `LoadPlan` (system, server address, outstanding calls per connection),
 * opens its connections and makes one call on each (`ready`), then on `go`
 * keeps every chain busy until the window ends: a chain issues its next
 * call from the previous one's completion, so a connection with k chains
 * has k calls outstanding (sync mode: k = 1). nyala's chains await each
 * call's promise, or (`plan.api === 'callback'`, rpc-bench's async mode)
 * re-issue from the stub's callback, as the raw and grpc loads do. Calls that complete inside
 * the window are counted and their latencies recorded; CPU time is sampled
 * at the window's edges. It answers `done` once every chain has drained.
 */
import { connect, type Socket } from 'node:net'
// The imported binding: the global `performance` is an accessor, dearer per call (both systems' loads use this one).
import { performance } from 'node:perf_hooks'
import { fileURLToPath } from 'node:url'
import { Client } from '../reactor/krpc/client.js'
import type { RpcError } from '../codec/errors.js'
import { CalculatorService } from '../examples/calculator/index.js'
import { createLatencyHistogram, encodeLatencies, recordLatency } from './latency.js'
import { loadGrpc } from './grpc-calculator.js'
import { epochNow, serverOf, type LoadDone, type LoadGo, type LoadPlan } from './bench-ipc.js'

/** A chain stops the run for its process after this many failed calls (a broken server, not a slow one). */
const MAX_ERRORS = 1000

/** The window and what was measured in it, shared by every chain of the process. */
class Window {
  startAt = Number.POSITIVE_INFINITY
  endAt = Number.POSITIVE_INFINITY
  stopped = false
  calls = 0
  errors = 0
  firstError: string | null = null
  readonly latencies = createLatencyHistogram()
  readonly #origin = performance.timeOrigin

  /** A call sent at `sentMs` completed at `doneMs` (both `performance.now()`). */
  complete (sentMs: number, doneMs: number): void {
    const at = this.#origin + doneMs
    if (at >= this.endAt) this.stopped = true
    else if (at >= this.startAt) {
      this.calls++
      recordLatency(this.latencies, (doneMs - sentMs) * 1000)
    }
  }

  fail (error: unknown): void {
    this.errors++
    this.firstError ??= error instanceof Error ? error.message : String(error)
    if (this.errors >= MAX_ERRORS) this.stopped = true
  }
}

/** One client connection with its chains: `prepare` connects and makes one call; `run` drives the chains until the window stops them. */
interface LoadConnection {
  prepare: () => Promise<void>
  run: (window: Window) => Promise<void>
  close: () => void
}

function nyalaConnection (plan: LoadPlan, chains: number): LoadConnection {
  const tls = plan.tlsCa === null ? {} : { tls: { ca: plan.tlsCa }, requireTls: true, encryptLoopback: true }
  const client = new Client({ endpoint: `${plan.host}:${plan.port}`, defaultTimeoutMs: plan.callTimeoutMs, busyPollUs: plan.busyPollUs, ...tls })
  const calc = client.service(CalculatorService)
  const data = 'x'.repeat(plan.payloadBytes)
  const echo = plan.payloadBytes > 0
  // rpc-bench's async workload: each chain re-issues its call from the last
  // one's callback (the stub's callback form, Kudu's AsyncRequest).
  const callbackChain = (window: Window, seed: number): Promise<void> => new Promise((resolve) => {
    let x = seed
    let sent = 0
    const onAdd = (error: RpcError | null, response?: { result: number }): void => {
      const done = performance.now()
      if (error !== null) window.fail(error)
      else if (response!.result !== x + 1) window.fail(new Error(`Add(${x}, 1) answered ${response!.result}`))
      else {
        window.complete(sent, done)
        x = (x + 1) & 0xffff
      }
      next()
    }
    const onEcho = (error: RpcError | null, response?: { data: string }): void => {
      const done = performance.now()
      if (error !== null) window.fail(error)
      else if (response!.data.length !== data.length) window.fail(new Error('Echo answered a different payload'))
      else window.complete(sent, done)
      next()
    }
    const next = (): void => {
      if (window.stopped) return resolve()
      sent = performance.now()
      if (echo) calc.Echo({ data }, onEcho)
      else calc.Add({ x, y: 1 }, onAdd)
    }
    next()
  })
  const chain = async (window: Window, seed: number): Promise<void> => {
    let x = seed
    while (!window.stopped) {
      const sent = performance.now()
      try {
        if (echo) {
          const response = await calc.Echo({ data })
          if (response.data.length !== data.length) throw new Error('Echo answered a different payload')
        } else {
          const response = await calc.Add({ x, y: 1 })
          if (response.result !== x + 1) throw new Error(`Add(${x}, 1) answered ${response.result}`)
        }
      } catch (err) {
        window.fail(err)
        continue
      }
      window.complete(sent, performance.now())
      x = (x + 1) & 0xffff
    }
  }
  return {
    prepare: async () => { await calc.Add({ x: 1, y: 2 }) },
    run: async (window) => {
      const running: Array<Promise<void>> = []
      for (let i = 0; i < chains; i++) running.push(plan.api === 'callback' ? callbackChain(window, i * 1000) : chain(window, i * 1000))
      await Promise.all(running)
    },
    close: () => client.close()
  }
}

async function grpcConnection (plan: LoadPlan, chains: number): Promise<LoadConnection> {
  const { grpc, clientConstructor } = await loadGrpc()
  // A local subchannel pool: each client is its own HTTP/2 connection, as each nyala Client is.
  const client = new clientConstructor(`${plan.host}:${plan.port}`, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 })
  type Callback = (error: Error | null, response?: { result?: number, data?: string }) => void
  const unary = client as unknown as Record<'Add' | 'Echo', (request: object, options: { deadline: number }, callback: Callback) => void>
  const data = 'x'.repeat(plan.payloadBytes)
  const echo = plan.payloadBytes > 0
  const timeoutMs = plan.callTimeoutMs
  const chain = (window: Window, seed: number): Promise<void> => new Promise((resolve) => {
    let x = seed
    const issue = (): void => {
      const sent = performance.now()
      const onAnswer: Callback = (error, response) => {
        const done = performance.now()
        if (error !== null) window.fail(error)
        else if (echo ? response?.data?.length !== data.length : response?.result !== x + 1) window.fail(new Error('wrong answer'))
        else {
          window.complete(sent, done)
          x = (x + 1) & 0xffff
        }
        if (window.stopped) resolve()
        else issue()
      }
      const deadline = Date.now() + timeoutMs
      if (echo) unary.Echo({ data }, { deadline }, onAnswer)
      else unary.Add({ x, y: 1 }, { deadline }, onAnswer)
    }
    issue()
  })
  return {
    prepare: () => new Promise((resolve, reject) => {
      unary.Add({ x: 1, y: 2 }, { deadline: Date.now() + timeoutMs }, (error) => error === null ? resolve() : reject(error))
    }),
    run: async (window) => {
      const running: Array<Promise<void>> = []
      for (let i = 0; i < chains; i++) running.push(chain(window, i * 1000))
      await Promise.all(running)
    },
    close: () => client.close()
  }
}

/**
 * The raw baseline's client, as bench/raw-echo.ts's `runRawClient`: frames
 * `[u32 length][payload]`, parses every answer frame by its length prefix
 * (frames may span reads), completes one call per frame (answers come in
 * order, so the oldest send time is the call's), and writes the calls
 * issued in one turn with one write at `process.nextTick`, the first at once.
 */
function rawConnection (plan: LoadPlan, chains: number): LoadConnection {
  const payloadBytes = plan.payloadBytes > 0 ? plan.payloadBytes : 8
  const frame = Buffer.alloc(4 + payloadBytes, 1)
  frame.writeUInt32BE(payloadBytes, 0)
  let socket: Socket | null = null
  // Send times of the outstanding calls, oldest first (a ring of `chains` slots).
  const sentAt = new Float64Array(Math.max(1, chains))
  let head = 0
  let outstanding = 0
  let batched = 0
  let flushScheduled = false
  let pending: Buffer | null = null
  let onAnswer: (() => void) | null = null
  const flush = (): void => {
    flushScheduled = false
    if (batched === 1) socket!.write(frame)
    else if (batched > 1) socket!.write(Buffer.concat(new Array<Buffer>(batched).fill(frame)))
    batched = 0
  }
  const send = (): void => {
    sentAt[(head + outstanding) % sentAt.length] = performance.now()
    outstanding++
    if (!flushScheduled) {
      socket!.write(frame)
      flushScheduled = true
      process.nextTick(flush)
    } else {
      batched++
    }
  }
  const onData = (chunk: Buffer): void => {
    const data = pending === null ? chunk : Buffer.concat([pending, chunk])
    pending = null
    let offset = 0
    while (data.length - offset >= 4) {
      const length = data.readUInt32BE(offset)
      if (data.length - offset < 4 + length) break
      if (length !== payloadBytes) throw new Error('short answer')
      offset += 4 + length
      onAnswer!()
    }
    if (offset < data.length) pending = Buffer.from(data.subarray(offset))
  }
  return {
    prepare: () => new Promise((resolve, reject) => {
      const s = connect({ port: plan.port, host: plan.host, noDelay: true })
      socket = s
      s.once('error', reject)
      s.on('data', onData)
      s.once('connect', () => {
        onAnswer = () => {
          outstanding--
          head = (head + 1) % sentAt.length
          resolve()
        }
        send()
      })
    }),
    run: (window) => new Promise((resolve, reject) => {
      socket!.removeAllListeners('error')
      socket!.once('error', reject)
      socket!.once('close', () => { if (outstanding > 0) reject(new Error('connection closed')) })
      onAnswer = () => {
        const sent = sentAt[head]!
        head = (head + 1) % sentAt.length
        outstanding--
        window.complete(sent, performance.now())
        if (!window.stopped) send()
        else if (outstanding === 0) resolve()
      }
      for (let i = 0; i < chains; i++) send()
    }),
    close: () => socket?.destroy()
  }
}

async function main (): Promise<void> {
  const plan = await new Promise<LoadPlan>((resolve) => process.once('message', (m) => resolve(m as LoadPlan)))
  const connections: LoadConnection[] = []
  for (const chains of plan.chains) {
    connections.push(serverOf(plan.system) === 'nyala'
      ? nyalaConnection(plan, chains)
      : plan.system === 'raw' ? rawConnection(plan, chains) : await grpcConnection(plan, chains))
  }
  await Promise.all(connections.map((c) => c.prepare()))
  const goMessage = new Promise<LoadGo>((resolve) => process.once('message', (m) => resolve(m as LoadGo)))
  process.send!({ type: 'ready' })
  const go = await goMessage
  const window = new Window()
  window.startAt = go.startAt
  window.endAt = go.endAt
  let cpuAtStart = process.cpuUsage()
  let cpu = { user: 0, system: 0 }
  const startTimer = new Promise<void>((resolve) => setTimeout(() => { cpuAtStart = process.cpuUsage(); resolve() }, Math.max(0, go.startAt - epochNow())))
  const endTimer = new Promise<void>((resolve) => setTimeout(() => {
    window.stopped = true
    cpu = process.cpuUsage(cpuAtStart)
    resolve()
  }, Math.max(0, go.endAt - epochNow())))
  await Promise.all([startTimer, endTimer, ...connections.map((c) => c.run(window))])
  for (const c of connections) c.close()
  const done: LoadDone = {
    type: 'done',
    calls: window.calls,
    errors: window.errors,
    firstError: window.firstError,
    latencies: encodeLatencies(window.latencies),
    userCpuUs: cpu.user,
    systemCpuUs: cpu.system
  }
  process.send!(done)
}

if (process.send !== undefined && process.argv[1] === fileURLToPath(import.meta.url)) {
  process.once('disconnect', () => process.exit(0))
  main().catch((err: Error) => {
    process.send!({ type: 'failed', error: err.stack ?? err.message }, () => process.exit(1))
  })
}
