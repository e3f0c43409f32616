// DecodeStack (kernels/decode_stack.h) at the level this file is compiled for, without torch
// (-DRADIXLM_NO_TORCH -fopenmp): a tiny 2-layer model with random weights (hidden 96, 6 query
// heads over 2 KV heads of 64, intermediate 96: every product's N padded) runs two decode steps
// of a batch of 3 requests of different lengths, against a float64 model of the same layer math
// written here (RMSNorm, q/k/v + bias, q/k norms, RoPE on interleaved pairs, attention over the
// request's slots, o_proj + bias, RMSNorm, gate/up, SiLU x up, down_proj, on a float64 residual):
//   - weights as float32 panels, bfloat16 pair panels (every bf16 GEMM path that runs here) and
//     q8_0 / q4_1 quant groups in the weight-only float32 mode and both int8 modes;
//   - float32 and bfloat16 KV pools (prior keys bfloat16-exact, the new ones rounded as stored);
//   - the final residual and the new tokens' K/V within 2e-5 of the largest magnitude where
//     nothing but float32 rounds (float32 and weight-only quantized weights; over a bfloat16
//     pool a new K/V value may be one rounding off), 1e-2 where the bf16 GEMM rounds x to
//     bfloat16, 3e-2 where the int8 modes round it to int8; every other pool slot untouched;
//   - a batch sharing a 96-slot prefix (the cascade attention in every layer, where the stack
//     takes it) and one that shares none (never);
//   - the same bits on 1, 2 and 3 threads; and tensor parallelism: the float32 model split over
//     two ranks (their heads and MLP columns) in two threads, summing through the all-reduce hook,
//     against the same reference, both ranks with the same bits;
//   - weights of the wrong width, a slot, a length and a batch out of range refused.
// Built and run by tests/kernels/test_cpu_linear.py per x86 build and, under qemu, aarch64:
//   g++ -std=c++17 -O2 -I kernels/csrc -DRADIXLM_NO_TORCH -fopenmp [level flags]
//       tests/kernels/csrc/test_decode_stack.cpp kernels/csrc/kernels/{decode_stack,paged_attention,
//       flash_attention,amx_attention,bf16_gemm,quant_gemm}.cpp -o t && ./t
// Exit 0 with "decode_stack <level>: N checks passed"; else the first mismatches and exit 1.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "decode_stack_model.h"
#include "driver_util.h"
#include "kernels/amx_attention.h"
#include "kernels/decode_stack.h"

namespace {

using driver::check;
using driver::refused;
using namespace decode_model;

// One configuration's run: each step on 1 thread against the reference, then on 2 and 3 threads
// for the same bits; the pool's other slots untouched; the cascade taken `cascades` times a step.
void run_steps(const Model& model, const Batch& batch, DType kv_dtype, const Options& options, double tolerance,
               int64_t cascades, const std::string& name) {
  std::vector<Pool> pools = model.make_pools(kv_dtype);
  const std::vector<Pool> initial = pools;
  radixlm::DecodeStack stack(model.shape());
  for (size_t l = 0; l < model.layers.size(); ++l) stack.add_layer(model.layers[l].view(pools[l]));
  stack.bf16_path = options.bf16_path;
  stack.quant_mode = options.quant_mode;
  stack.flash_attention = options.flash;
  Reference ref(model, initial);
  for (int64_t step = 0; step < batch.num_steps; ++step) {
    const StepInputs in = batch.step(step, model.dims);
    const std::string what = name + " step " + std::to_string(step);
    std::vector<float> first;
    for (int threads = 1; threads <= 3; ++threads) {
      omp_set_num_threads(threads);
      std::vector<float> out(in.size * model.dims.hidden);
      const int64_t before = radixlm::num_cascade_calls();
      stack.forward(in.view(), out.data());
      const int64_t took = radixlm::num_cascade_calls() - before;
      check(took == cascades, what + ": the cascade taken " + std::to_string(took) + " times");
      if (threads > 1) {
        check(std::memcmp(out.data(), first.data(), out.size() * sizeof(float)) == 0,
              what + ": other bits on " + std::to_string(threads) + " threads");
        continue;
      }
      first = out;
      const std::vector<double> want = ref.step(in, kv_dtype, &pools);
      check(relative_error(out, want) <= tolerance,
            what + ": residual off by " + std::to_string(relative_error(out, want)) + " of its largest magnitude");
      for (size_t l = 0; l < ref.kv_errors.size(); ++l) {
        check(ref.kv_errors[l] <= tolerance,
              what + " layer " + std::to_string(l) + ": new K/V off by " + std::to_string(ref.kv_errors[l]));
      }
    }
  }
  for (size_t l = 0; l < pools.size(); ++l) {
    check(pools[l].same_except(initial[l], batch.new_slots()), name + ": a slot no new token owns was written");
  }
}

// The float32 model split over two ranks in two threads, summing through the all-reduce hook.
struct TwoRankSum {
  std::mutex m;
  std::condition_variable cv;
  float* parts[2] = {nullptr, nullptr};
  int arrived = 0;
  int64_t generation = 0;

