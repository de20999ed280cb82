/*
 * tensor.c: aclTensorDesc, host-side: every getter and setter CANN declares, with CANN's meaning
 * of each (the "origin" shape and format are what the getters report; aclSetTensorShape and
 * aclSetTensorFormat set the storage ones). aclTransTensorDescFormat is a stub (api/acl_api.json).
 */
#include "client.h"
#include "objects.h"

#include <stdlib.h>
#include <string.h>

#define UNKNOWN_RANK_DIM (-2) /* a dims list [-2] means "rank unknown" */

int tensor_desc_check(const aclTensorDesc *desc, const char *what)
{
    return object_check(desc, TENSOR_DESC_MAGIC, what, "desc", "aclTensorDesc");
}

/* Replace list with n values copied from v (n == 0: empty). -1 when out of memory. */
static int list_set(struct int64_list *list, const int64_t *v, size_t n)
{
    int64_t *copy = NULL;
    if (n) {
        copy = malloc(n * sizeof *copy);
        if (!copy)
            return -1;
        memcpy(copy, v, n * sizeof *copy);
    }
    free(list->v);
    list->v = copy;
    list->n = n;
    return 0;
}

static void clear(aclTensorDesc *desc)
{
    free(desc->dims.v);
    free(desc->storage_dims.v);
    free(desc->shape_range.v);
    free(desc->value_range.v);
    free(desc->name);
    free(desc->dynamic_input);
    free(desc->const_data);
    desc->magic = 0;
}

API aclTensorDesc *aclCreateTensorDesc(aclDataType dataType, int numDims, const int64_t *dims, aclFormat format)
{
    if (numDims < 0) {
        flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclCreateTensorDesc: numDims %d is negative", numDims);
        return NULL;
    }
    if (numDims > 0 && !dims) {
        flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclCreateTensorDesc: dims is NULL while numDims is %d", numDims);
        return NULL;
    }
    aclTensorDesc *d = object_new(sizeof *d, TENSOR_DESC_MAGIC, "aclCreateTensorDesc");
    if (!d)
        return NULL;
    d->data_type = dataType;
    d->format = format;
    d->storage_format = ACL_FORMAT_UNDEFINED;
    d->placement = ACL_MEMTYPE_DEVICE;
    d->name = strdup("");
    if (!d->name || list_set(&d->dims, dims, (size_t)numDims)) {
        clear(d);
        object_free(d);
        flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclCreateTensorDesc: out of host memory");
        return NULL;
    }
    return d;
}

API void aclDestroyTensorDesc(const aclTensorDesc *desc)
{
    if (tensor_desc_check(desc, "aclDestroyTensorDesc"))
        return;
    clear((aclTensorDesc *)desc);
    object_free((aclTensorDesc *)desc);
}

aclTensorDesc *tensor_desc_copy(const aclTensorDesc *src)
{
    aclTensorDesc *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    *d = *src;
    d->dims = d->storage_dims = d->shape_range = d->value_range = (struct int64_list){NULL, 0};
    d->name = d->dynamic_input = NULL;
    d->const_data = NULL;
    int bad = list_set(&d->dims, src->dims.v, src->dims.n) || list_set(&d->storage_dims, src->storage_dims.v,
                                                                        src->storage_dims.n) ||
              list_set(&d->shape_range, src->shape_range.v, src->shape_range.n) ||
              list_set(&d->value_range, src->value_range.v, src->value_range.n) || !(d->name = strdup(src->name)) ||
              (src->dynamic_input && !(d->dynamic_input = strdup(src->dynamic_input)));
    if (!bad && src->const_data) {
        d->const_data = malloc(src->const_len);
        bad = !d->const_data;
        if (!bad)
            memcpy(d->const_data, src->const_data, src->const_len);
    }
    if (bad) {
        clear(d);
        object_free(d);
        return NULL;
    }
    return d;
}

static int set_ranges(aclTensorDesc *desc, struct int64_list *list, size_t count, int64_t (*ranges)[2],
                      const char *what)
{
    int rc = tensor_desc_check(desc, what);
    if (rc)
        return rc;
    if (count && !ranges)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the ranges are NULL while their count is %zu", what, count);
    if (count > SIZE_MAX / (2 * sizeof(int64_t)))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu ranges overflow", what, count);
    if (list_set(list, count ? &ranges[0][0] : NULL, 2 * count))
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    return ACL_SUCCESS;
}

