/*
 * session.c: the one session of the process: its state, the last error of each thread, fork
 * handling, the handle tables, and aclInit / aclFinalize.
 *
 * One connection per process, opened by aclInit from client.conf ($FLEXNPU_CONF, else
 * /etc/flexnpu/client.conf) and closed by aclFinalize. Every call holds one process-wide mutex
 * for its whole exchange, so threads may call concurrently. The current device and context are
 * per thread (as in ACL); the server has one current device per connection, so a call that
 * depends on it first re-selects the calling thread's device when another thread changed it.
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

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct session_state session = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
    .server_device = NO_DEVICE,
    .process_device = NO_DEVICE,
};

static _Thread_local char t_err[ERR_MAX];
static _Thread_local int t_has_err;
static _Thread_local int t_last_error; /* the code of this thread's last failed call (aclrtGetLastError) */
_Thread_local int t_device = NO_DEVICE;
_Thread_local uint64_t t_generation;
_Thread_local struct context *t_context;

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* -- errors ------------------------------------------------------------------------------------ */

int flexnpu_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_err, sizeof t_err, fmt, ap);
    va_end(ap);
    t_has_err = 1;
    t_last_error = code;
    return code;
}

#define UNSUPPORTED_FMT "%s is not supported on a FlexNPU vNPU share (libascendcl.so client)"

int flexnpu_unsupported(const char *name)
{
    return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT, UNSUPPORTED_FMT, name);
}

void flexnpu_unsupported_note(const char *name)
{
    snprintf(t_err, sizeof t_err, UNSUPPORTED_FMT, name);
    t_has_err = 1;
}

void error_save(struct saved_error *s)
{
    memcpy(s->text, t_err, sizeof s->text);
    s->has = t_has_err;
    s->last = t_last_error;
}

void error_restore(const struct saved_error *s)
{
    memcpy(t_err, s->text, sizeof t_err);
    t_has_err = s->has;
    t_last_error = s->last;
}

API const char *aclGetRecentErrMsg(void)
{
    return t_has_err ? t_err : NULL;
}

/* The last error of the calling thread (CANN's thread level, 0; its context level, 1, is the same
 * here, as a share's contexts live in the client): ACL_SUCCESS when no call of this thread failed
 * since the last aclrtGetLastError. A successful call does not clear it; aclrtGetLastError does,
 * aclrtPeekAtLastError does not. */
static int last_error(aclrtLastErrLevel level, int clear, const char *what)
{
    if ((int)level != ACL_RT_THREAD_LEVEL && (int)level != ACL_RT_THREAD_LEVEL + 1) {
        snprintf(t_err, sizeof t_err, "%s: level %d is neither ACL_RT_THREAD_LEVEL (0) nor the context level (1)",
                 what, (int)level);
        t_has_err = 1;
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    int code = t_last_error;
    if (clear)
        t_last_error = ACL_SUCCESS;
    return code;
}

API aclError aclrtGetLastError(aclrtLastErrLevel level)
{
    return last_error(level, 1, "aclrtGetLastError");
}

API aclError aclrtPeekAtLastError(aclrtLastErrLevel level)
{
    return last_error(level, 0, "aclrtPeekAtLastError");
}

/* The version of the ACL API these headers describe (CANN's numbers, acl_rt.h). */
API aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion)
{
    if (!majorVersion || !minorVersion || !patchVersion)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetVersion: an output pointer is NULL");
    *majorVersion = ACL_MAJOR_VERSION;
    *minorVersion = ACL_MINOR_VERSION;
    *patchVersion = ACL_PATCH_VERSION;
    return ACL_SUCCESS;
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
    if (session.initialized || session.fd >= 0) {
        session.forked_from = session.owner;
        if (session.fd >= 0)
            close(session.fd);
        session.fd = -1;
        session.initialized = 0;
        session.explicit_init = 0;
        session.dead = 0;
        memset(&session.reader, 0, sizeof session.reader);
        session.sendbuf = NULL;
        session.sendcap = 0;
        session.hosts = NULL;
        session.nhosts = session.caphosts = 0;
        session.allocs = NULL;
        session.nallocs = session.capallocs = 0;
        session.default_streams = NULL;
        session.default_contexts = NULL;
        session.objects = NULL;
        session.nobjects = session.capobjects = 0;
        session.nabandoned = 0;
        memset(&session.staging, 0, sizeof session.staging);
        session.server_device = session.process_device = NO_DEVICE;
        session.generation++;
    }
    t_device = NO_DEVICE;
    t_context = NULL;
}

