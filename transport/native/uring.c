/*
 * The io_uring backend: the ring's fd under the reactor's uv_poll_t (it is
 * readable while completions wait), multishot accept per listener,
 * multishot recv per connection into a ring of provided buffers, sends as
 * SQEs, and one io_uring_enter per turn (after JS returned; a uv_prepare_t
 * submits what JS queued outside a turn, from a timer say).
 *
 * Set up with IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER: the
 * kernel runs completions when this thread enters it anyway (libuv's
 * epoll_wait is woken for them). Not DEFER_TASKRUN: its completions run
 * only inside io_uring_enter, which a thread sleeping in epoll_wait never
 * calls (the loop would hang).
 *
 * Lifetimes: a provided buffer is copied into the reactor's slab and handed
 * back to the ring in the same turn (JS may keep views of what it read,
 * the ring must not rewrite it). A send's bytes are a copy of JS's, freed
 * when its completion comes (a small send's buffer goes back to the
 * reactor's spares: at most SPARE_COUNT of SPARE_BYTES, kept for the next
 * small sends instead of a malloc and a free per answer). A closed connection's fd is closed after the
 * turn's submit (an SQE queued for it must not find the number reused),
 * and its slot is freed once the kernel has completed every request on it.
 */
#define _GNU_SOURCE
#include "nyala.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RING_ENTRIES 2048
#define CQ_ENTRIES 16384
#define BUF_COUNT 256
#define BUF_BYTES (16 << 10)
#define BUF_GROUP 0
/* The most one send copies from JS; the rest waits for EV_WRITABLE. */
#define SEND_MAX (1 << 20)
/* Sends up to SPARE_BYTES copy into a buffer of that size, reused: at most SPARE_COUNT wait for the next. */
#define SPARE_BYTES 4096
#define SPARE_COUNT 64

enum { OP_ACCEPT = 1, OP_RECV, OP_SEND, OP_CANCEL, OP_CONNECT };

typedef struct {
  struct io_uring ring;
  struct io_uring_buf_ring *bufs_ring;
  char *bufs;
  int recycled; /* buffers handed back this turn, published by io_uring_buf_ring_advance */
  uv_prepare_t prepare;
  int *to_close; /* slots whose fds close after the next submit */
  int n_to_close;
  char *spares[SPARE_COUNT]; /* send buffers of SPARE_BYTES, free */
  int n_spares;
} ur_t;

static ur_t *ur (reactor_t *r) { return r->impl; }

static uint64_t tag (int op, int index, uint32_t gen) {
  return (uint64_t)op | ((uint64_t)(uint32_t)index << 8) | ((uint64_t)gen << 32);
}

/* An SQE, submitting what is queued when the ring is full; NULL only if the kernel takes nothing. */
static struct io_uring_sqe *sqe_of (reactor_t *r) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&ur(r)->ring);
  if (sqe == NULL) {
    io_uring_submit(&ur(r)->ring);
    sqe = io_uring_get_sqe(&ur(r)->ring);
  }
  return sqe;
}

static void cancel (reactor_t *r, uint64_t target) {
  struct io_uring_sqe *sqe = sqe_of(r);
  if (sqe == NULL) return;
  io_uring_prep_cancel64(sqe, target, 0);
  io_uring_sqe_set_data64(sqe, tag(OP_CANCEL, 0, 0));
}

/* One submit (one io_uring_enter), then the fds of connections closed since. */
static void flush (reactor_t *r) {
  ur_t *u = ur(r);
  if (u->recycled > 0) {
    io_uring_buf_ring_advance(u->bufs_ring, u->recycled);
    u->recycled = 0;
  }
  if (io_uring_sq_ready(&u->ring) > 0) io_uring_submit(&u->ring);
  int closed = u->n_to_close;
  for (int i = 0; i < u->n_to_close; i++) {
    conn_t *c = r->conns[u->to_close[i]];
    close(c->fd);
    c->fd = -1;
    if (c->ops == 0) conn_free(r, u->to_close[i]);
  }
  u->n_to_close = 0;
  /* Descriptors are free now (not when JS closed them): a listener stopped at EMFILE accepts again. */
  if (closed > 0) {
    listeners_resume(r);
    if (io_uring_sq_ready(&u->ring) > 0) io_uring_submit(&u->ring);
  }
}

static void on_prepare (uv_prepare_t *handle) {
  reactor_t *r = handle->data;
  if (io_uring_sq_ready(&ur(r)->ring) > 0 || ur(r)->n_to_close > 0 || ur(r)->recycled > 0) flush(r);
}

