/* call_stubs.c: calls each symbol named on the command line as aclError f(void) (the refusing
 * stubs of libascendcl take no arguments) and prints "<name> <code> <message>". */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*stub_fn)(void);
typedef const char *(*msg_fn)(void);

int main(int argc, char **argv)
{
    void *lib = dlopen("libascendcl.so", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    msg_fn msg = (msg_fn)dlsym(lib, "aclGetRecentErrMsg");
    for (int i = 1; i < argc; i++) {
        stub_fn f = (stub_fn)dlsym(lib, argv[i]);
        if (!f) {
            printf("%s missing -\n", argv[i]);
            continue;
        }
        int rc = f();
        const char *m = msg();
        printf("%s %d %s\n", argv[i], rc, m ? m : "-");
    }
    return 0;
}