static void atfork_child(void)
{
    pthread_mutex_init(&session.lock, NULL);
    forget_inherited();
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

static void ensure_fork_checked(void)
{
    pthread_once(&atfork_once, install_atfork);
    if ((session.initialized || session.fd >= 0) && getpid() != session.owner)
        forget_inherited(); /* forked without the atfork handler (a raw clone): the same treatment */
}

/* -- state checks ------------------------------------------------------------------------------- */

int session_ready(const char *what)
{
    ensure_fork_checked();
    if (!session.initialized) {
        if (session.forked_from)
            return flexnpu_fail(ACL_ERROR_UNINITIALIZE,
                                "%s: this process (pid %d) was forked from pid %d after aclInit; the parent's "
                                "aclserver session is not shared with a child: call aclInit in this process",
                                what, (int)getpid(), (int)session.forked_from);
        return flexnpu_fail(ACL_ERROR_UNINITIALIZE, "%s: aclInit has not been called", what);
    }
    if (session.dead)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR,
                            "%s: the connection to the aclserver of claim %s was lost; call aclFinalize and "
                            "aclInit again",
                            what, session.conf.claim_uid);
    return 0;
}

int session_thread_device(void)
{
    if (t_generation == session.generation && t_device != NO_DEVICE)
        return t_device;
    return session.process_device;
}

int session_select_device(int device, const char *what)
{
    if (device != session.server_device) {
        int64_t arg = device;
        int rc = rpc_call(OP_SET_DEVICE, &arg, 1, NULL, 0, session.call_timeout_ms, what);
        if (rc)
            return rc;
        session.server_device = device;
    }
    return 0;
}

int session_use_device(const char *what, int *device)
{
    int d = session_thread_device();
    if (d == NO_DEVICE)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "%s: no device is set; call aclrtSetDevice first", what);
    int rc = session_select_device(d, what);
    if (!rc && device)
        *device = d;
    return rc;
}

/* -- handle tables ------------------------------------------------------------------------------- */

int objects_add(void *obj)
{
    if (session.nobjects == session.capobjects) {
        size_t cap = session.capobjects ? 2 * session.capobjects : 16;
        void **no = realloc(session.objects, cap * sizeof *no);
        if (!no)
            return -1;
        session.objects = no;
        session.capobjects = cap;
    }
    session.objects[session.nobjects++] = obj;
    return 0;
}

int objects_has(const void *obj, uint32_t magic)
{
    if (!obj)
        return 0;
    for (size_t i = 0; i < session.nobjects; i++)
        if (session.objects[i] == obj)
            return *(const uint32_t *)obj == magic;
    return 0;
}

void objects_remove(void *obj)
{
    for (size_t i = 0; i < session.nobjects; i++)
        if (session.objects[i] == obj) {
            session.objects[i] = session.objects[--session.nobjects];
            free(obj);
            return;
        }
}

/* -- init / finalize ---------------------------------------------------------------------------- */

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

static void forget_session(void)
{
    for (size_t i = 0; i < session.nhosts; i++)
        munmap(session.hosts[i].addr, session.hosts[i].size);
    free(session.hosts);
    session.hosts = NULL;
    session.nhosts = session.caphosts = 0;
    if (session.staging.addr)
        munmap(session.staging.addr, session.staging.size);
    memset(&session.staging, 0, sizeof session.staging);
    free(session.allocs);
    session.allocs = NULL;
    session.nallocs = session.capallocs = 0;
    free(session.default_streams);
    session.default_streams = NULL;
    free(session.default_contexts); /* the contexts themselves are among the objects */
    session.default_contexts = NULL;
    for (size_t i = 0; i < session.nobjects; i++)
        free(session.objects[i]);
    free(session.objects);
    session.objects = NULL;
    session.nobjects = session.capobjects = 0;
    free(session.sendbuf);
    session.sendbuf = NULL;
    session.sendcap = 0;
    session.nabandoned = 0;
    session.initialized = 0;
    session.explicit_init = 0;
    session.dead = 0;
    session.server_device = session.process_device = NO_DEVICE;
    session.generation++;
}

