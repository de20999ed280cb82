/*
 * unsupported.c: ACL symbols an application may resolve that a FlexNPU share does not serve.
 * Each returns ACL_ERROR_API_NOT_SUPPORT (200001) and leaves a message for aclGetRecentErrMsg,
 * so a program that probes for them fails cleanly instead of crashing on an unresolved symbol.
 * Only functions returning aclError are listed (the arguments are ignored, which every C calling
 * convention this library is built for allows).
 */
#include "client.h"

#define API ACL_FUNC_VISIBILITY

#define UNSUPPORTED(name)                                                                                        \
    API aclError name(void);                                                                                     \
    API aclError name(void)                                                                                      \
    {                                                                                                            \
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT,                                                           \
                            #name " is not supported on a FlexNPU vNPU share (libascendcl.so client)");           \
    }

/* runtime */
UNSUPPORTED(aclrtSetOpWaitTimeout)
UNSUPPORTED(aclrtSetOpExecuteTimeOut)
UNSUPPORTED(aclrtCreateStreamWithConfig)
UNSUPPORTED(aclrtDestroyStreamForce)
UNSUPPORTED(aclrtSynchronizeStreamWithTimeout)
UNSUPPORTED(aclrtStreamQuery)
UNSUPPORTED(aclrtSetStreamFailureMode)
UNSUPPORTED(aclrtCreateEventExWithFlag)
UNSUPPORTED(aclrtQueryEventWaitStatus)
UNSUPPORTED(aclrtSynchronizeDeviceWithTimeout)
UNSUPPORTED(aclrtMemcpy2d)
UNSUPPORTED(aclrtMemcpy2dAsync)
UNSUPPORTED(aclrtDeviceCanAccessPeer)
UNSUPPORTED(aclrtDeviceEnablePeerAccess)
UNSUPPORTED(aclrtDeviceDisablePeerAccess)
UNSUPPORTED(aclrtGetDeviceUtilizationRate)
UNSUPPORTED(aclrtGetDeviceInfo)
UNSUPPORTED(aclrtGetDeviceSatMode)
UNSUPPORTED(aclrtSetDeviceSatMode)
UNSUPPORTED(aclrtSetTsDevice)
UNSUPPORTED(aclrtSubscribeReport)
UNSUPPORTED(aclrtUnSubscribeReport)
UNSUPPORTED(aclrtProcessReport)
UNSUPPORTED(aclrtLaunchCallback)
UNSUPPORTED(aclrtSetExceptionInfoCallback)
UNSUPPORTED(aclrtGetGroupCount)
UNSUPPORTED(aclrtGetAllGroupInfo)
UNSUPPORTED(aclrtSetGroup)
UNSUPPORTED(aclrtCtxGetSysParamOpt)
UNSUPPORTED(aclrtCtxSetSysParamOpt)
UNSUPPORTED(aclrtGetMemUsageInfo)
UNSUPPORTED(aclrtGetVersion)
UNSUPPORTED(aclrtGetOverflowStatus)
UNSUPPORTED(aclrtResetOverflowStatus)
UNSUPPORTED(aclrtBinaryLoad)
UNSUPPORTED(aclrtBinaryLoadFromFile)
UNSUPPORTED(aclrtBinaryUnLoad)
UNSUPPORTED(aclrtBinaryGetFunction)
UNSUPPORTED(aclrtMemExportToShareableHandle)
UNSUPPORTED(aclrtMemImportFromShareableHandle)
UNSUPPORTED(aclrtMallocPhysical)
UNSUPPORTED(aclrtFreePhysical)
UNSUPPORTED(aclrtReserveMemAddress)
UNSUPPORTED(aclrtReleaseMemAddress)
UNSUPPORTED(aclrtMapMem)
UNSUPPORTED(aclrtUnmapMem)
UNSUPPORTED(aclrtDeviceGetStreamPriorityRange)
UNSUPPORTED(aclrtPeekAtLastError)
UNSUPPORTED(aclrtGetLastError)
/* base, capabilities and versions */
UNSUPPORTED(aclGetDeviceCapability)
UNSUPPORTED(aclGetVersion)
UNSUPPORTED(aclGetCannAttribute)
UNSUPPORTED(aclGetCannAttributeList)
UNSUPPORTED(aclSetCompileopt)
UNSUPPORTED(aclInitCallbackRegister)
UNSUPPORTED(aclFinalizeCallbackRegister)
/* models */
UNSUPPORTED(aclmdlLoadFromFile)
UNSUPPORTED(aclmdlLoadFromMem)
UNSUPPORTED(aclmdlLoadFromFileWithMem)
UNSUPPORTED(aclmdlLoadFromMemWithMem)
UNSUPPORTED(aclmdlExecute)
UNSUPPORTED(aclmdlExecuteAsync)
UNSUPPORTED(aclmdlUnload)
UNSUPPORTED(aclmdlQuerySize)
UNSUPPORTED(aclmdlQuerySizeFromMem)
UNSUPPORTED(aclmdlGetDesc)
UNSUPPORTED(aclmdlDestroyDesc)
UNSUPPORTED(aclmdlSetDynamicBatchSize)
UNSUPPORTED(aclmdlSetDynamicHWSize)
UNSUPPORTED(aclmdlSetInputDynamicDims)
/* single operators */
UNSUPPORTED(aclopExecute)
UNSUPPORTED(aclopExecuteV2)
UNSUPPORTED(aclopCompile)
UNSUPPORTED(aclopCompileAndExecute)
UNSUPPORTED(aclopCompileAndExecuteV2)
UNSUPPORTED(aclopSetModelDir)
UNSUPPORTED(aclopLoad)
UNSUPPORTED(aclopCreateHandle)
UNSUPPORTED(aclopExecWithHandle)
UNSUPPORTED(aclopCreateKernel)
UNSUPPORTED(aclopRegisterCompileFunc)
UNSUPPORTED(aclopUpdateParams)
UNSUPPORTED(aclopInferShape)
/* profiling and dump */
UNSUPPORTED(aclprofInit)
UNSUPPORTED(aclprofStart)
UNSUPPORTED(aclprofStop)
UNSUPPORTED(aclprofFinalize)
UNSUPPORTED(aclmdlInitDump)
UNSUPPORTED(aclmdlSetDump)
UNSUPPORTED(aclmdlFinalizeDump)
