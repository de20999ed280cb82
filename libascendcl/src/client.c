/*
 * client.c: the ACL runtime API of FlexNPU's libascendcl.so, forwarded to the claim's aclserver.
 *
 * One connection per process, opened by aclInit from client.conf ($FLEXNPU_CONF, else
 * /etc/flexnpu/client.conf) and closed by aclFinalize. Every call holds one process-wide mutex
 * for its whole exchange, so threads may call concurrently. The current device and context are
 * per thread (as in ACL); the server has one current device per connection, so a call that
 * depends on it first re-selects the calling thread's device when another thread changed it.
 *
 * Data link (client/flexnpu_wire/datalink.py): aclrtMallocHost returns the address of a
 * shared-memory region the aclserver created, so aclrtMemcpy from or to it sends only offsets
 * (zero copy); any other host memory is copied through the connection's staging region in two
 * pipelined halves, exactly as the Python client does.
 *
 * fork: the child inherits neither the connection nor the session. Its calls fail with
 * ACL_ERROR_UNINITIALIZE and a message saying so until it calls aclInit itself (which opens its
 * own connection). Every socket and file descriptor is close-on-exec.
 *
 * Bounded waits: connecting and HELLO take at most FLEXNPU_CONNECT_TIMEOUT_MS (default 5000),
 * an ordinary reply at most FLEXNPU_CALL_TIMEOUT_MS (default 30000); calls that wait for queued
 * kernels (synchronize, destroy stream, finalize) wait as long as the server is connected.
 * A timed-out or broken connection fails every later call with ACL_ERROR_INTERNAL_ERROR until
 * aclFinalize.
 */
#include "client.h"

#include "acl/acl.h"
#include "acl/flexnpu_kernel.h"
#include "conf.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API ACL_FUNC_VISIBILITY
#define ERR_MAX 1024
#define MAX_DEVICES 1024
#define NO_DEVICE (-1)
#define WAIT_FOREVER (-1)
#define CTX_MAGIC 0x464E5043u   /* "FNPC" */
#define EVENT_MAGIC 0x464E5045u /* "FNPE" */
#define KERNEL_RESULT_BYTES 16

struct region {
    uint64_t wire; /* wire host pointer of offset 0 */
    unsigned char *addr;
    size_t size;
};

struct devalloc {
    uint64_t base, size;
};

struct context {
    uint32_t magic;
    int32_t device;
    uint64_t generation;
};

struct event {
    uint32_t magic;
    int recorded;
    struct timespec at;
};

static struct {
    pthread_mutex_t lock;
    int initialized;
    int fd;
    int dead; /* the connection broke: calls fail until aclFinalize */
    pid_t owner;
    pid_t forked_from; /* set in a child forked while its parent was initialized */
    uint32_t next_id;
    uint64_t generation; /* bumped by aclInit: stale thread-local devices and contexts are ignored */
    struct client_conf conf;
    const char *kind; /* "unix" or "tcp" */
    int device_count;
    int server_device;  /* the device last selected on the connection */
    int process_device; /* the device last set by any thread (for threads that set none) */
    struct wire_reader reader;
    unsigned char *sendbuf;
    size_t sendcap;
    struct region staging;
    struct region *hosts;
    size_t nhosts, caphosts;
    struct devalloc *allocs; /* sorted by base */
    size_t nallocs, capallocs;
    uint64_t *default_streams; /* per device, 0 = none yet */
    void **objects;            /* live contexts and events (handles are checked before use) */
    size_t nobjects, capobjects;
    int connect_timeout_ms, call_timeout_ms;
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
    .server_device = NO_DEVICE,
    .process_device = NO_DEVICE,
};

static _Thread_local char t_err[ERR_MAX];
static _Thread_local int t_has_err;
static _Thread_local int t_device = NO_DEVICE;
static _Thread_local uint64_t t_generation;
static _Thread_local struct context *t_context;

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* -- errors ------------------------------------------------------------------------------------ */

int flexnpu_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_err, sizeof t_err, fmt, ap);
    va_end(ap);
    t_has_err = 1;
    return code;
}

API const char *aclGetRecentErrMsg(void)
{
    return t_has_err ? t_err : NULL;
}

/* -- fork -------------------------------------------------------------------------------------- */

/* In the child: forget the parent's session without touching it. fork() does not wait for an ACL
 * call of another thread (that could be a long synchronize), so the child cannot trust the
 * state that call may have been changing: it closes only its copy of the socket, drops every
 * table without freeing it (a small leak in the child, never a double free), and starts with a
 * fresh mutex (the only thread of the child owns nothing). The staging region is not inherited
 * (MADV_DONTFORK); aclrtMallocHost buffers stay mapped, shared with the parent, as plain memory. */
static void forget_inherited(void)
{
    if (g.initialized || g.fd >= 0) {
        g.forked_from = g.owner;
        if (g.fd >= 0)
            close(g.fd);
        g.fd = -1;
        g.initialized = 0;
        g.dead = 0;
        memset(&g.reader, 0, sizeof g.reader);
        g.sendbuf = NULL;
        g.sendcap = 0;
        g.hosts = NULL;
        g.nhosts = g.caphosts = 0;
        g.allocs = NULL;
        g.nallocs = g.capallocs = 0;
        g.default_streams = NULL;
        g.objects = NULL;
        g.nobjects = g.capobjects = 0;
        memset(&g.staging, 0, sizeof g.staging);
        g.server_device = g.process_device = NO_DEVICE;
        g.generation++;
    }
    t_device = NO_DEVICE;
    t_context = NULL;
}

static void atfork_child(void)
{
    pthread_mutex_init(&g.lock, NULL);
    forget_inherited();
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

/* -- connection -------------------------------------------------------------------------------- */

static int env_ms(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n <= 0 || n > 86400000)
        return dflt;
    return (int)n;
}

static void drop_connection(void)
{
    if (g.fd >= 0)
        close(g.fd);
    g.fd = -1;
    wire_reader_free(&g.reader);
}

/* Mark the connection broken and return the error for the failed exchange. */
static int broken(int err, const char *what)
{
    g.dead = 1;
    drop_connection();
    const char *why = err == -ETIMEDOUT      ? "no reply in time (FLEXNPU_CONNECT_TIMEOUT_MS for aclInit, else FLEXNPU_CALL_TIMEOUT_MS)"
                      : err == -ECONNRESET || err == -EPIPE ? "the aclserver closed the connection"
                      : err == -EPROTO       ? "malformed frame from the aclserver"
                                             : strerror(-err);
    return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "aclserver connection (%s) of claim %s failed during %s: %s",
                        g.kind ? g.kind : "-", g.conf.claim_uid, what, why);
}

