/*
 * One GPU task for the H200 run of Tessera's GPU sharing (docs/gpushare.md).
 * Needs only the driver (libcuda.so.1); the kernel is PTX the driver compiles.
 * Optionally the CUDA runtime (TASK_CUDART=path/to/libcudart.so.12) for the
 * memory phase, so that allocations go through the runtime's cuGetProcAddress
 * lookups as a framework's do.
 *
 *   task SECONDS ITERS HOLD_MIB
 *
 * 1. Allocates 1 GiB chunks until one is refused (the cap), reads cuMemGetInfo,
 *    then frees all but HOLD_MIB.
 * 2. Launches a spin kernel (ITERS dependent FMAs per thread, one wave of 132
 *    x 1024 threads) back to back for SECONDS, two in flight, timing each
 *    cuLaunchKernel call on the CPU.
 * Prints one JSON line. Build: cc -O2 -o task task.c -ldl (no CUDA headers).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

static const char PTX[] =
    ".version 7.8\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 out, .param .u32 iters)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .f32 %f<4>;\n"
    "  .reg .b64 %rd<4>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [iters];\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r6, %ntid.x;\n"
    "  mad.lo.u32 %r7, %r3, %r6, %r2;\n"
    "  cvt.rn.f32.u32 %f1, %r7;\n"
    "  mov.f32 %f2, 0f3F7FFFFE;\n"
    "  mov.f32 %f3, 0f3A83126F;\n"
    "  mov.u32 %r4, 0;\n"
    "LOOP:\n"
    "  fma.rn.f32 %f1, %f1, %f2, %f3;\n"
    "  add.u32 %r4, %r4, 1;\n"
    "  setp.lt.u32 %p1, %r4, %r1;\n"
    "  @%p1 bra LOOP;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r7, 4;\n"
    "  add.u64 %rd2, %rd2, %rd3;\n"
    "  st.global.f32 [%rd2], %f1;\n"
    "  ret;\n"
    "}\n";

#define BLOCKS 132
#define THREADS 1024

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *sym(void *h, const char *n) {
    void *p = dlsym(h, n);
    if (!p) {
        fprintf(stderr, "task: no %s\n", n);
        exit(3);
    }
    return p;
}

static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define CHECK(call)                                                                     \
    do {                                                                                \
        CUresult rc_ = (call);                                                          \
        if (rc_) {                                                                      \
            printf("{\"pid\":%d,\"error\":\"%s\",\"rc\":%d}\n", getpid(), #call, rc_); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: task SECONDS ITERS HOLD_MIB\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    unsigned iters = (unsigned)strtoul(argv[2], NULL, 10);
    size_t hold = strtoull(argv[3], NULL, 10) << 20;

    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cu) {
        fprintf(stderr, "task: %s\n", dlerror());
        return 3;
    }
    CUresult (*cuInit)(unsigned) = sym(cu, "cuInit");
    CUresult (*cuDeviceGet)(int *, int) = sym(cu, "cuDeviceGet");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym(cu, "cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym(cu, "cuCtxSetCurrent");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym(cu, "cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym(cu, "cuMemFree_v2");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym(cu, "cuMemGetInfo_v2");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym(cu, "cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym(cu, "cuModuleGetFunction");
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym(cu, "cuStreamCreate");
    CUresult (*cuStreamSynchronize)(CUstream) = sym(cu, "cuStreamSynchronize");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **) =
        sym(cu, "cuLaunchKernel");

    CHECK(cuInit(0));
    int dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    /* 1. memory: through the runtime when given (its cuGetProcAddress path). */
    int (*rtMalloc)(void **, size_t) = NULL;
    int (*rtFree)(void *) = NULL;
    const char *rt = getenv("TASK_CUDART");
    if (rt && *rt) {
        void *h = dlopen(rt, RTLD_NOW);
        if (!h) {
            fprintf(stderr, "task: %s\n", dlerror());
            return 3;
        }
        rtMalloc = sym(h, "cudaMalloc");
        rtFree = sym(h, "cudaFree");
    }
    enum { MAXC = 256 };
    void *chunks[MAXC];
    int n = 0;
    size_t granted = 0;
    int stop_rc = 0;
    while (n < MAXC) {
        void *p = NULL;
        int r;
        if (rtMalloc) r = rtMalloc(&p, 1ull << 30);
        else r = cuMemAlloc((CUdeviceptr *)&p, 1ull << 30);
        if (r) {
            stop_rc = r; /* cudaErrorMemoryAllocation = 2, CUDA_ERROR_OUT_OF_MEMORY = 2 */
            break;
        }
        chunks[n++] = p;
        granted += 1ull << 30;
    }
    size_t info_free = 0, info_total = 0;
    CHECK(cuMemGetInfo(&info_free, &info_total));
    size_t kept = granted;
    while (n > 0 && kept > hold) {
        void *p = chunks[--n];
        if (rtFree) rtFree(p);
        else cuMemFree((CUdeviceptr)p);
        kept -= 1ull << 30;
    }

    /* 2. compute. */
    fprintf(stderr, "phase compute\n");
    fflush(stderr);
    CUmodule mod;
    CUfunction fn;
    CUstream st;
    CUdeviceptr out;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "spin"));
    CHECK(cuStreamCreate(&st, 1));
    CHECK(cuMemAlloc(&out, (size_t)BLOCKS * THREADS * 4));
    void *params[] = {&out, &iters};
    /* One kernel alone, for its duration. */
    double t0 = now_s();
    CHECK(cuLaunchKernel(fn, BLOCKS, 1, 1, THREADS, 1, 1, 0, st, params, NULL));
    CHECK(cuStreamSynchronize(st));
    double kernel_s = now_s() - t0;

    size_t cap = 1 << 20, k = 0;
    float *lat = malloc(cap * sizeof *lat);
    double start = now_s(), end = start + seconds;
    while (now_s() < end && k < cap) {
        double a = now_s();
        CHECK(cuLaunchKernel(fn, BLOCKS, 1, 1, THREADS, 1, 1, 0, st, params, NULL));
        lat[k++] = (float)((now_s() - a) * 1e6);
        if (k % 2 == 0) CHECK(cuStreamSynchronize(st));
    }
    CHECK(cuStreamSynchronize(st));
    double took = now_s() - start;
    qsort(lat, k, sizeof *lat, cmp);
    printf("{\"pid\":%d,\"runtime\":%s,\"alloc_stop_rc\":%d,\"granted_bytes\":%zu,\"kept_bytes\":%zu,\"info_free\":%zu,\"info_total\":%zu,"
           "\"kernel_ms\":%.3f,\"kernels\":%zu,\"seconds\":%.3f,\"kernels_per_s\":%.2f,"
           "\"launch_us_p50\":%.3f,\"launch_us_p99\":%.3f}\n",
           getpid(), rtMalloc ? "true" : "false", stop_rc, granted, kept, info_free, info_total, kernel_s * 1e3, k,
           took, k / took, k ? lat[k / 2] : 0.0, k ? lat[(size_t)(k * 0.99)] : 0.0);
    return 0;
}
