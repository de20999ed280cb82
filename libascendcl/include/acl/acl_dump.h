/*
 * acl/acl_dump.h: dump of operator arguments and exception information.
 *
 * FlexNPU's libascendcl.so: names, values, types and prototypes are CANN's (the ABI programs
 * are built against), written without CANN's comments; enumerator values are spelled out. The
 * function declarations between the markers are generated from libascendcl/api/acl_api.json
 * (python3 libascendcl/api/generate.py); libascendcl/API.md says how each one is served.
 */
#ifndef FLEXNPU_ACL_ACL_DUMP_H_
#define FLEXNPU_ACL_ACL_DUMP_H_

#include <stdint.h>
#include "acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ACL_DUMP_API __attribute__((visibility("default")))
#define ACL_DUMP_WEAK __attribute__((weak))
#else
#define ACL_DUMP_API
#define ACL_DUMP_WEAK
#endif

#define ACL_DUMP_MAX_FILE_PATH_LENGTH 4096
typedef struct acldumpChunk {
    char fileName[ACL_DUMP_MAX_FILE_PATH_LENGTH];
    uint32_t bufLen;
    uint32_t isLastChunk;
    int64_t offset;
    int32_t flag;
#if defined(__GNUC__)
    __extension__ /* a zero-length array, as CANN declares it; quiet under -pedantic */
#endif
    uint8_t dataBuf[0];
} acldumpChunk;

#define ACL_OP_DUMP_OP_AICORE_ARGS 0x00000001U

typedef enum acldumpType {
    AIC_ERR_BRIEF_DUMP = 1,
    AIC_ERR_NORM_DUMP = 2,
    AIC_ERR_DETAIL_DUMP = 3,
    DATA_DUMP = 4,
    OVERFLOW_DUMP = 5,
} acldumpType;

#define ACL_DUMP_MAX_SHAPE_NUM 25

typedef enum acldumpTensorType {
    ACL_DUMP_TENSOR_INPUT = 0,
    ACL_DUMP_TENSOR_OUTPUT = 1,
    ACL_DUMP_TENSOR_WORKSPACE = 2,
} acldumpTensorType;

typedef enum acldumpTensorAddressType {
    ACL_DUMP_ADDR_PTR = 0,
    ACL_DUMP_ADDR_PTR_PTR = 1,
    ACL_DUMP_ADDR_RAW = 2,
} acldumpTensorAddressType;

typedef enum acldumpTensorPlacement {
    ACL_DUMP_PLACEMENT_DEVICE = 0,
    ACL_DUMP_PLACEMENT_HOST = 1,
    ACL_DUMP_PLACEMENT_END = 2,
} acldumpTensorPlacement;

typedef struct acldumpTensorInfo {
    acldumpTensorType type;
    size_t tensorSize;
    int32_t format;
    int32_t dataType;
    int64_t* tensorAddr;
    acldumpTensorAddressType addrType;
    acldumpTensorPlacement placement;
    uint32_t argsOffset;
    uint32_t shapeNum;
    uint32_t originShapeNum;
    uint64_t shape[ACL_DUMP_MAX_SHAPE_NUM];
    uint64_t originShape[ACL_DUMP_MAX_SHAPE_NUM];
} acldumpTensorInfo;

/* @generated functions begin (libascendcl/api/generate.py) */
/* dump */
ACL_FUNC_VISIBILITY aclError acldumpRegCallback(
    int32_t (*const messageCallback)(const acldumpChunk *, int32_t), int32_t flag);
ACL_FUNC_VISIBILITY void acldumpUnregCallback();
ACL_FUNC_VISIBILITY aclError aclopStartDumpArgs(uint32_t dumpType, const char *path);
ACL_FUNC_VISIBILITY aclError aclopStopDumpArgs(uint32_t dumpType);
ACL_FUNC_VISIBILITY const char *acldumpGetPath(acldumpType dumpType);

/* error */
ACL_DUMP_WEAK ACL_FUNC_VISIBILITY aclError acldumpSaveExceptionInfo(const char *fileName, const char *userTag,
    const acldumpTensorInfo *tensors, size_t tensorCount);
ACL_DUMP_WEAK ACL_FUNC_VISIBILITY aclError acldumpGetExceptionInfoPath(char *path, size_t maxLen);
/* @generated functions end */

#ifdef __cplusplus
}
#endif

#endif /* FLEXNPU_ACL_ACL_DUMP_H_ */
