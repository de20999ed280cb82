/*
 * aclnn_helpers.h: what the C test programs calling aclnn functions share (aclnn_launch.c, ascend_ops.c):
 * a synchronized read-back, a contiguous float32 aclTensor over a whole storage (as torch_npu makes one), and
 * LAUNCH: GetWorkspaceSize then the launch on the program's stream. Include after check.h, the aclnn headers
 * and the program's `static aclrtStream stream;`.
 */
#ifndef FLEXNPU_TESTS_ACLNN_HELPERS_H_
#define FLEXNPU_TESTS_ACLNN_HELPERS_H_

static void read_back(float *host, const void *dev, size_t n)
{
    CALL(aclrtSynchronizeStream(stream));
    CALL(aclrtMemcpy(host, n * sizeof(float), dev, n * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST));
}

static aclTensor *tensor(void *data, int ndim, const int64_t *dims)
{
    int64_t strides[8], n = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        strides[k] = n;
        n *= dims[k];
    }
    return aclCreateTensor(dims, (uint64_t)ndim, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, &n, 1, data);
}

/* ws starts non-zero: the function must write it */
#define LAUNCH(fn, ...)                                                                                          \
    do {                                                                                                         \
        uint64_t ws = 1;                                                                                         \
        aclOpExecutor *ex = NULL;                                                                                \
        CALL(fn##GetWorkspaceSize(__VA_ARGS__, &ws, &ex));                                                       \
        CALL(fn(NULL, ws, ex, stream));                                                                          \
    } while (0)

#endif