static const char *conf_path(void)
{
    const char *path = getenv("FLEXNPU_CONF");
    return path && *path ? path : FLEXNPU_DEFAULT_CONF;
}

int session_conf(struct client_conf *out, const char *what)
{
    if (session.initialized) {
        *out = session.conf;
        return 0;
    }
    char err[ERR_MAX];
    int rc = conf_load(conf_path(), out, err, sizeof err);
    return rc ? flexnpu_fail(rc, "%s: %s", what, err) : 0;
}

/* Read client.conf, connect, HELLO and INIT: the session of this process. */
static int open_session(void)
{
    char err[ERR_MAX];
    int rc = conf_load(conf_path(), &session.conf, err, sizeof err);
    if (rc)
        return flexnpu_fail(rc, "aclInit: %s", err);
    session.connect_timeout_ms = env_ms("FLEXNPU_CONNECT_TIMEOUT_MS", 5000);
    session.call_timeout_ms = env_ms("FLEXNPU_CALL_TIMEOUT_MS", 30000);

    char errs[2][320] = {"", ""};
    int fd = -1;
    if (session.conf.unix_path[0]) {
        fd = rpc_connect_unix(session.conf.unix_path, session.connect_timeout_ms, errs[0], sizeof errs[0]);
        session.kind = "unix";
    }
    if (fd < 0 && session.conf.tcp_host[0]) {
        fd = rpc_connect_tcp(session.conf.tcp_host, session.conf.tcp_port, session.connect_timeout_ms, errs[1],
                             sizeof errs[1]);
        session.kind = "tcp";
    }
    if (fd < 0)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "aclInit: no aclserver endpoint of claim %s answered (%s%s%s)",
                            session.conf.claim_uid, errs[0], errs[0][0] && errs[1][0] ? "; " : "", errs[1]);
    session.fd = fd;
    session.owner = getpid();
    session.forked_from = 0;
    session.dead = 0;

    int64_t hello[2] = {FLEXNPU_PROTOCOL_VERSION, (int64_t)getpid()};
    uint32_t rid;
    struct wire_msg m;
    rc = rpc_send(OP_HELLO, hello, 2, session.conf.token, strlen(session.conf.token), &rid, "aclInit (HELLO)");
    if (!rc)
        rc = rpc_receive(rid, NULL, 0, session.connect_timeout_ms, "aclInit (HELLO)", &m);
    if (!rc && m.n_ints < 4)
        rc = rpc_broken(-EPROTO, "aclInit (HELLO)");
    if (rc) {
        if (!session.dead) { /* the server answered and refused: say whose server and why */
            char why[ERR_MAX];
            const char *last = aclGetRecentErrMsg();
            snprintf(why, sizeof why, "%s", last ? last : "");
            flexnpu_fail(rc, "aclInit: the aclserver of claim %s refused the connection (%s)",
                         session.conf.claim_uid, why);
        }
        rpc_drop();
        forget_session();
        return rc;
    }
    if (m.ints[2] < 1 || m.ints[2] > MAX_DEVICES || m.ints[3] < 2 || m.ints[3] > (int64_t)1 << 40) {
        rpc_drop();
        forget_session();
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "aclInit: the aclserver's HELLO reply is out of range");
    }
    session.device_count = (int)m.ints[2];
    session.staging.size = (size_t)m.ints[3];
    session.staging.wire = wire_host_ptr(0, 0);
    /* the server pre-touched the staging pages: mapping them lazily costs only minor faults, and a
     * process that never stages a copy does not carry them in its RSS */
    session.staging_sealed = 0;
    rc = rpc_map_region(m.tail, m.tail_len, session.staging.size, &session.staging.addr, 0,
                        "aclInit (staging region)");
    if (!rc)
        madvise(session.staging.addr, session.staging.size, MADV_DONTFORK); /* a child must never write into it */
    if (!rc) {
        session.default_streams = calloc((size_t)session.device_count, sizeof *session.default_streams);
        session.default_contexts = calloc((size_t)session.device_count, sizeof *session.default_contexts);
        if (!session.default_streams || !session.default_contexts)
            rc = flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclInit: out of host memory");
    }
    if (!rc)
        rc = rpc_call(OP_INIT, NULL, 0, NULL, 0, session.call_timeout_ms, "aclInit");
    if (rc) {
        rpc_close();
        forget_session();
        return rc;
    }
    session.initialized = 1;
    session.generation++;
    return 0;
}

