/*
 * dlopen_origin.c -- a library search path that depends on the caller, for
 * tests/native/test_shim_failopen.py.  Built three ways:
 *   -DPART_DEP   sub/libdep.so
 *   -DPART_FOO   libfoo.so, RUNPATH $ORIGIN/sub, whose foo() dlopens the bare
 *                name "libdep.so": found only through its caller's RUNPATH
 *   (neither)    the program: dlopens libfoo.so by path and calls foo()
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#if defined(PART_DEP)
int dep_value(void) { return 42; }
#elif defined(PART_FOO)
int foo(void)
{
    void *h = dlopen("libdep.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "foo: %s\n", dlerror());
        return -1;
    }
    int (*dep)(void) = (int (*)(void))dlsym(h, "dep_value");
    return dep ? dep() : -2;
}
#else
int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "main: %s\n", dlerror());
        return 2;
    }
    int (*foo)(void) = (int (*)(void))dlsym(h, "foo");
    printf("foo=%d\n", foo ? foo() : -3);
    return 0;
}
#endif
