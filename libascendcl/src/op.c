/*
 * op.c: single operators. fx_op_launch (acl/flexnpu_op.h) marshals one operator — its name, each
 * tensor as a view of device memory or host bytes by value, its attributes — into ONE OPERATOR
 * message (client/flexnpu_wire/opcall.py) and sends it without waiting for a reply: the aclserver
 * runs it in stream order and a failure becomes the stream's error, returned by its next
 * synchronize. aclopCompileAndExecute(V2), aclopExecute and aclopExecuteV2 are fx_op_launch over
 * CANN's tensor descriptors and data buffers; libopapi.so's aclnn launches call fx_op_launch too.
 * aclSetCompileopt and the compile options are kept here (a share compiles nothing).
 */
#include "client.h"
#include "objects.h"

#include "acl/acl.h"
#include "acl/acl_op_compiler.h"
#include "acl/flexnpu_op.h"

#include <stdlib.h>
#include <string.h>

#define OP_NAME_MAX 128

/* -- the word buffer (objects.h) ----------------------------------------------------------------- */

static void wbuf_reserve(struct wbuf *b, size_t more)
{
    if (b->oom || b->len + more <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->len + more)
        cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void wbuf_word(struct wbuf *b, int64_t v)
{
    wbuf_reserve(b, 8);
    if (b->oom)
        return;
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--, u >>= 8)
        b->p[b->len + (size_t)i] = (unsigned char)(u & 0xff);
    b->len += 8;
}

void wbuf_double(struct wbuf *b, double v)
{
    int64_t bits;
    memcpy(&bits, &v, sizeof bits);
    wbuf_word(b, bits);
}

void wbuf_blob(struct wbuf *b, const void *data, size_t n)
{
    size_t padded = (n + 7) & ~(size_t)7;
    wbuf_word(b, (int64_t)n);
    wbuf_reserve(b, padded);
    if (b->oom)
        return;
    if (n)
        memcpy(b->p + b->len, data, n);
    memset(b->p + b->len + n, 0, padded - n);
    b->len += padded;
}

/* -- fx_op_launch ---------------------------------------------------------------------------------- */

static int check_tensor(const char *op, const char *side, int i, const fxTensor *t)
{
    if (t->placement == FX_TENSOR_ABSENT)
        return 0;
    if (t->placement != FX_TENSOR_DEVICE && t->placement != FX_TENSOR_HOST)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s[%d]: placement %d is not device (1) or host (2)", op,
                            side, i, (int)t->placement);
    if (t->ndim < 0 || t->ndim > FX_OP_MAX_DIMS || (t->ndim > 0 && !t->dims))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s[%d]: %d dims at %p (0..%d, not NULL)", op, side, i,
                            (int)t->ndim, (const void *)t->dims, FX_OP_MAX_DIMS);
    int64_t elements = 1;
    for (int k = 0; k < t->ndim; k++) {
        if (t->dims[k] < 0)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s[%d]: dim %d is %lld", op, side, i, k,
                                (long long)t->dims[k]);
        elements *= t->dims[k];
    }
    if (t->offset < 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s[%d]: offset %lld is negative", op, side, i,
                            (long long)t->offset);
    if (elements && !t->data)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s[%d]: data is NULL", op, side, i);
    return 0;
}

static void put_tensor(struct wbuf *b, const fxTensor *t)
{
    wbuf_word(b, t->placement);
    if (t->placement == FX_TENSOR_ABSENT)
        return;
    wbuf_word(b, t->dtype);
    wbuf_word(b, t->format);
    wbuf_word(b, t->ndim);
    for (int k = 0; k < t->ndim; k++)
        wbuf_word(b, t->dims[k]);
    int64_t step = 1;
    int64_t contiguous[FX_OP_MAX_DIMS];
    for (int k = t->ndim - 1; k >= 0; k--) {
        contiguous[k] = step;
        step *= t->dims[k] > 1 ? t->dims[k] : 1;
    }
    for (int k = 0; k < t->ndim; k++)
        wbuf_word(b, t->strides ? t->strides[k] : contiguous[k]);
    wbuf_word(b, t->offset);
    if (t->placement == FX_TENSOR_DEVICE) {
        wbuf_word(b, (int64_t)(uintptr_t)t->data);
        wbuf_word(b, (int64_t)(t->storage_bytes > INT64_MAX ? 0 : t->storage_bytes));
    } else {
        wbuf_blob(b, t->data, (size_t)t->storage_bytes);
    }
}

