/*
 * A KRPC peer with TLS inside negotiation, written the way Kudu's C++ RPC
 * does it (client_negotiation.cc, server_negotiation.cc, tls_handshake.cc)
 * and independent of Node: OpenSSL on memory BIOs during the handshake,
 * each TLS_HANDSHAKE token being what SSL_do_handshake left in the write
 * BIO, then SSL_set_fd onto the socket; blocking I/O, one frame at a time.
 *
 *   kudu-tls-peer client HOST PORT [options]   a Kudu client with encryption
 *       required: NEGOTIATE, TLS, SASL PLAIN (or certificate), context, then
 *       one call nyala.demo.CalculatorService.Add(x=20, y=22); prints
 *       "result=42 tls=<version>|plain".
 *   kudu-tls-peer server PORT [options]        a Kudu server with encryption
 *       required, for one connection; answers Add, prints "user=<name> tls=...".
 *
 * Options: --cert F --key F (own certificate), --ca F (verify the peer with
 * it), --user NAME, --password PW, --tls12 (at most TLS 1.2), --loopback
 * (offer TLS_AUTHENTICATION_ONLY, as Kudu does on loopback unless
 * --rpc_encrypt_loopback_connections), --cert-authn (client: offer
 * CERTIFICATE authentication; server: require and verify the client
 * certificate), --pipeline (client: SASL_INITIATE, the connection context
 * and the call in one TLS write, before the server's SASL_SUCCESS). Exit 0 on success, 1 with a message on stderr otherwise.
 *
 * Build: cc -o kudu-tls-peer kudu-tls-peer.c -lssl -lcrypto
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void die (const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kudu-tls-peer: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  ERR_print_errors_fp(stderr);
  exit(1);
}

/* ---- protobuf, by hand ---- */

typedef struct { uint8_t *p; size_t n, cap; } buf_t;

static void put (buf_t *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}
static void put_varint (buf_t *b, uint64_t v) {
  uint8_t tmp[10];
  size_t n = 0;
  do { tmp[n] = (uint8_t)(v & 0x7f); v >>= 7; if (v) tmp[n] |= 0x80; n++; } while (v);
  put(b, tmp, n);
}
static void put_tag (buf_t *b, int field, int wire) { put_varint(b, ((uint64_t)field << 3) | wire); }
static void put_uint (buf_t *b, int field, uint64_t v) { put_tag(b, field, 0); put_varint(b, v); }
static void put_bytes (buf_t *b, int field, const void *data, size_t n) { put_tag(b, field, 2); put_varint(b, n); put(b, data, n); }

typedef struct { const uint8_t *p; size_t n, at; } reader_t;

static uint64_t get_varint (reader_t *r) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (r->at >= r->n) die("truncated varint");
    uint8_t byte = r->p[r->at++];
    v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return v;
  }
  die("bad varint");
  return 0;
}
/* Next field: returns 0 at the end; a length-delimited value is in data and len, a varint in value. */
static int next_field (reader_t *r, int *field, uint64_t *value, const uint8_t **data, size_t *len) {
  if (r->at >= r->n) return 0;
  uint64_t key = get_varint(r);
  *field = (int)(key >> 3);
  switch (key & 7) {
    case 0: *value = get_varint(r); break;
    case 2: *len = get_varint(r); if (r->at + *len > r->n) die("truncated field"); *data = r->p + r->at; r->at += *len; break;
    default: die("unexpected wire type %d", (int)(key & 7));
  }
  return 1;
}

/* ---- I/O: plain socket or TLS on it ---- */

typedef struct { int fd; SSL *ssl; buf_t *batch; } io_t;