static int send_request(uint16_t op, const int64_t *ints, unsigned n, const void *tail, size_t tail_len,
                        uint32_t *rid, const char *what)
{
    size_t need = 4 + FLEXNPU_HEADER_BYTES + 8 * (size_t)n + tail_len;
    if (need > g.sendcap) {
        unsigned char *nb = realloc(g.sendbuf, need);
        if (!nb)
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
        g.sendbuf = nb;
        g.sendcap = need;
    }
    *rid = ++g.next_id;
    size_t len = wire_encode(g.sendbuf, g.sendcap, op, *rid, ints, n, tail, tail_len);
    int rc = wire_send_all(g.fd, g.sendbuf, len, g.call_timeout_ms);
    if (rc == -EPIPE || rc == -ECONNRESET) {
        /* the server may have refused the connection (too many connections) with a frame and
         * closed it before this request went out: report its reason, not only the broken pipe */
        struct wire_msg m;
        if (wire_read(g.fd, &g.reader, &m, 0) == 0 && m.op == OP_NONE && m.n_ints >= 1 && m.ints[0] != 0) {
            int code = flexnpu_fail((int)m.ints[0], "%s: %.*s", what, (int)(m.tail_len > 900 ? 900 : m.tail_len),
                                    m.tail);
            char saved[ERR_MAX];
            memcpy(saved, t_err, sizeof saved);
            broken(rc, what);
            memcpy(t_err, saved, sizeof saved);
            return code;
        }
    }
    return rc ? broken(rc, what) : 0;
}

/* Wait for the reply to rid; copy up to nout output values (after ret) to out. Returns the ACL
 * code of the reply (with its message recorded) or a connection error. */
static int receive_reply(uint32_t rid, int64_t *out, unsigned nout, int timeout_ms, const char *what,
                         struct wire_msg *keep)
{
    struct wire_msg local;
    struct wire_msg *m = keep ? keep : &local;
    int rc = wire_read(g.fd, &g.reader, m, timeout_ms);
    if (rc)
        return broken(rc, what);
    if (m->n_ints < 1 || !(m->flags & FLEXNPU_FLAG_REPLY) || (m->request_id != rid && m->op != OP_NONE))
        return broken(-EPROTO, what);
    if (m->ints[0] != 0) {
        int code = flexnpu_fail((int)m->ints[0], "%s: %.*s", what, (int)(m->tail_len > 900 ? 900 : m->tail_len),
                                m->tail);
        if (m->op == OP_NONE) { /* the server refused the connection itself and closes it */
            char saved[ERR_MAX];
            memcpy(saved, t_err, sizeof saved); /* the message is formatted: the reader's buffer may go */
            broken(-EPROTO, what);
            memcpy(t_err, saved, sizeof saved);
        }
        return code;
    }
    if (m->n_ints - 1 < nout)
        return broken(-EPROTO, what);
    for (unsigned i = 0; i < nout; i++)
        out[i] = m->ints[1 + i];
    return 0;
}

static int call(uint16_t op, const int64_t *ints, unsigned n, int64_t *out, unsigned nout, int timeout_ms,
                const char *what)
{
    uint32_t rid;
    int rc = send_request(op, ints, n, NULL, 0, &rid, what);
    return rc ? rc : receive_reply(rid, out, nout, timeout_ms, what, NULL);
}

static int connect_unix(const char *path, int timeout_ms, char *err, size_t err_len)
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

static int connect_tcp(const char *host, int port, int timeout_ms, char *err, size_t err_len)
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

/* A region file the aclserver created in the claim's shm dir: validate its name, open it without
 * following symlinks and map it shared. */
static int map_region(const char *name, size_t name_len, size_t size, unsigned char **addr, int populate,
                      const char *what)
{
    if (name_len == 0 || name_len > 200 || memchr(name, '/', name_len) || memchr(name, '\0', name_len) ||
        name[0] == '.')
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the aclserver named an invalid region file", what);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%.*s", g.conf.shm_dir, (int)name_len, name) >= (int)sizeof path)
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

static void forget_session(void)
{
    for (size_t i = 0; i < g.nhosts; i++)
        munmap(g.hosts[i].addr, g.hosts[i].size);
    free(g.hosts);
    g.hosts = NULL;
    g.nhosts = g.caphosts = 0;
    if (g.staging.addr)
        munmap(g.staging.addr, g.staging.size);
    memset(&g.staging, 0, sizeof g.staging);
    free(g.allocs);
    g.allocs = NULL;
    g.nallocs = g.capallocs = 0;
    free(g.default_streams);
    g.default_streams = NULL;
    for (size_t i = 0; i < g.nobjects; i++)
        free(g.objects[i]);
    free(g.objects);
    g.objects = NULL;
    g.nobjects = g.capobjects = 0;
    free(g.sendbuf);
    g.sendbuf = NULL;
    g.sendcap = 0;
    g.initialized = 0;
    g.dead = 0;
    g.server_device = g.process_device = NO_DEVICE;
    g.generation++;
}

/* Half-close and wait (bounded) until the server released the session and closed its side. */
static void close_connection(void)
{
    if (g.fd < 0)
        return;
    shutdown(g.fd, SHUT_WR);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    char buf[4096];
    for (;;) {
        struct pollfd p = {.fd = g.fd, .events = POLLIN};
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = 5000 - ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
        if (left <= 0 || poll(&p, 1, (int)left) != 1)
            break;
        ssize_t n = recv(g.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            break;
    }
    drop_connection();
}

/* -- state checks ------------------------------------------------------------------------------- */

static void ensure_fork_checked(void)
{
    pthread_once(&atfork_once, install_atfork);
    if ((g.initialized || g.fd >= 0) && getpid() != g.owner)
        forget_inherited(); /* forked without the atfork handler (a raw clone): the same treatment */
}

static int ready(const char *what)
{
    ensure_fork_checked();
    if (!g.initialized) {
        if (g.forked_from)
            return flexnpu_fail(ACL_ERROR_UNINITIALIZE,
                                "%s: this process (pid %d) was forked from pid %d after aclInit; the parent's "
                                "aclserver session is not shared with a child: call aclInit in this process",
                                what, (int)getpid(), (int)g.forked_from);
        return flexnpu_fail(ACL_ERROR_UNINITIALIZE, "%s: aclInit has not been called", what);
    }
    if (g.dead)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR,
                            "%s: the connection to the aclserver of claim %s was lost; call aclFinalize and "
                            "aclInit again",
                            what, g.conf.claim_uid);
    return 0;
}

