#include "sim/check.hpp"

#include <fmt/format.h>

namespace trainplan {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(fmt::format("internal error at {}:{}: {} ({})", file, line, msg, expr));
}

}  // namespace trainplan
