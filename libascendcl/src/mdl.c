/*
 * mdl.c: models (acl_mdl.h), remoted to the claim's aclserver, which cannot see this container's
 * files: the model's bytes travel through the staging region into a server-side blob
 * (MODEL_BYTES_OPEN/WRITE), which is then loaded (MODEL_LOAD, on the calling thread's device;
 * weight and work memory from the share's quota unless the caller gives its own), measured
 * (MODEL_QUERY_SIZE) or described (MODEL_QUERY_DESC). aclmdlGetDesc fetches a model's whole
 * description once (MODEL_GET_DESC: the header layout of docs/model-format.md) and every query
 * of an aclmdlDesc is answered here from that copy. aclmdlExecute/ExecuteAsync send the device
 * pointers and sizes of the datasets' buffers (MODEL_EXECUTE); the aclserver runs the execution
 * on the stream under the share's compute policy (the V2 calls and their config: mdl_exec.c). The config handle for aclmdlLoadWithConfig
 * lives here too. Wire contract: client/flexnpu_wire/ops.py; format: client/flexnpu_wire/modelfile.py.
 */
#include "client.h"
#include "objects.h"

#include "acl/acl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MDL_DESC_MAGIC 0x464E4D44u   /* "FNMD" */
#define MDL_CONFIG_MAGIC 0x464E4D43u /* "FNMC" */
#define MODEL_MAGIC "FNPUMDL"
#define MODEL_VERSION 1
#define MODEL_FIXED_BYTES 64
#define MODEL_MAX_DIMS ACL_MAX_DIM_CNT
#define MODEL_MAX_TENSORS 256
#define MODEL_OUTPUT_EXTRA 28 /* op, a, b (u32) and scale, bias (f64) */
#define FORMAT_NCHW 0

struct mdl_tensor {
    char name[ACL_MAX_TENSOR_NAME_LEN];
    aclDataType data_type;
    aclFormat format;
    size_t ndims;
    uint64_t size; /* bytes at the largest gear, as the description states */
    int64_t dims[MODEL_MAX_DIMS];
};

struct aclmdlDesc {
    uint32_t magic;
    int filled;
    size_t n_inputs, n_outputs;
    struct mdl_tensor *tensors; /* inputs, then outputs */
    size_t n_batch, n_hw;
    uint64_t batch[ACL_MAX_BATCH_NUM];
    uint64_t hw[ACL_MAX_HW_NUM][2];
    uint64_t weight_bytes, work_bytes;
};

struct aclmdlConfigHandle {
    uint32_t magic;
    int has_load_type;
    size_t load_type;
    char *path;
    const void *mem;
    size_t mem_size;
    void *weight, *work;
    size_t weight_size, work_size;
    int32_t priority;
};

/* -- the description: parsed from the header layout of docs/model-format.md ------------------- */

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

struct cursor {
    const unsigned char *p;
    size_t off, len;
};

static int take(struct cursor *c, size_t n, const unsigned char **out)
{
    if (c->off > c->len || n > c->len - c->off)
        return -1;
    *out = c->p + c->off;
    c->off += n;
    return 0;
}

static int parse_tensor(struct cursor *c, struct mdl_tensor *t, int output)
{
    const unsigned char *p;
    if (take(c, 2, &p))
        return -1;
    size_t name_len = (size_t)le(p, 2);
    if (name_len == 0 || name_len >= ACL_MAX_TENSOR_NAME_LEN || take(c, name_len, &p))
        return -1;
    memcpy(t->name, p, name_len);
    t->name[name_len] = '\0';
    if (take(c, 20, &p))
        return -1;
    t->data_type = (aclDataType)(int32_t)(uint32_t)le(p, 4);
    t->format = (aclFormat)(int32_t)(uint32_t)le(p + 4, 4);
    t->ndims = (size_t)le(p + 8, 4);
    t->size = le(p + 12, 8);
    if (t->ndims > MODEL_MAX_DIMS || take(c, 8 * t->ndims, &p))
        return -1;
    for (size_t i = 0; i < t->ndims; i++)
        t->dims[i] = (int64_t)le(p + 8 * i, 8);
    return output ? take(c, MODEL_OUTPUT_EXTRA, &p) : 0;
}

