// Declaration shim, see gloo_shim/gloo/README.md.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