static int thread_device(void)
{
    if (t_generation == g.generation && t_device != NO_DEVICE)
        return t_device;
    return g.process_device;
}

/* Select the calling thread's device on the connection (if it is not already). */
static int use_device(const char *what, int *device)
{
    int d = thread_device();
    if (d == NO_DEVICE)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "%s: no device is set; call aclrtSetDevice first", what);
    if (d != g.server_device) {
        int64_t arg = d;
        int rc = call(OP_SET_DEVICE, &arg, 1, NULL, 0, g.call_timeout_ms, what);
        if (rc)
            return rc;
        g.server_device = d;
    }
    if (device)
        *device = d;
    return 0;
}

#define LOCKED(expr)                                                                                             \
    do {                                                                                                         \
        pthread_mutex_lock(&g.lock);                                                                             \
        int rc_ = (expr);                                                                                        \
        pthread_mutex_unlock(&g.lock);                                                                           \
        return rc_;                                                                                              \
    } while (0)

/* -- object tables ------------------------------------------------------------------------------ */

static struct region *find_host(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < g.nhosts; i++)
        if (a >= (uintptr_t)g.hosts[i].addr && a - (uintptr_t)g.hosts[i].addr < g.hosts[i].size)
            return &g.hosts[i];
    return NULL;
}

static size_t alloc_index(uint64_t p)
{
    size_t lo = 0, hi = g.nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g.allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo; /* first index with base > p */
}

static int is_device_ptr(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    size_t i = alloc_index(a);
    return i > 0 && a - g.allocs[i - 1].base < g.allocs[i - 1].size;
}

static int add_alloc(uint64_t base, uint64_t size)
{
    if (g.nallocs == g.capallocs) {
        size_t cap = g.capallocs ? 2 * g.capallocs : 64;
        struct devalloc *na = realloc(g.allocs, cap * sizeof *na);
        if (!na)
            return -1;
        g.allocs = na;
        g.capallocs = cap;
    }
    size_t i = alloc_index(base);
    memmove(&g.allocs[i + 1], &g.allocs[i], (g.nallocs - i) * sizeof *g.allocs);
    g.allocs[i] = (struct devalloc){base, size};
    g.nallocs++;
    return 0;
}

static void remove_alloc(uint64_t base)
{
    size_t i = alloc_index(base);
    if (i > 0 && g.allocs[i - 1].base == base) {
        memmove(&g.allocs[i - 1], &g.allocs[i], (g.nallocs - i) * sizeof *g.allocs);
        g.nallocs--;
    }
}

static int add_object(void *obj)
{
    if (g.nobjects == g.capobjects) {
        size_t cap = g.capobjects ? 2 * g.capobjects : 16;
        void **no = realloc(g.objects, cap * sizeof *no);
        if (!no)
            return -1;
        g.objects = no;
        g.capobjects = cap;
    }
    g.objects[g.nobjects++] = obj;
    return 0;
}

static int has_object(const void *obj, uint32_t magic)
{
    if (!obj)
        return 0;
    for (size_t i = 0; i < g.nobjects; i++)
        if (g.objects[i] == obj)
            return *(const uint32_t *)obj == magic;
    return 0;
}

static void remove_object(void *obj)
{
    for (size_t i = 0; i < g.nobjects; i++)
        if (g.objects[i] == obj) {
            g.objects[i] = g.objects[--g.nobjects];
            free(obj);
            return;
        }
}

/* -- init / finalize ---------------------------------------------------------------------------- */

static int do_init(const char *config_path)
{
    ensure_fork_checked();
    if (g.initialized)
        return flexnpu_fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialized in this process");
    if (config_path && *config_path && access(config_path, R_OK) != 0)
        return flexnpu_fail(ACL_ERROR_INVALID_FILE, "aclInit: cannot read the ACL config %s: %s", config_path,
                            strerror(errno));
    const char *path = getenv("FLEXNPU_CONF");
    if (!path || !*path)
        path = FLEXNPU_DEFAULT_CONF;
    char err[ERR_MAX];
    int rc = conf_load(path, &g.conf, err, sizeof err);
    if (rc)
        return flexnpu_fail(rc, "aclInit: %s", err);
    g.connect_timeout_ms = env_ms("FLEXNPU_CONNECT_TIMEOUT_MS", 5000);
    g.call_timeout_ms = env_ms("FLEXNPU_CALL_TIMEOUT_MS", 30000);

    char errs[2][320] = {"", ""};
    int fd = -1;
    if (g.conf.unix_path[0]) {
        fd = connect_unix(g.conf.unix_path, g.connect_timeout_ms, errs[0], sizeof errs[0]);
        g.kind = "unix";
    }
    if (fd < 0 && g.conf.tcp_host[0]) {
        fd = connect_tcp(g.conf.tcp_host, g.conf.tcp_port, g.connect_timeout_ms, errs[1], sizeof errs[1]);
        g.kind = "tcp";
    }
    if (fd < 0)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "aclInit: no aclserver endpoint of claim %s answered (%s%s%s)",
                            g.conf.claim_uid, errs[0], errs[0][0] && errs[1][0] ? "; " : "", errs[1]);
    g.fd = fd;
    g.owner = getpid();
    g.forked_from = 0;
    g.dead = 0;

    int64_t hello[2] = {FLEXNPU_PROTOCOL_VERSION, (int64_t)getpid()};
    uint32_t rid;
    struct wire_msg m;
    rc = send_request(OP_HELLO, hello, 2, g.conf.token, strlen(g.conf.token), &rid, "aclInit (HELLO)");
    if (!rc)
        rc = receive_reply(rid, NULL, 0, g.connect_timeout_ms, "aclInit (HELLO)", &m);
    if (!rc && m.n_ints < 4)
        rc = broken(-EPROTO, "aclInit (HELLO)");
    if (rc) {
        if (!g.dead) { /* the server answered and refused: say whose server and why */
            char why[ERR_MAX];
            snprintf(why, sizeof why, "%s", t_err);
            flexnpu_fail(rc, "aclInit: the aclserver of claim %s refused the connection (%s)", g.conf.claim_uid,
                         why);
        }
        drop_connection();
        forget_session();
        return rc;
    }
    if (m.ints[2] < 1 || m.ints[2] > MAX_DEVICES || m.ints[3] < 2 || m.ints[3] > (int64_t)1 << 40) {
        drop_connection();
        forget_session();
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "aclInit: the aclserver's HELLO reply is out of range");
    }
    g.device_count = (int)m.ints[2];
    g.staging.size = (size_t)m.ints[3];
    g.staging.wire = wire_host_ptr(0, 0);
    /* the server pre-touched the staging pages: mapping them lazily costs only minor faults, and a
     * process that never stages a copy does not carry them in its RSS */
    rc = map_region(m.tail, m.tail_len, g.staging.size, &g.staging.addr, 0, "aclInit (staging region)");
    if (!rc)
        madvise(g.staging.addr, g.staging.size, MADV_DONTFORK); /* a child must never write into it */
    if (!rc) {
        g.default_streams = calloc((size_t)g.device_count, sizeof *g.default_streams);
        if (!g.default_streams)
            rc = flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclInit: out of host memory");
    }
    if (!rc)
        rc = call(OP_INIT, NULL, 0, NULL, 0, g.call_timeout_ms, "aclInit");
    if (rc) {
        close_connection();
        forget_session();
        return rc;
    }
    g.initialized = 1;
    g.generation++;
    return 0;
}

