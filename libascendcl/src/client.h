/*
 * client.h: the internals the translation units of libascendcl.so share (nothing here is
 * exported; the library is built with -fvisibility=hidden and exports only ACL_FUNC_VISIBILITY).
 *
 * One process-wide session (session.c) holds the connection to the claim's aclserver and every
 * table that goes with it; each API family lives in its own file (device.c, context.c, stream.c,
 * event.c, memory.c, kernel.c) and reaches the server through the rpc_* calls of connection.c.
 * Every exported call takes session.lock for its whole exchange (LOCKED).
 */
#ifndef FLEXNPU_CLIENT_H_
#define FLEXNPU_CLIENT_H_

#include "acl/acl.h"
#include "conf.h"
#include "prototypes.h"
#include "wire.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define API ACL_FUNC_VISIBILITY
#define ERR_MAX 1024
#define MAX_DEVICES 1024
#define NO_DEVICE (-1)
#define WAIT_FOREVER (-1)
#define CTX_MAGIC 0x464E5043u   /* "FNPC" */
#define EVENT_MAGIC 0x464E5045u /* "FNPE" */
#define ABANDONED_MAX 32        /* timed-out waits whose late replies are still to be dropped */
#define WAIT_GRACE_MS 20        /* added to a wait's timeout for the round trip itself */

/* A shared-memory region the aclserver created and this process mapped. */
struct region {
    uint64_t wire; /* wire host pointer of offset 0 */
    unsigned char *addr;
    size_t size;
};