/* The ring of provided buffers multishot recvs pick from (liburing 2.3 has no io_uring_setup_buf_ring). */
static int buffers_start (ur_t *u) {
  size_t ring_bytes = BUF_COUNT * sizeof(struct io_uring_buf);
  if (posix_memalign((void **)&u->bufs_ring, 4096, ring_bytes) != 0) return -ENOMEM;
  u->bufs = malloc((size_t)BUF_COUNT * BUF_BYTES);
  if (u->bufs == NULL) return -ENOMEM;
  io_uring_buf_ring_init(u->bufs_ring);
  struct io_uring_buf_reg reg = { .ring_addr = (uint64_t)(uintptr_t)u->bufs_ring, .ring_entries = BUF_COUNT, .bgid = BUF_GROUP };
  int err = io_uring_register_buf_ring(&u->ring, &reg, 0);
  if (err < 0) return err;
  for (int i = 0; i < BUF_COUNT; i++) {
    io_uring_buf_ring_add(u->bufs_ring, u->bufs + (size_t)i * BUF_BYTES, BUF_BYTES, (unsigned short)i, io_uring_buf_ring_mask(BUF_COUNT), i);
  }
  io_uring_buf_ring_advance(u->bufs_ring, BUF_COUNT);
  return 0;
}

static void buffers_stop (ur_t *u) {
  free(u->bufs_ring);
  free(u->bufs);
}

/* Probes io_uring too: a kernel without it, seccomp or kernel.io_uring_disabled make it fail here. */
static int ur_start (reactor_t *r) {
  ur_t *u = calloc(1, sizeof *u);
  if (u == NULL) return -ENOMEM;
  u->to_close = malloc(sizeof(int) * MAX_CONNS);
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_CQSIZE;
  p.cq_entries = CQ_ENTRIES;
  int err = u->to_close == NULL ? -ENOMEM : io_uring_queue_init_params(RING_ENTRIES, &u->ring, &p);
  if (err < 0) {
    free(u->to_close);
    free(u);
    return err;
  }
  err = buffers_start(u);
  uv_loop_t *loop = NULL;
  if (err == 0) err = napi_get_uv_event_loop(r->env, &loop) == napi_ok ? 0 : -EINVAL;
  if (err == 0) err = uv_prepare_init(loop, &u->prepare);
  if (err < 0) {
    io_uring_queue_exit(&u->ring);
    buffers_stop(u);
    free(u->to_close);
    free(u);
    return err;
  }
  u->prepare.data = r;
  uv_prepare_start(&u->prepare, on_prepare);
  uv_unref((uv_handle_t *)&u->prepare);
  r->impl = u;
  r->poll_fd = u->ring.ring_fd;
  return 0;
}

static void ur_stop (reactor_t *r) {
  ur_t *u = ur(r);
  uv_close((uv_handle_t *)&u->prepare, NULL); /* u is never freed once started: the handle stays valid */
  io_uring_queue_exit(&u->ring);
  while (u->n_spares > 0) free(u->spares[--u->n_spares]);
}

