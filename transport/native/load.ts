import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The addon's API (transport/native/addon.c documents it). */
export interface NativeAddon {
  open: (backend: 'epoll' | 'io_uring', onTurn: (n: number, slabs: Buffer[]) => void) => NativeReactorHandle | number
}

/** A reactor the addon opened: its turn's events and the calls on its listeners and connections (negative numbers: -errno). */
export interface NativeReactorHandle {
  readonly events: Int32Array
  listen: (host: string, port: number, backlog: number, reusePort: boolean) => [number, number] | number
  closeListener: (listener: number) => void
  connect: (host: string, port: number, keepAliveSecs: number) => number
  /** Sends `chunk`. */
  send: (id: number, chunk: Buffer) => number
  /**
   * Sends `source[sendArgs[1], sendArgs[2])` on connection `sendArgs[0]`;
   * the bytes taken (or -errno) are left in `sendArgs[3]`. A `source` given
   * becomes `source` (not a Buffer: null) for the next calls, which may
   * leave it out to send from it again.
   */
  sendRange: (source?: Buffer) => void
  /** sendRange's source (undefined before the first). */
  readonly source?: Buffer | null
  /** sendRange's id, start, end and result. */
  readonly sendArgs: Int32Array
  sendv: (id: number, chunks: readonly Buffer[]) => number
  setReading: (id: number, on: boolean) => void
  shutdown: (id: number) => number
  close: (id: number, reset: boolean) => void
  peer: (id: number) => [string, number] | null
  queued: (id: number) => number
}

/** Where the built addon may be, first match wins: NYALA_NATIVE (a path), then prebuilds/linux-x64 at the package root (from the sources or from dist/). */
export function addonPaths (): string[] {
  const here = dirname(fileURLToPath(import.meta.url))
  const paths: string[] = []
  const forced = process.env.NYALA_NATIVE
  if (forced !== undefined && forced !== '') paths.push(forced)
  const platform = `${process.platform}-${process.arch}`
  // transport/native/ in the sources, dist/transport/native/ once compiled.
  for (const up of ['../..', '../../..']) paths.push(join(here, up, 'prebuilds', platform, 'nyala.node'))
  return paths
}

let loaded: { addon: NativeAddon | null, reason: string } | null = null

/**
 * The native transport's addon, loaded once; null when it is not built for
 * this platform or does not load (`loadFailure()` says why).
 */
export function loadAddon (): NativeAddon | null {
  if (loaded === null) loaded = tryLoad()
  return loaded.addon
}

/** Why `loadAddon()` returned null ('' when it did not). */
export function loadFailure (): string {
  loadAddon()
  return loaded!.reason
}

function tryLoad (): { addon: NativeAddon | null, reason: string } {
  if (process.platform !== 'linux') return { addon: null, reason: `no native transport on ${process.platform}` }
  const require = createRequire(import.meta.url)
  for (const path of addonPaths()) {
    if (!existsSync(path)) continue
    try {
      return { addon: require(path) as NativeAddon, reason: '' }
    } catch (err) {
      return { addon: null, reason: `${path} does not load: ${(err as Error).message}` }
    }
  }
  return { addon: null, reason: 'the native transport is not built (transport/native/build.sh)' }
}
