/* Counts the OpenMP parallel regions a process opens (GOMP_parallel calls), outer and nested apart: a region opened
 * inside another (omp_get_level() > 0) runs on the calling thread alone and wakes no thread, so it costs little.
 * benchmarks/omp_regions.c counts both together. Used by benchmarks/bf16_regions.py.
 *
 *   gcc -O2 -shared -fPIC -o /tmp/omp_regions_nested.so benchmarks/omp_regions_nested.c -ldl -lgomp
 *   LD_PRELOAD=/tmp/omp_regions_nested.so python benchmarks/bf16_regions.py ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn real_gomp_parallel;
static long long outer, nested;
extern int omp_get_level(void);

void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags) {
  if (!real_gomp_parallel) real_gomp_parallel = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  __atomic_add_fetch(omp_get_level() > 0 ? &nested : &outer, 1, __ATOMIC_RELAXED);
  real_gomp_parallel(fn, data, threads, flags);
}

long long omp_outer_regions(void) { return __atomic_load_n(&outer, __ATOMIC_RELAXED); }
long long omp_nested_regions(void) { return __atomic_load_n(&nested, __ATOMIC_RELAXED); }
