#include "backend/comm.h"

#include <cstdlib>
#include <optional>

#include "core/check.h"

namespace strata {
namespace {

// Reads an integer variable; nullopt when unset.
StatusOr<std::optional<int>> env_int(const char* name) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return std::optional<int>();
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (*end != '\0' || v < 0 || v > (1 << 20))
    return invalid_argument("environment variable {}='{}' is not a rank number", name, s);
  return std::optional<int>(int(v));
}

}  // namespace

void Communicator::all_to_all(const Tensor&, const Tensor&) {
  CHECK_MSG(false, "this communicator has no all_to_all");
}

StatusOr<std::unique_ptr<Communicator>> Communicator::split(int group_size) {
  return unimplemented("this communicator cannot split into groups of {} ranks", group_size);
}

StatusOr<LaunchRank> launch_rank_from_env() {
  // The launchers' names: Open MPI, MPICH/Intel MPI (PMI), Slurm, torchrun-style.
  struct Source {
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  static constexpr Source kSources[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
  };
  for (const Source& s : kSources) {
    STRATA_ASSIGN_OR_RETURN(std::optional<int> rank, env_int(s.rank));
    if (!rank) continue;
    STRATA_ASSIGN_OR_RETURN(std::optional<int> size, env_int(s.size));
    if (!size || *size < 1)
      return invalid_argument("{}={} is set but {} is not", s.rank, *rank, s.size);
    if (*rank >= *size)
      return invalid_argument("{}={} is not below {}={}", s.rank, *rank, s.size, *size);
    STRATA_ASSIGN_OR_RETURN(std::optional<int> local, env_int(s.local_rank));
    return LaunchRank{.rank = *rank,
                      .size = *size,
                      .local_rank = local ? *local : *rank,
                      .source = std::string(s.rank) + "/" + s.size};
  }
  return LaunchRank{};
}

}  // namespace strata