/* Fill desc from a description the aclserver sent (its own format: a bad one is a protocol error). */
static int desc_parse(aclmdlDesc *desc, const unsigned char *p, size_t len, const char *what)
{
    /* the header's size must cover its fixed part and lie within what was sent: every read below
     * is bounded by it (a shorter one would make the cursor start past its end) */
    if (len < MODEL_FIXED_BYTES || memcmp(p, MODEL_MAGIC, 8) || le(p + 8, 4) != MODEL_VERSION ||
        le(p + 12, 4) < MODEL_FIXED_BYTES || le(p + 12, 4) > len)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the aclserver sent a malformed model description", what);
    size_t n_in = (size_t)le(p + 40, 4), n_out = (size_t)le(p + 44, 4);
    size_t n_batch = (size_t)le(p + 48, 4), n_hw = (size_t)le(p + 52, 4);
    if (n_in + n_out > MODEL_MAX_TENSORS || n_batch > ACL_MAX_BATCH_NUM || n_hw > ACL_MAX_HW_NUM)
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the model description has too many entries", what);
    struct mdl_tensor *t = calloc(n_in + n_out ? n_in + n_out : 1, sizeof *t);
    if (!t)
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    struct cursor c = {p, MODEL_FIXED_BYTES, (size_t)le(p + 12, 4)};
    int bad = 0;
    for (size_t i = 0; i < n_in + n_out && !bad; i++)
        bad = parse_tensor(&c, &t[i], i >= n_in);
    const unsigned char *g;
    if (!bad && take(&c, 8 * n_batch + 16 * n_hw, &g) == 0) {
        for (size_t i = 0; i < n_batch; i++)
            desc->batch[i] = le(g + 8 * i, 8);
        for (size_t i = 0; i < n_hw; i++) {
            desc->hw[i][0] = le(g + 8 * n_batch + 16 * i, 8);
            desc->hw[i][1] = le(g + 8 * n_batch + 16 * i + 8, 8);
        }
    } else
        bad = 1;
    if (bad) {
        free(t);
        return flexnpu_fail(ACL_ERROR_INTERNAL_ERROR, "%s: the model description runs past its header", what);
    }
    free(desc->tensors);
    desc->tensors = t;
    desc->n_inputs = n_in;
    desc->n_outputs = n_out;
    desc->n_batch = n_batch;
    desc->n_hw = n_hw;
    desc->weight_bytes = le(p + 16, 8);
    desc->work_bytes = le(p + 24, 8);
    desc->filled = 1;
    return 0;
}

static int desc_check(const aclmdlDesc *desc, const char *what)
{
    if (!desc)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: modelDesc is NULL", what);
    if (desc->magic != MDL_DESC_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not a live aclmdlDesc", what, (const void *)desc);
    if (!desc->filled)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the aclmdlDesc is empty (call aclmdlGetDesc first)", what);
    return 0;
}

/* The tensor index of the inputs (output 0) or outputs (output 1), NULL with the failure recorded. */
static const struct mdl_tensor *tensor_at(const aclmdlDesc *desc, size_t index, int output, const char *what)
{
    if (desc_check(desc, what))
        return NULL;
    size_t n = output ? desc->n_outputs : desc->n_inputs;
    if (index >= n) {
        flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: index %zu is out of range (the model has %zu %s)", what, index, n,
                     output ? "outputs" : "inputs");
        return NULL;
    }
    return &desc->tensors[output ? desc->n_inputs + index : index];
}

/* -- a model's bytes to the aclserver ---------------------------------------------------------- */

struct model_src {
    int fd;                     /* a file, or -1 */
    const unsigned char *mem;   /* or memory */
    int64_t blob;
    const char *what;
};

