/*
 * harness.c -- loads the plugin as NCCL does (dlopen, dlsym ncclProfiler_vN)
 * and drives one communicator through init, two collectives and finalize.
 * Usage: harness PLUGIN.so v5|v6.  Prints the activation mask and handles.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "nccl_profiler_abi.h"

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    char sym[32];
    snprintf(sym, sizeof sym, "ncclProfiler_%s", argv[2]);
    const lxfNcclProfiler_t *p = dlsym(lib, sym);
    if (!p) {
        fprintf(stderr, "dlsym %s: missing\n", sym);
        return 1;
    }
    void *ctx = NULL;
    int mask = -1;
    if (p->init(&ctx, 0xC0FFEEull, &mask, "comm0", 1, 2, 0, NULL) != ncclSuccess)
        return 1;
    printf("name=%s mask=%d\n", p->name, mask);
    const char *types[] = {"ncclFloat32", "ncclBfloat16"};
    for (int i = 0; i < 2; i++) {
        lxfNcclEventDescr_t d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileColl;
        d.rank = 0;
        d.coll.seqNumber = 7 + i;
        d.coll.func = "AllToAll";
        d.coll.count = 1024;
        d.coll.datatype = types[i];
        void *h = NULL;
        if (p->startEvent(ctx, &h, &d) != ncclSuccess || p->recordEventState(h, 0, NULL) != ncclSuccess ||
            p->stopEvent(h) != ncclSuccess)
            return 1;
        printf("coll%d handle=%s\n", i, h ? "set" : "null");
    }
    lxfNcclEventDescr_t g = {.type = ncclProfileGroup};
    void *gh = (void *)1;
    if (p->startEvent(ctx, &gh, &g) != ncclSuccess || p->stopEvent(gh) != ncclSuccess)
        return 1;
    printf("group handle=%s\n", gh ? "set" : "null");
    return p->finalize(ctx) == ncclSuccess ? 0 : 1;
}