static int launch(const char *op, int n_in, const fxTensor *in, int n_out, const fxTensor *out,
                  const aclopAttr *attrs, aclrtStream stream)
{
    if (!op || !*op || strlen(op) > OP_NAME_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "fx_op_launch: the operator's name is NULL, empty or over %d "
                                                     "bytes", OP_NAME_MAX);
    if (n_in < 0 || n_out < 0 || n_in > FX_OP_MAX_TENSORS || n_out > FX_OP_MAX_TENSORS || (n_in && !in) ||
        (n_out && !out))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %d inputs at %p, %d outputs at %p (0..%d each)", op, n_in,
                            (const void *)in, n_out, (const void *)out, FX_OP_MAX_TENSORS);
    if (attrs && object_check(attrs, OP_ATTR_MAGIC, op, "attr", "aclopAttr"))
        return ACL_ERROR_INVALID_PARAM;
    size_t n_attrs = opattr_count(attrs);
    if (n_attrs > FX_OP_MAX_TENSORS)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu attributes (at most %d)", op, n_attrs,
                            FX_OP_MAX_TENSORS);
    for (int i = 0; i < n_in; i++)
        if (check_tensor(op, "inputs", i, &in[i]))
            return ACL_ERROR_INVALID_PARAM;
    for (int i = 0; i < n_out; i++)
        if (check_tensor(op, "outputs", i, &out[i]))
            return ACL_ERROR_INVALID_PARAM;
    int rc = session_ready(op);
    if (rc)
        return rc;
    int64_t sid;
    rc = stream_resolve(stream, &sid, op);
    if (rc)
        return rc;
    struct wbuf b = {0};
    wbuf_blob(&b, op, strlen(op));
    for (int i = 0; i < n_in; i++)
        put_tensor(&b, &in[i]);
    for (int i = 0; i < n_out; i++)
        put_tensor(&b, &out[i]);
    opattr_encode(attrs, &b);
    if (b.oom) {
        free(b.p);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory for its message", op);
    }
    int64_t ints[4] = {sid, n_in, n_out, (int64_t)n_attrs};
    uint32_t rid;
    rc = rpc_send(OP_OPERATOR, ints, 4, b.p, b.len, &rid, op); /* never answered (ops.py) */
    free(b.p);
    return rc;
}

API int fx_op_launch(const char *op, int n_inputs, const fxTensor *inputs, int n_outputs, const fxTensor *outputs,
                     const aclopAttr *attrs, aclrtStream stream)
{
    LOCKED(launch(op, n_inputs, inputs, n_outputs, outputs, attrs, stream));
}

/* -- aclop: CANN's descriptors and buffers as fxTensors -------------------------------------------- */

/* The fxTensor of one aclop operand; NULL desc or buffer: an absent optional input. */
static int from_desc(const char *op, const char *side, int i, const aclTensorDesc *desc, const aclDataBuffer *buf,
                     fxTensor *t)
{
    memset(t, 0, sizeof *t);
    if (!desc) {
        t->placement = FX_TENSOR_ABSENT;
        return 0;
    }
    if (tensor_desc_check(desc, op))
        return ACL_ERROR_INVALID_PARAM;
    t->dtype = (int32_t)desc->data_type;
    t->format = (int32_t)desc->format;
    t->ndim = (int32_t)desc->dims.n;
    t->dims = desc->dims.v;
    if (desc->dims.n > FX_OP_MAX_DIMS)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s[%d] has %zu dims (at most %d)", op, side, i,
                            desc->dims.n, FX_OP_MAX_DIMS);
    if (desc->const_data) { /* aclSetTensorConst: the value travels with the operator */
        t->placement = FX_TENSOR_HOST;
        t->data = desc->const_data;
        t->storage_bytes = desc->const_len;
        return 0;
    }
    if (!buf) {
        t->placement = FX_TENSOR_ABSENT;
        return 0;
    }
    if (object_check(buf, DATA_BUFFER_MAGIC, op, side, "aclDataBuffer"))
        return ACL_ERROR_INVALID_PARAM;
    t->data = buf->data;
    t->storage_bytes = buf->size;
    /* ACL_MEMTYPE_HOST (1) and ACL_MEMTYPE_HOST_COMPILE_INDEPENDENT (2): the bytes are the caller's */
    t->placement = desc->placement == ACL_MEMTYPE_DEVICE ? FX_TENSOR_DEVICE : FX_TENSOR_HOST;
    return 0;
}

static int execute(const char *what, const char *op_type, int n_in, const aclTensorDesc *const in_desc[],
                   const aclDataBuffer *const in_buf[], int n_out, const aclTensorDesc *const out_desc[],
                   aclDataBuffer *const out_buf[], const aclopAttr *attr, aclrtStream stream)
{
    if (!op_type)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: opType is NULL", what);
    if (n_in < 0 || n_out < 0 || n_in > FX_OP_MAX_TENSORS || n_out > FX_OP_MAX_TENSORS || (n_in && !in_desc) ||
        (n_out && (!out_desc || !out_buf)))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s: %d inputs, %d outputs (0..%d, their arrays not NULL)",
                            what, op_type, n_in, n_out, FX_OP_MAX_TENSORS);
    fxTensor in[FX_OP_MAX_TENSORS], out[FX_OP_MAX_TENSORS];
    for (int i = 0; i < n_in; i++)
        if (from_desc(op_type, "inputs", i, in_desc[i], in_buf ? in_buf[i] : NULL, &in[i]))
            return ACL_ERROR_INVALID_PARAM;
    for (int i = 0; i < n_out; i++) {
        if (!out_desc[i] || !out_buf[i])
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s: output %d has no descriptor or buffer", what,
                                op_type, i);
        if (from_desc(op_type, "outputs", i, out_desc[i], out_buf[i], &out[i]))
            return ACL_ERROR_INVALID_PARAM;
        if (out[i].placement != FX_TENSOR_DEVICE)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s: output %d is not in device memory", what, op_type,
                                i);
    }
    return launch(op_type, n_in, in, n_out, out, attr, stream);
}

