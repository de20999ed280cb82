/*
 * connection.c: the control link to the claim's aclserver (a unix socket or TCP), one request
 * and its reply at a time, and the mapping of the data-link region files the server names.
 *
 * Framing and bounded socket I/O are wire.c's; this file turns a failed exchange into an ACL code
 * with a message (a broken connection fails every later call until aclFinalize) and reports a
 * server that refused the connection with its own reason.
 */
#include "client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

void rpc_drop(void)
{
    if (session.fd >= 0)
        close(session.fd);
    session.fd = -1;
    wire_reader_free(&session.reader);
}

int rpc_broken(int err, const char *what)
{
    session.dead = 1;
    rpc_drop();
    const char *why = err == -ETIMEDOUT      ? "no reply in time (FLEXNPU_CONNECT_TIMEOUT_MS for aclInit, else FLEXNPU_CALL_TIMEOUT_MS)"
                      : err == -ECONNRESET || err == -EPIPE ? "the aclserver closed the connection"
                      : err == -EPROTO       ? "malformed frame from the aclserver"
                                             : strerror(-err);
    return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "aclserver connection (%s) of claim %s failed during %s: %s",
                        session.kind ? session.kind : "-", session.conf.claim_uid, what, why);
}

/* The server refused (a reply to op NONE) and closes the connection: record its reason, then
 * mark the connection broken without losing that message. */
static int refused(const struct wire_msg *m, int err, const char *what)
{
    int code = flexnpu_fail((int)m->ints[0], "%s: %.*s", what, (int)(m->tail_len > 900 ? 900 : m->tail_len),
                            m->tail);
    struct saved_error saved; /* the message is formatted: the reader's buffer may go */
    error_save(&saved);
    rpc_broken(err, what);
    error_restore(&saved);
    return code;
}

int rpc_send(uint16_t op, const int64_t *ints, unsigned n, const void *tail, size_t tail_len, uint32_t *rid,
             const char *what)
{
    size_t need = 4 + FLEXNPU_HEADER_BYTES + 8 * (size_t)n + tail_len;
    if (need > session.sendcap) {
        unsigned char *nb = realloc(session.sendbuf, need);
        if (!nb)
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
        session.sendbuf = nb;
        session.sendcap = need;
    }
    *rid = ++session.next_id;
    size_t len = wire_encode(session.sendbuf, session.sendcap, op, *rid, ints, n, tail, tail_len);
    int rc = wire_send_all(session.fd, session.sendbuf, len, session.call_timeout_ms);
    if (rc == -EPIPE || rc == -ECONNRESET) {
        /* the server may have refused the connection (too many connections) with a frame and
         * closed it before this request went out: report its reason, not only the broken pipe */
        struct wire_msg m;
        if (wire_read(session.fd, &session.reader, &m, 0) == 0 && m.op == OP_NONE && m.n_ints >= 1 && m.ints[0] != 0)
            return refused(&m, rc, what);
    }
    return rc ? rpc_broken(rc, what) : 0;
}

/* The reply to an abandoned wait, taken off the list (1), or not one (0). */
static int abandoned_take(uint32_t rid)
{
    for (unsigned i = 0; i < session.nabandoned; i++)
        if (session.abandoned[i] == rid) {
            session.abandoned[i] = session.abandoned[--session.nabandoned];
            return 1;
        }
    return 0;
}

/* rpc_receive; with timed_out, a timeout abandons rid instead of breaking the connection. */
static int receive(uint32_t rid, int64_t *out, unsigned nout, int timeout_ms, const char *what, struct wire_msg *keep,
                   int *timed_out)
{
    struct wire_msg local;
    struct wire_msg *m = keep ? keep : &local;
    int rc;
    do {
        rc = wire_read(session.fd, &session.reader, m, timeout_ms);
        if (rc == -ETIMEDOUT && timed_out && session.nabandoned < ABANDONED_MAX) {
            session.abandoned[session.nabandoned++] = rid;
            *timed_out = 1;
            return 0;
        }
        if (rc)
            return rpc_broken(rc, what);
    } while (m->request_id != rid && m->op != OP_NONE && (m->flags & FLEXNPU_FLAG_REPLY) &&
             abandoned_take(m->request_id)); /* a late reply to a wait that timed out: dropped */
    if (m->n_ints < 1 || !(m->flags & FLEXNPU_FLAG_REPLY) || (m->request_id != rid && m->op != OP_NONE))
        return rpc_broken(-EPROTO, what);
    if (m->ints[0] != 0) {
        if (m->op == OP_NONE) /* the server refused the connection itself and closes it */
            return refused(m, -EPROTO, what);
        return flexnpu_fail((int)m->ints[0], "%s: %.*s", what, (int)(m->tail_len > 900 ? 900 : m->tail_len),
                            m->tail);
    }
    if (m->n_ints - 1 < nout)
        return rpc_broken(-EPROTO, what);
    for (unsigned i = 0; i < nout; i++)
        out[i] = m->ints[1 + i];
    return 0;
}