static void arm_accept (reactor_t *r, int index) {
  listener_t *l = &r->listeners[index];
  struct io_uring_sqe *sqe = sqe_of(r);
  if (sqe == NULL) return;
  io_uring_prep_multishot_accept(sqe, l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  io_uring_sqe_set_data64(sqe, tag(OP_ACCEPT, index, l->gen));
  l->armed = 1;
}

static void arm_recv (reactor_t *r, conn_t *c) {
  struct io_uring_sqe *sqe = sqe_of(r);
  if (sqe == NULL) return;
  io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = BUF_GROUP;
  io_uring_sqe_set_data64(sqe, tag(OP_RECV, c->slot, c->gen));
  c->ops++;
  c->recv_armed = 1;
  c->recv_cancelled = 0;
}

static void prep_send (reactor_t *r, conn_t *c) {
  struct io_uring_sqe *sqe = sqe_of(r);
  if (sqe == NULL) return;
  io_uring_prep_send(sqe, c->fd, c->send_buf + c->send_off, c->send_len - c->send_off, MSG_NOSIGNAL);
  io_uring_sqe_set_data64(sqe, tag(OP_SEND, c->slot, c->gen));
  c->ops++;
}

static int ur_watch_listener (reactor_t *r, int index) {
  if (!r->listeners[index].armed) arm_accept(r, index);
  return r->listeners[index].armed ? 0 : -EBUSY;
}

/* Cancelled and submitted now: the caller closes the fd next, and no queued SQE may name it then. */
static void ur_unwatch_listener (reactor_t *r, int index) {
  listener_t *l = &r->listeners[index];
  if (l->armed) cancel(r, tag(OP_ACCEPT, index, l->gen));
  io_uring_submit(&ur(r)->ring);
}

static int ur_add_conn (reactor_t *r, conn_t *c) {
  if (!c->connecting) {
    arm_recv(r, c);
    return c->recv_armed ? 0 : -EBUSY;
  }
  struct io_uring_sqe *sqe = sqe_of(r);
  if (sqe == NULL) return -EBUSY;
  io_uring_prep_poll_add(sqe, c->fd, POLLOUT);
  io_uring_sqe_set_data64(sqe, tag(OP_CONNECT, c->slot, c->gen));
  c->ops++;
  return 0;
}

/* The connection a completion names, if it is still that one. */
static conn_t *conn_for (reactor_t *r, uint64_t data) {
  int slot = (int)((data >> 8) & 0xffffff);
  conn_t *c = slot < MAX_CONNS ? r->conns[slot] : NULL;
  return c != NULL && c->gen == (uint32_t)(data >> 32) ? c : NULL;
}

/* A request on `c` completed for good: the slot goes once a closed connection has none left. */
static void op_done (reactor_t *r, conn_t *c) {
  c->ops--;
  if (c->closing && c->ops == 0 && c->fd < 0) conn_free(r, c->slot);
}

static void on_accept (reactor_t *r, const struct io_uring_cqe *cqe) {
  int index = (int)((cqe->user_data >> 8) & 0xff);
  listener_t *l = &r->listeners[index];
  int ours = index < MAX_LISTENERS && l->in_use && l->gen == (uint32_t)(cqe->user_data >> 32);
  if (cqe->res >= 0) {
    int slot;
    conn_t *c = ours ? conn_new(r, cqe->res, &slot) : NULL;
    if (c == NULL) close(cqe->res);
    else {
      set_nodelay_nonblock(cqe->res);
      arm_recv(r, c);
      note(r, conn_id(c, slot), EV_ACCEPT, index, 0);
    }
  } else if (ours && (cqe->res == -EMFILE || cqe->res == -ENFILE || cqe->res == -ENOBUFS || cqe->res == -ENOMEM)) {
    l->stopped = 1;
    note(r, index, EV_ACCEPT_ERROR, -cqe->res, 0);
  }
  if (cqe->flags & IORING_CQE_F_MORE) {
    if (ours && l->stopped) cancel(r, cqe->user_data);
    return;
  }
  if (!ours) return;
  l->armed = 0;
  if (!l->stopped) arm_accept(r, index);
}

static void recycle (reactor_t *r, unsigned bid) {
  ur_t *u = ur(r);
  io_uring_buf_ring_add(u->bufs_ring, u->bufs + (size_t)bid * BUF_BYTES, BUF_BYTES, (unsigned short)bid, io_uring_buf_ring_mask(BUF_COUNT), u->recycled++);
}

/* Bytes, the end or an error on a connection's multishot recv. 0: the turn cannot take it (left in the ring for the next). */
static int on_recv (reactor_t *r, const struct io_uring_cqe *cqe) {
  conn_t *c = conn_for(r, cqe->user_data);
  int has_buf = (cqe->flags & IORING_CQE_F_BUFFER) != 0;
  unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
  if (c != NULL && !c->closing && cqe->res > 0 && has_buf) {
    size_t room;
    char *into = read_room(r, (size_t)cqe->res, &room);
    if (into == NULL) return 0;
    memcpy(into, ur(r)->bufs + (size_t)bid * BUF_BYTES, (size_t)cqe->res);
    note_read(r, c->slot, (size_t)cqe->res);
  } else if (c != NULL && !c->closing && !c->eof && cqe->res <= 0 && cqe->res != -ENOBUFS && cqe->res != -ECANCELED) {
    if (turn_full(r)) return 0;
    c->eof = 1;
    if (cqe->res == 0) note(r, conn_id(c, c->slot), EV_EOF, 0, 0);
    else note(r, conn_id(c, c->slot), EV_ERROR, -cqe->res, 0);
  }
  if (has_buf) recycle(r, bid);
  if (c == NULL || (cqe->flags & IORING_CQE_F_MORE)) return 1;
  /* The multishot recv ended (out of buffers, cancelled by a pause, the end): again if JS reads. */
  c->recv_armed = 0;
  if (c->reading && !c->eof && !c->closing) arm_recv(r, c);
  op_done(r, c);
  return 1;
}

static void on_send (reactor_t *r, const struct io_uring_cqe *cqe) {
  conn_t *c = conn_for(r, cqe->user_data);
  if (c == NULL) return;
  if (!c->closing) {
    if (cqe->res > 0) c->send_off += (size_t)cqe->res;
    if (cqe->res > 0 && c->send_off < c->send_len) {
      prep_send(r, c); /* a short send: the rest goes next */
      op_done(r, c);
      return;
    }
    if (c->shut_pending) shutdown(c->fd, SHUT_WR);
    /* JS hears of the end of a send it waits for: one it was refused behind, or a half-close behind it. */
    if (cqe->res <= 0 && !turn_full(r)) note(r, conn_id(c, c->slot), EV_ERROR, cqe->res == 0 ? EPIPE : -cqe->res, 0);
    else if ((c->want_write || c->shut_pending) && !turn_full(r)) note(r, conn_id(c, c->slot), EV_WRITABLE, 0, 0);
    c->want_write = 0;
    c->shut_pending = 0;
  }
  ur_t *u = ur(r);
  if (c->send_len <= SPARE_BYTES && u->n_spares < SPARE_COUNT) u->spares[u->n_spares++] = c->send_buf;
  else free(c->send_buf);
  c->send_buf = NULL;
  c->send_len = c->send_off = 0;
  op_done(r, c);
}

static void on_connect (reactor_t *r, const struct io_uring_cqe *cqe) {
  conn_t *c = conn_for(r, cqe->user_data);
  if (c == NULL) return;
  if (!c->closing) {
    int err = 0;
    socklen_t len = sizeof err;
    if (cqe->res < 0) err = -cqe->res;
    else if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    c->connecting = 0;
    if (err != 0) c->eof = 1;
    else if (c->reading) arm_recv(r, c);
    note(r, conn_id(c, c->slot), EV_CONNECTED, err, 0);
  }
  op_done(r, c);
}

/* Takes the completions the turn can report; the rest wait (the ring fd stays readable). */
static void ur_turn (reactor_t *r) {
  struct io_uring *ring = &ur(r)->ring;
  struct io_uring_cqe *cqe;
  unsigned head, seen = 0;
  io_uring_for_each_cqe(ring, head, cqe) {
    if (turn_full(r)) break;
    int op = (int)(cqe->user_data & 0xff);
    if (op == OP_RECV && !on_recv(r, cqe)) break;
    if (op == OP_ACCEPT) on_accept(r, cqe);
    else if (op == OP_SEND) on_send(r, cqe);
    else if (op == OP_CONNECT) on_connect(r, cqe);
    seen++;
  }
  io_uring_cq_advance(ring, seen);
}

static void ur_set_reading (reactor_t *r, conn_t *c) {
  if (c->reading && !c->recv_armed && !c->eof) arm_recv(r, c);
  else if (!c->reading && c->recv_armed && !c->recv_cancelled) {
    /* Completions already on their way still come (JS holds them until it reads again). */
    cancel(r, tag(OP_RECV, c->slot, c->gen));
    c->recv_cancelled = 1;
  }
}

/* One send in flight per connection: its bytes are copied, and a send behind it waits for EV_WRITABLE. */
static ssize_t ur_send (reactor_t *r, conn_t *c, const struct iovec *iov, int iovcnt) {
  if (c->send_buf != NULL || c->connecting) {
    c->want_write = 1;
    return 0;
  }
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
  size_t take = total < SEND_MAX ? total : SEND_MAX;
  if (take == 0) return 0;
  ur_t *u = ur(r);
  if (take > SPARE_BYTES) c->send_buf = malloc(take);
  else c->send_buf = u->n_spares > 0 ? u->spares[--u->n_spares] : malloc(SPARE_BYTES);
  if (c->send_buf == NULL) return -ENOMEM;
  size_t at = 0;
  for (int i = 0; i < iovcnt && at < take; i++) {
    size_t n = iov[i].iov_len < take - at ? iov[i].iov_len : take - at;
    memcpy(c->send_buf + at, iov[i].iov_base, n);
    at += n;
  }
  c->send_len = take;
  c->send_off = 0;
  prep_send(r, c);
  if (take < total) c->want_write = 1;
  return (ssize_t)take;
}

static int ur_shutdown (reactor_t *r, conn_t *c) {
  (void)r;
  if (c->send_buf != NULL) {
    c->shut_pending = 1;
    return 1; /* EV_WRITABLE says when it is done */
  }
  return shutdown(c->fd, SHUT_WR) < 0 ? -errno : 0;
}

static void ur_close_conn (reactor_t *r, conn_t *c) {
  if (c->recv_armed) cancel(r, tag(OP_RECV, c->slot, c->gen));
  if (c->send_buf != NULL || c->connecting) cancel(r, tag(c->connecting ? OP_CONNECT : OP_SEND, c->slot, c->gen));
  ur(r)->to_close[ur(r)->n_to_close++] = c->slot;
}

static size_t ur_queued (reactor_t *r, conn_t *c) {
  (void)r;
  return c->send_len - c->send_off;
}

static void ur_after_turn (reactor_t *r) {
  flush(r);
}

const backend_t uring_backend = {
  .name = "io_uring",
  .start = ur_start,
  .stop = ur_stop,
  .turn = ur_turn,
  .after_turn = ur_after_turn,
  .watch_listener = ur_watch_listener,
  .unwatch_listener = ur_unwatch_listener,
  .add_conn = ur_add_conn,
  .set_reading = ur_set_reading,
  .send = ur_send,
  .shutdown = ur_shutdown,
  .close_conn = ur_close_conn,
  .queued = ur_queued
};
