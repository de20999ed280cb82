/*
 * cann_emulator.c: an ABI-compatible stand-in for CANN's libascendcl.so on a machine without an
 * NPU, for the aclserver's ascend backend (dra_driver/aclserver/backend_ascend.py). Device memory
 * is host RAM; every call is counted; a call can be made to fail with a given code.
 *
 * Environment: FLEXNPU_EMU_DEVICES (default 2), FLEXNPU_EMU_MEMORY (bytes per device, default
 * 1 GiB). Test hooks (not ACL): emu_calls(name) -> count, emu_fail_next(name, code),
 * emu_allocated(device) -> bytes, emu_current_device() -> the calling thread's device.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_ALLOCS 4096
#define NCALLS 16

static const char *names[NCALLS] = {"aclInit",         "aclFinalize",  "aclrtSetDevice", "aclrtResetDevice",
                                    "aclrtGetDeviceCount", "aclrtMalloc", "aclrtFree",   "aclrtMemcpy",
                                    "aclrtMemset",     "aclrtGetMemInfo", NULL};
static long calls[NCALLS];
static int fail_code[NCALLS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int current = -1;
static _Thread_local char err[256];
static int inited;

struct alloc {
    unsigned char *p;
    size_t size;
    int device;
};
static struct alloc allocs[MAX_ALLOCS];

static int devices(void)
{
    const char *v = getenv("FLEXNPU_EMU_DEVICES");
    return v ? atoi(v) : 2;
}

static size_t memory(void)
{
    const char *v = getenv("FLEXNPU_EMU_MEMORY");
    return v ? (size_t)strtoull(v, NULL, 10) : (size_t)1 << 30;
}

static int idx(const char *name)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name))
            return i;
    return -1;
}

/* count the call; return the injected failure code (0 = none) */
static int enter(const char *name)
{
    int i = idx(name), code;
    pthread_mutex_lock(&mu);
    calls[i]++;
    code = fail_code[i];
    fail_code[i] = 0;
    pthread_mutex_unlock(&mu);
    if (code)
        snprintf(err, sizeof err, "EE9999: injected failure of %s", name);
    return code;
}

static int fail(int code, const char *msg)
{
    snprintf(err, sizeof err, "%s", msg);
    return code;
}

static size_t used(int device)
{
    size_t n = 0;
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].p && allocs[i].device == device)
            n += allocs[i].size;
    return n;
}

static struct alloc *find(const void *p, size_t count)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].p && a >= (uintptr_t)allocs[i].p && a - (uintptr_t)allocs[i].p + count <= allocs[i].size)
            return &allocs[i];
    return NULL;
}

EXPORT long emu_calls(const char *name);
EXPORT long emu_calls(const char *name)
{
    int i = idx(name);
    return i < 0 ? -1 : calls[i];
}

EXPORT int emu_fail_next(const char *name, int code);
EXPORT int emu_fail_next(const char *name, int code)
{
    int i = idx(name);
    if (i >= 0)
        fail_code[i] = code;
    return i < 0 ? -1 : 0;
}

EXPORT long long emu_allocated(int device);
EXPORT long long emu_allocated(int device)
{
    pthread_mutex_lock(&mu);
    size_t n = used(device);
    pthread_mutex_unlock(&mu);
    return (long long)n;
}

EXPORT int emu_current_device(void);
EXPORT int emu_current_device(void)
{
    return current;
}

EXPORT const char *aclGetRecentErrMsg(void);
EXPORT const char *aclGetRecentErrMsg(void)
{
    return err[0] ? err : NULL;
}

EXPORT int aclInit(const char *config);
EXPORT int aclInit(const char *config)
{
    (void)config;
    int code = enter("aclInit");
    if (code)
        return code;
    if (inited)
        return fail(100002, "repeat initialize");
    inited = 1;
    return 0;
}

