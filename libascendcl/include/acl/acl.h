/*
 * acl.h: the AscendCL entry points (aclInit, aclFinalize) and the runtime API of FlexNPU's
 * libascendcl.so. Written from public ACL API facts (names, signatures, values); not copied from CANN.
 *
 * aclInit reads the claim's client.conf ($FLEXNPU_CONF, else /etc/flexnpu/client.conf) and
 * connects to its aclserver; configPath is the usual ACL JSON config and may be NULL.
 */
#ifndef FLEXNPU_ACL_H_
#define FLEXNPU_ACL_H_

#include "acl_base.h"
#include "acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
ACL_FUNC_VISIBILITY aclError aclFinalize(void);

#ifdef __cplusplus
}
#endif

#endif /* FLEXNPU_ACL_H_ */