API aclError aclInit(const char *configPath)
{
    LOCKED(do_init(configPath));
}

static int do_finalize(void)
{
    ensure_fork_checked();
    if (!g.initialized) {
        if (g.forked_from)
            return flexnpu_fail(ACL_ERROR_REPEAT_FINALIZE,
                                "aclFinalize: this process (pid %d) was forked from pid %d and has not called "
                                "aclInit; the parent's session is untouched",
                                (int)getpid(), (int)g.forked_from);
        return flexnpu_fail(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: aclInit has not been called");
    }
    int rc = 0;
    if (!g.dead)
        rc = call(OP_FINALIZE, NULL, 0, NULL, 0, WAIT_FOREVER, "aclFinalize");
    close_connection();
    forget_session();
    return rc;
}

API aclError aclFinalize(void)
{
    LOCKED(do_finalize());
}

/* -- devices ------------------------------------------------------------------------------------ */

static int do_set_device(int32_t device)
{
    int rc = ready("aclrtSetDevice");
    if (rc)
        return rc;
    if (device < 0 || device >= g.device_count)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE,
                            "aclrtSetDevice: device %d does not exist (this claim has 0..%d)", device,
                            g.device_count - 1);
    int64_t arg = device;
    rc = call(OP_SET_DEVICE, &arg, 1, NULL, 0, g.call_timeout_ms, "aclrtSetDevice");
    if (rc)
        return rc;
    g.server_device = device;
    g.process_device = device;
    t_device = device;
    t_generation = g.generation;
    return 0;
}

API aclError aclrtSetDevice(int32_t deviceId)
{
    LOCKED(do_set_device(deviceId));
}

static int do_reset_device(int32_t device)
{
    int rc = ready("aclrtResetDevice");
    if (rc)
        return rc;
    int64_t arg = device;
    rc = call(OP_RESET_DEVICE, &arg, 1, NULL, 0, g.call_timeout_ms, "aclrtResetDevice");
    if (rc)
        return rc;
    g.server_device = NO_DEVICE;
    if (g.process_device == device)
        g.process_device = NO_DEVICE;
    if (t_device == device)
        t_device = NO_DEVICE;
    return 0;
}

API aclError aclrtResetDevice(int32_t deviceId)
{
    LOCKED(do_reset_device(deviceId));
}

static int do_get_device(int32_t *device)
{
    if (!device)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is NULL");
    int rc = ready("aclrtGetDevice");
    if (rc)
        return rc;
    int d = thread_device();
    if (d == NO_DEVICE)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "aclrtGetDevice: no device is set; call aclrtSetDevice first");
    *device = d;
    return 0;
}

API aclError aclrtGetDevice(int32_t *deviceId)
{
    LOCKED(do_get_device(deviceId));
}

static int do_get_device_count(uint32_t *count)
{
    if (!count)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is NULL");
    int rc = ready("aclrtGetDeviceCount");
    if (rc)
        return rc;
    int64_t n;
    rc = call(OP_GET_DEVICE_COUNT, NULL, 0, &n, 1, g.call_timeout_ms, "aclrtGetDeviceCount");
    if (rc)
        return rc;
    *count = (uint32_t)n;
    return 0;
}

API aclError aclrtGetDeviceCount(uint32_t *count)
{
    LOCKED(do_get_device_count(count));
}

API aclError aclrtGetRunMode(aclrtRunMode *runMode)
{
    if (!runMode)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is NULL");
    *runMode = ACL_HOST;
    return ACL_SUCCESS;
}

API const char *aclrtGetSocName(void)
{
    static char name[64];
    pthread_mutex_lock(&g.lock);
    const char *out = NULL;
    if (ready("aclrtGetSocName") == 0) {
        snprintf(name, sizeof name, "%s", g.conf.soc_name[0] ? g.conf.soc_name : "FlexNPU-vNPU");
        out = name;
    }
    pthread_mutex_unlock(&g.lock);
    return out;
}

static int do_synchronize_device(void)
{
    int rc = ready("aclrtSynchronizeDevice");
    if (!rc)
        rc = use_device("aclrtSynchronizeDevice", NULL);
    if (rc)
        return rc;
    return call(OP_SYNCHRONIZE_DEVICE, NULL, 0, NULL, 0, WAIT_FOREVER, "aclrtSynchronizeDevice");
}

API aclError aclrtSynchronizeDevice(void)
{
    LOCKED(do_synchronize_device());
}

/* -- contexts ----------------------------------------------------------------------------------- */

static int do_create_context(aclrtContext *context, int32_t device)
{
    if (!context)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context is NULL");
    int rc = ready("aclrtCreateContext");
    if (rc)
        return rc;
    if (device < 0 || device >= g.device_count)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE,
                            "aclrtCreateContext: device %d does not exist (this claim has 0..%d)", device,
                            g.device_count - 1);
    struct context *c = malloc(sizeof *c);
    if (!c || add_object(c)) {
        free(c);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclrtCreateContext: out of host memory");
    }
    *c = (struct context){CTX_MAGIC, device, g.generation};
    t_context = c;
    t_device = device;
    t_generation = g.generation;
    g.process_device = g.process_device == NO_DEVICE ? device : g.process_device;
    *context = c;
    return 0;
}

API aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId)
{
    LOCKED(do_create_context(context, deviceId));
}

static int do_destroy_context(aclrtContext context)
{
    int rc = ready("aclrtDestroyContext");
    if (rc)
        return rc;
    if (!has_object(context, CTX_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtDestroyContext: %p is not a context", context);
    if (t_context == context)
        t_context = NULL;
    remove_object(context);
    return 0;
}

API aclError aclrtDestroyContext(aclrtContext context)
{
    LOCKED(do_destroy_context(context));
}

static int do_set_current_context(aclrtContext context)
{
    int rc = ready("aclrtSetCurrentContext");
    if (rc)
        return rc;
    if (!has_object(context, CTX_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtSetCurrentContext: %p is not a context",
                            context);
    struct context *c = context;
    t_context = c;
    t_device = c->device;
    t_generation = g.generation;
    return 0;
}

API aclError aclrtSetCurrentContext(aclrtContext context)
{
    LOCKED(do_set_current_context(context));
}

static int do_get_current_context(aclrtContext *context)
{
    if (!context)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext: context is NULL");
    int rc = ready("aclrtGetCurrentContext");
    if (rc)
        return rc;
    if (!t_context || !has_object(t_context, CTX_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE,
                            "aclrtGetCurrentContext: this thread has no current context (aclrtCreateContext)");
    *context = t_context;
    return 0;
}

API aclError aclrtGetCurrentContext(aclrtContext *context)
{
    LOCKED(do_get_current_context(context));
}

/* -- streams ------------------------------------------------------------------------------------ */

static int do_create_stream(aclrtStream *stream)
{
    if (!stream)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream is NULL");
    int rc = ready("aclrtCreateStream");
    if (!rc)
        rc = use_device("aclrtCreateStream", NULL);
    if (rc)
        return rc;
    int64_t id;
    rc = call(OP_CREATE_STREAM, NULL, 0, &id, 1, g.call_timeout_ms, "aclrtCreateStream");
    if (!rc)
        *stream = (aclrtStream)(uintptr_t)id;
    return rc;
}

API aclError aclrtCreateStream(aclrtStream *stream)
{
    LOCKED(do_create_stream(stream));
}

/* The stream id to use for a NULL stream: the thread's device's default stream (created lazily). */
static int stream_id(aclrtStream stream, int64_t *id, const char *what)
{
    if (stream) {
        *id = (int64_t)(uintptr_t)stream;
        return 0;
    }
    int device;
    int rc = use_device(what, &device);
    if (rc)
        return rc;
    if (!g.default_streams[device]) {
        int64_t sid;
        rc = call(OP_CREATE_STREAM, NULL, 0, &sid, 1, g.call_timeout_ms, what);
        if (rc)
            return rc;
        g.default_streams[device] = (uint64_t)sid;
    }
    *id = (int64_t)g.default_streams[device];
    return 0;
}

static int do_destroy_stream(aclrtStream stream)
{
    int rc = ready("aclrtDestroyStream");
    if (rc)
        return rc;
    if (!stream)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: the default stream cannot be destroyed");
    int64_t id = (int64_t)(uintptr_t)stream;
    return call(OP_DESTROY_STREAM, &id, 1, NULL, 0, WAIT_FOREVER, "aclrtDestroyStream");
}

API aclError aclrtDestroyStream(aclrtStream stream)
{
    LOCKED(do_destroy_stream(stream));
}

static int sync_stream(aclrtStream stream, const char *what)
{
    int64_t id;
    int rc = stream_id(stream, &id, what);
    if (rc)
        return rc;
    return call(OP_SYNCHRONIZE_STREAM, &id, 1, NULL, 0, WAIT_FOREVER, what);
}

static int do_synchronize_stream(aclrtStream stream)
{
    int rc = ready("aclrtSynchronizeStream");
    return rc ? rc : sync_stream(stream, "aclrtSynchronizeStream");
}

API aclError aclrtSynchronizeStream(aclrtStream stream)
{
    LOCKED(do_synchronize_stream(stream));
}

/* -- events ------------------------------------------------------------------------------------- */

static int do_create_event(aclrtEvent *event)
{
    if (!event)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent: event is NULL");
    int rc = ready("aclrtCreateEvent");
    if (rc)
        return rc;
    struct event *e = calloc(1, sizeof *e);
    if (!e || add_object(e)) {
        free(e);
        return flexnpu_fail(ACL_ERROR_RT_NO_EVENT_RESOURCE, "aclrtCreateEvent: out of host memory");
    }
    e->magic = EVENT_MAGIC;
    *event = e;
    return 0;
}

API aclError aclrtCreateEvent(aclrtEvent *event)
{
    LOCKED(do_create_event(event));
}

static int do_destroy_event(aclrtEvent event)
{
    int rc = ready("aclrtDestroyEvent");
    if (rc)
        return rc;
    if (!has_object(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtDestroyEvent: %p is not an event", event);
    remove_object(event);
    return 0;
}

API aclError aclrtDestroyEvent(aclrtEvent event)
{
    LOCKED(do_destroy_event(event));
}

static int do_record_event(aclrtEvent event, aclrtStream stream)
{
    int rc = ready("aclrtRecordEvent");
    if (rc)
        return rc;
    if (!has_object(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtRecordEvent: %p is not an event", event);
    rc = sync_stream(stream, "aclrtRecordEvent");
    if (rc)
        return rc;
    struct event *e = event;
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    e->recorded = 1;
    return 0;
}

API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    LOCKED(do_record_event(event, stream));
}

static int do_synchronize_event(aclrtEvent event)
{
    int rc = ready("aclrtSynchronizeEvent");
    if (rc)
        return rc;
    if (!has_object(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtSynchronizeEvent: %p is not an event", event);
    return 0; /* recording waited for the stream: a recorded event is complete */
}

API aclError aclrtSynchronizeEvent(aclrtEvent event)
{
    LOCKED(do_synchronize_event(event));
}

static int do_elapsed(float *ms, aclrtEvent start, aclrtEvent end)
{
    if (!ms)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms is NULL");
    int rc = ready("aclrtEventElapsedTime");
    if (rc)
        return rc;
    if (!has_object(start, EVENT_MAGIC) || !has_object(end, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtEventElapsedTime: an argument is not an event");
    struct event *a = start, *b = end;
    if (!a->recorded || !b->recorded)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: both events must be recorded first");
    *ms = (float)((double)(b->at.tv_sec - a->at.tv_sec) * 1e3 + (double)(b->at.tv_nsec - a->at.tv_nsec) / 1e6);
    return 0;
}

API aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)
{
    LOCKED(do_elapsed(ms, startEvent, endEvent));
}

static int do_event_query(aclrtEvent event, int *recorded, const char *what)
{
    int rc = ready(what);
    if (rc)
        return rc;
    if (!has_object(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "%s: %p is not an event", what, event);
    if (recorded)
        *recorded = ((struct event *)event)->recorded;
    return 0;
}

API aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    (void)flag; /* every event records a timestamp and synchronizes */
    LOCKED(do_create_event(event));
}

static int do_query_event(aclrtEvent event, aclrtEventStatus *status)
{
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEvent: status is NULL");
    int rc = do_event_query(event, NULL, "aclrtQueryEvent");
    if (!rc)
        *status = ACL_EVENT_STATUS_COMPLETE; /* recording waited for the stream */
    return rc;
}

API aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status)
{
    LOCKED(do_query_event(event, status));
}

static int do_query_event_status(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status is NULL");
    int recorded = 0;
    int rc = do_event_query(event, &recorded, "aclrtQueryEventStatus");
    if (!rc)
        *status = recorded ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return rc;
}

API aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    LOCKED(do_query_event_status(event, status));
}

static int do_reset_event(aclrtEvent event)
{
    int rc = do_event_query(event, NULL, "aclrtResetEvent");
    if (!rc)
        ((struct event *)event)->recorded = 0;
    return rc;
}

API aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream)
{
    (void)stream;
    LOCKED(do_reset_event(event));
}

API aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout)
{
    (void)timeout; /* a recorded event is complete */
    LOCKED(do_event_query(event, NULL, "aclrtSynchronizeEventWithTimeout"));
}

API aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)
{
    (void)stream;
    LOCKED(do_event_query(event, NULL, "aclrtStreamWaitEvent"));
}

/* -- memory ------------------------------------------------------------------------------------- */

static int do_malloc(void **dev, size_t size, int policy, const char *what)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", what);
    if (size == 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: size must be positive", what);
    if (size > (size_t)INT64_MAX - 64)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: size %zu overflows", what, size);
    int rc = ready(what);
    if (!rc)
        rc = use_device(what, NULL);
    if (rc)
        return rc;
    /* the memory-type flags select a kind of memory a share does not distinguish */
    policy &= ~(ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH);
    int64_t args[2] = {(int64_t)size, policy}, ptr;
    rc = call(OP_MALLOC, args, 2, &ptr, 1, g.call_timeout_ms, what);
    if (rc)
        return rc;
    if (add_alloc((uint64_t)ptr, size)) {
        int64_t p = ptr;
        call(OP_FREE, &p, 1, NULL, 0, g.call_timeout_ms, what);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    *dev = (void *)(uintptr_t)ptr;
    return 0;
}

API aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    LOCKED(do_malloc(devPtr, size, (int)policy, "aclrtMalloc"));
}

API aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    LOCKED(do_malloc(devPtr, size, (int)policy, "aclrtMallocAlign32"));
}

API aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    LOCKED(do_malloc(devPtr, size, (int)policy, "aclrtMallocCached"));
}

static int do_mem_sync(void *dev, size_t size, const char *what)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", what);
    int rc = ready(what);
    if (rc)
        return rc;
    if (size && (!is_device_ptr(dev) || !is_device_ptr((char *)dev + size - 1)))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu bytes at %p are not device memory of this process",
                            what, size, dev);
    return 0; /* no cache between the client and the device memory of a share */
}

API aclError aclrtMemFlush(void *devPtr, size_t size)
{
    LOCKED(do_mem_sync(devPtr, size, "aclrtMemFlush"));
}

API aclError aclrtMemInvalidate(void *devPtr, size_t size)
{
    LOCKED(do_mem_sync(devPtr, size, "aclrtMemInvalidate"));
}

static int do_free(void *dev)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: devPtr is NULL");
    int rc = ready("aclrtFree");
    if (rc)
        return rc;
    int64_t p = (int64_t)(uintptr_t)dev;
    rc = call(OP_FREE, &p, 1, NULL, 0, g.call_timeout_ms, "aclrtFree");
    if (!rc)
        remove_alloc((uint64_t)p);
    return rc;
}