static int src_fill(void *ctx, unsigned char *dst, size_t done, size_t n)
{
    struct model_src *s = ctx;
    if (s->fd < 0) {
        memcpy(dst, s->mem + done, n);
        return 0;
    }
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(s->fd, dst + got, n - got, (off_t)(done + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return flexnpu_fail(ACL_ERROR_READ_MODEL_FAILURE, "%s: reading the model file failed: %s", s->what,
                                r < 0 ? strerror(errno) : "it became shorter");
        got += (size_t)r;
    }
    return 0;
}

static unsigned blob_frame(void *ctx, size_t done, uint64_t host, size_t n, uint16_t *op, int64_t *args)
{
    *op = OP_MODEL_BYTES_WRITE;
    args[0] = ((struct model_src *)ctx)->blob;
    args[1] = (int64_t)done;
    args[2] = (int64_t)host;
    args[3] = (int64_t)n;
    return 4;
}

void blob_close(int64_t blob, const char *what)
{
    struct saved_error keep;
    error_save(&keep);
    rpc_call(OP_MODEL_BYTES_CLOSE, &blob, 1, NULL, 0, session.call_timeout_ms, what);
    error_restore(&keep);
}

/* Hand the aclserver a model (a file path, or size bytes at mem); its blob id in *blob. */
int model_send(const char *path, const void *mem, size_t size, int64_t *blob, const char *what)
{
    struct model_src src = {-1, mem, 0, what};
    if (path) {
        src.fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        struct stat st;
        if (src.fd < 0 || fstat(src.fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
            int err = src.fd < 0 ? errno : 0;
            if (src.fd >= 0)
                close(src.fd);
            return flexnpu_fail(ACL_ERROR_READ_MODEL_FAILURE, "%s: cannot read the model file %s: %s", what, path,
                                err ? strerror(err) : "not a non-empty regular file");
        }
        size = (size_t)st.st_size;
    } else if (!mem || size == 0) {
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s", what, mem ? "modelSize is 0" : "model is NULL");
    }
    int64_t n = (int64_t)size;
    int rc = size > (size_t)INT64_MAX ? flexnpu_fail(ACL_ERROR_MODEL_SIZE_INVALID, "%s: the model is too large", what)
                                      : rpc_call(OP_MODEL_BYTES_OPEN, &n, 1, blob, 1, session.call_timeout_ms, what);
    if (!rc) {
        src.blob = *blob;
        rc = staged_send(size, src_fill, blob_frame, &src, what);
        if (rc && !session.dead)
            blob_close(*blob, what);
    }
    if (src.fd >= 0)
        close(src.fd);
    return rc;
}

/* -- load, unload, query ----------------------------------------------------------------------- */

static int do_load(const char *path, const void *mem, size_t size, uint32_t *model_id, void *work, size_t work_size,
                   void *weight, size_t weight_size, const char *what)
{
    if (!model_id)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: modelId is NULL", what);
    if (path == NULL && mem == NULL)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the model %s is NULL", what, size ? "memory" : "path");
    if ((weight && !weight_size) || (work && !work_size) || weight_size > (size_t)INT64_MAX ||
        work_size > (size_t)INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: a weight or work pointer needs its size", what);
    int rc = session_ready(what);
    if (!rc)
        rc = session_use_device(what, NULL);
    int64_t blob;
    if (!rc)
        rc = model_send(path, mem, size, &blob, what);
    if (rc)
        return rc;
    int64_t args[5] = {blob, (int64_t)(uintptr_t)weight, weight ? (int64_t)weight_size : 0,
                       (int64_t)(uintptr_t)work, work ? (int64_t)work_size : 0};
    int64_t id;
    rc = rpc_call(OP_MODEL_LOAD, args, 5, &id, 1, session.call_timeout_ms, what);
    if (rc) {
        if (!session.dead)
            blob_close(blob, what); /* a refused load keeps the blob: drop it */
        return rc;
    }
    *model_id = (uint32_t)id;
    return 0;
}

API aclError aclmdlLoadFromFile(const char *modelPath, uint32_t *modelId)
{
    LOCKED(do_load(modelPath, NULL, 0, modelId, NULL, 0, NULL, 0, "aclmdlLoadFromFile"));
}

API aclError aclmdlLoadFromMem(const void *model, size_t modelSize, uint32_t *modelId)
{
    LOCKED(do_load(NULL, model, modelSize, modelId, NULL, 0, NULL, 0, "aclmdlLoadFromMem"));
}

API aclError aclmdlLoadFromFileWithMem(const char *modelPath, uint32_t *modelId, void *workPtr, size_t workSize,
                                       void *weightPtr, size_t weightSize)
{
    LOCKED(do_load(modelPath, NULL, 0, modelId, workPtr, workSize, weightPtr, weightSize, "aclmdlLoadFromFileWithMem"));
}

API aclError aclmdlLoadFromMemWithMem(const void *model, size_t modelSize, uint32_t *modelId, void *workPtr,
                                      size_t workSize, void *weightPtr, size_t weightSize)
{
    LOCKED(do_load(NULL, model, modelSize, modelId, workPtr, workSize, weightPtr, weightSize,
                   "aclmdlLoadFromMemWithMem"));
}

static int do_unload(uint32_t model_id)
{
    int rc = session_ready("aclmdlUnload");
    int64_t id = model_id;
    return rc ? rc : rpc_call(OP_MODEL_UNLOAD, &id, 1, NULL, 0, WAIT_FOREVER, "aclmdlUnload");
}

API aclError aclmdlUnload(uint32_t modelId)
{
    LOCKED(do_unload(modelId));
}

static int do_query_size(const char *path, const void *mem, size_t size, size_t *work, size_t *weight,
                         const char *what)
{
    if (!work || !weight)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", what, work ? "weightSize" : "workSize");
    if (!path && !mem)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the model is NULL", what);
    int rc = session_ready(what);
    int64_t blob, out[2];
    if (!rc)
        rc = model_send(path, mem, size, &blob, what);
    if (rc)
        return rc;
    rc = rpc_call(OP_MODEL_QUERY_SIZE, &blob, 1, out, 2, session.call_timeout_ms, what);
    if (!session.dead)
        blob_close(blob, what);
    if (!rc) {
        *work = (size_t)out[0];
        *weight = (size_t)out[1];
    }
    return rc;
}

API aclError aclmdlQuerySize(const char *fileName, size_t *workSize, size_t *weightSize)
{
    LOCKED(do_query_size(fileName, NULL, 0, workSize, weightSize, "aclmdlQuerySize"));
}

API aclError aclmdlQuerySizeFromMem(const void *model, size_t modelSize, size_t *workSize, size_t *weightSize)
{
    LOCKED(do_query_size(NULL, model, modelSize, workSize, weightSize, "aclmdlQuerySizeFromMem"));
}

/* -- descriptions ------------------------------------------------------------------------------ */

API aclmdlDesc *aclmdlCreateDesc(void)
{
    aclmdlDesc *d = calloc(1, sizeof *d);
    if (!d) {
        flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclmdlCreateDesc: out of host memory");
        return NULL;
    }
    d->magic = MDL_DESC_MAGIC;
    return d;
}

API aclError aclmdlDestroyDesc(aclmdlDesc *modelDesc)
{
    if (!modelDesc || modelDesc->magic != MDL_DESC_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlDestroyDesc: %s",
                            modelDesc ? "not a live aclmdlDesc" : "modelDesc is NULL");
    free(modelDesc->tensors);
    modelDesc->magic = 0;
    free(modelDesc);
    return ACL_SUCCESS;
}

/* Ask for a description (op MODEL_GET_DESC of a model, or MODEL_QUERY_DESC of a blob) into desc. */
static int fetch_desc(aclmdlDesc *desc, uint16_t op, int64_t id, const char *what)
{
    uint32_t rid;
    struct wire_msg m;
    int rc = rpc_send(op, &id, 1, NULL, 0, &rid, what);
    if (!rc)
        rc = rpc_receive(rid, NULL, 0, session.call_timeout_ms, what, &m);
    return rc ? rc : desc_parse(desc, (const unsigned char *)m.tail, m.tail_len, what);
}

static int do_get_desc(aclmdlDesc *desc, uint32_t model_id, const char *what)
{
    if (!desc || desc->magic != MDL_DESC_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s", what, desc ? "not a live aclmdlDesc" : "modelDesc is NULL");
    int rc = session_ready(what);
    return rc ? rc : fetch_desc(desc, OP_MODEL_GET_DESC, model_id, what);
}

API aclError aclmdlGetDesc(aclmdlDesc *modelDesc, uint32_t modelId)
{
    LOCKED(do_get_desc(modelDesc, modelId, "aclmdlGetDesc"));
}

static int do_desc_of(aclmdlDesc *desc, const char *path, const void *mem, size_t size, const char *what)
{
    if (!desc || desc->magic != MDL_DESC_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s", what, desc ? "not a live aclmdlDesc" : "modelDesc is NULL");
    if (!path && !mem)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the model is NULL", what);
    int rc = session_ready(what);
    int64_t blob;
    if (!rc)
        rc = model_send(path, mem, size, &blob, what);
    if (rc)
        return rc;
    rc = fetch_desc(desc, OP_MODEL_QUERY_DESC, blob, what);
    if (!session.dead)
        blob_close(blob, what);
    return rc;
}

API aclError aclmdlGetDescFromFile(aclmdlDesc *modelDesc, const char *modelPath)
{
    LOCKED(do_desc_of(modelDesc, modelPath, NULL, 0, "aclmdlGetDescFromFile"));
}

API aclError aclmdlGetDescFromMem(aclmdlDesc *modelDesc, const void *model, size_t modelSize)
{
    LOCKED(do_desc_of(modelDesc, NULL, model, modelSize, "aclmdlGetDescFromMem"));
}

API size_t aclmdlGetNumInputs(aclmdlDesc *modelDesc)
{
    return desc_check(modelDesc, "aclmdlGetNumInputs") ? 0 : modelDesc->n_inputs;
}

API size_t aclmdlGetNumOutputs(aclmdlDesc *modelDesc)
{
    return desc_check(modelDesc, "aclmdlGetNumOutputs") ? 0 : modelDesc->n_outputs;
}

API size_t aclmdlGetInputSizeByIndex(aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 0, "aclmdlGetInputSizeByIndex");
    return t ? (size_t)t->size : 0;
}

API size_t aclmdlGetOutputSizeByIndex(aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 1, "aclmdlGetOutputSizeByIndex");
    return t ? (size_t)t->size : 0;
}

static int dims_of(const aclmdlDesc *desc, size_t index, int output, aclmdlIODims *dims, const char *what)
{
    const struct mdl_tensor *t = tensor_at(desc, index, output, what);
    if (!t)
        return ACL_ERROR_INVALID_PARAM;
    if (!dims)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: dims is NULL", what);
    memset(dims, 0, sizeof *dims);
    memcpy(dims->name, t->name, sizeof t->name);
    dims->dimCount = t->ndims;
    memcpy(dims->dims, t->dims, t->ndims * sizeof t->dims[0]);
    return ACL_SUCCESS;
}

API aclError aclmdlGetInputDims(const aclmdlDesc *modelDesc, size_t index, aclmdlIODims *dims)
{
    return dims_of(modelDesc, index, 0, dims, "aclmdlGetInputDims");
}

/* Without AIPP (which the emulated format does not have) the V2 dims are the same. */
API aclError aclmdlGetInputDimsV2(const aclmdlDesc *modelDesc, size_t index, aclmdlIODims *dims)
{
    return dims_of(modelDesc, index, 0, dims, "aclmdlGetInputDimsV2");
}

API aclError aclmdlGetOutputDims(const aclmdlDesc *modelDesc, size_t index, aclmdlIODims *dims)
{
    return dims_of(modelDesc, index, 1, dims, "aclmdlGetOutputDims");
}

API aclError aclmdlGetInputDimsRange(const aclmdlDesc *modelDesc, size_t index, aclmdlIODimsRange *dimsRange)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 0, "aclmdlGetInputDimsRange");
    if (!t)
        return ACL_ERROR_INVALID_PARAM;
    if (!dimsRange)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlGetInputDimsRange: dimsRange is NULL");
    memset(dimsRange, 0, sizeof *dimsRange);
    dimsRange->rangeCount = t->ndims;
    for (size_t i = 0; i < t->ndims; i++) {
        int64_t lo = t->dims[i], hi = t->dims[i];
        if (t->dims[i] == -1) { /* the smallest and largest gear of this dim */
            size_t hpos = t->format == FORMAT_NCHW ? 2 : 1;
            lo = INT64_MAX;
            hi = 0;
            for (size_t g = 0; g < modelDesc->n_batch; g++) {
                lo = (int64_t)modelDesc->batch[g] < lo ? (int64_t)modelDesc->batch[g] : lo;
                hi = (int64_t)modelDesc->batch[g] > hi ? (int64_t)modelDesc->batch[g] : hi;
            }
            for (size_t g = 0; g < modelDesc->n_hw; g++) {
                int64_t v = (int64_t)modelDesc->hw[g][i == hpos ? 0 : 1];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
        }
        dimsRange->range[i][0] = lo;
        dimsRange->range[i][1] = hi;
    }
    return ACL_SUCCESS;
}

API const char *aclmdlGetInputNameByIndex(const aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 0, "aclmdlGetInputNameByIndex");
    return t ? t->name : NULL;
}

API const char *aclmdlGetOutputNameByIndex(const aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 1, "aclmdlGetOutputNameByIndex");
    return t ? t->name : NULL;
}

