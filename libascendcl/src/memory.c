/*
 * memory.c: memory. Device memory (aclrtMalloc and its variants, free, memset, flush and
 * invalidate) lives on the aclserver, charged to the share's quota; the client keeps a sorted
 * table of its own allocations to tell device pointers from host ones. aclrtMallocHost returns
 * the address of a shared-memory region the aclserver created (the data link,
 * flexnpu_runtime/aclserver/datalink.py), so aclrtMemcpy from or to it sends only offsets (zero
 * copy); any other host memory is copied through the connection's staging region in two
 * pipelined halves, exactly as the Python client does.
 */
#include "client.h"

#include "acl/acl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* -- tables ------------------------------------------------------------------------------------- */

static struct region *find_host(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < session.nhosts; i++)
        if (a >= (uintptr_t)session.hosts[i].addr && a - (uintptr_t)session.hosts[i].addr < session.hosts[i].size)
            return &session.hosts[i];
    return NULL;
}

static size_t alloc_index(uint64_t p)
{
    size_t lo = 0, hi = session.nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (session.allocs[mid].base <= p)
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
    return i > 0 && a - session.allocs[i - 1].base < session.allocs[i - 1].size;
}

int add_alloc(uint64_t base, uint64_t size, int device, int policy)
{
    if (session.nallocs == session.capallocs) {
        size_t cap = session.capallocs ? 2 * session.capallocs : 64;
        struct devalloc *na = realloc(session.allocs, cap * sizeof *na);
        if (!na)
            return -1;
        session.allocs = na;
        session.capallocs = cap;
    }
    size_t i = alloc_index(base);
    memmove(&session.allocs[i + 1], &session.allocs[i], (session.nallocs - i) * sizeof *session.allocs);
    session.allocs[i] = (struct devalloc){base, size, device, policy};
    session.nallocs++;
    return 0;
}

void remove_alloc(uint64_t base)
{
    size_t i = alloc_index(base);
    if (i > 0 && session.allocs[i - 1].base == base) {
        memmove(&session.allocs[i - 1], &session.allocs[i], (session.nallocs - i) * sizeof *session.allocs);
        session.nallocs--;
    }
}

/* -- allocation --------------------------------------------------------------------------------- */

/* Allocate on device (NO_DEVICE: the calling thread's). */
static int do_malloc(void **dev, size_t size, int policy, int device, const char *what)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", what);
    if (size == 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: size must be positive", what);
    if (size > (size_t)INT64_MAX - 64)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: size %zu overflows", what, size);
    int rc = session_ready(what);
    if (rc)
        return rc;
    if (device == NO_DEVICE)
        rc = session_use_device(what, &device);
    else if (device < 0 || device >= session.device_count)
        rc = flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "%s: device %d does not exist (this claim has 0..%d)", what,
                          device, session.device_count - 1);
    else
        rc = session_select_device(device, what);
    if (rc)
        return rc;
    int64_t args[2] = {(int64_t)size, mem_policy_for_server(policy)}, ptr;
    rc = rpc_call(OP_MALLOC, args, 2, &ptr, 1, session.call_timeout_ms, what);
    if (rc)
        return rc;
    if (add_alloc((uint64_t)ptr, size, device, policy)) {
        int64_t p = ptr;
        rpc_call(OP_FREE, &p, 1, NULL, 0, session.call_timeout_ms, what);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    *dev = (void *)(uintptr_t)ptr;
    return 0;
}

