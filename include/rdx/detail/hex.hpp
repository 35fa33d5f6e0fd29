// rdx::detail: the value of one hex digit, for the decoders of text formats
// (the ibv_rc_pingpong address, pre-shared keys written in hex).
#pragma once

namespace rdx::detail {

//! 0 to 15 for '0'-'9', 'a'-'f' and 'A'-'F'; -1 for any other character.
[[nodiscard]] constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

}  // namespace rdx::detail
