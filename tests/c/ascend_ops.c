/*
 * ascend_ops.c: operators and virtual memory on a share whose aclserver runs the ascend backend (issue 24
 * items 3 and 4), as torch_npu calls them: aclopCompileAndExecute with a 0-d host scalar and attributes of
 * every setter kind, aclnn functions with scalars, a strided view and a workspace, an operator the host's
 * CANN refuses (its code and name at the next synchronize), a strided view the single-op path cannot take,
 * a workspace beyond the quota, the virtual-memory calls with an operator across two mapped handles, and a
 * kernel binary loaded, looked up and launched (aclrtBinary*, and libruntime.so's rt* stubs).
 * Run against tests/c/cann_emulator.c as the host's CANN (test_backend_ascend_ops.py reads its call log).
 */
#include "check.h"

#include <acl/acl.h>
#include <acl/acl_op_compiler.h>
#include <acl/flexnpu_op.h>
#include <aclnn/aclnn_base.h>
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_cat.h>
#include <aclnnop/aclnn_matmul.h>

#include <math.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#define N 4

static aclrtStream stream;

static void *device(const float *host, size_t n)
{
    void *p = NULL;
    CALL(aclrtMalloc(&p, n * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    if (host)
        CALL(aclrtMemcpy(p, n * sizeof(float), host, n * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE));
    return p;
}

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

#define LAUNCH(fn, ...)                                                                                          \
    do {                                                                                                         \
        uint64_t ws = 0;                                                                                         \
        aclOpExecutor *ex = NULL;                                                                                \
        CALL(fn##GetWorkspaceSize(__VA_ARGS__, &ws, &ex));                                                       \
        CALL(fn(NULL, ws, ex, stream));                                                                          \
    } while (0)

static int aclop(void)
{
    float a[N * N], b[N * N], out[N * N];
    for (int i = 0; i < N * N; i++) {
        a[i] = (float)i;
        b[i] = (float)(i % 3) - 1.0f;
    }
    void *da = device(a, N * N), *db = device(b, N * N), *dout = device(NULL, N * N);
    int64_t dims[2] = {N, N};
    aclTensorDesc *d2 = aclCreateTensorDesc(ACL_FLOAT, 2, dims, ACL_FORMAT_ND);
    aclTensorDesc *scalar = aclCreateTensorDesc(ACL_FLOAT, 0, NULL, ACL_FORMAT_ND);
    CALL(aclSetTensorPlaceMent(scalar, ACL_MEMTYPE_HOST));
    float one = 1.0f;
    aclDataBuffer *ba = aclCreateDataBuffer(da, sizeof a), *bb = aclCreateDataBuffer(db, sizeof b);
    aclDataBuffer *bout = aclCreateDataBuffer(dout, sizeof out), *bone = aclCreateDataBuffer(&one, sizeof one);

    /* Add(a, 1): the scalar is host memory, by value */
    const aclTensorDesc *add_in[2] = {d2, scalar};
    const aclDataBuffer *add_buf[2] = {ba, bone};
    const aclTensorDesc *outs[1] = {d2};
    aclDataBuffer *out_buf[1] = {bout};
    CALL(aclopCompileAndExecute("Add", 2, add_in, add_buf, 1, outs, out_buf, NULL, ACL_ENGINE_SYS, ACL_COMPILE_SYS,
                                NULL, stream));
    read_back(out, dout, N * N);
    int good = 1;
    for (int i = 0; i < N * N; i++)
        good &= out[i] == a[i] + 1.0f;
    CHECK(good, "Add(a, host scalar 1) computed by the host's CANN");

    /* MatMul(a, b^T) with transpose_x2, and one attribute of every other setter (they reach CANN as set) */
    aclopAttr *mm = aclopCreateAttr();
    CALL(aclopSetAttrBool(mm, "transpose_x1", 0));
    CALL(aclopSetAttrBool(mm, "transpose_x2", 1));
    CALL(aclopSetAttrInt(mm, "offset_x", 7));
    CALL(aclopSetAttrFloat(mm, "alpha", 0.5f));
    CALL(aclopSetAttrString(mm, "mode", "high"));
    CALL(aclopSetAttrDataType(mm, "dst_type", ACL_FLOAT16));
    int64_t axes[2] = {-1, 0};
    CALL(aclopSetAttrListInt(mm, "axes", 2, axes));
    float scales[3] = {2.5f, 1, 1};
    CALL(aclopSetAttrListFloat(mm, "scales", 3, scales));
    uint8_t flags[1] = {1};
    CALL(aclopSetAttrListBool(mm, "flags", 1, flags));
    aclDataType types[2] = {ACL_INT64, ACL_FLOAT};
    CALL(aclopSetAttrListDataType(mm, "types", 2, types));
    const char *names[2] = {"x", "y"};
    CALL(aclopSetAttrListString(mm, "names", 2, names));
    int64_t r0[3] = {3, 1, 2}, r1[1] = {4};
    const int64_t *rows[2] = {r0, r1};
    int counts[2] = {3, 1};
    CALL(aclopSetAttrListListInt(mm, "pads", 2, counts, rows));
    const aclTensorDesc *mm_in[2] = {d2, d2};
    const aclDataBuffer *mm_buf[2] = {ba, bb};
    CALL(aclopCompileAndExecute("MatMul", 2, mm_in, mm_buf, 1, outs, out_buf, mm, ACL_ENGINE_SYS, ACL_COMPILE_SYS,
                                NULL, stream));
    read_back(out, dout, N * N);
    good = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float want = 0;
            for (int k = 0; k < N; k++)
                want += a[i * N + k] * b[j * N + k];
            good &= fabsf(out[i * N + j] - want) < 1e-4f;
        }
    CHECK(good, "MatMul(a, b, transpose_x2) computed by the host's CANN");

    /* MatMul with its optional bias left out (fx_op_launch, as the aclnn library and torch_npu send one) */
    fxTensor x = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 2, dims, NULL, 0, da, sizeof a};
    fxTensor w = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 2, dims, NULL, 0, db, sizeof b};
    fxTensor y = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 2, dims, NULL, 0, dout, sizeof out};
    fxTensor no_bias = {FX_TENSOR_ABSENT, ACL_FLOAT, ACL_FORMAT_ND, 0, NULL, NULL, 0, NULL, 0};
    fxTensor with_bias[3] = {x, w, no_bias};
    CALL(fx_op_launch("MatMul", 3, with_bias, 1, &y, mm, stream));
    read_back(out, dout, N * N);
    CHECK(fabsf(out[5] - (a[4] * b[4] + a[5] * b[5] + a[6] * b[6] + a[7] * b[7])) < 1e-4f,
          "MatMul with an absent bias: %g", (double)out[5]);

    /* an operator the host's CANN has no kernel for: its code and name at the next synchronize */
    CALL(aclopCompileAndExecute("NoSuchOp", 2, mm_in, mm_buf, 1, outs, out_buf, NULL, ACL_ENGINE_SYS,
                                ACL_COMPILE_SYS, NULL, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == 100024 && strstr(msg(), "NoSuchOp") && strstr(msg(), "EZ3003"), "the refused op: %d %s", rc, msg());
    printf("val refused_code %d\n", rc);

    /* a strided view: CANN's single-operator descriptors have no strides */
    int64_t half[2] = {N / 2, N}, strides[2] = {2 * N, 1};
    fxTensor view = {FX_TENSOR_DEVICE, ACL_FLOAT, ACL_FORMAT_ND, 2, half, strides, N, dout, sizeof out};
    CALL(fx_op_launch("OnesLike", 1, &view, 1, &view, NULL, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == ACL_ERROR_INVALID_PARAM && strstr(msg(), "strided"), "a strided view: %d %s", rc, msg());

    /* the stream goes on */
    CALL(aclopCompileAndExecute("Add", 2, add_in, add_buf, 1, outs, out_buf, NULL, ACL_ENGINE_SYS, ACL_COMPILE_SYS,
                                NULL, stream));
    read_back(out, dout, N * N);
    CHECK(out[5] == 6.0f, "the stream still runs: a[5] + 1 = %g", (double)out[5]);

    aclopDestroyAttr(mm);
    aclDestroyDataBuffer(ba), aclDestroyDataBuffer(bb), aclDestroyDataBuffer(bout), aclDestroyDataBuffer(bone);
    aclDestroyTensorDesc(d2), aclDestroyTensorDesc(scalar);
    CALL(aclrtFree(da));
    CALL(aclrtFree(db));
    CALL(aclrtFree(dout));
    return 0;
}

static int aclnn(void)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, got[6];
    int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d22[2] = {2, 2};
    void *da = device(a, 6), *dout = device(NULL, 6), *dmm = device(NULL, 4);
    aclTensor *ta = tensor(da, 2, d23), *tout = tensor(dout, 2, d23), *tmm = tensor(dmm, 2, d22);

    /* x + 2.5 * 2: aclnnAdds with a float and an int scalar; the host's CANN asks for a workspace */
    float two_half = 2.5f;
    int64_t two = 2;
    aclScalar *other = aclCreateScalar(&two_half, ACL_FLOAT), *alpha = aclCreateScalar(&two, ACL_INT64);
    LAUNCH(aclnnAdds, ta, other, alpha, tout);
    read_back(got, dout, 6);
    int good = 1;
    for (int i = 0; i < 6; i++)
        good &= got[i] == a[i] + 5.0f;
    CHECK(good, "aclnnAdds(a, 2.5, alpha 2) = a + 5 by the host's CANN");

    /* a @ a^T with mat2 a transposed view of a's storage (strides (1, 3)) */
    int64_t tstrides[2] = {1, 3}, six = 6;
    aclTensor *at = aclCreateTensor(d32, 2, ACL_FLOAT, tstrides, 0, ACL_FORMAT_ND, &six, 1, da);
    LAUNCH(aclnnMatmul, ta, at, tmm, (int8_t)1);
    read_back(got, dmm, 4);
    CHECK(got[0] == 14 && got[1] == 32 && got[2] == 32 && got[3] == 77, "aclnnMatmul(a, a^T) = [[14, 32], [32, 77]]");

    /* cat of a tensor list along dim 0 into [4, 3] */
    int64_t d43[2] = {4, 3};
    void *dcat = device(NULL, 12);
    aclTensor *t43 = tensor(dcat, 2, d43);
    const aclTensor *pair[2] = {ta, ta};
    aclTensorList *list = aclCreateTensorList(pair, 2);
    LAUNCH(aclnnCat, list, (int64_t)0, t43);
    float cat[12];
    read_back(cat, dcat, 12);
    CHECK(!memcmp(cat, a, sizeof a) && !memcmp(cat + 6, a, sizeof a), "aclnnCat([a, a], 0) by the host's CANN");
    aclDestroyTensorList(list);
    aclDestroyTensor(t43);
    CALL(aclrtFree(dcat));

    /* shapes the host's CANN refuses: its code (161002) at the next synchronize, naming the function */
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CALL(aclnnMatmulGetWorkspaceSize(ta, ta, tmm, 0, &ws, &ex));
    CALL(aclnnMatmul(NULL, ws, ex, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == 161002 && strstr(msg(), "aclnnMatmul") && strstr(msg(), "[2, 3] and [2, 3]"), "refused: %d %s", rc,
          msg());
    printf("val aclnn_refused_code %d\n", rc);

    /* a workspace the quota cannot hold: 207001 naming it; then, with room again, it runs */
    size_t free_b = 0, total = 0;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
    void *filler = NULL;
    CALL(aclrtMalloc(&filler, free_b - 1024, ACL_MEM_MALLOC_HUGE_FIRST));
    LAUNCH(aclnnAdds, ta, other, alpha, tout);
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == ACL_ERROR_RT_MEMORY_ALLOCATION && strstr(msg(), "aclnnAdds") && strstr(msg(), "workspace"),
          "a workspace beyond the quota: %d %s", rc, msg());
    printf("val workspace_code %d\n", rc);
    CALL(aclrtFree(filler));
    CALL(aclrtMemset(dout, sizeof got, 0, sizeof got));
    LAUNCH(aclnnAdds, ta, other, alpha, tout);
    read_back(got, dout, 6);
    CHECK(got[5] == 11.0f, "with room, the workspace is allocated: a[5] + 5 = %g", (double)got[5]);
    size_t after = 0;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &after, &total));
    CHECK(after == free_b, "the workspace was returned to the quota: free %zu, before %zu", after, free_b);

    aclDestroyScalar(other), aclDestroyScalar(alpha);
    aclDestroyTensor(ta), aclDestroyTensor(tout), aclDestroyTensor(tmm), aclDestroyTensor(at);
    CALL(aclrtFree(da));
    CALL(aclrtFree(dout));
    CALL(aclrtFree(dmm));
    return 0;
}