/* Names are at most 127 bytes in this format: every name is its own real name. */
API const char *aclmdlGetTensorRealName(const aclmdlDesc *modelDesc, const char *name)
{
    if (desc_check(modelDesc, "aclmdlGetTensorRealName"))
        return NULL;
    for (size_t i = 0; name && i < modelDesc->n_inputs + modelDesc->n_outputs; i++)
        if (!strcmp(modelDesc->tensors[i].name, name))
            return modelDesc->tensors[i].name;
    flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlGetTensorRealName: the model has no tensor named %s",
                 name ? name : "(NULL)");
    return NULL;
}

API aclFormat aclmdlGetInputFormat(const aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 0, "aclmdlGetInputFormat");
    return t ? t->format : ACL_FORMAT_UNDEFINED;
}

API aclFormat aclmdlGetOutputFormat(const aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 1, "aclmdlGetOutputFormat");
    return t ? t->format : ACL_FORMAT_UNDEFINED;
}

API aclDataType aclmdlGetInputDataType(const aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 0, "aclmdlGetInputDataType");
    return t ? t->data_type : ACL_DT_UNDEFINED;
}

API aclDataType aclmdlGetOutputDataType(const aclmdlDesc *modelDesc, size_t index)
{
    const struct mdl_tensor *t = tensor_at(modelDesc, index, 1, "aclmdlGetOutputDataType");
    return t ? t->data_type : ACL_DT_UNDEFINED;
}

