// The CUDA provider's attention and optimizer kernels on the emulated device (see
// cuda_emu_kernels_test.cc): attention against its definition in double precision, AdamW and
// SGD bit for bit against the CPU's steps, the squared norm and the clipping scale.
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.h"
#include "tests/cuda_emu_test_util.h"  // last: cuda_emu.h defines threadIdx and friends as macros

namespace cleave {
namespace {

using namespace emu_testing;  // NOLINT: the helpers of these tests

// ---- Attention -----------------------------------------------------------------------------

struct AttnCase {
  int64_t batch, T, S;
  int D, Dv;
  bool causal;
};

TEST_P(CudaEmu, AttentionForwardAndBackwardAgainstTheDefinition) {
  const AttnCase cases[] = {
      {3, 37, 45, 40, 24, true},  // T < S: query i sees keys j <= i + 8
      {2, 20, 20, 128, 128, false},
      {2, 9, 5, 16, 16, true},    // T > S: the first four queries see no key
      {1, 33, 70, 256, 8, false},
  };
  for (Dt dt : kDts)
    for (const AttnCase& a : cases) {
      SCOPED_TRACE(std::string(Name(dt)) + " T " + std::to_string(a.T) + " S " + std::to_string(a.S) + " D " +
                   std::to_string(a.D) + (a.causal ? " causal" : ""));
      const int64_t B = a.batch, T = a.T, S = a.S, D = a.D, Dv = a.Dv;
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      Values q(dt, Uniform(B * T * D, -1.f, 1.f, 25)), k(dt, Uniform(B * S * D, -1.f, 1.f, 26));
      Values v(dt, Uniform(B * S * Dv, -1.f, 1.f, 27)), dout(dt, Uniform(B * T * Dv, -1.f, 1.f, 28));
      Values out(dt, B * T * Dv), dq(dt, B * T * D), dk(dt, B * S * D), dv(dt, B * S * Dv);
      Array<float> lse(B * T, kNaN), delta(B * T, kNaN);
      ASSERT_TRUE(Ok(ck::AttentionForward(dt, q.data(), k.data(), v.data(), out.data(), lse.data(), B, T, S, a.D,
                                          a.Dv, scale, a.causal, nullptr)));
      ASSERT_TRUE(Ok(ck::AttentionBackward(dt, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                           dq.data(), dk.data(), dv.data(), delta.data(), B, T, S, a.D, a.Dv, scale,
                                           a.causal, nullptr)));
      std::vector<double> want_out(static_cast<size_t>(B * T * Dv), 0.0), want_lse;
      std::vector<double> want_dq(static_cast<size_t>(B * T * D), 0.0), want_dk(static_cast<size_t>(B * S * D), 0.0),
          want_dv(static_cast<size_t>(B * S * Dv), 0.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < T; ++i) {
          const int64_t visible = a.causal ? std::clamp<int64_t>(i + 1 + S - T, 0, S) : S;
          std::vector<double> p(static_cast<size_t>(S), 0.0);
          double m = -INFINITY, l = 0;
          for (int64_t j = 0; j < visible; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[(b * T + i) * D + d]) * k[(b * S + j) * D + d];
            p[static_cast<size_t>(j)] = dot * scale;
            m = std::max(m, p[static_cast<size_t>(j)]);
          }
          for (int64_t j = 0; j < visible; ++j) l += std::exp(p[static_cast<size_t>(j)] - m);
          for (int64_t j = 0; j < visible; ++j) p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m) / l;
          want_lse.push_back(visible ? m + std::log(l) : -INFINITY);
          for (int64_t j = 0; j < visible; ++j)
            for (int64_t d = 0; d < Dv; ++d)
              want_out[static_cast<size_t>((b * T + i) * Dv + d)] += p[static_cast<size_t>(j)] * v[(b * S + j) * Dv + d];
          // The backward, from the kernel's own forward output (as the provider runs it).
          double di = 0;
          for (int64_t d = 0; d < Dv; ++d) di += static_cast<double>(dout[(b * T + i) * Dv + d]) * out[(b * T + i) * Dv + d];
          for (int64_t j = 0; j < visible; ++j) {
            const double pij = p[static_cast<size_t>(j)];
            double dp = 0;
            for (int64_t d = 0; d < Dv; ++d) {
              dp += static_cast<double>(dout[(b * T + i) * Dv + d]) * v[(b * S + j) * Dv + d];
              want_dv[static_cast<size_t>((b * S + j) * Dv + d)] += pij * dout[(b * T + i) * Dv + d];
            }
            const double ds = pij * (dp - di);
            for (int64_t d = 0; d < D; ++d) {
              want_dq[static_cast<size_t>((b * T + i) * D + d)] += scale * ds * k[(b * S + j) * D + d];
              want_dk[static_cast<size_t>((b * S + j) * D + d)] += scale * ds * q[(b * T + i) * D + d];
            }
          }
        }
      const double rtol = 1e-5, atol = dt == Dt::kF32 ? 1e-5 : 2e-3;
      EXPECT_TRUE(Near(out, dt, want_out, rtol, atol));
      EXPECT_TRUE(Near(lse, Dt::kF32, want_lse, 1e-6, 1e-5));
      EXPECT_TRUE(Near(dq, dt, want_dq, rtol, atol));
      EXPECT_TRUE(Near(dk, dt, want_dk, rtol, atol));
      EXPECT_TRUE(Near(dv, dt, want_dv, rtol, atol));
    }
}

