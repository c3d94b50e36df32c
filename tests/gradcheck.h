// Finite-difference gradient checking in double precision, and small helpers shared by the test suites.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"

namespace tt::testing {

inline std::vector<double> random_doubles(int64_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> out(static_cast<size_t>(n));
  for (double& x : out) x = dist(gen);
  return out;
}

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(gen);
  return out;
}

inline Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = DType::f64, double scale = 1.0,
                            Device device = Device::cpu()) {
  const int64_t n = shape_numel(shape);
  if (dtype == DType::f64) return Tensor::from_doubles(random_doubles(n, seed, scale), shape);
  Tensor t = Tensor::from_floats(random_floats(n, seed, static_cast<float>(scale)), shape, device);
  return dtype == DType::f32 ? t : ops::cast(t, dtype);
}

// ||a - b|| / ||b|| (0 when both are zero).
// The rows [start, start + count) of a (positions, dim) sequence's values, for each start, one after another.
inline std::vector<double> rows_from(const std::vector<double>& values, const std::vector<int32_t>& starts,
                                     int64_t count, int64_t dim) {
  std::vector<double> out;
  for (int32_t start : starts) {
    const auto from = static_cast<size_t>(start * dim), to = static_cast<size_t>((start + count) * dim);
    out.insert(out.end(), values.begin() + from, values.begin() + to);
  }
  return out;
}

inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

inline double dot(const Tensor& a, const std::vector<double>& weights) {
  const std::vector<double> values = a.to_doubles();
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * weights[i];
  return total;
}

// Compares autograd's gradient of L = sum(f(inputs) * R) (R random) with central differences, for every
// input that requires grad (at most `max_checks` elements each, spread over the tensor). Inputs must be
// f64 CPU tensors. Returns the largest relative error seen.
inline double gradient_error(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             std::vector<Tensor> inputs, double eps = 1e-6, int max_checks = 24) {
  const Tensor out = f(inputs);
  const std::vector<double> weights = random_doubles(out.numel(), 1234);
  out.backward(Tensor::from_doubles(weights, out.shape()));
  double worst = 0;
  for (Tensor& input : inputs) {
    if (!input.requires_grad()) continue;
    const std::vector<double> analytic = input.grad().to_doubles();
    double* data = input.data<double>();
    const int64_t n = input.numel();
    const int64_t stride = std::max<int64_t>(1, n / max_checks);
    for (int64_t i = 0; i < n; i += stride) {
      const double saved = data[i];
      double plus, minus;
      {
        NoGradGuard guard;
        data[i] = saved + eps;
        plus = dot(f(inputs), weights);
        data[i] = saved - eps;
        minus = dot(f(inputs), weights);
      }
      data[i] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      const double err = std::fabs(numeric - analytic[i]) / std::max(1.0, std::fabs(numeric));
      worst = std::max(worst, err);
    }
  }
  return worst;
}

inline Tensor leaf(const Shape& shape, uint32_t seed, double scale = 1.0) {
  Tensor t = random_tensor(shape, seed, DType::f64, scale);
  t.set_requires_grad(true);
  return t;
}

}  // namespace tt::testing
