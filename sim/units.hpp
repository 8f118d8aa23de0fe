// Units used across trainplan. Quantities are plain doubles whose type name carries the unit;
// files store human units (GB, GB/s, TFLOP/s, microseconds) and loaders convert once, here.
#pragma once

namespace trainplan {

using Bytes = double;           // bytes
using Seconds = double;         // seconds
using Flops = double;           // floating-point operations
using FlopsPerSecond = double;  // FLOP/s
using BytesPerSecond = double;  // bytes per second

inline constexpr double kGB = 1e9;        // decimal gigabyte (vendor datasheets, ZeRO paper)
inline constexpr double kGiB = 1073741824.0;
inline constexpr double kTera = 1e12;
inline constexpr double kMicro = 1e-6;

}  // namespace trainplan

namespace trainplan {

// Number format of weights, activations and matmuls in a training step.
enum class Dtype { bf16, fp16, fp8, fp32 };
const char* to_string(Dtype d);
// Bytes per element of activations and 16-bit weights for this dtype (fp8 keeps bf16 activations
// and master copies; only the matmul inputs are 8-bit).
double activation_bytes(Dtype d);

}  // namespace trainplan
