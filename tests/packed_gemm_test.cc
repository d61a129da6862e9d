// Tests of the packed-weight GEMM (kernels/cpu/packed_gemm.h) against GemmReference over
// shapes with row and column tails, and of MatMul / FusedMatMul with a constant weight,
// which take that path, through OpTester. Expected values come from double-precision loops.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "tests/nn_test_util.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

using kernels::cpu::Activation;

double GeluErfRef(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double GeluTanhRef(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

// act(A @ op(B) + bias) in double through GemmReference.
std::vector<double> Reference(int64_t M, int64_t N, int64_t K, bool trans_b,
                              const std::vector<float>& a, const std::vector<float>& b,
                              const std::vector<float>* bias, Activation act) {
  kernels::cpu::GemmParams g;
  g.M = M, g.N = N, g.K = K, g.trans_b = trans_b;
  std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), y(M * N);
  kernels::cpu::GemmReference(g, ad.data(), bd.data(), y.data());
  for (int64_t i = 0; i < M * N; ++i) {
    double v = y[i] + (bias ? (*bias)[i % N] : 0.0);
    if (act == Activation::kGelu) v = GeluErfRef(v);
    else if (act == Activation::kGeluTanh) v = GeluTanhRef(v);
    y[i] = v;
  }
  return y;
}

// Runs every (M, N, K) combination both ways round for B, with and without a bias, on 1
// and 2 threads; the two thread counts must agree bit for bit (fixed summation order).
void CheckShapes(const std::vector<int64_t>& ms, const std::vector<int64_t>& ns,
                 const std::vector<int64_t>& ks, Activation act) {
  ThreadPool pool2(2);
  for (int64_t M : ms)
    for (int64_t N : ns)
      for (int64_t K : ks)
        for (bool trans_b : {false, true})
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " K " << K
                                              << " transB " << trans_b << " bias " << with_bias);
            const std::vector<float> a = Cast<float>(Values(M * K, 1 + M + K));
            const std::vector<float> b = Cast<float>(Values(K * N, 2 + N + K));
            const std::vector<float> bias = Cast<float>(Values(N, 3 + N));
            const std::vector<float>* bias_p = with_bias ? &bias : nullptr;
            const std::vector<double> ref = Reference(M, N, K, trans_b, a, b, bias_p, act);
            const kernels::cpu::PackedB pb = kernels::cpu::PackB(b.data(), K, N, trans_b);
            // C gets a row stride wider than N, so stray writes past column N show up.
            const int64_t ldc = N + 3;
            std::vector<float> c1(M * ldc, 7.f), c2(M * ldc, 7.f);
            const float* bp = with_bias ? bias.data() : nullptr;
            kernels::cpu::GemmPacked(M, a.data(), K, pb, bp, act, c1.data(), ldc, nullptr);
            kernels::cpu::GemmPacked(M, a.data(), K, pb, bp, act, c2.data(), ldc, &pool2);
            // Rounding grows with the number of terms summed (about sqrt(K) for random signs).
            const double abs_tol = 1e-4 * std::max(1.0, std::sqrt(static_cast<double>(K)) / 4);
            int bad = 0;
            for (int64_t m = 0; m < M && bad < 5; ++m)
              for (int64_t n = 0; n < ldc && bad < 5; ++n) {
                const float got = c1[m * ldc + n];
                ASSERT_EQ(got, c2[m * ldc + n]) << "thread counts disagree at " << m << "," << n;
                if (n >= N) {
                  bad += got != 7.f;
                  EXPECT_EQ(got, 7.f) << "write past N at " << m << "," << n;
                  continue;
                }
                const double want = ref[m * N + n];
                const bool ok = std::abs(got - want) <= abs_tol + 1e-4 * std::abs(want);
                bad += !ok;
                EXPECT_TRUE(ok) << "at " << m << "," << n << ": got " << got << " want " << want;
              }
          }
}

TEST(PackedGemmTest, MatchesReferenceOverTails) {
  if (!kernels::cpu::PackedGemmAvailable()) GTEST_SKIP() << "no AVX-512 on this CPU";
  CheckShapes({1, 5, 13, 128, 131}, {1, 17, 32, 100}, {1, 7, 64, 768}, Activation::kNone);
}

TEST(PackedGemmTest, WideAndLongShapes) {
  if (!kernels::cpu::PackedGemmAvailable()) GTEST_SKIP() << "no AVX-512 on this CPU";
  CheckShapes({1, 13, 131}, {2304}, {7, 768}, Activation::kNone);
  CheckShapes({250, 500}, {33}, {64}, Activation::kNone);  // more than one row block
  CheckShapes({3}, {48}, {0}, Activation::kNone);           // K = 0: C = bias (or 0)
}

TEST(PackedGemmTest, ActivationsApplyAfterBias) {
  if (!kernels::cpu::PackedGemmAvailable()) GTEST_SKIP() << "no AVX-512 on this CPU";
  CheckShapes({5, 13}, {17, 100}, {7, 64}, Activation::kGelu);
  CheckShapes({5, 13}, {17, 100}, {7, 64}, Activation::kGeluTanh);
}

