/*
 * cann_emulator.c: an ABI-compatible stand-in for CANN's libascendcl.so on a machine without an
 * NPU, for the aclserver's ascend backend (flexnpu_runtime/aclserver/backend_ascend.py). Device memory
 * is host RAM; every call is counted; a call can be made to fail with a given code.
 *
 * Environment: FLEXNPU_EMU_DEVICES (default 2), FLEXNPU_EMU_MEMORY (bytes per device, default
 * 1 GiB). Test hooks (not ACL): emu_calls(name) -> count, emu_fail_next(name, code),
 * emu_allocated(device) -> bytes, emu_current_device() -> the calling thread's device,
 * emu_last_batch() -> the batch of the last aclmdlSetDynamicBatchSize.
 *
 * Streams, single operators, aclnn functions, virtual memory and kernel binaries: cann_emulator_ops.c (included
 * at the end), which logs every launch to emu_op_log() and to the file FLEXNPU_EMU_LOG names (the emulator then
 * lives in another process: an aclserver's); emu_streams() -> live streams.
 *
 * Models (the aclmdl entry points the ascend backend forwards to): the bytes are a model of
 * FlexNPU's emulated format (docs/model-format.md), of which this reads only what CANN's
 * description calls answer; an execution copies input a of each output into it (every op is a
 * copy here; of a model with batch gears, only the set batch's part), from and to emulated
 * device memory.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_ALLOCS 4096
#define NCALLS 64
#define MAX_MODELS 64
#define MAX_T 64

static const char *names[NCALLS] = {"aclInit",         "aclFinalize",  "aclrtSetDevice", "aclrtResetDevice",
                                    "aclrtGetDeviceCount", "aclrtMalloc", "aclrtFree",   "aclrtMemcpy",
                                    "aclrtMemset",     "aclrtGetMemInfo", "aclmdlLoadFromMemWithMem",
                                    "aclmdlExecute",   "aclmdlUnload", "aclmdlSetDynamicBatchSize",
                                    "aclmdlQuerySizeFromMem", "aclrtCreateStream", "aclrtSynchronizeStream",
                                    "aclrtDestroyStream", "aclopCompileAndExecute", "aclopExecuteV2",
                                    "aclCreateTensor", "aclDestroyTensor", "aclCreateScalar", "aclnnAdds",
                                    "aclnnMatmul", "aclnnAddsGetWorkspaceSize", "aclnnMatmulGetWorkspaceSize",
                                    "aclrtReserveMemAddress", "aclrtReleaseMemAddress", "aclrtMallocPhysical",
                                    "aclrtFreePhysical", "aclrtMapMem", "aclrtUnmapMem", "aclCreateTensorDesc",
                                    "aclDestroyTensorDesc", "aclCreateDataBuffer", "aclDestroyDataBuffer",
                                    "aclopCreateAttr", "aclopDestroyAttr", "aclSetTensorPlaceMent",
                                    "aclCreateIntArray", "aclDestroyIntArray", "aclDestroyScalar", NULL};
static long calls[NCALLS];
static int fail_code[NCALLS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int current = -1;
static _Thread_local char err[256];
static int inited;

enum { PLAIN, RESERVED, PHYSICAL }; /* aclrtMalloc; aclrtReserveMemAddress; aclrtMallocPhysical (cann_emulator_ops.c) */
struct alloc {
    unsigned char *p;
    size_t size;
    int device;
    int kind;
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
    if (i < 0)
        return 0; /* a call the table does not count */
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
        if (allocs[i].p && allocs[i].device == device && allocs[i].kind != RESERVED)
            n += allocs[i].size;
    return n;
}

static int mapped(const struct alloc *range, uintptr_t a, size_t count);

