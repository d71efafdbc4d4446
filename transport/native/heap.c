/*
 * trimHeap(): gives the process's freed C heap back to the system.
 *
 * Why: a flood of small frames (pushes, pipelined answers to peers that do
 * not read) leaves hundreds of MiB of glibc heap freed but still mapped:
 * blocks below the mmap threshold are carved from the heap and its arenas,
 * and glibc returns only the top of the main heap on its own. malloc_trim(0)
 * releases every free page of every arena (madvise(MADV_DONTNEED) for the
 * pages inside, sbrk for the top). reactor/idle-collection.ts calls it after
 * its idle full collection, when the garbage's buffers have just been freed.
 *
 * It runs on Node's thread, between JS turns, like any N-API call: glibc
 * locks each arena while it trims it, so other threads' mallocs wait a
 * little; nothing else is touched.
 */
#define _GNU_SOURCE
#include "nyala.h"

#include <malloc.h>

/* trimHeap() -> true when some memory was released to the system. */
static napi_value js_trim_heap (napi_env env, napi_callback_info info) {
  (void)info;
  napi_value result;
  napi_get_boolean(env, malloc_trim(0) != 0, &result);
  return result;
}

/* Adds trimHeap to the addon's exports (addon.c's init calls it). */
void heap_init (napi_env env, napi_value exports) {
  napi_value fn;
  napi_create_function(env, "trimHeap", NAPI_AUTO_LENGTH, js_trim_heap, NULL, &fn);
  napi_set_named_property(env, exports, "trimHeap", fn);
}
