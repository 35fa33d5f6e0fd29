// rdx: a job's ranks through the PMIx server that launched them (Open MPI's
// mpirun, Slurm's srun --mpi=pmix): where this process stands, and the
// exchange of every rank's bytes by one PMIx fence instead of rdx's own TCP
// rendezvous.
//
// pmix_session connects to the server (PMIx_Init) for its lifetime. info()
// reads the rank, the job's size and this host's ranks from the server;
// exchange() puts this rank's bytes under rdx's key ("rdx.group.v1"; the
// process's later exchanges "rdx.group.v1.1", ".2"...), fences over the whole
// namespace with the data collected, and reads every rank's bytes back, so
// it can stand in for the rendezvous as mesh_options::exchange:
//
//   rdx::group::pmix_session s;
//   rdx::group::mesh_options o{.timeout = 60s};
//   o.exchange = [&](std::span<const std::byte> b) { return s.exchange(b, o.timeout); };
//   rdx::group::mesh m(s.info(), pd, window, o);   // destroyed before s
//
// Needs libpmix (the target rdx::pmix); no other rdx header includes this one.
// Every failure throws rdx::error naming the PMIx call, PMIx's text for its
// status and the rank concerned.
#pragma once

#include <rdx/error.hpp>
#include <rdx/group/environment.hpp>
#include <rdx/group/rendezvous.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pmix.h>

namespace rdx::group {

namespace detail {

// The key each rank's exchange bytes are put under; its version changes with
// what the bytes mean, so two rdx versions never read each other's.
inline constexpr const char* pmix_key = "rdx.group.v1";

// Exchanges this process has begun, over all its sessions. Each exchange
// after the first puts under a key of its own ("rdx.group.v1.1", ".2"...):
// a rank that has left a fence may put its next bytes before a slower rank
// has read the last ones, and under one key they would replace them. Every
// rank calls exchange() equally often, so the numbers agree across the job.
inline std::atomic<std::uint64_t> pmix_exchanges{0};

inline std::string pmix_exchange_key(std::uint64_t n) {
  return n == 0 ? std::string(pmix_key) : std::string(pmix_key) + "." + std::to_string(n);
}

inline std::string pmix_status_text(pmix_status_t s) {
  const char* text = PMIx_Error_string(s);
  return std::string(text != nullptr ? text : "unknown status") + " (" + std::to_string(s) + ")";
}

inline std::string pmix_where(std::string_view nspace, std::uint32_t rank) {
  return "rdx::group::pmix_session (rank " + std::to_string(rank) + " of namespace \"" + std::string(nspace) +
         "\"): ";
}

// A value PMIx_Get returned: PMIx allocates it with malloc (PMIX_VALUE_RELEASE
// frees it so), and its data with it.
struct pmix_value_release {
  void operator()(pmix_value_t* v) const noexcept {
    PMIx_Value_destruct(v);
    std::free(v);  // NOLINT(cppcoreguidelines-no-malloc): PMIx allocated it
  }
};
using pmix_value_ptr = std::unique_ptr<pmix_value_t, pmix_value_release>;

// Directives for one call, their values released when it is over.
template <std::size_t N>
struct pmix_infos {
  std::array<pmix_info_t, N> items{};
  pmix_infos() = default;
  pmix_infos(const pmix_infos&) = delete;
  pmix_infos& operator=(const pmix_infos&) = delete;
  pmix_infos(pmix_infos&&) = delete;
  pmix_infos& operator=(pmix_infos&&) = delete;
  ~pmix_infos() {
    for (pmix_info_t& i : items) {
      PMIx_Value_destruct(&i.value);
    }
  }
};

// A whole number of any of PMIx's integer types; nullopt for another type
// or a negative number.
inline std::optional<std::uint64_t> pmix_number(const pmix_value_t& v) noexcept {
  auto non_negative = [](std::int64_t x) -> std::optional<std::uint64_t> {
    if (x < 0) {
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(x);
  };
  switch (v.type) {
    case PMIX_UINT8: return v.data.uint8;
    case PMIX_UINT16: return v.data.uint16;
    case PMIX_UINT32: return v.data.uint32;
    case PMIX_UINT64: return v.data.uint64;
    case PMIX_UINT: return v.data.uint;
    case PMIX_SIZE: return v.data.size;
    case PMIX_PROC_RANK: return v.data.rank;
    case PMIX_INT8: return non_negative(v.data.int8);
    case PMIX_INT16: return non_negative(v.data.int16);
    case PMIX_INT32: return non_negative(v.data.int32);
    case PMIX_INT64: return non_negative(v.data.int64);
    case PMIX_INT: return non_negative(v.data.integer);
    default: return std::nullopt;
  }
}

}  // namespace detail

//! A PMIx client session: this process connected to the PMIx server that
//! launched it, from construction (PMIx_Init) to destruction (PMIx_Finalize).
//!
//! Move-only. Sessions may nest (PMIx counts its initializations). Destroy
//! whatever calls exchange() (a mesh whose mesh_options::exchange does)
//! before the session.
class pmix_session {
public:
  //! True when the environment names a PMIx server's job (PMIX_NAMESPACE and
  //! PMIX_RANK are set, as mpirun and srun --mpi=pmix set them); calls no
  //! PMIx function.
  [[nodiscard]] static bool launched_by_pmix() noexcept {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): read at set-up; rdx never sets the environment
    return std::getenv("PMIX_NAMESPACE") != nullptr && std::getenv("PMIX_RANK") != nullptr;
  }

