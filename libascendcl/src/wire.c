/*
 * wire.c: framing and bounded-time socket I/O for the aclserver protocol (see wire.h).
 * Knows nothing about ACL semantics.
 */
#include "wire.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void put_be16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static void put_be32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (24 - 8 * i));
}

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static uint32_t get_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

size_t wire_encode(unsigned char *out, size_t cap, uint16_t op, uint32_t request_id, const int64_t *ints,
                   unsigned n_ints, const void *tail, size_t tail_len)
{
    if (n_ints > FLEXNPU_MAX_INTS)
        return 0;
    size_t total = 4 + FLEXNPU_HEADER_BYTES + 8 * (size_t)n_ints + tail_len;
    if (total > cap || total - 4 > UINT32_MAX)
        return 0;
    put_be32(out, (uint32_t)(total - 4));
    put_be16(out + 4, op);
    put_be16(out + 6, 0);
    put_be32(out + 8, request_id);
    out[12] = (unsigned char)n_ints;
    for (unsigned i = 0; i < n_ints; i++)
        put_be64(out + 13 + 8 * i, (uint64_t)ints[i]);
    if (tail_len)
        memcpy(out + 13 + 8 * (size_t)n_ints, tail, tail_len);
    return total;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for events; 0, -ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0)
                return -ETIMEDOUT;
            wait = left > 1000000 ? 1000000 : (int)left;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, wait);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return -errno;
    }
}

int wire_send_all(int fd, const void *buf, size_t len, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc)
                return rc;
            continue;
        }
        return n < 0 ? -errno : -EIO;
    }
    return 0;
}

static int reserve(struct wire_reader *r, size_t need)
{
    if (r->start && r->start == r->end)
        r->start = r->end = 0;
    if (r->cap - r->start >= need && r->end < r->cap)
        return 0;
    if (r->start) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (need <= r->cap && r->end < r->cap)
        return 0;
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < need || cap <= r->end)
        cap *= 2;
    unsigned char *nb = realloc(r->buf, cap);
    if (!nb)
        return -ENOMEM;
    r->buf = nb;
    r->cap = cap;
    return 0;
}

/* recv into the reader's free space, keeping any descriptors passed with the bytes. */
static ssize_t recv_with_fds(int fd, struct wire_reader *r)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = r->buf + r->end, .iov_len = r->cap - r->end};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t got = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got <= 0)
        return got;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int passed;
            memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
            if (r->nfds < WIRE_MAX_FDS)
                r->fds[r->nfds++] = passed;
            else
                close(passed); /* more than any reply passes: not ours to keep */
        }
    }
    return got;
}

int wire_take_fd(struct wire_reader *r)
{
    if (!r->nfds)
        return -1;
    int fd = r->fds[0];
    memmove(r->fds, r->fds + 1, (--r->nfds) * sizeof r->fds[0]);
    return fd;
}

int wire_read(int fd, struct wire_reader *r, struct wire_msg *msg, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        size_t avail = r->end - r->start;
        size_t need = 4;
        if (avail >= 4) {
            uint32_t length = get_be32(r->buf + r->start);
            if (length > FLEXNPU_REPLY_MAX_FRAME || length < FLEXNPU_HEADER_BYTES)
                return -EPROTO;
            need = 4 + (size_t)length;
            if (avail >= need) {
                const unsigned char *p = r->buf + r->start + 4;
                msg->op = (uint16_t)(p[0] << 8 | p[1]);
                msg->flags = (uint16_t)(p[2] << 8 | p[3]);
                msg->request_id = get_be32(p + 4);
                msg->n_ints = p[8];
                size_t body = FLEXNPU_HEADER_BYTES + 8 * (size_t)msg->n_ints;
                if (length < body)
                    return -EPROTO;
                for (unsigned i = 0; i < msg->n_ints; i++)
                    msg->ints[i] = (int64_t)get_be64(p + FLEXNPU_HEADER_BYTES + 8 * i);
                msg->tail = (const char *)p + body;
                msg->tail_len = length - body;
                r->start += need;
                return 0;
            }
        }
        int rc = reserve(r, need);
        if (rc)
            return rc;
        ssize_t got = recv_with_fds(fd, r);
        if (got > 0) {
            r->end += (size_t)got;
            continue;
        }
        if (got == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        rc = wait_fd(fd, POLLIN, deadline);
        if (rc)
            return rc;
    }
}

void wire_reader_free(struct wire_reader *r)
{
    free(r->buf);
    r->buf = NULL;
    r->cap = r->start = r->end = 0;
    while (r->nfds)
        close(r->fds[--r->nfds]);
}
