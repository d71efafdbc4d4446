/**
 * trimHeap() (transport/native/heap.c through heap.ts): after a flood of
 * small buffers is freed, the freed glibc heap stays mapped until the trim
 * gives it back. 128 K buffers of 1000 bytes (blocks below the mmap
 * threshold, ~128 MiB), a few kept after them so the heap's top stays in
 * use, then freed by a full collection: the trim returns most of it.
 * Skipped when the addon is not built (then trimHeap() answers null), and
 * under AddressSanitizer (.ci/run's sanitizer pass preloads libasan, whose
 * allocator replaces glibc's: malloc_trim there returns nothing).
 */
import t from 'tap'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { trimHeap } from '../../transport/native/heap.js'
import { loadAddon, loadFailure } from '../../transport/native/load.js'

const MiB = 1024 * 1024
const asan = /libasan/.test(process.env.LD_PRELOAD ?? '')
const skip = loadAddon() === null ? `the addon is not loaded: ${loadFailure()}` : asan ? 'under AddressSanitizer, whose allocator malloc_trim does not trim' : false

t.test('without the addon it answers null', { skip: loadAddon() === null ? false : 'the addon is loaded here' }, async (t) => {
  t.equal(trimHeap(), null)
})

t.test('the freed heap of 128 K small buffers goes back to the system', { skip }, async (t) => {
  setFlagsFromString('--expose-gc')
  const gc = runInNewContext('gc') as () => void
  gc()
  trimHeap()
  let flood: Buffer[] | null = []
  for (let i = 0; i < 128 * 1024; i++) flood.push(Buffer.allocUnsafeSlow(1000).fill(1))
  const pinned: Buffer[] = []
  for (let i = 0; i < 100; i++) pinned.push(Buffer.allocUnsafeSlow(1000).fill(2))
  const peak = process.memoryUsage.rss()
  flood = null
  gc()
  await new Promise((resolve) => setTimeout(resolve, 50))
  gc()
  const freed = process.memoryUsage.rss()
  const released = trimHeap()
  const trimmed = process.memoryUsage.rss()
  t.comment(`RSS: ${Math.round(peak / MiB)} MiB with the buffers, ${Math.round(freed / MiB)} MiB freed, ${Math.round(trimmed / MiB)} MiB trimmed`)
  t.equal(released, true, 'malloc_trim released memory')
  t.ok(freed - trimmed > 64 * MiB, `the trim gave back more than 64 MiB (${Math.round((freed - trimmed) / MiB)} MiB)`)
  t.equal(pinned.every((b) => b[0] === 2 && b[999] === 2), true, 'the buffers still held are intact')
})
