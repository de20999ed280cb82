/*
 * hccl.c: libhccl.so with single-device semantics. A share is one device of one process group:
 * a communicator of one rank (rank 0 of 1) can be made, queried and destroyed; every collective or
 * point-to-point call answers HCCL_E_NOT_SUPPORT (5) and says so on stderr once per function name,
 * because a vNPU share has no peer to reach (docs/pytorch.md: what vLLM's tensor parallelism needs).
 * Prototypes and values as CANN's hccl.h / hccl_types.h.
 */
#include "closure.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    HCCL_SUCCESS = 0,
    HCCL_E_PARA = 1,
    HCCL_E_PTR = 2,
    HCCL_E_MEMORY = 3,
    HCCL_E_INTERNAL = 4,
    HCCL_E_NOT_SUPPORT = 5,
} HcclResult;
typedef void *HcclComm;
typedef void *aclrtStream;
typedef int HcclDataType;
typedef int HcclReduceOp;
#define HCCL_ROOT_INFO_BYTES 4108
typedef struct HcclRootInfoDef {
    char internal[HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

#define COMM_MAGIC 0x46484343u /* "FHCC" */
struct comm {
    uint32_t magic;
};

API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm);
API HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm);
API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
API HcclResult HcclCommDestroy(HcclComm comm);
API const char *HcclGetErrorString(HcclResult code);
API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                             HcclComm comm, aclrtStream stream);
API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                             aclrtStream stream);
API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                             aclrtStream stream);
API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                 HcclReduceOp op, HcclComm comm, aclrtStream stream);
API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);
API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                        aclrtStream stream);
API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                        aclrtStream stream);

static HcclResult unsupported(const char *what)
{
    fprintf(stderr, "FlexNPU libhccl.so: %s: collectives need peers; a FlexNPU vNPU share is one device of one rank "
                    "(HCCL_E_NOT_SUPPORT)\n", what);
    return HCCL_E_NOT_SUPPORT;
}

static int live(HcclComm comm)
{
    return comm && ((struct comm *)comm)->magic == COMM_MAGIC;
}

API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)
{
    if (!rootInfo)
        return HCCL_E_PTR;
    memset(rootInfo, 0, sizeof *rootInfo);
    memcpy(rootInfo->internal, "flexnpu-single-rank", sizeof "flexnpu-single-rank");
    return HCCL_SUCCESS;
}

API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm)
{
    if (!rootInfo || !comm)
        return HCCL_E_PTR;
    if (nRanks != 1 || rank != 0)
        return unsupported("HcclCommInitRootInfo with more than one rank");
    struct comm *c = calloc(1, sizeof *c);
    if (!c)
        return HCCL_E_MEMORY;
    c->magic = COMM_MAGIC;
    *comm = c;
    return HCCL_SUCCESS;
}

API HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm)
{
    (void)clusterInfo, (void)rank, (void)comm;
    return unsupported("HcclCommInitClusterInfo");
}

API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize)
{
    if (!live(comm) || !rankSize)
        return HCCL_E_PARA;
    *rankSize = 1;
    return HCCL_SUCCESS;
}

API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank)
{
    if (!live(comm) || !rank)
        return HCCL_E_PARA;
    *rank = 0;
    return HCCL_SUCCESS;
}

API HcclResult HcclCommDestroy(HcclComm comm)
{
    if (!live(comm))
        return HCCL_E_PARA;
    ((struct comm *)comm)->magic = 0;
    free(comm);
    return HCCL_SUCCESS;
}

API const char *HcclGetErrorString(HcclResult code)
{
    switch (code) {
    case HCCL_SUCCESS:
        return "success";
    case HCCL_E_PARA:
        return "parameter error";
    case HCCL_E_PTR:
        return "empty pointer";
    case HCCL_E_MEMORY:
        return "memory error";
    case HCCL_E_NOT_SUPPORT:
        return "not supported on a FlexNPU vNPU share (one device, one rank)";
    default:
        return "internal error";
    }
}

API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                             HcclComm comm, aclrtStream stream)
{
    (void)sendBuf, (void)recvBuf, (void)count, (void)dataType, (void)op, (void)comm, (void)stream;
    return unsupported("HcclAllReduce");
}

API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                             aclrtStream stream)
{
    (void)buf, (void)count, (void)dataType, (void)root, (void)comm, (void)stream;
    return unsupported("HcclBroadcast");
}

API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                             aclrtStream stream)
{
    (void)sendBuf, (void)recvBuf, (void)sendCount, (void)dataType, (void)comm, (void)stream;
    return unsupported("HcclAllGather");
}

API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                 HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    (void)sendBuf, (void)recvBuf, (void)recvCount, (void)dataType, (void)op, (void)comm, (void)stream;
    return unsupported("HcclReduceScatter");
}

API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream)
{
    (void)comm, (void)stream;
    return unsupported("HcclBarrier");
}

API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                        aclrtStream stream)
{
    (void)sendBuf, (void)count, (void)dataType, (void)destRank, (void)comm, (void)stream;
    return unsupported("HcclSend");
}

API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                        aclrtStream stream)
{
    (void)recvBuf, (void)count, (void)dataType, (void)srcRank, (void)comm, (void)stream;
    return unsupported("HcclRecv");
}