int session_seal_staging(const char *what)
{
    if (session.staging_sealed)
        return 0;
    session.staging_sealed = -1; /* asked once: a server or link without it keeps the region file */
    if (strcmp(session.kind, "unix"))
        return 0;
    struct saved_error keep;
    error_save(&keep);
    int64_t size = 0;
    int fd;
    int rc = rpc_call_fd(OP_STAGING_FD, NULL, 0, &size, 1, &fd, what);
    if (rc) {
        if (session.dead)
            return rc;
        error_restore(&keep);
        return 0;
    }
    unsigned char *addr;
    if (size != (int64_t)session.staging.size) {
        if (fd >= 0)
            close(fd);
        return rpc_broken(-EPROTO, what);
    }
    rc = rpc_map_fd(fd, session.staging.size, &addr, 1, what);
    if (rc)
        return rpc_broken(-ENOMEM, what); /* the server's staging region is the memfd now */
    madvise(addr, session.staging.size, MADV_DONTFORK);
    munmap(session.staging.addr, session.staging.size);
    session.staging.addr = addr;
    session.staging_sealed = 1;
    return 0;
}

int session_open_implicitly(const char *what)
{
    ensure_fork_checked();
    if (session.initialized)
        return 0;
    int rc = open_session();
    if (rc) {
        const char *m = aclGetRecentErrMsg();
        char why[ERR_MAX];
        snprintf(why, sizeof why, "%s", m ? m : "");
        return flexnpu_fail(rc, "%s before aclInit opens the session itself, and could not: %s", what, why);
    }
    return 0;
}

static int do_init(const char *config_path)
{
    ensure_fork_checked();
    if (session.explicit_init)
        return flexnpu_fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialized in this process");
    if (config_path && *config_path && access(config_path, R_OK) != 0)
        return flexnpu_fail(ACL_ERROR_INVALID_FILE, "aclInit: cannot read the ACL config %s: %s", config_path,
                            strerror(errno));
    int rc = session.initialized ? 0 : open_session(); /* aclrtSetDevice may have opened it already */
    if (!rc)
        session.explicit_init = 1;
    return rc;
}

API aclError aclInit(const char *configPath)
{
    LOCKED(do_init(configPath));
}

static int do_finalize(void)
{
    ensure_fork_checked();
    if (session.initialized && !session.explicit_init)
        return flexnpu_fail(ACL_ERROR_REPEAT_FINALIZE,
                            "aclFinalize: aclInit has not been called (the session aclrtSetDevice opened stays "
                            "until the process exits, as CANN's runtime does)");
    if (!session.initialized) {
        if (session.forked_from)
            return flexnpu_fail(ACL_ERROR_REPEAT_FINALIZE,
                                "aclFinalize: this process (pid %d) was forked from pid %d and has not called "
                                "aclInit; the parent's session is untouched",
                                (int)getpid(), (int)session.forked_from);
        return flexnpu_fail(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: aclInit has not been called");
    }
    int rc = 0;
    if (!session.dead)
        rc = rpc_call(OP_FINALIZE, NULL, 0, NULL, 0, WAIT_FOREVER, "aclFinalize");
    rpc_close();
    forget_session();
    return rc;
}

API aclError aclFinalize(void)
{
    LOCKED(do_finalize());
}