  void sum(int rank, float* data, int64_t n) {
    std::unique_lock<std::mutex> lock(m);
    parts[rank] = data;
    const int64_t gen = generation;
    if (++arrived < 2) {
      cv.wait(lock, [&] { return generation != gen; });
      return;
    }
    for (int64_t i = 0; i < n; ++i) parts[0][i] = parts[1][i] = parts[0][i] + parts[1][i];  // rank order
    arrived = 0;
    ++generation;
    cv.notify_all();
  }
};

void run_tensor_parallel(const Model& model, const Batch& batch) {
  const Model shards[2] = {model.shard(0, 2), model.shard(1, 2)};
  std::vector<Pool> pools[2] = {shards[0].make_pools(DType::kFloat32), shards[1].make_pools(DType::kFloat32)};
  Reference ref(model, model.make_pools(DType::kFloat32));
  TwoRankSum reduce;
  std::vector<radixlm::DecodeStack> stacks;
  for (int r = 0; r < 2; ++r) {
    stacks.emplace_back(shards[r].shape());
    for (size_t l = 0; l < model.layers.size(); ++l) stacks[r].add_layer(shards[r].layers[l].view(pools[r][l]));
    stacks[r].all_reduce = radixlm::AllReduce{[&reduce, r](float* d, int64_t n) { reduce.sum(r, d, n); }, r, 4096};
  }
  for (int64_t step = 0; step < batch.num_steps; ++step) {
    const StepInputs in = batch.step(step, model.dims);
    const std::vector<double> want = ref.step(in, DType::kFloat32);
    std::vector<float> out[2] = {std::vector<float>(in.size * model.dims.hidden), std::vector<float>(in.size * model.dims.hidden)};
    std::thread other([&] { stacks[1].forward(in.view(), out[1].data()); });
    stacks[0].forward(in.view(), out[0].data());
    other.join();
    const std::string what = "tensor parallel step " + std::to_string(step);
    check(relative_error(out[0], want) <= 2e-5, what + ": residual off by " + std::to_string(relative_error(out[0], want)));
    check(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0, what + ": the ranks differ");
  }
}

void check_refusals(const Model& model, const Batch& batch) {
  refused("5 heads over 2", "multiple of num_kv_heads", [] {
    radixlm::DecodeStack bad(radixlm::DecodeShape{96, 5, 2, 64, 96, 1e-6f, 0.125f});
  });
  std::vector<Pool> pools = model.make_pools(DType::kFloat32);
  radixlm::DecodeStack stack(model.shape());
  radixlm::DecodeLayer narrow = model.layers[0].view(pools[0]);
  narrow.o.units -= 1;
  refused("o one panel short", "o must hold", [&] { stack.add_layer(narrow); });
  stack.add_layer(model.layers[0].view(pools[0]));
  StepInputs in = batch.step(0, model.dims);
  std::vector<float> out(in.size * model.dims.hidden);
  in.slots[1] = 0;  // the pool's dummy slot
  refused("slot 0", "a new token's KV slot is out of range", [&] { stack.forward(in.view(), out.data()); });
  in = batch.step(0, model.dims);
  in.seq_lens[2] = batch.context + 1;
  refused("a length past the context", "row or length is out of range", [&] { stack.forward(in.view(), out.data()); });
  in = batch.step(0, model.dims);
  stack.all_reduce = radixlm::AllReduce{[](float*, int64_t) {}, 0, 100};
  refused("a batch past the all-reduce", "exceeds the all-reduce's slots", [&] { stack.forward(in.view(), out.data()); });
}

}  // namespace

int main() {
  omp_set_num_threads(2);
  radixlm::set_long_extend_math(1);  // the cascade in float32 FMAs (test_attention.cpp checks vdpbf16ps)
  const Dims dims{96, 6, 2, 64, 96};
  const Batch apart = Batch::make(dims, {5, 23, 70}, 0, 2, 7);
  const Batch sharing = Batch::make(dims, {97, 100, 98}, 96, 2, 8);
  std::vector<radixlm::Bf16Path> bf16_paths;
  for (auto p : {radixlm::Bf16Path::kEmulated, radixlm::Bf16Path::kAvx512Bf16, radixlm::Bf16Path::kAmx}) {
    if (radixlm::bf16_path_runs(p)) bf16_paths.push_back(p);
  }
  const radixlm::Bf16Path fastest = radixlm::bf16_path();
  const int64_t layers = 2;
  for (const WeightType type : {WeightType::kFloat32, WeightType::kBFloat16, WeightType::kQ8_0, WeightType::kQ4_1}) {
    const Model model = Model::make(dims, layers, type, 100 + static_cast<uint64_t>(type));
    std::vector<Options> options;
    if (type == WeightType::kBFloat16) {
      for (auto p : bf16_paths) options.push_back({p, radixlm::QMode::kFloat});
    } else if (type == WeightType::kFloat32) {
      options.push_back({fastest, radixlm::QMode::kFloat});
    } else {
      for (auto m : {radixlm::QMode::kFloat, radixlm::QMode::kInt8Block, radixlm::QMode::kInt8Row}) options.push_back({fastest, m});
    }
    for (const Options& o : options) {
      // x rounded to bfloat16 by the bf16 GEMM, to int8 by the int8 modes; else float32 alone rounds
      const double tolerance = type == WeightType::kBFloat16 ? 1e-2 : o.quant_mode != radixlm::QMode::kFloat ? 3e-2 : 2e-5;
      for (const DType kv : {DType::kFloat32, DType::kBFloat16}) {
        const std::string name = std::string(type_name(type)) + " weights" + options_name(type, o) +
                                 (kv == DType::kFloat32 ? ", float32 KV" : ", bf16 KV");
        // with the flash kernels allowed, a batch sharing a prefix takes the cascade in every
        // layer (float32 FMAs over either pool); one whose requests share nothing never does
        run_steps(model, apart, kv, {o.bf16_path, o.quant_mode, true}, tolerance, 0, name);
        for (const bool flash : {false, true}) {
          run_steps(model, sharing, kv, {o.bf16_path, o.quant_mode, flash}, tolerance, flash ? layers : 0,
                    name + ", sharing a prefix" + (flash ? "" : ", flash off"));
        }
      }
    }
    if (type == WeightType::kFloat32) {
      run_tensor_parallel(model, apart);
      check_refusals(model, apart);
    }
  }
  return driver::finish("decode_stack");
}
