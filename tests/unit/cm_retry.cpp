// rdx::cm::detail::retry_while_refused: a client that waits for its listener
// tries again while it is refused (an attempt reports a refusal as a value,
// never by throwing), within the whole timeout; each retry starts with at
// least 200 ms left; a retry that runs out of time after a refusal reports
// the refusal (what the user can act on), not a bare timeout; other errors
// end it at once.
#include <rdx/cm/link.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace cm = rdx::cm;
using namespace std::chrono_literals;

namespace {

rdx::error refused() {
  return rdx::error(std::make_error_code(std::errc::connection_refused),
                    "connecting with 10.0.0.1:1: nothing listens on that port");
}

rdx::error timed_out() {
  return rdx::error(rdx::errc::timed_out, "connecting with 10.0.0.1:1: no reply");
}

// The error retry_while_refused(o, attempt) ends with; a test failure if it returns.
using refusal = cm::detail::refusal;

template <class F>
rdx::error thrown_by(const cm::options& o, F&& attempt) {
  try {
    (void)cm::detail::retry_while_refused(o, std::forward<F>(attempt));
  } catch (const rdx::error& e) {
    return e;
  }
  FAIL("retry_while_refused returned instead of throwing");
  return rdx::error(rdx::errc::ok, "unreachable");
}

}  // namespace

TEST_CASE("without wait_for_listener the first refusal ends it") {
  cm::options o;
  o.timeout = 2000ms;
  int calls = 0;
  const rdx::error e = thrown_by(o, [&](const cm::options&, refusal& r) -> std::optional<int> {
    ++calls;
    r = refused();
    return std::nullopt;
  });
  CHECK(e.code() == std::errc::connection_refused);
  CHECK(std::string(e.what()).find("nothing listens on that port") != std::string::npos);
  CHECK(calls == 1);
}

TEST_CASE("refused twice, then accepted: the value, with less time each try") {
  cm::options o;
  o.timeout = 3000ms;
  o.wait_for_listener = true;
  std::vector<std::chrono::milliseconds> given;
  const int v =
      cm::detail::retry_while_refused(o, [&](const cm::options& left, refusal& r) -> std::optional<int> {
        CHECK_FALSE(r.has_value());  // each attempt reports its own refusal
        given.push_back(left.timeout);
        if (given.size() < 3) {
          r = refused();
          return std::nullopt;
        }
        return 42;
      });
  CHECK(v == 42);
  REQUIRE(given.size() == 3);
  CHECK(given[0] <= 3000ms);
  CHECK(given[1] < given[0]);
  CHECK(given[2] < given[1]);
  CHECK(given[2] >= 200ms);
}

TEST_CASE("a retry that times out after a refusal reports the refusal") {
  cm::options o;
  o.timeout = 1500ms;
  o.wait_for_listener = true;
  int calls = 0;
  const rdx::error e = thrown_by(o, [&](const cm::options&, refusal& r) -> std::optional<int> {
    if (++calls == 1) {
      r = refused();
      return std::nullopt;
    }
    throw timed_out();
  });
  CHECK(e.code() == std::errc::connection_refused);
  CHECK(std::string(e.what()).find("nothing listens on that port") != std::string::npos);
  CHECK(calls == 2);
}

TEST_CASE("a timeout with no refusal before it stays a timeout") {
  cm::options o;
  o.timeout = 1000ms;
  o.wait_for_listener = true;
  const rdx::error e =
      thrown_by(o, [&](const cm::options&, refusal&) -> std::optional<int> { throw timed_out(); });
  CHECK(e.code() == make_error_code(rdx::errc::timed_out));
}

TEST_CASE("refused until the end: refused, within the timeout, every try with 200 ms or more") {
  cm::options o;
  o.timeout = 1000ms;
  o.wait_for_listener = true;
  std::vector<std::chrono::milliseconds> given;
  const auto t0 = std::chrono::steady_clock::now();
  const rdx::error e = thrown_by(o, [&](const cm::options& left, refusal& r) -> std::optional<int> {
    given.push_back(left.timeout);
    r = refused();
    return std::nullopt;
  });
  CHECK(e.code() == std::errc::connection_refused);
  CHECK(std::chrono::steady_clock::now() - t0 < 1000ms);
  REQUIRE(given.size() >= 2);
  for (auto g : given) CHECK(g >= 200ms);
}

TEST_CASE("any other error ends it at once") {
  cm::options o;
  o.timeout = 2000ms;
  o.wait_for_listener = true;
  int calls = 0;
  const rdx::error e = thrown_by(o, [&](const cm::options&, refusal&) -> std::optional<int> {
    ++calls;
    throw rdx::error(rdx::errc::rejected, "rejected by the rdx server");
  });
  CHECK(e.code() == make_error_code(rdx::errc::rejected));
  CHECK(calls == 1);
}
