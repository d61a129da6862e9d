// RNN, GRU and LSTM unrolled over their (static) sequence length into MatMuls, Splits and
// elementwise ops, one step per time step and direction (graph/passes/decomposition.cc).
//
// The input projection X·Wᵀ of every step is one MatMul over the whole sequence, split by
// gate and then by step; each step adds H·Rᵀ (one MatMul, split by gate) and applies the
// activations. The states are [1, batch, hidden] throughout, so the steps' outputs
// concatenate into Y and the last state is Y_h's slice for its direction without reshaping.
// Splits and Concats keep the backward linear in the sequence length: their gradients are a
// Concat and a Split, where a Gather or Slice per step would each scatter into a zero tensor of
// the whole sequence. A sequence_lens input masks each step with a Where: a row past its
// length keeps its state and writes zeros to Y. Reversed, the same masks skip a row's padding
// before its first real step, so each row starts at its own last element.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "graph/passes/emitter.h"

namespace cleave::graph::decompose {

namespace {

struct Activation {
  std::string name;  // lower case
  float alpha = 0.f, beta = 0.f;
};

// The ONNX defaults of the activations' alpha and beta, and whether each takes them.
bool TakesAlpha(const std::string& f) {
  return f == "leakyrelu" || f == "thresholdedrelu" || f == "elu" || f == "hardsigmoid" || f == "affine" ||
         f == "scaledtanh";
}
bool TakesBeta(const std::string& f) { return f == "hardsigmoid" || f == "affine" || f == "scaledtanh"; }
float DefaultAlpha(const std::string& f) {
  if (f == "leakyrelu") return 0.01f;
  if (f == "hardsigmoid") return 0.2f;
  return 1.f;
}
float DefaultBeta(const std::string& f) {
  if (f == "hardsigmoid") return 0.5f;
  if (f == "affine") return 0.f;
  return 1.f;
}

// The node's activations, `per_direction` for each direction: the `activations` attribute (one
// list for every direction, or one per direction, forward first) or `defaults`. alpha and beta
// are taken in order by the activations that have them.
absl::StatusOr<std::vector<Activation>> Activations(const Node& n, int directions,
                                                    const std::vector<std::string>& defaults) {
  const int per_direction = static_cast<int>(defaults.size());
  std::vector<std::string> names;
  if (n.HasAttr("activations")) {
    names = n.FindAttr("activations")->strings;
    if (static_cast<int>(names.size()) == per_direction && directions == 2) {
      names.insert(names.end(), names.begin(), names.end());
    } else if (static_cast<int>(names.size()) != per_direction * directions) {
      return InvalidArgument(n.Describe(), ": expected ", per_direction * directions, " activations (",
                             per_direction, " per direction), got ", names.size());
    }
  } else {
    for (int d = 0; d < directions; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  }
  const std::vector<float> alphas = n.AttrFloats("activation_alpha"), betas = n.AttrFloats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  std::vector<Activation> out;
  for (const std::string& name : names) {
    Activation a{absl::AsciiStrToLower(name)};
    static const char* kKnown[] = {"sigmoid", "tanh", "relu", "leakyrelu", "thresholdedrelu", "hardsigmoid",
                                   "elu", "softsign", "softplus", "affine", "scaledtanh"};
    if (std::find(std::begin(kKnown), std::end(kKnown), a.name) == std::end(kKnown))
      return Unimplemented(n.Describe(), ": activation '", name,
                           "' is not one of Sigmoid, Tanh, Relu, LeakyRelu, ThresholdedRelu, HardSigmoid, Elu, "
                           "Softsign, Softplus, Affine, ScaledTanh");
    a.alpha = DefaultAlpha(a.name);
    a.beta = DefaultBeta(a.name);
    if (TakesAlpha(a.name) && next_alpha < alphas.size()) a.alpha = alphas[next_alpha++];
    if (TakesBeta(a.name) && next_beta < betas.size()) a.beta = betas[next_beta++];
    out.push_back(a);
  }
  return out;
}

class Unroller {
 public:
  Unroller(Graph* g, Node* n, Emitter& e)
      : g_(g), n_(*n), e_(e), t_(n->input(0)->dtype()), base_(n->name().empty() ? n->op_type() : n->name()) {}

  // f(x). A gate's x is first bounded to [-clip, clip] when the node has a clip; the cell
  // state going into LSTM's h is not (as in onnxruntime).
  absl::StatusOr<Value*> Activate(const Activation& a, Value* x, bool gate = true) {
    if (clip_ && gate) {
      ASSIGN_OR_RETURN(x, e_.ClipSymmetric(x, *clip_));
    }
    const std::string& f = a.name;
    if (f == "sigmoid") return e_.Add("Sigmoid", {x});
    if (f == "tanh") return e_.Add("Tanh", {x});
    if (f == "relu") return e_.Add("Relu", {x});
    if (f == "softsign") return e_.Add("Softsign", {x});
    if (f == "softplus") return e_.Add("Softplus", {x});
    if (f == "leakyrelu") return e_.Add("LeakyRelu", {x}, {{"alpha", Attribute::Float(a.alpha)}});
    if (f == "thresholdedrelu") return e_.Add("ThresholdedRelu", {x}, {{"alpha", Attribute::Float(a.alpha)}});
    if (f == "elu") return e_.Add("Elu", {x}, {{"alpha", Attribute::Float(a.alpha)}});
    if (f == "hardsigmoid")
      return e_.Add("HardSigmoid", {x}, {{"alpha", Attribute::Float(a.alpha)}, {"beta", Attribute::Float(a.beta)}});
    if (f == "affine") {
      ASSIGN_OR_RETURN(Value * y, e_.Add("Mul", {x, e_.Scalar(t_, a.alpha)}));
      return e_.Add("Add", {y, e_.Scalar(t_, a.beta)});
    }
    // scaledtanh: alpha tanh(beta x)
    ASSIGN_OR_RETURN(Value * y, e_.Add("Mul", {x, e_.Scalar(t_, a.beta)}));
    ASSIGN_OR_RETURN(y, e_.Add("Tanh", {y}));
    return e_.Add("Mul", {y, e_.Scalar(t_, a.alpha)});
  }

  absl::Status Run(int version) {
    const std::string op = n_.op_type();
    gates_ = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
    Value* x = n_.input(0);
    const Shape& xs = x->shape();
    if (!xs.has_rank()) return Unimplemented(n_.Describe(), ": X's rank is unknown; cleave unrolls ", op, " by shape");
    const bool batch_major = version >= 14 && n_.AttrInt("layout", 0) == 1;
    const Dim& seq = xs[batch_major ? 1 : 0];
    if (!seq.is_static())
      return Unimplemented(n_.Describe(), ": the sequence length (X's dim ", batch_major ? 1 : 0, ", '", seq.symbol,
                           "') is symbolic; cleave unrolls ", op,
                           " over a static one. Fix it (free_dimension_overrides, or --dim when training)");
    steps_ = seq.value;
    if (steps_ == 0) return Unimplemented(n_.Describe(), ": X's sequence is empty (length 0); cleave unrolls ", op, " over one of 1 or more");
    hidden_ = HiddenSize();
    if (hidden_ <= 0) return Unimplemented(n_.Describe(), ": the hidden size is unknown (no 'hidden_size', R's dims symbolic)");
    const std::string direction = n_.AttrString("direction", "forward");
    const int directions = direction == "bidirectional" ? 2 : 1;
    if (n_.HasAttr("clip")) clip_ = n_.AttrFloat("clip", 0.f);
    const std::vector<std::string> defaults = op == "LSTM"  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                              : op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                            : std::vector<std::string>{"Tanh"};
    ASSIGN_OR_RETURN(acts_, Activations(n_, directions, defaults));
    linear_before_reset_ = n_.AttrInt("linear_before_reset", 0) != 0;
    input_forget_ = n_.AttrInt("input_forget", 0) != 0;

    auto input = [&](int i) { return i < n_.num_inputs() ? n_.input(i) : nullptr; };
    Value* w = input(1);
    Value* r = input(2);
    Value* b = input(3);
    lens_ = input(4);
    Value* h0 = input(5);
    Value* c0 = op == "LSTM" ? input(6) : nullptr;
    Value* p = op == "LSTM" ? input(7) : nullptr;
    std::vector<Value*> outs;
    for (int i = 0; i < n_.num_outputs(); ++i) outs.push_back(n_.output(i));
    outs.resize(3, nullptr);
    const bool want_y = outs[0] != nullptr;
    g_->RemoveNode(&n_);  // n_ is gone from here on

    // Time-major throughout: X [seq, batch, input], the states [directions, batch, hidden].
    if (batch_major) {
      ASSIGN_OR_RETURN(x, e_.Transpose(x, {1, 0, 2}));
      if (h0) {
        ASSIGN_OR_RETURN(h0, e_.Transpose(h0, {1, 0, 2}));
      }
      if (c0) {
        ASSIGN_OR_RETURN(c0, e_.Transpose(c0, {1, 0, 2}));
      }
    }
    const std::vector<int64_t> per_dir(directions, 1);
    ASSIGN_OR_RETURN(std::vector<Value*> ws, e_.Split(w, 0, per_dir));
    ASSIGN_OR_RETURN(std::vector<Value*> rs, e_.Split(r, 0, per_dir));
    std::vector<Value*> bs(directions, nullptr), h0s(directions, nullptr), c0s(directions, nullptr),
        ps(directions, nullptr);
    if (b) {
      ASSIGN_OR_RETURN(bs, e_.Split(b, 0, per_dir));
    }
    if (h0) {
      ASSIGN_OR_RETURN(h0s, e_.Split(h0, 0, per_dir));
    }
    if (c0) {
      ASSIGN_OR_RETURN(c0s, e_.Split(c0, 0, per_dir));
    }
    if (p) {
      ASSIGN_OR_RETURN(ps, e_.Split(p, 0, per_dir));
    }
    Value* zeros = nullptr;
    std::vector<Value*> ys, hs, cs;
    for (int d = 0; d < directions; ++d) {
      const bool reverse = direction == "reverse" || d == 1;
      if (!h0s[d] || (gates_ == 4 && !c0s[d])) {
        if (!zeros) zeros = e_.Constant(base_ + "/zero_state", Tensor(t_, {1, 1, hidden_}));
      }
      Direction dir{ws[d], rs[d], bs[d], ps[d], h0s[d] ? h0s[d] : zeros, c0s[d] ? c0s[d] : zeros, reverse,
                    std::vector<Activation>(acts_.begin() + d * defaults.size(),
                                            acts_.begin() + (d + 1) * defaults.size())};
      ASSIGN_OR_RETURN(Result res, Unroll(x, dir, want_y));
      ys.push_back(res.y);
      hs.push_back(res.h);
      cs.push_back(res.c);
    }
    // Y [seq, directions, batch, hidden], Y_h and Y_c [directions, batch, hidden]; batch
    // first under layout 1.
    if (outs[0]) {
      std::vector<Value*> parts;
      for (Value* y : ys) {
        ASSIGN_OR_RETURN(Value * u, e_.Unsqueeze(y, {1}));
        parts.push_back(u);
      }
      ASSIGN_OR_RETURN(Value * y, Concat(parts, 1));
      if (batch_major) {
        ASSIGN_OR_RETURN(y, e_.Transpose(y, {2, 0, 1, 3}));
      }
      RETURN_IF_ERROR(e_.Finish(y, outs[0]));
    }
    for (int k = 1; k < 3; ++k) {
      if (!outs[k]) continue;
      ASSIGN_OR_RETURN(Value * s, Concat(k == 1 ? hs : cs, 0));
      if (batch_major) {
        ASSIGN_OR_RETURN(s, e_.Transpose(s, {1, 0, 2}));
      }
      RETURN_IF_ERROR(e_.Finish(s, outs[k]));
    }
    return absl::OkStatus();
  }

 private:
  struct Direction {
    Value *w, *r, *b, *p, *h0, *c0;
    bool reverse;
    std::vector<Activation> acts;  // f, g, h as the op has them
  };
  struct Result {
    Value *y, *h, *c;
  };

  int64_t HiddenSize() const {
    if (n_.HasAttr("hidden_size")) return n_.AttrInt("hidden_size", 0);
    const Shape& r = n_.input(2)->shape();
    return r.has_rank() && r.rank() == 3 && r[2].is_static() ? r[2].value : 0;
  }

  absl::StatusOr<Value*> Concat(const std::vector<Value*>& parts, int64_t axis) {
    if (parts.size() == 1) return parts[0];
    return e_.Add("Concat", parts, {{"axis", Attribute::Int(axis)}});
  }

  // Step t's mask [1, batch, 1]: t < sequence_lens.
  absl::StatusOr<Value*> Mask(int64_t t) {
    if (auto it = masks_.find(t); it != masks_.end()) return it->second;
    ASSIGN_OR_RETURN(Value * m, e_.Add("Less", {e_.Scalar(lens_->dtype(), static_cast<double>(t)), lens_}));
    ASSIGN_OR_RETURN(m, e_.Unsqueeze(m, {0, 2}));
    masks_[t] = m;
    return m;
  }

  // One direction: the sequence's projections, then each step.
  absl::StatusOr<Result> Unroll(Value* x, const Direction& dir, bool want_y) {
    const int64_t h = hidden_;
    ASSIGN_OR_RETURN(Value * wt, e_.Squeeze(dir.w, {0}));
    ASSIGN_OR_RETURN(wt, e_.Transpose(wt, {1, 0}));  // [input, gates·hidden]
    ASSIGN_OR_RETURN(Value * rt, e_.Squeeze(dir.r, {0}));
    ASSIGN_OR_RETURN(rt, e_.Transpose(rt, {1, 0}));           // [hidden, gates·hidden]
    ASSIGN_OR_RETURN(Value * xw, e_.Add("MatMul", {x, wt}));  // [seq, batch, gates·hidden]
    ASSIGN_OR_RETURN(std::vector<Value*> xg, e_.Split(xw, 2, std::vector<int64_t>(gates_, h)));
    // Biases per gate: Wb + Rb joins the projection, except GRU's Rbh under
    // linear_before_reset, which stays inside the reset gate's product.
    Value* rbh = nullptr;
    if (dir.b) {
      ASSIGN_OR_RETURN(std::vector<Value*> bias, e_.Split(dir.b, 1, std::vector<int64_t>(2 * gates_, h)));
      for (int k = 0; k < gates_; ++k) {
        Value* wb = bias[k];
        Value* rb = bias[gates_ + k];
        if (gates_ == 3 && k == 2 && linear_before_reset_) {
          rbh = rb;
          ASSIGN_OR_RETURN(xg[k], e_.Add("Add", {xg[k], wb}));
          continue;
        }
        ASSIGN_OR_RETURN(Value * sum, e_.Add("Add", {wb, rb}));
        ASSIGN_OR_RETURN(xg[k], e_.Add("Add", {xg[k], sum}));
      }
    }
    std::vector<std::vector<Value*>> xs(gates_);
    for (int k = 0; k < gates_; ++k) {
      ASSIGN_OR_RETURN(xs[k], e_.Split(xg[k], 0, std::vector<int64_t>(steps_, 1)));
    }
    std::vector<Value*> peep;
    if (dir.p) {
      ASSIGN_OR_RETURN(peep, e_.Split(dir.p, 1, {h, h, h}));  // i, o, f
    }
    // GRU without linear_before_reset multiplies the reset gate into H before Rh.
    Value* rt_zr = rt;
    Value* rt_h = nullptr;
    if (gates_ == 3 && !linear_before_reset_) {
      ASSIGN_OR_RETURN(std::vector<Value*> parts, e_.Split(rt, 1, {2 * h, h}));
      rt_zr = parts[0];
      rt_h = parts[1];
    }

    Value* hp = dir.h0;
    Value* cp = dir.c0;
    std::vector<Value*> ys(steps_, nullptr);
    for (int64_t i = 0; i < steps_; ++i) {
      const int64_t t = dir.reverse ? steps_ - 1 - i : i;
      ASSIGN_OR_RETURN(Value * hr, e_.Add("MatMul", {hp, rt_zr}));
      Value *hn = nullptr, *cn = nullptr;
      if (gates_ == 1) {
        ASSIGN_OR_RETURN(Value * pre, e_.Add("Add", {xs[0][t], hr}));
        ASSIGN_OR_RETURN(hn, Activate(dir.acts[0], pre));
      } else if (gates_ == 3) {
        ASSIGN_OR_RETURN(hn, GruStep(dir, xs, t, hp, hr, rt_h, rbh));
      } else {
        ASSIGN_OR_RETURN(std::vector<Value*> rg, e_.Split(hr, 2, {h, h, h, h}));  // i, o, f, c
        std::vector<Value*> pre(4);
        for (int k = 0; k < 4; ++k) {
          ASSIGN_OR_RETURN(pre[k], e_.Add("Add", {xs[k][t], rg[k]}));
        }
        if (dir.p) {
          ASSIGN_OR_RETURN(Value * pi, e_.Add("Mul", {peep[0], cp}));
          ASSIGN_OR_RETURN(pre[0], e_.Add("Add", {pre[0], pi}));
          ASSIGN_OR_RETURN(Value * pf, e_.Add("Mul", {peep[2], cp}));
          ASSIGN_OR_RETURN(pre[2], e_.Add("Add", {pre[2], pf}));
        }
        ASSIGN_OR_RETURN(Value * ig, Activate(dir.acts[0], pre[0]));
        Value* fg;
        if (input_forget_) {
          ASSIGN_OR_RETURN(fg, e_.Add("Sub", {e_.Scalar(t_, 1), ig}));
        } else {
          ASSIGN_OR_RETURN(fg, Activate(dir.acts[0], pre[2]));
        }
        ASSIGN_OR_RETURN(Value * cg, Activate(dir.acts[1], pre[3]));
        ASSIGN_OR_RETURN(Value * kept, e_.Add("Mul", {fg, cp}));
        ASSIGN_OR_RETURN(Value * added, e_.Add("Mul", {ig, cg}));
        ASSIGN_OR_RETURN(cn, e_.Add("Add", {kept, added}));
        if (dir.p) {
          ASSIGN_OR_RETURN(Value * po, e_.Add("Mul", {peep[1], cn}));
          ASSIGN_OR_RETURN(pre[1], e_.Add("Add", {pre[1], po}));
        }
        ASSIGN_OR_RETURN(Value * og, Activate(dir.acts[0], pre[1]));
        ASSIGN_OR_RETURN(Value * hc, Activate(dir.acts[2], cn, /*gate=*/false));
        ASSIGN_OR_RETURN(hn, e_.Add("Mul", {og, hc}));
      }
      Value* y = hn;
      if (lens_) {
        ASSIGN_OR_RETURN(Value * m, Mask(t));
        ASSIGN_OR_RETURN(y, e_.Add("Where", {m, hn, e_.Scalar(t_, 0)}));
        ASSIGN_OR_RETURN(hn, e_.Add("Where", {m, hn, hp}));
        if (cn) {
          ASSIGN_OR_RETURN(cn, e_.Add("Where", {m, cn, cp}));
        }
      }
      ys[t] = y;
      hp = hn;
      cp = cn;
    }
    Result res{nullptr, hp, cp};
    if (want_y) {
      ASSIGN_OR_RETURN(res.y, Concat(ys, 0));
    }
    return res;
  }

  // One GRU step: z and r from X and H, the candidate through the reset gate, then
  // H' = h + z (H - h), which is (1 - z) h + z H.
  absl::StatusOr<Value*> GruStep(const Direction& dir, const std::vector<std::vector<Value*>>& xs, int64_t t,
                                 Value* hp, Value* hr, Value* rt_h, Value* rbh) {
    const int64_t h = hidden_;
    std::vector<Value*> rg;
    if (linear_before_reset_) {
      ASSIGN_OR_RETURN(rg, e_.Split(hr, 2, {h, h, h}));
    } else {
      ASSIGN_OR_RETURN(rg, e_.Split(hr, 2, {h, h}));
    }
    ASSIGN_OR_RETURN(Value * zp, e_.Add("Add", {xs[0][t], rg[0]}));
    ASSIGN_OR_RETURN(Value * rp, e_.Add("Add", {xs[1][t], rg[1]}));
    ASSIGN_OR_RETURN(Value * z, Activate(dir.acts[0], zp));
    ASSIGN_OR_RETURN(Value * reset, Activate(dir.acts[0], rp));
    Value* rec;
    if (linear_before_reset_) {
      Value* lin = rg[2];
      if (rbh) {
        ASSIGN_OR_RETURN(lin, e_.Add("Add", {lin, rbh}));
      }
      ASSIGN_OR_RETURN(rec, e_.Add("Mul", {reset, lin}));
    } else {
      ASSIGN_OR_RETURN(Value * rh, e_.Add("Mul", {reset, hp}));
      ASSIGN_OR_RETURN(rec, e_.Add("MatMul", {rh, rt_h}));
    }
    ASSIGN_OR_RETURN(Value * cand, e_.Add("Add", {xs[2][t], rec}));
    ASSIGN_OR_RETURN(cand, Activate(dir.acts[1], cand));
    ASSIGN_OR_RETURN(Value * diff, e_.Add("Sub", {hp, cand}));
    ASSIGN_OR_RETURN(Value * mix, e_.Add("Mul", {z, diff}));
    return e_.Add("Add", {cand, mix});
  }

  Graph* g_;
  Node& n_;
  Emitter& e_;
  DataType t_;
  std::string base_;
  int gates_ = 1;
  int64_t steps_ = 0, hidden_ = 0;
  std::optional<float> clip_;
  std::vector<Activation> acts_;
  bool linear_before_reset_ = false, input_forget_ = false;
  Value* lens_ = nullptr;
  std::map<int64_t, Value*> masks_;
};

}  // namespace

absl::Status DecomposeRecurrent(Graph* g, Node* n, int version) {
  Emitter e(g, *n);
  Unroller u(g, n, e);
  return u.Run(version);
}

}  // namespace cleave::graph::decompose
