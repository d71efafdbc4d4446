/*
 * The go/no-go prototype of a native reactor: one epoll
 * set, watched from Node's own libuv loop by one uv_poll_t, that accepts,
 * reads every ready socket of a loop turn into one shared slab and enters
 * JS once with (fd, offset, length) entries. The answers JS queues in that
 * call leave with one write per connection when it returns; a write that
 * would block keeps its rest and waits for EPOLLOUT (write at once, wait
 * only on EAGAIN). Not the product: no limits, no TLS, one listener, level-
 * triggered epoll; it measures what is left of a request's cost once Node's
 * stream layer is gone (bench/native-memcached.ts drives it).
 *
 * JS API (N-API, so one build loads in any Node >= 18):
 *   listen(port, onTurn) -> { port, inbound: Buffer, entries: Int32Array,
 *                             outbound: Buffer, out: Int32Array }
 *     onTurn(n): entries[3i..3i+2] = fd, offset, length for i < n (length
 *     -1: the peer closed; the fd is already closed). It returns m, the
 *     answers it wrote: out[3j..3j+2] = fd, offset, length into outbound.
 *   close()
 */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <node_api.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define SLAB_BYTES (4 << 20)
#define MAX_ENTRIES 4096
#define MAX_EVENTS 512
#define READ_BYTES (64 << 10)
#define MAX_FDS 65536

typedef struct {
  char *data; /* bytes a write left (EAGAIN), waiting for EPOLLOUT */
  size_t length;
} pending_t;

static int listen_fd = -1;
static int epoll_fd = -1;
static uv_poll_t poll_handle;
static napi_env g_env;
static napi_ref on_turn_ref;
static char *inbound;
static char *outbound;
static int32_t *entries;
static int32_t *out_entries;
static pending_t pending[MAX_FDS];

static void close_fd (int fd) {
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
  if (fd < MAX_FDS) {
    free(pending[fd].data);
    pending[fd].data = NULL;
    pending[fd].length = 0;
  }
}

/* Writes what can go now; keeps the rest and asks for EPOLLOUT. */
static void send_bytes (int fd, const char *bytes, size_t length) {
  if (fd < 0 || fd >= MAX_FDS) return;
  pending_t *p = &pending[fd];
  if (p->length > 0) {
    /* Behind earlier bytes: append, order kept. */
    char *grown = realloc(p->data, p->length + length);
    if (grown == NULL) { close_fd(fd); return; }
    memcpy(grown + p->length, bytes, length);
    p->data = grown;
    p->length += length;
    return;
  }
  ssize_t n = write(fd, bytes, length);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) { close_fd(fd); return; }
    n = 0;
  }
  if ((size_t)n == length) return;
  p->data = malloc(length - (size_t)n);
  if (p->data == NULL) { close_fd(fd); return; }
  memcpy(p->data, bytes + n, length - (size_t)n);
  p->length = length - (size_t)n;
  struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.fd = fd };
  epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
}

static void flush_pending (int fd) {
  pending_t *p = &pending[fd];
  ssize_t n = write(fd, p->data, p->length);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) close_fd(fd);
    return;
  }
  if ((size_t)n < p->length) {
    memmove(p->data, p->data + n, p->length - (size_t)n);
    p->length -= (size_t)n;
    return;
  }
  free(p->data);
  p->data = NULL;
  p->length = 0;
  struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
  epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
}

static void accept_all (void) {
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN, or out of descriptors: the next turn tries again */
    if (fd >= MAX_FDS) { close(fd); continue; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0) close(fd);
  }
}

