/*
 * nnopbase.c: libnnopbase.so, the aclnn API's host-side objects (CANN's aclnn/acl_meta.h) and the
 * executor that libopapi.so's aclnnXxxGetWorkspaceSize builds and aclnnXxx sends (opapi.h).
 *
 * Objects are plain heap objects with a magic number: a NULL or foreign pointer given to a getter or
 * a Destroy answers ACLNN_ERR_PARAM_NULLPTR / ACLNN_ERR_PARAM_INVALID instead of crashing; every
 * Create copies what it is given (dims, values), so the caller's arrays may go at once. A refused
 * parameter is reported with aclAppLog (ERROR, naming the function and the parameter) and its
 * status returned by GetWorkspaceSize, as CANN's.
 */
#include "opapi.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CHECKED(obj, want) ((obj) && ((const struct { uint32_t magic; } *)(const void *)(obj))->magic == (want))

static void say(const char *fn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const char *fn, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    aclAppLog(ACL_ERROR, fn, __FILE__, __LINE__, "%s", msg);
}

/* -- tensors --------------------------------------------------------------------------------------- */

static int dtype_size(int32_t dtype)
{
    size_t n = aclDataTypeSize((aclDataType)dtype);
    return (int)n;
}

static aclnnStatus fill_tensor(struct aclTensor *t, const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                               const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storageDims,
                               uint64_t storageDimsNum, void *data, const char *fn)
{
    if (viewDimsNum > OPAPI_MAX_DIMS || storageDimsNum > OPAPI_MAX_DIMS) {
        say(fn, "%s: %llu view dims, %llu storage dims (at most %d)", fn, (unsigned long long)viewDimsNum,
            (unsigned long long)storageDimsNum, OPAPI_MAX_DIMS);
        return ACLNN_ERR_PARAM_INVALID;
    }
    if ((viewDimsNum && !viewDims) || (storageDimsNum && !storageDims)) {
        say(fn, "%s: viewDims or storageDims is NULL", fn);
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (offset < 0) {
        say(fn, "%s: offset %lld is negative", fn, (long long)offset);
        return ACLNN_ERR_PARAM_INVALID;
    }
    memset(t, 0, sizeof *t);
    t->magic = TENSOR_MAGIC;
    t->dtype = (int32_t)dataType;
    t->format = (int32_t)format;
    t->ndim = (uint32_t)viewDimsNum;
    t->storage_ndim = (uint32_t)storageDimsNum;
    int64_t step = 1;
    for (int k = (int)viewDimsNum - 1; k >= 0; k--) { /* stride NULL: contiguous */
        if (viewDims[k] < 0) {
            say(fn, "%s: view dim %d is %lld", fn, k, (long long)viewDims[k]);
            return ACLNN_ERR_PARAM_INVALID;
        }
        t->dims[k] = viewDims[k];
        t->strides[k] = stride ? stride[k] : step;
        step *= viewDims[k] > 1 ? viewDims[k] : 1;
    }
    for (uint64_t k = 0; k < storageDimsNum; k++)
        t->storage_dims[k] = storageDims[k];
    t->offset = offset;
    t->data = data;
    return ACLNN_SUCCESS;
}

API aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                               const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storageDims,
                               uint64_t storageDimsNum, void *tensorData)
{
    struct aclTensor *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    if (fill_tensor(t, viewDims, viewDimsNum, dataType, stride, offset, format, storageDims, storageDimsNum,
                    tensorData, "aclCreateTensor")) {
        free(t);
        return NULL;
    }
    return t;
}

API aclnnStatus aclInitTensor(aclTensor *tensor, const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                              const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storageDims,
                              uint64_t storageDimsNum, void *tensorDataAddr)
{
    if (!CHECKED(tensor, TENSOR_MAGIC))
        return tensor ? ACLNN_ERR_PARAM_INVALID : ACLNN_ERR_PARAM_NULLPTR;
    struct aclTensor t;
    aclnnStatus rc = fill_tensor(&t, viewDims, viewDimsNum, dataType, stride, offset, format, storageDims,
                                 storageDimsNum, tensorDataAddr, "aclInitTensor");
    if (rc == ACLNN_SUCCESS)
        *tensor = t;
    return rc;
}

