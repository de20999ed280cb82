/*
opapi.h: what the share's libnnopbase.so (the aclnn host-side objects: nnopbase.c) and libopapi.so
 * (the aclnn functions, generated into aclnn_functions.c from api/aclnn_api.json, plus nnopbase.c)
 * share: the objects' layouts and the executor builder.
 *
 * An aclnnXxxGetWorkspaceSize call builds an executor in the client: every tensor it reads becomes an
 * input and every tensor it writes an output (fxTensor views: dims, strides, offset and the storage's
 * base and size, copied, so the caller may destroy its objects at once); every other parameter an
 * attribute under CANN's parameter name (aclopAttr). The workspace size is 0. aclnnXxx(workspace,
 * size, executor, stream) sends it as one operator through libascendcl.so's fx_op_launch
 * (acl/flexnpu_op.h) and frees the executor, unless aclSetAclOpExecutorRepeatable made it reusable
 * (then aclDestroyAclOpExecutor frees it).
 */
#ifndef FLEXNPU_OPAPI_H_
#define FLEXNPU_OPAPI_H_

#include "aclnn/aclnn_base.h"
#include "acl/acl_op.h"
#include "acl/flexnpu_op.h"

#define API __attribute__((visibility("default")))

/* CANN's aclnn statuses (aclnn/opdev/op_errno.h) */
#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_RUNTIME_ERROR 361001
#define ACLNN_ERR_INNER 561000

#define OPAPI_MAX_DIMS FX_OP_MAX_DIMS
#define OPAPI_MAX_TENSORS FX_OP_MAX_TENSORS
#define OPAPI_MAX_LIST 4096 /* elements of an aclIntArray/FloatArray/BoolArray, tensors of a list */

#define TENSOR_MAGIC 0x464e5431u   /* "FNT1" */
#define SCALAR_MAGIC 0x464e5331u   /* "FNS1" */
#define INTARR_MAGIC 0x464e4931u   /* "FNI1" */
#define FLTARR_MAGIC 0x464e4631u   /* "FNF1" */
#define BOOLARR_MAGIC 0x464e4231u  /* "FNB1" */
#define TLIST_MAGIC 0x464e4c31u    /* "FNL1" */
#define SLIST_MAGIC 0x464e5231u    /* "FNR1" */
#define EXECUTOR_MAGIC 0x464e4531u /* "FNE1" */

struct aclTensor {
    uint32_t magic;
    int32_t dtype;
    int32_t format;
    uint32_t ndim;
    uint32_t storage_ndim;
    int64_t dims[OPAPI_MAX_DIMS];
    int64_t strides[OPAPI_MAX_DIMS];
    int64_t offset;
    int64_t storage_dims[OPAPI_MAX_DIMS];
    void *data;
};

struct aclScalar {
    uint32_t magic;
    int32_t dtype;
    unsigned char value[16]; /* the value's bytes, as aclCreateScalar read them */
};

struct aclIntArray {
    uint32_t magic;
    uint64_t n;
    int64_t *v;
};

struct aclFloatArray {
    uint32_t magic;
    uint64_t n;
    float *v;
};

struct aclBoolArray {
    uint32_t magic;
    uint64_t n;
    bool *v;
};

struct aclTensorList {
    uint32_t magic;
    uint64_t n;
    aclTensor **v; /* the list's own copies (aclDestroyTensorList frees them) */
};

struct aclScalarList {
    uint32_t magic;
    uint64_t n;
    aclScalar **v;
};

/* One operator call being built (GetWorkspaceSize) and sent (the launch). */
struct aclOpExecutor {
    uint32_t magic;
    int repeatable;
    int failed; /* a parameter was refused: status is the answer */
    aclnnStatus status;
    char name[64];
    int n_in, n_out;
    fxTensor in[OPAPI_MAX_TENSORS], out[OPAPI_MAX_TENSORS];
    struct aclTensor in_t[OPAPI_MAX_TENSORS], out_t[OPAPI_MAX_TENSORS]; /* what in/out point into */
    aclopAttr *attrs;
};

/* nnopbase.c, exported for libopapi.so only (names outside CANN's). */
API aclOpExecutor *flexnpu_opapi_begin(const char *name);
API void flexnpu_opapi_tensor(aclOpExecutor *e, const char *param, const aclTensor *t, int optional, int output);
API void flexnpu_opapi_tensor_list(aclOpExecutor *e, const char *param, const aclTensorList *list);
API void flexnpu_opapi_scalar(aclOpExecutor *e, const char *param, const aclScalar *s);
API void flexnpu_opapi_int(aclOpExecutor *e, const char *param, int64_t v);
API void flexnpu_opapi_bool(aclOpExecutor *e, const char *param, bool v);
API void flexnpu_opapi_double(aclOpExecutor *e, const char *param, double v);
API void flexnpu_opapi_int_array(aclOpExecutor *e, const char *param, const aclIntArray *a, int optional);
API void flexnpu_opapi_string(aclOpExecutor *e, const char *param, const char *s);
API aclnnStatus flexnpu_opapi_finish(aclOpExecutor *e, uint64_t *workspaceSize, aclOpExecutor **executor);
API aclnnStatus flexnpu_opapi_launch(const char *name, void *workspace, uint64_t workspaceSize,
                                     aclOpExecutor *executor, aclrtStream stream);

#endif /* FLEXNPU_OPAPI_H_ */
