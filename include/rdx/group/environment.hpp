// rdx: where this process stands in a job of N ranks, read from the launcher
// that started it (torchrun, Slurm's srun, Open MPI's mpirun) or given by the
// program, each value checked against the others.
//
// A launcher hands each process its rank and the job's size in environment
// variables; rdx reads them and says, by name, which one is missing, which
// is not a number and which two contradict each other. Nothing here opens a
// device or a socket.
#pragma once

#include <rdx/error.hpp>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace rdx::group {

//! Which launcher's variables a rank_info came from.
enum class launcher : std::uint8_t {
  given,     //!< the program gave every value (rank_info::given)
  torchrun,  //!< RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  open_mpi,  //!< OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
  slurm,     //!< SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE
  pmix,      //!< the PMIx server that launched the process (group/pmix.hpp: pmix_session::info)
};

//! "given", "torchrun", "Open MPI", "Slurm" or "PMIx".
[[nodiscard]] constexpr std::string_view to_string(launcher l) noexcept {
  switch (l) {
    case launcher::given: return "given";
    case launcher::torchrun: return "torchrun";
    case launcher::open_mpi: return "Open MPI";
    case launcher::slurm: return "Slurm";
    case launcher::pmix: return "PMIx";
  }
  return "?";
}

//! This process's place in the job.
struct rank_info {
  std::uint32_t rank = 0;        //!< 0 .. size - 1
  std::uint32_t size = 1;        //!< ranks in the job
  std::uint32_t local_rank = 0;  //!< 0 .. local_size - 1, among the ranks of this host
  std::uint32_t local_size = 1;  //!< ranks on this host
  //! Where rank 0 serves the rendezvous (torchrun's MASTER_ADDR and
  //! MASTER_PORT, which the other launchers also honour when set); empty
  //! when the launcher gave none.
  std::string rendezvous_host;
  std::uint16_t rendezvous_port = 0;  //!< rank 0's rendezvous port (0: none given)
  launcher from = launcher::given;    //!< whose variables these are
  //! The launcher's host list where it gives one (SLURM_STEP_NODELIST), as given.
  std::string nodelist;

  //! Checks the values against each other; throws rdx::error
  //! (errc::invalid_argument) naming the two that contradict.
  void check() const;
};

//! Reads an environment variable; the default reads the process's own.
using env_reader = std::function<const char*(const char*)>;

namespace detail {

inline const char* process_env(const char* name) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read at set-up; rdx never sets the environment
  return std::getenv(name);
}

[[noreturn]] inline void refuse(launcher l, const std::string& what) {
  rdx::detail::throw_rdx(errc::invalid_argument, "rdx::group (" + std::string(to_string(l)) + "): " + what);
}

// A whole decimal number of at most `max`; the error names the variable.
inline std::uint64_t number(const env_reader& env, launcher l, const char* name, std::uint64_t max) {
  const char* v = env(name);
  if (v == nullptr) {
    refuse(l, std::string(name) + " is not set");
  }
  const std::string_view s(v);
  std::uint64_t out = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || out > max) {
    refuse(l, std::string(name) + "=\"" + std::string(s) + "\" is not a whole number from 0 to " +
                  std::to_string(max));
  }
  return out;
}

inline std::optional<std::string> text(const env_reader& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr) {
    return std::nullopt;
  }
  return std::string(v);
}

// Slurm's SLURM_STEP_TASKS_PER_NODE ("2(x3),1": three nodes of 2 tasks, then
// one of 1): the tasks on node `node`, or nothing when the text is not that form.
inline std::optional<std::uint64_t> tasks_on_node(std::string_view s, std::uint64_t node) {
  std::uint64_t seen = 0;
  std::optional<std::uint64_t> found;
  for (;;) {  // every part is read, so that a malformed one anywhere is refused
    const std::size_t comma = s.find(',');
    const std::string_view part = s.substr(0, comma);
    std::uint64_t tasks = 0;
    std::uint64_t repeat = 1;
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), tasks);
    if (ec != std::errc{} || p == part.data()) {
      return std::nullopt;
    }
    const std::string_view rest(p, static_cast<std::size_t>(part.data() + part.size() - p));
    if (!rest.empty()) {
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        return std::nullopt;
      }
      const std::string_view n = rest.substr(2, rest.size() - 3);
      const auto [q, ec2] = std::from_chars(n.data(), n.data() + n.size(), repeat);
      if (ec2 != std::errc{} || q != n.data() + n.size() || repeat == 0) {
        return std::nullopt;
      }
    }
    if (!found && node - seen < repeat && node >= seen) {
      found = tasks;
    }
    seen += repeat;
    if (comma == std::string_view::npos) {
      return found;
    }
    s = s.substr(comma + 1);
  }
}

inline void rendezvous_from(const env_reader& env, rank_info& r, bool required) {
  const std::optional<std::string> host = text(env, "MASTER_ADDR");
  if (!host) {
    if (required) {
      refuse(r.from, "MASTER_ADDR is not set (rank 0's host, where the rendezvous is served)");
    }
    if (env("MASTER_PORT") != nullptr) {
      refuse(r.from, "MASTER_PORT is set but MASTER_ADDR is not");
    }
    return;
  }
  if (host->empty()) {
    refuse(r.from, "MASTER_ADDR is empty");
  }
  r.rendezvous_host = *host;
  r.rendezvous_port = static_cast<std::uint16_t>(number(env, r.from, "MASTER_PORT", 65535));
  if (r.rendezvous_port == 0) {
    refuse(r.from, "MASTER_PORT=0 is not a port to meet at");
  }
}

}  // namespace detail

