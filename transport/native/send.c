/*
 * The sends JS makes on a connection (open() binds them; addon.c has the
 * rest of the N-API side). Each hands the backend's send iovecs over the
 * Buffers' memory: the backend copies what it takes (io_uring) or the
 * kernel does (epoll), so JS may write the Buffers again once it returns.
 */
#define _GNU_SOURCE
#include "nyala.h"

#include <errno.h>

/* Copies a JS Buffer's place into `iov`; 0 when `v` is not a Buffer. */
static int iov_of (napi_env env, napi_value v, struct iovec *iov) {
  void *data;
  size_t len;
  if (napi_get_buffer_info(env, v, &data, &len) != napi_ok) return 0;
  iov->iov_base = data;
  iov->iov_len = len;
  return 1;
}

/* send(id, buffer) -> bytes taken | -errno */
napi_value js_send (napi_env env, napi_callback_info info) {
  napi_value argv[2];
  reactor_t *r = args(env, info, 2, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  struct iovec iov;
  if (c == NULL) return int_value(env, -EBADF);
  if (!iov_of(env, argv[1], &iov)) return int_value(env, -EINVAL);
  return int_value(env, r->backend->send(r, c, &iov, 1));
}

/*
 * Makes `v` sendRange's source: held by a reference until the next (the
 * reactor lives as long as the process), so its memory stays where N-API
 * said it is (the sources are nyala's own answer slabs, which are never
 * transferred: a detached ArrayBuffer would lose its memory), and named as
 * the reactor object's `source` (null when `v` is not a Buffer: sends from
 * it are refused), which JS compares with.
 */
static void set_source (napi_env env, reactor_t *r, napi_value v) {
  struct iovec iov = { NULL, 0 };
  napi_value named = v, self = NULL;
  if (r->source != NULL) napi_delete_reference(env, r->source);
  r->source = NULL;
  if (iov_of(env, v, &iov)) napi_create_reference(env, v, 1, &r->source);
  else napi_get_null(env, &named);
  r->source_data = r->source == NULL ? NULL : iov.iov_base;
  r->source_length = r->source == NULL ? 0 : iov.iov_len;
  if (napi_get_reference_value(env, r->self, &self) == napi_ok && self != NULL) napi_set_named_property(env, self, "source", named);
}

/*
 * sendRange([buffer]) -> undefined: sends source[start, end) to connection
 * id, the three read from sendArgs[0..2], and leaves the bytes taken (or
 * -errno) in sendArgs[3]. A buffer given becomes the source; without one
 * the last is sent from again (none yet: EINVAL). Answers are encoded into
 * a few 64 KiB slabs, so most sends name none: no N-API number conversions
 * (~170 instructions a send) and no asking where a Buffer's memory is (~210).
 */
napi_value js_send_range (napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1] = { NULL };
  void *data = NULL;
  napi_get_cb_info(env, info, &argc, argv, NULL, &data);
  reactor_t *r = data;
  if (argc >= 1) set_source(env, r, argv[0]);
  int32_t *a = r->send_args;
  conn_t *c = conn_of(r, a[0], NULL);
  if (c == NULL) a[3] = -EBADF;
  else if (r->source == NULL || a[1] < 0 || a[2] < a[1] || (size_t)a[2] > r->source_length) a[3] = -EINVAL;
  else {
    struct iovec iov = { r->source_data + a[1], (size_t)(a[2] - a[1]) };
    a[3] = (int32_t)r->backend->send(r, c, &iov, 1);
  }
  return NULL;
}

/* sendv(id, buffers) -> bytes taken | -errno (at most MAX_IOV buffers go; the rest is as if refused) */
napi_value js_sendv (napi_env env, napi_callback_info info) {
  napi_value argv[2];
  reactor_t *r = args(env, info, 2, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  struct iovec *iov = r->iov;
  uint32_t n = 0;
  if (c == NULL) return int_value(env, -EBADF);
  if (argv[1] == NULL || napi_get_array_length(env, argv[1], &n) != napi_ok) return int_value(env, -EINVAL);
  if (n > MAX_IOV) n = MAX_IOV;
  for (uint32_t i = 0; i < n; i++) {
    napi_value v;
    if (napi_get_element(env, argv[1], i, &v) != napi_ok || !iov_of(env, v, &iov[i])) return int_value(env, -EINVAL);
  }
  return int_value(env, r->backend->send(r, c, iov, (int)n));
}
