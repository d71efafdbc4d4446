// Client side: real clients against the fake server, every call settled once.
import { createServer, type Server as NetServer } from 'node:net'
import { RpcError } from '../../codec/errors.js'
import { krpcCodeName } from '../../codec/krpc/codes.js'
import { Client, type ClientOptions } from '../../reactor/krpc/client.js'
import type { ServiceDef } from '../../codec/protobuf/schema.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { FakeConn } from './fake-server.js'
import { CLIENT_MAX_MESSAGE_BYTES, CLIENT_TIMEOUT_MS, type FuzzFailure, HOST, SETTLE_GRACE_MS } from './options.js'
import { Rng, mix } from './rng.js'

interface CallRecord { deadline: number, reported: boolean }

/** The client side of a run: the fake server, the fuzzed clients and their calls. */
export class ClientSide {
  readonly #seed: number
  readonly #failSink: (f: FuzzFailure) => void
  readonly #net: NetServer
  readonly conns = new Set<FakeConn>()
  #connections = 0
  mutants = 0
  stalledClosed = 0
  calls = 0
  settledOnce = 0
  settledTwice = 0
  settledBeforeReturn = 0
  neverSettled = 0
  readonly outcomes: Record<string, number> = {}
  readonly #settles: number[] = []
  readonly #pending = new Map<number, CallRecord>()
  #clients: Client[] = []
  #clientOptions: ClientOptions[] = []
  clientsClosed = 0
  /** Calls `finish` made to the real server. */
  realServerCalls = 0
  #rng: Rng
  #port = 0
  #stopping = false
  #watch: NodeJS.Timeout | null = null
  #drained: (() => void) | null = null

