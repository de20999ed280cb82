/* physical_prop_layout.c: the layout of CANN's aclrtPhysicalMemProp as FlexNPU's headers (checked against CANN's)
 * declare it, for the ascend backend's ctypes copy (test_backend_ascend_ops.py). */
#include <acl/acl.h>

#include <stddef.h>
#include <stdio.h>

int main(void)
{
    printf("size %zu handleType %zu allocationType %zu memAttr %zu location_id %zu location_type %zu reserve %zu\n",
           sizeof(aclrtPhysicalMemProp), offsetof(aclrtPhysicalMemProp, handleType),
           offsetof(aclrtPhysicalMemProp, allocationType), offsetof(aclrtPhysicalMemProp, memAttr),
           offsetof(aclrtPhysicalMemProp, location.id), offsetof(aclrtPhysicalMemProp, location.type),
           offsetof(aclrtPhysicalMemProp, reserve));
    return 0;
}
