/*
 * buffer.c: aclDataBuffer (an address and a size the caller owns) and aclDataTypeSize, host-side.
 * A data buffer never owns its memory: destroying it leaves the data to the caller.
 */
#include "client.h"
#include "objects.h"

static int buffer_check(const aclDataBuffer *buffer, const char *what)
{
    return object_check(buffer, DATA_BUFFER_MAGIC, what, "dataBuffer", "aclDataBuffer");
}

API aclDataBuffer *aclCreateDataBuffer(void *data, size_t size)
{
    aclDataBuffer *b = object_new(sizeof *b, DATA_BUFFER_MAGIC, "aclCreateDataBuffer");
    if (b) {
        b->data = data;
        b->size = size;
    }
    return b;
}

API aclError aclDestroyDataBuffer(const aclDataBuffer *dataBuffer)
{
    int rc = buffer_check(dataBuffer, "aclDestroyDataBuffer");
    if (rc)
        return rc;
    object_free((aclDataBuffer *)dataBuffer);
    return ACL_SUCCESS;
}

API aclError aclUpdateDataBuffer(aclDataBuffer *dataBuffer, void *data, size_t size)
{
    int rc = buffer_check(dataBuffer, "aclUpdateDataBuffer");
    if (rc)
        return rc;
    dataBuffer->data = data;
    dataBuffer->size = size;
    return ACL_SUCCESS;
}

API void *aclGetDataBufferAddr(const aclDataBuffer *dataBuffer)
{
    return buffer_check(dataBuffer, "aclGetDataBufferAddr") ? NULL : dataBuffer->data;
}

API uint32_t aclGetDataBufferSize(const aclDataBuffer *dataBuffer)
{
    return buffer_check(dataBuffer, "aclGetDataBufferSize") ? 0 : (uint32_t)dataBuffer->size;
}

API size_t aclGetDataBufferSizeV2(const aclDataBuffer *dataBuffer)
{
    return buffer_check(dataBuffer, "aclGetDataBufferSizeV2") ? 0 : dataBuffer->size;
}

/* CANN's sizes: 0 for strings and undefined, 1 byte for the sub-byte types (INT4, UINT1), and
 * 8 for every type it does not list (the 6- and 4-bit floats included). */
API size_t aclDataTypeSize(aclDataType dataType)
{
    switch (dataType) {
    case ACL_STRING:
    case ACL_DT_UNDEFINED:
        return 0;
    case ACL_UINT1:
    case ACL_INT4:
    case ACL_BOOL:
    case ACL_INT8:
    case ACL_UINT8:
    case ACL_HIFLOAT8:
    case ACL_FLOAT8_E5M2:
    case ACL_FLOAT8_E4M3FN:
    case ACL_FLOAT8_E8M0:
        return 1;
    case ACL_FLOAT16:
    case ACL_INT16:
    case ACL_UINT16:
    case ACL_BF16:
        return 2;
    case ACL_FLOAT:
    case ACL_INT32:
    case ACL_UINT32:
    case ACL_COMPLEX32:
        return 4;
    case ACL_COMPLEX128:
        return 16;
    default:
        return 8;
    }
}
