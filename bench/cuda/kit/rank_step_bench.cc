// rank_step_bench inside strata_bench_kit (kit_main.cc says why): its source with main renamed.
#define main strata_kit_rank_step_bench_main
#include "cuda/rank_step_bench.cc"
