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
      const ck::AttentionLayout L = ck::ContiguousAttention(T, S, D, Dv);
      ASSERT_TRUE(Ok(ck::AttentionForward(dt, L, q.data(), k.data(), v.data(), out.data(), lse.data(), B, T, S, a.D,
                                          a.Dv, scale, a.causal, nullptr)));
      ASSERT_TRUE(Ok(ck::AttentionBackward(dt, L, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
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
  EXPECT_EQ(ck::AttentionForward(Dt::kF32, ck::ContiguousAttention(1, 1, 300, 300), q.data(), q.data(), q.data(),
                                 out.data(), nullptr, 1, 1, 1, 300, 300, 1.f, false, nullptr),
            cudaErrorInvalidValue);
}

// The kernels read and write [B, T, H, D] operands and the packed [B, T, 3, H, D] q/k/v product in
// place, through their strides: the same values, bit for bit, as the contiguous [B, H, T, D]
// kernels on re-laid copies, and every element of a packed gradient written.
TEST_P(CudaEmu, AttentionInPlaceLayoutsMatchTheContiguousKernels) {
  const struct {
    int64_t B, H, T, S;
    int D, Dv;
    bool causal, packed;
  } cases[] = {{2, 3, 37, 45, 40, 24, true, false},  // T < S, D != Dv, partial tiles
               {1, 2, 40, 40, 32, 32, false, false},
               {2, 2, 37, 37, 16, 16, true, true},   // packed: T = S, D = Dv
               {1, 4, 9, 9, 64, 64, false, true}};
  for (Dt dt : kDts)
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(Name(dt)) + (c.packed ? " bs3hd" : " bshd") + " H " + std::to_string(c.H) + " T " +
                   std::to_string(c.T) + " S " + std::to_string(c.S));
      const int64_t B = c.B, H = c.H, T = c.T, S = c.S, D = c.D, Dv = c.Dv, BH = B * H;
      const float scale = 0.3f;
      // The contiguous operands, slice (b, h) after slice.
      Values q(dt, Uniform(BH * T * D, -1.f, 1.f, 40)), k(dt, Uniform(BH * S * D, -1.f, 1.f, 41));
      Values v(dt, Uniform(BH * S * Dv, -1.f, 1.f, 42)), dout(dt, Uniform(BH * T * Dv, -1.f, 1.f, 43));
      Values out(dt, BH * T * Dv), dq(dt, BH * T * D), dk(dt, BH * S * D), dv(dt, BH * S * Dv);
      Array<float> lse(BH * T, kNaN), delta(BH * T, kNaN);
      const ck::AttentionLayout C = ck::ContiguousAttention(T, S, D, Dv);
      ASSERT_TRUE(Ok(ck::AttentionForward(dt, C, q.data(), k.data(), v.data(), out.data(), lse.data(), BH, T, S,
                                          c.D, c.Dv, scale, c.causal, nullptr)));
      ASSERT_TRUE(Ok(ck::AttentionBackward(dt, C, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                           dq.data(), dk.data(), dv.data(), delta.data(), BH, T, S, c.D, c.Dv,
                                           scale, c.causal, nullptr)));
      // The same values in the product's layout: row t of head h of batch b at b * batch + h * head + t * row.
      ck::AttentionLayout L;
      L.heads = H;
      if (c.packed) {
        L.q = L.k = L.v = {T * 3 * H * D, D, 3 * H * D};
      } else {
        L.q = {T * H * D, D, H * D};
        L.k = {S * H * D, D, H * D};
        L.v = {S * H * Dv, Dv, H * Dv};
      }
      L.o = {T * H * Dv, Dv, H * Dv};
      const int64_t k_off = c.packed ? H * D : 0, v_off = c.packed ? 2 * H * D : 0;
      const int64_t qkv_elems = c.packed ? B * T * 3 * H * D : 0;
      Values packed(dt, qkv_elems > 0 ? qkv_elems : 1), dpacked(dt, qkv_elems > 0 ? qkv_elems : 1);
      Values ql(dt, BH * T * D), kl(dt, BH * S * D), vl(dt, BH * S * Dv), doutl(dt, BH * T * Dv);
      Values outl(dt, BH * T * Dv), dql(dt, BH * T * D), dkl(dt, BH * S * D), dvl(dt, BH * S * Dv);
      Values& qs = c.packed ? packed : ql;
      Values& ks = c.packed ? packed : kl;
      Values& vs = c.packed ? packed : vl;
      const auto at = [&](const ck::AttentionStrides& s, int64_t b, int64_t t) {
        return b / H * s.batch + b % H * s.head + t * s.row;
      };
      const auto relay = [&](const Values& from, Values& to, const ck::AttentionStrides& s, int64_t off, int64_t rows,
                             int64_t width) {
        for (int64_t b = 0; b < BH; ++b)
          for (int64_t t = 0; t < rows; ++t)
            for (int64_t d = 0; d < width; ++d) to.Set(off + at(s, b, t) + d, from[(b * rows + t) * width + d]);
      };
      relay(q, qs, L.q, 0, T, D);
      relay(k, ks, L.k, k_off, S, D);
      relay(v, vs, L.v, v_off, S, Dv);
      relay(dout, doutl, L.o, 0, T, Dv);
      Array<float> lsel(BH * T, kNaN), deltal(BH * T, kNaN);
      const char* base = static_cast<const char*>(qs.data());
      const size_t elem = dt == Dt::kF32 ? 4 : 2;
      const void* kp = c.packed ? base + k_off * elem : kl.data();
      const void* vp = c.packed ? base + v_off * elem : vl.data();
      void* dqp = c.packed ? dpacked.data() : dql.data();
      void* dkp = c.packed ? static_cast<char*>(dpacked.data()) + k_off * elem : dkl.data();
      void* dvp = c.packed ? static_cast<char*>(dpacked.data()) + v_off * elem : dvl.data();
      ASSERT_TRUE(Ok(ck::AttentionForward(dt, L, qs.data(), kp, vp, outl.data(), lsel.data(), BH, T, S, c.D, c.Dv,
                                          scale, c.causal, nullptr)));
      ASSERT_TRUE(Ok(ck::AttentionBackward(dt, L, doutl.data(), qs.data(), kp, vp, outl.data(), lsel.data(), dqp, dkp,
                                           dvp, deltal.data(), BH, T, S, c.D, c.Dv, scale, c.causal, nullptr)));
      // Laid back out: each result is the contiguous one exactly.
      const auto expect_same = [&](const Values& got, const ck::AttentionStrides& s, int64_t off, const Values& want,
                                   int64_t rows, int64_t width, const char* what) {
        int64_t differ = 0;
        for (int64_t b = 0; b < BH; ++b)
          for (int64_t t = 0; t < rows; ++t)
            for (int64_t d = 0; d < width; ++d) {
              const float g = got[off + at(s, b, t) + d], w = want[(b * rows + t) * width + d];
              differ += !(g == w || (std::isnan(g) && std::isnan(w)));
            }
        EXPECT_EQ(differ, 0) << what;
      };
      expect_same(outl, L.o, 0, out, T, Dv, "out");
      for (int64_t i = 0; i < BH * T; ++i) ASSERT_EQ(lsel[i], lse[i]) << "lse " << i;
      expect_same(c.packed ? dpacked : dql, L.q, 0, dq, T, D, "dq");
      expect_same(c.packed ? dpacked : dkl, L.k, k_off, dk, S, D, "dk");
      expect_same(c.packed ? dpacked : dvl, L.v, v_off, dv, S, Dv, "dv");
      if (c.packed) {  // every element of the packed gradient is one of dq, dk, dv: none is left NaN
        int64_t unwritten = 0;
        for (int64_t i = 0; i < qkv_elems; ++i) unwritten += std::isnan(dpacked[i]);
        EXPECT_EQ(unwritten, 0);
      }
    }
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
