/*
 * aclnn/aclnn_base.h: aclnnInit/aclnnFinalize, as CANN's aclnn_base.h declares them (the share's
 * libnnopbase.so answers both with success: there is nothing to load).
 */
#ifndef FLEXNPU_ACLNN_ACLNN_BASE_H_
#define FLEXNPU_ACLNN_ACLNN_BASE_H_

#include "acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnInit(const char *configPath);
ACL_FUNC_VISIBILITY aclnnStatus aclnnFinalize(void);

#ifdef __cplusplus
}
#endif

#endif /* FLEXNPU_ACLNN_ACLNN_BASE_H_ */