API aclError aclSetTensorShapeRange(aclTensorDesc *desc, size_t dimsCount,
                                    int64_t dimsRange[][ACL_TENSOR_SHAPE_RANGE_NUM])
{
    return set_ranges(desc, desc ? &desc->shape_range : NULL, dimsCount, dimsRange, "aclSetTensorShapeRange");
}

API aclError aclSetTensorValueRange(aclTensorDesc *desc, size_t valueCount,
                                    int64_t valueRange[][ACL_TENSOR_VALUE_RANGE_NUM])
{
    return set_ranges(desc, desc ? &desc->value_range : NULL, valueCount, valueRange, "aclSetTensorValueRange");
}

API aclDataType aclGetTensorDescType(const aclTensorDesc *desc)
{
    return tensor_desc_check(desc, "aclGetTensorDescType") ? ACL_DT_UNDEFINED : desc->data_type;
}

API aclFormat aclGetTensorDescFormat(const aclTensorDesc *desc)
{
    return tensor_desc_check(desc, "aclGetTensorDescFormat") ? ACL_FORMAT_UNDEFINED : desc->format;
}

/* The product of the dims: 1 for a scalar, 0 for a dynamic (negative) dim or an overflow. */
static size_t element_count(const aclTensorDesc *desc)
{
    size_t count = 1;
    for (size_t i = 0; i < desc->dims.n; i++) {
        int64_t dim = desc->dims.v[i];
        if (dim < 0)
            return 0;
        if (dim && count > SIZE_MAX / (uint64_t)dim)
            return 0;
        count *= (size_t)dim;
    }
    return count;
}

API size_t aclGetTensorDescElementCount(const aclTensorDesc *desc)
{
    return tensor_desc_check(desc, "aclGetTensorDescElementCount") ? 0 : element_count(desc);
}

API size_t aclGetTensorDescSize(const aclTensorDesc *desc)
{
    if (tensor_desc_check(desc, "aclGetTensorDescSize"))
        return 0;
    size_t count = element_count(desc), unit = aclDataTypeSize(desc->data_type);
    return unit && count > SIZE_MAX / unit ? 0 : count * unit;
}

API size_t aclGetTensorDescNumDims(const aclTensorDesc *desc)
{
    if (tensor_desc_check(desc, "aclGetTensorDescNumDims"))
        return 0;
    if (desc->dims.n && desc->dims.v[0] == UNKNOWN_RANK_DIM)
        return (size_t)ACL_UNKNOWN_RANK;
    return desc->dims.n;
}

static int dim_index(const aclTensorDesc *desc, size_t index, size_t n, const char *what)
{
    int rc = tensor_desc_check(desc, what);
    if (!rc && index >= n)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: index %zu is out of range (%zu dims)", what, index, n);
    return rc;
}

API int64_t aclGetTensorDescDim(const aclTensorDesc *desc, size_t index)
{
    return dim_index(desc, index, desc ? desc->dims.n : 0, "aclGetTensorDescDim") ? -1 : desc->dims.v[index];
}

API aclError aclGetTensorDescDimV2(const aclTensorDesc *desc, size_t index, int64_t *dimSize)
{
    if (!dimSize)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetTensorDescDimV2: dimSize is NULL");
    int rc = dim_index(desc, index, desc ? desc->dims.n : 0, "aclGetTensorDescDimV2");
    if (!rc)
        *dimSize = desc->dims.v[index];
    return rc;
}

API aclError aclGetTensorDescDimRange(const aclTensorDesc *desc, size_t index, size_t dimRangeNum, int64_t *dimRange)
{
    if (!dimRange)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetTensorDescDimRange: dimRange is NULL");
    int rc = dim_index(desc, index, desc ? desc->shape_range.n / 2 : 0, "aclGetTensorDescDimRange");
    if (rc)
        return rc;
    if (dimRangeNum < ACL_TENSOR_SHAPE_RANGE_NUM)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetTensorDescDimRange: dimRangeNum %zu is less than %d",
                            dimRangeNum, ACL_TENSOR_SHAPE_RANGE_NUM);
    dimRange[0] = desc->shape_range.v[2 * index];
    dimRange[1] = desc->shape_range.v[2 * index + 1];
    return ACL_SUCCESS;
}

API void aclSetTensorDescName(aclTensorDesc *desc, const char *name)
{
    if (tensor_desc_check(desc, "aclSetTensorDescName"))
        return;
    char *copy = strdup(name ? name : "");
    if (!copy) {
        flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclSetTensorDescName: out of host memory");
        return;
    }
    free(desc->name);
    desc->name = copy;
}