TEST_P(CudaEmu, AttentionRefusesHeadsWiderThan256) {
  Values q(Dt::kF32, 300), out(Dt::kF32, 300);
  EXPECT_EQ(ck::AttentionForward(Dt::kF32, q.data(), q.data(), q.data(), out.data(), nullptr, 1, 1, 1, 300, 300, 1.f,
                                 false, nullptr),
            cudaErrorInvalidValue);
}

// ---- Optimizers ----------------------------------------------------------------------------

// `count` tensors of assorted sizes (some empty) with their float arrays.
struct TensorSet {
  std::vector<std::unique_ptr<Array<float>>> arrays;
  std::vector<const float*> in;
  std::vector<float*> out;
  std::vector<int64_t> n;
  TensorSet(const std::vector<int64_t>& sizes, float lo, float hi, uint32_t seed) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      arrays.push_back(std::make_unique<Array<float>>(sizes[t]));
      const std::vector<float> v = Uniform(sizes[t], lo, hi, seed + static_cast<uint32_t>(t));
      for (int64_t i = 0; i < sizes[t]; ++i) (*arrays.back())[i] = v[static_cast<size_t>(i)];
      in.push_back(arrays.back()->data());
      out.push_back(arrays.back()->data());
      n.push_back(sizes[t]);
    }
  }
};

std::vector<int64_t> Sizes(int count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> s;
  for (int t = 0; t < count; ++t) s.push_back(t % 9 == 4 ? 0 : static_cast<int64_t>(gen() % 2500 + 1));
  return s;
}

::testing::AssertionResult SameAs(const TensorSet& got, const std::vector<std::vector<float>>& want, const char* what) {
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      const float g = (*got.arrays[t])[static_cast<int64_t>(i)];
      if (g != want[t][i])
        return ::testing::AssertionFailure() << what << " tensor " << t << " [" << i << "] " << Text(g) << " want "
                                             << Text(want[t][i]);
    }
  return ::testing::AssertionSuccess();
}

TEST_P(CudaEmu, MultiTensorAdamWIsTheCpuStepOverManyLaunches) {
  const std::vector<int64_t> sizes = Sizes(70, 29);  // 32 tensors a launch: three launches
  for (bool on_device_scale : {false, true}) {
    SCOPED_TRACE(on_device_scale ? "scale on the device" : "scale from the host");
    TensorSet p(sizes, -1.f, 1.f, 100), g(sizes, -2.f, 2.f, 200), m(sizes, -0.1f, 0.1f, 300), v(sizes, 0.f, 0.1f, 400);
    kernels::cpu::AdamWParams ap;
    ap.lr = static_cast<float>(3e-4), ap.step = 7,  // the learning rate is a float32 input on either side ap.grad_scale = 0.625f, ap.beta1 = 0.9f, ap.beta2 = 0.95f, ap.epsilon = 1e-8f;
    ap.weight_decay = 0.1f;
    std::vector<std::vector<float>> wp, wm, wv;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t k = static_cast<size_t>(sizes[t]);
      wp.emplace_back(k), wm.emplace_back(k), wv.emplace_back(k);
      kernels::cpu::AdamWStep(ap, p.in[t], g.in[t], m.in[t], v.in[t], wp[t].data(), wm[t].data(), wv[t].data(),
                              sizes[t], nullptr);
    }
    Array<float> device_scale(1, ap.grad_scale);
    // In place, as the training session updates its state.
    ASSERT_TRUE(Ok(ck::MultiTensorAdamW(static_cast<int>(sizes.size()), p.in.data(), g.in.data(), m.in.data(),
                                        v.in.data(), p.out.data(), m.out.data(), v.out.data(), p.n.data(),
                                        static_cast<float>(ap.lr), ap.beta1, ap.beta2, ap.epsilon, ap.weight_decay,
                                        ap.step, on_device_scale ? 99.f : ap.grad_scale, nullptr,
                                        on_device_scale ? device_scale.data() : nullptr)));
    EXPECT_TRUE(SameAs(p, wp, "param"));
    EXPECT_TRUE(SameAs(m, wm, "exp_avg"));
    EXPECT_TRUE(SameAs(v, wv, "exp_avg_sq"));
  }
}