static void io_write (io_t *io, const void *data, size_t n) {
  const uint8_t *p = data;
  if (io->batch) { put(io->batch, data, n); return; }
  while (n > 0) {
    int w = io->ssl ? SSL_write(io->ssl, p, (int)n) : (int)write(io->fd, p, n);
    if (w <= 0) die("write failed");
    p += w;
    n -= (size_t)w;
  }
}
static void io_read (io_t *io, void *data, size_t n) {
  uint8_t *p = data;
  while (n > 0) {
    int r = io->ssl ? SSL_read(io->ssl, p, (int)n) : (int)read(io->fd, p, n);
    if (r <= 0) die("connection closed while reading");
    p += r;
    n -= (size_t)r;
  }
}

/* A frame: 4-byte length, varint-prefixed header, varint-prefixed body. */
static void send_frame (io_t *io, buf_t *header, buf_t *body) {
  buf_t f = {0};
  put_varint(&f, header->n);
  put(&f, header->p, header->n);
  put_varint(&f, body->n);
  put(&f, body->p, body->n);
  uint32_t len = htonl((uint32_t)f.n);
  buf_t out = {0};
  put(&out, &len, 4);
  put(&out, f.p, f.n);
  io_write(io, out.p, out.n);
  free(f.p);
  free(out.p);
}
/* Reads one frame; *header and *body point into the returned buffer. */
static uint8_t *recv_frame (io_t *io, reader_t *header, reader_t *body) {
  uint32_t len;
  io_read(io, &len, 4);
  len = ntohl(len);
  if (len > 8 * 1024 * 1024) die("frame of %u bytes", len);
  uint8_t *f = malloc(len);
  io_read(io, f, len);
  reader_t r = { f, len, 0 };
  size_t hl = get_varint(&r);
  *header = (reader_t){ f + r.at, hl, 0 };
  r.at += hl;
  size_t bl = get_varint(&r);
  *body = (reader_t){ f + r.at, bl, 0 };
  return f;
}

#define NEGOTIATE_CALL_ID (-33)
#define CONTEXT_CALL_ID (-3)

typedef struct {
  int step;
  int features[8], nfeatures;
  int authn; /* the first authentication type named: 1 sasl, 3 certificate, 0 none */
  int authn_mask; /* every one named, as 1 << type */
  int has_plain;
  const uint8_t *token; size_t token_len;  /* token (3) */
  const uint8_t *tls; size_t tls_len; int has_tls;  /* tls_handshake (5) */
} negotiate_t;

static void parse_negotiate (reader_t *r, negotiate_t *m) {
  memset(m, 0, sizeof *m);
  int field; uint64_t v; const uint8_t *d; size_t l;
  while (next_field(r, &field, &v, &d, &l)) {
    if (field == 1 && m->nfeatures < 8) m->features[m->nfeatures++] = (int)v;
    else if (field == 2) m->step = (int)v;
    else if (field == 3) { m->token = d; m->token_len = l; }
    else if (field == 4) {
      reader_t mech = { d, l, 0 }; int f2; uint64_t v2; const uint8_t *d2; size_t l2;
      while (next_field(&mech, &f2, &v2, &d2, &l2)) if (f2 == 2 && l2 == 5 && memcmp(d2, "PLAIN", 5) == 0) m->has_plain = 1;
    } else if (field == 5) { m->tls = d; m->tls_len = l; m->has_tls = 1; }
    else if (field == 7) {
      reader_t t = { d, l, 0 }; int f2; uint64_t v2; const uint8_t *d2; size_t l2;
      if (next_field(&t, &f2, &v2, &d2, &l2)) { if (m->authn == 0) m->authn = f2; m->authn_mask |= 1 << f2; }
    }
  }
}
static int has_feature (negotiate_t *m, int f) { for (int i = 0; i < m->nfeatures; i++) if (m->features[i] == f) return 1; return 0; }