/* CANN's check of an aclrtMallocConfig (NULL is none); *device gets an ACL_RT_MEM_ATTR_DEVICE_ID. */
static int malloc_config(const aclrtMallocConfig *cfg, int *device, const char *what)
{
    *device = NO_DEVICE;
    if (!cfg || cfg->numAttrs == 0)
        return 0;
    if (!cfg->attrs)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: cfg->attrs is NULL while cfg->numAttrs is %zu", what,
                            cfg->numAttrs);
    for (size_t i = 0; i < cfg->numAttrs; i++) {
        const aclrtMallocAttribute *a = &cfg->attrs[i];
        if (a->attr == ACL_RT_MEM_ATTR_DEVICE_ID)
            *device = (int)a->value.deviceId; /* checked against the claim's devices by the caller */
        else if (a->attr != ACL_RT_MEM_ATTR_RSV && a->attr != ACL_RT_MEM_ATTR_MODULE_ID &&
                 a->attr != ACL_RT_MEM_ATTR_VA_FLAG)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: cfg->attrs[%zu].attr %d is not an aclrtMallocAttrType",
                                what, i, (int)a->attr);
    }
    return 0;
}

API aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    LOCKED(do_malloc(devPtr, size, (int)policy, NO_DEVICE, "aclrtMalloc"));
}

static int do_malloc_with_cfg(void **dev, size_t size, int policy, const aclrtMallocConfig *cfg)
{
    int device;
    int rc = malloc_config(cfg, &device, "aclrtMallocWithCfg");
    return rc ? rc : do_malloc(dev, size, policy, device, "aclrtMallocWithCfg");
}

/* The module id and VA flag of cfg mean nothing on a share; a device id allocates on that device. */
API aclError aclrtMallocWithCfg(void **devPtr, size_t size, aclrtMemMallocPolicy policy, aclrtMallocConfig *cfg)
{
    LOCKED(do_malloc_with_cfg(devPtr, size, (int)policy, cfg));
}

API aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    LOCKED(do_malloc(devPtr, size, (int)policy, NO_DEVICE, "aclrtMallocAlign32"));
}

API aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    LOCKED(do_malloc(devPtr, size, (int)policy, NO_DEVICE, "aclrtMallocCached"));
}

static int do_mem_sync(void *dev, size_t size, const char *what)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", what);
    int rc = session_ready(what);
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

/* The *WithDevSync frees: first wait for the queued work of the thread's device. */
static int sync_device_first(const char *what)
{
    int rc = session_ready(what);
    if (!rc)
        rc = session_use_device(what, NULL);
    return rc ? rc : rpc_call(OP_SYNCHRONIZE_DEVICE, NULL, 0, NULL, 0, WAIT_FOREVER, what);
}

static int do_free(void *dev, int sync, const char *what)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", what);
    int rc = sync ? sync_device_first(what) : session_ready(what);
    if (rc)
        return rc;
    int64_t p = (int64_t)(uintptr_t)dev;
    rc = rpc_call(OP_FREE, &p, 1, NULL, 0, session.call_timeout_ms, what);
    if (!rc)
        remove_alloc((uint64_t)p);
    return rc;
}

API aclError aclrtFree(void *devPtr)
{
    LOCKED(do_free(devPtr, 0, "aclrtFree"));
}

API aclError aclrtFreeWithDevSync(void *devPtr)
{
    LOCKED(do_free(devPtr, 1, "aclrtFreeWithDevSync"));
}

/* Map the host buffer the server just made at wire pointer r.wire — the memfd it passed (fd >= 0)
 * or the region file it named — and add it to the table; if it cannot be mapped, free it there. */
static int adopt_host(struct region r, int fd, const char *name, size_t name_len, void **host, const char *what)
{
    int rc = fd >= 0 ? rpc_map_fd(fd, r.size, &r.addr, 1, what)
                     : rpc_map_region(name, name_len, r.size, &r.addr, 1, what);
    if (rc) {
        int64_t p = (int64_t)r.wire;
        struct saved_error keep;
        error_save(&keep);
        rpc_call(OP_FREE_HOST, &p, 1, NULL, 0, session.call_timeout_ms, what);
        error_restore(&keep);
        return rc;
    }
    session.hosts[session.nhosts++] = r;
    *host = r.addr;
    return 0;
}