#define DESTROY(fn, type, magic_, body)                                                                           \
    API aclnnStatus fn(const type *obj)                                                                           \
    {                                                                                                             \
        if (!obj)                                                                                                 \
            return ACLNN_SUCCESS; /* CANN: destroying NULL does nothing */                                        \
        if (!CHECKED(obj, magic_))                                                                                \
            return ACLNN_ERR_PARAM_INVALID;                                                                       \
        type *o = (type *)(uintptr_t)obj;                                                                         \
        body;                                                                                                     \
        o->magic = 0;                                                                                             \
        free(o);                                                                                                  \
        return ACLNN_SUCCESS;                                                                                     \
    }

DESTROY(aclDestroyTensor, aclTensor, TENSOR_MAGIC, (void)0)
DESTROY(aclDestroyScalar, aclScalar, SCALAR_MAGIC, (void)0)
DESTROY(aclDestroyIntArray, aclIntArray, INTARR_MAGIC, free(o->v))
DESTROY(aclDestroyFloatArray, aclFloatArray, FLTARR_MAGIC, free(o->v))
DESTROY(aclDestroyBoolArray, aclBoolArray, BOOLARR_MAGIC, free(o->v))
DESTROY(aclDestroyTensorList, aclTensorList, TLIST_MAGIC,
        for (uint64_t i = 0; i < o->n; i++) aclDestroyTensor(o->v[i]);
        free(o->v))
DESTROY(aclDestroyScalarList, aclScalarList, SLIST_MAGIC,
        for (uint64_t i = 0; i < o->n; i++) aclDestroyScalar(o->v[i]);
        free(o->v))

/* A malloc'd copy of n int64s (the caller frees it; CANN's callers use delete[], which glibc's C++
 * runtime serves with free for arrays of a trivial type). */
static aclnnStatus give_dims(const int64_t *src, uint64_t n, int64_t **out, uint64_t *out_n)
{
    if (!out || !out_n)
        return ACLNN_ERR_PARAM_NULLPTR;
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return ACLNN_ERR_INNER;
    if (n)
        memcpy(v, src, n * sizeof *v);
    *out = v;
    *out_n = n;
    return ACLNN_SUCCESS;
}

#define TENSOR_GETTER_CHECK(t)                                                                                    \
    if (!(t))                                                                                                     \
        return ACLNN_ERR_PARAM_NULLPTR;                                                                           \
    if (!CHECKED(t, TENSOR_MAGIC))                                                                                \
        return ACLNN_ERR_PARAM_INVALID;

API aclnnStatus aclGetViewShape(const aclTensor *tensor, int64_t **viewDims, uint64_t *viewDimsNum)
{
    TENSOR_GETTER_CHECK(tensor)
    return give_dims(tensor->dims, tensor->ndim, viewDims, viewDimsNum);
}

API aclnnStatus aclGetStorageShape(const aclTensor *tensor, int64_t **storageDims, uint64_t *storageDimsNum)
{
    TENSOR_GETTER_CHECK(tensor)
    return give_dims(tensor->storage_dims, tensor->storage_ndim, storageDims, storageDimsNum);
}

API aclnnStatus aclGetViewStrides(const aclTensor *tensor, int64_t **stridesValue, uint64_t *stridesNum)
{
    TENSOR_GETTER_CHECK(tensor)
    return give_dims(tensor->strides, tensor->ndim, stridesValue, stridesNum);
}

API aclnnStatus aclGetViewOffset(const aclTensor *tensor, int64_t *offset)
{
    TENSOR_GETTER_CHECK(tensor)
    if (!offset)
        return ACLNN_ERR_PARAM_NULLPTR;
    *offset = tensor->offset;
    return ACLNN_SUCCESS;
}

