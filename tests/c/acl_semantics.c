/*
 * acl_semantics.c: CANN's semantics of the calls libascendcl.so serves, against a real aclserver.
 * Run as `acl_semantics <scenario> [args]` with FLEXNPU_CONF set; prints check.h lines.
 *
 *   preinit <devices>  device count, SoC name and run mode before aclInit (from client.conf),
 *                      aclrtSetDevice before aclInit opens the session, aclInit adopts it
 *   lasterror          aclrtGetLastError / aclrtPeekAtLastError: ACL_SUCCESS when nothing failed,
 *                      the last failure kept across successes, cleared by Get only, per thread
 *   memory <quota> <devices>  every aclrtMemMallocPolicy value and flag, aclrtMemAttr 0..17,
 *                      aclrtMallocWithCfg / aclrtMallocHostWithCfg, aclrtPointerGetAttributes
 *   peer               peer access between the claim's two devices, and a copy from one to the other
 *   waits <kernel_us>  aclrtStreamQuery and the synchronize calls with a timeout while a kernel of
 *                      kernel_us runs: they time out, the session keeps working, late answers are dropped
 */
#include "check.h"

#include <acl/acl.h>
#include <acl/flexnpu_kernel.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void scenario_preinit(uint32_t devices)
{
    uint32_t count = 0;
    int r = aclrtGetDeviceCount(&count);
    printf("val count_code %d\nval count_msg %s\nval count %u\n", r, r ? msg() : "", count);
    CHECK(r == ACL_SUCCESS && count == devices, "device count before aclInit: %u (want %u)", count, devices);
    const char *soc = aclrtGetSocName();
    printf("val soc %s\n", soc ? soc : "(null)");
    CHECK(soc != NULL, "SoC name before aclInit");
    aclrtRunMode mode = ACL_DEVICE;
    CALL(aclrtGetRunMode(&mode));
    CHECK(mode == ACL_HOST, "run mode before aclInit: %d", (int)mode);
    void *p = NULL;
    expect(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE, "malloc before any session");

    CALL(aclrtSetDevice(0)); /* opens the session */
    CALL(aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclInit(NULL)); /* adopts it */
    expect(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE, "aclInit twice");
    int32_t dev = -1;
    CALL(aclrtGetDevice(&dev));
    CHECK(dev == 0, "the device set before aclInit stays: %d", dev);
    count = 0;
    CALL(aclrtGetDeviceCount(&count));
    CHECK(count == devices, "device count from the server: %u", count);
    CALL(aclrtFree(p));
    CALL(aclFinalize());
    expect(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE, "aclFinalize twice");
}

static void *other_thread(void *arg)
{
    (void)arg;
    intptr_t seen = aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL);
    return (void *)seen;
}

static void scenario_lasterror(void)
{
    expect(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS, "last error when nothing failed");
    expect(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS, "peek when nothing failed");
    void *p = NULL;
    expect(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE, "malloc before aclInit");
    expect(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_UNINITIALIZE, "peek sees it");
    expect(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_UNINITIALIZE, "peek does not clear it");
    pthread_t t;
    void *seen = NULL;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, &seen);
    CHECK((intptr_t)seen == ACL_SUCCESS, "another thread's last error is its own: %ld", (long)(intptr_t)seen);
    expect(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_UNINITIALIZE, "get returns it");
    expect(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS, "get cleared it");

    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    expect(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM, "malloc 0 bytes");
    uint32_t count;
    CALL(aclrtGetDeviceCount(&count));
    expect(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM, "a success does not clear it");
    expect(aclrtSetOpWaitTimeout(1), ACL_ERROR_API_NOT_SUPPORT, "a stub");
    expect(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_API_NOT_SUPPORT, "the last failure wins");
    expect(aclrtGetLastError((aclrtLastErrLevel)7), ACL_ERROR_RT_PARAM_INVALID, "an unknown level");
    CHECK(strstr(msg(), "level 7") != NULL, "the message names the level: %s", msg());
    expect(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS, "the level refusal is no call failure");
    CALL(aclFinalize());
}

static const int POLICIES[] = {
    ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_ONLY, ACL_MEM_MALLOC_NORMAL_ONLY,
    ACL_MEM_MALLOC_HUGE_FIRST_P2P, ACL_MEM_MALLOC_HUGE_ONLY_P2P, ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
    ACL_MEM_MALLOC_HUGE1G_ONLY, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,
};
static const int FLAGS[] = {0, ACL_MEM_TYPE_LOW_BAND_WIDTH, ACL_MEM_TYPE_HIGH_BAND_WIDTH,
                            ACL_MEM_ACCESS_USER_SPACE_READONLY,
                            ACL_MEM_TYPE_HIGH_BAND_WIDTH | ACL_MEM_ACCESS_USER_SPACE_READONLY};

