// cxx_app.cc: a C++ ACL program built against libascendcl's headers (their extern "C" guards and
// enums must work for C++) and linked with -lascendcl. Prints the device count and memory total.
#include <acl/acl.h>
#include <acl/flexnpu_kernel.h>

#include <cstdio>

int main()
{
    if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS)
        return 1;
    uint32_t count = 0;
    size_t free_b = 0, total = 0;
    if (aclrtGetDeviceCount(&count) != ACL_SUCCESS || aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total) != ACL_SUCCESS)
        return 2;
    void *dev = nullptr;
    int over = aclrtMalloc(&dev, total + 1, ACL_MEM_MALLOC_HUGE_FIRST);
    std::printf("val count %u\nval total %zu\nval over %d\n", count, total, over);
    return aclFinalize() == ACL_SUCCESS ? 0 : 3;
}