static void send_negotiate (io_t *io, int server, buf_t *body) {
  buf_t h = {0};
  /* RequestHeader.call_id is field 3, ResponseHeader.call_id field 1; int32 -33 as a 10-byte varint. */
  put_uint(&h, server ? 1 : 3, (uint64_t)(int64_t)NEGOTIATE_CALL_ID);
  send_frame(io, &h, body);
  free(h.p);
}
static void send_tls_token (io_t *io, int server, const uint8_t *token, size_t n) {
  buf_t b = {0};
  put_uint(&b, 2, 5);
  put_bytes(&b, 5, token, n);
  send_negotiate(io, server, &b);
  free(b.p);
}
static void send_error (io_t *io, int code, const char *message) {
  buf_t h = {0}, b = {0};
  put_uint(&h, 1, (uint64_t)(int64_t)NEGOTIATE_CALL_ID);
  put_uint(&h, 2, 1);
  put_bytes(&b, 1, message, strlen(message));
  put_uint(&b, 2, (uint64_t)code);
  send_frame(io, &h, &b);
  free(h.p);
  free(b.p);
}

/* Reads a negotiation frame from the peer; a server's error frame ends the run. */
static uint8_t *recv_negotiate (io_t *io, int from_server, negotiate_t *m) {
  reader_t h, b;
  uint8_t *f = recv_frame(io, &h, &b);
  int field; uint64_t v; const uint8_t *d; size_t l;
  int64_t call_id = 0; int is_error = 0;
  while (next_field(&h, &field, &v, &d, &l)) {
    if (field == (from_server ? 1 : 3)) call_id = (int64_t)v;
    if (from_server && field == 2) is_error = (int)v;
  }
  if (call_id != NEGOTIATE_CALL_ID) die("expected call id -33, got %lld", (long long)call_id);
  if (is_error) {
    char msg[512] = "";
    while (next_field(&b, &field, &v, &d, &l)) if (field == 1) snprintf(msg, sizeof msg, "%.*s", (int)l, d);
    die("server refused negotiation: %s", msg);
  }
  parse_negotiate(&b, m);
  return f;
}

/* ---- TLS on memory BIOs, as Kudu's TlsHandshake ---- */

typedef struct { SSL *ssl; BIO *rbio, *wbio; int server; } handshake_t;

/* Feeds the peer's token; returns 1 when done, 0 when incomplete; the answer in *out. */
static int tls_continue (handshake_t *hs, const uint8_t *in, size_t n, buf_t *out) {
  if (n > 0 && BIO_write(hs->rbio, in, (int)n) != (int)n) die("BIO_write");
  int rc = SSL_do_handshake(hs->ssl);
  if (rc != 1) {
    int e = SSL_get_error(hs->ssl, rc);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) die("TLS handshake error");
  }
  out->n = 0;
  int pending = BIO_ctrl_pending(hs->wbio);
  if (pending > 0) {
    uint8_t *tmp = malloc((size_t)pending);
    if (BIO_read(hs->wbio, tmp, pending) != pending) die("BIO_read");
    put(out, tmp, (size_t)pending);
    free(tmp);
  }
  return rc == 1;
}

static SSL_CTX *make_ctx (int server, const char *cert, const char *key, const char *ca, int tls12, int verify_peer) {
  SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!ctx) die("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (tls12) SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION);
  if (cert && SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) die("cannot load %s", cert);
  if (key && SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) die("cannot load %s", key);
  if (ca && SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) die("cannot load %s", ca);
  SSL_CTX_set_verify(ctx, verify_peer ? (SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0)) : SSL_VERIFY_NONE, NULL);
  return ctx;
}

static void handshake_init (handshake_t *hs, SSL_CTX *ctx, int server) {
  hs->ssl = SSL_new(ctx);
  hs->rbio = BIO_new(BIO_s_mem());
  hs->wbio = BIO_new(BIO_s_mem());
  SSL_set_bio(hs->ssl, hs->rbio, hs->wbio);
  hs->server = server;
  if (server) SSL_set_accept_state(hs->ssl); else SSL_set_connect_state(hs->ssl);
}