static uint32_t expected_page(int policy)
{
    int base = policy & 0xFF;
    if (base == ACL_MEM_MALLOC_NORMAL_ONLY || base == ACL_MEM_MALLOC_NORMAL_ONLY_P2P)
        return 4096;
    if (base == ACL_MEM_MALLOC_HUGE1G_ONLY || base == ACL_MEM_MALLOC_HUGE1G_ONLY_P2P)
        return 1u << 30;
    return 2u << 20;
}

static void malloc_policies(void)
{
    int ok = 0, tried = 0;
    for (size_t i = 0; i < sizeof POLICIES / sizeof *POLICIES; i++)
        for (size_t f = 0; f < sizeof FLAGS / sizeof *FLAGS; f++) {
            int policy = POLICIES[i] | FLAGS[f];
            void *p = NULL;
            aclrtPtrAttributes a;
            tried++;
            int r = aclrtMalloc(&p, 4096, (aclrtMemMallocPolicy)policy);
            int r2 = r ? r : aclrtPointerGetAttributes(p, &a);
            int good = r == 0 && r2 == 0 && a.location.type == ACL_MEM_LOCATION_TYPE_DEVICE &&
                       a.pageSize == expected_page(policy) && aclrtFree(p) == 0;
            if (!good)
                printf("FAIL policy 0x%x -> %d/%d %s\n", policy, r, r2, msg());
            ok += good;
        }
    CHECK(ok == tried, "every policy and flag allocates: %d of %d", ok, tried);
    void *p = NULL;
    CALL(aclrtMalloc(&p, 4096, (aclrtMemMallocPolicy)0x7FFFFFFF)); /* CANN's default for the unknown */
    CALL(aclrtFree(p));
    CALL(aclrtMallocCached(&p, 4096, ACL_MEM_MALLOC_HUGE1G_ONLY));
    CALL(aclrtFree(p));
    CALL(aclrtMallocAlign32(&p, 4096, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P));
    CALL(aclrtFree(p));
}

static void mem_attributes(size_t quota)
{
    int ok = 0;
    for (int attr = ACL_DDR_MEM; attr <= ACL_MEM_P2P_HUGE1G; attr++) {
        size_t f = 0, t = 0;
        int r = aclrtGetMemInfo((aclrtMemAttr)attr, &f, &t);
        if (r || t != quota || f > t)
            printf("FAIL mem attr %d -> %d free %zu total %zu %s\n", attr, r, f, t, msg());
        ok += r == 0 && t == quota && f <= t;
    }
    CHECK(ok == 18, "every aclrtMemAttr 0..17 reports the quota: %d of 18", ok);
    size_t f, t;
    expect(aclrtGetMemInfo((aclrtMemAttr)18, &f, &t), ACL_ERROR_INVALID_PARAM, "mem attr 18");
    expect(aclrtGetMemInfo((aclrtMemAttr)-1, &f, &t), ACL_ERROR_INVALID_PARAM, "mem attr -1");
}

static void with_cfg(uint32_t devices)
{
    void *p = NULL;
    aclrtPtrAttributes a;
    CALL(aclrtMallocWithCfg(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST, NULL));
    CALL(aclrtFree(p));
    aclrtMallocAttribute attr = {.attr = ACL_RT_MEM_ATTR_DEVICE_ID, .value.deviceId = devices - 1};
    aclrtMallocConfig cfg = {&attr, 1};
    CALL(aclrtMallocWithCfg(&p, 4096, ACL_MEM_MALLOC_HUGE_ONLY, &cfg));
    CALL(aclrtPointerGetAttributes(p, &a));
    CHECK(a.location.id == devices - 1 && a.location.type == ACL_MEM_LOCATION_TYPE_DEVICE,
          "allocated on the cfg's device %u: id %u type %d", devices - 1, a.location.id, (int)a.location.type);
    CALL(aclrtFree(p));
    attr.value.deviceId = devices + 4;
    expect(aclrtMallocWithCfg(&p, 4096, ACL_MEM_MALLOC_HUGE_ONLY, &cfg), ACL_ERROR_INVALID_DEVICE,
           "a cfg naming a device the claim has not");
    aclrtMallocConfig broken = {NULL, 2};
    expect(aclrtMallocWithCfg(&p, 4096, ACL_MEM_MALLOC_HUGE_ONLY, &broken), ACL_ERROR_INVALID_PARAM,
           "cfg attrs NULL with numAttrs 2");
    attr = (aclrtMallocAttribute){.attr = (aclrtMallocAttrType)42};
    expect(aclrtMallocWithCfg(&p, 4096, ACL_MEM_MALLOC_HUGE_ONLY, &cfg), ACL_ERROR_INVALID_PARAM, "attr type 42");
    /* a later call on the thread's own device still lands there */
    CALL(aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtPointerGetAttributes(p, &a));
    CHECK(a.location.id == 0, "then again on the thread's device 0: %u", a.location.id);
    CALL(aclrtFree(p));

    void *h = NULL;
    CALL(aclrtMallocHostWithCfg(&h, 8192, NULL));
    CALL(aclrtPointerGetAttributes(h, &a));
    CHECK(a.location.type == ACL_MEM_LOCATION_TYPE_HOST, "aclrtMallocHostWithCfg memory is host memory: %d",
          (int)a.location.type);
    memset(h, 7, 8192); /* it is real host memory */
    CALL(aclrtFreeHost(h));
    expect(aclrtMallocHostWithCfg(NULL, 64, NULL), ACL_ERROR_INVALID_PARAM, "host cfg NULL out");
    int local = 0;
    CALL(aclrtPointerGetAttributes(&local, &a));
    CHECK(a.location.type == ACL_MEM_LOCATION_TYPE_UNREGISTERED, "a stack address is unregistered: %d",
          (int)a.location.type);
    expect(aclrtPointerGetAttributes(NULL, &a), ACL_ERROR_INVALID_PARAM, "attributes of NULL");
}

