/*
 * The N-API side of the native transport: `open(backend, onTurn)` makes a
 * reactor (one uv_poll_t in Node's loop, see nyala.h) and returns its
 * functions, bound to it. This file owns the slabs reads land in, the
 * turn's events and the one JS call per turn; send.c the sends; connections.c
 * the connection table; epoll.c and uring.c the syscalls.
 *
 * JS API (transport/native/reactor.ts is its only caller):
 *   open(backend, onTurn) -> { events: Int32Array, sendArgs: Int32Array,
 *       listen, closeListener, connect, send, sendRange, sendv, setReading,
 *       shutdown, close, peer, queued, and sendRange's source once set },
 *       or a negative errno (the backend cannot start here).
 *   onTurn(n, slabs): events[4i .. 4i+3] for i < n (kinds in nyala.h);
 *       slabs: the Buffers this turn's reads are in. A slab is never
 *       written again where JS was given bytes, and lives while any view
 *       of it does (each Buffer holds a reference; its finalizer drops it).
 *   Calls that can fail return a negative errno; send/sendv return the
 *   bytes taken (fewer than offered: the rest waits for EV_WRITABLE).
 */
#define _GNU_SOURCE
#include "nyala.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>


/* ---- slabs and the turn's events ---- */

static void slab_release (slab_t *s) {
  if (--s->refs == 0) free(s);
}

/* A JS Buffer over a slab was collected. */
static void slab_finalize (napi_env env, void *data, void *hint) {
  (void)env; (void)data;
  slab_release((slab_t *)hint);
}

int turn_full (const reactor_t *r) {
  return r->n_events >= MAX_EVENTS;
}

void note (reactor_t *r, int32_t a, int32_t kind, int32_t b, int32_t c) {
  if (turn_full(r)) return; /* callers check turn_full before taking work they must report */
  int32_t *e = r->events + 4 * r->n_events++;
  e[0] = a; e[1] = kind; e[2] = b; e[3] = c;
}

/* Where the next read of at least `need` bytes goes: the rest of the slab, or a new one. NULL: this turn can take no more reads. */
char *read_room (reactor_t *r, size_t need, size_t *room) {
  if (turn_full(r)) return NULL;
  if (r->slab == NULL || SLAB_BYTES - r->slab->used < need) {
    if (r->n_turn_slabs == MAX_TURN_SLABS) return NULL;
    slab_t *s = malloc(sizeof *s);
    if (s == NULL) return NULL;
    s->refs = 1;
    s->used = 0;
    s->js = NULL;
    if (r->slab != NULL) {
      /* Full: its Buffer lives on while JS holds views of it (the finalizer drops the Buffer's ref). */
      if (r->slab->js != NULL) napi_delete_reference(r->env, r->slab->js);
      r->slab->js = NULL;
      slab_release(r->slab);
    }
    r->slab = s;
  }
  size_t rest = SLAB_BYTES - r->slab->used;
  *room = rest < READ_BYTES ? rest : READ_BYTES;
  return r->slab->data + r->slab->used;
}

/* `n` bytes were read into the room read_room gave, for the connection in `slot`. */
int note_read (reactor_t *r, int slot, size_t n) {
  slab_t *s = r->slab;
  int index = r->n_turn_slabs - 1;
  if (index < 0 || r->turn_slabs[index] != s) {
    index = r->n_turn_slabs++;
    r->turn_slabs[index] = s;
    s->refs++; /* the turn's, until JS has its Buffer */
  }
  note(r, conn_id(r->conns[slot], slot), EV_READ | (index << 8), (int32_t)s->used, (int32_t)(s->used + n));
  s->used += n;
  return 0;
}

/* The turn's slabs as Buffers, each holding its slab: the slab's Buffer of earlier turns while the reactor still fills it. */
static napi_value turn_buffers (reactor_t *r) {
  napi_env env = r->env;
  napi_value array, buf;
  napi_create_array_with_length(env, (size_t)r->n_turn_slabs, &array);
  for (int i = 0; i < r->n_turn_slabs; i++) {
    slab_t *s = r->turn_slabs[i];
    if (s->js == NULL || napi_get_reference_value(env, s->js, &buf) != napi_ok || buf == NULL) {
      if (napi_create_external_buffer(env, SLAB_BYTES, s->data, slab_finalize, s, &buf) == napi_ok) {
        s->refs++;
        /* Kept for the next turns only while the reactor fills this slab (a full one is let go). */
        if (s == r->slab && s->js == NULL) napi_create_reference(env, buf, 1, &s->js);
      } else {
        napi_get_undefined(env, &buf);
      }
    }
    napi_set_element(env, array, (uint32_t)i, buf);
  }
  return array;
}