int rpc_receive(uint32_t rid, int64_t *out, unsigned nout, int timeout_ms, const char *what, struct wire_msg *keep)
{
    return receive(rid, out, nout, timeout_ms, what, keep, NULL);
}

int rpc_wait_within(uint16_t op, const int64_t *ints, unsigned n, int timeout_ms, int *finished, const char *what)
{
    *finished = 0;
    if (timeout_ms >= 0 && session.nabandoned == ABANDONED_MAX)
        return flexnpu_fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                            "%s: %d earlier waits that timed out are still unanswered; wait without a timeout",
                            what, ABANDONED_MAX);
    uint32_t rid;
    int timed_out = 0;
    int rc = rpc_send(op, ints, n, NULL, 0, &rid, what);
    if (!rc)
        rc = receive(rid, NULL, 0, timeout_ms, what, NULL, timeout_ms >= 0 ? &timed_out : NULL);
    *finished = !rc && !timed_out;
    return rc;
}

int rpc_call(uint16_t op, const int64_t *ints, unsigned n, int64_t *out, unsigned nout, int timeout_ms,
             const char *what)
{
    uint32_t rid;
    int rc = rpc_send(op, ints, n, NULL, 0, &rid, what);
    return rc ? rc : rpc_receive(rid, out, nout, timeout_ms, what, NULL);
}

int rpc_connect_unix(const char *path, int timeout_ms, char *err, size_t err_len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, err_len, "unix: path too long");
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, err_len, "unix: %s", strerror(errno));
        return -1;
    }
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc && errno == EAGAIN) { /* backlog full: wait for room within the budget */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        rc = poll(&p, 1, timeout_ms) == 1 ? connect(fd, (struct sockaddr *)&sa, sizeof sa) : -1;
        if (rc && errno == 0)
            errno = ETIMEDOUT;
    }
    if (rc) {
        snprintf(err, err_len, "unix %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

int rpc_connect_tcp(const char *host, int port, int timeout_ms, char *err, size_t err_len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST},
                    *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai) {
        snprintf(err, err_len, "tcp %s:%d: %s", host, port, gai_strerror(gai));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, err_len, "tcp: %s", strerror(errno));
        freeaddrinfo(res);
        return -1;
    }
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int so_err = ETIMEDOUT;
        socklen_t l = sizeof so_err;
        if (poll(&p, 1, timeout_ms) == 1)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_err, &l);
        errno = so_err;
        rc = so_err ? -1 : 0;
    }
    if (rc) {
        snprintf(err, err_len, "tcp %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int rpc_map_region(const char *name, size_t name_len, size_t size, unsigned char **addr, int populate,
                   const char *what)
{
    if (name_len == 0 || name_len > 200 || memchr(name, '/', name_len) || memchr(name, '\0', name_len) ||
        name[0] == '.')
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the aclserver named an invalid region file", what);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%.*s", session.conf.shm_dir, (int)name_len, name) >= (int)sizeof path)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: region path too long", what);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: cannot open data-link region %s: %s", what, path,
                            strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < size) {
        close(fd);
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: data-link region %s is not a %zu-byte regular file",
                            what, path, size);
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: cannot map data-link region %s: %s", what, path, strerror(e));
    *addr = p;
    return 0;
}

int rpc_map_fd(int fd, size_t size, unsigned char **addr, int populate, const char *what)
{
    struct stat st;
    if (fd < 0)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the aclserver's reply passed no descriptor", what);
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < size) {
        close(fd);
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the passed region is not a %zu-byte memfd", what, size);
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: cannot map the passed region: %s", what, strerror(e));
    *addr = p;
    return 0;
}

int rpc_call_fd(uint16_t op, const int64_t *ints, unsigned n, int64_t *out, unsigned nout, int *fd, const char *what)
{
    uint32_t rid;
    *fd = -1;
    int rc = rpc_send(op, ints, n, NULL, 0, &rid, what);
    if (!rc)
        rc = rpc_receive(rid, out, nout, session.call_timeout_ms, what, NULL);
    if (!rc)
        *fd = wire_take_fd(&session.reader);
    return rc;
}

void rpc_close(void)
{
    if (session.fd < 0)
        return;
    shutdown(session.fd, SHUT_WR);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    char buf[4096];
    for (;;) {
        struct pollfd p = {.fd = session.fd, .events = POLLIN};
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = 5000 - ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
        if (left <= 0 || poll(&p, 1, (int)left) != 1)
            break;
        ssize_t n = recv(session.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            break;
    }
    rpc_drop();
}
