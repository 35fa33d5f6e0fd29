// rdx-doctor: findings (one line each: ok, note, warning or error, with the
// fix), printed for people as they come, or at the end as JSON.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace doctor {

enum class level { ok, note, warning, error };

inline std::string_view to_string(level l) {
  switch (l) {
    case level::ok: return "ok";
    case level::note: return "note";
    case level::warning: return "warning";
    case level::error: return "error";
  }
  return "?";
}

//! One finding: a check ("gid", "peer.connect"), what it is about ("rxe0
//! port 1"), the verdict, a sentence saying what was found, and the fix.
struct finding {
  std::string check;
  std::string subject;
  level verdict = level::ok;
  std::string message;
  std::string fix;                                         //!< empty when nothing is to be done
  std::vector<std::pair<std::string, std::string>> facts;  //!< machine-readable values
};

//! Escapes a string for a JSON string literal.
inline std::string json_string(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          o += b;
        } else {
          o += c;
        }
    }
  }
  return o + "\"";
}

class report {
public:
  explicit report(bool json) : json_(json) {}

  finding& add(finding f) {
    items_.push_back(std::move(f));
    if (!json_) print(items_.back());
    return items_.back();
  }
  finding& add(std::string check, std::string subject, level v, std::string message, std::string fix = {},
               std::vector<std::pair<std::string, std::string>> facts = {}) {
    return add(finding{std::move(check), std::move(subject), v, std::move(message), std::move(fix),
                       std::move(facts)});
  }

  [[nodiscard]] int count(level l) const {
    int n = 0;
    for (const auto& f : items_) n += f.verdict == l ? 1 : 0;
    return n;
  }
  [[nodiscard]] const std::vector<finding>& items() const noexcept { return items_; }
  [[nodiscard]] bool json() const noexcept { return json_; }

  //! A progress line (people only; JSON output stays one document).
  void progress(const std::string& s) const {
    if (!json_) {
      std::printf("  ... %s\n", s.c_str());
      std::fflush(stdout);
    }
  }
  void heading(const std::string& s) const {
    if (!json_) std::printf("\n%s\n", s.c_str());
  }

  //! The closing summary, or the whole JSON document.
  void finish(const std::vector<std::pair<std::string, std::string>>& about) const {
    if (!json_) {
      std::printf("\nsummary: %d ok, %d note%s, %d warning%s, %d error%s\n", count(level::ok),
                  count(level::note), count(level::note) == 1 ? "" : "s", count(level::warning),
                  count(level::warning) == 1 ? "" : "s", count(level::error),
                  count(level::error) == 1 ? "" : "s");
      return;
    }
    std::string o = "{";
    for (const auto& [k, v] : about) o += json_string(k) + ":" + json_string(v) + ",";
    o += "\"checks\":[";
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const finding& f = items_[i];
      o += i == 0 ? "\n" : ",\n";
      o += "{\"check\":" + json_string(f.check) + ",\"subject\":" + json_string(f.subject) +
           ",\"status\":" + json_string(to_string(f.verdict)) + ",\"message\":" + json_string(f.message) +
           ",\"fix\":" + json_string(f.fix) + ",\"facts\":{";
      for (std::size_t j = 0; j < f.facts.size(); ++j)
        o += (j == 0 ? "" : ",") + json_string(f.facts[j].first) + ":" + json_string(f.facts[j].second);
      o += "}}";
    }
    o += "\n],\"summary\":{\"ok\":" + std::to_string(count(level::ok)) +
         ",\"note\":" + std::to_string(count(level::note)) +
         ",\"warning\":" + std::to_string(count(level::warning)) +
         ",\"error\":" + std::to_string(count(level::error)) + "}}\n";
    std::fputs(o.c_str(), stdout);
  }

private:
  static void print(const finding& f) {
    static constexpr const char* tag[] = {"[ ok    ]", "[ note  ]", "[warning]", "[ ERROR ]"};
    std::printf("%s %-16s %s: %s\n", tag[static_cast<int>(f.verdict)], f.check.c_str(), f.subject.c_str(),
                f.message.c_str());
    if (!f.fix.empty()) std::printf("          %-16s fix: %s\n", "", f.fix.c_str());
    std::fflush(stdout);
  }

  bool json_;
  std::vector<finding> items_;
};

}  // namespace doctor
