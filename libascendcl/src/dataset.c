/*
 * dataset.c: aclmdlDataset, host-side: an ordered list of the caller's data buffers, each with an
 * optional tensor descriptor the dataset copies and owns (as CANN: destroying the dataset frees
 * its descriptors, never the buffers or their memory).
 */
#include "client.h"
#include "objects.h"

#include <stdlib.h>

static int dataset_check(const aclmdlDataset *dataset, const char *what)
{
    return object_check(dataset, DATASET_MAGIC, what, "dataset", "aclmdlDataset");
}

static int index_check(const aclmdlDataset *dataset, size_t index, const char *what)
{
    int rc = dataset_check(dataset, what);
    if (!rc && index >= dataset->n)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: index %zu is out of range (the dataset holds %zu buffers)",
                          what, index, dataset->n);
    return rc;
}

API aclmdlDataset *aclmdlCreateDataset(void)
{
    return object_new(sizeof(aclmdlDataset), DATASET_MAGIC, "aclmdlCreateDataset");
}

API aclError aclmdlDestroyDataset(const aclmdlDataset *dataset)
{
    int rc = dataset_check(dataset, "aclmdlDestroyDataset");
    if (rc)
        return rc;
    aclmdlDataset *d = (aclmdlDataset *)dataset;
    for (size_t i = 0; i < d->n; i++)
        aclDestroyTensorDesc(d->blobs[i].desc);
    free(d->blobs);
    object_free(d);
    return ACL_SUCCESS;
}

API aclError aclmdlAddDatasetBuffer(aclmdlDataset *dataset, aclDataBuffer *dataBuffer)
{
    int rc = dataset_check(dataset, "aclmdlAddDatasetBuffer");
    if (rc)
        return rc;
    rc = object_check(dataBuffer, DATA_BUFFER_MAGIC, "aclmdlAddDatasetBuffer", "dataBuffer", "aclDataBuffer");
    if (rc)
        return rc;
    if (dataset->n == dataset->cap) {
        size_t cap = dataset->cap ? 2 * dataset->cap : 8;
        struct dataset_blob *nb = realloc(dataset->blobs, cap * sizeof *nb);
        if (!nb)
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclmdlAddDatasetBuffer: out of host memory");
        dataset->blobs = nb;
        dataset->cap = cap;
    }
    dataset->blobs[dataset->n++] = (struct dataset_blob){dataBuffer, NULL};
    return ACL_SUCCESS;
}

API size_t aclmdlGetDatasetNumBuffers(const aclmdlDataset *dataset)
{
    return dataset_check(dataset, "aclmdlGetDatasetNumBuffers") ? 0 : dataset->n;
}

API aclDataBuffer *aclmdlGetDatasetBuffer(const aclmdlDataset *dataset, size_t index)
{
    return index_check(dataset, index, "aclmdlGetDatasetBuffer") ? NULL : dataset->blobs[index].buffer;
}

/* NULL removes the index's descriptor; otherwise the dataset keeps its own copy of tensorDesc. */
API aclError aclmdlSetDatasetTensorDesc(aclmdlDataset *dataset, aclTensorDesc *tensorDesc, size_t index)
{
    int rc = index_check(dataset, index, "aclmdlSetDatasetTensorDesc");
    if (rc)
        return rc;
    aclTensorDesc *copy = NULL;
    if (tensorDesc) {
        rc = tensor_desc_check(tensorDesc, "aclmdlSetDatasetTensorDesc");
        if (rc)
            return rc;
        copy = tensor_desc_copy(tensorDesc);
        if (!copy)
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclmdlSetDatasetTensorDesc: out of host memory");
    }
    if (dataset->blobs[index].desc)
        aclDestroyTensorDesc(dataset->blobs[index].desc);
    dataset->blobs[index].desc = copy;
    return ACL_SUCCESS;
}

API aclTensorDesc *aclmdlGetDatasetTensorDesc(const aclmdlDataset *dataset, size_t index)
{
    return index_check(dataset, index, "aclmdlGetDatasetTensorDesc") ? NULL : dataset->blobs[index].desc;
}