static int index_by_name(const aclmdlDesc *desc, const char *name, size_t *index, int output, const char *what)
{
    int rc = desc_check(desc, what);
    if (rc)
        return rc;
    if (!name || !index)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", what, name ? "index" : "name");
    size_t first = output ? desc->n_inputs : 0, n = output ? desc->n_outputs : desc->n_inputs;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(desc->tensors[first + i].name, name)) {
            *index = i;
            return ACL_SUCCESS;
        }
    return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the model has no %s named %s", what,
                        output ? "output" : "input", name);
}

API aclError aclmdlGetInputIndexByName(const aclmdlDesc *modelDesc, const char *name, size_t *index)
{
    return index_by_name(modelDesc, name, index, 0, "aclmdlGetInputIndexByName");
}

API aclError aclmdlGetOutputIndexByName(const aclmdlDesc *modelDesc, const char *name, size_t *index)
{
    return index_by_name(modelDesc, name, index, 1, "aclmdlGetOutputIndexByName");
}

API aclError aclmdlGetDynamicBatch(const aclmdlDesc *modelDesc, aclmdlBatch *batch)
{
    int rc = desc_check(modelDesc, "aclmdlGetDynamicBatch");
    if (rc)
        return rc;
    if (!batch)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlGetDynamicBatch: batch is NULL");
    memset(batch, 0, sizeof *batch);
    batch->batchCount = modelDesc->n_batch;
    memcpy(batch->batch, modelDesc->batch, modelDesc->n_batch * sizeof batch->batch[0]);
    return ACL_SUCCESS;
}

