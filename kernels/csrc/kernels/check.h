// The torch-free kernels' one way to refuse their operands: RADIXLM_CHECK(condition, parts...)
// throws a std::runtime_error whose message is the parts streamed together (Python sees a
// RuntimeError with that text, as from TORCH_CHECK; a C++ test driver catches it).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace radixlm {

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw std::runtime_error(message.str());
}

}  // namespace radixlm

#define RADIXLM_CHECK(condition, ...)             \
  do {                                            \
    if (!(condition)) ::radixlm::fail(__VA_ARGS__); \
  } while (0)