// GemmAvx512, the path Sgemm takes where OpenBLAS runs 256-bit kernels: every transpose of A
// and B, C written or added to (beta 0 or 1), leading dimensions wider than the matrices, row
// and column tails, a reduction too long to pack whole (K past 32768 floats a panel), K = 0;
// against GemmReference in double, and bit for bit on 1 and 2 threads.
void CheckGeneral(int64_t M, int64_t N, int64_t K) {
  ThreadPool pool2(2);
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (float beta : {0.f, 1.f}) {
        SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " K " << K << " transA " << trans_a
                                          << " transB " << trans_b << " beta " << beta);
        kernels::cpu::GemmParams p;
        p.M = M, p.N = N, p.K = K, p.trans_a = trans_a, p.trans_b = trans_b, p.beta = beta;
        p.lda = (trans_a ? M : K) + 5, p.ldb = (trans_b ? K : N) + 2, p.ldc = N + 3;
        const int64_t a_rows = trans_a ? K : M, b_rows = trans_b ? N : K;
        const std::vector<float> a = Cast<float>(Values(a_rows * p.lda, 5 + M + K));
        const std::vector<float> b = Cast<float>(Values(b_rows * p.ldb, 6 + N + K));
        const std::vector<float> c0 = Cast<float>(Values(M * p.ldc, 7 + M + N));
        // The reference over dense copies of op(A) and op(B).
        std::vector<double> ad(M * K), bd(K * N), ref(M * N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = 0; k < K; ++k) ad[m * K + k] = trans_a ? a[k * p.lda + m] : a[m * p.lda + k];
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) bd[k * N + n] = trans_b ? b[n * p.ldb + k] : b[k * p.ldb + n];
        kernels::cpu::GemmParams dense;
        dense.M = M, dense.N = N, dense.K = K;
        kernels::cpu::GemmReference(dense, ad.data(), bd.data(), ref.data());
        std::vector<float> c1 = c0, c2 = c0;
        kernels::cpu::GemmAvx512(p, a.data(), b.data(), c1.data(), nullptr);
        kernels::cpu::GemmAvx512(p, a.data(), b.data(), c2.data(), &pool2);
        const double abs_tol = 1e-4 * std::max(1.0, std::sqrt(static_cast<double>(K)) / 4);
        int bad = 0;
        for (int64_t m = 0; m < M && bad < 5; ++m)
          for (int64_t n = 0; n < p.ldc && bad < 5; ++n) {
            const int64_t i = m * p.ldc + n;
            ASSERT_EQ(c1[i], c2[i]) << "thread counts disagree at " << m << "," << n;
            if (n >= N) {
              bad += c1[i] != c0[i];
              EXPECT_EQ(c1[i], c0[i]) << "write past N at " << m << "," << n;
              continue;
            }
            const double want = ref[m * N + n] + (beta == 1.f ? c0[i] : 0.0);
            const bool ok = std::abs(c1[i] - want) <= abs_tol + 1e-4 * std::abs(want);
            bad += !ok;
            EXPECT_TRUE(ok) << "at " << m << "," << n << ": got " << c1[i] << " want " << want;
          }
      }
}

TEST(PackedGemmTest, GeneralProductsOfEveryLayoutMatchTheReference) {
  if (!kernels::cpu::PackedGemmAvailable()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (int64_t M : {1, 13, 250})
    for (int64_t N : {7, 32, 100})
      for (int64_t K : {1, 64, 300}) CheckGeneral(M, N, K);
  CheckGeneral(37, 1100, 70);   // more panels than 4 per thread: threads split the columns
  CheckGeneral(3, 40, 33000);   // a panel over the whole K is past 4 MiB: packed a K block at a time
  CheckGeneral(5, 9, 0);        // K = 0: C = 0, or left as it is
}

// With B an initializer the kernels pack it at load; the results must match the naive
// product for batched A, both B layouts, bias and activations.
TEST(PackedGemmTest, OpsWithConstantWeightMatchNaive) {
  const I64 ad = {2, 5, 40}, bd = {40, 37}, btd = {37, 40};
  std::vector<double> a = Values(Numel(ad), 31), b = Values(Numel(bd), 32), bias = Values(37, 33);
  std::vector<double> bt(b.size());
  for (int64_t k = 0; k < 40; ++k)
    for (int64_t n = 0; n < 37; ++n) bt[n * 40 + k] = b[k * 37 + n];
  I64 yd;
  const std::vector<double> mm = NaiveMatMul(a, ad, b, bd, &yd);
  OpTester("MatMul", 13).Input<float>("A", ad, Cast<float>(a)).Input<float>("B", bd, Cast<float>(b))
      .AsInitializer().Output<float>("Y", yd, Cast<float>(mm)).Tolerance(1e-5, 1e-4).Run();
  for (const char* act : {"", "gelu", "gelu_tanh"})
    for (bool trans_b : {false, true}) {
      std::vector<double> y = mm;
      for (size_t i = 0; i < y.size(); ++i) {
        double v = y[i] + bias[i % 37];
        if (act == std::string("gelu")) v = GeluErfRef(v);
        else if (act == std::string("gelu_tanh")) v = GeluTanhRef(v);
        y[i] = v;
      }
      SCOPED_TRACE(::testing::Message() << "act '" << act << "' transB " << trans_b);
      OpTester("FusedMatMul", 1, "ai.cleave")
          .Attr("activation", std::string(act)).Attr("transB", int64_t{trans_b})
          .Input<float>("A", ad, Cast<float>(a))
          .Input<float>("B", trans_b ? btd : bd, Cast<float>(trans_b ? bt : b)).AsInitializer()
          .Input<float>("bias", {37}, Cast<float>(bias))
          .Output<float>("Y", yd, Cast<float>(y)).Tolerance(1e-5, 1e-4).Run();
    }
}

}  // namespace
}  // namespace cleave::testing
