/*
 * The go/no-go prototype of a native reactor: every socket watched by a
 * uv_poll_t of its own in Node's libuv loop, so libuv's one epoll_wait per
 * turn is the only one (a second epoll set watched from the loop would cost
 * a nested epoll_wait every turn). Each ready socket's callback reads it
 * into one shared slab and notes (fd, offset, length); a uv_check_t, which
 * libuv runs once right after the poll phase, enters JS once with the
 * turn's entries. The answers JS queues in that call leave with one write
 * per connection when it returns; a write that would block keeps its rest
 * and waits for the socket to turn writable (write at once, wait only on
 * EAGAIN). Not the product: no limits, no TLS, one listener; it measures
 * what is left of a request's cost once Node's stream layer is gone
 * (bench/native-memcached.ts drives it).
 *
 * JS API (N-API, so one build loads in any Node >= 18):
 *   listen(port, onTurn) -> { port, inbound: Buffer, entries: Int32Array,
 *                             outbound: Buffer, out: Int32Array, more: Int32Array }
 *     onTurn(n): entries[3i..3i+2] = fd, offset, length for i < n (length
 *     -1: the peer closed; the fd is already closed). It returns m, the
 *     answers it wrote: out[3j..3j+2] = fd, offset, length into outbound.
 *     It sets more[0] to 1 when it left whole requests unanswered (the
 *     outbound slab was full): it is then called next turn even with n = 0.
 *   close()
 */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <node_api.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define SLAB_BYTES (4 << 20)
#define MAX_ENTRIES 4096
#define READ_BYTES (64 << 10)
#define MAX_FDS 65536

typedef struct {
  uv_poll_t poll; /* first: a callback's handle is its connection */
  int fd;
  char *pending; /* bytes a write left (EAGAIN), waiting for writability */
  size_t pending_length;
} conn_t;

static int listen_fd = -1;
static uv_poll_t listen_poll;
static uv_check_t turn_check;
/* Active while JS has requests left over: an active idle handle makes libuv poll without blocking, so the next turn comes at once. */
static uv_idle_t more_idle;
static napi_env g_env;
static napi_ref on_turn_ref;
static char *inbound;
static char *outbound;
static int32_t *entries;
static int32_t *out_entries;
static int32_t *more;
static conn_t *conns[MAX_FDS];
/* This turn's reads so far: slab bytes used and entries noted, handed to JS by on_turn. */
static size_t used;
static int noted;

static void free_conn (uv_handle_t *handle) {
  conn_t *c = (conn_t *)handle;
  free(c->pending);
  free(c);
}

/* uv_close first: it takes the fd out of libuv's epoll set while it is still open. */
static void close_conn (conn_t *c) {
  conns[c->fd] = NULL;
  uv_close((uv_handle_t *)&c->poll, free_conn);
  close(c->fd);
}

static void on_conn (uv_poll_t *handle, int status, int events);

/* Writes what can go now; keeps the rest and asks for writability. */
static void send_bytes (conn_t *c, const char *bytes, size_t length) {
  if (c->pending_length > 0) {
    /* Behind earlier bytes: append, order kept. */
    char *grown = realloc(c->pending, c->pending_length + length);
    if (grown == NULL) { close_conn(c); return; }
    memcpy(grown + c->pending_length, bytes, length);
    c->pending = grown;
    c->pending_length += length;
    return;
  }
  ssize_t n = write(c->fd, bytes, length);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) { close_conn(c); return; }
    n = 0;
  }
  if ((size_t)n == length) return;
  c->pending = malloc(length - (size_t)n);
  if (c->pending == NULL) { close_conn(c); return; }
  memcpy(c->pending, bytes + n, length - (size_t)n);
  c->pending_length = length - (size_t)n;
  uv_poll_start(&c->poll, UV_READABLE | UV_WRITABLE, on_conn);
}

/* Returns 0 once the connection is closed. */
static int flush_pending (conn_t *c) {
  ssize_t n = write(c->fd, c->pending, c->pending_length);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) { close_conn(c); return 0; }
    return 1;
  }
  if ((size_t)n < c->pending_length) {
    memmove(c->pending, c->pending + n, c->pending_length - (size_t)n);
    c->pending_length -= (size_t)n;
    return 1;
  }
  free(c->pending);
  c->pending = NULL;
  c->pending_length = 0;
  uv_poll_start(&c->poll, UV_READABLE, on_conn);
  return 1;
}

