/*
 * The native transport's shared types: one reactor per `open()` (per
 * backend and thread), its connections and listeners, the slabs reads land
 * in, and the events of one turn that JS gets in one call.
 *
 * For a reader who knows libuv: the reactor is ONE uv_poll_t in Node's loop,
 * watching an epoll fd (epoll.c) or an io_uring ring fd (uring.c). When it
 * fires, the backend does every ready accept, read and write-completion,
 * notes them as events, and addon.c enters JS once with all of them. What
 * JS sends in that call goes straight to the kernel (epoll: one sendmsg per
 * connection) or into the ring (io_uring: one send SQE per connection,
 * submitted by one io_uring_enter at the end of the turn).
 */
#ifndef NYALA_H
#define NYALA_H

#include <node_api.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <uv.h>

/* Connection ids: slot in the low bits, a generation above (a stale id never names a new connection). */
#define SLOT_BITS 18
#define MAX_CONNS (1 << SLOT_BITS)
#define GEN_MASK 0x1fff
#define MAX_LISTENERS 64
/* The most buffers one sendv takes. */
#define MAX_IOV 1024

/* One turn's events (4 int32 each) and the slabs its reads landed in. */
#define MAX_EVENTS 4096
#define MAX_TURN_SLABS 32
/* Reads land in slabs of this size; a read asks for at most READ_BYTES and at least MIN_READ_BYTES of room. */
#define SLAB_BYTES (256 << 10)
#define READ_BYTES (64 << 10)
#define MIN_READ_BYTES (4 << 10)

/* Event kinds (events[4i + 1]). */
enum {
  EV_READ = 1,     /* id, READ | slab << 8, start, end: bytes in slabs[slab][start, end) */
  EV_ACCEPT = 2,   /* id, ACCEPT, listener, 0: a new connection */
  EV_EOF = 3,      /* id, EOF: the peer half-closed */
  EV_ERROR = 4,    /* id, ERROR, errno: the connection failed (JS closes it) */
  EV_WRITABLE = 5, /* id, WRITABLE: a refused send may go again */
  EV_CONNECTED = 6,/* id, CONNECTED, errno (0: connected) */
  EV_ACCEPT_ERROR = 7 /* listener, ACCEPT_ERROR, errno: out of descriptors; accepting resumes when a connection closes */
};

/*
 * A slab: freed when neither the reactor (filling it) nor any JS Buffer over it holds it.
 * One JS Buffer per slab, not per turn: V8 counts each Buffer's 256 KiB as external memory,
 * and a Buffer a turn (thousands a second) forced a full collection every few turns.
 */
typedef struct slab {
  int refs;
  size_t used;
  napi_ref js; /* its Buffer, held while the reactor fills the slab (later turns hand out the same one); NULL before the first */
  char data[SLAB_BYTES];
} slab_t;

typedef struct conn {
  int fd;
  int slot;
  uint32_t gen;
  unsigned reading : 1;     /* JS wants reads */
  unsigned eof : 1;         /* the peer's FIN (or an error) was read: no more reads */
  unsigned want_write : 1;  /* a send was refused: tell JS when it may send again */
  unsigned connecting : 1;  /* an outbound connect not finished */
  unsigned closing : 1;     /* JS closed it; the slot waits for the kernel's last completion */
  unsigned shut_pending : 1;/* half-close once the send in flight completed */
  unsigned hup : 1;         /* epoll: hung up while not reading; reported when reading resumes */
  uint32_t events;          /* epoll: the interest set */
  /* io_uring: what is in flight, and the bytes of the send in flight (a copy of JS's). */
  int ops;
  unsigned recv_armed : 1;
  unsigned recv_cancelled : 1;
  char *send_buf;
  size_t send_len;
  size_t send_off;
} conn_t;

typedef struct listener {
  int fd;
  int in_use;
  int stopped; /* out of descriptors: not accepting until a connection closes */
  uint32_t gen; /* io_uring: names this listener in its completions (its index is reused) */
  int armed;    /* io_uring: a multishot accept is in the ring */
} listener_t;

