/*
 * The connection table of a reactor: a slot per open connection, named to
 * JS by an id that carries the slot's generation, so an id of a closed
 * connection never reaches the connection that took its slot next.
 */
#define _GNU_SOURCE
#include "nyala.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>

int32_t conn_id (const conn_t *c, int slot) {
  return (int32_t)(((c->gen & GEN_MASK) << SLOT_BITS) | (uint32_t)slot);
}

/* The live connection JS names by `id`, or NULL (closed, or never was). */
conn_t *conn_of (reactor_t *r, int32_t id, int *slot) {
  if (id < 0) return NULL;
  int s = id & (MAX_CONNS - 1);
  conn_t *c = r->conns[s];
  if (c == NULL || c->closing || (c->gen & GEN_MASK) != ((uint32_t)id >> SLOT_BITS)) return NULL;
  if (slot != NULL) *slot = s;
  return c;
}

/* The loop stays alive while a listener or connection is open, as with node:net. */
void live_add (reactor_t *r, int delta) {
  r->live += delta;
  if (r->live > 0) uv_ref((uv_handle_t *)&r->poll);
  else uv_unref((uv_handle_t *)&r->poll);
}

/* A free slot for `fd` (it keeps the loop alive until JS closes it), or NULL when the table is full (the caller closes fd). */
conn_t *conn_new (reactor_t *r, int fd, int *slot) {
  for (int i = 0; i < MAX_CONNS; i++) {
    int s = (r->free_hint + i) & (MAX_CONNS - 1);
    if (r->conns[s] != NULL) continue;
    conn_t *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->fd = fd;
    c->slot = s;
    c->gen = ++r->next_gen;
    c->reading = 1;
    r->conns[s] = c;
    r->free_hint = s + 1;
    *slot = s;
    live_add(r, 1);
    return c;
  }
  return NULL;
}

void conn_free (reactor_t *r, int slot) {
  conn_t *c = r->conns[slot];
  if (c == NULL) return;
  free(c->send_buf);
  free(c);
  r->conns[slot] = NULL;
}

int set_nodelay_nonblock (int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 ? -errno : (fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? -errno : 0);
}
