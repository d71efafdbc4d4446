// The fuzzed server: the demo service, run in this process or a child.
import { fork, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Server } from '../../reactor/krpc/server.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'
import { modelAuthenticate } from './model.js'
import { FUZZ_MAX_MESSAGE_BYTES, HOST, type ServerReport } from './options.js'

/**
 * The demo handlers, but Sleep answers at once (a mutated sleep_micros would
 * hold a worker for up to 71 minutes), and a call that reaches a handler on
 * a connection that never finished negotiation is counted (its user is '',
 * a user the authenticator refuses).
 */
function fuzzHandlers (counters: { unauthenticated: number }): typeof calculatorHandlers {
  const seen = (ctx: CallContext): void => { if (ctx.user === '') counters.unauthenticated++ }
  return {
    Add: (req, ctx) => { seen(ctx); return calculatorHandlers.Add(req, ctx) },
    Echo: (req, ctx) => { seen(ctx); return calculatorHandlers.Echo(req, ctx) },
    PushStrings: (req, ctx) => { seen(ctx); return calculatorHandlers.PushStrings(req, ctx) },
    EchoSidecars: (req, ctx) => { seen(ctx); return calculatorHandlers.EchoSidecars(req, ctx) },
    Sleep: (req, ctx) => {
      seen(ctx)
      if (req.return_app_error === true) throw new Error('Got some error')
      return {}
    }
  }
}

function buildFuzzServer (counters: { unauthenticated: number }): Server {
  return new Server({
    maxMessageBytes: FUZZ_MAX_MESSAGE_BYTES,
    // Asynchronous, so negotiation takes the server's async path.
    authenticate: async (user) => modelAuthenticate(user)
  }).addService(CalculatorService, fuzzHandlers(counters))
}

function reportOf (server: Server, counters: { unauthenticated: number }): ServerReport {
  const cpu = process.cpuUsage()
  return {
    stats: server.stats(),
    unauthenticatedCalls: counters.unauthenticated,
    maxRssKiB: process.resourceUsage().maxRSS,
    rssBytes: process.memoryUsage().rss,
    cpuMs: Math.round((cpu.user + cpu.system) / 1000)
  }
}

interface ServerHandle {
  port: number
  report: () => Promise<ServerReport>
  close: () => Promise<ServerReport>
  /** Set when the server crashed (child exit or message). */
  crashed: string | null
  /** Called once when the server crashes. */
  onCrash: (() => void) | null
}

/** The fuzzed server in this process. */
export async function startInProcess (): Promise<ServerHandle> {
  const counters = { unauthenticated: 0 }
  const server = buildFuzzServer(counters)
  const { port } = await server.listen(0, HOST)
  return {
    port,
    crashed: null,
    onCrash: null,
    report: async () => reportOf(server, counters),
    close: async () => {
      await server.close({ graceMs: 0 })
      return reportOf(server, counters)
    }
  }
}

/** The fuzzer's entry (bench/fuzz.ts, or .js once built), which runs `serverChild` when given --server-child. */
const FUZZ_ENTRY = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? '../fuzz.ts' : '../fuzz.js', import.meta.url))

type ChildMessage = { type: 'listening', port: number } | { type: 'report', id: number, report: ServerReport } | { type: 'crash', error: string }

/** The fuzzed server in a child process (the entry run with --server-child), its crashes seen as exits. */
export async function startChild (execArgv: string[]): Promise<ServerHandle> {
  const child: ChildProcess = fork(FUZZ_ENTRY, ['--server-child'], { execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  let nextId = 0
  const waiting = new Map<number, { resolve: (r: ServerReport) => void, reject: (e: Error) => void }>()
  let lastReport: ServerReport | null = null
  let exited = false
  const exit = new Promise<void>((resolve) => child.once('exit', (code, signal) => {
    exited = true
    if (handle.crashed === null && (code !== 0 || signal !== null)) {
      handle.crashed = `server child exited with ${signal ?? code}`
      handle.onCrash?.()
    }
    for (const w of waiting.values()) w.reject(new Error(`server child gone: ${handle.crashed ?? 'exited'}`))
    waiting.clear()
    resolve()
  }))
  const ask = (type: 'report' | 'close'): Promise<ServerReport> => new Promise((resolve, reject) => {
    if (exited || !child.connected) { reject(new Error(`server child gone: ${handle.crashed ?? 'disconnected'}`)); return }
    const id = type === 'close' ? -1 : nextId++
    waiting.set(id, { resolve, reject })
    child.send({ type, id })
  })
  const handle: ServerHandle = {
    port: 0,
    crashed: null,
    onCrash: null,
    report: () => ask('report'),
    close: async () => {
      const report = await ask('close').catch(() => lastReport)
      await exit
      if (report === null) throw new Error(`server child gone: ${handle.crashed ?? 'no report'}`)
      return report
    }
  }
  const listening = new Promise<number>((resolve, reject) => {
    child.on('message', (m: ChildMessage) => {
      if (m.type === 'listening') resolve(m.port)
      else if (m.type === 'crash') {
        if (handle.crashed === null) {
          handle.crashed = m.error
          handle.onCrash?.()
        }
      }
      else {
        lastReport = m.report
        const w = waiting.get(m.id)
        waiting.delete(m.id)
        w?.resolve(m.report)
      }
    })
    void exit.then(() => reject(new Error(`server child exited before listening: ${handle.crashed ?? ''}`)))
  })
  handle.port = await listening
  return handle
}

/** The server child's side (`--server-child`): serves, reports and closes at the parent's messages. */
export async function serverChild (): Promise<void> {
  const counters = { unauthenticated: 0 }
  process.on('uncaughtException', (err) => {
    process.send?.({ type: 'crash', error: err.stack ?? String(err) }, () => process.exit(70))
  })
  const server = buildFuzzServer(counters)
  const { port } = await server.listen(0, HOST)
  process.on('message', (m: { type: string, id?: number }) => {
    if (m.type === 'report') {
      process.send!({ type: 'report', id: m.id, report: reportOf(server, counters) })
    } else if (m.type === 'close') {
      void server.close({ graceMs: 0 }).then(() => {
        process.send!({ type: 'report', id: -1, report: reportOf(server, counters) }, () => process.exit(0))
      })
    }
  })
  process.on('disconnect', () => process.exit(0))
  process.send!({ type: 'listening', port })
}
