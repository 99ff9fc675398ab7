// Where a tensor's memory lives.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool operator==(const Device&) const = default;
  std::string str() const { return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace kiln
