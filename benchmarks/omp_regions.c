/* Counts the OpenMP parallel regions a process opens (GOMP_parallel calls: PyTorch's parallel_for, MKL and oneDNN
 * as built into the CPU wheels of torch), for benchmarks/bert6_step.py. Outer regions only; nested ones run inline.
 *
 *   gcc -O2 -shared -fPIC -o /tmp/omp_regions.so benchmarks/omp_regions.c -ldl
 *   LD_PRELOAD=/tmp/omp_regions.so python benchmarks/bert6_step.py ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn real_gomp_parallel;
static long long regions;

void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags) {
  if (!real_gomp_parallel) real_gomp_parallel = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  __atomic_add_fetch(&regions, 1, __ATOMIC_RELAXED);
  real_gomp_parallel(fn, data, threads, flags);
}

long long omp_regions(void) { return __atomic_load_n(&regions, __ATOMIC_RELAXED); }