static int vmm(void)
{
    size_t free0 = 0, total = 0, free1 = 0;
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));
    void *va = NULL;
    CALL(aclrtReserveMemAddress(&va, 8u << 20, 0, NULL, 0));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free1 == free0, "a reserved range is not charged: free %zu -> %zu", free0, free1);
    aclrtPhysicalMemProp prop = {0};
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    size_t gran = 0;
    CALL(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &gran));
    aclrtDrvMemHandle h1 = NULL, h2 = NULL;
    CALL(aclrtMallocPhysical(&h1, gran, &prop, 0));
    CALL(aclrtMallocPhysical(&h2, gran, &prop, 0));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free0 - free1 == 2 * gran, "two physical handles are charged: %zu bytes", free0 - free1);
    printf("val vmm_charged %zu\n", free0 - free1);
    CALL(aclrtMapMem(va, gran, 0, h1, 0));
    CALL(aclrtMapMem((char *)va + gran, gran, 0, h2, 0));
    static float across[1024], back[1024];
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
    CALL(aclrtMemcpy(back, sizeof back, mid, sizeof back, ACL_MEMCPY_DEVICE_TO_HOST));
    int good = 1;
    for (int i = 0; i < 1024; i++)
        good &= back[i] == (float)i + 2.0f;
    CHECK(good, "Add by the host's CANN over a tensor that spans two mapped handles");
    CHECK(aclrtReleaseMemAddress(va) == ACL_ERROR_INVALID_PARAM, "release with mappings: %s", msg());
    aclrtDrvMemHandle huge = NULL;
    CHECK(aclrtMallocPhysical(&huge, total, &prop, 0) == ACL_ERROR_RT_MEMORY_ALLOCATION,
          "a handle beyond the quota: %s", msg());
    CALL(aclrtUnmapMem(va));
    CALL(aclrtUnmapMem((char *)va + gran));
    CALL(aclrtFreePhysical(h1));
    CALL(aclrtFreePhysical(h2));
    CALL(aclrtReleaseMemAddress(va));
    CALL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free1 == free0, "all of it returned: free %zu -> %zu", free0, free1);
    /* left mapped at exit: the aclserver unmaps, frees and releases it when the session closes */
    CALL(aclrtReserveMemAddress(&va, 4u << 20, 0, NULL, 0));
    CALL(aclrtMallocPhysical(&h1, gran, &prop, 0));
    CALL(aclrtMapMem(va, gran, 0, h1, 0));
    return 0;
}

