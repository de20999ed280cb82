/*
 * op_launch.c: single operators on a share (issue 24 item 3), as torch_npu sends them without
 * libopapi.so: aclopCompileAndExecute with tensor descriptors, a 0-d host-resident scalar, op
 * attributes, on an asynchronous stream; the results are read back after a synchronize. Then an
 * unknown operator: its launch succeeds, the next synchronize returns the stream's error naming it,
 * and the stream keeps working. fx_op_launch (acl/flexnpu_op.h) with a strided view of device memory.
 */
#include "check.h"

#include <acl/acl.h>
#include <acl/acl_op_compiler.h>
#include <acl/flexnpu_op.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 4

static void *device_copy(const float *host, size_t n)
{
    void *p = NULL;
    CALL(aclrtMalloc(&p, n * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    if (host)
        CALL(aclrtMemcpy(p, n * sizeof(float), host, n * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE));
    return p;
}

static void read_back(float *host, const void *dev, size_t n)
{
    CALL(aclrtMemcpy(host, n * sizeof(float), dev, n * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST));
}

/* n operators launched on one stream with no synchronize between them (more than the aclserver queues
 * per session: the later launches wait for room, none is dropped), then one synchronize. */
static int flood(int n)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    aclrtStream stream = NULL;
    CALL(aclrtCreateStream(&stream));
    void *acc = NULL;
    CALL(aclrtMalloc(&acc, sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(aclrtMemset(acc, sizeof(float), 0, sizeof(float)));
    int64_t one_dim[1] = {1};
    float one = 1.0f;
    fxTensor x = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 1, one_dim, NULL, 0, acc, sizeof(float)};
    fxTensor y = {FX_TENSOR_HOST, ACL_FLOAT, ACL_FORMAT_ND, 0, NULL, NULL, 0, &one, sizeof one};
    fxTensor in[2] = {x, y};
    int launched = 0;
    for (int i = 0; i < n; i++)
        launched += fx_op_launch("Add", 2, in, 1, &x, NULL, stream) == ACL_SUCCESS;
    CHECK(launched == n, "%d of %d launches accepted", launched, n);
    CALL(aclrtSynchronizeStream(stream));
    float got = 0;
    CALL(aclrtMemcpy(&got, sizeof got, acc, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(got == (float)n, "every operator ran once, in order: %.0f of %d", (double)got, n);
    printf("val flood_sum %.0f\n", (double)got);
    CALL(aclrtDestroyStream(stream));
    CALL(aclFinalize());
    return finish();
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "flood") == 0)
        return flood(atoi(argv[2]));
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    aclrtContext ctx = NULL;
    CALL(aclrtGetCurrentContext(&ctx));
    CHECK(ctx != NULL, "aclrtSetDevice made the device's default context current");
    /* torch_npu's start-up calls, each answered as CANN does on an A2 die (startup.c) */
    int32_t attr = -1;
    CALL(aclGetCannAttribute(ACL_CANN_ATTR_INF_NAN, &attr));
    CHECK(attr == 1, "INF_NAN mode is supported: %d", attr);
    CALL(aclSetCompileopt(ACL_OP_JIT_COMPILE, "disable"));
    char opt[16] = "";
    CALL(aclGetCompileopt(ACL_OP_JIT_COMPILE, opt, sizeof opt));
    CHECK(strcmp(opt, "disable") == 0, "a compile option is kept: %s", opt);
    int64_t det = -1;
    CALL(aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1));
    CALL(aclrtCtxGetSysParamOpt(ACL_OPT_DETERMINISTIC, &det));
    CHECK(det == 1, "the context's deterministic option is kept: %lld", (long long)det);
    CALL(aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, &det));
    uint64_t granted = 0;
    CALL(aclrtSetOpExecuteTimeOutV2(1800000, &granted));
    CHECK(granted == 1800000, "the operator timeout asked for is granted: %llu", (unsigned long long)granted);
    aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE;
    aclmdlRI ri = (aclmdlRI)&status;
    CALL(aclmdlRICaptureGetInfo(NULL, &status, &ri));
    CHECK(status == ACL_MODEL_RI_CAPTURE_STATUS_NONE && ri == NULL, "no capture: status %d", (int)status);
    CHECK(aclGetCannAttribute((aclCannAttr)99, &attr) == ACL_ERROR_INVALID_PARAM, "an unknown attribute: %s", msg());

    aclrtStream stream = NULL;
    CALL(aclrtCreateStreamWithConfig(&stream, 0, 3));
    CALL(aclrtSetStreamFailureMode(stream, 1));

    float a[N * N], b[N * N], out[N * N];
    for (int i = 0; i < N * N; i++) {
        a[i] = (float)i;
        b[i] = (float)(i % 3) - 1.0f;
    }
    void *da = device_copy(a, N * N), *db = device_copy(b, N * N), *dout = device_copy(NULL, N * N);
    int64_t dims[2] = {N, N};
    aclTensorDesc *d2 = aclCreateTensorDesc(ACL_FLOAT, 2, dims, ACL_FORMAT_ND);
    aclTensorDesc *scalar = aclCreateTensorDesc(ACL_FLOAT, 0, NULL, ACL_FORMAT_ND);
    CALL(aclSetTensorPlaceMent(scalar, ACL_MEMTYPE_HOST_COMPILE_INDEPENDENT));
    float one = 1.0f;
    aclDataBuffer *ba = aclCreateDataBuffer(da, sizeof a), *bb = aclCreateDataBuffer(db, sizeof b);
    aclDataBuffer *bout = aclCreateDataBuffer(dout, sizeof out), *bone = aclCreateDataBuffer(&one, sizeof one);

    /* Add(a, 1) */
    const aclTensorDesc *add_in[2] = {d2, scalar};
    const aclDataBuffer *add_buf[2] = {ba, bone};
    const aclTensorDesc *outs[1] = {d2};
    aclDataBuffer *out_buf[1] = {bout};
    aclopAttr *none = aclopCreateAttr();
    CALL(aclopCompileAndExecute("Add", 2, add_in, add_buf, 1, outs, out_buf, none, ACL_ENGINE_SYS,
                                ACL_COMPILE_SYS, NULL, stream));
    CALL(aclrtSynchronizeStream(stream));
    read_back(out, dout, N * N);
    int good = 1;
    for (int i = 0; i < N * N; i++)
        good &= out[i] == a[i] + 1.0f;
    CHECK(good, "Add(a, host scalar 1) computed on the share");

    /* MatMul(a, b^T) with transpose_x2 */
    aclopAttr *mm = aclopCreateAttr();
    CALL(aclopSetAttrBool(mm, "transpose_x1", 0));
    CALL(aclopSetAttrBool(mm, "transpose_x2", 1));
    const aclTensorDesc *mm_in[2] = {d2, d2};
    const aclDataBuffer *mm_buf[2] = {ba, bb};
    CALL(aclopCompileAndExecute("MatMul", 2, mm_in, mm_buf, 1, outs, out_buf, mm, ACL_ENGINE_SYS, ACL_COMPILE_SYS,
                                NULL, stream));
    CALL(aclrtSynchronizeStream(stream));
    read_back(out, dout, N * N);
    good = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float want = 0;
            for (int k = 0; k < N; k++)
                want += a[i * N + k] * b[j * N + k];
            good &= fabsf(out[i * N + j] - want) < 1e-4f;
        }
    CHECK(good, "MatMul(a, b, transpose_x2) computed on the share");

    /* an unknown operator: launched, then the stream's error at the synchronize, naming it */
    CALL(aclopCompileAndExecute("NoSuchOp", 2, mm_in, mm_buf, 1, outs, out_buf, NULL, ACL_ENGINE_SYS,
                                ACL_COMPILE_SYS, NULL, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == 100024 && strstr(msg(), "NoSuchOp"), "the unknown op's stream error: %d %s", rc, msg());
    printf("val unknown_code %d\n", rc);

    /* the stream goes on: OnesLike through fx_op_launch on a strided view (every other row) */
    int64_t half[2] = {N / 2, N}, strides[2] = {2 * N, 1};
    fxTensor view = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 2, half, strides, N, dout, sizeof out};
    CALL(aclrtMemset(dout, sizeof out, 0, sizeof out));
    CALL(fx_op_launch("OnesLike", 1, &view, 1, &view, NULL, stream));
    CALL(aclrtSynchronizeStream(stream));
    read_back(out, dout, N * N);
    good = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            good &= out[i * N + j] == (i % 2 == 1 ? 1.0f : 0.0f);
    CHECK(good, "OnesLike wrote exactly rows 1 and 3 (offset %d, row stride %d)", N, 2 * N);

    /* a view beyond its buffer is the stream's error, naming the operand */
    int64_t big[2] = {N, 2 * N};
    fxTensor over = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 2, big, NULL, 0, dout, sizeof out};
    CALL(fx_op_launch("OnesLike", 1, &over, 1, &over, NULL, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == ACL_ERROR_INVALID_PARAM && strstr(msg(), "OnesLike"), "a view past its buffer: %d %s", rc, msg());
    CHECK(fx_op_launch(NULL, 0, NULL, 0, NULL, NULL, stream) == ACL_ERROR_INVALID_PARAM, "a NULL op name: %s",
          msg());

    /* virtual memory (torch's expandable segments): a reserved range is free, mapped handles are charged */
    size_t free0 = 0, total = 0, free1 = 0;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));
    void *va = NULL;
    CALL(aclrtReserveMemAddress(&va, 8u << 20, 0, NULL, 0));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free1 == free0, "a reserved range is not charged: free %zu -> %zu", free0, free1);
    aclrtPhysicalMemProp prop = {0};
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CALL(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &gran));
    aclrtDrvMemHandle h1 = NULL, h2 = NULL;
    CALL(aclrtMallocPhysical(&h1, gran, &prop, 0));
    CALL(aclrtMallocPhysical(&h2, gran, &prop, 0));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free0 - free1 == 2 * gran, "two physical handles are charged: %zu bytes", free0 - free1);
    CALL(aclrtMapMem(va, gran, 0, h1, 0));
    CALL(aclrtMapMem((char *)va + gran, gran, 0, h2, 0));
    CHECK(aclrtMapMem((char *)va + gran / 2, gran, 0, h2, 0) == ACL_ERROR_INVALID_PARAM, "an overlap: %s", msg());
    /* a copy and an operator across the two handles' boundary */
    static float across[1024];
    for (int i = 0; i < 1024; i++)
        across[i] = (float)i;
    char *mid = (char *)va + gran - 512 * sizeof(float);
    CALL(aclrtMemcpy(mid, sizeof across, across, sizeof across, ACL_MEMCPY_HOST_TO_DEVICE));
    int64_t n1024[1] = {1024};
    fxTensor span = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 1, n1024, NULL, 0, mid, 0};
    float two = 2.0f;
    fxTensor two_t = {FX_TENSOR_HOST, ACL_FLOAT, ACL_FORMAT_ND, 0, NULL, NULL, 0, &two, sizeof two};
    fxTensor span_in[2] = {span, two_t};
    CALL(fx_op_launch("Add", 2, span_in, 1, &span, NULL, stream));
    CALL(aclrtSynchronizeStream(stream));
    static float back[1024];
    CALL(aclrtMemcpy(back, sizeof back, mid, sizeof back, ACL_MEMCPY_DEVICE_TO_HOST));
    good = 1;
    for (int i = 0; i < 1024; i++)
        good &= back[i] == (float)i + 2.0f;
    CHECK(good, "Add over a tensor that spans two mapped handles");
    CHECK(aclrtReleaseMemAddress(va) == ACL_ERROR_INVALID_PARAM, "release with mappings: %s", msg());
    CHECK(aclrtFreePhysical(h1) == ACL_ERROR_INVALID_PARAM, "free of a mapped handle: %s", msg());
    aclrtDrvMemHandle huge = NULL;
    CHECK(aclrtMallocPhysical(&huge, total, &prop, 0) == ACL_ERROR_RT_MEMORY_ALLOCATION, "a handle beyond the quota: %s",
          msg());
    CALL(aclrtUnmapMem(va));
    CALL(aclrtUnmapMem((char *)va + gran));
    CALL(aclrtFreePhysical(h1));
    CALL(aclrtFreePhysical(h2));
    CALL(aclrtReleaseMemAddress(va));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free1 == free0, "all of it returned: free %zu -> %zu", free0, free1);

    aclopDestroyAttr(mm);
    aclopDestroyAttr(none);
    CALL(aclrtDestroyStream(stream));
    CALL(aclrtResetDevice(0));
    CALL(aclFinalize());
    return finish();
}
