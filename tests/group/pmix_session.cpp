// unit test: rdx::group::pmix_session, no RDMA device needed. Run alone
// (pmix_session.sh does, first), it checks what a process outside a PMIx job
// is told. Under mpirun, that info() agrees with Open MPI's own variables and
// that exchange() returns every rank's bytes in rank order, for entries of
// different lengths, empty ones and 64 KiB ones, one exchange after another.
#include <rdx/error.hpp>
#include <rdx/group/pmix.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace {

int failures = 0;
std::uint32_t my_rank = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("rank %u: FAILED: %s\n", my_rank, what.c_str());
    ++failures;
  }
}

std::uint32_t env_number(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? static_cast<std::uint32_t>(std::strtoul(v, nullptr, 10)) : ~0u;
}

// What `rank` hands in to exchange `round`: `length` bytes of a pattern of both.
std::vector<std::byte> entry(std::uint32_t round, std::uint32_t rank, std::size_t length) {
  std::vector<std::byte> b(length);
  for (std::size_t i = 0; i < length; ++i)
    b[i] = static_cast<std::byte>((i * 131) ^ (rank * 7) ^ (round << 5));
  return b;
}

template <class F>
void expect_throw(rdx::errc code, const std::string& text, F&& f, const std::string& what) {
  try {
    std::forward<F>(f)();
    check(false, what + ": no exception");
  } catch (const rdx::error& e) {
    check(e.code() == code, what + ": code " + e.code().message() + ", " + e.what());
    check(std::string(e.what()).find(text) != std::string::npos,
          what + ": \"" + text + "\" not in \"" + e.what() + "\"");
  }
}

void outside() {
  check(!rdx::group::pmix_session::launched_by_pmix(), "launched_by_pmix() outside a PMIx job");
  expect_throw(
      rdx::errc::invalid_argument, "start under mpirun or srun --mpi=pmix",
      [] { rdx::group::pmix_session s; }, "a session outside a PMIx job");
  check(rdx::group::to_string(rdx::group::launcher::pmix) == "PMIx", "to_string(launcher::pmix)");
  std::printf("outside a PMIx job: %s\n", failures == 0 ? "ok" : "FAILED");
}

void inside() {
  using namespace std::chrono_literals;
  check(rdx::group::pmix_session::launched_by_pmix(), "launched_by_pmix() under mpirun");
  rdx::group::pmix_session s;
  const rdx::group::rank_info me = s.info();
  my_rank = me.rank;
  check(me.from == rdx::group::launcher::pmix, "from");
  check(me.rank == s.rank(), "rank() and info().rank");
  check(me.rank == env_number("OMPI_COMM_WORLD_RANK"), "rank against OMPI_COMM_WORLD_RANK");
  check(me.size == env_number("OMPI_COMM_WORLD_SIZE"), "size against OMPI_COMM_WORLD_SIZE");
  check(me.local_rank == env_number("OMPI_COMM_WORLD_LOCAL_RANK"), "local rank");
  check(me.local_size == env_number("OMPI_COMM_WORLD_LOCAL_SIZE"), "local size");
  check(me.rendezvous_host.empty() && me.rendezvous_port == 0, "no rendezvous address");
  check(!s.nspace().empty(), "a namespace");

  // Rounds of each kind, one after another: a rank that leaves a fence first
  // must not overwrite what a slower one has yet to read.
  for (std::uint32_t round = 0; round < 12; ++round) {
    auto length_of = [&](std::uint32_t r) -> std::size_t {
      switch (round % 3) {
        case 0: return std::size_t{r} * 37 + round;  // each rank its own length
        case 1: return 0;
        default: return 65536;
      }
    };
    const auto mine = entry(round, me.rank, length_of(me.rank));
    const rdx::group::rendezvous_table t = s.exchange(mine, 30s);
    check(t.size() == me.size,
          "round " + std::to_string(round) + ": " + std::to_string(t.size()) + " entries");
    for (std::uint32_t p = 0; p < t.size(); ++p) {
      check(t[p] == entry(round, p, length_of(p)), "round " + std::to_string(round) + ": rank " +
                                                       std::to_string(p) + "'s bytes (" +
                                                       std::to_string(t[p].size()) + " bytes)");
    }
  }
  expect_throw(
      rdx::errc::invalid_argument, "at least 1 ms", [&] { (void)s.exchange({}, 0ms); }, "a timeout of 0");

  rdx::group::pmix_session moved = std::move(s);
  check(moved.info().rank == me.rank, "the session moved to");
  expect_throw(
      rdx::errc::not_ready, "moved from", [&] { (void)s.info(); },
      "a moved-from session");  // NOLINT(bugprone-use-after-move)
  std::printf("rank %u/%u (local %u/%u) under PMIx: %s\n", me.rank, me.size, me.local_rank, me.local_size,
              failures == 0 ? "ok" : "FAILED");
}

}  // namespace

int main() {
  try {
    if (rdx::group::pmix_session::launched_by_pmix()) {
      inside();
    } else {
      outside();
    }
  } catch (const std::exception& e) {
    std::printf("rank %u: FAILED: %s\n", my_rank, e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