/* One JS call with every event of the turn (microtasks run when it returns, as after any libuv callback). */
static void deliver (reactor_t *r) {
  if (r->n_events == 0) return;
  napi_env env = r->env;
  napi_handle_scope scope;
  napi_open_handle_scope(env, &scope);
  napi_value fn, recv, argv[2], result;
  napi_get_reference_value(env, r->on_turn, &fn);
  napi_get_global(env, &recv);
  napi_create_int32(env, r->n_events, &argv[0]);
  argv[1] = turn_buffers(r);
  for (int i = 0; i < r->n_turn_slabs; i++) slab_release(r->turn_slabs[i]);
  r->n_turn_slabs = 0;
  r->n_events = 0;
  r->in_turn = 1;
  if (napi_make_callback(env, NULL, recv, fn, 2, argv, &result) == napi_pending_exception) {
    /* An exception JS did not catch is the process's, as from any callback. */
    napi_value error;
    napi_get_and_clear_last_exception(env, &error);
    napi_fatal_exception(env, error);
  }
  r->in_turn = 0;
  napi_close_handle_scope(env, scope);
}

/* Node's loop polled the backend's fd: take the turn's events, enter JS once, hand the kernel the answers. */
static void on_poll (uv_poll_t *handle, int status, int events) {
  (void)status; (void)events;
  reactor_t *r = handle->data;
  r->backend->turn(r);
  deliver(r);
  r->backend->after_turn(r);
}

void listeners_resume (reactor_t *r) {
  for (int i = 0; i < MAX_LISTENERS; i++) {
    listener_t *l = &r->listeners[i];
    if (l->in_use && l->stopped && r->backend->watch_listener(r, i) == 0) l->stopped = 0;
  }
}

/* ---- argument helpers ---- */

reactor_t *args (napi_env env, napi_callback_info info, size_t want, napi_value *argv) {
  size_t argc = want;
  void *data = NULL;
  for (size_t i = 0; i < want; i++) argv[i] = NULL;
  napi_get_cb_info(env, info, &argc, argv, NULL, &data);
  return data;
}

int32_t int_arg (napi_env env, napi_value v) {
  int32_t n = -1;
  if (v == NULL || napi_get_value_int32(env, v, &n) != napi_ok) return -1;
  return n;
}

napi_value int_value (napi_env env, int64_t n) {
  napi_value v;
  napi_create_int64(env, n, &v);
  return v;
}