EXPORT int aclFinalize(void);
EXPORT int aclFinalize(void)
{
    int code = enter("aclFinalize");
    if (code)
        return code;
    inited = 0;
    return 0;
}

EXPORT int aclrtSetDevice(int32_t d);
EXPORT int aclrtSetDevice(int32_t d)
{
    int code = enter("aclrtSetDevice");
    if (code)
        return code;
    if (d < 0 || d >= devices())
        return fail(107001, "invalid device id");
    current = d;
    return 0;
}

EXPORT int aclrtResetDevice(int32_t d);
EXPORT int aclrtResetDevice(int32_t d)
{
    int code = enter("aclrtResetDevice");
    if (code)
        return code;
    if (d < 0 || d >= devices())
        return fail(107001, "invalid device id");
    if (current == d)
        current = -1;
    return 0;
}

EXPORT int aclrtGetDeviceCount(uint32_t *n);
EXPORT int aclrtGetDeviceCount(uint32_t *n)
{
    int code = enter("aclrtGetDeviceCount");
    if (code)
        return code;
    *n = (uint32_t)devices();
    return 0;
}

EXPORT int aclrtMalloc(void **p, size_t size, int policy);
EXPORT int aclrtMalloc(void **p, size_t size, int policy)
{
    (void)policy;
    int code = enter("aclrtMalloc");
    if (code)
        return code;
    if (current < 0)
        return fail(107002, "no device set in this thread");
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (used(current) + size > memory()) {
        rc = fail(207001, "EL0004: device out of memory");
    } else {
        int i = 0;
        while (i < MAX_ALLOCS && allocs[i].p)
            i++;
        unsigned char *m = i < MAX_ALLOCS ? calloc(1, size) : NULL;
        if (!m) {
            rc = fail(207001, "EL0004: emulator table full");
        } else {
            allocs[i] = (struct alloc){m, size, current};
            *p = m;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtFree(void *p);
EXPORT int aclrtFree(void *p)
{
    int code = enter("aclrtFree");
    if (code)
        return code;
    pthread_mutex_lock(&mu);
    int rc = fail(107000, "free of an unknown pointer");
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].p == p) {
            free(allocs[i].p);
            allocs[i].p = NULL;
            err[0] = '\0';
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtMemcpy(void *dst, size_t max, const void *src, size_t count, int kind);
EXPORT int aclrtMemcpy(void *dst, size_t max, const void *src, size_t count, int kind)
{
    int code = enter("aclrtMemcpy");
    if (code)
        return code;
    if (count > max)
        return fail(107000, "count exceeds destMax");
    pthread_mutex_lock(&mu);
    int dev_dst = kind == 1 || kind == 3, dev_src = kind == 2 || kind == 3;
    int ok = (!dev_dst || find(dst, count)) && (!dev_src || find(src, count)) && kind >= 0 && kind <= 3;
    pthread_mutex_unlock(&mu);
    if (!ok)
        return fail(107000, "memcpy outside an allocation or bad kind");
    memmove(dst, src, count);
    return 0;
}

EXPORT int aclrtMemset(void *p, size_t max, int32_t value, size_t count);
EXPORT int aclrtMemset(void *p, size_t max, int32_t value, size_t count)
{
    int code = enter("aclrtMemset");
    if (code)
        return code;
    if (count > max || !find(p, count))
        return fail(107000, "memset outside an allocation");
    memset(p, value, count);
    return 0;
}

EXPORT int aclrtGetMemInfo(int attr, size_t *free_b, size_t *total);
EXPORT int aclrtGetMemInfo(int attr, size_t *free_b, size_t *total)
{
    (void)attr;
    int code = enter("aclrtGetMemInfo");
    if (code)
        return code;
    if (current < 0)
        return fail(107002, "no device set in this thread");
    pthread_mutex_lock(&mu);
    *total = memory();
    *free_b = memory() - used(current);
    pthread_mutex_unlock(&mu);
    return 0;
}