  //! Connects to the PMIx server that launched this process.
  //! @throws rdx::error errc::invalid_argument when no PMIx server launched
  //! it (launched_by_pmix() is false), errc::operation_failed when PMIx_Init
  //! fails.
  pmix_session() {
    if (!launched_by_pmix()) {
      rdx::detail::throw_rdx(errc::invalid_argument,
                             "rdx::group::pmix_session: not launched by a PMIx server (PMIX_NAMESPACE and "
                             "PMIX_RANK are not set): start under mpirun or srun --mpi=pmix");
    }
    const pmix_status_t s = PMIx_Init(&me_, nullptr, 0);
    if (s != PMIX_SUCCESS) {
      // NOLINTNEXTLINE(concurrency-mt-unsafe): read at set-up; rdx never sets the environment
      const char* ns = std::getenv("PMIX_NAMESPACE");
      // NOLINTNEXTLINE(concurrency-mt-unsafe): read at set-up; rdx never sets the environment
      const char* rank = std::getenv("PMIX_RANK");
      rdx::detail::throw_rdx(errc::operation_failed,
                             "rdx::group::pmix_session (rank " + std::string(rank != nullptr ? rank : "?") +
                                 " of namespace \"" + std::string(ns != nullptr ? ns : "?") +
                                 "\"): PMIx_Init failed: " + detail::pmix_status_text(s) +
                                 "; the PMIx server that launched this process is gone or does not "
                                 "speak this libpmix's protocol");
    }
    active_ = true;
  }

  //! Ends the session (PMIx_Finalize); a failure is not reported.
  ~pmix_session() { finalize(); }

  //! Takes over `other`'s session; `other` holds none after.
  pmix_session(pmix_session&& other) noexcept
      : me_(other.me_), active_(std::exchange(other.active_, false)) {}

  //! Ends this session, then takes over `other`'s.
  pmix_session& operator=(pmix_session&& other) noexcept {
    if (this != &other) {
      finalize();
      me_ = other.me_;
      active_ = std::exchange(other.active_, false);
    }
    return *this;
  }

  pmix_session(const pmix_session&) = delete;             //!< move-only
  pmix_session& operator=(const pmix_session&) = delete;  //!< move-only

  //! This process's PMIx name: its namespace (the job) and rank.
  [[nodiscard]] const pmix_proc_t& proc() const noexcept { return me_; }

  //! The namespace PMIx gave the job.
  [[nodiscard]] std::string_view nspace() const noexcept {
    return {me_.nspace, ::strnlen(me_.nspace, sizeof me_.nspace)};
  }

  //! This process's rank in the job.
  [[nodiscard]] std::uint32_t rank() const noexcept { return me_.rank; }