API aclError aclopCompileAndExecute(const char *opType, int numInputs, const aclTensorDesc *const inputDesc[],
                                    const aclDataBuffer *const inputs[], int numOutputs,
                                    const aclTensorDesc *const outputDesc[], aclDataBuffer *const outputs[],
                                    const aclopAttr *attr, aclopEngineType engineType, aclopCompileType compileFlag,
                                    const char *opPath, aclrtStream stream)
{
    (void)engineType, (void)compileFlag, (void)opPath; /* nothing is compiled on a share */
    LOCKED(execute("aclopCompileAndExecute", opType, numInputs, inputDesc, inputs, numOutputs, outputDesc, outputs,
                   attr, stream));
}

API aclError aclopCompileAndExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[],
                                      aclDataBuffer *inputs[], int numOutputs, aclTensorDesc *outputDesc[],
                                      aclDataBuffer *outputs[], aclopAttr *attr, aclopEngineType engineType,
                                      aclopCompileType compileFlag, const char *opPath, aclrtStream stream)
{
    (void)engineType, (void)compileFlag, (void)opPath;
    LOCKED(execute("aclopCompileAndExecuteV2", opType, numInputs, (const aclTensorDesc *const *)inputDesc,
                   (const aclDataBuffer *const *)inputs, numOutputs, (const aclTensorDesc *const *)outputDesc,
                   outputs, attr, stream));
}

API aclError aclopExecute(const char *opType, int numInputs, const aclTensorDesc *const inputDesc[],
                          const aclDataBuffer *const inputs[], int numOutputs, const aclTensorDesc *const outputDesc[],
                          aclDataBuffer *const outputs[], const aclopAttr *attr, aclrtStream stream)
{
    LOCKED(execute("aclopExecute", opType, numInputs, inputDesc, inputs, numOutputs, outputDesc, outputs, attr,
                   stream));
}

API aclError aclopExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[], aclDataBuffer *inputs[],
                            int numOutputs, aclTensorDesc *outputDesc[], aclDataBuffer *outputs[], aclopAttr *attr,
                            aclrtStream stream)
{
    LOCKED(execute("aclopExecuteV2", opType, numInputs, (const aclTensorDesc *const *)inputDesc,
                   (const aclDataBuffer *const *)inputs, numOutputs, (const aclTensorDesc *const *)outputDesc,
                   outputs, attr, stream));
}

/* -- compile options: kept, nothing is compiled ---------------------------------------------------- */

#define COMPILE_OPTS 32
static char *compile_opts[COMPILE_OPTS];
static pthread_mutex_t opts_lock = PTHREAD_MUTEX_INITIALIZER;

API aclError aclSetCompileopt(aclCompileOpt opt, const char *value)
{
    if ((int)opt < 0 || (int)opt >= COMPILE_OPTS)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclSetCompileopt: option %d is not an aclCompileOpt", (int)opt);
    if (!value)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclSetCompileopt: value is NULL");
    char *copy = strdup(value);
    if (!copy)
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclSetCompileopt: out of host memory");
    pthread_mutex_lock(&opts_lock);
    free(compile_opts[opt]);
    compile_opts[opt] = copy;
    pthread_mutex_unlock(&opts_lock);
    return ACL_SUCCESS;
}

API size_t aclGetCompileoptSize(aclCompileOpt opt)
{
    if ((int)opt < 0 || (int)opt >= COMPILE_OPTS)
        return 0;
    pthread_mutex_lock(&opts_lock);
    size_t n = compile_opts[opt] ? strlen(compile_opts[opt]) + 1 : 1;
    pthread_mutex_unlock(&opts_lock);
    return n;
}

API aclError aclGetCompileopt(aclCompileOpt opt, char *value, size_t length)
{
    if ((int)opt < 0 || (int)opt >= COMPILE_OPTS || !value)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetCompileopt: option %d, value %p", (int)opt,
                            (void *)value);
    pthread_mutex_lock(&opts_lock);
    const char *v = compile_opts[opt] ? compile_opts[opt] : "";
    size_t need = strlen(v) + 1;
    if (need <= length)
        memcpy(value, v, need);
    pthread_mutex_unlock(&opts_lock);
    return need <= length ? ACL_SUCCESS
                          : flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetCompileopt: option %d needs %zu bytes, got "
                                                                  "%zu", (int)opt, need, length);
}