/* The gears are the model's (index, which CANN reserves for per-input gears, is not used). */
API aclError aclmdlGetDynamicHW(const aclmdlDesc *modelDesc, size_t index, aclmdlHW *hw)
{
    (void)index;
    int rc = desc_check(modelDesc, "aclmdlGetDynamicHW");
    if (rc)
        return rc;
    if (!hw)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlGetDynamicHW: hw is NULL");
    memset(hw, 0, sizeof *hw);
    hw->hwCount = modelDesc->n_hw;
    memcpy(hw->hw, modelDesc->hw, modelDesc->n_hw * sizeof hw->hw[0]);
    return ACL_SUCCESS;
}

/* The format has no dynamic-dims gears (only batch or height/width): zero gears. */
API aclError aclmdlGetInputDynamicGearCount(const aclmdlDesc *modelDesc, size_t index, size_t *gearCount)
{
    (void)index;
    int rc = desc_check(modelDesc, "aclmdlGetInputDynamicGearCount");
    if (!rc && !gearCount)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlGetInputDynamicGearCount: gearCount is NULL");
    if (!rc)
        *gearCount = 0;
    return rc;
}

API aclError aclmdlGetInputDynamicDims(const aclmdlDesc *modelDesc, size_t index, aclmdlIODims *dims,
                                       size_t gearCount)
{
    (void)index;
    (void)dims;
    int rc = desc_check(modelDesc, "aclmdlGetInputDynamicDims");
    if (!rc && gearCount)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlGetInputDynamicDims: the model has 0 dynamic-dims gears, "
                                                   "%zu asked",
                          gearCount);
    return rc;
}

/* -- execution --------------------------------------------------------------------------------- */

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static int pack(const aclmdlDataset *ds, unsigned char *tail, const char *name, const char *what)
{
    for (size_t i = 0; i < ds->n; i++) {
        const aclDataBuffer *b = ds->blobs[i].buffer;
        if (!b || b->magic != DATA_BUFFER_MAGIC)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s buffer %zu is not a live aclDataBuffer", what, name, i);
        if (b->size > (size_t)INT64_MAX)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s buffer %zu size overflows", what, name, i);
        put_be64(tail + 16 * i, (uint64_t)(uintptr_t)b->data);
        put_be64(tail + 16 * i + 8, (uint64_t)b->size);
    }
    return 0;
}

int mdl_execute(uint32_t model_id, const aclmdlDataset *in, aclmdlDataset *out, aclrtStream stream, int async,
                const char *what)
{
    if (!in || in->magic != DATASET_MAGIC || !out || out->magic != DATASET_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s is not a live aclmdlDataset", what,
                            !in || in->magic != DATASET_MAGIC ? "input" : "output");
    if (in->n + out->n > MODEL_MAX_TENSORS)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: more than %d buffers", what, MODEL_MAX_TENSORS);
    int rc = session_ready(what);
    if (!rc)
        rc = session_use_device(what, NULL);
    int64_t sid = 0;
    if (!rc && async)
        rc = stream_resolve(stream, &sid, what);
    if (rc)
        return rc;
    size_t len = 16 * (in->n + out->n);
    unsigned char tail[16 * MODEL_MAX_TENSORS]; /* no allocation per execution */
    rc = pack(in, tail, "input", what);
    if (!rc)
        rc = pack(out, tail + 16 * in->n, "output", what);
    if (!rc) {
        int64_t args[4] = {model_id, sid, (int64_t)in->n, (int64_t)out->n};
        uint32_t rid;
        rc = rpc_send(OP_MODEL_EXECUTE, args, 4, tail, len, &rid, what);
        if (!rc)
            rc = rpc_receive(rid, NULL, 0, async ? session.call_timeout_ms : WAIT_FOREVER, what, NULL);
    }
    return rc;
}

API aclError aclmdlExecute(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output)
{
    LOCKED(mdl_execute(modelId, input, output, NULL, 0, "aclmdlExecute"));
}

API aclError aclmdlExecuteAsync(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output,
                                aclrtStream stream)
{
    LOCKED(mdl_execute(modelId, input, output, stream, 1, "aclmdlExecuteAsync"));
}