  //! Where this process stands: its rank, the job's size (PMIX_JOB_SIZE),
  //! its rank among this host's ranks (PMIX_LOCAL_RANK) and their number
  //! (PMIX_LOCAL_SIZE), from launcher::pmix; no rendezvous address.
  //! @throws rdx::error errc::not_ready for a moved-from session,
  //! errc::operation_failed when PMIx_Get fails, errc::protocol_error when
  //! it returns no whole number, errc::invalid_argument when the values
  //! contradict each other (rank_info::check).
  [[nodiscard]] rank_info info() const {
    require_active("info");
    const pmix_proc_t job = wildcard();
    constexpr std::uint64_t most = 1u << 24;  // ranks a job may have, as from_environment reads them
    rank_info r;
    r.from = launcher::pmix;
    r.rank = me_.rank;
    r.size = static_cast<std::uint32_t>(number(job, PMIX_JOB_SIZE, "PMIX_JOB_SIZE", most));
    r.local_rank = static_cast<std::uint32_t>(number(me_, PMIX_LOCAL_RANK, "PMIX_LOCAL_RANK", most - 1));
    r.local_size = static_cast<std::uint32_t>(number(job, PMIX_LOCAL_SIZE, "PMIX_LOCAL_SIZE", most));
    r.check();
    return r;
  }

