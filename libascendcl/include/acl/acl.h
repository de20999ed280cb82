/*
 * acl/acl.h: the header an ACL program includes: the runtime (acl_rt.h), single operators
 * (acl_op.h) and models (acl_mdl.h), as CANN's acl.h does.
 *
 * FlexNPU's libascendcl.so serves these on a vNPU share: aclInit reads the claim's client.conf
 * ($FLEXNPU_CONF, else /etc/flexnpu/client.conf) and connects to its aclserver; configPath is the
 * usual ACL JSON config and may be NULL. libascendcl/API.md says how each function is served.
 */
#ifndef FLEXNPU_ACL_ACL_H_
#define FLEXNPU_ACL_ACL_H_

#include "acl_rt.h"
#include "acl_op.h"
#include "acl_mdl.h"

#endif /* FLEXNPU_ACL_ACL_H_ */