/* A numeric IPv4 or IPv6 address and port (names are resolved in JS). */
static int address_of (napi_env env, napi_value host, int32_t port, struct sockaddr_storage *addr, socklen_t *len) {
  char text[INET6_ADDRSTRLEN + 1];
  size_t n = 0;
  if (host == NULL || napi_get_value_string_utf8(env, host, text, sizeof text, &n) != napi_ok) return -EINVAL;
  if (port < 0 || port > 65535) return -EINVAL;
  memset(addr, 0, sizeof *addr);
  struct sockaddr_in *v4 = (struct sockaddr_in *)addr;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)addr;
  if (inet_pton(AF_INET, text, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    *len = sizeof *v4;
    return 0;
  }
  if (inet_pton(AF_INET6, text, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    *len = sizeof *v6;
    return 0;
  }
  return -EINVAL;
}

/* ---- the functions open() returns ---- */

/* listen(host, port, backlog, reusePort) -> [listener, port] | -errno */
static napi_value js_listen (napi_env env, napi_callback_info info) {
  napi_value argv[4];
  reactor_t *r = args(env, info, 4, argv);
  struct sockaddr_storage addr;
  socklen_t len;
  int err = address_of(env, argv[0], int_arg(env, argv[1]), &addr, &len);
  if (err < 0) return int_value(env, err);
  int index = 0;
  while (index < MAX_LISTENERS && r->listeners[index].in_use) index++;
  if (index == MAX_LISTENERS) return int_value(env, -EMFILE);
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return int_value(env, -errno);
  int one = 1;
  bool reuse_port = false;
  if (argv[3] != NULL) napi_get_value_bool(env, argv[3], &reuse_port);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuse_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  int32_t backlog = int_arg(env, argv[2]);
  if (bind(fd, (struct sockaddr *)&addr, len) < 0 || listen(fd, backlog > 0 ? backlog : 511) < 0) {
    err = -errno;
    close(fd);
    return int_value(env, err);
  }
  len = sizeof addr;
  getsockname(fd, (struct sockaddr *)&addr, &len);
  int port = ntohs(addr.ss_family == AF_INET ? ((struct sockaddr_in *)&addr)->sin_port : ((struct sockaddr_in6 *)&addr)->sin6_port);
  r->listeners[index] = (listener_t){ .fd = fd, .in_use = 1, .gen = ++r->next_gen };
  err = r->backend->watch_listener(r, index);
  if (err < 0) {
    close(fd);
    r->listeners[index].in_use = 0;
    return int_value(env, err);
  }
  live_add(r, 1);
  napi_value result;
  napi_create_array_with_length(env, 2, &result);
  napi_set_element(env, result, 0, int_value(env, index));
  napi_set_element(env, result, 1, int_value(env, port));
  return result;
}

/* closeListener(listener) */
static napi_value js_close_listener (napi_env env, napi_callback_info info) {
  napi_value argv[1];
  reactor_t *r = args(env, info, 1, argv);
  int32_t index = int_arg(env, argv[0]);
  if (index < 0 || index >= MAX_LISTENERS || !r->listeners[index].in_use) return NULL;
  r->backend->unwatch_listener(r, index);
  close(r->listeners[index].fd);
  r->listeners[index].in_use = 0;
  live_add(r, -1);
  return NULL;
}

/* connect(host, port, keepAliveSecs) -> id | -errno; EV_CONNECTED follows. keepAliveSecs > 0: TCP keepalive, the first probe after that long idle. */
static napi_value js_connect (napi_env env, napi_callback_info info) {
  napi_value argv[3];
  reactor_t *r = args(env, info, 3, argv);
  struct sockaddr_storage addr;
  socklen_t len;
  int err = address_of(env, argv[0], int_arg(env, argv[1]), &addr, &len);
  if (err < 0) return int_value(env, err);
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return int_value(env, -errno);
  set_nodelay_nonblock(fd);
  int32_t idle = int_arg(env, argv[2]);
  if (idle > 0) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  }
  if (connect(fd, (struct sockaddr *)&addr, len) < 0 && errno != EINPROGRESS) {
    err = -errno;
    close(fd);
    return int_value(env, err);
  }
  int slot;
  conn_t *c = conn_new(r, fd, &slot);
  if (c == NULL) {
    close(fd);
    return int_value(env, -ENFILE);
  }
  c->connecting = 1;
  err = r->backend->add_conn(r, c);
  if (err < 0) {
    close(fd);
    conn_free(r, slot);
    live_add(r, -1);
    return int_value(env, err);
  }
  return int_value(env, conn_id(c, slot));
}

/* setReading(id, on) */
static napi_value js_set_reading (napi_env env, napi_callback_info info) {
  napi_value argv[2];
  reactor_t *r = args(env, info, 2, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  bool on = false;
  if (c == NULL || argv[1] == NULL || napi_get_value_bool(env, argv[1], &on) != napi_ok) return NULL;
  if (c->reading == (on ? 1u : 0u)) return NULL;
  c->reading = on ? 1 : 0;
  r->backend->set_reading(r, c);
  return NULL;
}

/* shutdown(id) -> 0 | 1 (io_uring: after the send in flight, then EV_WRITABLE) | -errno: FIN after what was sent. */
static napi_value js_shutdown (napi_env env, napi_callback_info info) {
  napi_value argv[1];
  reactor_t *r = args(env, info, 1, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  return int_value(env, c == NULL ? -EBADF : r->backend->shutdown(r, c));
}

/* close(id, reset): at once; with reset the peer gets an RST. */
static napi_value js_close (napi_env env, napi_callback_info info) {
  napi_value argv[2];
  reactor_t *r = args(env, info, 2, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  bool reset = false;
  if (c == NULL) return NULL;
  if (argv[1] != NULL) napi_get_value_bool(env, argv[1], &reset);
  if (reset) {
    struct linger hard = { .l_onoff = 1, .l_linger = 0 };
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  }
  c->closing = 1;
  r->backend->close_conn(r, c);
  live_add(r, -1);
  return NULL;
}

/* peer(id) -> [address, port] | null */
static napi_value js_peer (napi_env env, napi_callback_info info) {
  napi_value argv[1];
  reactor_t *r = args(env, info, 1, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  struct sockaddr_storage addr;
  socklen_t len = sizeof addr;
  char text[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (c == NULL || getpeername(c->fd, (struct sockaddr *)&addr, &len) < 0) return NULL;
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&addr)->sin_addr, text, sizeof text);
    port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&addr)->sin6_addr, text, sizeof text);
    port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
  }
  napi_value result, s;
  napi_create_array_with_length(env, 2, &result);
  napi_create_string_utf8(env, text, NAPI_AUTO_LENGTH, &s);
  napi_set_element(env, result, 0, s);
  napi_set_element(env, result, 1, int_value(env, port));
  return result;
}