/* A ready socket: its bytes go into the slab, noted for this turn's JS call. */
static void on_conn (uv_poll_t *handle, int status, int events) {
  conn_t *c = (conn_t *)handle;
  if (status < 0) events = UV_READABLE; /* an error: the read below reports it and closes */
  if ((events & UV_WRITABLE) && c->pending_length > 0 && !flush_pending(c)) return;
  if (!(events & (UV_READABLE | UV_DISCONNECT))) return;
  /* Bounded per turn: a socket left unread (slab or entries full) is still ready next turn (level-triggered). */
  if (noted >= MAX_ENTRIES || SLAB_BYTES - used < READ_BYTES) return;
  ssize_t got = read(c->fd, inbound + used, READ_BYTES);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  entries[3 * noted] = c->fd;
  entries[3 * noted + 1] = (int32_t)used;
  if (got <= 0) {
    close_conn(c);
    entries[3 * noted + 2] = -1;
  } else {
    entries[3 * noted + 2] = (int32_t)got;
    used += (size_t)got;
  }
  noted++;
}

static void on_accept (uv_poll_t *handle, int status, int events) {
  (void)handle; (void)status; (void)events;
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN, or out of descriptors: the next turn tries again */
    conn_t *c = fd < MAX_FDS ? calloc(1, sizeof *c) : NULL;
    if (c == NULL) { close(fd); continue; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    if (uv_poll_init(uv_handle_get_loop((uv_handle_t *)handle), &c->poll, fd) != 0) { free(c); close(fd); continue; }
    conns[fd] = c;
    uv_poll_start(&c->poll, UV_READABLE, on_conn);
  }
}

/* Nothing to do: being active is its whole job (see more_idle). */
static void on_idle (uv_idle_t *handle) { (void)handle; }

/* Right after the poll phase: one JS call for every read of the turn, then the answers written. */
static void on_turn (uv_check_t *handle) {
  (void)handle;
  int n = noted;
  if (n == 0 && more[0] == 0) return;
  noted = 0;
  used = 0;
  napi_handle_scope scope;
  napi_open_handle_scope(g_env, &scope);
  napi_value fn, undefined, arg, result;
  napi_get_reference_value(g_env, on_turn_ref, &fn);
  napi_get_undefined(g_env, &undefined);
  napi_create_int32(g_env, n, &arg);
  int32_t answers = 0;
  /* napi_call_function, not napi_make_callback: no async-hooks scope and no
   * microtask checkpoint per turn (the JS side is synchronous). The product
   * would need the checkpoint for handlers that await. */
  if (napi_call_function(g_env, undefined, fn, 1, &arg, &result) == napi_ok) napi_get_value_int32(g_env, result, &answers);
  else {
    napi_value error;
    napi_get_and_clear_last_exception(g_env, &error);
  }
  for (int j = 0; j < answers && j < MAX_ENTRIES; j++) {
    int32_t fd = out_entries[3 * j], off = out_entries[3 * j + 1], len = out_entries[3 * j + 2];
    if (fd < 0 || fd >= MAX_FDS || conns[fd] == NULL) continue;
    if (off < 0 || len <= 0 || (size_t)off + (size_t)len > SLAB_BYTES) continue;
    send_bytes(conns[fd], outbound + off, (size_t)len);
  }
  if (more[0] != 0) uv_idle_start(&more_idle, on_idle);
  else uv_idle_stop(&more_idle);
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

  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
  if (bind(listen_fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listen_fd, 512) < 0) {
    napi_throw_error(env, NULL, strerror(errno));
    close(listen_fd);
    listen_fd = -1;
    return NULL;
  }
  socklen_t len = sizeof addr;
  getsockname(listen_fd, (struct sockaddr *)&addr, &len);
  napi_create_reference(env, argv[1], 1, &on_turn_ref);

  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  uv_poll_init(loop, &listen_poll, listen_fd);
  uv_poll_start(&listen_poll, UV_READABLE, on_accept);
  uv_check_init(loop, &turn_check);
  uv_check_start(&turn_check, on_turn);
  uv_unref((uv_handle_t *)&turn_check); /* the listener keeps the loop alive, not this */
  uv_idle_init(loop, &more_idle);
  uv_unref((uv_handle_t *)&more_idle);

  inbound = malloc(SLAB_BYTES);
  outbound = malloc(SLAB_BYTES);
  entries = malloc(sizeof(int32_t) * 3 * MAX_ENTRIES);
  out_entries = malloc(sizeof(int32_t) * 3 * MAX_ENTRIES);
  more = calloc(1, sizeof(int32_t));
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
  ab = buffer_over(env, more, sizeof(int32_t));
  napi_create_typedarray(env, napi_int32_array, 1, ab, 0, &value);
  napi_set_named_property(env, result, "more", value);
  return result;
}

static napi_value js_close (napi_env env, napi_callback_info info) {
  (void)info;
  if (listen_fd >= 0) {
    uv_close((uv_handle_t *)&listen_poll, NULL);
    uv_close((uv_handle_t *)&turn_check, NULL);
    uv_close((uv_handle_t *)&more_idle, NULL);
    close(listen_fd);
    listen_fd = -1;
    for (int fd = 0; fd < MAX_FDS; fd++) if (conns[fd] != NULL) close_conn(conns[fd]);
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
