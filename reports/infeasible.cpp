#include "reports/infeasible.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace trainplan {

namespace {

void append_int(std::string& out, long long v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

// "12.3 GB": decimal gigabytes rounded to one decimal (half-way cases away from zero), with integer
// formatting as predict wrote it when reasons were text (the same digits as "{:.1f} GB").
void append_gb(std::string& out, Bytes b) {
  const long long tenths = std::llround(b / 1e8);
  append_int(out, tenths / 10);
  out += '.';
  out += static_cast<char>('0' + tenths % 10);
  out += " GB";
}

}  // namespace

std::string describe(const Infeasible& why, const Strategy& s) {
  std::string out = std::string(reason_key(why.reason)) + ": ";
  switch (why.reason) {
    case InfeasibleReason::invalid_strategy: return out + why.detail;
    case InfeasibleReason::unsupported_dtype:
      return out + fmt::format("{} has no {} peak{}", why.detail, to_string(s.dtype),
                               block_scaled(s.dtype) ? " (block-scaled tensor-core formats: Blackwell; gpu.peak_tflops." +
                                                           std::string(to_string(s.dtype)) + " in the cluster file)"
                                                     : "");
    case InfeasibleReason::cluster_too_small:
      return out + fmt::format("{} GPUs requested, {} has at most {}", std::llround(why.needed), why.detail,
                               std::llround(why.available));
    case InfeasibleReason::out_of_memory:
      out += "stage ";
      append_int(out, why.stage);
      out += " needs ";
      append_gb(out, why.needed);
      out += ", the GPU has ";
      append_gb(out, why.available);
      if (why.margin > 0) {
        out += fmt::format(" less a {:g}% safety margin (", 100 * why.margin);
        append_gb(out, why.available * (1 - why.margin));
        out += ')';
      }
      return out;
  }
  return out + why.detail;
}

std::vector<std::string> infeasible_reasons(const Estimate& e) {
  std::vector<std::string> out;
  out.reserve(e.infeasible.size());
  for (const Infeasible& why : e.infeasible) out.push_back(describe(why, e.strategy));
  return out;
}

std::map<std::string, std::int64_t> counts_by_key(const std::map<InfeasibleReason, std::int64_t>& counts) {
  std::map<std::string, std::int64_t> out;
  for (const auto& [reason, n] : counts) out[reason_key(reason)] += n;
  return out;
}

std::optional<InfeasibleReason> parse_reason_key(const std::string& key) {
  for (InfeasibleReason r : {InfeasibleReason::invalid_strategy, InfeasibleReason::unsupported_dtype,
                             InfeasibleReason::cluster_too_small, InfeasibleReason::out_of_memory}) {
    if (key == reason_key(r)) return r;
  }
  return std::nullopt;
}

}  // namespace trainplan