/* queued(id) -> bytes taken from JS that the kernel has not taken yet */
static napi_value js_queued (napi_env env, napi_callback_info info) {
  napi_value argv[1];
  reactor_t *r = args(env, info, 1, argv);
  conn_t *c = conn_of(r, int_arg(env, argv[0]), NULL);
  return int_value(env, c == NULL ? 0 : (int64_t)r->backend->queued(r, c));
}

/* ---- open ---- */

static void bind_fn (napi_env env, napi_value obj, const char *name, napi_callback cb, reactor_t *r) {
  napi_value fn;
  napi_create_function(env, name, NAPI_AUTO_LENGTH, cb, r, &fn);
  napi_set_named_property(env, obj, name, fn);
}

static napi_value reactor_object (napi_env env, reactor_t *r) {
  napi_value obj, ab, events, send_args;
  napi_create_object(env, &obj);
  napi_create_external_arraybuffer(env, r->events, sizeof(int32_t) * 4 * MAX_EVENTS, NULL, NULL, &ab);
  napi_create_typedarray(env, napi_int32_array, 4 * MAX_EVENTS, ab, 0, &events);
  napi_set_named_property(env, obj, "events", events);
  napi_create_external_arraybuffer(env, r->send_args, sizeof r->send_args, NULL, NULL, &ab);
  napi_create_typedarray(env, napi_int32_array, 4, ab, 0, &send_args);
  napi_set_named_property(env, obj, "sendArgs", send_args);
  bind_fn(env, obj, "listen", js_listen, r);
  bind_fn(env, obj, "closeListener", js_close_listener, r);
  bind_fn(env, obj, "connect", js_connect, r);
  bind_fn(env, obj, "send", js_send, r);
  bind_fn(env, obj, "sendRange", js_send_range, r);
  bind_fn(env, obj, "sendv", js_sendv, r);
  bind_fn(env, obj, "setReading", js_set_reading, r);
  bind_fn(env, obj, "shutdown", js_shutdown, r);
  bind_fn(env, obj, "close", js_close, r);
  bind_fn(env, obj, "peer", js_peer, r);
  bind_fn(env, obj, "queued", js_queued, r);
  napi_create_reference(env, obj, 1, &r->self);
  return obj;
}

/*
 * open(backend, onTurn) -> reactor | -errno. The reactor lives as long as
 * the process (a thread opens each backend at most once: reactor.ts).
 */
static napi_value js_open (napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  char name[16] = "";
  size_t n;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 2 || napi_get_value_string_utf8(env, argv[0], name, sizeof name, &n) != napi_ok) return int_value(env, -EINVAL);
  const backend_t *backend = strcmp(name, "epoll") == 0 ? &epoll_backend : strcmp(name, "io_uring") == 0 ? &uring_backend : NULL;
  if (backend == NULL) return int_value(env, -EINVAL);
  reactor_t *r = calloc(1, sizeof *r);
  int32_t *events = malloc(sizeof(int32_t) * 4 * MAX_EVENTS);
  if (r == NULL || events == NULL) {
    free(r);
    free(events);
    return int_value(env, -ENOMEM);
  }
  r->backend = backend;
  r->env = env;
  r->events = events;
  int err = backend->start(r);
  uv_loop_t *loop = NULL;
  if (err == 0) err = napi_get_uv_event_loop(env, &loop) == napi_ok ? 0 : -EINVAL;
  if (err == 0) err = uv_poll_init(loop, &r->poll, r->poll_fd);
  if (err == 0) err = uv_poll_start(&r->poll, UV_READABLE, on_poll);
  if (err != 0) {
    /* A started backend whose poll handle failed: nothing references r, leak nothing but r's fds. */
    if (r->poll_fd > 0) backend->stop(r);
    free(events);
    free(r);
    return int_value(env, err);
  }
  r->poll.data = r;
  uv_unref((uv_handle_t *)&r->poll);
  napi_create_reference(env, argv[1], 1, &r->on_turn);
  return reactor_object(env, r);
}

static napi_value init (napi_env env, napi_value exports) {
  napi_value fn;
  napi_create_function(env, "open", NAPI_AUTO_LENGTH, js_open, NULL, &fn);
  napi_set_named_property(env, exports, "open", fn);
  heap_init(env, exports);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