struct devalloc {
    uint64_t base, size;
    int device, policy; /* as allocated (aclrtPointerGetAttributes) */
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

/* The one session of this process (defined in session.c). */
struct session_state {
    pthread_mutex_t lock;
    int initialized;   /* the session is open (by aclInit, or by aclrtSetDevice before it) */
    int explicit_init; /* aclInit was called (aclFinalize closes only such a session) */
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
    int staging_sealed; /* 0: not asked yet; 1: a sealed memfd; -1: the region file (TCP, older server) */
    struct region *hosts;
    size_t nhosts, caphosts;
    struct devalloc *allocs; /* sorted by base */
    size_t nallocs, capallocs;
    uint64_t *default_streams; /* per device, 0 = none yet */
    struct context **default_contexts; /* per device: made current by aclrtSetDevice (in objects) */
    void **objects;            /* live contexts and events (handles are checked before use) */
    size_t nobjects, capobjects;
    int connect_timeout_ms, call_timeout_ms;
    uint32_t abandoned[ABANDONED_MAX]; /* request ids of timed-out waits (their replies come later) */
    unsigned nabandoned;
};

extern struct session_state session;

/* The calling thread's device and context (valid while t_generation == session.generation). */
extern _Thread_local int t_device;
extern _Thread_local uint64_t t_generation;
extern _Thread_local struct context *t_context;

#define LOCKED(expr)                                                                                             \
    do {                                                                                                         \
        pthread_mutex_lock(&session.lock);                                                                       \
        int rc_ = (expr);                                                                                        \
        pthread_mutex_unlock(&session.lock);                                                                     \
        return rc_;                                                                                              \
    } while (0)

/* -- errors (session.c) -------------------------------------------------------------------------- */

/* Record a failure message for aclGetRecentErrMsg (this thread) and return code. */
int flexnpu_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A stub's answer (src/stubs.c): the message "<name> is not supported ..." and 200001;
 * the _note form only leaves the message (for functions that return nothing). */
int flexnpu_unsupported(const char *name);
void flexnpu_unsupported_note(const char *name);

/* The calling thread's last message and error code, kept across a call that would overwrite them. */
struct saved_error {
    char text[ERR_MAX];
    int has;
    int last;
};
void error_save(struct saved_error *s);
void error_restore(const struct saved_error *s);

/* -- session state (session.c) ------------------------------------------------------------------- */

/* 0 when the session is usable, else the failure (recorded) for the call named what. */
int session_ready(const char *what);
/* Open the session if aclInit has not (aclrtSetDevice before aclInit, as CANN allows). */
int session_open_implicitly(const char *what);
/* The claim's client.conf: the session's, or read now (before aclInit) without connecting. */
int session_conf(struct client_conf *out, const char *what);
/* The device the calling thread uses (its own, else the process's), NO_DEVICE when none. */
int session_thread_device(void);
/* Select the calling thread's device on the connection (if it is not already). */
int session_use_device(const char *what, int *device);
/* Select device on the connection for the next call (the thread's own is selected again later). */
int session_select_device(int device, const char *what);
/* On the unix socket, make the staging region a sealed memfd the server maps (asked once, at the
 * first staged copy; a server that cannot keeps the region file). */
int session_seal_staging(const char *what);

int objects_add(void *obj);
int objects_has(const void *obj, uint32_t magic);
void objects_remove(void *obj); /* and free it */

/* -- the connection (connection.c) --------------------------------------------------------------- */

int rpc_connect_unix(const char *path, int timeout_ms, char *err, size_t err_len);
int rpc_connect_tcp(const char *host, int port, int timeout_ms, char *err, size_t err_len);
/* Mark the connection broken and return the error for the failed exchange (-errno in err). */
int rpc_broken(int err, const char *what);
int rpc_send(uint16_t op, const int64_t *ints, unsigned n, const void *tail, size_t tail_len, uint32_t *rid,
             const char *what);
/* Wait for the reply to rid; copy up to nout output values (after ret) to out; keep (if not NULL)
 * receives the whole reply. Returns the reply's ACL code (its message recorded) or a
 * connection error. */
int rpc_receive(uint32_t rid, int64_t *out, unsigned nout, int timeout_ms, const char *what,
                struct wire_msg *keep);
/* A request that waits on the server (synchronize), given timeout_ms to answer (< 0: no limit).
 * *finished is 1 when it answered in time (its code returned), 0 when not: its late reply is then
 * dropped when it arrives, and 0 is returned. */
int rpc_wait_within(uint16_t op, const int64_t *ints, unsigned n, int timeout_ms, int *finished, const char *what);
/* One request and its reply. */
int rpc_call(uint16_t op, const int64_t *ints, unsigned n, int64_t *out, unsigned nout, int timeout_ms,
             const char *what);
void rpc_drop(void);  /* close the socket and its reader */
void rpc_close(void); /* half-close, wait (bounded) for the server to release the session, drop */
/* Map a region file the aclserver created in the claim's shm dir (name checked, no symlink). */
int rpc_map_region(const char *name, size_t name_len, size_t size, unsigned char **addr, int populate,
                   const char *what);
/* One request whose successful reply passes a descriptor (unix socket): *fd, or -1. */
int rpc_call_fd(uint16_t op, const int64_t *ints, unsigned n, int64_t *out, unsigned nout, int *fd, const char *what);
/* Map (and close) a sealed memfd the aclserver passed. */
int rpc_map_fd(int fd, size_t size, unsigned char **addr, int populate, const char *what);

/* -- staged transfers (memory.c) ------------------------------------------------------------------ */

/* Put the chunk of n bytes at offset done of the transfer into dst (0, or an error recorded). */
typedef int (*staged_fill)(void *ctx, unsigned char *dst, size_t done, size_t n);
/* The request that hands the server that chunk, now at wire host pointer host: its op and values. */
typedef unsigned (*staged_frame)(void *ctx, size_t done, uint64_t host, size_t n, uint16_t *op, int64_t *args);
/* Send count bytes through the two staging halves, pipelined: the client fills one half while the
 * server drains the other (as the Python client's Session._send_staged). */
int staged_send(size_t count, staged_fill fill, staged_frame frame, void *ctx, const char *what);

/* The client's table of device memory (memory.c): a range the server gave out (an allocation, a
 * reserved virtual range), for pointer attributes and copy directions; add_alloc is -1 without memory. */
int add_alloc(uint64_t base, uint64_t size, int device, int policy);
void remove_alloc(uint64_t base);

/* -- byte blobs (mdl.c): a model's or a kernel binary's bytes, shipped once through the staging region -- */

/* Hand the aclserver the bytes of a file (path) or of size bytes at mem: its blob id in *blob. */
int model_send(const char *path, const void *mem, size_t size, int64_t *blob, const char *what);
/* Drop a blob the aclserver still holds (the recorded error is kept). */
void blob_close(int64_t blob, const char *what);

/* -- memory policies and attributes (mempolicy.c) --------------------------------------------- */

/* The policy (0..5) the aclserver is sent for any aclrtMemMallocPolicy value CANN accepts. */
int mem_policy_for_server(int policy);
/* The page size aclrtPointerGetAttributes reports for memory allocated with policy. */
uint32_t mem_policy_page_size(int policy);
/* The attribute (0..5) the aclserver is asked for an aclrtMemAttr 0..17; -1 for another value. */
int mem_attr_for_server(int attr);

/* -- models (mdl.c) ------------------------------------------------------------------------------ */

/* Execute model_id on in/out: synchronously (async 0, stream unused) or queued on stream. */
int mdl_execute(uint32_t model_id, const aclmdlDataset *in, aclmdlDataset *out, aclrtStream stream, int async,
                const char *what);

/* -- streams (stream.c) -------------------------------------------------------------------------- */

/* The server's id of stream; NULL is the thread's device's default stream (created lazily). */
int stream_resolve(aclrtStream stream, int64_t *id, const char *what);
/* Wait until stream's queued work is done. */
int stream_sync(aclrtStream stream, const char *what);
/* Wait at most timeout ms (-1: without limit) for stream's work; *finished says whether it ended. */
int stream_sync_within(aclrtStream stream, int32_t timeout, int *finished, const char *what);

#endif /* FLEXNPU_CLIENT_H_ */