/* Kudu's Finish: the session moves onto the socket; `pending` (TLS 1.3 server) goes out raw first. */
static void handshake_finish (handshake_t *hs, io_t *io, buf_t *pending) {
  if (BIO_ctrl_pending(hs->rbio) != 0) die("unread TLS bytes at Finish");
  if (SSL_set_fd(hs->ssl, io->fd) != 1) die("SSL_set_fd");
  if (pending && pending->n > 0) { io_t raw = { io->fd, NULL }; io_write(&raw, pending->p, pending->n); }
  io->ssl = hs->ssl;
}

static const char *opt (int argc, char **argv, const char *name) {
  for (int i = 0; i < argc - 1; i++) if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return NULL;
}
static int flag (int argc, char **argv, const char *name) {
  for (int i = 0; i < argc; i++) if (strcmp(argv[i], name) == 0) return 1;
  return 0;
}

static int run_client (int argc, char **argv) {
  const char *host = argv[2], *port = argv[3];
  const char *cert = opt(argc, argv, "--cert"), *key = opt(argc, argv, "--key"), *ca = opt(argc, argv, "--ca");
  const char *user = opt(argc, argv, "--user") ? opt(argc, argv, "--user") : "kudu";
  const char *password = opt(argc, argv, "--password") ? opt(argc, argv, "--password") : "";
  int loopback = flag(argc, argv, "--loopback"), cert_authn = flag(argc, argv, "--cert-authn");
  struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
  if (getaddrinfo(host, port, &hints, &ai) != 0) die("cannot resolve %s", host);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) die("cannot connect to %s:%s", host, port);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  io_t io = { fd, NULL };
  io_write(&io, "hrpc\x09\x00\x00", 7);

  /* NEGOTIATE: APPLICATION_FEATURE_FLAGS, TLS (+ TLS_AUTHENTICATION_ONLY on loopback); SASL (+ certificate). */
  buf_t b = {0};
  put_uint(&b, 1, 1);
  put_uint(&b, 1, 2);
  if (loopback) put_uint(&b, 1, 3);
  put_uint(&b, 2, 1);
  put_bytes(&b, 7, "\x0a\x00", 2);
  if (cert_authn) put_bytes(&b, 7, "\x1a\x00", 2);
  send_negotiate(&io, 0, &b);
  b.n = 0;
  negotiate_t m;
  uint8_t *f = recv_negotiate(&io, 1, &m);
  if (m.step != 1) die("expected NEGOTIATE, got step %d", m.step);
  if (!has_feature(&m, 2)) die("server does not support required TLS encryption");
  int certificate = m.authn == 3;
  if (certificate && !cert_authn) die("server chose certificate authentication, but client has no certificate");
  if (!certificate && !m.has_plain) die("server offers no SASL PLAIN");
  int auth_only = loopback && has_feature(&m, 3);
  free(f);

  /* TLS: the first token is the answer to an empty one. With SASL the client verifies nothing (VERIFY_NONE) unless given a CA. */
  SSL_CTX *ctx = make_ctx(0, cert, key, ca, flag(argc, argv, "--tls12"), ca != NULL);
  handshake_t hs;
  handshake_init(&hs, ctx, 0);
  buf_t token = {0};
  int done = tls_continue(&hs, NULL, 0, &token);
  send_tls_token(&io, 0, token.p, token.n);
  while (!done) {
    f = recv_negotiate(&io, 1, &m);
    if (m.step != 5) die("expected TLS_HANDSHAKE step, got %d", m.step);
    done = tls_continue(&hs, m.tls, m.tls_len, &token);
    /* NeedsExtraStep (client): incomplete, or done with bytes to send. */
    if (!done || token.n > 0) send_tls_token(&io, 0, token.p, token.n);
    free(f);
  }
  const char *version = SSL_get_version(hs.ssl);
  if (!auth_only) handshake_finish(&hs, &io, NULL);

  /* --pipeline: the rest goes out in one write, SASL_SUCCESS read after the call is sent. */
  buf_t batch = {0};
  int pipeline = flag(argc, argv, "--pipeline");
  if (pipeline) io.batch = &batch;
  if (!certificate) {
    buf_t plain = {0};
    put(&plain, "\0", 1); put(&plain, user, strlen(user)); put(&plain, "\0", 1); put(&plain, password, strlen(password));
    put_uint(&b, 2, 2);
    put_bytes(&b, 3, plain.p, plain.n);
    put_bytes(&b, 4, "\x12\x05PLAIN", 7);
    send_negotiate(&io, 0, &b);
    b.n = 0;
    if (!pipeline) {
      f = recv_negotiate(&io, 1, &m);
      if (m.step != 0) die("expected SASL_SUCCESS, got step %d", m.step);
      free(f);
    }
  }
  /* ConnectionContextPB{DEPRECATED_user_info{real_user}} with call id -3, no answer. */
  buf_t h = {0}, info = {0};
  put_uint(&h, 3, (uint64_t)(int64_t)CONTEXT_CALL_ID);
  put_bytes(&info, 2, user, strlen(user));
  put_bytes(&b, 2, info.p, info.n);
  send_frame(&io, &h, &b);

  /* One call: Add(x=20, y=22). */
  h.n = 0; b.n = 0;
  buf_t remote = {0};
  const char *service = "nyala.demo.CalculatorService";
  put_bytes(&remote, 1, service, strlen(service));
  put_bytes(&remote, 2, "Add", 3);
  put_uint(&h, 3, 0);
  put_bytes(&h, 6, remote.p, remote.n);
  put_uint(&h, 10, 10000);
  put_uint(&b, 1, 20);
  put_uint(&b, 2, 22);
  send_frame(&io, &h, &b);
  if (pipeline) {
    io.batch = NULL;
    io_write(&io, batch.p, batch.n);
    if (!certificate) {
      f = recv_negotiate(&io, 1, &m);
      if (m.step != 0) die("expected SASL_SUCCESS, got step %d", m.step);
      free(f);
    }
  }
  reader_t rh, rb;
  f = recv_frame(&io, &rh, &rb);
  int field; uint64_t v; const uint8_t *d; size_t l;
  int is_error = 0;
  while (next_field(&rh, &field, &v, &d, &l)) if (field == 2) is_error = (int)v;
  if (is_error) die("the call failed");
  uint64_t result = 0;
  while (next_field(&rb, &field, &v, &d, &l)) if (field == 1) result = v;
  printf("result=%llu tls=%s\n", (unsigned long long)result, auth_only ? "plain" : version);
  return 0;
}

