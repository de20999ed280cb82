/*
 * flexnpu_op.h: FlexNPU's internal operator launch, exported by libascendcl.so for the share's other
 * client libraries (libacl_op_compiler.so, libopapi.so and the libaclnn_*.so names). Not a CANN API.
 *
 *   int fx_op_launch(const char *op, int n_inputs, const fxTensor *inputs, int n_outputs,
 *                    const fxTensor *outputs, const aclopAttr *attrs, aclrtStream stream);
 *
 * Queues one operator on stream (NULL: the calling thread's device's default stream) as ONE
 * control-link message (wire op OPERATOR, client/flexnpu_wire/opcall.py): no reply is awaited, so
 * an asynchronous stream costs no round trip per operator. The aclserver runs it in stream order:
 * it builds array views over the share's device memory from each tensor's dtype, dims, strides and
 * offset, computes it with the operator library (flexnpu_runtime/aclserver/operators/, keyed by
 * the aclop type "Add", "MatMul", ... or the aclnn name without GetWorkspaceSize, "aclnnAdds", ...)
 * and charges its die time to the share's compute policy.
 *
 * Returns ACL_SUCCESS once the message is sent; an argument the client can check (NULL op, a
 * negative count, more than 64 tensors or attributes, more than 16 dims, a NULL device address)
 * fails at once with ACL_ERROR_INVALID_PARAM and nothing is sent. A failure of the operator itself
 * (unknown op: the message names it; a dtype or shape the operator refuses; memory outside the
 * share) is the stream's error: the next aclrtSynchronizeStream / aclrtSynchronizeDevice (or their
 * WithTimeout forms, or aclrtMemcpyAsync on that stream) returns it, with its message in
 * aclGetRecentErrMsg, and the operators queued after it still run.
 *
 * A tensor is a view: element (i0, i1, ...) is at data + (offset + sum(ik * strides[k])) * itemsize.
 * FX_TENSOR_DEVICE: data is a device pointer (the storage's base) and storage_bytes bounds the
 * storage from data (0: unknown; the server then checks against the allocation). FX_TENSOR_HOST:
 * data is host memory of storage_bytes bytes, copied into the message (a scalar, a shape).
 * FX_TENSOR_ABSENT: an optional input left out. strides NULL means contiguous. attrs may be NULL;
 * build it with aclopCreateAttr / aclopSetAttr* (an aclScalar is an attribute or a 0-d host tensor).
 */
#ifndef FLEXNPU_OP_H_
#define FLEXNPU_OP_H_

#include "acl_base.h"
#include "acl_op.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum fxPlacement { FX_TENSOR_ABSENT = 0, FX_TENSOR_DEVICE = 1, FX_TENSOR_HOST = 2 };

typedef struct fxTensor {
    int32_t placement; /* enum fxPlacement */
    int32_t dtype;     /* aclDataType */
    int32_t format;    /* aclFormat (ACL_FORMAT_ND = 2) */
    int32_t ndim;      /* 0..16 */
    const int64_t *dims;
    const int64_t *strides; /* in elements; NULL: contiguous */
    int64_t offset;         /* in elements, from data */
    const void *data;
    uint64_t storage_bytes;
} fxTensor;

#define FX_OP_MAX_TENSORS 64
#define FX_OP_MAX_DIMS 16

ACL_FUNC_VISIBILITY int fx_op_launch(const char *op, int n_inputs, const fxTensor *inputs, int n_outputs,
                                     const fxTensor *outputs, const aclopAttr *attrs, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* FLEXNPU_OP_H_ */