  constructor (seed: number, fail: (f: FuzzFailure) => void) {
    this.#seed = seed
    this.#failSink = fail
    this.#rng = new Rng(mix(seed, 0xca11))
    this.#net = createServer({ noDelay: true }, (socket) => {
      const conn = new FakeConn(this.#connections++, socket, this.#seed, this)
      this.conns.add(conn)
      socket.once('close', () => this.conns.delete(conn))
    })
  }

  get fakeConnections (): number {
    return this.#connections
  }

  fail (kind: string, detail: string, conn?: FakeConn): void {
    const f: FuzzFailure = { kind, detail, seed: this.#seed }
    if (conn !== undefined) {
      f.connection = conn.index
      f.bytesHex = conn.recentHex()
    }
    this.#failSink(f)
  }

  async start (): Promise<void> {
    await new Promise<void>((resolve) => this.#net.listen(0, HOST, resolve))
    this.#port = (this.#net.address() as { port: number }).port
    const endpoint = `${HOST}:${this.#port}`
    const base: ClientOptions = { endpoint, defaultTimeoutMs: CLIENT_TIMEOUT_MS, negotiationTimeoutMs: CLIENT_TIMEOUT_MS, maxMessageBytes: CLIENT_MAX_MESSAGE_BYTES }
    this.#clientOptions = [
      base,
      { ...base, retry: {} },
      { ...base, connectionsPerEndpoint: 2 },
      { ...base, maxMessageBytes: 4096 },
      { ...base, maxOutboundBytes: 128 * 1024 }
    ]
    this.#clients = this.#clientOptions.map(o => new Client(o))
  }

  // Now and then a client is closed with calls pending (they must settle with CLIENT_CLOSED) and replaced.
  #replaceClient (): void {
    const i = this.#rng.int(this.#clients.length)
    const old = this.#clients[i]!
    this.#clients[i] = new Client(this.#clientOptions[i]!)
    old.close()
    this.clientsClosed++
  }

  /** Keeps `concurrency` calls outstanding until `target` mutants were answered (or `stop()`). */
  async run (target: number, concurrency: number): Promise<void> {
    if (target <= 0) return
    this.#watch = setInterval(() => this.#checkStuck(), 1000)
    const done = new Promise<void>((resolve) => { this.#drained = resolve })
    const guard = target * 4 + 1000
    const next = (): void => {
      if (this.#stopping || this.mutants >= target || this.calls >= guard) {
        this.#stopping = true
        if (this.#pending.size === 0) this.#drained?.()
        return
      }
      this.#issue(next)
    }
    for (let i = 0; i < concurrency; i++) next()
    await done
    clearInterval(this.#watch)
    this.#watch = null
  }

  stop (): void {
    this.#stopping = true
    if (this.#pending.size === 0) this.#drained?.()
  }

  // Starts one call; `then` runs once it settled.
  #issue (then: () => void): void {
    const rng = this.#rng
    const id = this.calls++
    if (id % 2000 === 1999) this.#replaceClient()
    const client = rng.pick(this.#clients)
    const calc = client.service(CalculatorService)
    const timeoutMs = rng.chance(0.05) ? rng.range(1, 5) : CLIENT_TIMEOUT_MS
    const options: { timeoutMs: number, signal?: AbortSignal, sidecars?: Uint8Array[], requiredFeatureFlags?: number[] } = { timeoutMs }
    if (rng.chance(0.03)) options.requiredFeatureFlags = [rng.int(4)]
    if (rng.chance(0.05)) {
      const controller = new AbortController()
      options.signal = controller.signal
      setTimeout(() => controller.abort(), rng.int(20))
    }
    // A retried call may run up to its deadline, then a negotiation timer, before it fails.
    this.#pending.set(id, { deadline: Date.now() + timeoutMs + CLIENT_TIMEOUT_MS, reported: false })
    let returned = false
    const settle = (outcome: string): void => {
      const n = (this.#settles[id] = (this.#settles[id] ?? 0) + 1)
      if (n === 1) {
        this.#pending.delete(id)
        this.settledOnce++
        this.outcomes[outcome] = (this.outcomes[outcome] ?? 0) + 1
        if (!returned) {
          this.settledBeforeReturn++
          this.fail('settled before return', `call ${id} settled (${outcome}) before the call that made it returned`)
        }
      } else {
        this.settledOnce--
        this.settledTwice++
        this.fail('settled twice', `call ${id} settled ${n} times (last: ${outcome})`)
        return
      }
      if (this.#stopping && this.#pending.size === 0) this.#drained?.()
      then()
    }
    const onResult = (error: RpcError | null): void => settle(error === null ? 'OK' : outcomeOf(error))
    const form = rng.int(2)
    const method = rng.int(100)
    if (method < 55) {
      const request = { x: rng.u32(), y: rng.u32() }
      if (form === 0) calc.Add(request, options, (e) => onResult(e))
      else calc.Add(request, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    } else if (method < 70) {
      const request = { data: 'y'.repeat(rng.int(100)) }
      if (form === 0) calc.Echo(request, options, (e) => onResult(e))
      else calc.Echo(request, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    } else if (method < 80) {
      // Now and then a sidecar too large to copy into the frame: it is written as its own slice.
      options.sidecars = [Buffer.alloc(rng.chance(0.05) ? rng.range(64 * 1024, 400 * 1024) : rng.int(200), 7), Buffer.alloc(rng.int(50), 9)]
      const request = { sidecar_indexes: [0, 1] }
      if (form === 0) calc.PushStrings(request, options, (e) => onResult(e))
      else calc.PushStrings(request, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    } else {
      options.sidecars = Array.from({ length: rng.int(3) }, () => Buffer.alloc(rng.int(300), 5))
      // The result form: the response's sidecars come with it.
      client.call(`${HOST}:${this.#port}`, CalculatorService as unknown as ServiceDef, 'EchoSidecars', {}, options).then(() => onResult(null), (e: unknown) => settle(outcomeOf(e)))
    }
    returned = true
  }

  #checkStuck (): void {
    const now = Date.now()
    for (const [id, record] of this.#pending) {
      if (record.reported || now < record.deadline + SETTLE_GRACE_MS) continue
      record.reported = true
      this.fail('never settled', `call ${id} still pending ${now - record.deadline} ms after its deadline`)
    }
  }

  /** Waits for every call to settle (failing those that do not in time), then checks each client still calls a real server. */
  async finish (realEndpoint: string | null): Promise<boolean> {
    const deadline = Date.now() + CLIENT_TIMEOUT_MS * 2 + SETTLE_GRACE_MS
    while (this.#pending.size > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20))
    for (const [id] of this.#pending) {
      this.neverSettled++
      this.fail('never settled', `call ${id} never settled`)
    }
    this.#pending.clear()
    for (const [i, client] of this.#clients.entries()) {
      if (client.pendingCalls > 0) this.fail('client leak', `client ${i} still holds ${client.pendingCalls} calls after every call settled`)
    }
    if (realEndpoint === null) return false
    let works = true
    for (const [i, client] of this.#clients.entries()) {
      this.realServerCalls++
      try {
        const res = await client.service(CalculatorService, realEndpoint).Add({ x: 40, y: i }, { timeoutMs: 10_000 })
        if (res.result !== 40 + i) works = false
      } catch (err) {
        works = false
        this.fail('client broken after the run', `client ${i}: ${(err as Error).message}`)
      }
    }
    return works
  }

  async close (): Promise<void> {
    for (const client of this.#clients) client.close()
    for (const conn of this.conns) conn.socket.destroy()
    await new Promise<void>((resolve) => this.#net.close(() => resolve()))
  }
}

function outcomeOf (error: unknown): string {
  if (error instanceof RpcError) return error.remote?.code !== undefined ? `REMOTE:${krpcCodeName(error.remote?.code)}` : error.code
  return `THROWN:${error instanceof Error ? error.message : String(error)}`
}