API aclError aclrtFree(void *devPtr)
{
    LOCKED(do_free(devPtr));
}

static int do_malloc_host(void **host, size_t size)
{
    if (!host)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is NULL");
    if (size == 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size must be positive");
    if (size > (size_t)INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size %zu overflows", size);
    int rc = ready("aclrtMallocHost");
    if (rc)
        return rc;
    if (g.nhosts == g.caphosts) {
        size_t cap = g.caphosts ? 2 * g.caphosts : 16;
        struct region *nh = realloc(g.hosts, cap * sizeof *nh);
        if (!nh)
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclrtMallocHost: out of host memory");
        g.hosts = nh;
        g.caphosts = cap;
    }
    int64_t arg = (int64_t)size;
    uint32_t rid;
    struct wire_msg m;
    rc = send_request(OP_MALLOC_HOST, &arg, 1, NULL, 0, &rid, "aclrtMallocHost");
    if (!rc)
        rc = receive_reply(rid, NULL, 0, g.call_timeout_ms, "aclrtMallocHost", &m);
    if (rc)
        return rc;
    if (m.n_ints < 3 || m.ints[2] < (int64_t)size)
        return broken(-EPROTO, "aclrtMallocHost");
    struct region r = {.wire = (uint64_t)m.ints[1], .size = (size_t)m.ints[2]};
    rc = map_region(m.tail, m.tail_len, r.size, &r.addr, 1, "aclrtMallocHost");
    if (rc) {
        int64_t p = (int64_t)r.wire;
        char keep[ERR_MAX];
        memcpy(keep, t_err, sizeof keep);
        call(OP_FREE_HOST, &p, 1, NULL, 0, g.call_timeout_ms, "aclrtMallocHost");
        memcpy(t_err, keep, sizeof keep);
        return rc;
    }
    g.hosts[g.nhosts++] = r;
    *host = r.addr;
    return 0;
}

API aclError aclrtMallocHost(void **hostPtr, size_t size)
{
    LOCKED(do_malloc_host(hostPtr, size));
}

static int do_free_host(void *host)
{
    if (!host)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is NULL");
    int rc = ready("aclrtFreeHost");
    if (rc)
        return rc;
    struct region *r = find_host(host);
    if (!r || r->addr != host)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: %p is not a buffer from aclrtMallocHost", host);
    int64_t p = (int64_t)r->wire;
    rc = call(OP_FREE_HOST, &p, 1, NULL, 0, g.call_timeout_ms, "aclrtFreeHost");
    if (rc)
        return rc;
    munmap(r->addr, r->size);
    *r = g.hosts[--g.nhosts];
    return 0;
}

API aclError aclrtFreeHost(void *hostPtr)
{
    LOCKED(do_free_host(hostPtr));
}

static int do_memset(void *dev, size_t max, int32_t value, size_t count)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: devPtr is NULL");
    if (count > max)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: count %zu exceeds maxCount %zu", count, max);
    if (max > (size_t)INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: maxCount %zu overflows", max);
    int rc = ready("aclrtMemset");
    if (rc)
        return rc;
    struct region *r = find_host(dev);
    if (r) {
        if ((size_t)((unsigned char *)dev - r->addr) + count > r->size)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: %zu bytes at %p run past the host buffer",
                                count, dev);
        memset(dev, value, count);
        return 0;
    }
    int64_t args[4] = {(int64_t)(uintptr_t)dev, (int64_t)max, value, (int64_t)count};
    return call(OP_MEMSET, args, 4, NULL, 0, g.call_timeout_ms, "aclrtMemset");
}

API aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    LOCKED(do_memset(devPtr, maxCount, value, count));
}

