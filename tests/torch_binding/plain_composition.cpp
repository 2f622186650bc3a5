#include "plain_composition.h"

#include <cmath>
#include <numbers>

#include "codegen/feature_params.h"

namespace lunajit::testing {
namespace {

using torch::Tensor;

Tensor plain_sigmoid(const Tensor& t) { return 1.0 / (1.0 + torch::exp(-t)); }
Tensor plain_relu(const Tensor& t) { return torch::clamp_min(t, 0.0); }
Tensor plain_gelu(const Tensor& t) { return 0.5 * t * (1.0 + torch::erf(t / std::numbers::sqrt2)); }
Tensor plain_softplus(const Tensor& t) { return torch::log1p(torch::exp(t)); }

Tensor act(Activation a, const Tensor& t) {
  switch (a) {
    case Activation::relu: return plain_relu(t);
    case Activation::gelu: return plain_gelu(t);
    case Activation::silu: return t * plain_sigmoid(t);
    case Activation::tanh: return torch::tanh(t);
  }
  return t;
}

Tensor out_act(OutputActivation a, const Tensor& y) {
  switch (a) {
    case OutputActivation::relu: return plain_relu(y);
    case OutputActivation::softplus: return plain_softplus(y);
    case OutputActivation::none: return y;
  }
  return y;
}

Tensor basis(int l, const Tensor& u) {
  switch (l % 8) {
    case 0: return torch::sin(u);
    case 1: return torch::cos(u);
    case 2: return torch::tanh(u);
    case 3: return plain_sigmoid(u);
    case 4: return plain_relu(u);
    case 5: return plain_gelu(u);
    case 6: return plain_softplus(u);
    default: return torch::exp(-0.5 * u * u);
  }
}

// The head's parameter tensors, sliced out of its block by the layout.
struct Block {
  const AttentionSpec& spec;
  ParamLayout layout;
  Tensor block;  // [per_head_floats]
  Tensor operator()(const char* name) const {
    const ParamTensor* t = layout.find(name);
    std::vector<int64_t> shape(t->shape.begin(), t->shape.end());
    Tensor v = block.narrow(0, t->offset, t->numel()).reshape(shape);
    return t->learned ? v : v.detach();
  }
};

// phi of one head's rows x [n, d] -> [n, D].
Tensor phi(const Tensor& x, const Block& p, const AttentionSpec& s, bool is_query) {
  const int64_t n = x.size(0), d = x.size(1);
  std::vector<Tensor> cols;
  switch (s.family) {
    case Family::luna: {
      const auto& o = s.luna;
      const Tensor u = torch::matmul(x, p("W").t());  // [n, M]
      Tensor h = torch::ones({n, 1}, x.options());
      if (o.envelope) h = plain_sigmoid(torch::matmul(x, p("a").unsqueeze(1)) + p("c"));
      for (int i = 0; i < o.projections; ++i) {
        const Tensor ui = u.select(1, i).unsqueeze(1);  // [n, 1]
        const int L = o.variant == LunaVariant::rff ? 2 : o.channels;
        for (int l = 0; l < L; ++l) {
          Tensor psi;
          if (o.variant == LunaVariant::neural) {
            const Tensor W1 = o.shared_channels ? p("W1") : p("W1")[l];
            const Tensor b1 = o.shared_channels ? p("b1") : p("b1")[l];
            const Tensor hidden = act(o.activation, ui * W1.unsqueeze(0) + b1.unsqueeze(0));  // [n, Hm]
            psi = out_act(o.output_activation, torch::matmul(hidden, p("W2")[l]) + p("b2")[l]);
          } else if (o.variant == LunaVariant::bank_coef) {
            psi = p("coef")[l] * basis(l, ui.squeeze(1));
          } else {
            psi = l == 0 ? torch::cos(ui.squeeze(1)) : torch::sin(ui.squeeze(1));
          }
          cols.push_back(psi * h.squeeze(1) / std::sqrt(double(o.projections)));
        }
      }
      return torch::stack(cols, 1);
    }
    case Family::performer: {
      const Tensor xs = x * std::pow(double(d), -0.25);
      const Tensor e = torch::matmul(xs, p("omega").t()) - 0.5 * (xs * xs).sum(1, true);
      const Tensor stab = is_query ? std::get<0>(e.max(1, true)).detach() : e.max().detach();
      return torch::exp(e - stab) / std::sqrt(double(s.performer.features)) + s.performer.kernel_eps;
    }
    case Family::rff: {
      const Tensor w = torch::matmul(x, p("omega").t());
      return torch::cat({torch::cos(w), torch::sin(w)}, 1) / std::sqrt(double(s.rff.features));
    }
    case Family::elu: return torch::where(x > 0, x + 1, torch::exp(x));
    case Family::relu: return plain_relu(x);
    case Family::t2r: return plain_relu(torch::matmul(x, p("W").t()) + p("b"));
    case Family::hedgehog: {
      const Tensor y = torch::matmul(x, p("W").t()) + p("b");
      auto softmax = [](const Tensor& t) {
        const Tensor e = torch::exp(t - std::get<0>(t.max(1, true)));
        return e / e.sum(1, true);
      };
      return torch::cat({softmax(y), softmax(-y)}, 1);
    }
    case Family::cosformer: {
      const Tensor angle = torch::arange(1, n + 1, x.options()).unsqueeze(1) * (std::numbers::pi / (2.0 * n));
      return torch::cat({plain_relu(x) * torch::sin(angle), plain_relu(x) * torch::cos(angle)}, 1);
    }
    case Family::slay: {
      const auto& o = s.slay;
      const Tensor u = x / torch::sqrt((x * x).sum(1, true));
      const Tensor adot = torch::matmul(u, p("anchors").t());
      const Tensor anc = adot * adot / std::sqrt(double(o.anchors));  // [n, P]
      const Tensor omega = p("omega"), nodes = p("nodes"), weights = p("weights");
      for (int r = 0; r < o.nodes; ++r) {
        const Tensor sr = nodes[r];
        const Tensor prf =
            torch::exp(torch::sqrt(2 * sr) * torch::matmul(u, omega[r].t()) - sr) / std::sqrt(double(o.prf_features));
        for (int q = 0; q < o.anchors; ++q) cols.push_back(torch::sqrt(weights[r]) * anc.select(1, q).unsqueeze(1) * prf);
      }
      return torch::cat(cols, 1);
    }
  }
  return {};
}

}  // namespace

torch::Tensor plain_linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& params, const AttentionSpec& spec) {
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2);
  const ParamLayout layout = param_layout(spec);
  std::vector<Tensor> batches;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Tensor> heads;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t blk = spec.params_per_head ? h : 0;
      const Block p{spec, layout,
                    layout.per_head_floats ? params.narrow(0, blk * layout.per_head_floats, layout.per_head_floats)
                                           : Tensor()};
      const Tensor pq = phi(q[b].select(1, h), p, spec, true);   // [N, D]
      Tensor A;
      if (spec.causal && spec.family == Family::performer) {
        // Row i maps keys j <= i with M_i = the max of their exponents (docs/MATH.md §2),
        // written out row by row: phi_i(k_j) = m^{-1/2} exp(e(k_j) - M_i) + kernel_eps.
        const Tensor x = k[b].select(1, h);
        const Tensor xs = x * std::pow(double(spec.head_dim), -0.25);
        const Tensor e = torch::matmul(xs, p("omega").t()) - 0.5 * (xs * xs).sum(1, true);  // [N, m]
        std::vector<Tensor> rows;
        for (int64_t i = 0; i < N; ++i) {
          const Tensor seen = e.narrow(0, 0, i + 1);
          const Tensor Ki = torch::exp(seen - seen.max().detach()) / std::sqrt(double(spec.performer.features)) +
                            spec.performer.kernel_eps;                                        // [i+1, m]
          const Tensor row = torch::matmul(Ki, pq[i]);                                          // [i+1]
          rows.push_back(torch::cat({row, torch::zeros({N - i - 1}, row.options())}));
        }
        A = torch::stack(rows, 0);  // [N, N]
      } else {
        const Tensor pk = phi(k[b].select(1, h), p, spec, false);  // [N, D]
        A = torch::matmul(pq, pk.t());                              // [N, N]
        if (spec.causal) A = A * torch::ones({N, N}, A.options()).tril();
      }
      if (spec.normalize) A = A / (A.sum(1, true) + spec.eps);
      heads.push_back(torch::matmul(A, v[b].select(1, h).to(A.scalar_type())));  // [N, dv]
    }
    batches.push_back(torch::stack(heads, 1));  // [N, H, dv]
  }
  return torch::stack(batches, 0);
}

}  // namespace lunajit::testing