API aclnnStatus aclGetFormat(const aclTensor *tensor, aclFormat *format)
{
    TENSOR_GETTER_CHECK(tensor)
    if (!format)
        return ACLNN_ERR_PARAM_NULLPTR;
    *format = (aclFormat)tensor->format;
    return ACLNN_SUCCESS;
}

API aclnnStatus aclGetDataType(const aclTensor *tensor, aclDataType *dataType)
{
    TENSOR_GETTER_CHECK(tensor)
    if (!dataType)
        return ACLNN_ERR_PARAM_NULLPTR;
    *dataType = (aclDataType)tensor->dtype;
    return ACLNN_SUCCESS;
}

API aclnnStatus aclSetRawTensorAddr(aclTensor *tensor, void *addr)
{
    TENSOR_GETTER_CHECK(tensor)
    tensor->data = addr;
    return ACLNN_SUCCESS;
}

API aclnnStatus aclGetRawTensorAddr(const aclTensor *tensor, void **addr)
{
    TENSOR_GETTER_CHECK(tensor)
    if (!addr)
        return ACLNN_ERR_PARAM_NULLPTR;
    *addr = tensor->data;
    return ACLNN_SUCCESS;
}

/* -- scalars and arrays ------------------------------------------------------------------------------ */

API aclScalar *aclCreateScalar(void *value, aclDataType dataType)
{
    int size = dtype_size(dataType);
    if (!value || size <= 0 || size > 16) {
        say("aclCreateScalar", "aclCreateScalar: %s (dataType %d)", value ? "a dataType without a size" : "value is NULL",
            (int)dataType);
        return NULL;
    }
    struct aclScalar *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->magic = SCALAR_MAGIC;
    s->dtype = (int32_t)dataType;
    memcpy(s->value, value, (size_t)size);
    return s;
}

#define CREATE_ARRAY(fn, type, elem, magic_)                                                                      \
    API type *fn(const elem *value, uint64_t size)                                                                \
    {                                                                                                             \
        if ((size && !value) || size > OPAPI_MAX_LIST) {                                                          \
            say(#fn, #fn ": %llu values at %p (at most %d)", (unsigned long long)size, (const void *)value,       \
                OPAPI_MAX_LIST);                                                                                  \
            return NULL;                                                                                          \
        }                                                                                                         \
        type *a = calloc(1, sizeof *a);                                                                           \
        elem *v = malloc((size ? size : 1) * sizeof *v);                                                          \
        if (!a || !v) {                                                                                           \
            free(a), free(v);                                                                                     \
            return NULL;                                                                                          \
        }                                                                                                         \
        if (size)                                                                                                 \
            memcpy(v, value, size * sizeof *v);                                                                   \
        a->magic = magic_;                                                                                        \
        a->n = size;                                                                                              \
        a->v = v;                                                                                                 \
        return a;                                                                                                 \
    }

CREATE_ARRAY(aclCreateIntArray, aclIntArray, int64_t, INTARR_MAGIC)
CREATE_ARRAY(aclCreateFloatArray, aclFloatArray, float, FLTARR_MAGIC)
CREATE_ARRAY(aclCreateBoolArray, aclBoolArray, bool, BOOLARR_MAGIC)

