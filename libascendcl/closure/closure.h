/*
 * closure.h: what the share's other client libraries (api/closure.json) share. Each is built with
 * -fvisibility=hidden and exports only API functions; a forwarding library finds libascendcl.so's
 * function with dlsym on libascendcl.so's own handle, so the lookup never returns its own copy.
 */
#ifndef FLEXNPU_CLOSURE_H_
#define FLEXNPU_CLOSURE_H_

#include <dlfcn.h>
#include <stdio.h>

#define API __attribute__((visibility("default")))

/* libascendcl.so's definition of name (NULL, with a message on stderr, if it has none). */
static inline void *closure_lookup(const char *name)
{
    void *lib = dlopen("libascendcl.so", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen("libascendcl.so", RTLD_NOW);
    void *fn = lib ? dlsym(lib, name) : NULL;
    if (!fn)
        fprintf(stderr, "FlexNPU client: %s: libascendcl.so does not export it (%s)\n", name,
                lib ? "an older libascendcl.so" : dlerror());
    return fn;
}

#endif /* FLEXNPU_CLOSURE_H_ */