static int do_memset_async(void *dev, size_t max, int32_t value, size_t count, aclrtStream stream)
{
    int rc = ready("aclrtMemsetAsync");
    if (rc)
        return rc;
    rc = sync_stream(stream, "aclrtMemsetAsync"); /* in stream order, complete on return */
    return rc ? rc : do_memset(dev, max, value, count);
}

API aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream)
{
    LOCKED(do_memset_async(devPtr, maxCount, value, count, stream));
}

/* Copy count plain host bytes at src to device dst through the staging halves, pipelined: the
 * client fills one half while the server drains the other (dra_driver/client/session.py). */
static int staged_in(uint64_t dst, const unsigned char *src, size_t count, int kind, const char *what)
{
    size_t half = g.staging.size / 2;
    uint32_t pending = 0;
    int have_pending = 0;
    size_t done = 0;
    for (unsigned k = 0;; k++) {
        size_t n = count - done < half ? count - done : half;
        size_t off = (k % 2) * half;
        memcpy(g.staging.addr + off, src + done, n);
        int64_t args[6] = {(int64_t)(dst + done), (int64_t)(count - done), (int64_t)wire_host_ptr(0, off),
                           (int64_t)n, kind, (int64_t)(count - done)};
        uint32_t rid;
        int rc = send_request(OP_MEMCPY, args, 6, NULL, 0, &rid, what);
        if (rc)
            return rc;
        if (have_pending) {
            rc = receive_reply(pending, NULL, 0, g.call_timeout_ms, what, NULL);
            if (rc) {
                if (!g.dead) {
                    char keep[ERR_MAX];
                    memcpy(keep, t_err, sizeof keep);
                    receive_reply(rid, NULL, 0, g.call_timeout_ms, what, NULL);
                    memcpy(t_err, keep, sizeof keep);
                }
                return rc;
            }
        }
        pending = rid;
        have_pending = 1;
        done += n;
        if (done >= count)
            break;
    }
    return receive_reply(pending, NULL, 0, g.call_timeout_ms, what, NULL);
}

/* Copy count bytes from device src into plain host memory dst through the staging halves: the
 * server fills one half while the client drains the other. */
static int staged_out(unsigned char *dst, uint64_t src, size_t count, int kind, const char *what)
{
    size_t half = g.staging.size / 2;
    size_t nchunks = (count + half - 1) / half;
    uint32_t rid;
    int64_t first[6] = {(int64_t)wire_host_ptr(0, 0), (int64_t)half, (int64_t)src,
                        (int64_t)(count < half ? count : half), kind, (int64_t)count};
    int rc = send_request(OP_MEMCPY, first, 6, NULL, 0, &rid, what);
    for (size_t k = 0; !rc && k < nchunks; k++) {
        size_t done = k * half, n = count - done < half ? count - done : half;
        rc = receive_reply(rid, NULL, 0, g.call_timeout_ms, what, NULL);
        if (rc)
            break; /* nothing else is in flight: the next chunk is only sent after this one succeeded */
        if (k + 1 < nchunks) {
            size_t nd = done + half, nn = count - nd < half ? count - nd : half;
            int64_t next[6] = {(int64_t)wire_host_ptr(0, ((k + 1) % 2) * half), (int64_t)half, (int64_t)(src + nd),
                               (int64_t)nn, kind, (int64_t)(count - nd)};
            rc = send_request(OP_MEMCPY, next, 6, NULL, 0, &rid, what);
        }
        memcpy(dst + done, g.staging.addr + (k % 2) * half, n);
    }
    return rc;
}

enum side { SIDE_PLAIN, SIDE_HOSTREG, SIDE_DEVICE };

static enum side classify(const void *p, struct region **reg)
{
    *reg = find_host(p);
    if (*reg)
        return SIDE_HOSTREG;
    return is_device_ptr(p) ? SIDE_DEVICE : SIDE_PLAIN;
}