API const char *aclGetTensorDescName(aclTensorDesc *desc)
{
    return tensor_desc_check(desc, "aclGetTensorDescName") ? "" : desc->name;
}

static int set_format(aclTensorDesc *desc, aclFormat *field, aclFormat format, const char *what)
{
    int rc = tensor_desc_check(desc, what);
    if (!rc)
        *field = format;
    return rc;
}

API aclError aclSetTensorStorageFormat(aclTensorDesc *desc, aclFormat format)
{
    return set_format(desc, desc ? &desc->storage_format : NULL, format, "aclSetTensorStorageFormat");
}

API aclError aclSetTensorFormat(aclTensorDesc *desc, aclFormat format)
{
    return set_format(desc, desc ? &desc->storage_format : NULL, format, "aclSetTensorFormat");
}

API aclError aclSetTensorOriginFormat(aclTensorDesc *desc, aclFormat format)
{
    return set_format(desc, desc ? &desc->format : NULL, format, "aclSetTensorOriginFormat");
}

static int set_shape(aclTensorDesc *desc, struct int64_list *list, int numDims, const int64_t *dims,
                     const char *what)
{
    int rc = tensor_desc_check(desc, what);
    if (rc)
        return rc;
    if (!dims)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: dims is NULL", what);
    if (numDims < 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: numDims %d is negative", what, numDims);
    if (list_set(list, dims, (size_t)numDims))
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    return ACL_SUCCESS;
}

API aclError aclSetTensorStorageShape(aclTensorDesc *desc, int numDims, const int64_t *dims)
{
    return set_shape(desc, desc ? &desc->storage_dims : NULL, numDims, dims, "aclSetTensorStorageShape");
}

API aclError aclSetTensorShape(aclTensorDesc *desc, int numDims, const int64_t *dims)
{
    return set_shape(desc, desc ? &desc->storage_dims : NULL, numDims, dims, "aclSetTensorShape");
}

API aclError aclSetTensorOriginShape(aclTensorDesc *desc, int numDims, const int64_t *dims)
{
    return set_shape(desc, desc ? &desc->dims : NULL, numDims, dims, "aclSetTensorOriginShape");
}

/* As CANN: descriptors may sit in an array (index selects one); one made by aclCreateTensorDesc
 * is an array of one. */
API aclTensorDesc *aclGetTensorDescByIndex(aclTensorDesc *desc, size_t index)
{
    if (!desc) {
        flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetTensorDescByIndex: desc is NULL");
        return NULL;
    }
    return &desc[index];
}

API void *aclGetTensorDescAddress(const aclTensorDesc *desc)
{
    return tensor_desc_check(desc, "aclGetTensorDescAddress") ? NULL : desc->address;
}

API aclError aclSetTensorDynamicInput(aclTensorDesc *desc, const char *dynamicInputName)
{
    int rc = tensor_desc_check(desc, "aclSetTensorDynamicInput");
    if (rc)
        return rc;
    if (!dynamicInputName)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclSetTensorDynamicInput: dynamicInputName is NULL");
    char *copy = strdup(dynamicInputName);
    if (!copy)
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclSetTensorDynamicInput: out of host memory");
    free(desc->dynamic_input);
    desc->dynamic_input = copy;
    return ACL_SUCCESS;
}

API aclError aclSetTensorConst(aclTensorDesc *desc, void *dataBuffer, size_t length)
{
    int rc = tensor_desc_check(desc, "aclSetTensorConst");
    if (rc)
        return rc;
    if (!dataBuffer || length == 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclSetTensorConst: %s", dataBuffer ? "length is 0"
                                                                                          : "dataBuffer is NULL");
    void *copy = malloc(length);
    if (!copy)
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclSetTensorConst: out of host memory for %zu bytes", length);
    memcpy(copy, dataBuffer, length);
    free(desc->const_data);
    desc->const_data = copy;
    desc->const_len = length;
    return ACL_SUCCESS;
}

API aclError aclSetTensorPlaceMent(aclTensorDesc *desc, aclMemType memType)
{
    int rc = tensor_desc_check(desc, "aclSetTensorPlaceMent");
    if (rc)
        return rc;
    if (memType != ACL_MEMTYPE_DEVICE && memType != ACL_MEMTYPE_HOST && memType != ACL_MEMTYPE_HOST_COMPILE_INDEPENDENT)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclSetTensorPlaceMent: unknown memType %d", (int)memType);
    desc->placement = memType;
    return ACL_SUCCESS;
}