/* the allocation holding [p, p + count): plain memory, or mapped parts of a reserved range */
static struct alloc *find(const void *p, size_t count)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].p && allocs[i].kind != PHYSICAL && a >= (uintptr_t)allocs[i].p &&
            a - (uintptr_t)allocs[i].p + count <= allocs[i].size)
            return allocs[i].kind == PLAIN || mapped(&allocs[i], a, count) ? &allocs[i] : NULL;
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
            allocs[i] = (struct alloc){m, size, current, PLAIN};
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
        if (allocs[i].p == p && allocs[i].kind == PLAIN) {
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

/* -- models ------------------------------------------------------------------------------------ */

typedef struct {
    char name[128];
    size_t dimCount;
    int64_t dims[128];
} emu_dims; /* aclmdlIODims */

struct emu_tensor {
    char name[128];
    int dtype, format;
    size_t ndims, size;
    int64_t dims[8];
    unsigned a; /* outputs: the input it copies */
};

struct emu_desc {
    size_t nin, nout, nbatch, weight, work, header;
    struct emu_tensor t[MAX_T];
    uint64_t batch[128];
};

struct emu_model {
    int live;
    uint64_t batch; /* the last aclmdlSetDynamicBatchSize, 0 = none */
    struct emu_desc d;
};

static struct emu_model models[MAX_MODELS];
static uint64_t last_batch;

static uint64_t rd(const unsigned char *p, int n)
{
    uint64_t v = 0;
    while (n--)
        v = v << 8 | p[n];
    return v;
}

static int emu_parse(const unsigned char *p, size_t len, struct emu_desc *d)
{
    if (len < 64 || memcmp(p, "FNPUMDL", 8))
        return fail(507011, "EE1001: not a model the emulator knows");
    memset(d, 0, sizeof *d);
    d->header = rd(p + 12, 4);
    d->weight = rd(p + 16, 8);
    d->work = rd(p + 24, 8);
    d->nin = rd(p + 40, 4);
    d->nout = rd(p + 44, 4);
    d->nbatch = rd(p + 48, 4);
    if (d->header > len || d->nin + d->nout > MAX_T || d->nbatch > 128)
        return fail(507011, "EE1001: model header out of range");
    size_t off = 64;
    for (size_t i = 0; i < d->nin + d->nout; i++) {
        struct emu_tensor *t = &d->t[i];
        size_t n = rd(p + off, 2);
        if (n >= sizeof t->name || off + 2 + n + 20 > d->header)
            return fail(507011, "EE1001: model tensor out of range");
        memcpy(t->name, p + off + 2, n);
        off += 2 + n;
        t->dtype = (int)(int32_t)rd(p + off, 4);
        t->format = (int)(int32_t)rd(p + off + 4, 4);
        t->ndims = rd(p + off + 8, 4);
        t->size = rd(p + off + 12, 8);
        off += 20;
        if (t->ndims > 8 || off + 8 * t->ndims > d->header)
            return fail(507011, "EE1001: model dims out of range");
        for (size_t k = 0; k < t->ndims; k++)
            t->dims[k] = (int64_t)rd(p + off + 8 * k, 8);
        off += 8 * t->ndims;
        if (i >= d->nin) {
            t->a = (unsigned)rd(p + off + 4, 4);
            off += 28;
        }
    }
    for (size_t i = 0; i < d->nbatch && off + 8 * (i + 1) <= d->header; i++)
        d->batch[i] = rd(p + off + 8 * i, 8);
    return 0;
}

EXPORT uint64_t emu_last_batch(void);
EXPORT uint64_t emu_last_batch(void)
{
    return last_batch;
}

EXPORT int aclmdlQuerySizeFromMem(const void *model, size_t size, size_t *work, size_t *weight);
EXPORT int aclmdlQuerySizeFromMem(const void *model, size_t size, size_t *work, size_t *weight)
{
    int code = enter("aclmdlQuerySizeFromMem");
    struct emu_desc d;
    if (code || (code = emu_parse(model, size, &d)))
        return code;
    *work = d.work;
    *weight = d.weight;
    return 0;
}

EXPORT int aclmdlLoadFromMemWithMem(const void *model, size_t size, uint32_t *id, void *work, size_t work_size,
                                    void *weight, size_t weight_size);
EXPORT int aclmdlLoadFromMemWithMem(const void *model, size_t size, uint32_t *id, void *work, size_t work_size,
                                    void *weight, size_t weight_size)
{
    int code = enter("aclmdlLoadFromMemWithMem");
    struct emu_desc d;
    if (code || (code = emu_parse(model, size, &d)))
        return code;
    pthread_mutex_lock(&mu);
    int ok = (!d.work || (work && work_size >= d.work && find(work, d.work))) &&
             (!d.weight || (weight && weight_size >= d.weight && find(weight, d.weight)));
    int slot = -1;
    for (int i = 0; ok && i < MAX_MODELS && slot < 0; i++)
        if (!models[i].live)
            slot = i;
    if (slot >= 0) {
        models[slot].live = 1;
        models[slot].d = d;
        if (d.weight)
            memcpy(weight, (const unsigned char *)model + d.header, d.weight);
    }
    pthread_mutex_unlock(&mu);
    if (!ok)
        return fail(107000, "EE1002: model memory missing, too small or not device memory");
    if (slot < 0)
        return fail(507899, "EE1003: emulator model table full");
    *id = (uint32_t)slot + 1;
    return 0;
}

static struct emu_model *model_of(uint32_t id)
{
    return id >= 1 && id <= MAX_MODELS && models[id - 1].live ? &models[id - 1] : NULL;
}

EXPORT int aclmdlUnload(uint32_t id);
EXPORT int aclmdlUnload(uint32_t id)
{
    int code = enter("aclmdlUnload");
    if (code)
        return code;
    struct emu_model *m = model_of(id);
    if (!m)
        return fail(100011, "invalid model id");
    m->live = 0;
    return 0;
}

EXPORT void *aclmdlCreateDesc(void);
EXPORT void *aclmdlCreateDesc(void)
{
    return calloc(1, sizeof(struct emu_desc));
}

EXPORT int aclmdlDestroyDesc(void *desc);
EXPORT int aclmdlDestroyDesc(void *desc)
{
    free(desc);
    return 0;
}

EXPORT int aclmdlGetDesc(void *desc, uint32_t id);
EXPORT int aclmdlGetDesc(void *desc, uint32_t id)
{
    struct emu_model *m = model_of(id);
    if (!m)
        return fail(100011, "invalid model id");
    *(struct emu_desc *)desc = m->d;
    return 0;
}

EXPORT int aclmdlGetDescFromMem(void *desc, const void *model, size_t size);
EXPORT int aclmdlGetDescFromMem(void *desc, const void *model, size_t size)
{
    return emu_parse(model, size, desc);
}

EXPORT size_t aclmdlGetNumInputs(void *desc);
EXPORT size_t aclmdlGetNumInputs(void *desc)
{
    return ((struct emu_desc *)desc)->nin;
}

EXPORT size_t aclmdlGetNumOutputs(void *desc);
EXPORT size_t aclmdlGetNumOutputs(void *desc)
{
    return ((struct emu_desc *)desc)->nout;
}

static struct emu_tensor *tensor_of(void *desc, size_t index, int out)
{
    struct emu_desc *d = desc;
    return &d->t[out ? d->nin + index : index];
}

EXPORT size_t aclmdlGetInputSizeByIndex(void *desc, size_t i);
EXPORT size_t aclmdlGetInputSizeByIndex(void *desc, size_t i)
{
    return tensor_of(desc, i, 0)->size;
}

EXPORT size_t aclmdlGetOutputSizeByIndex(void *desc, size_t i);
EXPORT size_t aclmdlGetOutputSizeByIndex(void *desc, size_t i)
{
    return tensor_of(desc, i, 1)->size;
}

static int dims_to(struct emu_tensor *t, emu_dims *dims)
{
    memset(dims, 0, sizeof *dims);
    memcpy(dims->name, t->name, sizeof t->name);
    dims->dimCount = t->ndims;
    memcpy(dims->dims, t->dims, t->ndims * sizeof(int64_t));
    return 0;
}

EXPORT int aclmdlGetInputDims(void *desc, size_t i, emu_dims *dims);
EXPORT int aclmdlGetInputDims(void *desc, size_t i, emu_dims *dims)
{
    return dims_to(tensor_of(desc, i, 0), dims);
}

EXPORT int aclmdlGetOutputDims(void *desc, size_t i, emu_dims *dims);
EXPORT int aclmdlGetOutputDims(void *desc, size_t i, emu_dims *dims)
{
    return dims_to(tensor_of(desc, i, 1), dims);
}

EXPORT int aclmdlGetInputDataType(void *desc, size_t i);
EXPORT int aclmdlGetInputDataType(void *desc, size_t i)
{
    return tensor_of(desc, i, 0)->dtype;
}

EXPORT int aclmdlGetOutputDataType(void *desc, size_t i);
EXPORT int aclmdlGetOutputDataType(void *desc, size_t i)
{
    return tensor_of(desc, i, 1)->dtype;
}

EXPORT int aclmdlGetInputFormat(void *desc, size_t i);
EXPORT int aclmdlGetInputFormat(void *desc, size_t i)
{
    return tensor_of(desc, i, 0)->format;
}

EXPORT int aclmdlGetOutputFormat(void *desc, size_t i);
EXPORT int aclmdlGetOutputFormat(void *desc, size_t i)
{
    return tensor_of(desc, i, 1)->format;
}

EXPORT int aclmdlGetDynamicBatch(void *desc, void *batch);
EXPORT int aclmdlGetDynamicBatch(void *desc, void *batch)
{
    struct emu_desc *d = desc;
    size_t n = d->nbatch;
    memcpy(batch, &n, sizeof n);
    memcpy((unsigned char *)batch + sizeof n, d->batch, n * sizeof(uint64_t));
    return 0;
}

EXPORT int aclmdlGetDynamicHW(void *desc, size_t index, void *hw);
EXPORT int aclmdlGetDynamicHW(void *desc, size_t index, void *hw)
{
    (void)desc;
    (void)index;
    size_t n = 0;
    memcpy(hw, &n, sizeof n);
    return 0;
}

struct emu_buffer {
    void *data;
    size_t size;
};

struct emu_dataset {
    size_t n;
    struct emu_buffer *b[MAX_T];
};

EXPORT void *aclCreateDataBuffer(void *data, size_t size);
EXPORT void *aclCreateDataBuffer(void *data, size_t size)
{
    struct emu_buffer *b = malloc(sizeof *b);
    if (b)
        *b = (struct emu_buffer){data, size};
    return b;
}

EXPORT int aclDestroyDataBuffer(void *b);
EXPORT int aclDestroyDataBuffer(void *b)
{
    free(b);
    return 0;
}

EXPORT void *aclmdlCreateDataset(void);
EXPORT void *aclmdlCreateDataset(void)
{
    return calloc(1, sizeof(struct emu_dataset));
}

EXPORT int aclmdlDestroyDataset(void *ds);
EXPORT int aclmdlDestroyDataset(void *ds)
{
    free(ds);
    return 0;
}

EXPORT int aclmdlAddDatasetBuffer(void *ds, void *b);
EXPORT int aclmdlAddDatasetBuffer(void *ds, void *b)
{
    struct emu_dataset *d = ds;
    if (d->n >= MAX_T)
        return fail(100000, "dataset full");
    d->b[d->n++] = b;
    return 0;
}

EXPORT int aclmdlSetDynamicBatchSize(uint32_t id, void *ds, size_t index, uint64_t batch);
EXPORT int aclmdlSetDynamicBatchSize(uint32_t id, void *ds, size_t index, uint64_t batch)
{
    int code = enter("aclmdlSetDynamicBatchSize");
    if (code)
        return code;
    (void)ds;
    (void)index;
    struct emu_model *m = model_of(id);
    if (!m)
        return fail(100011, "invalid model id");
    last_batch = m->batch = batch;
    return 0;
}

EXPORT int aclmdlExecute(uint32_t id, const void *in, void *out);
EXPORT int aclmdlExecute(uint32_t id, const void *in, void *out)
{
    int code = enter("aclmdlExecute");
    if (code)
        return code;
    struct emu_model *m = model_of(id);
    const struct emu_dataset *i = in;
    struct emu_dataset *o = out;
    if (!m)
        return fail(100011, "invalid model id");
    if (i->n != m->d.nin || o->n != m->d.nout)
        return fail(145000, "EE1004: dataset size does not match the model");
    pthread_mutex_lock(&mu);
    int rc = 0;
    for (size_t k = 0; k < o->n && !rc; k++) {
        const struct emu_buffer *src = i->b[m->d.t[m->d.nin + k].a], *dst = o->b[k];
        size_t n = src->size < dst->size ? src->size : dst->size;
        uint64_t max = 0;
        for (size_t g = 0; g < m->d.nbatch; g++)
            max = m->d.batch[g] > max ? m->d.batch[g] : max;
        if (max && m->batch)
            n = n / max * m->batch;
        if (!find(src->data, n) || !find(dst->data, n))
            rc = 1;
        else
            memmove(dst->data, src->data, n);
    }
    pthread_mutex_unlock(&mu);
    return rc ? fail(107000, "EE1005: a dataset buffer is not device memory") : 0;
}

EXPORT int aclmdlSetDynamicHWSize(uint32_t id, void *ds, size_t index, uint64_t height, uint64_t width);
EXPORT int aclmdlSetDynamicHWSize(uint32_t id, void *ds, size_t index, uint64_t height, uint64_t width)
{
    (void)ds;
    (void)index;
    (void)height;
    (void)width;
    return model_of(id) ? 0 : fail(100011, "invalid model id");
}

/* streams, single operators, aclnn and virtual memory */
#include "cann_emulator_ops.c"
