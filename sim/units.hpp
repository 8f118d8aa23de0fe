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

// Number format of the GEMMs in a training step (and of weights and activations in bf16, fp16 and
// fp32). fp8: E4M3/E5M2 with one scale per tensor (Hopper, Ada, MI300X). mxfp8 and nvfp4: block-
// scaled formats the tensor cores read with their scales (Blackwell): MXFP8 (OCP Microscaling
// Formats (MX) v1.0) = 8-bit elements and one E8M0 scale per 32; NVFP4 = 4-bit E2M1 elements, one
// E4M3 scale per 16 and an fp32 scale per tensor (NVIDIA's NVFP4 description). What each format
// stores at what width is ElementBytes' (plan_shape.hpp).
enum class Dtype { bf16, fp16, fp8, fp32, mxfp8, nvfp4 };
const char* to_string(Dtype d);
// The GEMM inputs are quantized below 16 bits (the weights, activations and gradients around them
// stay 16-bit): fp8, mxfp8, nvfp4.
inline bool quantized_gemms(Dtype d) { return d == Dtype::fp8 || d == Dtype::mxfp8 || d == Dtype::nvfp4; }
// Scaled per block of elements along the GEMM's reduction dimension: mxfp8, nvfp4.
inline bool block_scaled(Dtype d) { return d == Dtype::mxfp8 || d == Dtype::nvfp4; }
// Bytes per element of activations and 16-bit weights for this dtype (fp8 keeps bf16 activations
// and master copies; only the matmul inputs are 8-bit).
double activation_bytes(Dtype d);

}  // namespace trainplan
