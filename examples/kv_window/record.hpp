// kv_window: the table's layout (fixed-size records with a version word) and
// what each record holds before and after a client's run, on both sides.
#pragma once

#include <rdx/channel/window.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace kv {

//! One record: 64 bytes, the version word at index 1 of its 8 words.
struct record {
  std::uint64_t key;
  std::uint64_t version;
  char value[48];
};
static_assert(sizeof(record) == 64 && alignof(record) == 8);
constexpr std::size_t words_per_record = sizeof(record) / 8;
constexpr std::uint64_t final_version = 10;

constexpr auto table_rights = rdx::rights::read | rdx::rights::write | rdx::rights::atomic;

inline std::string initial_value(std::uint64_t i) {
  return "record " + std::to_string(i);
}
inline std::string updated_value(std::uint64_t i) {
  return "updated " + std::to_string(i * 7);
}
inline void set_value(record& r, const std::string& v) {
  std::memset(r.value, 0, sizeof r.value);
  std::memcpy(r.value, v.data(), std::min(v.size(), sizeof r.value - 1));
}
//! Large tables are sampled: every stride-th record is bumped, every second
//! of those rewritten (at most 128 of each kind of operation per run).
inline std::uint64_t stride_for(std::uint64_t records) {
  return std::max<std::uint64_t>(1, records / 128);
}
inline bool bumped(std::uint64_t i, std::uint64_t stride) {
  return i % stride == 0;
}
inline bool rewritten(std::uint64_t i, std::uint64_t stride) {
  return bumped(i, stride) && (i / stride) % 2 == 0;
}

//! The first problem with a record in its final state, or "".
inline std::string final_problem(const record& r, std::uint64_t i, std::uint64_t stride) {
  if (r.key != i) return "key " + std::to_string(r.key);
  const std::uint64_t version = bumped(i, stride) ? final_version : 0;
  if (r.version != version)
    return "version " + std::to_string(r.version) + ", expected " + std::to_string(version);
  const std::string want = rewritten(i, stride) ? updated_value(i) : initial_value(i);
  if (std::string(r.value) != want) return "value '" + std::string(r.value) + "', expected '" + want + "'";
  return "";
}

}  // namespace kv
