// hello_world.cpp: the smallest ACL program, in the style of the vendor's "hello world" sample:
// initialise, open a device, a context and a stream, then release them in reverse order. Every
// step prints an [INFO] or [ERROR] line; the exit status is 0 only if all of them succeeded.
#include "acl/acl.h"

#include <cstdio>

#define STEP(call, what)                                                                                         \
    do {                                                                                                         \
        aclError ret_ = (call);                                                                                  \
        if (ret_ != ACL_SUCCESS) {                                                                               \
            std::printf("[ERROR] %s failed, errorCode = %d, %s\n", what, static_cast<int>(ret_),                \
                        aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "");                                      \
            return 1;                                                                                            \
        }                                                                                                        \
        std::printf("[INFO] %s success\n", what);                                                                \
    } while (0)

int main()
{
    int32_t deviceId = 0;
    aclrtContext context = nullptr;
    aclrtStream stream = nullptr;
    STEP(aclInit(nullptr), "acl init");
    STEP(aclrtSetDevice(deviceId), "set device");
    STEP(aclrtCreateContext(&context, deviceId), "create context");
    STEP(aclrtCreateStream(&stream), "create stream");
    aclrtRunMode runMode;
    STEP(aclrtGetRunMode(&runMode), "get run mode");
    std::printf("[INFO] run mode %s, soc %s\n", runMode == ACL_HOST ? "host" : "device", aclrtGetSocName());
    STEP(aclrtSynchronizeStream(stream), "synchronize stream");
    STEP(aclrtDestroyStream(stream), "destroy stream");
    STEP(aclrtDestroyContext(context), "destroy context");
    STEP(aclrtResetDevice(deviceId), "reset device");
    STEP(aclFinalize(), "acl finalize");
    return 0;
}