static void scenario_memory(size_t quota, uint32_t devices)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    malloc_policies();
    mem_attributes(quota);
    with_cfg(devices);
    size_t f, t;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &f, &t));
    CHECK(f == t, "everything was freed: %zu of %zu free", f, t);
    CALL(aclFinalize());
}

static void scenario_peer(void)
{
    int32_t can = -1;
    CALL(aclrtDeviceCanAccessPeer(&can, 0, 1)); /* before aclInit too, from client.conf */
    CHECK(can == 1, "device 0 reaches device 1: %d", can);
    expect(aclrtDeviceCanAccessPeer(&can, 1, 1), ACL_ERROR_INVALID_PARAM, "a device and itself");
    expect(aclrtDeviceCanAccessPeer(&can, 0, 5), ACL_ERROR_INVALID_DEVICE, "a device the claim has not");
    expect(aclrtDeviceCanAccessPeer(NULL, 0, 1), ACL_ERROR_INVALID_PARAM, "into NULL");
    CALL(aclInit(NULL));
    expect(aclrtDeviceEnablePeerAccess(1, 0), ACL_ERROR_INVALID_DEVICE, "enable with no device set");
    CALL(aclrtSetDevice(0));
    CALL(aclrtDeviceEnablePeerAccess(1, 0));
    expect(aclrtDeviceEnablePeerAccess(0, 0), ACL_ERROR_INVALID_PARAM, "enable the current device");
    expect(aclrtDeviceEnablePeerAccess(1, 3), ACL_ERROR_FEATURE_UNSUPPORTED, "enable with flags");
    void *a = NULL, *b = NULL;
    char in[256], out[256] = {0};
    memset(in, 'p', sizeof in);
    CALL(aclrtMalloc(&a, sizeof in, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMemcpy(a, sizeof in, in, sizeof in, ACL_MEMCPY_HOST_TO_DEVICE));
    CALL(aclrtSetDevice(1));
    CALL(aclrtMalloc(&b, sizeof in, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMemcpy(b, sizeof in, a, sizeof in, ACL_MEMCPY_INTER_DEVICE_TO_DEVICE));
    CALL(aclrtMemcpy(out, sizeof out, b, sizeof in, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(memcmp(in, out, sizeof in) == 0, "device 0's data copied to device 1");
    CALL(aclrtDeviceDisablePeerAccess(0));
    CALL(aclrtFree(a));
    CALL(aclrtFree(b));
    CALL(aclFinalize());
}

static void scenario_waits(uint64_t kernel_us)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    aclrtStream s = NULL;
    CALL(aclrtCreateStream(&s));
    aclrtStreamStatus status = ACL_STREAM_STATUS_RESERVED;
    CALL(aclrtStreamQuery(s, &status));
    CHECK(status == ACL_STREAM_STATUS_COMPLETE, "an idle stream is complete: %d", (int)status);
    CALL(aclrtSynchronizeStreamWithTimeout(s, 0));
    aclrtEmulatedKernelArgs k = {.duration_us = kernel_us, .tag = 1};
    CALL(aclrtLaunchKernel(NULL, 1, &k, sizeof k, s));
    CALL(aclrtStreamQuery(s, &status));
    CHECK(status == ACL_STREAM_STATUS_NOT_READY, "a busy stream is not ready: %d", (int)status);
    expect(aclrtSynchronizeStreamWithTimeout(s, 10), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "a 10 ms stream wait");
    expect(aclrtSynchronizeDeviceWithTimeout(10), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "a 10 ms device wait");
    int timeouts = 0, refused = 0;
    for (int i = 0; i < 40; i++) { /* more than the client keeps: the rest are refused, not queued */
        int r = aclrtSynchronizeStreamWithTimeout(s, 0);
        timeouts += r == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
        refused += r == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT && strstr(msg(), "still unanswered") != NULL;
    }
    CHECK(timeouts == 40 && refused > 0, "40 busy waits time out, %d refused as too many", refused);
    /* the session still works while the waits are outstanding, out of order */
    size_t f = 0, tot = 0;
    void *p = NULL;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &f, &tot));
    CALL(aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtFree(p));
    expect(aclrtSynchronizeStreamWithTimeout(s, -7), ACL_ERROR_INVALID_PARAM, "timeout -7");
    expect(aclrtStreamQuery(s, NULL), ACL_ERROR_INVALID_PARAM, "query into NULL");
    CALL(aclrtSynchronizeStreamWithTimeout(s, -1)); /* without limit: the kernel's end */
    CALL(aclrtStreamQuery(s, &status));
    CHECK(status == ACL_STREAM_STATUS_COMPLETE, "complete after the kernel: %d", (int)status);
    CALL(aclrtSynchronizeDeviceWithTimeout(1000));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &f, &tot)); /* the late answers were dropped on the way */

    /* events: a wait is over once the event is recorded */
    aclrtEvent e = NULL;
    aclrtEventWaitStatus ws = ACL_EVENT_WAIT_STATUS_RESERVED;
    CALL(aclrtCreateEvent(&e));
    CALL(aclrtQueryEventWaitStatus(e, &ws));
    CHECK(ws == ACL_EVENT_WAIT_STATUS_NOT_READY, "not recorded: not ready (%d)", (int)ws);
    CALL(aclrtRecordEvent(e, s));
    CALL(aclrtQueryEventWaitStatus(e, &ws));
    CHECK(ws == ACL_EVENT_WAIT_STATUS_COMPLETE, "recorded: complete (%d)", (int)ws);
    CALL(aclrtStreamWaitEventWithTimeout(s, e, 5));
    expect(aclrtStreamWaitEventWithTimeout(s, (aclrtEvent)&ws, 5), ACL_ERROR_INVALID_RESOURCE_HANDLE, "not an event");
    CALL(aclrtDestroyEvent(e));

    /* the frees that synchronize the device first: after the kernel that reads the buffer */
    void *in = NULL, *host = NULL;
    CALL(aclrtMalloc(&in, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMallocHost(&host, 4096));
    aclrtEmulatedKernelArgs reader = {.duration_us = 200000, .tag = 2, .in_ptr = (uint64_t)(uintptr_t)in,
                                      .in_len = 4096};
    CALL(aclrtLaunchKernel(NULL, 1, &reader, sizeof reader, s));
    CALL(aclrtFreeWithDevSync(in));
    CALL(aclrtStreamQuery(s, &status));
    CHECK(status == ACL_STREAM_STATUS_COMPLETE, "the kernel ended before the free returned (%d)", (int)status);
    CALL(aclrtFreeHostWithDevSync(host));
    expect(aclrtFreeWithDevSync(NULL), ACL_ERROR_INVALID_PARAM, "free NULL with sync");
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &f, &tot));
    CHECK(f == tot, "everything freed: %zu of %zu", f, tot);
    CALL(aclrtDestroyStream(s));
    CALL(aclFinalize());
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *s = argc > 1 ? argv[1] : "";
    if (!strcmp(s, "preinit") && argc == 3)
        scenario_preinit((uint32_t)strtoul(argv[2], NULL, 10));
    else if (!strcmp(s, "lasterror"))
        scenario_lasterror();
    else if (!strcmp(s, "memory") && argc == 4)
        scenario_memory(strtoull(argv[2], NULL, 10), (uint32_t)strtoul(argv[3], NULL, 10));
    else if (!strcmp(s, "peer"))
        scenario_peer();
    else if (!strcmp(s, "waits") && argc == 3)
        scenario_waits(strtoull(argv[2], NULL, 10));
    else {
        fprintf(stderr, "usage: acl_semantics preinit <devices> | lasterror | memory <quota> <devices> | peer | waits <us>\n");
        return 2;
    }
    return finish();
}
