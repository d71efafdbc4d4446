/*
 * The epoll backend: one epoll set (level-triggered) under the reactor's
 * uv_poll_t, so libuv's epoll_wait wakes us and ours (timeout 0) says which
 * sockets are ready: a nested epoll set, one extra syscall per turn for any
 * number of sockets (libuv itself would keep one uv_poll_t per socket).
 *
 * Reads: one read per ready socket, again only while a read fills the room
 * it was given (more is waiting), as memcached does: no read that returns
 * EAGAIN after each request. Sends: sendmsg at once; what the kernel
 * refuses stays with JS, and only then is EPOLLOUT in the interest set.
 */
#define _GNU_SOURCE
#include "nyala.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_READY 256
#define MAX_ACCEPTS 64
#define MAX_READS 4
#define LISTENER_TAG (1ull << 40)

typedef struct {
  int epfd;
  struct epoll_event ready[MAX_READY];
} ep_t;

static ep_t *ep (reactor_t *r) { return r->impl; }

static int ep_start (reactor_t *r) {
  ep_t *e = calloc(1, sizeof *e);
  if (e == NULL) return -ENOMEM;
  e->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (e->epfd < 0) {
    int err = -errno;
    free(e);
    return err;
  }
  r->impl = e;
  r->poll_fd = e->epfd;
  return 0;
}

static void ep_stop (reactor_t *r) {
  close(ep(r)->epfd);
  free(r->impl);
  r->impl = NULL;
}

/* What the connection should be polled for now. */
static uint32_t interest (const conn_t *c) {
  uint32_t want = 0;
  if (c->reading && !c->eof && !c->hup) want |= EPOLLIN;
  if (c->want_write || c->connecting) want |= EPOLLOUT;
  return want;
}

/* Brings the epoll set in line with interest(): a syscall only when it changed (none: out of the set). */
static void update (reactor_t *r, conn_t *c, int slot) {
  uint32_t want = interest(c);
  if (want == c->events) return;
  struct epoll_event ev = { .events = want, .data.u64 = (uint64_t)slot };
  int op = c->events == 0 ? EPOLL_CTL_ADD : want == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
  if (epoll_ctl(ep(r)->epfd, op, c->fd, &ev) == 0 || op == EPOLL_CTL_DEL) c->events = want;
}

static int ep_watch_listener (reactor_t *r, int index) {
  struct epoll_event ev = { .events = EPOLLIN, .data.u64 = LISTENER_TAG | (uint64_t)index };
  return epoll_ctl(ep(r)->epfd, EPOLL_CTL_ADD, r->listeners[index].fd, &ev) < 0 ? -errno : 0;
}

static void ep_unwatch_listener (reactor_t *r, int index) {
  epoll_ctl(ep(r)->epfd, EPOLL_CTL_DEL, r->listeners[index].fd, NULL);
}

static int ep_add_conn (reactor_t *r, conn_t *c) {
  int slot = conn_slot(r, c);
  update(r, c, slot);
  return c->events == interest(c) ? 0 : -errno;
}

/* Accepts what is waiting, up to what the turn can report; out of descriptors stops the listener. */
static void accept_all (reactor_t *r, int index) {
  listener_t *l = &r->listeners[index];
  for (int i = 0; i < MAX_ACCEPTS && !turn_full(r); i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        ep_unwatch_listener(r, index);
        l->stopped = 1;
        note(r, index, EV_ACCEPT_ERROR, errno, 0);
      }
      return;
    }
    set_nodelay_nonblock(fd);
    int slot;
    conn_t *c = conn_new(r, fd, &slot);
    if (c == NULL) {
      close(fd);
      continue;
    }
    update(r, c, slot);
    note(r, conn_id(c, slot), EV_ACCEPT, index, 0);
  }
}

