import { loadAddon } from './load.js'

/**
 * Gives the freed C heap back to the system: the addon's `trimHeap()`
 * (transport/native/heap.c, glibc's malloc_trim(0)). A flood of small
 * frames leaves the memory of its buffers freed but still mapped (blocks
 * below glibc's mmap threshold); only this returns it. The addon is loaded
 * for it whatever transport the connections use (node:net too). Answers
 * true when memory was released, false when none was, and null when the
 * addon is not there (not built, not Linux): then that heap stays mapped
 * and is reused by later allocations (docs/limits.md).
 */
export function trimHeap (): boolean | null {
  const addon = loadAddon() as { trimHeap?: () => boolean } | null
  if (addon === null || typeof addon.trimHeap !== 'function') return null
  return addon.trimHeap()
}