/* A list holds copies of the tensors (or scalars) it is given, and frees them when destroyed. */
#define CREATE_LIST(fn, type, elem, magic_, elem_magic, copy)                                                     \
    API type *fn(const elem *const *value, uint64_t size)                                                         \
    {                                                                                                             \
        if ((size && !value) || size > OPAPI_MAX_LIST) {                                                          \
            say(#fn, #fn ": %llu objects at %p (at most %d)", (unsigned long long)size, (const void *)value,      \
                OPAPI_MAX_LIST);                                                                                  \
            return NULL;                                                                                          \
        }                                                                                                         \
        for (uint64_t i = 0; i < size; i++)                                                                       \
            if (value[i] && !CHECKED(value[i], elem_magic)) {                                                     \
                say(#fn, #fn ": element %llu is not one", (unsigned long long)i);                                 \
                return NULL;                                                                                      \
            }                                                                                                     \
        type *l = calloc(1, sizeof *l);                                                                           \
        elem **v = calloc(size ? size : 1, sizeof *v);                                                            \
        if (!l || !v) {                                                                                           \
            free(l), free(v);                                                                                     \
            return NULL;                                                                                          \
        }                                                                                                         \
        l->magic = magic_;                                                                                        \
        l->v = v;                                                                                                 \
        for (uint64_t i = 0; i < size; i++) {                                                                     \
            if (value[i] && !(v[i] = malloc(sizeof *v[i]))) {                                                     \
                l->n = i;                                                                                         \
                fn##_free(l);                                                                                     \
                return NULL;                                                                                      \
            }                                                                                                     \
            if (value[i])                                                                                         \
                copy;                                                                                             \
        }                                                                                                         \
        l->n = size;                                                                                              \
        return l;                                                                                                 \
    }

static void aclCreateTensorList_free(aclTensorList *l) { aclDestroyTensorList(l); }
static void aclCreateScalarList_free(aclScalarList *l) { aclDestroyScalarList(l); }

CREATE_LIST(aclCreateTensorList, aclTensorList, aclTensor, TLIST_MAGIC, TENSOR_MAGIC, *v[i] = *value[i])
CREATE_LIST(aclCreateScalarList, aclScalarList, aclScalar, SLIST_MAGIC, SCALAR_MAGIC, *v[i] = *value[i])

#define SIZE_GETTER(fn, type, magic_)                                                                             \
    API aclnnStatus fn(const type *obj, uint64_t *size)                                                           \
    {                                                                                                             \
        if (!obj || !size)                                                                                        \
            return ACLNN_ERR_PARAM_NULLPTR;                                                                       \
        if (!CHECKED(obj, magic_))                                                                                \
            return ACLNN_ERR_PARAM_INVALID;                                                                       \
        *size = obj->n;                                                                                           \
        return ACLNN_SUCCESS;                                                                                     \
    }

SIZE_GETTER(aclGetIntArraySize, aclIntArray, INTARR_MAGIC)
SIZE_GETTER(aclGetFloatArraySize, aclFloatArray, FLTARR_MAGIC)
SIZE_GETTER(aclGetBoolArraySize, aclBoolArray, BOOLARR_MAGIC)
SIZE_GETTER(aclGetTensorListSize, aclTensorList, TLIST_MAGIC)
SIZE_GETTER(aclGetScalarListSize, aclScalarList, SLIST_MAGIC)

/* -- aclnnInit / aclnnFinalize ------------------------------------------------------------------------ */

API aclnnStatus aclnnInit(const char *configPath)
{
    (void)configPath; /* nothing to load: the operators run in the aclserver */
    return ACLNN_SUCCESS;
}

API aclnnStatus aclnnFinalize(void)
{
    return ACLNN_SUCCESS;
}

/* -- the executor -------------------------------------------------------------------------------------- */

static void refuse(aclOpExecutor *e, aclnnStatus status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(aclOpExecutor *e, aclnnStatus status, const char *fmt, ...)
{
    if (e->failed)
        return; /* the first refusal is the answer */
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->failed = 1;
    e->status = status;
    say(e->name, "%sGetWorkspaceSize: %s", e->name, msg);
}

API aclOpExecutor *flexnpu_opapi_begin(const char *name)
{
    aclOpExecutor *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->magic = EXECUTOR_MAGIC;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->attrs = aclopCreateAttr();
    if (!e->attrs)
        refuse(e, ACLNN_ERR_INNER, "out of host memory");
    return e;
}

static void add_tensor(aclOpExecutor *e, const char *param, const aclTensor *t, int output)
{
    int *n = output ? &e->n_out : &e->n_in;
    if (*n >= OPAPI_MAX_TENSORS) {
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s: more than %d tensors", param, OPAPI_MAX_TENSORS);
        return;
    }
    fxTensor *f = output ? &e->out[*n] : &e->in[*n];
    struct aclTensor *copy = output ? &e->out_t[*n] : &e->in_t[*n];
    (*n)++;
    memset(f, 0, sizeof *f);
    if (!t) {
        f->placement = FX_TENSOR_ABSENT;
        return;
    }
    *copy = *t;
    f->placement = FX_TENSOR_DEVICE;
    f->dtype = copy->dtype;
    f->format = copy->format;
    f->ndim = (int32_t)copy->ndim;
    f->dims = copy->dims;
    f->strides = copy->strides;
    f->offset = copy->offset;
    f->data = copy->data;
    int size = dtype_size(copy->dtype);
    uint64_t elements = copy->storage_ndim ? 1 : 0;
    for (uint32_t k = 0; k < copy->storage_ndim; k++)
        elements *= copy->storage_dims[k] > 0 ? (uint64_t)copy->storage_dims[k] : 0;
    f->storage_bytes = size > 0 ? elements * (uint64_t)size : 0; /* 0: the server checks the allocation */
}

API void flexnpu_opapi_tensor(aclOpExecutor *e, const char *param, const aclTensor *t, int optional, int output)
{
    if (!e)
        return;
    if (!t && !optional) {
        refuse(e, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", param);
        return;
    }
    if (t && !CHECKED(t, TENSOR_MAGIC)) {
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s is not an aclTensor", param);
        return;
    }
    add_tensor(e, param, t, output);
}

API void flexnpu_opapi_tensor_list(aclOpExecutor *e, const char *param, const aclTensorList *list)
{
    if (!e)
        return;
    if (!list) {
        refuse(e, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", param);
        return;
    }
    if (!CHECKED(list, TLIST_MAGIC)) {
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s is not an aclTensorList", param);
        return;
    }
    for (uint64_t i = 0; i < list->n; i++) {
        if (!list->v[i]) {
            refuse(e, ACLNN_ERR_PARAM_NULLPTR, "%s[%llu] is NULL", param, (unsigned long long)i);
            return;
        }
        add_tensor(e, param, list->v[i], 0);
    }
}

static void set_attr(aclOpExecutor *e, const char *param, aclError rc)
{
    if (rc != ACL_SUCCESS)
        refuse(e, ACLNN_ERR_INNER, "%s: the attribute could not be kept (%d)", param, (int)rc);
}

API void flexnpu_opapi_scalar(aclOpExecutor *e, const char *param, const aclScalar *s)
{
    if (!e)
        return;
    if (!s) {
        refuse(e, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", param);
        return;
    }
    if (!CHECKED(s, SCALAR_MAGIC)) {
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s is not an aclScalar", param);
        return;
    }
    const unsigned char *p = s->value;
    int64_t i;
    double d;
    switch (s->dtype) {
    case ACL_BOOL:
        set_attr(e, param, aclopSetAttrBool(e->attrs, param, (uint8_t)(*p != 0)));
        return;
    case ACL_INT8: i = *(const int8_t *)(const void *)p; break;
    case ACL_UINT8: i = *p; break;
    case ACL_INT16: { int16_t v; memcpy(&v, p, sizeof v); i = v; break; }
    case ACL_UINT16: { uint16_t v; memcpy(&v, p, sizeof v); i = v; break; }
    case ACL_INT32: { int32_t v; memcpy(&v, p, sizeof v); i = v; break; }
    case ACL_UINT32: { uint32_t v; memcpy(&v, p, sizeof v); i = v; break; }
    case ACL_INT64: memcpy(&i, p, sizeof i); break;
    case ACL_UINT64: { uint64_t v; memcpy(&v, p, sizeof v); i = (int64_t)v; break; }
    case ACL_FLOAT: { float v; memcpy(&v, p, sizeof v); d = v; goto real; }
    case ACL_DOUBLE: memcpy(&d, p, sizeof d); goto real;
    case ACL_FLOAT16: { aclFloat16 v; memcpy(&v, p, sizeof v); d = aclFloat16ToFloat(v); goto real; }
    case ACL_BF16: { uint16_t v; memcpy(&v, p, sizeof v); uint32_t w = (uint32_t)v << 16; float f; memcpy(&f, &w, 4); d = f; goto real; }
    default:
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s: an aclScalar of dataType %d", param, (int)s->dtype);
        return;
    }
    set_attr(e, param, aclopSetAttrInt(e->attrs, param, i));
    return;
real:
    set_attr(e, param, aclopSetAttrFloat(e->attrs, param, (float)d));
}

API void flexnpu_opapi_int(aclOpExecutor *e, const char *param, int64_t v)
{
    if (e)
        set_attr(e, param, aclopSetAttrInt(e->attrs, param, v));
}

API void flexnpu_opapi_bool(aclOpExecutor *e, const char *param, bool v)
{
    if (e)
        set_attr(e, param, aclopSetAttrBool(e->attrs, param, (uint8_t)v));
}

API void flexnpu_opapi_double(aclOpExecutor *e, const char *param, double v)
{
    if (e)
        set_attr(e, param, aclopSetAttrFloat(e->attrs, param, (float)v));
}

API void flexnpu_opapi_int_array(aclOpExecutor *e, const char *param, const aclIntArray *a, int optional)
{
    if (!e || (!a && optional)) /* an absent optional array: no attribute */
        return;
    if (!a) {
        refuse(e, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", param);
        return;
    }
    if (!CHECKED(a, INTARR_MAGIC)) {
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s is not an aclIntArray", param);
        return;
    }
    set_attr(e, param, aclopSetAttrListInt(e->attrs, param, (int)a->n, a->v));
}

API void flexnpu_opapi_string(aclOpExecutor *e, const char *param, const char *s)
{
    if (!e)
        return;
    if (!s) {
        refuse(e, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", param);
        return;
    }
    if (strnlen(s, 256) == 256) {
        refuse(e, ACLNN_ERR_PARAM_INVALID, "%s is longer than 255 bytes", param);
        return;
    }
    set_attr(e, param, aclopSetAttrString(e->attrs, param, s));
}

static void executor_free(aclOpExecutor *e)
{
    aclopDestroyAttr(e->attrs);
    e->magic = 0;
    free(e);
}

API aclnnStatus flexnpu_opapi_finish(aclOpExecutor *e, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!e)
        return ACLNN_ERR_INNER;
    if (!workspaceSize || !executor) {
        refuse(e, ACLNN_ERR_PARAM_NULLPTR, "workspaceSize or executor is NULL");
    }
    if (e->failed) {
        aclnnStatus rc = e->status;
        executor_free(e);
        return rc;
    }
    *workspaceSize = 0;
    *executor = e;
    return ACLNN_SUCCESS;
}

API aclnnStatus flexnpu_opapi_launch(const char *name, void *workspace, uint64_t workspaceSize,
                                     aclOpExecutor *executor, aclrtStream stream)
{
    (void)workspace, (void)workspaceSize; /* the workspace size is 0: no workspace is used */
    if (!executor) {
        say(name, "%s: executor is NULL", name);
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (!CHECKED(executor, EXECUTOR_MAGIC) || strcmp(executor->name, name) != 0) {
        say(name, "%s: the executor is not one %sGetWorkspaceSize made", name, name);
        return ACLNN_ERR_PARAM_INVALID;
    }
    int rc = fx_op_launch(name, executor->n_in, executor->in, executor->n_out, executor->out, executor->attrs, stream);
    if (!executor->repeatable)
        executor_free(executor);
    return rc == ACL_SUCCESS ? ACLNN_SUCCESS : rc;
}

API aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor)
{
    if (!executor)
        return ACLNN_ERR_PARAM_NULLPTR;
    if (!CHECKED(executor, EXECUTOR_MAGIC))
        return ACLNN_ERR_PARAM_INVALID;
    executor->repeatable = 1;
    return ACLNN_SUCCESS;
}

API aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    if (!executor)
        return ACLNN_SUCCESS;
    if (!CHECKED(executor, EXECUTOR_MAGIC))
        return ACLNN_ERR_PARAM_INVALID;
    executor_free(executor);
    return ACLNN_SUCCESS;
}
