/**
 * The allocator tuning the launchers give a server process: glibc's mmap
 * threshold frozen at its initial 128 KiB.
 *
 * Why: glibc serves an allocation of at least the mmap threshold with a
 * mapping of its own, returned to the system when freed, but it raises the
 * threshold to the size of every such block freed (up to 32 MiB). After
 * one 1 MiB frame came and went, every later 1 MiB frame or answer is cut
 * from the heap instead, and a heap keeps its freed middle: after a
 * slow-reader or partial-frame attack the process stayed at its peak RSS.
 * Setting the threshold at all turns that adjustment off, so large buffers
 * go back to the system when they are freed (bench/rss-recovery.ts
 * measures both). glibc reads it only when the process starts, so it is an
 * environment variable: `bin/nyala` sets it before it starts Node, the
 * examples' main scripts for the reactor processes they fork.
 *
 * `NYALA_MALLOC=system` leaves glibc's default; a threshold the user chose
 * (MALLOC_MMAP_THRESHOLD_, or glibc.malloc.mmap_threshold in
 * GLIBC_TUNABLES) is kept.
 */

/** The variable and value that turn the tuning off. */
export const MALLOC_OPT_OUT = { name: 'NYALA_MALLOC', value: 'system' } as const

/** The mmap threshold the launchers set (glibc's initial one), in bytes. */
export const MMAP_THRESHOLD_BYTES = 128 * 1024

/** The variables to add to `env` for the tuning: none when it is turned off or the user chose a threshold. */
export function mallocTuning (env: NodeJS.ProcessEnv): Record<string, string> {
  if (env[MALLOC_OPT_OUT.name] === MALLOC_OPT_OUT.value) return {}
  if (env.MALLOC_MMAP_THRESHOLD_ !== undefined && env.MALLOC_MMAP_THRESHOLD_ !== '') return {}
  if ((env.GLIBC_TUNABLES ?? '').includes('malloc.mmap_threshold=')) return {}
  return { MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD_BYTES) }
}

/**
 * Adds the tuning to this process's environment, which the reactor
 * processes `serveReactors` forks inherit (this process's own allocator
 * read its settings when it started).
 */
export function tuneForkedProcesses (): void {
  Object.assign(process.env, mallocTuning(process.env))
}