TEST_P(CudaEmu, MultiTensorSgdIsTheCpuStepWithAndWithoutMomentum) {
  const std::vector<int64_t> sizes = Sizes(35, 31);
  struct Case {
    float momentum, dampening;
    bool nesterov;
    int64_t step;
  };
  for (const Case& c : {Case{0.f, 0.f, false, 1}, Case{0.9f, 0.1f, false, 1}, Case{0.9f, 0.1f, false, 2},
                        Case{0.9f, 0.f, true, 3}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " step " + std::to_string(c.step) +
                 (c.nesterov ? " nesterov" : ""));
    TensorSet p(sizes, -1.f, 1.f, 500), g(sizes, -2.f, 2.f, 600), buf(sizes, -0.5f, 0.5f, 700);
    kernels::cpu::SgdParams sp;
    sp.lr = static_cast<float>(0.05), sp.step = c.step, sp.grad_scale = 0.5f, sp.momentum = c.momentum, sp.dampening = c.dampening;
    sp.weight_decay = 0.01f, sp.nesterov = c.nesterov;
    std::vector<std::vector<float>> wp, wb;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t k = static_cast<size_t>(sizes[t]);
      wp.emplace_back(k), wb.emplace_back(buf.in[t], buf.in[t] + k);
      kernels::cpu::SgdStep(sp, p.in[t], g.in[t], c.momentum != 0.f ? buf.in[t] : nullptr, wp[t].data(),
                            c.momentum != 0.f ? wb[t].data() : nullptr, sizes[t], nullptr);
    }
    ASSERT_TRUE(Ok(ck::MultiTensorSgd(static_cast<int>(sizes.size()), p.in.data(), g.in.data(), buf.in.data(),
                                      p.out.data(), buf.out.data(), p.n.data(), static_cast<float>(sp.lr), c.momentum,
                                      c.dampening, sp.weight_decay, c.nesterov, c.step, sp.grad_scale, nullptr)));
    EXPECT_TRUE(SameAs(p, wp, "param"));
    EXPECT_TRUE(SameAs(buf, wb, "momentum buffer"));
  }
}

TEST_P(CudaEmu, SquaredNormOfManyTensorsAndTheClippingScale) {
  const std::vector<int64_t> sizes = Sizes(130, 37);  // 128 tensors a launch: two launches
  TensorSet x(sizes, -1.f, 1.f, 800);
  double want = 0;
  for (size_t t = 0; t < sizes.size(); ++t) want += kernels::cpu::SquaredNorm(x.in[t], sizes[t], nullptr);
  Array<float> sumsq(1, kNaN);
  Array<double> acc(1, NAN);
  ASSERT_TRUE(Ok(ck::SquaredNorm(x.in.data(), x.n.data(), static_cast<int>(sizes.size()), sumsq.data(), acc.data(),
                                 nullptr)));
  EXPECT_NEAR(sumsq[0], want, 1e-6 * want);
  // The CPU's clipping, in its float operations.
  for (float max_norm : {0.f, 1.f, 1e6f}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    Array<float> norm(1, kNaN), scale(1, kNaN);
    const float grad_scale = 0.25f, eps = 1e-6f;
    ASSERT_TRUE(Ok(ck::ClipScale(sumsq.data(), grad_scale, max_norm, eps, norm.data(), scale.data(), nullptr)));
    const float want_norm = std::sqrt(sumsq[0]) * grad_scale;
    EXPECT_EQ(norm[0], want_norm);
    EXPECT_EQ(scale[0], max_norm > 0.f ? grad_scale * std::min(max_norm / (want_norm + eps), 1.f) : grad_scale);
  }
}

// The loss scaler's test over 130 tensors (two launches): true for finite values up to the
// largest float, false for one infinite or NaN element anywhere, as the CPU says.
TEST_P(CudaEmu, AllFiniteOfManyTensors) {
  const std::vector<int64_t> sizes = Sizes(130, 41);
  TensorSet x(sizes, -1.f, 1.f, 900);
  const float kInf = std::numeric_limits<float>::infinity();
  auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    bool want = true;
    for (size_t t = 0; t < sizes.size(); ++t) want = want && kernels::cpu::AllFinite(x.in[t], sizes[t], nullptr);
    Array<bool> finite(1, !want);
    EXPECT_TRUE(Ok(ck::AllFinite(x.in.data(), x.n.data(), static_cast<int>(sizes.size()), finite.data(), nullptr)));
    EXPECT_EQ(finite[0], want);
    return want;
  };
  EXPECT_TRUE(check("random values"));
  x.out[7][0] = std::numeric_limits<float>::max();
  x.out[8][sizes[8] - 1] = -std::numeric_limits<float>::max();
  EXPECT_TRUE(check("the largest floats"));
  for (float bad : {kInf, -kInf, kNaN}) {
    for (size_t t : {size_t{2}, sizes.size() - 1}) {  // in the first launch, and in the second
      const int64_t i = sizes[t] - 1;
      const float kept = x.out[t][i];
      x.out[t][i] = bad;
      EXPECT_FALSE(check((std::to_string(bad) + " in tensor " + std::to_string(t)).c_str()));
      x.out[t][i] = kept;
    }
  }
}

}  // namespace
}  // namespace cleave
