// The end of a pingpong run: the round trips' times, and what each side prints.
#pragma once

#include <vector>

#include "options.hpp"

namespace pingpong {

struct run_stats {
  std::vector<double> rtt_us;
  double wall_s = 0;
};

//! The end of a run: the client's statistics, or the server's one line.
void report(const options& o, const run_stats& st, bool client, const char* label);

}  // namespace pingpong
