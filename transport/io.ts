import { NativeReactor, type NativeBackend } from './native/reactor.js'

/**
 * Which transport carries a server's or client's plain TCP connections:
 * `io_uring` or `epoll` (the native transport, transport/native/), `node`
 * (node:net), or `auto`: io_uring, else epoll, else node:net (the first
 * that starts: seccomp or kernel.io_uring_disabled refuse io_uring, a
 * missing addon both). The environment variable NYALA_IO, when set,
 * overrides what the code asked for. TLS connections always use node:tls.
 */
export type IoOption = 'auto' | 'io_uring' | 'epoll' | 'node'

/** The transport in use. */
export type IoBackend = 'io_uring' | 'epoll' | 'node'

/** `io` by default. */
export const DEFAULT_IO: IoOption = 'auto'

/** What `resolveIo` chose: the backend, its reactor (null for node:net), and why `auto` fell back (null when it did not). */
export interface ResolvedIo {
  backend: IoBackend
  reactor: NativeReactor | null
  fallback: string | null
}

const OPTIONS: readonly string[] = ['auto', 'io_uring', 'epoll', 'node']

/** True for the four values of `io`. */
export function isIoOption (value: unknown): value is IoOption {
  return typeof value === 'string' && OPTIONS.includes(value)
}

/**
 * The transport for `requested` (NYALA_IO first). An explicit native
 * backend that cannot start throws (a start-up error, never a silent
 * fallback); `auto` falls back and says why in `fallback`.
 */
export function resolveIo (requested: IoOption | undefined, env: string | undefined = process.env.NYALA_IO): ResolvedIo {
  const forced = env === undefined || env === '' ? undefined : env
  if (forced !== undefined && !isIoOption(forced)) throw new Error(`NYALA_IO must be auto, io_uring, epoll or node, got '${forced}'`)
  const io = forced ?? requested ?? DEFAULT_IO
  if (io === 'node') return { backend: 'node', reactor: null, fallback: null }
  if (io !== 'auto') {
    const reactor = NativeReactor.open(io)
    if (typeof reactor === 'string') throw new Error(`io '${io}' cannot be used: ${reactor}`)
    return { backend: io, reactor, fallback: null }
  }
  const reasons: string[] = []
  for (const backend of ['io_uring', 'epoll'] as NativeBackend[]) {
    const reactor = NativeReactor.open(backend)
    if (typeof reactor !== 'string') return { backend, reactor, fallback: reasons.length === 0 ? null : reasons.join('; ') }
    reasons.push(reactor)
  }
  return { backend: 'node', reactor: null, fallback: reasons.join('; ') }
}