static int do_malloc_host(void **host, size_t size, const char *what)
{
    if (!host)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: hostPtr is NULL", what);
    if (size == 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: size must be positive", what);
    if (size > (size_t)INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: size %zu overflows", what, size);
    int rc = session_ready(what);
    if (rc)
        return rc;
    if (session.nhosts == session.caphosts) {
        size_t cap = session.caphosts ? 2 * session.caphosts : 16;
        struct region *nh = realloc(session.hosts, cap * sizeof *nh);
        if (!nh)
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
        session.hosts = nh;
        session.caphosts = cap;
    }
    int64_t arg = (int64_t)size;
    if (!strcmp(session.kind, "unix")) { /* a sealed memfd the server maps too: copies at memcpy speed */
        struct saved_error keep;
        error_save(&keep);
        int64_t out[2];
        int fd;
        rc = rpc_call_fd(OP_MALLOC_HOST_FD, &arg, 1, out, 2, &fd, what);
        if (!rc && out[1] < (int64_t)size) {
            if (fd >= 0)
                close(fd);
            return rpc_broken(-EPROTO, what);
        }
        if (!rc)
            return adopt_host((struct region){.wire = (uint64_t)out[0], .size = (size_t)out[1]}, fd, NULL, 0,
                              host, what);
        if (session.dead || (rc != ACL_ERROR_API_NOT_SUPPORT && rc != ACL_ERROR_INVALID_PARAM))
            return rc; /* the server refused the buffer itself (its host-memory limit, say) */
        error_restore(&keep); /* a server without sealed buffers: the region file below */
    }
    uint32_t rid;
    struct wire_msg m;
    rc = rpc_send(OP_MALLOC_HOST, &arg, 1, NULL, 0, &rid, what);
    if (!rc)
        rc = rpc_receive(rid, NULL, 0, session.call_timeout_ms, what, &m);
    if (rc)
        return rc;
    if (m.n_ints < 3 || m.ints[2] < (int64_t)size)
        return rpc_broken(-EPROTO, what);
    return adopt_host((struct region){.wire = (uint64_t)m.ints[1], .size = (size_t)m.ints[2]}, -1, m.tail,
                      m.tail_len, host, what);
}

API aclError aclrtMallocHost(void **hostPtr, size_t size)
{
    LOCKED(do_malloc_host(hostPtr, size, "aclrtMallocHost"));
}

static int do_malloc_host_with_cfg(void **host, uint64_t size, const aclrtMallocConfig *cfg)
{
    int device;
    int rc = malloc_config(cfg, &device, "aclrtMallocHostWithCfg");
    if (!rc && size > SIZE_MAX)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHostWithCfg: size %llu overflows",
                          (unsigned long long)size);
    return rc ? rc : do_malloc_host(host, (size_t)size, "aclrtMallocHostWithCfg");
}

/* Host memory of the data link, as aclrtMallocHost; cfg's attributes mean nothing for it. */
API aclError aclrtMallocHostWithCfg(void **ptr, uint64_t size, aclrtMallocConfig *cfg)
{
    LOCKED(do_malloc_host_with_cfg(ptr, size, cfg));
}

static int do_free_host(void *host, int sync, const char *what)
{
    if (!host)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: hostPtr is NULL", what);
    int rc = session_ready(what);
    if (rc)
        return rc;
    struct region *r = find_host(host);
    if (!r || r->addr != host)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not a buffer from aclrtMallocHost", what, host);
    if (sync && (rc = sync_device_first(what)))
        return rc;
    int64_t p = (int64_t)r->wire;
    rc = rpc_call(OP_FREE_HOST, &p, 1, NULL, 0, session.call_timeout_ms, what);
    if (rc)
        return rc;
    munmap(r->addr, r->size);
    *r = session.hosts[--session.nhosts];
    return 0;
}

API aclError aclrtFreeHost(void *hostPtr)
{
    LOCKED(do_free_host(hostPtr, 0, "aclrtFreeHost"));
}

API aclError aclrtFreeHostWithDevSync(void *hostPtr)
{
    LOCKED(do_free_host(hostPtr, 1, "aclrtFreeHostWithDevSync"));
}

static int do_memset(void *dev, size_t max, int32_t value, size_t count)
{
    if (!dev)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: devPtr is NULL");
    if (count > max)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: count %zu exceeds maxCount %zu", count, max);
    if (max > (size_t)INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: maxCount %zu overflows", max);
    int rc = session_ready("aclrtMemset");
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
    return rpc_call(OP_MEMSET, args, 4, NULL, 0, session.call_timeout_ms, "aclrtMemset");
}

API aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    LOCKED(do_memset(devPtr, maxCount, value, count));
}

static int do_memset_async(void *dev, size_t max, int32_t value, size_t count, aclrtStream stream)
{
    int rc = session_ready("aclrtMemsetAsync");
    if (rc)
        return rc;
    rc = stream_sync(stream, "aclrtMemsetAsync"); /* in stream order, complete on return */
    return rc ? rc : do_memset(dev, max, value, count);
}

API aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream)
{
    LOCKED(do_memset_async(devPtr, maxCount, value, count, stream));
}