/* Reads while reads fill their room (at most MAX_READS); the end and errors are noted once. */
static void read_conn (reactor_t *r, conn_t *c, int slot) {
  for (int i = 0; i < MAX_READS; i++) {
    size_t room;
    char *into = read_room(r, MIN_READ_BYTES, &room);
    if (into == NULL) return; /* the turn is full: level-triggered, the socket is ready again next turn */
    ssize_t n = read(c->fd, into, room);
    if (n > 0) {
      note_read(r, slot, (size_t)n);
      if ((size_t)n < room) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c->eof = 1;
    if (n == 0) note(r, conn_id(c, slot), EV_EOF, 0, 0);
    else note(r, conn_id(c, slot), EV_ERROR, errno, 0);
    update(r, c, slot);
    return;
  }
}

/* An outbound connect finished (or failed). */
static void connected (reactor_t *r, conn_t *c, int slot) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
  c->connecting = 0;
  if (err != 0) c->eof = 1;
  update(r, c, slot);
  note(r, conn_id(c, slot), EV_CONNECTED, err, 0);
}

static void conn_ready (reactor_t *r, int slot, uint32_t events) {
  conn_t *c = r->conns[slot];
  if (c == NULL || c->closing) return;
  if (c->connecting) {
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) connected(r, c, slot);
    return;
  }
  if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && c->want_write) {
    c->want_write = 0;
    update(r, c, slot);
    note(r, conn_id(c, slot), EV_WRITABLE, 0, 0);
  }
  if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;
  if (c->reading && !c->eof) {
    read_conn(r, c, slot);
    return;
  }
  /* Hung up while JS does not read: out of the set (it would be reported every turn) until it reads again. */
  if (events & (EPOLLERR | EPOLLHUP)) {
    c->hup = 1;
    update(r, c, slot);
  }
}

static void ep_turn (reactor_t *r) {
  ep_t *e = ep(r);
  int n = epoll_wait(e->epfd, e->ready, MAX_READY, 0);
  /* Room for one socket's events (a writability, its reads, its end) before each; the rest is ready again next turn. */
  for (int i = 0; i < n && MAX_EVENTS - r->n_events >= MAX_READS + 2; i++) {
    uint64_t tag = e->ready[i].data.u64;
    if (tag & LISTENER_TAG) accept_all(r, (int)(tag & 0xff));
    else conn_ready(r, (int)tag, e->ready[i].events);
  }
}

static void ep_after_turn (reactor_t *r) { (void)r; }

static void ep_set_reading (reactor_t *r, conn_t *c) {
  /* Reading again after a hang-up seen while paused: back in the set, where the read reports it. */
  if (c->reading) c->hup = 0;
  update(r, c, conn_slot(r, c));
}

static ssize_t ep_send (reactor_t *r, conn_t *c, const struct iovec *iov, int iovcnt) {
  if (c->want_write || c->connecting) return 0;
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
  struct msghdr msg = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
  ssize_t n;
  do n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT); while (n < 0 && errno == EINTR);
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
  if (n < 0) n = 0;
  if ((size_t)n < total) {
    c->want_write = 1;
    update(r, c, conn_slot(r, c));
  }
  return n;
}

static int ep_shutdown (reactor_t *r, conn_t *c) {
  (void)r;
  return shutdown(c->fd, SHUT_WR) < 0 ? -errno : 0;
}

static void ep_close_conn (reactor_t *r, conn_t *c) {
  int slot = conn_slot(r, c);
  if (c->events != 0) epoll_ctl(ep(r)->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  conn_free(r, slot);
  /* A descriptor is free: a listener stopped at EMFILE accepts again. */
  listeners_resume(r);
}

static size_t ep_queued (reactor_t *r, conn_t *c) {
  (void)r; (void)c;
  return 0; /* what the kernel refused stays with JS */
}

const backend_t epoll_backend = {
  .name = "epoll",
  .start = ep_start,
  .stop = ep_stop,
  .turn = ep_turn,
  .after_turn = ep_after_turn,
  .watch_listener = ep_watch_listener,
  .unwatch_listener = ep_unwatch_listener,
  .add_conn = ep_add_conn,
  .set_reading = ep_set_reading,
  .send = ep_send,
  .shutdown = ep_shutdown,
  .close_conn = ep_close_conn,
  .queued = ep_queued
};