/* Check that index is the dynamic-shape input of a model with that kind of gears and value one of
 * them; the buffer to write it to in *dst (its size in *max). */
static int dynamic_target(uint32_t model_id, aclmdlDataset *ds, size_t index, const uint64_t *value, int hw,
                          void **dst, size_t *max, const char *what)
{
    if (!ds || ds->magic != DATASET_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: dataset is not a live aclmdlDataset", what);
    int rc = session_ready(what);
    if (rc)
        return rc;
    aclmdlDesc desc = {.magic = MDL_DESC_MAGIC};
    rc = fetch_desc(&desc, OP_MODEL_GET_DESC, model_id, what);
    if (rc)
        return rc;
    size_t gears = hw ? desc.n_hw : desc.n_batch;
    int found = 0;
    for (size_t g = 0; g < gears; g++)
        found |= hw ? desc.hw[g][0] == value[0] && desc.hw[g][1] == value[1] : desc.batch[g] == value[0];
    if (!gears)
        rc = flexnpu_fail(ACL_ERROR_MODEL_NOT_DYNAMIC, "%s: model %u has no dynamic %s gears", what, model_id,
                          hw ? "height/width" : "batch");
    else if (index + 1 != desc.n_inputs || index >= ds->n)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: index %zu is not the dynamic-shape input (%s, index %zu)",
                          what, index, ACL_DYNAMIC_TENSOR_NAME, desc.n_inputs - 1);
    else if (!found && hw)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %llux%llu is not one of the model's gears", what,
                          (unsigned long long)value[0], (unsigned long long)value[1]);
    else if (!found)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %llu is not one of the model's gears", what,
                          (unsigned long long)value[0]);
    else if (!ds->blobs[index].buffer || ds->blobs[index].buffer->magic != DATA_BUFFER_MAGIC ||
             ds->blobs[index].buffer->size < (hw ? 16u : 8u))
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the dynamic-shape input's buffer is missing or too small", what);
    if (!rc) {
        *dst = ds->blobs[index].buffer->data;
        *max = ds->blobs[index].buffer->size;
    }
    free(desc.tensors);
    return rc;
}

static aclError set_dynamic(uint32_t model_id, aclmdlDataset *ds, size_t index, const uint64_t *value, int hw,
                            const char *what)
{
    void *dst = NULL;
    size_t max = 0;
    pthread_mutex_lock(&session.lock);
    int rc = dynamic_target(model_id, ds, index, value, hw, &dst, &max, what);
    pthread_mutex_unlock(&session.lock);
    if (rc)
        return rc;
    unsigned char raw[16];
    for (int k = 0; k < (hw ? 2 : 1); k++)
        for (int i = 0; i < 8; i++)
            raw[8 * k + i] = (unsigned char)(value[k] >> (8 * i)); /* little-endian, as the format says */
    return aclrtMemcpy(dst, max, raw, hw ? 16 : 8, ACL_MEMCPY_HOST_TO_DEVICE);
}

API aclError aclmdlSetDynamicBatchSize(uint32_t modelId, aclmdlDataset *dataset, size_t index, uint64_t batchSize)
{
    uint64_t v[1] = {batchSize};
    return set_dynamic(modelId, dataset, index, v, 0, "aclmdlSetDynamicBatchSize");
}

API aclError aclmdlSetDynamicHWSize(uint32_t modelId, aclmdlDataset *dataset, size_t index, uint64_t height,
                                    uint64_t width)
{
    uint64_t v[2] = {height, width};
    return set_dynamic(modelId, dataset, index, v, 1, "aclmdlSetDynamicHWSize");
}

/* -- aclmdlLoadWithConfig and its config handle ------------------------------------------------ */

API aclmdlConfigHandle *aclmdlCreateConfigHandle(void)
{
    aclmdlConfigHandle *h = calloc(1, sizeof *h);
    if (!h) {
        flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclmdlCreateConfigHandle: out of host memory");
        return NULL;
    }
    h->magic = MDL_CONFIG_MAGIC;
    return h;
}

API aclError aclmdlDestroyConfigHandle(aclmdlConfigHandle *handle)
{
    if (!handle || handle->magic != MDL_CONFIG_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlDestroyConfigHandle: %s",
                            handle ? "not a live aclmdlConfigHandle" : "handle is NULL");
    free(handle->path);
    handle->magic = 0;
    free(handle);
    return ACL_SUCCESS;
}

