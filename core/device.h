// Where a tensor lives: the CPU or one CUDA device.
#pragma once

#include <cstdint>
#include <string>

namespace tt {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  // Parses "cpu", "cuda" or "cuda:N"; throws tt::Error on anything else.
  static Device parse(const std::string& text);

  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  bool operator==(const Device& other) const { return kind == other.kind && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

// True when this build has CUDA and a device is present.
bool cuda_available();

}  // namespace tt