static int run_server (int argc, char **argv) {
  const char *cert = opt(argc, argv, "--cert"), *key = opt(argc, argv, "--key"), *ca = opt(argc, argv, "--ca");
  int loopback = flag(argc, argv, "--loopback"), cert_authn = flag(argc, argv, "--cert-authn");
  int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2])) };
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, 1) != 0) die("cannot listen");
  socklen_t alen = sizeof addr;
  getsockname(lfd, (struct sockaddr *)&addr, &alen);
  printf("listening on 127.0.0.1:%d\n", ntohs(addr.sin_port));
  fflush(stdout);
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  io_t io = { fd, NULL };
  uint8_t preamble[7];
  io_read(&io, preamble, 7);
  if (memcmp(preamble, "hrpc\x09\x00\x00", 7) != 0) die("bad preamble");

  negotiate_t m;
  uint8_t *f = recv_negotiate(&io, 0, &m);
  if (m.step != 1) die("expected NEGOTIATE");
  if (!has_feature(&m, 2)) { send_error(&io, 15, "Not authorized: client does not support required TLS encryption"); die("client offered no TLS"); }
  int certificate = cert_authn && (m.authn_mask & (1 << 3));
  if (cert_authn && !certificate) { send_error(&io, 15, "Not authorized: client offered no certificate authentication"); die("client offered no certificate"); }
  free(f);
  buf_t b = {0};
  put_uint(&b, 1, 1);
  put_uint(&b, 1, 2);
  if (loopback) put_uint(&b, 1, 3);
  put_uint(&b, 2, 1);
  if (certificate) put_bytes(&b, 7, "\x1a\x00", 2);
  else { put_bytes(&b, 4, "\x12\x05PLAIN", 7); put_bytes(&b, 7, "\x0a\x00", 2); }
  send_negotiate(&io, 1, &b);
  b.n = 0;
  int auth_only = loopback && has_feature(&m, 3);

  SSL_CTX *ctx = make_ctx(1, cert, key, ca, flag(argc, argv, "--tls12"), certificate);
  handshake_t hs;
  handshake_init(&hs, ctx, 1);
  buf_t token = {0}, pending = {0};
  for (int done = 0; !done;) {
    f = recv_negotiate(&io, 0, &m);
    if (m.step != 5) { send_error(&io, 15, "Not authorized: expected TLS_HANDSHAKE step"); die("expected TLS_HANDSHAKE"); }
    done = tls_continue(&hs, m.tls, m.tls_len, &token);
    free(f);
    /* NeedsExtraStep (server): incomplete; or done with bytes under TLS 1.2. TLS 1.3's last bytes are kept for Finish. */
    int tls13 = SSL_version(hs.ssl) == TLS1_3_VERSION;
    if (!done || (!tls13 && token.n > 0)) send_tls_token(&io, 1, token.p, token.n);
    else if (token.n > 0) { pending.n = 0; put(&pending, token.p, token.n); }
  }
  const char *version = SSL_get_version(hs.ssl);
  char user[256] = "";
  if (certificate) {
    X509 *peer = SSL_get1_peer_certificate(hs.ssl);
    if (!peer) die("no client certificate");
    X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, user, sizeof user);
    X509_free(peer);
  }
  if (!auth_only) handshake_finish(&hs, &io, &pending);

  if (!certificate) {
    f = recv_negotiate(&io, 0, &m);
    if (m.step != 2) die("expected SASL_INITIATE, got %d", m.step);
    /* PLAIN: authzid NUL authcid NUL passwd. */
    const uint8_t *nul = memchr(m.token, 0, m.token_len);
    if (!nul) die("bad PLAIN token");
    const uint8_t *nul2 = memchr(nul + 1, 0, m.token_len - (size_t)(nul + 1 - m.token));
    if (!nul2) die("bad PLAIN token");
    snprintf(user, sizeof user, "%.*s", (int)(nul2 - nul - 1), nul + 1);
    free(f);
    put_uint(&b, 2, 0);
    send_negotiate(&io, 1, &b);
    b.n = 0;
  }
  reader_t rh, rb;
  f = recv_frame(&io, &rh, &rb);
  int field; uint64_t v; const uint8_t *d; size_t l;
  int64_t call_id = 0;
  while (next_field(&rh, &field, &v, &d, &l)) if (field == 3) call_id = (int64_t)v;
  if (call_id != CONTEXT_CALL_ID) die("expected the connection context, got call id %lld", (long long)call_id);
  free(f);
  /* The call: answer Add with x + y. */
  f = recv_frame(&io, &rh, &rb);
  uint64_t x = 0, y = 0;
  call_id = -1;
  while (next_field(&rh, &field, &v, &d, &l)) if (field == 3) call_id = (int64_t)v;
  while (next_field(&rb, &field, &v, &d, &l)) { if (field == 1) x = v; if (field == 2) y = v; }
  free(f);
  buf_t h = {0};
  put_uint(&h, 1, (uint64_t)call_id);
  put_uint(&h, 2, 0);
  put_uint(&b, 1, x + y);
  send_frame(&io, &h, &b);
  printf("user=%s tls=%s\n", user, auth_only ? "plain" : version);
  fflush(stdout);
  if (io.ssl) SSL_shutdown(io.ssl);
  close(fd);
  return 0;
}

int main (int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "client") == 0) return run_client(argc, argv);
  if (argc >= 3 && strcmp(argv[1], "server") == 0) return run_server(argc, argv);
  fprintf(stderr, "usage: kudu-tls-peer client HOST PORT [options] | server PORT [options]\n");
  return 2;
}
