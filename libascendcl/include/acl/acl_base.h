/*
 * acl/acl_base.h: the base of the ACL headers, as CANN's acl_base.h: the runtime's base types
 * and error codes (acl_base_rt.h), tensor descriptors (acl_base_mdl.h) and the runtime and
 * graph-engine error codes (error_codes/).
 */
#ifndef FLEXNPU_ACL_ACL_BASE_H_
#define FLEXNPU_ACL_ACL_BASE_H_

#include "acl_base_rt.h"
#include "acl_base_mdl.h"
#include "error_codes/rt_error_codes.h"
#include "error_codes/ge_error_codes.h"

#endif /* FLEXNPU_ACL_ACL_BASE_H_ */