/* libruntime.so's entry points (CANN's rt headers; a framework declares them itself) */
typedef struct {
    uint32_t magic;
    uint32_t version;
    const void *data;
    uint64_t length;
} rtDevBinary_t;
int32_t rtDevBinaryRegister(const rtDevBinary_t *bin, void **hdl);
int32_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName, const void *kernelInfoExt,
                           uint32_t funcMode);
int32_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize, void *smDesc,
                       void *stm);

static const char binary[] = "EMUKBIN\nfill_u32\nunused\n";

struct fill_args {
    uint64_t ptr;
    uint32_t count, value;
};

static int all(const uint32_t *w, int n, uint32_t v)
{
    for (int i = 0; i < n; i++)
        if (w[i] != v)
            return 0;
    return 1;
}

/* a kernel binary loaded once, its function looked up, launched with arguments by value */
static int kernels(void)
{
    static uint32_t got[256];
    void *buf = NULL;
    CALL(aclrtMalloc(&buf, sizeof got, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtBinHandle bin = NULL;
    CALL(aclrtBinaryLoadFromData(binary, sizeof binary - 1, NULL, &bin));
    aclrtFuncHandle fill = NULL, none = NULL;
    CALL(aclrtBinaryGetFunction(bin, "fill_u32", &fill));
    rc = aclrtBinaryGetFunction(bin, "missing", &none);
    CHECK(rc == 107000 && strstr(msg(), "missing"), "a kernel the binary lacks: %d %s", rc, msg());
    struct fill_args a = {(uint64_t)(uintptr_t)buf, 256, 0xABCD1234u};
    CALL(aclrtLaunchKernel(fill, 8, &a, sizeof a, stream));
    CALL(aclrtSynchronizeStream(stream));
    CALL(aclrtMemcpy(got, sizeof got, buf, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(all(got, 256, 0xABCD1234u), "fill_u32 ran on the host's CANN with its arguments by value");
    /* a kernel fault (a pointer outside device memory) is the stream's error, CANN's code */
    struct fill_args bad = {8, 4, 1};
    CALL(aclrtLaunchKernel(fill, 1, &bad, sizeof bad, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == 507015 && strstr(msg(), "fill_u32"), "a kernel fault: %d %s", rc, msg());
    printf("val kernel_fault %d\n", rc);
    a.value = 5;
    CALL(aclrtLaunchKernelV2(fill, 2, &a, sizeof a, NULL, stream));
    a.value = 6;
    CALL(aclrtLaunchKernelWithHostArgs(fill, 3, stream, NULL, &a, sizeof a, NULL, 0));
    CALL(aclrtSynchronizeStream(stream));
    CALL(aclrtMemcpy(got, sizeof got, buf, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(all(got, 256, 6), "aclrtLaunchKernelV2 then aclrtLaunchKernelWithHostArgs ran, in stream order");
    CALL(aclrtBinaryUnLoad(bin));
    rc = aclrtLaunchKernel(fill, 1, &a, sizeof a, stream);
    CHECK(rc == ACL_ERROR_INVALID_PARAM, "a function of an unloaded binary: %d %s", rc, msg());

    /* from a file (its bytes shipped the same way) */
    char path[] = "/tmp/flexnpu-kbin-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, binary, sizeof binary - 1) == (ssize_t)(sizeof binary - 1), "a binary file");
    close(fd);
    CALL(aclrtBinaryLoadFromFile(path, NULL, &bin));
    unlink(path);
    CALL(aclrtBinaryUnLoad(bin));

    /* through libruntime.so, as a framework's generated kernel stubs launch */
    static const char stub = 0; /* any address the program launches the kernel by */
    rtDevBinary_t dev = {0x43554245u, 1, binary, sizeof binary - 1};
    void *handle = NULL;
    CALL(rtDevBinaryRegister(&dev, &handle));
    CALL(rtFunctionRegister(handle, &stub, "fill_stub", "fill_u32", 0));
    a.value = 77;
    CALL(rtKernelLaunch(&stub, 4, &a, sizeof a, NULL, stream));
    CALL(aclrtSynchronizeStream(stream));
    CALL(aclrtMemcpy(got, sizeof got, buf, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(all(got, 256, 77), "rtKernelLaunch of a registered stub ran fill_u32");
    CHECK(rtKernelLaunch(&got, 4, &a, sizeof a, NULL, stream) == 107000, "an unregistered stub is refused");
    CALL(aclrtFree(buf));
    return 0;
}

/* a binary larger than the claim's hostMemory: refused while it is shipped, naming the limit; a small one
 * loads afterwards (the refused one's bytes were returned) */
static int kernels_big(size_t size)
{
    char *big = calloc(1, size);
    CHECK(big != NULL, "a %zu-byte binary", size);
    memcpy(big, binary, sizeof binary - 1);
    aclrtBinHandle bin = NULL;
    rc = aclrtBinaryLoadFromData(big, size, NULL, &bin);
    CHECK(rc == ACL_ERROR_RT_MEMORY_ALLOCATION && strstr(msg(), "hostMemory"), "over hostMemory: %d %s", rc, msg());
    printf("val big_load %d\n", rc);
    free(big);
    CALL(aclrtBinaryLoadFromData(binary, sizeof binary - 1, NULL, &bin));
    CALL(aclrtBinaryUnLoad(bin));
    return 0;
}

/* the emulated backend: a clear ACL error */
static int kernels_emulated(void)
{
    aclrtBinHandle bin = NULL;
    rc = aclrtBinaryLoadFromData(binary, sizeof binary - 1, NULL, &bin);
    CHECK(rc == ACL_ERROR_API_NOT_SUPPORT && strstr(msg(), "ascend backend") && !bin, "emulated: %d %s", rc, msg());
    printf("val emulated_load %d\n", rc);
    rtDevBinary_t dev = {0x43554245u, 1, binary, sizeof binary - 1};
    void *handle = NULL;
    rc = rtDevBinaryRegister(&dev, &handle);
    CHECK(rc == ACL_ERROR_API_NOT_SUPPORT, "emulated, through libruntime.so: %d", rc);
    return 0;
}

int main(int argc, char **argv)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    CALL(aclnnInit(NULL));
    CALL(aclrtCreateStream(&stream));
    const char *part = argc > 1 ? argv[1] : "all";
    if (!strcmp(part, "all") || !strcmp(part, "aclop"))
        aclop();
    if (!strcmp(part, "all") || !strcmp(part, "aclnn"))
        aclnn();
    if (!strcmp(part, "all") || !strcmp(part, "vmm"))
        vmm();
    if (!strcmp(part, "all") || !strcmp(part, "kernels"))
        kernels();
    if (!strcmp(part, "kernels-emulated"))
        kernels_emulated();
    if (!strcmp(part, "kernels-big") && argc > 2)
        kernels_big((size_t)strtoull(argv[2], NULL, 10));
    return finish(); /* no finalize: the session's close releases what is left */
}