/* One loop turn: every ready socket read into the slab, one JS call, the answers written. */
static void on_ready (uv_poll_t *handle, int status, int events) {
  (void)handle; (void)status; (void)events;
  struct epoll_event ready[MAX_EVENTS];
  int count = epoll_wait(epoll_fd, ready, MAX_EVENTS, 0);
  if (count <= 0) return;
  size_t used = 0;
  int n = 0;
  for (int i = 0; i < count; i++) {
    int fd = ready[i].data.fd;
    if (fd == listen_fd) { accept_all(); continue; }
    if ((ready[i].events & EPOLLOUT) && fd < MAX_FDS && pending[fd].length > 0) flush_pending(fd);
    if (!(ready[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
    /* Bounded per turn: a socket left unread (slab or entries full) is still ready next turn. */
    if (n >= MAX_ENTRIES || SLAB_BYTES - used < READ_BYTES) break;
    ssize_t got = read(fd, inbound + used, READ_BYTES);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    entries[3 * n] = fd;
    entries[3 * n + 1] = (int32_t)used;
    if (got <= 0) {
      close_fd(fd);
      entries[3 * n + 2] = -1;
    } else {
      entries[3 * n + 2] = (int32_t)got;
      used += (size_t)got;
    }
    n++;
  }
  if (n == 0) return;
  napi_handle_scope scope;
  napi_open_handle_scope(g_env, &scope);
  napi_value fn, global, arg, result;
  napi_get_reference_value(g_env, on_turn_ref, &fn);
  napi_get_global(g_env, &global);
  napi_create_int32(g_env, n, &arg);
  int32_t answers = 0;
  /* napi_call_function, not napi_make_callback: no async-hooks scope and no
   * microtask checkpoint per turn (the JS side is synchronous). The product
   * would need the checkpoint for handlers that await. */
  if (napi_call_function(g_env, global, fn, 1, &arg, &result) == napi_ok) napi_get_value_int32(g_env, result, &answers);
  else {
    napi_value error;
    napi_get_and_clear_last_exception(g_env, &error);
  }
  for (int j = 0; j < answers && j < MAX_ENTRIES; j++) {
    int32_t off = out_entries[3 * j + 1], len = out_entries[3 * j + 2];
    if (off < 0 || len <= 0 || (size_t)off + (size_t)len > SLAB_BYTES) continue;
    send_bytes(out_entries[3 * j], outbound + off, (size_t)len);
  }
  napi_close_handle_scope(g_env, scope);
}

static napi_value buffer_over (napi_env env, void *data, size_t bytes) {
  napi_value ab;
  napi_create_external_arraybuffer(env, data, bytes, NULL, NULL, &ab);
  return ab;
}

static napi_value js_listen (napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int32_t port = 0;
  napi_get_value_int32(env, argv[0], &port);
  g_env = env;
  napi_create_reference(env, argv[1], 1, &on_turn_ref);

  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
  if (bind(listen_fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listen_fd, 512) < 0) {
    napi_throw_error(env, NULL, strerror(errno));
    return NULL;
  }
  socklen_t len = sizeof addr;
  getsockname(listen_fd, (struct sockaddr *)&addr, &len);

  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = { .events = EPOLLIN, .data.fd = listen_fd };
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  uv_poll_init(loop, &poll_handle, epoll_fd);
  uv_poll_start(&poll_handle, UV_READABLE, on_ready);

  inbound = malloc(SLAB_BYTES);
  outbound = malloc(SLAB_BYTES);
  entries = malloc(sizeof(int32_t) * 3 * MAX_ENTRIES);
  out_entries = malloc(sizeof(int32_t) * 3 * MAX_ENTRIES);
  napi_value result, value, ab;
  napi_create_object(env, &result);
  napi_create_int32(env, ntohs(addr.sin_port), &value);
  napi_set_named_property(env, result, "port", value);
  ab = buffer_over(env, inbound, SLAB_BYTES);
  napi_create_typedarray(env, napi_uint8_array, SLAB_BYTES, ab, 0, &value);
  napi_set_named_property(env, result, "inbound", value);
  ab = buffer_over(env, outbound, SLAB_BYTES);
  napi_create_typedarray(env, napi_uint8_array, SLAB_BYTES, ab, 0, &value);
  napi_set_named_property(env, result, "outbound", value);
  ab = buffer_over(env, entries, sizeof(int32_t) * 3 * MAX_ENTRIES);
  napi_create_typedarray(env, napi_int32_array, 3 * MAX_ENTRIES, ab, 0, &value);
  napi_set_named_property(env, result, "entries", value);
  ab = buffer_over(env, out_entries, sizeof(int32_t) * 3 * MAX_ENTRIES);
  napi_create_typedarray(env, napi_int32_array, 3 * MAX_ENTRIES, ab, 0, &value);
  napi_set_named_property(env, result, "out", value);
  return result;
}

static napi_value js_close (napi_env env, napi_callback_info info) {
  (void)info;
  if (epoll_fd >= 0) {
    uv_poll_stop(&poll_handle);
    uv_close((uv_handle_t *)&poll_handle, NULL);
    close(listen_fd);
    close(epoll_fd);
    epoll_fd = -1;
    napi_delete_reference(env, on_turn_ref);
  }
  return NULL;
}

static napi_value init (napi_env env, napi_value exports) {
  napi_value fn;
  napi_create_function(env, "listen", NAPI_AUTO_LENGTH, js_listen, NULL, &fn);
  napi_set_named_property(env, exports, "listen", fn);
  napi_create_function(env, "close", NAPI_AUTO_LENGTH, js_close, NULL, &fn);
  napi_set_named_property(env, exports, "close", fn);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