int staged_send(size_t count, staged_fill fill, staged_frame frame, void *ctx, const char *what)
{
    int src = session_seal_staging(what);
    if (src)
        return src;
    size_t half = session.staging.size / 2;
    uint32_t pending = 0;
    int have_pending = 0;
    size_t done = 0;
    for (unsigned k = 0;; k++) {
        size_t n = count - done < half ? count - done : half;
        size_t off = (k % 2) * half;
        int rc = fill(ctx, session.staging.addr + off, done, n);
        uint32_t rid = 0;
        int sent = 0;
        if (!rc) {
            int64_t args[FLEXNPU_MAX_INTS];
            uint16_t op;
            unsigned nargs = frame(ctx, done, wire_host_ptr(0, off), n, &op, args);
            rc = rpc_send(op, args, nargs, NULL, 0, &rid, what);
            sent = !rc;
        }
        if (have_pending && !session.dead) {
            struct saved_error keep;
            if (rc)
                error_save(&keep);
            int prc = rpc_receive(pending, NULL, 0, session.call_timeout_ms, what, NULL);
            if (rc)
                error_restore(&keep);
            else if (prc) {
                if (sent && !session.dead) {
                    error_save(&keep);
                    rpc_receive(rid, NULL, 0, session.call_timeout_ms, what, NULL);
                    error_restore(&keep);
                }
                return prc;
            }
        }
        if (rc)
            return rc;
        pending = rid;
        have_pending = 1;
        done += n;
        if (done >= count)
            break;
    }
    return rpc_receive(pending, NULL, 0, session.call_timeout_ms, what, NULL);
}

struct staged_copy {
    uint64_t dst;
    const unsigned char *src;
    size_t count;
    int kind;
};

static int copy_fill(void *ctx, unsigned char *dst, size_t done, size_t n)
{
    memcpy(dst, ((struct staged_copy *)ctx)->src + done, n);
    return 0;
}

static unsigned copy_frame(void *ctx, size_t done, uint64_t host, size_t n, uint16_t *op, int64_t *args)
{
    const struct staged_copy *c = ctx;
    *op = OP_MEMCPY;
    args[0] = (int64_t)(c->dst + done);
    args[1] = (int64_t)(c->count - done);
    args[2] = (int64_t)host;
    args[3] = (int64_t)n;
    args[4] = c->kind;
    args[5] = (int64_t)(c->count - done);
    return 6;
}

/* Copy count plain host bytes at src to device dst through the staging halves (staged_send). */
static int staged_in(uint64_t dst, const unsigned char *src, size_t count, int kind, const char *what)
{
    struct staged_copy c = {dst, src, count, kind};
    return staged_send(count, copy_fill, copy_frame, &c, what);
}

/* Copy count bytes from device src into plain host memory dst through the staging halves: the
 * server fills one half while the client drains the other. */