typedef struct reactor reactor_t;

/* What a backend does; addon.c owns everything else. Each returns 0 or -errno. */
typedef struct backend {
  const char *name;
  int (*start)(reactor_t *r);                 /* creates the fd the uv_poll_t watches (r->poll_fd) */
  void (*stop)(reactor_t *r);
  void (*turn)(reactor_t *r);                 /* the fd is readable: note this turn's events */
  void (*after_turn)(reactor_t *r);           /* JS returned: hand the kernel what it queued */
  int (*watch_listener)(reactor_t *r, int index);
  void (*unwatch_listener)(reactor_t *r, int index);
  int (*add_conn)(reactor_t *r, conn_t *c);   /* a new connection: read it (or wait for its connect) */
  void (*set_reading)(reactor_t *r, conn_t *c);
  ssize_t (*send)(reactor_t *r, conn_t *c, const struct iovec *iov, int iovcnt); /* bytes taken, or -errno */
  int (*shutdown)(reactor_t *r, conn_t *c);   /* FIN after what was sent */
  void (*close_conn)(reactor_t *r, conn_t *c);/* stops watching and closes; frees the slot now or when its ops end; listeners_resume once the fd is closed */
  size_t (*queued)(reactor_t *r, conn_t *c);  /* bytes taken from JS the kernel has not taken yet */
} backend_t;

struct reactor {
  const backend_t *backend;
  napi_env env;
  napi_ref on_turn;
  uv_poll_t poll;
  int poll_fd;
  int live; /* listeners and connections: the uv_poll_t keeps the loop alive while any */
  void *impl; /* the backend's own state */
  conn_t *conns[MAX_CONNS];
  uint32_t next_gen;
  int free_hint;
  listener_t listeners[MAX_LISTENERS];
  /* This turn. */
  int32_t *events;
  int n_events;
  slab_t *slab; /* being filled */
  slab_t *turn_slabs[MAX_TURN_SLABS];
  int n_turn_slabs;
  int in_turn;
  struct iovec iov[MAX_IOV]; /* sendv's, per reactor (worker threads have reactors of their own) */
  int32_t send_args[4];      /* sendRange's id, start, end and result: JS's sendArgs */
  napi_ref self;             /* the reactor object JS holds (reactor_object) */
  napi_ref source;           /* sendRange's Buffer, held until the next: its memory stays put */
  char *source_data;
  size_t source_length;
};

/* connections.c: the connection table. */
int32_t conn_id (const conn_t *c, int slot);
static inline int conn_slot (const reactor_t *r, const conn_t *c) { (void)r; return c->slot; }
conn_t *conn_new (reactor_t *r, int fd, int *slot);
conn_t *conn_of (reactor_t *r, int32_t id, int *slot);
void conn_free (reactor_t *r, int slot);
void live_add (reactor_t *r, int delta);
int set_nodelay_nonblock (int fd);

/* addon.c, for the backends. */
int turn_full (const reactor_t *r);
void note (reactor_t *r, int32_t a, int32_t kind, int32_t b, int32_t c);
char *read_room (reactor_t *r, size_t need, size_t *room);
int note_read (reactor_t *r, int slot, size_t n);
void listeners_resume (reactor_t *r);
void heap_init (napi_env env, napi_value exports); /* heap.c: trimHeap() */

/* addon.c's argument helpers: the reactor a function is bound to (argv[i] NULL past those given), an int32 argument (-1 if none), a number. */
reactor_t *args (napi_env env, napi_callback_info info, size_t want, napi_value *argv);
int32_t int_arg (napi_env env, napi_value v);
napi_value int_value (napi_env env, int64_t n);

/* send.c: send(id, buffer), sendRange([buffer]) through sendArgs, sendv(id, buffers). */
napi_value js_send (napi_env env, napi_callback_info info);
napi_value js_send_range (napi_env env, napi_callback_info info);
napi_value js_sendv (napi_env env, napi_callback_info info);

extern const backend_t epoll_backend;
extern const backend_t uring_backend;

#endif