inline void rank_info::check() const {
  if (size == 0) {
    detail::refuse(from, "the job has 0 ranks");
  }
  if (rank >= size) {
    detail::refuse(from,
                   "rank " + std::to_string(rank) + " is not below the job's size " + std::to_string(size));
  }
  if (local_size == 0) {
    detail::refuse(from, "0 ranks on this host");
  }
  if (local_rank >= local_size) {
    detail::refuse(from, "local rank " + std::to_string(local_rank) +
                             " is not below the ranks on this host, " + std::to_string(local_size));
  }
  if (local_size > size) {
    detail::refuse(from, std::to_string(local_size) + " ranks on this host, more than the job's " +
                             std::to_string(size));
  }
  if (local_rank > rank) {
    detail::refuse(from, "local rank " + std::to_string(local_rank) + " above the rank " +
                             std::to_string(rank) + ": no launcher numbers a host's ranks so");
  }
}

//! Where this process stands, from the first launcher whose variables are
//! set: torchrun (RANK), then Open MPI (OMPI_COMM_WORLD_RANK), then Slurm
//! (SLURM_PROCID). Throws rdx::error (errc::invalid_argument) naming the
//! variable that is missing, not a number, or contradicts another; with no
//! launcher's variables at all, the message lists what each sets.
[[nodiscard]] inline rank_info from_environment(const env_reader& env = detail::process_env) {
  constexpr std::uint64_t most = 1u << 24;  // ranks a job may have
  rank_info r;
  if (env("RANK") != nullptr || env("WORLD_SIZE") != nullptr) {
    r.from = launcher::torchrun;
    r.rank = static_cast<std::uint32_t>(detail::number(env, r.from, "RANK", most - 1));
    r.size = static_cast<std::uint32_t>(detail::number(env, r.from, "WORLD_SIZE", most));
    r.local_rank = static_cast<std::uint32_t>(detail::number(env, r.from, "LOCAL_RANK", most - 1));
    r.local_size = static_cast<std::uint32_t>(detail::number(env, r.from, "LOCAL_WORLD_SIZE", most));
    detail::rendezvous_from(env, r, true);
  } else if (env("OMPI_COMM_WORLD_RANK") != nullptr) {
    r.from = launcher::open_mpi;
    r.rank = static_cast<std::uint32_t>(detail::number(env, r.from, "OMPI_COMM_WORLD_RANK", most - 1));
    r.size = static_cast<std::uint32_t>(detail::number(env, r.from, "OMPI_COMM_WORLD_SIZE", most));
    r.local_rank =
        static_cast<std::uint32_t>(detail::number(env, r.from, "OMPI_COMM_WORLD_LOCAL_RANK", most - 1));
    r.local_size =
        static_cast<std::uint32_t>(detail::number(env, r.from, "OMPI_COMM_WORLD_LOCAL_SIZE", most));
    detail::rendezvous_from(env, r, false);
  } else if (env("SLURM_PROCID") != nullptr) {
    r.from = launcher::slurm;
    r.rank = static_cast<std::uint32_t>(detail::number(env, r.from, "SLURM_PROCID", most - 1));
    r.size = static_cast<std::uint32_t>(detail::number(env, r.from, "SLURM_NTASKS", most));
    r.local_rank = static_cast<std::uint32_t>(detail::number(env, r.from, "SLURM_LOCALID", most - 1));
    const std::uint64_t node = detail::number(env, r.from, "SLURM_NODEID", most - 1);
    const std::optional<std::string> per_node = detail::text(env, "SLURM_STEP_TASKS_PER_NODE");
    if (!per_node) {
      detail::refuse(r.from, "SLURM_STEP_TASKS_PER_NODE is not set (run inside srun)");
    }
    const std::optional<std::uint64_t> here = detail::tasks_on_node(*per_node, node);
    if (!here) {
      detail::refuse(r.from, "SLURM_STEP_TASKS_PER_NODE=\"" + *per_node + "\" names no node " +
                                 std::to_string(node) +
                                 " (SLURM_NODEID) in the form N or N(xK), comma-separated");
    }
    if (*here > most) {
      detail::refuse(r.from,
                     "SLURM_STEP_TASKS_PER_NODE gives node " + std::to_string(node) + " too many tasks");
    }
    r.local_size = static_cast<std::uint32_t>(*here);
    r.nodelist = detail::text(env, "SLURM_STEP_NODELIST").value_or("");
    detail::rendezvous_from(env, r, false);
  } else {
    detail::refuse(launcher::given,
                   "no launcher's variables: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
                   "MASTER_ADDR and MASTER_PORT; mpirun sets OMPI_COMM_WORLD_RANK and _SIZE; srun sets "
                   "SLURM_PROCID and SLURM_NTASKS. Start the program with one of them, or give the ranks "
                   "to rdx::group::given()");
  }
  r.check();
  return r;
}

//! The program's own values, checked as the launchers' are.
[[nodiscard]] inline rank_info given(std::uint32_t rank, std::uint32_t size, std::uint32_t local_rank,
                                     std::uint32_t local_size, std::string rendezvous_host = {},
                                     std::uint16_t rendezvous_port = 0) {
  rank_info r{.rank = rank,
              .size = size,
              .local_rank = local_rank,
              .local_size = local_size,
              .rendezvous_host = std::move(rendezvous_host),
              .rendezvous_port = rendezvous_port,
              .from = launcher::given,
              .nodelist = {}};
  r.check();
  return r;
}

}  // namespace rdx::group