static int do_memcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind, const char *what)
{
    if (count > dest_max)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: count %zu exceeds destMax %zu", what, count, dest_max);
    if (dest_max > (size_t)INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: destMax %zu overflows", what, dest_max);
    if (kind < ACL_MEMCPY_HOST_TO_HOST || kind > ACL_MEMCPY_INTER_DEVICE_TO_DEVICE)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: unknown memcpy kind %d", what, kind);
    if (kind == ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE)
        kind = ACL_MEMCPY_HOST_TO_DEVICE;
    else if (kind > ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE)
        kind = ACL_MEMCPY_DEVICE_TO_DEVICE;
    if (!dst || !src)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", what, dst ? "src" : "dst");
    if ((uintptr_t)dst + count < (uintptr_t)dst || (uintptr_t)src + count < (uintptr_t)src)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu bytes overflow the address space", what, count);
    int rc = ready(what);
    if (rc)
        return rc;
    if (count == 0)
        return 0;
    struct region *dr, *sr;
    enum side ds = classify(dst, &dr), ss = classify(src, &sr);
    if (kind == ACL_MEMCPY_DEFAULT) {
        int dh = ds != SIDE_DEVICE, sh = ss != SIDE_DEVICE;
        kind = sh ? (dh ? ACL_MEMCPY_HOST_TO_HOST : ACL_MEMCPY_HOST_TO_DEVICE)
                  : (dh ? ACL_MEMCPY_DEVICE_TO_HOST : ACL_MEMCPY_DEVICE_TO_DEVICE);
    }
    int src_host = kind == ACL_MEMCPY_HOST_TO_HOST || kind == ACL_MEMCPY_HOST_TO_DEVICE;
    int dst_host = kind == ACL_MEMCPY_HOST_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_HOST;
    if ((src_host && ss == SIDE_DEVICE) || (dst_host && ds == SIDE_DEVICE))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: kind %d names a device pointer (%p) as host memory", what,
                            kind, src_host && ss == SIDE_DEVICE ? src : (const void *)dst);
    if ((!src_host && ss == SIDE_HOSTREG) || (!dst_host && ds == SIDE_HOSTREG))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: kind %d names a host buffer (%p) as device memory", what,
                            kind, !src_host && ss == SIDE_HOSTREG ? src : (const void *)dst);
    if (sr && (size_t)((const unsigned char *)src - sr->addr) + count > sr->size)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu bytes at %p run past its host buffer (%zu bytes)", what,
                            count, src, sr->size);
    if (dr && (size_t)((unsigned char *)dst - dr->addr) + count > dr->size)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu bytes at %p run past its host buffer (%zu bytes)", what,
                            count, dst, dr->size);
    if (kind == ACL_MEMCPY_HOST_TO_HOST) {
        memmove(dst, src, count);
        return 0;
    }
    uint64_t d = dr ? dr->wire + (uint64_t)((unsigned char *)dst - dr->addr) : (uint64_t)(uintptr_t)dst;
    uint64_t s = sr ? sr->wire + (uint64_t)((const unsigned char *)src - sr->addr) : (uint64_t)(uintptr_t)src;
    if (kind == ACL_MEMCPY_DEVICE_TO_DEVICE || (kind == ACL_MEMCPY_HOST_TO_DEVICE && sr) ||
        (kind == ACL_MEMCPY_DEVICE_TO_HOST && dr)) {
        int64_t args[5] = {(int64_t)d, (int64_t)dest_max, (int64_t)s, (int64_t)count, kind};
        return call(OP_MEMCPY, args, 5, NULL, 0, g.call_timeout_ms, what);
    }
    if (kind == ACL_MEMCPY_HOST_TO_DEVICE)
        return staged_in(d, src, count, kind, what);
    return staged_out(dst, s, count, kind, what);
}

API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    LOCKED(do_memcpy(dst, destMax, src, count, (int)kind, "aclrtMemcpy"));
}

static int do_memcpy_async(void *dst, size_t dest_max, const void *src, size_t count, int kind, aclrtStream stream)
{
    int rc = ready("aclrtMemcpyAsync");
    if (rc)
        return rc;
    /* in stream order: after the stream's queued kernels (the copy itself completes before return) */
    rc = sync_stream(stream, "aclrtMemcpyAsync");
    return rc ? rc : do_memcpy(dst, dest_max, src, count, kind, "aclrtMemcpyAsync");
}

API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                              aclrtStream stream)
{
    LOCKED(do_memcpy_async(dst, destMax, src, count, (int)kind, stream));
}

static int do_get_mem_info(int attr, size_t *free_b, size_t *total)
{
    if (!free_b || !total)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: %s is NULL", free_b ? "total" : "free");
    int rc = ready("aclrtGetMemInfo");
    if (!rc)
        rc = use_device("aclrtGetMemInfo", NULL);
    if (rc)
        return rc;
    int64_t arg = attr, out[2];
    rc = call(OP_GET_MEM_INFO, &arg, 1, out, 2, g.call_timeout_ms, "aclrtGetMemInfo");
    if (rc)
        return rc;
    *free_b = (size_t)out[0];
    *total = (size_t)out[1];
    return 0;
}

API aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total)
{
    LOCKED(do_get_mem_info((int)attr, free, total));
}

/* -- kernels ------------------------------------------------------------------------------------ */

static int do_launch(aclrtFuncHandle func, const void *args, size_t args_size, aclrtStream stream)
{
    if (func)
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT,
                            "aclrtLaunchKernel: only the emulated kernel exists on a FlexNPU share (pass funcHandle "
                            "NULL and aclrtEmulatedKernelArgs)");
    if (!args || args_size != sizeof(aclrtEmulatedKernelArgs))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchKernel: argsData must be an aclrtEmulatedKernelArgs "
                                                     "(%zu bytes), got %zu bytes",
                            sizeof(aclrtEmulatedKernelArgs), args_size);
    aclrtEmulatedKernelArgs k;
    memcpy(&k, args, sizeof k);
    if (k.duration_us > INT64_MAX || k.tag > INT64_MAX || k.out_ptr > INT64_MAX || k.in_ptr > INT64_MAX ||
        k.in_len > INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchKernel: an argument overflows int64");
    int rc = ready("aclrtLaunchKernel");
    if (rc)
        return rc;
    int64_t sid;
    rc = stream_id(stream, &sid, "aclrtLaunchKernel");
    if (rc)
        return rc;
    int64_t a[6] = {sid, (int64_t)k.duration_us, (int64_t)k.tag, (int64_t)k.out_ptr, (int64_t)k.in_ptr,
                    (int64_t)k.in_len};
    return call(OP_LAUNCH_KERNEL, a, 6, NULL, 0, g.call_timeout_ms, "aclrtLaunchKernel");
}

API aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t blockDim, const void *argsData, size_t argsSize,
                               aclrtStream stream)
{
    (void)blockDim;
    LOCKED(do_launch(funcHandle, argsData, argsSize, stream));
}
