/*
 * stub_cann_library.c: a stand-in for one of CANN's other libraries in an application image (built once
 * per SONAME: libopapi.so, libhccl.so, libacl_op_compiler.so, ...). Whatever calls it gets the failure
 * 500001 and a line on stderr naming the stand-in, so a program that reached CANN's copy instead of the
 * share's fails visibly. It exports what torch_npu looks up first in each: the aclnn launches of
 * ones/adds/matmul, aclSetCompileopt, the HCCL communicator calls.
 */
#include <stdio.h>

#ifndef STANDIN
#define STANDIN "a CANN library"
#endif
#define EXPORT __attribute__((visibility("default")))
#define STUB(name)                                                                                              \
    EXPORT int name(void);                                                                                      \
    EXPORT int name(void)                                                                                       \
    {                                                                                                           \
        fprintf(stderr, "stand-in CANN %s: %s called\n", STANDIN, #name);                                      \
        return 500001;                                                                                          \
    }

STUB(aclnnInplaceOneGetWorkspaceSize)
STUB(aclnnInplaceOne)
STUB(aclnnAddsGetWorkspaceSize)
STUB(aclnnAdds)
STUB(aclnnMatmulGetWorkspaceSize)
STUB(aclnnMatmul)
STUB(aclCreateTensor)
STUB(aclCreateScalar)
STUB(aclSetCompileopt)
STUB(aclopCompileAndExecute)
STUB(HcclGetRankSize)
STUB(HcclCommInitRootInfo)
STUB(rtKernelLaunch)
STUB(MsprofReportApi)