  //! Hands in this rank's bytes and returns every rank's, indexed by rank:
  //! PMIx_Put (global scope) and PMIx_Commit, a PMIx_Fence over every rank of
  //! the namespace with the data collected, then PMIx_Get of each rank's
  //! bytes. A collective call: every rank of the job makes it, as with
  //! rendezvous(), and as often as the others (the n-th exchange of each
  //! process meets the n-th of every other, under a key of its own).
  //! @param mine this rank's bytes (a mesh's acceptor address, say)
  //! @param timeout how long the fence may take (rounded up to whole seconds,
  //! as PMIx counts it), and each read after it
  //! @throws rdx::error errc::invalid_argument for a timeout below 1 ms,
  //! errc::not_ready for a moved-from session, errc::timed_out when the
  //! fence did not complete in time (a rank never reached it, or died),
  //! errc::protocol_error when a rank put no bytes under this exchange's key
  //! (another program, another rdx version, or a rank that exchanged fewer
  //! times), errc::operation_failed when a PMIx call fails otherwise.
  [[nodiscard]] rendezvous_table exchange(std::span<const std::byte> mine,
                                          std::chrono::milliseconds timeout) {
    require_active("exchange");
    if (timeout.count() <= 0) {
      rdx::detail::throw_rdx(
          errc::invalid_argument,
          where() + "exchange: a timeout of " + std::to_string(timeout.count()) + " ms; give at least 1 ms");
    }
    const std::chrono::seconds whole = std::chrono::ceil<std::chrono::seconds>(timeout);
    const int seconds =
        whole.count() > std::int64_t{86400} * 365 ? 86400 * 365 : static_cast<int>(whole.count());

    // PMIx_Put copies the value; the copy here only spares a cast of const away.
    std::vector<char> bytes(mine.size());
    if (!mine.empty()) {
      std::memcpy(bytes.data(), mine.data(), mine.size());
    }
    pmix_value_t v{};
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = bytes.data();
    v.data.bo.size = bytes.size();
    const std::string key = detail::pmix_exchange_key(detail::pmix_exchanges.fetch_add(1));
    if (const pmix_status_t s = PMIx_Put(PMIX_GLOBAL, key.c_str(), &v); s != PMIX_SUCCESS) {
      fail(errc::operation_failed, "PMIx_Put of " + std::to_string(mine.size()) + " bytes under \"" + key +
                                       "\" failed: " + detail::pmix_status_text(s));
    }
    if (const pmix_status_t s = PMIx_Commit(); s != PMIX_SUCCESS) {
      fail(errc::operation_failed, "PMIx_Commit failed: " + detail::pmix_status_text(s));
    }

    detail::pmix_infos<2> fence_info;
    const bool collect = true;
    const pmix_status_t l0 = PMIx_Info_load(fence_info.items.data(), PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    const pmix_status_t l1 = PMIx_Info_load(&fence_info.items[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    if (l0 != PMIX_SUCCESS || l1 != PMIX_SUCCESS) {
      fail(errc::operation_failed,
           "PMIx_Info_load failed: " + detail::pmix_status_text(l0 != PMIX_SUCCESS ? l0 : l1));
    }
    const pmix_proc_t all = wildcard();
    const pmix_status_t fenced = PMIx_Fence(&all, 1, fence_info.items.data(), fence_info.items.size());
    if (fenced == PMIX_ERR_TIMEOUT) {
      fail(errc::timed_out,
           "PMIx_Fence over every rank of the job did not complete within " + std::to_string(seconds) +
               " s: " + detail::pmix_status_text(fenced) +
               "; a rank has not reached the exchange (it failed or hangs before it, or runs "
               "another program)");
    }
    if (fenced != PMIX_SUCCESS) {
      fail(errc::operation_failed,
           "PMIx_Fence over every rank of the job failed: " + detail::pmix_status_text(fenced) +
               "; a rank ended, or lost its PMIx server, before it reached the exchange");
    }

    // The data came with the fence; the timeout bounds a server that did not
    // collect it and fetches each rank's on demand.
    const std::uint64_t size = number(all, PMIX_JOB_SIZE, "PMIX_JOB_SIZE", std::uint64_t{1} << 24);
    rendezvous_table table(size);
    for (std::uint32_t p = 0; p < size; ++p) {
      pmix_proc_t peer = me_;
      peer.rank = p;
      pmix_value_t* got = nullptr;
      const pmix_status_t s = PMIx_Get(&peer, key.c_str(), &fence_info.items[1], 1, &got);
      const detail::pmix_value_ptr owned(got);
      if (s == PMIX_ERR_NOT_FOUND) {
        fail(errc::protocol_error,
             "PMIx_Get of rank " + std::to_string(p) + "'s \"" + key + "\": " + detail::pmix_status_text(s) +
                 "; rank " + std::to_string(p) +
                 " put no bytes under it (another program, another rdx version, or a rank that "
                 "exchanged fewer times)");
      }
      if (s != PMIX_SUCCESS || owned == nullptr) {
        fail(errc::operation_failed, "PMIx_Get of rank " + std::to_string(p) + "'s \"" + key +
                                         "\" failed: " + detail::pmix_status_text(s));
      }
      if (owned->type != PMIX_BYTE_OBJECT) {
        fail(errc::protocol_error, "PMIx_Get of rank " + std::to_string(p) + "'s \"" + key +
                                       "\" returned PMIx type " + std::to_string(owned->type) +
                                       ", not bytes (another program, or another rdx version)");
      }
      const pmix_byte_object_t& bo = owned->data.bo;
      table[p].resize(bo.size);
      if (bo.size != 0) {
        std::memcpy(table[p].data(), bo.bytes, bo.size);
      }
    }
    return table;
  }

private:
  void finalize() noexcept {
    if (std::exchange(active_, false)) {
      (void)PMIx_Finalize(nullptr, 0);
    }
  }

  [[nodiscard]] std::string where() const { return detail::pmix_where(nspace(), me_.rank); }

  [[noreturn]] void fail(errc e, const std::string& what) const { rdx::detail::throw_rdx(e, where() + what); }

  void require_active(const char* call) const {
    if (!active_) {
      rdx::detail::throw_rdx(
          errc::not_ready, std::string("rdx::group::pmix_session::") + call + ": the session was moved from");
    }
  }

  // Every rank of this process's namespace: job-level values and the fence.
  [[nodiscard]] pmix_proc_t wildcard() const noexcept {
    pmix_proc_t p = me_;
    p.rank = PMIX_RANK_WILDCARD;
    return p;
  }

  // A whole number the server holds for `who`, at most `max`.
  [[nodiscard]] std::uint64_t number(const pmix_proc_t& who, const char* key, const char* name,
                                     std::uint64_t max) const {
    pmix_value_t* got = nullptr;
    const pmix_status_t s = PMIx_Get(&who, key, nullptr, 0, &got);
    const detail::pmix_value_ptr owned(got);
    const std::string of = who.rank == PMIX_RANK_WILDCARD ? "the job" : "rank " + std::to_string(who.rank);
    if (s != PMIX_SUCCESS || owned == nullptr) {
      fail(s == PMIX_ERR_NOT_FOUND ? errc::protocol_error : errc::operation_failed,
           "PMIx_Get of " + std::string(name) + " for " + of + " failed: " + detail::pmix_status_text(s) +
               (s == PMIX_ERR_NOT_FOUND ? "; the launcher's PMIx server does not give it" : ""));
    }
    const std::optional<std::uint64_t> n = detail::pmix_number(*owned);
    if (!n || *n > max) {
      fail(errc::protocol_error,
           "PMIx_Get of " + std::string(name) + " for " + of +
               (n ? " returned " + std::to_string(*n) + ", above " + std::to_string(max)
                  : " returned PMIx type " + std::to_string(owned->type) + ", not a whole number"));
    }
    return *n;
  }

  pmix_proc_t me_{};
  bool active_ = false;
};

}  // namespace rdx::group