/* valueSize must be the size of the attribute's type; pointer attributes point to the pointer. */
API aclError aclmdlSetConfigOpt(aclmdlConfigHandle *handle, aclmdlConfigAttr attr, const void *attrValue,
                                size_t valueSize)
{
    const char *what = "aclmdlSetConfigOpt";
    if (!handle || handle->magic != MDL_CONFIG_MAGIC || !attrValue)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s", what,
                            !attrValue ? "attrValue is NULL" : "handle is not a live aclmdlConfigHandle");
    size_t want = attr == ACL_MDL_PRIORITY_INT32 ? sizeof(int32_t)
                  : attr == ACL_MDL_PATH_PTR || attr == ACL_MDL_MEM_ADDR_PTR || attr == ACL_MDL_WEIGHT_ADDR_PTR ||
                          attr == ACL_MDL_WORKSPACE_ADDR_PTR
                      ? sizeof(void *)
                      : sizeof(size_t);
    if (attr > ACL_MDL_WORKSPACE_SIZET)
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT, "%s: config attribute %d is not supported on a FlexNPU share",
                            what, (int)attr);
    if (valueSize != want)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %d takes %zu bytes, valueSize is %zu", what,
                            (int)attr, want, valueSize);
    switch (attr) {
    case ACL_MDL_PRIORITY_INT32:
        memcpy(&handle->priority, attrValue, sizeof handle->priority);
        break;
    case ACL_MDL_LOAD_TYPE_SIZET:
        memcpy(&handle->load_type, attrValue, sizeof handle->load_type);
        handle->has_load_type = 1;
        break;
    case ACL_MDL_PATH_PTR: {
        const char *path;
        memcpy(&path, attrValue, sizeof path);
        char *copy = path ? strdup(path) : NULL;
        if (!copy)
            return flexnpu_fail(path ? ACL_ERROR_BAD_ALLOC : ACL_ERROR_INVALID_PARAM, "%s: %s", what,
                                path ? "out of host memory" : "the path is NULL");
        free(handle->path);
        handle->path = copy; /* a deep copy, as CANN makes */
        break;
    }
    case ACL_MDL_MEM_ADDR_PTR:
        memcpy(&handle->mem, attrValue, sizeof handle->mem);
        break;
    case ACL_MDL_MEM_SIZET:
        memcpy(&handle->mem_size, attrValue, sizeof handle->mem_size);
        break;
    case ACL_MDL_WEIGHT_ADDR_PTR:
        memcpy(&handle->weight, attrValue, sizeof handle->weight);
        break;
    case ACL_MDL_WEIGHT_SIZET:
        memcpy(&handle->weight_size, attrValue, sizeof handle->weight_size);
        break;
    case ACL_MDL_WORKSPACE_ADDR_PTR:
        memcpy(&handle->work, attrValue, sizeof handle->work);
        break;
    default: /* ACL_MDL_WORKSPACE_SIZET */
        memcpy(&handle->work_size, attrValue, sizeof handle->work_size);
        break;
    }
    return ACL_SUCCESS;
}

static int do_load_with_config(const aclmdlConfigHandle *h, uint32_t *model_id)
{
    const char *what = "aclmdlLoadWithConfig";
    if (!h || h->magic != MDL_CONFIG_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: handle is not a live aclmdlConfigHandle", what);
    if (!h->has_load_type)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: ACL_MDL_LOAD_TYPE_SIZET is not set", what);
    int with_mem = h->load_type == ACL_MDL_LOAD_FROM_FILE_WITH_MEM || h->load_type == ACL_MDL_LOAD_FROM_MEM_WITH_MEM;
    switch (h->load_type) {
    case ACL_MDL_LOAD_FROM_FILE:
    case ACL_MDL_LOAD_FROM_FILE_WITH_MEM:
        if (!h->path)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: ACL_MDL_PATH_PTR is not set", what);
        break;
    case ACL_MDL_LOAD_FROM_MEM:
    case ACL_MDL_LOAD_FROM_MEM_WITH_MEM:
        if (!h->mem || !h->mem_size)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: ACL_MDL_MEM_ADDR_PTR and ACL_MDL_MEM_SIZET are needed",
                                what);
        break;
    default:
        return flexnpu_fail(h->load_type == ACL_MDL_LOAD_FROM_FILE_WITH_Q || h->load_type == ACL_MDL_LOAD_FROM_MEM_WITH_Q
                                ? ACL_ERROR_API_NOT_SUPPORT
                                : ACL_ERROR_INVALID_PARAM,
                            "%s: load type %zu is not served (1..4: from file or memory, with or without memory)",
                            what, h->load_type);
    }
    return do_load(h->load_type <= ACL_MDL_LOAD_FROM_FILE_WITH_MEM ? h->path : NULL,
                   h->load_type <= ACL_MDL_LOAD_FROM_FILE_WITH_MEM ? NULL : h->mem, h->mem_size, model_id,
                   with_mem ? h->work : NULL, with_mem ? h->work_size : 0, with_mem ? h->weight : NULL,
                   with_mem ? h->weight_size : 0, what);
}

API aclError aclmdlLoadWithConfig(const aclmdlConfigHandle *handle, uint32_t *modelId)
{
    LOCKED(do_load_with_config(handle, modelId));
}