static int staged_out(unsigned char *dst, uint64_t src, size_t count, int kind, const char *what)
{
    int sealed = session_seal_staging(what);
    if (sealed)
        return sealed;
    size_t half = session.staging.size / 2;
    size_t nchunks = (count + half - 1) / half;
    uint32_t rid;
    int64_t first[6] = {(int64_t)wire_host_ptr(0, 0), (int64_t)half, (int64_t)src,
                        (int64_t)(count < half ? count : half), kind, (int64_t)count};
    int rc = rpc_send(OP_MEMCPY, first, 6, NULL, 0, &rid, what);
    for (size_t k = 0; !rc && k < nchunks; k++) {
        size_t done = k * half, n = count - done < half ? count - done : half;
        rc = rpc_receive(rid, NULL, 0, session.call_timeout_ms, what, NULL);
        if (rc)
            break; /* nothing else is in flight: the next chunk is only sent after this one succeeded */
        if (k + 1 < nchunks) {
            size_t nd = done + half, nn = count - nd < half ? count - nd : half;
            int64_t next[6] = {(int64_t)wire_host_ptr(0, ((k + 1) % 2) * half), (int64_t)half, (int64_t)(src + nd),
                               (int64_t)nn, kind, (int64_t)(count - nd)};
            rc = rpc_send(OP_MEMCPY, next, 6, NULL, 0, &rid, what);
        }
        memcpy(dst + done, session.staging.addr + (k % 2) * half, n);
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
    int rc = session_ready(what);
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
        return rpc_call(OP_MEMCPY, args, 5, NULL, 0, session.call_timeout_ms, what);
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
    int rc = session_ready("aclrtMemcpyAsync");
    if (rc)
        return rc;
    /* in stream order: after the stream's queued kernels (the copy itself completes before return) */
    rc = stream_sync(stream, "aclrtMemcpyAsync");
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
    if (mem_attr_for_server(attr) < 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: attr %d is not an aclrtMemAttr (0..%d)", attr,
                            ACL_MEM_P2P_HUGE1G);
    int rc = session_ready("aclrtGetMemInfo");
    if (!rc)
        rc = session_use_device("aclrtGetMemInfo", NULL);
    if (rc)
        return rc;
    int64_t arg = mem_attr_for_server(attr), out[2];
    rc = rpc_call(OP_GET_MEM_INFO, &arg, 1, out, 2, session.call_timeout_ms, "aclrtGetMemInfo");
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

/* -- pointer attributes --------------------------------------------------------------------------- */

static int do_pointer_attributes(const void *ptr, aclrtPtrAttributes *attributes)
{
    if (!ptr || !attributes)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtPointerGetAttributes: %s is NULL",
                            ptr ? "attributes" : "ptr");
    memset(attributes, 0, sizeof *attributes);
    uint64_t a = (uint64_t)(uintptr_t)ptr;
    size_t i = alloc_index(a);
    if (i > 0 && a - session.allocs[i - 1].base < session.allocs[i - 1].size) {
        attributes->location = (aclrtMemLocation){(uint32_t)session.allocs[i - 1].device, ACL_MEM_LOCATION_TYPE_DEVICE};
        attributes->pageSize = mem_policy_page_size(session.allocs[i - 1].policy);
        return ACL_SUCCESS;
    }
    long page = sysconf(_SC_PAGESIZE);
    attributes->pageSize = page > 0 ? (uint32_t)page : 4096u;
    attributes->location.type = find_host(ptr) ? ACL_MEM_LOCATION_TYPE_HOST : ACL_MEM_LOCATION_TYPE_UNREGISTERED;
    return ACL_SUCCESS;
}

/* Device memory of this process (its device and its policy's page size), aclrtMallocHost memory
 * (host), or any other address (unregistered): answered from the client's own tables. */
API aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes)
{
    LOCKED(do_pointer_attributes(ptr, attributes));
}
