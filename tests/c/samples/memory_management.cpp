// memory_management.cpp: the memory calls of the runtime, in the style of the vendor's memory
// management samples: host and device buffers, memset, the four copy kinds synchronously and on a
// stream, memory information before and after, and an allocation the device cannot hold.
// Usage: memory_management <bytes>. Exit status 0 only if every check held.
#include "acl/acl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int g_failed = 0;

static void Check(bool ok, const char *what)
{
    std::printf("[%s] %s%s%s\n", ok ? "INFO" : "ERROR", what, ok ? "" : ": ",
                ok ? "" : (aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "(no message)"));
    g_failed += ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (1u << 20);
    Check(aclInit(nullptr) == ACL_SUCCESS, "acl init");
    Check(aclrtSetDevice(0) == ACL_SUCCESS, "set device 0");
    aclrtStream stream = nullptr;
    Check(aclrtCreateStream(&stream) == ACL_SUCCESS, "create stream");
    size_t freeBefore = 0, total = 0;
    Check(aclrtGetMemInfo(ACL_HBM_MEM, &freeBefore, &total) == ACL_SUCCESS, "memory info");
    std::printf("[INFO] HBM free %zu of %zu bytes\n", freeBefore, total);

    void *hostIn = nullptr, *hostOut = nullptr, *devA = nullptr, *devB = nullptr;
    Check(aclrtMallocHost(&hostIn, size) == ACL_SUCCESS, "malloc host (input)");
    Check(aclrtMallocHost(&hostOut, size) == ACL_SUCCESS, "malloc host (output)");
    Check(aclrtMalloc(&devA, size, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS, "malloc device A");
    Check(aclrtMalloc(&devB, size, ACL_MEM_MALLOC_NORMAL_ONLY) == ACL_SUCCESS, "malloc device B");
    if (g_failed)
        return 1;
    Check(aclrtMemset(hostIn, size, 7, size) == ACL_SUCCESS, "memset host");
    Check(aclrtMemset(devB, size, 0, size) == ACL_SUCCESS, "memset device");
    Check(aclrtMemcpy(devA, size, hostIn, size, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_SUCCESS, "copy host to device");
    Check(aclrtMemcpy(devB, size, devA, size, ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_SUCCESS, "copy device to device");
    Check(aclrtMemcpy(hostOut, size, devB, size, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS, "copy device to host");
    Check(std::memcmp(hostIn, hostOut, size) == 0, "the data came back");

    std::vector<unsigned char> plain(size);
    for (size_t i = 0; i < size; i++)
        plain[i] = static_cast<unsigned char>(i * 31 + 5);
    Check(aclrtMemcpyAsync(devA, size, plain.data(), size, ACL_MEMCPY_HOST_TO_DEVICE, stream) == ACL_SUCCESS,
          "async copy of plain memory to device");
    Check(aclrtMemcpyAsync(hostOut, size, devA, size, ACL_MEMCPY_DEVICE_TO_HOST, stream) == ACL_SUCCESS,
          "async copy back");
    Check(aclrtSynchronizeStream(stream) == ACL_SUCCESS, "synchronize stream");
    Check(std::memcmp(plain.data(), hostOut, size) == 0, "the async data came back");
    Check(aclrtMemcpy(hostIn, size, hostOut, size, ACL_MEMCPY_HOST_TO_HOST) == ACL_SUCCESS, "copy host to host");

    size_t freeHeld = 0;
    Check(aclrtGetMemInfo(ACL_HBM_MEM, &freeHeld, &total) == ACL_SUCCESS, "memory info while held");
    Check(freeHeld + 2 * size <= freeBefore, "both device buffers are charged to the device");
    void *tooBig = nullptr;
    aclError ret = aclrtMalloc(&tooBig, total + 1, ACL_MEM_MALLOC_HUGE_FIRST);
    std::printf("[INFO] an allocation beyond the device: %d\n", static_cast<int>(ret));
    Check(ret == ACL_ERROR_RT_MEMORY_ALLOCATION, "the device refuses more than it has");

    Check(aclrtFree(devA) == ACL_SUCCESS && aclrtFree(devB) == ACL_SUCCESS, "free device");
    Check(aclrtFreeHost(hostIn) == ACL_SUCCESS && aclrtFreeHost(hostOut) == ACL_SUCCESS, "free host");
    size_t freeAfter = 0;
    Check(aclrtGetMemInfo(ACL_HBM_MEM, &freeAfter, &total) == ACL_SUCCESS && freeAfter == freeBefore,
          "everything returned");
    Check(aclrtDestroyStream(stream) == ACL_SUCCESS, "destroy stream");
    Check(aclrtResetDevice(0) == ACL_SUCCESS, "reset device");
    Check(aclFinalize() == ACL_SUCCESS, "acl finalize");
    std::printf("[INFO] %d failed\n", g_failed);
    return g_failed ? 1 : 0;
}
