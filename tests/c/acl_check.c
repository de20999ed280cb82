/*
 * acl_check.c: drives libascendcl.so against a real aclserver. Built by tests/c/cbuild.py with
 * -lascendcl; run as `acl_check <scenario> [args]` with FLEXNPU_CONF set. Every check prints
 * "ok <what>" or "FAIL <what>: ..." and scenario values as "val <key> <value>"; the exit status
 * is the number of failed checks (capped at 100).
 */
#include "check.h"

#include <acl/acl.h>
#include <acl/flexnpu_kernel.h>

/* aclrtQueryEvent is deprecated in CANN (and so in our headers); it is still served and tested. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

/* quota <quota_bytes> <devices>: device count, mem info, malloc within and beyond the quota. */
static void scenario_quota(size_t quota, uint32_t devices)
{
    CALL(aclInit(NULL));
    uint32_t count = 0;
    CALL(aclrtGetDeviceCount(&count));
    printf("val device_count %u\n", count);
    CHECK(count == devices, "device count %u == %u", count, devices);
    CALL(aclrtSetDevice(0));
    int32_t dev = -1;
    CALL(aclrtGetDevice(&dev));
    CHECK(dev == 0, "current device %d", dev);
    size_t free_b = 0, total = 0;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
    printf("val total %zu\nval free %zu\n", total, free_b);
    CHECK(total == quota && free_b == quota, "mem info total %zu free %zu (quota %zu)", total, free_b, quota);
    void *a = NULL, *b = NULL;
    CALL(aclrtMalloc(&a, quota / 2, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMalloc(&b, quota / 4, ACL_MEM_MALLOC_NORMAL_ONLY));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
    CHECK(free_b == quota - quota / 2 - quota / 4, "free after two allocations %zu", free_b);
    void *c = NULL;
    int r = aclrtMalloc(&c, quota / 2, ACL_MEM_MALLOC_HUGE_FIRST);
    printf("val over_quota_code %d\nval over_quota_msg %s\n", r, msg());
    expect(r, ACL_ERROR_RT_MEMORY_ALLOCATION, "malloc beyond the quota");
    CHECK(c == NULL, "no pointer returned for a refused malloc");
    CALL(aclrtFree(b));
    CALL(aclrtMalloc(&c, quota / 2, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtFree(a));
    CALL(aclrtFree(c));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
    CHECK(free_b == quota, "all memory back: free %zu", free_b);
    if (devices > 1) {
        CALL(aclrtSetDevice((int32_t)devices - 1));
        CALL(aclrtMalloc(&a, 1 << 20, ACL_MEM_MALLOC_HUGE_FIRST));
        CALL(aclrtFree(a));
    }
    expect(aclrtSetDevice((int32_t)devices), ACL_ERROR_INVALID_DEVICE, "set a device beyond the claim");
    CALL(aclrtResetDevice(0));
    CALL(aclFinalize());
}

static int copy_roundtrip(size_t n, int use_host_buffers, int kind_default, unsigned seed)
{
    int before = failures;
    void *dev = NULL;
    CALL(aclrtMalloc(&dev, n, ACL_MEM_MALLOC_HUGE_FIRST));
    unsigned char *src, *dst;
    if (use_host_buffers) {
        CALL(aclrtMallocHost((void **)&src, n));
        CALL(aclrtMallocHost((void **)&dst, n));
    } else {
        src = malloc(n);
        dst = malloc(n);
    }
    fill(src, n, seed);
    memset(dst, 0, n);
    CALL(aclrtMemcpy(dev, n, src, n, kind_default ? ACL_MEMCPY_DEFAULT : ACL_MEMCPY_HOST_TO_DEVICE));
    CALL(aclrtMemcpy(dst, n, dev, n, kind_default ? ACL_MEMCPY_DEFAULT : ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(memcmp(src, dst, n) == 0, "%zu bytes round trip (%s%s)", n, use_host_buffers ? "host buffers" : "plain",
          kind_default ? ", kind DEFAULT" : "");
    if (use_host_buffers) {
        CALL(aclrtFreeHost(src));
        CALL(aclrtFreeHost(dst));
    } else {
        free(src);
        free(dst);
    }
    CALL(aclrtFree(dev));
    return failures == before;
}

/* memcpy <staging_bytes>: both ways, plain and aclrtMallocHost buffers, chunked, D2D, memset. */
static void scenario_memcpy(size_t staging)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    copy_roundtrip(4096, 0, 0, 1);
    copy_roundtrip(2 * staging + 12345, 0, 0, 2); /* several pipelined chunks */
    copy_roundtrip(2 * staging + 777, 1, 0, 3);   /* zero copy */
    copy_roundtrip(100000, 0, 1, 4);
    copy_roundtrip(100000, 1, 1, 5);

    size_t n = 1 << 20;
    void *d1 = NULL, *d2 = NULL;
    unsigned char *h = NULL;
    CALL(aclrtMalloc(&d1, n, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMalloc(&d2, n, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMallocHost((void **)&h, n));
    CALL(aclrtMemset(d1, n, 0x5A, n));
    CALL(aclrtMemcpy(d2, n, d1, n, ACL_MEMCPY_INNER_DEVICE_TO_DEVICE));
    memset(h, 0, n);
    CALL(aclrtMemcpy(h, n, d2, n, ACL_MEMCPY_DEVICE_TO_HOST));
    int all = 1;
    for (size_t i = 0; i < n; i++)
        all &= h[i] == 0x5A;
    CHECK(all, "memset then device-to-device copy: every byte is 0x5A");
    /* an offset inside a host buffer and inside an allocation */
    fill(h, n, 9);
    CALL(aclrtMemcpy((char *)d1 + 1000, n - 1000, h + 500, 4096, ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE));
    unsigned char back[4096];
    CALL(aclrtMemcpy(back, sizeof back, (char *)d1 + 1000, 4096, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(memcmp(back, h + 500, 4096) == 0, "copy at offsets inside a host buffer and an allocation");
    CALL(aclrtMemcpy(h + 10, 100, h + 2000, 100, ACL_MEMCPY_HOST_TO_HOST));
    CHECK(memcmp(h + 10, h + 2000, 100) == 0, "host to host copy");
    CALL(aclrtFreeHost(h));
    CALL(aclrtFree(d1));
    CALL(aclrtFree(d2));
    CALL(aclFinalize());
}

/* streams <kernel_us>: kernels on a stream and the default stream, their results, events. */
static void scenario_streams(uint64_t kernel_us)
{
    CALL(aclInit(NULL));
    aclrtContext ctx = NULL, cur = NULL;
    CALL(aclrtCreateContext(&ctx, 0));
    CALL(aclrtGetCurrentContext(&cur));
    CHECK(cur == ctx, "the new context is current");
    aclrtStream s = NULL;
    CALL(aclrtCreateStream(&s));
    void *in = NULL, *out = NULL;
    size_t in_len = 65536;
    CALL(aclrtMalloc(&in, in_len, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMalloc(&out, 16, ACL_MEM_MALLOC_HUGE_FIRST));
    unsigned char *data = malloc(in_len);
    fill(data, in_len, 42);
    CALL(aclrtMemcpy(in, in_len, data, in_len, ACL_MEMCPY_HOST_TO_DEVICE));
    aclrtEvent start = NULL, end = NULL;
    CALL(aclrtCreateEvent(&start));
    CALL(aclrtCreateEvent(&end));
    CALL(aclrtRecordEvent(start, s));
    aclrtEmulatedKernelArgs k = {.duration_us = kernel_us, .tag = 0xC0FFEE, .out_ptr = (uint64_t)(uintptr_t)out,
                                 .in_ptr = (uint64_t)(uintptr_t)in, .in_len = in_len};
    for (int i = 0; i < 3; i++)
        CALL(aclrtLaunchKernel(NULL, 1, &k, sizeof k, s));
    CALL(aclrtRecordEvent(end, s));
    CALL(aclrtSynchronizeEvent(end));
    float ms = 0;
    CALL(aclrtEventElapsedTime(&ms, start, end));
    printf("val elapsed_ms %.3f\n", ms);
    CHECK(ms >= 3 * kernel_us / 1000.0 * 0.95, "events: %.3f ms for 3 kernels of %llu us", ms,
          (unsigned long long)kernel_us);
    uint64_t res[2] = {0, 0};
    CALL(aclrtMemcpy(res, sizeof res, out, sizeof res, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(res[0] == 0xC0FFEE && res[1] == crc32_of(data, in_len), "kernel result tag %llx crc %llx (want %x)",
          (unsigned long long)res[0], (unsigned long long)res[1], crc32_of(data, in_len));
    /* the default stream */
    k.tag = 7;
    CALL(aclrtLaunchKernel(NULL, 1, &k, sizeof k, NULL));
    CALL(aclrtSynchronizeStream(NULL));
    CALL(aclrtMemcpy(res, sizeof res, out, sizeof res, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(res[0] == 7, "kernel on the default stream wrote tag %llu", (unsigned long long)res[0]);
    /* async copy is ordered after the stream's kernels */
    k.tag = 99;
    CALL(aclrtLaunchKernel(NULL, 1, &k, sizeof k, s));
    CALL(aclrtMemcpyAsync(res, sizeof res, out, sizeof res, ACL_MEMCPY_DEVICE_TO_HOST, s));
    CALL(aclrtSynchronizeStream(s));
    CHECK(res[0] == 99, "async copy after a kernel on the same stream sees tag %llu", (unsigned long long)res[0]);
    CALL(aclrtSynchronizeDevice());
    /* event queries and waits: a recorded event is complete */
    aclrtEventStatus st = ACL_EVENT_STATUS_RESERVED;
    aclrtEventRecordedStatus rst = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    CALL(aclrtQueryEvent(end, &st));
    CHECK(st == ACL_EVENT_STATUS_COMPLETE, "query event: complete (%d)", (int)st);
    CALL(aclrtQueryEventStatus(end, &rst));
    CHECK(rst == ACL_EVENT_RECORDED_STATUS_COMPLETE, "query event status: recorded (%d)", (int)rst);
    CALL(aclrtStreamWaitEvent(s, end));
    CALL(aclrtSynchronizeEventWithTimeout(end, 1000));
    CALL(aclrtResetEvent(end, s));
    CALL(aclrtQueryEventStatus(end, &rst));
    CHECK(rst == ACL_EVENT_RECORDED_STATUS_NOT_READY, "a reset event is not recorded (%d)", (int)rst);
    expect(aclrtEventElapsedTime(&ms, start, end), ACL_ERROR_INVALID_PARAM, "elapsed time to a reset event");
    aclrtEvent flagged = NULL;
    CALL(aclrtCreateEventWithFlag(&flagged, 0x8u));
    CALL(aclrtDestroyEvent(flagged));
    expect(aclrtQueryEvent(flagged, &st), ACL_ERROR_INVALID_RESOURCE_HANDLE, "query a destroyed event");
    /* memset in stream order, cached memory */
    k.tag = 1234;
    CALL(aclrtLaunchKernel(NULL, 1, &k, sizeof k, s));
    CALL(aclrtMemsetAsync(out, 16, 0x11, 8, s));
    CALL(aclrtMemcpy(res, sizeof res, out, sizeof res, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(res[0] == 0x1111111111111111ull, "async memset after the kernel on its stream: %llx",
          (unsigned long long)res[0]);
    void *cached = NULL;
    CALL(aclrtMallocCached(&cached, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMemFlush(cached, 4096));
    CALL(aclrtMemInvalidate(cached, 4096));
    expect(aclrtMemFlush(data, 16), ACL_ERROR_INVALID_PARAM, "flush host memory");
    CALL(aclrtFree(cached));
    CALL(aclrtDestroyEvent(start));
    CALL(aclrtDestroyEvent(end));
    expect(aclrtDestroyEvent(start), ACL_ERROR_INVALID_RESOURCE_HANDLE, "destroy an event twice");
    CALL(aclrtDestroyStream(s));
    expect(aclrtSynchronizeStream(s), ACL_ERROR_INVALID_RESOURCE_HANDLE, "synchronize a destroyed stream");
    CALL(aclrtDestroyContext(ctx));
    expect(aclrtSetCurrentContext(ctx), ACL_ERROR_INVALID_RESOURCE_HANDLE, "set a destroyed context");
    aclrtRunMode mode;
    CALL(aclrtGetRunMode(&mode));
    CHECK(mode == ACL_HOST, "run mode is ACL_HOST");
    const char *soc = aclrtGetSocName();
    CHECK(soc && *soc, "soc name %s", soc ? soc : "(null)");
    free(data);
    CALL(aclFinalize());
}

/* badargs: NULL and out-of-range arguments, overflowing sizes, calls out of order. */
static void scenario_badargs(void)
{
    void *p = NULL;
    size_t a, b;
    expect(aclrtMalloc(&p, 1024, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE, "malloc before aclInit");
    expect(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE, "finalize before aclInit");
    CALL(aclInit(NULL));
    expect(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE, "aclInit twice");
    expect(aclrtMalloc(&p, 1024, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_DEVICE, "malloc before set device");
    expect(aclrtSetDevice(-1), ACL_ERROR_INVALID_DEVICE, "set device -1");
    expect(aclrtSetDevice(1 << 20), ACL_ERROR_INVALID_DEVICE, "set device 2^20");
    CALL(aclrtSetDevice(0));
    expect(aclrtMalloc(NULL, 1024, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM, "malloc NULL out");
    expect(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM, "malloc 0 bytes");
    expect(aclrtMalloc(&p, SIZE_MAX, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM, "malloc SIZE_MAX");
    expect(aclrtMalloc(&p, (size_t)1 << 62, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION,
           "malloc 2^62 bytes");
    /* CANN takes a policy it does not know as its default: so does a share */
    CALL(aclrtMalloc(&p, 1024, (aclrtMemMallocPolicy)77));
    CALL(aclrtFree(p));
    CALL(aclrtMalloc(&p, 1024, (aclrtMemMallocPolicy)(ACL_MEM_MALLOC_HUGE_FIRST | ACL_MEM_TYPE_HIGH_BAND_WIDTH)));
    CALL(aclrtFree(p));
    expect(aclrtMallocHost(NULL, 10), ACL_ERROR_INVALID_PARAM, "malloc host NULL out");
    expect(aclrtMallocHost(&p, SIZE_MAX), ACL_ERROR_INVALID_PARAM, "malloc host SIZE_MAX");
    expect(aclrtMallocHost(&p, (size_t)1 << 50), ACL_ERROR_INVALID_PARAM, "malloc host 2^50 bytes");
    expect(aclrtFree(NULL), ACL_ERROR_INVALID_PARAM, "free NULL");
    expect(aclrtFree((void *)(uintptr_t)0x1234), ACL_ERROR_INVALID_PARAM, "free a pointer never allocated");
    expect(aclrtFreeHost(&a), ACL_ERROR_INVALID_PARAM, "free host on a stack address");
    expect(aclrtGetMemInfo(ACL_HBM_MEM, NULL, &b), ACL_ERROR_INVALID_PARAM, "mem info NULL free");
    expect(aclrtGetMemInfo((aclrtMemAttr)99, &a, &b), ACL_ERROR_INVALID_PARAM, "mem info unknown attribute");
    expect(aclrtGetDeviceCount(NULL), ACL_ERROR_INVALID_PARAM, "device count NULL");
    expect(aclrtGetDevice(NULL), ACL_ERROR_INVALID_PARAM, "get device NULL");
    void *dev = NULL;
    CALL(aclrtMalloc(&dev, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    char buf[8192];
    expect(aclrtMemcpy(dev, 4096, buf, 8192, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
           "memcpy count > destMax");
    expect(aclrtMemcpy(dev, 8192, buf, 8192, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
           "memcpy past the end of an allocation");
    expect(aclrtMemcpy(NULL, 10, buf, 10, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "memcpy NULL dst");
    expect(aclrtMemcpy(dev, 10, NULL, 10, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "memcpy NULL src");
    expect(aclrtMemcpy(dev, SIZE_MAX, buf, 10, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
           "memcpy destMax SIZE_MAX");
    expect(aclrtMemcpy(dev, 10, buf, 10, (aclrtMemcpyKind)9), ACL_ERROR_INVALID_PARAM, "memcpy unknown kind");
    expect(aclrtMemcpy(buf, 10, dev, 10, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
           "memcpy kind H2D with a device source");
    expect(aclrtMemcpy((void *)(uintptr_t)(UINTPTR_MAX - 4), 10, buf, 10, ACL_MEMCPY_HOST_TO_HOST),
           ACL_ERROR_INVALID_PARAM, "memcpy wrapping the address space");
    expect(aclrtMemset(dev, 4096, 1, 8192), ACL_ERROR_INVALID_PARAM, "memset count > maxCount");
    expect(aclrtMemset(dev, 4096, 300, 16), ACL_ERROR_INVALID_PARAM, "memset value not a byte");
    expect(aclrtSynchronizeStream((aclrtStream)(uintptr_t)0xdead), ACL_ERROR_INVALID_RESOURCE_HANDLE,
           "synchronize an unknown stream");
    expect(aclrtDestroyStream(NULL), ACL_ERROR_INVALID_PARAM, "destroy the default stream");
    expect(aclrtRecordEvent((aclrtEvent)buf, NULL), ACL_ERROR_INVALID_RESOURCE_HANDLE, "record a non-event");
    expect(aclrtDestroyContext((aclrtContext)buf), ACL_ERROR_INVALID_RESOURCE_HANDLE, "destroy a non-context");
    expect(aclrtCreateContext(NULL, 0), ACL_ERROR_INVALID_PARAM, "create context NULL out");
    expect(aclrtCreateContext((aclrtContext *)&p, 99), ACL_ERROR_INVALID_DEVICE, "create context on device 99");
    float ms;
    expect(aclrtEventElapsedTime(&ms, NULL, NULL), ACL_ERROR_INVALID_RESOURCE_HANDLE, "elapsed time of NULL events");
    aclrtEmulatedKernelArgs k = {.duration_us = 100};
    expect(aclrtLaunchKernel(NULL, 1, &k, 3, NULL), ACL_ERROR_INVALID_PARAM, "launch with a short args block");
    expect(aclrtLaunchKernel((aclrtFuncHandle)buf, 1, &k, sizeof k, NULL), ACL_ERROR_INVALID_PARAM,
           "launch a function handle aclrtBinaryGetFunction did not give");
    k.duration_us = 0;
    expect(aclrtLaunchKernel(NULL, 1, &k, sizeof k, NULL), ACL_ERROR_INVALID_PARAM, "launch a 0 us kernel");
    /* the session still works after every refusal */
    size_t total;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &a, &total));
    CHECK(a + 4096 <= total + 32 && a < total, "mem info after refusals: free %zu of %zu", a, total);
    CALL(aclrtFree(dev));
    /* unsupported symbols resolve and refuse cleanly */
    aclError (*fn)(void) = (aclError(*)(void))dlsym(RTLD_DEFAULT, "aclmdlLoadFromFileWithQ");
    CHECK(fn != NULL, "aclmdlLoadFromFileWithQ resolves");
    if (fn) {
        int r = fn();
        printf("val unsupported_msg %s\n", msg());
        expect(r, ACL_ERROR_API_NOT_SUPPORT, "aclmdlLoadFromFileWithQ");
    }
    CALL(aclFinalize());
    /* as CANN: aclrtSetDevice opens the session itself, aclFinalize then has no aclInit to undo,
     * and a later aclInit adopts the open session */
    CALL(aclrtSetDevice(0));
    int32_t cur = -7;
    CALL(aclrtGetDevice(&cur));
    CHECK(cur == 0, "the device aclrtSetDevice set before aclInit: %d", cur);
    expect(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE, "finalize a session only aclrtSetDevice opened");
    CALL(aclInit(NULL));
    expect(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE, "aclInit twice after aclrtSetDevice");
    CALL(aclFinalize());
    /* a process may initialize again; a thread's device of the old session does not carry over */
    for (int i = 0; i < 3; i++) {
        CALL(aclInit(NULL));
        int32_t d = -7;
        expect(aclrtGetDevice(&d), ACL_ERROR_INVALID_DEVICE, "no device right after a new aclInit");
        CALL(aclrtSetDevice(0));
        CALL(aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
        CALL(aclrtGetMemInfo(ACL_HBM_MEM, &a, &total));
        CHECK(total - a == 4096, "a fresh session holds only its own allocation (%zu used)", total - a);
        CALL(aclFinalize());
    }
}

/* init: aclInit only; prints its code and message (for bad client.conf, token, endpoint). */
static void scenario_init(void)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = aclInit(NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("val init_code %d\nval init_msg %s\nval init_ms %.1f\n", r, msg(),
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    if (r == 0) {
        CALL(aclrtSetDevice(0));
        size_t f, t;
        r = aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
        printf("val meminfo_code %d\nval meminfo_msg %s\n", r, r ? msg() : "");
    }
}

/* desc: aclInit, set device 0 and describe model 1 (against a server that sends the description). */
static void scenario_desc(void)
{
    int r = aclInit(NULL);
    printf("val init_code %d\nval init_msg %s\n", r, r ? msg() : "");
    if (r)
        return;
    CALL(aclrtSetDevice(0));
    aclmdlDesc *desc = aclmdlCreateDesc();
    r = aclmdlGetDesc(desc, 1);
    printf("val desc_code %d\nval desc_msg %s\n", r, r ? msg() : "");
    if (!r)
        printf("val desc_inputs %zu\n", aclmdlGetNumInputs(desc));
    aclmdlDestroyDesc(desc);
}

/* hold <bytes> <fifo-less>: init, allocate, print "held", then wait for stdin to close. */
static void scenario_hold(size_t bytes)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    void *p = NULL;
    int r = aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
    printf("val hold_code %d\nval hold_msg %s\n", r, r ? msg() : "");
    size_t f = 0, t = 0;
    aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
    printf("val hold_free %zu\nval hold_total %zu\nheld\n", f, t);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
        if (c == 'i') {
            aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
            printf("val hold_free %zu\n", f);
            fflush(stdout);
        }
    }
    if (r == 0)
        CALL(aclrtFree(p));
    CALL(aclFinalize());
}

/* afterline: init and set device, print "ready", wait for one line on stdin, then make two
 * calls and print their codes, messages and durations (the server may be killed or stopped
 * meanwhile). */
static void scenario_afterline(void)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return;
    struct timespec t0, t1;
    size_t f, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("val first_code %d\nval first_msg %s\nval first_ms %.1f\n", r, msg(),
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    void *p = NULL;
    r = aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST);
    printf("val second_code %d\nval second_msg %s\n", r, msg());
    printf("val finalize_code %d\n", aclFinalize());
}

struct syncer {
    aclrtStream stream;
    _Atomic int tid;
    _Atomic int done;
    int rc;
};

static void *sync_main(void *arg)
{
    struct syncer *s = arg;
    atomic_store(&s->tid, (int)syscall(SYS_gettid));
    s->rc = aclrtSynchronizeStream(s->stream);
    atomic_store(&s->done, 1);
    return NULL;
}

/* Whether thread tid is blocked in poll/ppoll (waiting for the aclserver's reply). */
static int in_poll(pid_t tid)
{
    char path[64], buf[64] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    long nr = strtol(buf, NULL, 10);
#ifdef SYS_poll
    if (nr == SYS_poll)
        return 1;
#endif
    return nr == SYS_ppoll;
}

/* forkbusy <kernel_us>: fork while another thread waits in aclrtSynchronizeStream for a long
 * kernel (holding the client's lock): fork does not wait for it, and the child gets its clean
 * error at once. */
static void scenario_forkbusy(uint64_t kernel_us)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    struct syncer sy = {0};
    CALL(aclrtCreateStream(&sy.stream));
    aclrtEmulatedKernelArgs k = {.duration_us = kernel_us};
    CALL(aclrtLaunchKernel(NULL, 1, &k, sizeof k, sy.stream));
    pthread_t th;
    pthread_create(&th, NULL, sync_main, &sy);
    while (!atomic_load(&sy.tid) || !in_poll((pid_t)atomic_load(&sy.tid)))
        ; /* until the thread is blocked waiting for the aclserver's reply, inside the call */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        void *q = NULL;
        int r = aclrtMalloc(&q, 4096, ACL_MEM_MALLOC_HUGE_FIRST);
        printf("val child_malloc_code %d\n", r);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* had fork waited for the lock, the other thread's synchronize would have finished first */
    printf("val sync_done_when_child_exited %d\n", atomic_load(&sy.done));
    printf("val fork_ms %.1f\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    pthread_join(th, NULL);
    CHECK(sy.rc == 0, "the other thread's synchronize completed: %d", sy.rc);
    CALL(aclrtDestroyStream(sy.stream));
    CALL(aclFinalize());
}

struct worker {
    int index, ok;
};

static void *thread_main(void *arg)
{
    struct worker *w = arg;
    int local_rc;
    w->ok = 1;
    if ((local_rc = aclrtSetDevice(0)) != 0) {
        w->ok = 0;
        return NULL;
    }
    for (int i = 0; i < 20 && w->ok; i++) {
        size_t n = 8192 + (size_t)w->index * 1000 + (size_t)i;
        void *d = NULL;
        unsigned char *a = malloc(n), *b = malloc(n);
        fill(a, n, (unsigned)(w->index * 100 + i));
        if (aclrtMalloc(&d, n, ACL_MEM_MALLOC_HUGE_FIRST) || aclrtMemcpy(d, n, a, n, ACL_MEMCPY_HOST_TO_DEVICE) ||
            aclrtMemcpy(b, n, d, n, ACL_MEMCPY_DEVICE_TO_HOST) || memcmp(a, b, n) || aclrtFree(d))
            w->ok = 0;
        free(a);
        free(b);
    }
    return NULL;
}

/* threads <n>: n threads copy concurrently through the one connection. */
static void scenario_threads(int n)
{
    CALL(aclInit(NULL));
    pthread_t th[64];
    struct worker ws[64];
    for (int i = 0; i < n; i++) {
        ws[i].index = i;
        pthread_create(&th[i], NULL, thread_main, &ws[i]);
    }
    int all = 1;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        all &= ws[i].ok;
    }
    CHECK(all, "%d threads copied and checked their data", n);
    CALL(aclFinalize());
}

/* fork: the child gets a clean error, then its own session or a clear refusal; the parent's
 * session keeps working. */
static void scenario_fork(void)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    void *p = NULL;
    CALL(aclrtMalloc(&p, 1 << 20, ACL_MEM_MALLOC_HUGE_FIRST));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        void *q = NULL;
        int r = aclrtMalloc(&q, 4096, ACL_MEM_MALLOC_HUGE_FIRST);
        printf("val child_malloc_code %d\nval child_malloc_msg %s\n", r, msg());
        r = aclrtFree(p);
        printf("val child_free_parent_code %d\n", r);
        r = aclInit(NULL);
        printf("val child_init_code %d\nval child_init_msg %s\n", r, r ? msg() : "");
        if (r == 0) {
            int r2 = aclrtSetDevice(0);
            if (!r2)
                r2 = aclrtMalloc(&q, 4096, ACL_MEM_MALLOC_HUGE_FIRST);
            printf("val child_own_malloc_code %d\n", r2);
            printf("val child_finalize_code %d\n", aclFinalize());
        }
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited cleanly");
    size_t f, t;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &f, &t));
    CHECK(t - f >= (1 << 20), "the parent's allocation survived the child: %zu used", t - f);
    CALL(aclrtFree(p));
    CALL(aclFinalize());
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *s = argc > 1 ? argv[1] : "";
    if (!strcmp(s, "quota") && argc == 4)
        scenario_quota(strtoull(argv[2], NULL, 10), (uint32_t)strtoul(argv[3], NULL, 10));
    else if (!strcmp(s, "memcpy") && argc == 3)
        scenario_memcpy(strtoull(argv[2], NULL, 10));
    else if (!strcmp(s, "streams") && argc == 3)
        scenario_streams(strtoull(argv[2], NULL, 10));
    else if (!strcmp(s, "badargs"))
        scenario_badargs();
    else if (!strcmp(s, "init"))
        scenario_init();
    else if (!strcmp(s, "desc"))
        scenario_desc();
    else if (!strcmp(s, "hold") && argc == 3)
        scenario_hold(strtoull(argv[2], NULL, 10));
    else if (!strcmp(s, "threads") && argc == 3)
        scenario_threads(atoi(argv[2]));
    else if (!strcmp(s, "forkbusy") && argc == 3)
        scenario_forkbusy(strtoull(argv[2], NULL, 10));
    else if (!strcmp(s, "afterline"))
        scenario_afterline();
    else if (!strcmp(s, "fork"))
        scenario_fork();
    else {
        fprintf(stderr, "usage: acl_check quota|memcpy|streams|badargs|init|desc|hold|threads|afterline|fork ...\n");
        return 2;
    }
    return finish();
}
