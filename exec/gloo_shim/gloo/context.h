// Declaration shim, see gloo_shim/gloo/README.md.
#pragma once
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);  // defined inside libtorch's Gloo
};
}  // namespace gloo
