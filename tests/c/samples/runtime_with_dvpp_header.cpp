// runtime_with_dvpp_header.cpp: a runtime-only program that includes the media header, as some of
// the vendor's memory samples do (built with -DENABLE_DVPP_INTERFACE, calling no DVPP function):
// the header must compile, and the runtime calls work.
#include "acl/acl.h"
#include "acl/ops/acl_dvpp.h"

#include <cstdio>
#include <cstring>

int main()
{
    if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) {
        std::printf("[ERROR] init: %s\n", aclGetRecentErrMsg());
        return 1;
    }
    uint32_t count = 0;
    aclrtGetDeviceCount(&count);
    const size_t size = 4096;
    void *dev = nullptr;
    char in[size], out[size];
    std::memset(in, 'a', size);
    bool ok = aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS &&
              aclrtMemcpy(dev, size, in, size, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_SUCCESS &&
              aclrtMemcpy(out, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS &&
              std::memcmp(in, out, size) == 0 && aclrtFree(dev) == ACL_SUCCESS;
    std::printf("[INFO] devices %u, pixel format enum YUV420SP = %d, copy %s\n", count,
                static_cast<int>(PIXEL_FORMAT_YUV_SEMIPLANAR_420), ok ? "ok" : "failed");
    return ok && aclFinalize() == ACL_SUCCESS ? 0 : 1;
}
