// Options and results of a run, and the constants every part shares.
import { headerSchema } from '../../codec/krpc/frames.js'
import type { ServerStats } from '../../reactor/krpc/server.js'
import { CalculatorService } from '../../examples/calculator/index.js'

export interface FuzzOptions {
  /** Mutants to send in all (server and client side). */
  mutants: number
  seed?: number
  /** Share of the mutants that go to the client side (answers of the fake server); default 0.3. */
  clientShare?: number
  /** Server-side connections (episodes) at once; default 32. */
  concurrency?: number
  /** Client-side calls outstanding at once; default 64. */
  clientConcurrency?: number
  /** `child` (default): the server runs in a child process; `in-process`: in this one. */
  server?: 'child' | 'in-process'
  /** Node flags of the server child (default: this process's, so a TypeScript loader carries over). */
  execArgv?: string[]
  /** Adds inputs that hit the product bugs already known (see the file's comment). */
  foundBugs?: readonly FoundBug[]
  /** Stops early (reported, not a failure) after this long; default 3600 s. */
  maxSeconds?: number
  /** Progress lines (default: none). */
  log?: (line: string) => void
}

/** One failure: what went wrong and how to send the same bytes again. */
export interface FuzzFailure {
  kind: string
  detail: string
  seed: number
  /** Server side: the episode (`--replay-episode`) and its batch. */
  episode?: number
  batch?: number
  /** Client side: the fake server's connection. */
  connection?: number
  /** Bytes written on the connection (hex, at most 8 KiB of them). */
  bytesHex?: string
}

export interface ServerReport {
  stats: ServerStats
  /** Calls that reached a handler on a connection that never finished negotiation. */
  unauthenticatedCalls: number
  maxRssKiB: number
  rssBytes: number
  /** User + system CPU time of the server's process, ms. */
  cpuMs: number
}

export interface FuzzResult {
  seed: number
  mutants: { total: number, serverFrames: number, negotiation: number, client: number }
  server: {
    mode: 'child' | 'in-process'
    episodes: number
    batches: number
    /** Calls the model predicted an answer for, and how many got exactly one. */
    callsPredicted: number
    callsAnsweredOnce: number
    /** Answers never sent because the connection closed for a bad frame of the same read (which the server may do). */
    answersDroppedAtClose: number
    /** Connections the server closed where the model said it must (bad frame, refused negotiation or preamble). */
    closedAsPredicted: number
    /** Connections the server closed while the model waited for bytes (a limit or deadline; allowed). */
    closedWhileWaiting: number
    /** Bad frames the server counted (stats().badFrames), and the model's count. */
    badFramesClosed: number
    badFramesModel: number
    callsReceived: number
    callsReceivedModel: number
    unauthenticatedCalls: number
    probes: { ok: number, failed: number }
    /** A normal Add was answered after the run. */
    answersAfterRun: boolean
    /** Open connections and calls in flight on the server at the end. */
    connectionsOpenAtEnd: number
    callsInFlightAtEnd: number
  }
  client: {
    calls: number
    settledOnce: number
    settledTwice: number
    settledBeforeReturn: number
    neverSettled: number
    outcomes: Record<string, number>
    fakeConnections: number
    /** Fake-server connections closed because the client was left waiting inside a frame (a lying length). */
    stalledClosed: number
    /** Clients closed (and replaced) with calls pending during the run. */
    clientsClosed: number
    /** The fuzzed clients' calls to the real server after the run. */
    stillWork: boolean
  }
  crashes: { count: number, details: string[] }
  failures: FuzzFailure[]
  failureCount: number
  rss: { serverPeakKiB: number, fuzzerPeakKiB: number, serverEndBytes: number }
  /** CPU time (user + system) of the server's process and of this one, ms (the same process in-process). */
  cpuMs: { server: number, fuzzer: number }
  openSocketsAtEnd: number
  stoppedEarly: boolean
  wallMs: number
}

/** Product bugs the fuzzer found (fixed), whose inputs `foundBugs` keeps in the mix (see the file's comment). */
export const FOUND_BUGS = ['prototype-names', 'refused-auth-pipelining'] as const
export type FoundBug = typeof FOUND_BUGS[number]

/** Where every server of the run listens. */
export const HOST = '127.0.0.1'
/** The fuzzed server's largest frame: lying prefixes above it are refused at the prefix, below it they wait for bytes. */
export const FUZZ_MAX_MESSAGE_BYTES = 1024 * 1024
/** The fuzzed clients' largest inbound frame. */
export const CLIENT_MAX_MESSAGE_BYTES = 256 * 1024
/** The fuzzed clients' call timeout. */
export const CLIENT_TIMEOUT_MS = 250
/** Time a batch may take to be answered (and closed, if it must) before that is a failure. */
export const BATCH_TIMEOUT_MS = 20_000
/** Grace past a call's deadline before it counts as never settled. */
export const SETTLE_GRACE_MS = 5000
/** The failures kept in a result (the count goes on). */
export const MAX_FAILURES_KEPT = 20
/** The most bytes of an input kept as hex in a failure. */
export const MAX_HEX_BYTES = 8192

/** The demo service's full name. */
export const SERVICE = CalculatorService.fullName
/** The demo service's methods. */
export const M = CalculatorService.methods
/** The NegotiatePB type, with the fields the fuzzer reads and writes. */
export const NegotiateType = headerSchema.type<{
  step: number, supported_features?: number[], token?: Uint8Array, sasl_mechanisms?: Array<{ mechanism: string }>,
  authn_types?: Array<{ sasl?: object, token?: object, certificate?: object, jwt?: object }>
}>('kudu.rpc.NegotiatePB')
